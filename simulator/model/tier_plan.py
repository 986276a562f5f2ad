"""The closed forms of a tiered scenario: every tier's first-order interval, its waste and money.

First order for k tiers (Benoit, Cavelan, Le Fèvre, Robert, Sun, IEEE TC 2017; Di, Robert,
Vivien, Cappello, TPDS 2017; ``analytic.tier_first_order``): tier ℓ saved every √(2Cℓ/λℓ),
λℓ the rate of the failures ℓ serves (``model.tiers.served_by``), waste Σℓ √(2 λℓ Cℓ) plus
each failure's recovery and restore. ``first_order_plan`` is that optimum, ``waste_at`` the
same model at any intervals (the budget's), ``single_tier_plan`` the best single tier beside
it, and ``recommend_tiers`` what ``ckptsim optimize`` prints, each strategy with what it
assumes. The simulated optimum, which assumes none of this, is ``simulator.tier_search``.
"""

from __future__ import annotations

import math
from typing import Any

from simulator.errors import InputError
from simulator.model.tiers import (
    Tier,
    failure_cost_s,
    final_save_s,
    save_writers,
    scheduled,
    served_by,
    step_overhead,
)

__all__ = [
    "class_terms",
    "first_order_plan",
    "job_waste_fraction",
    "recommend_tiers",
    "single_tier_plan",
    "waste_at",
    "what_it_assumes",
]


def first_order_plan(scenario) -> dict[str, Any]:
    """The first-order tier intervals and waste of a scenario with tiers (``analytic``).

    ``served_by`` says where each class's failures come back from. A class a scheduled tier
    serves is charged to the cheapest (least save stall) that survives it; its recovery is its
    detection and restart, that tier's restore and the warm-up. A class a just-in-time tier
    survives loses no work: it pays that tier's save and restore in its recovery. A class an
    every-step tier survives loses half a step and pays that tier's restore; every step's
    stall adds ``step_overhead`` to the waste. The scheduled tiers' intervals leave both out.
    A class in bursts counts a burst as one failure whose recovery lasts from its first
    failure to the end of the recovery from its last (``class_terms``).

    ``waste_fraction`` is the steady rate (what dollars per day use); the job's final save,
    paid once per job, is ``final_save_s`` apart from it (``job_waste_fraction`` adds it).
    Returns ``tier_intervals_s`` (tier name -> seconds; ``inf``: only the final save goes
    there), ``rates_per_s`` (λℓ per tier; a burst counts once), ``waste_fraction`` and
    ``final_save_s``.
    """
    from simulator import analytic  # scipy: only when a closed form is asked for

    if not scenario.tiers:
        raise InputError("the tier closed form needs [[tier]] tables in the scenario")
    writers = save_writers(scenario)
    costs = {t.name: t.stall_s(writers) for t in scheduled(scenario.tiers)}
    rates = dict.fromkeys(costs, 0.0)
    restart_cost = 0.0
    for name, rate, recovery_s in class_terms(scenario):
        kind, by = served_by(scenario.tiers, name)
        if kind != "scheduled":  # no interval to set: lost work is none or half a step
            restart_cost += rate * failure_cost_s(kind, by, recovery_s, writers)
            continue
        if not by:
            raise InputError(
                f"no tier survives failure class {name!r}: each such failure would restart "
                "the job from its beginning; add it to a tier's survives"
            )
        tier = min(by, key=lambda t: costs[t.name])
        rates[tier.name] += rate
        restart_cost += rate * failure_cost_s(kind, tier, recovery_s, writers)
    tau, waste = analytic.tier_first_order(list(costs.values()), list(rates.values()), restart_cost)
    return {
        "tier_intervals_s": {n: float(x) for n, x in zip(costs, tau, strict=True)},
        "rates_per_s": rates,
        "waste_fraction": waste + step_overhead(scenario.tiers),
        "final_save_s": final_save_s(scenario.tiers, writers),
    }


def job_waste_fraction(scenario, waste_fraction: float, final_s: float) -> float | None:
    """The waste of the scenario's whole job, its final save included: 1 − work / wall, with
    wall = work / (1 − waste) + the final save (None without work_h)."""
    if scenario.work_s is None or waste_fraction >= 1.0:
        return None
    wall = scenario.work_s / (1.0 - waste_fraction) + final_s
    return float(1.0 - scenario.work_s / wall)


