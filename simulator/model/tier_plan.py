"""The closed forms of a tiered scenario: every tier's first-order interval, its waste and money.

First order for k tiers (Benoit, Cavelan, Le Fèvre, Robert, Sun, IEEE TC 2017; Di, Robert,
Vivien, Cappello, TPDS 2017; ``analytic.tier_first_order``): tier ℓ saved every √(2Cℓ/λℓ),
λℓ the rate of the failures ℓ serves (``model.tiers.served_by``), waste Σℓ √(2 λℓ Cℓ) plus
each failure's recovery and restore; an asynchronous tier is saved no more often than its
background write lasts (``after_writes``: the live controller's rule). A just-in-time save
written ``into`` a tier is a copy there, as in the DES: it restarts that tier's interval (and
those of the tiers it covers, ``tiers.refreshed_by``), so such a tier's interval and lost work
are ``analytic.refreshed_interval`` and ``refreshed_age_s`` at that rate. ``first_order_plan``
is that optimum, ``waste_at`` the same model at any intervals, ``wall_per_work`` the budget's
wall time from the same terms. The single-tier
answer beside it (``single_tier_plan``) is today's single-tier machinery,
``simulator.recommend``'s exact optimum and Daly's expected wall time, at the classes'
combined rate and their rate-weighted recovery (``OneTierJob``); when one tier serves every
class the tiers' answer is that one too, so a scenario written as tiers gives exactly what
the same job gives without them. ``recommend_tiers`` is what ``ckptsim optimize`` prints,
each strategy with what it assumes, and ``adopt_simulated`` lays the simulated optimum
(``simulator.tier_search``, which assumes none of the first-order approximations) over it:
with ``--simulate`` that is the recommendation.

The first-order terms are rates that leave out second-order ones of relative size about
Σ_c λ_c·(recovery_c + τ_c), the failures expected within one recovery and one interval
(``first_order_strain``); past ``ROUGH_STRAIN`` the plan says so and points at ``--simulate``.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any

from simulator.errors import InputError
from simulator.model.tiers import (
    Tier,
    failure_cost_s,
    final_save_s,
    final_tiers,
    refreshed_by,
    save_writers,
    scheduled,
    served_by,
    step_overhead,
)

__all__ = [
    "ROUGH_STRAIN",
    "OneTierJob",
    "after_writes",
    "class_terms",
    "closed_form_plan",
    "first_order_plan",
    "first_order_strain",
    "job_waste_fraction",
    "priced",
    "refresh_rates_per_s",
    "served_rates_per_s",
    "serves_every_class",
    "single_tier_plan",
    "storage_usd_per_day",
    "stored_bytes",
    "wall_per_work",
    "waste_at",
]

ROUGH_STRAIN = 0.05
"""Above this Σ_c λ_c·(recovery_c + τ_c) (``first_order_strain``) the first-order waste is
called rough. The first-order forms take at most one failure per interval and recovery and
drop the terms of the next order; on the ``llama3-tiers`` mix the first-order waste runs high
by about 0.6 to 0.7 times this sum, relative (``reports/tiers.md``, "Where the first order holds":
the DES at the plan's own intervals from 1,024 to 100,000 GPUs; 7 % at 16,384 GPUs, where the
sum is 0.097). At 0.05 that is ~3 %, about the 95 % CI half-width of a 100-replica simulation
at 16,384 GPUs: past it the bias is one a routine ``--simulate`` resolves."""


def first_order_plan(scenario) -> dict[str, Any]:
    """The first-order tier intervals and waste of a scenario with tiers (``analytic``).

    ``served_by`` says where each class's failures come back from. A class a scheduled tier
    serves is charged to the cheapest (least save stall) that survives it; its recovery is its
    detection and restart, that tier's restore and the warm-up. A class a just-in-time tier
    survives loses no work: it pays that tier's save and restore in its recovery. A class an
    every-step tier survives loses half a step and pays that tier's restore; every step's
    stall adds ``step_overhead`` to the waste. The scheduled tiers' intervals leave both out.
    A tier that just-in-time saves are written into (``refresh_rates_per_s``) gets copies
    from them too: its interval is ``analytic.refreshed_interval``, the waste ``waste_at``.
    A class in bursts counts a burst as one failure whose recovery lasts from its first
    failure to the end of the recovery from its last (``class_terms``).

    ``waste_fraction`` is the steady rate (what dollars per day use); the job's final save,
    paid once per job, is ``final_save_s`` apart from it (``job_waste_fraction`` adds it).
    Returns ``tier_intervals_s`` (tier name -> seconds; ``inf``: only the final save goes
    there), ``rates_per_s`` (λℓ per tier; a burst counts once), ``waste_fraction``,
    ``final_save_s`` and ``raised_to_write_s`` (``after_writes``: the asynchronous tiers whose
    first-order interval was shorter than their write, and now is the write; the waste is then
    ``waste_at`` those intervals).
    """
    from simulator import analytic  # scipy: only when a closed form is asked for

    if not scenario.tiers:
        raise InputError("the tier closed form needs [[tier]] tables in the scenario")
    writers = save_writers(scenario)
    costs = {t.name: t.stall_s(writers) for t in scheduled(scenario.tiers)}
    for name, cost in costs.items():  # the tiers' fields are in range: a guard, naming it
        if not (math.isfinite(cost) and cost > 0):
            raise InputError(f"tier {name!r}: its save stalls {cost!r} s; give a positive time")
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
    intervals = {n: float(x) for n, x in zip(costs, tau, strict=True)}
    refresh = {n: rho for n, rho in refresh_rates_per_s(scenario).items() if rho > 0}
    for n, rho in refresh.items():  # just-in-time saves give it copies too
        intervals[n] = float(analytic.refreshed_interval(costs[n], rates[n], rho))
    raised = after_writes(scenario, intervals)
    if raised:  # the same model, at the intervals the writes allow
        intervals.update({n: write for n, (_, write) in raised.items()})
    if raised or refresh:
        waste = waste_at(scenario, intervals)
    else:
        waste += step_overhead(scenario.tiers)
    return {
        "tier_intervals_s": intervals,
        "rates_per_s": rates,
        "waste_fraction": waste,
        "final_save_s": final_save_s(scenario.tiers, writers),
        "raised_to_write_s": raised,
    }


def after_writes(scenario, intervals_s: dict[str, float]) -> dict[str, tuple[float, float]]:
    """The asynchronous tiers whose background write outlasts their interval: tier name ->
    (the interval, the write), seconds. Such a tier is saved every write instead: a save may
    not start before the previous one's write has landed, the rule the live controller applies
    (``policies.after_the_write``; the DES makes the save wait instead, stalling
    training)."""
    from simulator.policies import after_the_write

    writers = save_writers(scenario)
    out = {}
    for t in scheduled(scenario.tiers):
        if not t.asynchronous or t.name not in intervals_s:
            continue
        interval, write = intervals_s[t.name], t.write_s(writers)
        if after_the_write(interval, write) > interval:
            out[t.name] = (float(interval), float(write))
    return out


def job_waste_fraction(scenario, waste_fraction: float, final_s: float) -> float | None:
    """The waste of the scenario's whole job, its final save included: 1 − work / wall, with
    wall = work / (1 − waste) + the final save (None without work_h)."""
    if scenario.work_s is None or waste_fraction >= 1.0:
        return None
    wall = scenario.work_s / (1.0 - waste_fraction) + final_s
    return float(1.0 - scenario.work_s / wall)


def waste_at(scenario, intervals_s: dict[str, float]) -> float:
    """First-order waste of a tier schedule at any intervals (tier name -> seconds; ``inf``:
    final save only), as a fraction of wall time: each tier's stalls Cℓ/τℓ (an asynchronous
    one's wait for a write that outlasts its interval too), every step's stall, and each
    class (``served_by``) losing the work since the newest copy among the scheduled tiers
    that survive it (``_charges``: half the shortest interval, less where just-in-time saves
    are written into such a tier; half the work when none is saved on a schedule, half a step
    when an every-step tier serves it, nothing when a just-in-time tier does) and paying its
    recovery and restore (``failure_cost_s``)."""
    waste = _stalls(scenario, intervals_s)
    waste += sum(rate * (lost + cost) for rate, lost, cost in _charges(scenario, intervals_s))
    return float(waste)


def _stalls(scenario, intervals_s: dict[str, float]) -> float:
    """Stall seconds per compute second: each tier's save over its interval, an asynchronous
    save waiting as well for the rest of the previous write when that outlasts the interval
    (as the DES does: ``policies.after_the_write``), and every step's stall."""
    from simulator.analytic import refreshed_saves_per_s  # scipy: only when asked for
    from simulator.policies import after_the_write

    writers = save_writers(scenario)
    refresh = refresh_rates_per_s(scenario)
    total = step_overhead(scenario.tiers)
    for t in scheduled(scenario.tiers):
        tau = intervals_s[t.name]
        if math.isfinite(tau):
            wait = after_the_write(tau, t.write_s(writers)) - tau if t.asynchronous else 0.0
            rho = refresh[t.name]
            per_s = 1.0 / tau if rho == 0 else refreshed_saves_per_s(tau, rho)
            total += (t.stall_s(writers) + wait) * per_s
    return float(total)


