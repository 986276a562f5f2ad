"""The simulated optimum of a tiered schedule: every tier's interval at once, by simulation.

The closed form (``model.tier_plan.closed_form_plan``: the first-order plan of Benoit et al.
2017, or today's exact single-tier optimum when one tier serves every failure class) assumes
each tier's failures are rare against its interval and that the tiers do not interact; the
DES assumes neither. Here the objective is the mean wall time over replicas of the tiered
DES, every candidate schedule on the same failure histories (common random numbers, as in
``simulator.optimize``). The search works in log-interval space:

- Round 1 evaluates a 3^k design (k tiers searched) around the closed-form intervals, at
  half their value and twice it; a least-squares quadratic through those points, smoothed
  over the noise, gives its minimiser, kept inside the design's box (half a step past it).
- Round 2 does the same around that minimiser with a box of √2 either way.
- The estimate is round 2's minimiser: 2·3^k evaluations in all (18 for two tiers), never
  the single noisy best point. Round 2's replicas, resampled with their pairing kept
  (bootstrap), give percentile intervals for each tier's interval. At most
  ``MAX_SEARCHED_TIERS`` tiers are searched together (the design grows as 3^k).

A tier whose closed-form interval is infinite (no failure class needs it) is not searched:
it takes only the job's final save. Just-in-time and every-step tiers have no interval: they
run as they are in every schedule, and the single tier runs without them. Searching one tier
with the others at infinity is the best single-tier schedule (``single_tier=True``), so the
two answers are found the same way. The check then runs the two optima and the closed-form
plan (under the key ``first_order``) on fresh seeds.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from dataclasses import dataclass
from typing import Any

import numpy as np

from simulator.engines.results import mean_ci
from simulator.engines.streams import search_and_check
from simulator.errors import InputError
from simulator.model.tier_plan import closed_form_plan, single_tier_plan
from simulator.model.tiers import TierSchedule, scheduled

__all__ = [
    "MAX_SEARCHED_TIERS",
    "TierOptimum",
    "evaluate_schedules",
    "search_tiers",
    "waste_summary",
]

ROUNDS = ((math.log(2.0), 1.5), (0.5 * math.log(2.0), 1.5))
"""(half-width of the 3^k design in log interval, how far past it the minimiser may go, in
half-widths) for each round."""
MAX_SEARCHED_TIERS = 4
"""Most tiers whose intervals are searched together: 2·3^4 = 162 schedules a search, each on
every replica; past it the design outgrows any budget (25 tiers would be 2·3^25)."""
EXTRA_ROUNDS = 3
"""A round whose minimiser ends on its box's edge (the basin lies further out) is run again
around that edge, at most this many times in all; an answer still on the edge says so."""


@dataclass(frozen=True)
class TierOptimum:
    """The simulated optimum: each searched tier's interval with a bootstrap 95 % interval."""

    intervals_s: dict[str, float]
    ci95_s: dict[str, tuple[float, float]]
    evaluations: int
    replicas: int
    searched: tuple[str, ...]
    at_edge: bool = False
    """The last round's minimiser lay on its box's edge: the optimum may lie further out."""

    def schedule(self) -> TierSchedule:
        return TierSchedule(dict(self.intervals_s))


def evaluate_schedules(
    scenario, schedules, *, replicas: int, seed=0, workers: int | None = 1, bar=None
) -> np.ndarray:
    """Wall time (s) of each schedule on each replica, shape (schedules, replicas); replica r
    meets the same failures under every schedule."""
    from simulator.optimize import evaluate

    out = evaluate(
        scenario, list(schedules), replicas=replicas, seed=seed, engine="des", workers=workers,
        bar=bar,
    )  # fmt: skip
    return np.asarray(out["wall_s"], dtype=float)


def _features(x: np.ndarray) -> np.ndarray:
    """[1, x_i, x_i·x_j (i ≤ j)] of each row of x: a full quadratic."""
    n, k = x.shape
    cols = [np.ones(n), *(x[:, i] for i in range(k))]
    cols += [x[:, i] * x[:, j] for i in range(k) for j in range(i, k)]
    return np.stack(cols, axis=1)