def waste_at(scenario, intervals_s: dict[str, float]) -> float:
    """First-order waste of a tier schedule at any intervals (tier name -> seconds; ``inf``:
    final save only), as a fraction of wall time: each tier's stalls Cℓ/τℓ, every step's
    stall, and each class (``served_by``) losing half the shortest interval among the
    scheduled tiers that survive it (half the work when none is saved on a schedule, half a
    step when an every-step tier serves it, nothing when a just-in-time tier does) and paying
    its recovery and restore (``failure_cost_s``)."""
    writers = save_writers(scenario)
    work = float(scenario.work_s or 0.0)
    tiers = scheduled(scenario.tiers)
    waste = sum(
        t.stall_s(writers) / intervals_s[t.name]
        for t in tiers
        if math.isfinite(intervals_s[t.name])
    )
    waste += step_overhead(scenario.tiers)
    for name, rate, recovery_s in class_terms(scenario):
        kind, by = served_by(scenario.tiers, name)
        if kind != "scheduled":
            waste += rate * failure_cost_s(kind, by, recovery_s, writers)
            continue
        saved = [(intervals_s[t.name], t) for t in by if math.isfinite(intervals_s[t.name])]
        if saved:
            tau, tier = min(saved, key=lambda x: x[0])
            waste += rate * (tau / 2.0 + failure_cost_s(kind, tier, recovery_s, writers))
        else:
            waste += rate * (work / 2.0 + recovery_s)
    return float(waste)


def class_terms(scenario):
    """(name, rate per second, recovery seconds) of each class, for the closed forms: the rate
    of its failures, a burst counting once, and their detection (its mean) + restart + warm-up
    plus, for a class in bursts, the expected time from a burst's first failure to its last
    (``FailureClass.burst_span_s``).

    A burst is charged as the recovery it costs: from its first failure the job makes no
    lasting headway until the recovery from its last is over (a follow-up during a recovery
    starts it again; work between follow-ups is rolled back). That assumes no save falls
    inside a burst's window, i.e. the window is short against the intervals; the DES makes
    no such assumption."""
    from simulator.model.scenario import IMPLICIT_CLASS

    if not scenario.failure_classes:
        recovery = scenario.detection_s + scenario.restart_s + scenario.warmup_s
        return [(IMPLICIT_CLASS, scenario.failure_rate_per_s, recovery)]
    out = []
    for c in scenario.failure_classes:
        restart = scenario.restart_s if c.restart_s is None else c.restart_s
        rate = c.burst_rate_per_s(scenario.gpus, scenario.nodes)
        recovery = c.detection_s + restart + scenario.warmup_s
        if c.burst_followups:
            recovery += c.burst_span_s
        out.append((c.name, rate, recovery))
    return out


def single_tier_plan(scenario) -> dict[str, Any]:
    """The best single-tier answer beside the tiered one: every save to the cheapest tier that
    survives every class (the persistent one), at the first-order optimum for all failures."""
    from simulator import analytic

    writers = save_writers(scenario)
    terms = class_terms(scenario)
    names = {name for name, _, _ in terms}
    surviving = [t for t in scheduled(scenario.tiers) if names <= set(t.survives)]
    if not surviving:
        raise InputError("no tier survives every failure class: add one (the persistent tier)")
    tier = min(surviving, key=lambda t: t.stall_s(writers))
    rate = sum(r for _, r, _ in terms)
    restart_cost = sum(r * (recovery_s + tier.restore_s) for _, r, recovery_s in terms)
    tau, waste = analytic.tier_first_order([tier.stall_s(writers)], [rate], restart_cost)
    return {
        "tier": tier.name,
        "interval_s": float(tau[0]),
        "waste_fraction": waste,
        "final_save_s": final_save_s([tier], writers),
    }


def _rates_per_h(scenario, kind: str) -> dict[str, float]:
    """Failures per hour (a burst counting once) of each tier of ``kind`` (``jit`` or
    ``step``, ``served_by``): the classes it serves."""
    pick = (lambda t: t.jit) if kind == "jit" else (lambda t: t.every_step)
    out = {t.name: 0.0 for t in scenario.tiers if pick(t)}
    for name, rate, _ in class_terms(scenario):
        how, by = served_by(scenario.tiers, name)
        if how == kind:
            out[by.name] += rate * 3600.0
    return out