def wall_per_work(scenario, intervals_s: dict[str, float]) -> float:
    """Expected wall seconds per second of work at these intervals, the budget's wall time:
    (1 + S) · Π_c e^(λ_c·R_c) · (e^(λ_c·τ_c) − 1) / (λ_c·τ_c). The stalls S grow with the
    compute (``_stalls``); each failure class c, at rate λ_c, costs its recovery R_c and rolls
    back over τ_c, twice its expected lost work (``_charges``: the interval of the tier it
    returns to, the whole work when none is saved on a schedule, nothing for a just-in-time
    tier). Each factor is Daly's exact one for exponential failures striking one segment, so a
    heavy load grows the wall time exponentially, never to a pole; for light loads the product
    is 1 + Σ λ_c·(τ_c/2 + R_c), the first order. inf only where it overflows a float."""
    log_factor = 0.0
    for rate, lost, cost in _charges(scenario, intervals_s):
        y = 2.0 * rate * lost
        if y > 700.0:  # (e^y − 1)/y overflows; its log is y − log y to double precision
            log_factor += rate * cost + y - math.log(y)
        else:
            log_factor += rate * cost + (math.log(math.expm1(y) / y) if y > 0.0 else 0.0)
    if log_factor > 700.0:
        return math.inf
    return (1.0 + _stalls(scenario, intervals_s)) * math.exp(log_factor)