def _quadratic_min(x: np.ndarray, y: np.ndarray, centre: np.ndarray, reach: float) -> np.ndarray:
    """Minimiser of the least-squares quadratic through (x, y), clipped to centre ± reach; the
    best point when the fit has no minimum (a flat or saddle-shaped fit of noise)."""
    k = x.shape[1]
    coef, *_ = np.linalg.lstsq(_features(x - centre), y - y.mean(), rcond=None)
    b = coef[1 : 1 + k]
    h = np.zeros((k, k))
    idx = 1 + k
    for i in range(k):
        for j in range(i, k):
            h[i, j] += coef[idx] if i != j else 2 * coef[idx]
            h[j, i] += coef[idx] if i != j else 0.0
            idx += 1
    try:
        positive = bool(np.all(np.linalg.eigvalsh(h) > 0))
    except np.linalg.LinAlgError:
        positive = False
    if not positive:
        return x[int(np.argmin(y))].copy()
    step = np.linalg.solve(h, -b)
    return centre + np.clip(step, -reach, reach)


def _schedules(names, points, fixed) -> list[TierSchedule]:
    return [
        TierSchedule({**fixed, **{n: float(math.exp(v)) for n, v in zip(names, p, strict=True)}})
        for p in points
    ]


def search_tiers(
    scenario,
    *,
    replicas: int,
    seed=0,
    single_tier: bool = False,
    workers: int | None = 1,
    bar=None,
    boot: int = 400,
) -> TierOptimum:
    """The simulated optimum of every tier's interval (``single_tier``: of the best single
    tier's, the other tiers saved only at the end), starting from the closed-form plan.
    ``bar`` advances by one per run, and at the end by the runs of the extra rounds it did
    not need, so that a bar sized for them all (``max_runs``) fills without its total ever
    changing."""
    if not scenario.tiers:
        raise InputError("a tier search needs [[tier]] tables in the scenario")
    if replicas < 2:
        raise InputError("a tier search needs 2 or more replicas (the fit smooths over noise)")
    names_all = [t.name for t in scheduled(scenario.tiers)]
    if single_tier:
        plan = single_tier_plan(scenario)
        start = {n: math.inf for n in names_all} | {plan["tier"]: plan["interval_s"]}
    else:
        start = dict(closed_form_plan(scenario)["tier_intervals_s"])
    # A tier saved no more often than the whole job lasts takes only the final save anyway.
    names = tuple(n for n in names_all if start[n] < float(scenario.work_s))
    fixed = {n: math.inf for n in names_all if n not in names}
    if not names:
        return TierOptimum(dict(fixed), {}, 0, replicas, ())
    k = len(names)
    if k > MAX_SEARCHED_TIERS:
        evaluations_for(scenario)  # its one-line refusal
    centre = np.log([start[n] for n in names])
    offsets = np.array(list(itertools.product((-1.0, 0.0, 1.0), repeat=k)))
    evaluations, extra, i = 0, 0, 0
    while i < len(ROUNDS):
        half, past = ROUNDS[i]
        points = centre + half * offsets
        walls = evaluate_schedules(
            scenario, _schedules(names, points, fixed), replicas=replicas, seed=seed,
            workers=workers, bar=bar,
        )  # fmt: skip
        evaluations += len(points)
        best = _quadratic_min(points, walls.mean(axis=1), centre, past * half)
        at_edge = bool(np.any(np.abs(best - centre) >= past * half * (1 - 1e-9)))
        last = (points, walls, centre, past * half)
        centre = best
        if at_edge and extra < EXTRA_ROUNDS:
            extra += 1  # the same round again, around the edge it stopped at
            continue
        i += 1
    if bar is not None:  # the bar holds room for every extra round: skip those not run
        bar.update((EXTRA_ROUNDS - extra) * len(offsets) * replicas)
    points, walls, around, reach = last
    rng = np.random.default_rng(0)
    draws = np.array(
        [
            _quadratic_min(points, walls[:, idx].mean(axis=1), around, reach)
            for idx in (rng.integers(0, replicas, replicas) for _ in range(boot))
        ]
    )
    lo, hi = np.percentile(draws, [2.5, 97.5], axis=0)
    return TierOptimum(
        intervals_s={
            **fixed,
            **{n: float(math.exp(v)) for n, v in zip(names, centre, strict=True)},
        },
        ci95_s={
            n: (float(math.exp(a)), float(math.exp(b)))
            for n, a, b in zip(names, lo, hi, strict=True)
        },
        evaluations=evaluations,
        replicas=replicas,
        searched=names,
        at_edge=at_edge,
    )