def what_it_assumes(scenario, tier: Tier) -> str:
    """What a plan that saves to ``tier`` takes for granted, for a person: which failures a
    copy there survives (so which hardware must hold it: host memory, a peer, shared
    storage), and what a save and a restore cost."""
    from simulator.model.scenario import IMPLICIT_CLASS

    writers = save_writers(scenario)
    classes = sorted(c.name for c in scenario.failure_classes) or [IMPLICIT_CLASS]
    survived = [c for c in classes if c in tier.survives]
    lost = [c for c in classes if c not in tier.survives]
    if tier.jit:
        return (
            f"{tier.name}: healthy replicas still hold the whole state after a "
            f"{', '.join(survived)} failure and save it in {tier.checkpoint_s or 0.0:g} s "
            f"(restore {tier.restore_s:.3g} s)"
        )
    cost = f"{tier.stall_s(writers):.3g} s stall per save, restore {tier.restore_s:.3g} s"
    if tier.every_step:
        cost = (
            f"a snapshot after every {tier.step_s:g} s step, {tier.step_stall_s:.3g} s stall "
            f"each, restore {tier.restore_s:.3g} s; a failure loses the step under way"
        )
    if not lost:
        return f"{tier.name}: a copy every failure class leaves intact ({cost})"
    return (
        f"{tier.name}: a copy that outlives {', '.join(survived)} failures but not "
        f"{', '.join(lost)} ({cost})"
    )


def recommend_tiers(scenario) -> dict[str, Any]:
    """Every tier's interval (first order) and its waste and money, with the best single-tier
    answer beside it: the dict ``ckptsim optimize --json`` prints for a tiered scenario."""
    from simulator.model import money

    plan = first_order_plan(scenario)
    single = single_tier_plan(scenario)
    if plan["waste_fraction"] >= 1.0:
        raise InputError(
            f"this job would make no headway: even at the tiers' first-order intervals, saves, "
            f"lost work and restarts would take {plan['waste_fraction']:.3g}x the wall time "
            "(at most 1); make saves or restarts cheaper, or failures rarer"
        )
    out: dict[str, Any] = {
        "scenario": scenario.to_dict(),
        "method": "first-order multi-tier optimum (Benoit et al., IEEE TC 2017)",
        "tier_intervals_s": plan["tier_intervals_s"],
        "tier_failure_rates_per_h": {k: v * 3600.0 for k, v in plan["rates_per_s"].items()},
        "jit_failure_rates_per_h": _rates_per_h(scenario, "jit"),
        "every_step_failure_rates_per_h": _rates_per_h(scenario, "step"),
        "optimal_waste_fraction": plan["waste_fraction"],
        "final_save_s": plan["final_save_s"],
        "job_waste_fraction": job_waste_fraction(
            scenario, plan["waste_fraction"], plan["final_save_s"]
        ),
        "single_tier": single["tier"],
        "single_tier_interval_s": single["interval_s"],
        "single_tier_waste_fraction": single["waste_fraction"],
        "single_tier_job_waste_fraction": job_waste_fraction(
            scenario, single["waste_fraction"], single["final_save_s"]
        ),
        "assumes": {
            "tiers": [what_it_assumes(scenario, t) for t in scenario.tiers],
            "single_tier": what_it_assumes(
                scenario, next(t for t in scenario.tiers if t.name == single["tier"])
            ),
        },
        "warnings": [
            f"failure class {c.name!r} is {c.failure}: the first-order plan assumes exponential "
            "failures; --simulate finds the intervals for the family itself"
            for c in scenario.failure_classes
            if not c.failure.strip().lower().startswith("exponential")
        ]
        + [
            f"failure class {c.name!r} comes in bursts: the first-order plan counts a burst as "
            f"one failure whose recovery runs from its first failure to the end of the "
            f"recovery from its last (+{c.burst_span_s:.3g} s on average), assuming no save "
            "falls inside its window; --simulate runs the bursts themselves"
            for c in scenario.failure_classes
            if c.burst_followups
        ],
    }
    if scenario.gpus is not None and scenario.usd_per_gpu_hour is not None:
        per_day = {
            key: float(money.usd_lost_per_day(scenario.gpus, scenario.usd_per_gpu_hour, w))
            for key, w in (("tiers", plan["waste_fraction"]), ("single", single["waste_fraction"]))
        }
        out["usd_lost_per_day"] = per_day["tiers"]
        out["single_tier_usd_lost_per_day"] = per_day["single"]
        out["usd_saved_per_day"] = per_day["single"] - per_day["tiers"]
    return out