def _charges(scenario, intervals_s: dict[str, float]):
    """(rate, expected lost work, recovery cost) of each class, seconds, at these intervals:
    the work since the newest copy it survives (the least expected age among the scheduled
    tiers that survive it: half the interval, or ``analytic.refreshed_age_s`` for a tier that
    just-in-time saves are written into, ``refresh_rates_per_s``; half the work when none is
    saved on a schedule; nothing for a just-in-time tier) and its recovery and restore
    (``failure_cost_s``; half a step with an every-step tier)."""
    writers = save_writers(scenario)
    work = float(scenario.work_s or 0.0)
    refresh = refresh_rates_per_s(scenario)
    for name, rate, recovery_s in class_terms(scenario):
        kind, by = served_by(scenario.tiers, name)
        if kind != "scheduled":
            yield rate, 0.0, failure_cost_s(kind, by, recovery_s, writers)
            continue
        saved = [(_age_s(intervals_s[t.name], refresh[t.name]), t) for t in by]
        saved = [(age, t) for age, t in saved if math.isfinite(age)]
        if saved:
            lost, tier = min(saved, key=lambda x: x[0])
            yield rate, lost, failure_cost_s(kind, tier, recovery_s, writers)
        else:
            yield rate, work / 2.0, recovery_s


def _age_s(tau: float, refresh: float) -> float:
    """Expected work since a tier's newest copy at a failure: half its interval (inf when it
    is saved only at the end), or ``analytic.refreshed_age_s`` with just-in-time copies."""
    if refresh == 0:
        return tau / 2.0
    from simulator.analytic import refreshed_age_s  # scipy: only when asked for

    return float(refreshed_age_s(tau, refresh))


def served_rates_per_s(scenario, kind: str) -> dict[str, float]:
    """Failures per second (a burst counting once) that each tier of ``kind`` (``jit`` or
    ``step``) serves (``served_by``)."""
    pick = (lambda t: t.jit) if kind == "jit" else (lambda t: t.every_step)
    out = {t.name: 0.0 for t in scenario.tiers if pick(t)}
    for name, rate, _ in class_terms(scenario):
        how, by = served_by(scenario.tiers, name)
        if how == kind:
            out[by.name] += rate
    return out