def _waste(scenario, walls) -> np.ndarray:
    """Waste of each run, 1 − work/wall, from its wall time (s)."""
    return 1.0 - float(scenario.work_s) / np.asarray(walls, dtype=float)


def waste_summary(scenario, walls: np.ndarray) -> dict[str, Any]:
    """Waste (1 − work/wall) of each replica, its mean and 95 % CI (Student's t, kept inside
    the possible 0 to 1), and the dollars a day that waste costs the cluster (when the
    scenario has GPUs and a price)."""
    mean, lo, hi = mean_ci(_waste(scenario, walls))
    lo, hi = max(lo, 0.0), min(hi, 1.0)
    out: dict[str, Any] = {"waste_fraction": mean, "waste_fraction_ci95": [lo, hi]}
    if scenario.gpus is not None and scenario.usd_per_gpu_hour is not None:
        from simulator.model.money import usd_lost_per_day

        day = [
            float(usd_lost_per_day(scenario.gpus, scenario.usd_per_gpu_hour, w))
            for w in (mean, lo, hi)
        ]
        out["usd_lost_per_day"], out["usd_lost_per_day_ci95"] = day[0], day[1:]
    return out


def _searched(scenario) -> tuple[int, bool]:
    """(how many tiers the search varies, whether the single-tier search varies another set:
    when it would vary the same one tier, the two searches are one)."""
    work = float(scenario.work_s)
    varied = {n for n, v in closed_form_plan(scenario)["tier_intervals_s"].items() if v < work}
    single = single_tier_plan(scenario)
    alone = {single["tier"]} if single["interval_s"] < work else set()
    # The single tier runs without just-in-time or every-step tiers: another search.
    unscheduled = len(scheduled(scenario.tiers)) < len(scenario.tiers)
    return len(varied), varied != alone or unscheduled


def scheduled_only(scenario):
    """The scenario with its just-in-time and every-step tiers taken out: where the single
    tier runs (one tier means no saves after a failure or after every step either)."""
    if len(scheduled(scenario.tiers)) == len(scenario.tiers):
        return scenario
    return dataclasses.replace(scenario, tiers=tuple(scheduled(scenario.tiers)))


def evaluations_for(scenario, rounds: int = len(ROUNDS)) -> int:
    """How many schedules :func:`simulate_tier_plan` runs (each on every replica) in
    ``rounds`` rounds of each search (the design's own; more when rounds run again,
    ``EXTRA_ROUNDS``); more than ``MAX_SEARCHED_TIERS`` tiers to search is one line."""
    k, separate = _searched(scenario)
    if k > MAX_SEARCHED_TIERS:
        raise InputError(
            f"the simulated search varies every tier's interval at once in a 3^k design; this "
            f"scenario has {k} tiers to search, and at most {MAX_SEARCHED_TIERS} are searched "
            f"together ({len(ROUNDS) * 3**MAX_SEARCHED_TIERS} schedules): merge tiers, or run "
            "chosen schedules with `ckptsim simulate --tier-interval-s NAME=SECONDS`"
        )
    tiers = rounds * 3**k if k else 0
    single = rounds * 3 if separate else 0
    return tiers + single + 3  # and the check: the two optima and the first-order plan


def max_runs(scenario, replicas: int, extra: int = 0) -> int:
    """Runs :func:`simulate_tier_plan` makes at most: its schedules with every extra round
    each search may add, and ``extra`` more in the check, on every replica; the size of its
    progress bar."""
    return (evaluations_for(scenario, len(ROUNDS) + EXTRA_ROUNDS) + extra) * replicas


def budget_schedules(scenario) -> list[TierSchedule]:
    """Schedules as many and as costly as :func:`simulate_tier_plan` runs, for the budget:
    its designs centre on the first-order plan (tiers) and the first-order single tier."""
    first = TierSchedule(dict(closed_form_plan(scenario)["tier_intervals_s"]))
    plan = single_tier_plan(scenario)
    single = TierSchedule(
        {t.name: math.inf for t in scheduled(scenario.tiers)} | {plan["tier"]: plan["interval_s"]}
    )
    n_single = len(ROUNDS) * 3 + 1 if _searched(scenario)[1] else 1
    return [first] * (evaluations_for(scenario) - n_single) + [single] * n_single