def refresh_rates_per_s(scenario) -> dict[str, float]:
    """ρℓ of each scheduled tier: how often per second a just-in-time save leaves a copy that
    serves its failures and restarts its interval (``tiers.refreshed_by``: the failures the
    just-in-time tiers written into a tier that covers it serve); 0 for most tiers."""
    jit = served_rates_per_s(scenario, "jit")
    tiers = scenario.tiers
    return {
        t.name: float(sum(jit[j.name] for j in refreshed_by(tiers, t.name)))
        for t in scheduled(tiers)
    }


def first_order_strain(scenario, intervals_s: dict[str, float]) -> float:
    """Σ_c λ_c·(recovery_c + τ_c): the failures expected within one recovery and one interval
    of the tier each class rolls back to (``_charges``). The first-order forms take it to be
    small (at most one failure per period, none in a recovery); the terms they drop are of
    about this size relative to the waste (``ROUGH_STRAIN``)."""
    charges = _charges(scenario, intervals_s)
    return float(sum(rate * (2.0 * lost + cost) for rate, lost, cost in charges))


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


@dataclass(frozen=True, kw_only=True)
class OneTierJob:
    """A tiered scenario saving to one tier only, as the single-tier closed forms
    (``simulator.recommend.recommend``) read a plain scenario: the classes' combined rate (a
    burst counting once, ``class_terms``) as the job's MTBF, their rate-weighted recovery
    (detection, restart, warm-up and burst span, plus the tier's restore) as R, the tier's
    stall as δ with its background write behind it, and its retained copies as the storage.
    Every class rolls back to the tier, so this is exactly a plain job with that failure rate
    and recovery: the two give the same answer to the last bit."""

    source: Any
    """The tiered scenario (its dict is what the answer says it was for)."""
    tier: str
    system_mtbf_s: float
    save_stall_s: float
    background_write_s: float
    recovery_s: float
    failure: str
    """``exponential``, or the first class's family that is not (the closed forms warn)."""
    work_h: float | None
    gpus: int | None
    usd_per_gpu_hour: float | None
    checkpoint_bytes: float | None
    checkpoints_retained: int
    usd_per_gb_month: float | None

    @classmethod
    def of(cls, scenario, tier: Tier) -> OneTierJob:
        writers = save_writers(scenario)
        terms = class_terms(scenario)
        rate = sum(r for _, r, _ in terms)
        # Weights of exactly 1.0 for a single class, so its recovery is not rounded.
        recovery = sum((r / rate) * (rec + tier.restore_s) for _, r, rec in terms)
        families = [c.failure for c in scenario.failure_classes]
        odd = [f for f in families if not f.strip().lower().startswith("exponential")]
        return cls(
            source=scenario,
            tier=tier.name,
            system_mtbf_s=1.0 / rate,
            save_stall_s=tier.stall_s(writers),
            background_write_s=tier.write_s(writers) if tier.asynchronous else 0.0,
            recovery_s=float(recovery),
            failure=odd[0] if odd else (scenario.failure if not families else "exponential"),
            work_h=scenario.work_h,
            gpus=scenario.gpus,
            usd_per_gpu_hour=scenario.usd_per_gpu_hour,
            checkpoint_bytes=stored_bytes(scenario, tier),
            checkpoints_retained=tier.retention,
            usd_per_gb_month=scenario.usd_per_gb_month if priced(scenario, tier) else None,
        )

    def to_dict(self) -> dict[str, Any]:
        return self.source.to_dict()


def serves_every_class(scenario, plan: dict[str, Any]) -> str | None:
    """The one scheduled tier every failure class rolls back to in the first-order ``plan``
    (each class's cheapest surviving tier is that one, none is served just in time or every
    step, and no tier stalls every step), or None. Then the tiers are one tier, and the
    single-tier answer (``single_tier_plan``) is theirs."""
    if step_overhead(scenario.tiers) or len(scheduled(scenario.tiers)) < len(scenario.tiers):
        return None
    used = [n for n, r in plan["rates_per_s"].items() if r > 0]
    return used[0] if len(used) == 1 else None


def closed_form_plan(scenario) -> dict[str, Any]:
    """The tiers' closed-form answer: the first-order plan (``first_order_plan``), or, when
    one tier serves every class (``serves_every_class``), the single-tier answer
    (``single_tier_plan``), which is then exactly today's single-tier optimum. Returns
    ``tier_intervals_s``, ``waste_fraction``, ``method`` (None for first order), ``alone``
    (that one tier, or None) and the two plans it chose between (``first_order``,
    ``single``). The simulated search starts from it, and checks it."""
    plan = first_order_plan(scenario)
    single = single_tier_plan(scenario)
    alone = serves_every_class(scenario, plan)
    if alone is not None and alone == single["tier"]:
        intervals = {n: math.inf for n in plan["tier_intervals_s"]} | {alone: single["interval_s"]}
        waste = single["waste_fraction"]
        method = f"{single['method']}: every failure class rolls back to {alone}, one tier"
    else:
        alone, method = None, None
        intervals, waste = plan["tier_intervals_s"], plan["waste_fraction"]
    return {
        "tier_intervals_s": intervals,
        "waste_fraction": waste,
        "method": method,
        "alone": alone,
        "first_order": plan,
        "single": single,
    }


def single_tier_plan(scenario) -> dict[str, Any]:
    """The best single-tier answer beside the tiered one: every save to the cheapest tier that
    survives every class (the persistent one), at today's single-tier optimum for all the
    failures (``OneTierJob``: ``recommend``'s exact optimum of Daly's expected wall time), no
    shorter than its background write when asynchronous (``after_writes``' rule, and then
    Daly's waste at that interval)."""
    from simulator import analytic
    from simulator.recommend import recommend

    writers = save_writers(scenario)
    names = {name for name, _, _ in class_terms(scenario)}
    surviving = [t for t in scheduled(scenario.tiers) if names <= set(t.survives)]
    if not surviving:
        raise InputError("no tier survives every failure class: add one (the persistent tier)")
    tier = min(surviving, key=lambda t: t.stall_s(writers))
    job = OneTierJob.of(scenario, tier)
    rec = recommend(job)
    interval, waste = rec["optimal_interval_s"], rec["optimal_waste_fraction"]
    raised = after_writes(scenario, {tier.name: interval}).get(tier.name)
    if raised is not None:
        interval = raised[1]
        waste = float(
            analytic.waste_fraction(interval, job.save_stall_s, job.system_mtbf_s, job.recovery_s)
        )
    return {
        "tier": tier.name,
        "interval_s": float(interval),
        "waste_fraction": float(waste),
        "final_save_s": final_save_s([tier], writers),
        "raised_to_write_s": raised,
        "method": "exact single-tier optimum (Daly 2006, Lambert W) at the classes' total rate",
    }


def priced(scenario, tier: Tier) -> bool:
    """Whether a tier's copies are on the storage the scenario's ``usd_per_gb_month`` prices:
    those of a tier that survives every failure class (persistent storage, outside the job's
    nodes). A copy some class destroys lives in the job's own memory or disks: no bill."""
    names = {name for name, _, _ in class_terms(scenario)}
    return not (tier.jit or tier.every_step) and names <= set(tier.survives)


def stored_bytes(scenario, tier: Tier) -> float | None:
    """Bytes one copy in ``tier`` holds: its own checkpoint_bytes, else the scenario's (beside
    [[tier]] tables, the size of one checkpoint); None when neither is given."""
    return tier.checkpoint_bytes if tier.checkpoint_bytes is not None else scenario.checkpoint_bytes


def storage_usd_per_day(scenario, intervals_s: dict[str, float]) -> float | None:
    """US dollars a day to keep the priced tiers' retained copies (``priced``: each such tier's
    ``retention`` copies of ``stored_bytes``) for a schedule: a tier saved on it, or at the
    final save, holds copies; one never saved holds none. None without a price or a size."""
    from simulator.model import money

    if scenario.usd_per_gb_month is None:
        return None
    final = {t.name for t in final_tiers(scenario.tiers)}
    total, known = 0.0, False
    for t in scheduled(scenario.tiers):
        held = math.isfinite(intervals_s.get(t.name, math.inf)) or t.name in final
        size = stored_bytes(scenario, t)
        if not (held and priced(scenario, t)) or size is None:
            continue
        total += float(money.storage_usd_per_day(size, t.retention, scenario.usd_per_gb_month))
        known = True
    return total if known else None


_ADVICE = frozenset({"recommend_tiers", "what_it_assumes", "adopt_simulated"})


def __getattr__(name: str):
    # What ``ckptsim optimize`` prints lives in ``simulator.tier_recommend`` (it uses the
    # single-tier comparison, ``simulator.recommend``); its old home still gives it.
    if name in _ADVICE:
        from simulator import tier_recommend

        return getattr(tier_recommend, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