def simulate_tier_plan(
    scenario,
    *,
    replicas: int,
    seed=0,
    workers: int | None = 1,
    progress: bool = False,
    extra: dict[str, TierSchedule] | None = None,
    per_replica: bool = False,
) -> dict[str, Any]:
    """The simulated optimum of every tier's interval and of the best single tier, then both
    and the first-order plan run again on fresh seeds (paired), so their waste, dollars and
    the difference between them are measured out of sample: what ``ckptsim optimize
    --simulate`` prints for a tiered scenario. ``extra`` schedules (label -> schedule, e.g.
    hand-set intervals) join that check, each with its waste and its excess waste over the
    simulated optimum (``extra``). ``per_replica``: also each check replica's waste
    (``check_waste``: tiers, single_tier, first_order and the extra labels), to pair with
    other scenarios checked on the same seed (their replicas meet the same failures when their
    failure classes are the same)."""
    from tqdm.auto import tqdm

    from simulator.optimize import paired_excess

    first = TierSchedule(dict(closed_form_plan(scenario)["tier_intervals_s"]))
    search_ss, check_ss = search_and_check(seed)  # as optimize_by_simulation
    extra = dict(extra or {})
    total = max_runs(scenario, replicas, len(extra))
    with tqdm(total=total, unit="run", desc="optimize", disable=not progress, leave=False) as bar:
        tiers = search_tiers(scenario, replicas=replicas, seed=search_ss, workers=workers, bar=bar)
        plain = scheduled_only(scenario)
        if _searched(scenario)[1]:
            single = search_tiers(
                plain, replicas=replicas, seed=search_ss, single_tier=True, workers=workers,
                bar=bar,
            )  # fmt: skip
        else:  # the tiers' optimum varies one tier only: it is the single-tier search
            single = dataclasses.replace(tiers, evaluations=0)
        runs = dict(replicas=replicas, seed=check_ss, workers=workers, bar=bar)
        check = evaluate_schedules(scenario, [tiers.schedule(), first, *extra.values()], **runs)
        alone = evaluate_schedules(plain, [single.schedule()], **runs)  # the same failures
        check = np.vstack([check[:1], alone, check[1:]])
    name = single_tier_plan(scenario)["tier"]
    waste = _waste(scenario, check)  # per schedule and replica
    saved = paired_excess(waste[1], waste[0])  # the single tier's waste minus the tiers'
    by_first = paired_excess(waste[2], waste[0])  # the first-order plan's minus the tiers'
    excess = {label: paired_excess(waste[3 + i], waste[0]) for i, label in enumerate(extra)}
    out: dict[str, Any] = {
        "method": (
            f"DES under common random numbers: two rounds of a 3^k design in log interval "
            f"around the first-order plan (a round again while its minimum lies on its edge), "
            f"each smoothed by a quadratic; {replicas} replicas per schedule, then checked on "
            "fresh seeds"
        ),
        "replicas": replicas,
        "evaluations": tiers.evaluations + single.evaluations + 3 + len(extra),
        "at_edge": tiers.at_edge or single.at_edge,
        "tier_intervals_s": tiers.intervals_s,
        "tier_intervals_ci95_s": {k: list(v) for k, v in tiers.ci95_s.items()},
        **waste_summary(scenario, check[0]),
        "single_tier": name,
        "single_tier_interval_s": single.intervals_s[name],
        "single_tier_interval_ci95_s": list(single.ci95_s.get(name, (math.inf, math.inf))),
        "single_tier_simulated": waste_summary(scenario, check[1]),
        "first_order": waste_summary(scenario, check[2]),
        "waste_saved_vs_single_tier": {k: saved[k] for k in ("mean", "lo", "hi")},
        "waste_saved_vs_first_order": {k: by_first[k] for k in ("mean", "lo", "hi")},
    }
    if per_replica:
        labels = ["tiers", "single_tier", "first_order", *extra]
        out["check_waste"] = {k: waste[i].tolist() for i, k in enumerate(labels)}
    if extra:
        out["extra"] = {
            label: {
                "tier_intervals_s": dict(extra[label].intervals_s),
                **waste_summary(scenario, check[3 + i]),
                "excess_waste": {k: excess[label][k] for k in ("mean", "lo", "hi")},
            }
            for i, label in enumerate(extra)
        }
    return out
