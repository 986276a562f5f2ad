"""What ``ckptsim optimize`` says for a scenario with tiers: every tier's interval, its waste and
money, the best single tier beside it, what each assumes, and the recommendation.

``recommend_tiers`` gives the closed form (``model.tier_plan``): the first-order plan of every
tier, or, when one tier serves every failure class, today's exact single-tier optimum (the two
answers then agree with the same job written without tiers, to the last bit), with the best
single tier beside it, warnings where the closed form is rough, and a recommendation.
``adopt_simulated`` lays ``tier_search.simulate_tier_plan``'s answer over it: with
``--simulate`` the recommendation and the top-level keys are the simulated optimum, measured on
fresh replicas, and the closed form stays under ``closed_form``.

The top-level keys external checks read (``tier_intervals_s``, ``optimal_waste_fraction``,
``usd_lost_per_day``, ``single_tier_interval_s``, ``single_tier_waste_fraction``) hold what the
recommendation rests on: the closed form without ``--simulate``, the simulation with it
(``recommended_by`` says which).
"""

from __future__ import annotations

import math
from typing import Any

from simulator.display import format_duration, format_percent, format_usd
from simulator.errors import InputError
from simulator.model.tier_plan import (
    ROUGH_STRAIN,
    closed_form_plan,
    first_order_strain,
    job_waste_fraction,
    served_rates_per_s,
    storage_usd_per_day,
)
from simulator.model.tiers import Tier, save_writers, scheduled

__all__ = ["FIRST_ORDER_METHOD", "adopt_simulated", "recommend_tiers", "what_it_assumes"]

FIRST_ORDER_METHOD = "first-order multi-tier optimum (Benoit et al., IEEE TC 2017)"
STRATEGY_HINT = (
    "Other strategies: add a [[tier]] with jit = true (just-in-time: saved from a healthy "
    "replica after a failure, EuroSys'24) or with every_step = true, step_s and step_stall_s "
    "(a snapshot after every step, Gemini) to weigh them here."
)
"""Said when a scenario has neither: every strategy the tier model weighs is one table away."""


def _rates_per_h(scenario, kind: str) -> dict[str, float]:
    """Failures per hour (a burst counting once) of each tier of ``kind`` (``jit`` or
    ``step``, ``served_by``): the classes it serves."""
    return {n: r * 3600.0 for n, r in served_rates_per_s(scenario, kind).items()}


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
        into = "" if tier.into is None else f" into {tier.into}, where it counts as a copy,"
        return (
            f"{tier.name}: healthy replicas still hold the whole state after a "
            f"{', '.join(survived)} failure and save it{into} in {tier.checkpoint_s or 0.0:g} "
            f"s (restore {tier.restore_s:.3g} s)"
        )
    cost = f"{tier.stall_s(writers):.3g} s stall per save"
    if tier.asynchronous:
        cost += f" with a {tier.write_s(writers):.3g} s write behind it"
    cost += f", restore {tier.restore_s:.3g} s"
    if tier.every_step:
        cost = (
            f"a snapshot after every {tier.step_s:g} s step, {tier.step_stall_s:.3g} s stall "
            f"each, restore {tier.restore_s:.3g} s; a failure loses the step under way"
        )
    if not lost:
        return f"{tier.name}: a copy every failure class leaves intact ({cost})"
    if not survived:
        return f"{tier.name}: a copy no failure class leaves intact ({cost})"
    return (
        f"{tier.name}: a copy that outlives {', '.join(survived)} failures but not "
        f"{', '.join(lost)} ({cost})"
    )


def _raised(tier: str, raised: tuple[float, float], what: str) -> str:
    interval, write = raised
    return (
        f"tier {tier!r} is asynchronous and its background write ({format_duration(write)}) "
        f"outlasts {what} ({format_duration(interval)}): it is saved every "
        f"{format_duration(write)} instead, the live controller's rule (a save cannot start "
        "before the previous write lands; saving more often would stall training until it "
        "does); the closed form still leaves out failures before a write lands, which lose up "
        "to a write's worth of work more: check with --simulate"
    )


def _warnings(scenario, plan, single, strain: float | None) -> list[str]:
    out = [
        f"failure class {c.name!r} is {c.failure}: the first-order plan assumes exponential "
        "failures; --simulate finds the intervals for the family itself"
        for c in scenario.failure_classes
        if not c.failure.strip().lower().startswith("exponential")
    ]
    out += [
        f"failure class {c.name!r} comes in bursts: the first-order plan counts a burst as "
        f"one failure whose recovery runs from its first failure to the end of the "
        f"recovery from its last (+{c.burst_span_s:.3g} s on average), assuming no save "
        "falls inside its window; --simulate runs the bursts themselves"
        for c in scenario.failure_classes
        if c.burst_followups
    ]
    out += [
        _raised(name, r, "its first-order interval") for name, r in plan.items() if r is not None
    ]
    if single["raised_to_write_s"] is not None:
        out.append(_raised(single["tier"], single["raised_to_write_s"], "its single-tier optimum"))
    if strain is not None and strain > ROUGH_STRAIN:
        out.append(
            f"failures are not rare against the tiers' intervals and recoveries: "
            f"Σ rate × (recovery + interval) = {strain:.2g}, above {ROUGH_STRAIN:g}, so the "
            "first-order waste, which drops terms of about that size relative to itself, is "
            "rough (it runs high); --simulate gives the recommendation"
        )
    return out


def recommend_tiers(scenario) -> dict[str, Any]:
    """Every tier's interval and its waste and money by the closed form, with the best
    single-tier answer beside it: the dict ``ckptsim optimize --json`` prints for a tiered
    scenario (without ``--simulate``; see the module docstring)."""
    from simulator.model import money

    closed_form = closed_form_plan(scenario)
    plan, single = closed_form["first_order"], closed_form["single"]
    intervals, waste = closed_form["tier_intervals_s"], closed_form["waste_fraction"]
    method, strain, raised = closed_form["method"], None, {}
    if closed_form["alone"] is None:  # first order: say where it is rough
        strain = first_order_strain(scenario, intervals)
        raised = plan["raised_to_write_s"]
    if waste >= 1.0:
        raise InputError(
            f"this job would make no headway: even at the tiers' best closed-form intervals, "
            f"saves, lost work and restarts would take {waste:.3g}x the wall time (at most 1); "
            "make saves or restarts cheaper, or failures rarer"
        )
    single_schedule = {n: math.inf for n in intervals} | {single["tier"]: single["interval_s"]}
    closed: dict[str, Any] = {
        "method": method or FIRST_ORDER_METHOD,
        "tier_intervals_s": intervals,
        "optimal_waste_fraction": waste,
        "job_waste_fraction": job_waste_fraction(scenario, waste, plan["final_save_s"]),
        "single_tier_interval_s": single["interval_s"],
        "single_tier_waste_fraction": single["waste_fraction"],
        "single_tier_job_waste_fraction": job_waste_fraction(
            scenario, single["waste_fraction"], single["final_save_s"]
        ),
        "storage_usd_per_day": storage_usd_per_day(scenario, intervals),
        "single_tier_storage_usd_per_day": storage_usd_per_day(scenario, single_schedule),
    }
    if scenario.gpus is not None and scenario.usd_per_gpu_hour is not None:
        day = money.gpu_usd_per_day(scenario.gpus, scenario.usd_per_gpu_hour)
        closed["usd_lost_per_day"] = float(day * waste)
        closed["single_tier_usd_lost_per_day"] = float(day * single["waste_fraction"])
        closed["usd_saved_per_day"] = (
            closed["single_tier_usd_lost_per_day"] - closed["usd_lost_per_day"]
        )
    out: dict[str, Any] = {
        "scenario": scenario.to_dict(),
        **closed,
        "recommended_by": "closed form",
        "closed_form": dict(closed),
        "first_order_strain": strain,
        "tier_failure_rates_per_h": {k: v * 3600.0 for k, v in plan["rates_per_s"].items()},
        "jit_failure_rates_per_h": _rates_per_h(scenario, "jit"),
        "every_step_failure_rates_per_h": _rates_per_h(scenario, "step"),
        "final_save_s": plan["final_save_s"],
        "single_tier": single["tier"],
        "assumes": {
            "tiers": [what_it_assumes(scenario, t) for t in scenario.tiers],
            "single_tier": what_it_assumes(
                scenario, next(t for t in scenario.tiers if t.name == single["tier"])
            ),
        },
        "warnings": _warnings(scenario, raised, single, strain),
    }
    out["recommendation"] = _advice(scenario, out)
    return out


def adopt_simulated(result: dict[str, Any], sim: dict[str, Any], scenario) -> dict[str, Any]:
    """``result`` (``recommend_tiers``) with the simulated optimum as its recommendation: the
    top-level keys become what the fresh check replicas measured for the search's answer (or
    for the first-order plan, when the check measured it wasting less: the search was noisy),
    and for the simulated single tier; the closed form stays under ``closed_form`` and the
    whole search under ``simulated``. Waste measured by simulation is the whole job's, its
    final save included, so ``job_waste_fraction`` is the same number."""
    out = dict(result)
    first = sim["waste_saved_vs_first_order"]["hi"] < 0
    pick = sim["first_order"] if first else sim
    intervals = dict(
        result["closed_form"]["tier_intervals_s"] if first else sim["tier_intervals_s"]
    )
    single = sim["single_tier_simulated"]
    single_schedule = {n: math.inf for n in intervals} | {
        sim["single_tier"]: sim["single_tier_interval_s"]
    }
    out.update(
        {
            "method": sim["method"],
            "recommended_by": (
                "closed form, simulated (it wasted less than the search's answer on the fresh "
                "replicas)"
                if first
                else "simulated optimum"
            ),
            "tier_intervals_s": intervals,
            "optimal_waste_fraction": pick["waste_fraction"],
            "optimal_waste_fraction_ci95": pick["waste_fraction_ci95"],
            "job_waste_fraction": pick["waste_fraction"],
            "single_tier": sim["single_tier"],
            "single_tier_interval_s": sim["single_tier_interval_s"],
            "single_tier_waste_fraction": single["waste_fraction"],
            "single_tier_waste_fraction_ci95": single["waste_fraction_ci95"],
            "single_tier_job_waste_fraction": single["waste_fraction"],
            "storage_usd_per_day": storage_usd_per_day(scenario, intervals),
            "single_tier_storage_usd_per_day": storage_usd_per_day(scenario, single_schedule),
            "simulated": sim,
        }
    )
    if "usd_lost_per_day" in pick:
        out["usd_lost_per_day"] = pick["usd_lost_per_day"]
        out["single_tier_usd_lost_per_day"] = single["usd_lost_per_day"]
        out["usd_saved_per_day"] = single["usd_lost_per_day"] - pick["usd_lost_per_day"]
    out["recommendation"] = _advice(scenario, out)
    return out


def _advice(scenario, r: dict[str, Any]) -> str:
    """The one-paragraph recommendation: what to save where, and on what it rests."""
    intervals = r["tier_intervals_s"]
    single, every = r["single_tier"], format_duration(r["single_tier_interval_s"])
    saved = [n for n, v in intervals.items() if math.isfinite(v)]
    others = [t.name for t in scenario.tiers if t.name != single]
    plain = len(scheduled(scenario.tiers)) == len(scenario.tiers)
    if "simulated" not in r:
        if plain and set(saved) <= {single}:
            text = f"save to {single} every {every}"
            if others:
                one = len(others) == 1
                text += (
                    f"; {', '.join(others)} take{'s' if one else ''} no saves on a schedule: at "
                    f"these failure rates {'it' if one else 'they'} would not pay for them"
                )
        elif r["optimal_waste_fraction"] < r["single_tier_waste_fraction"]:
            text = "the tiers as above"
        else:
            text = (
                f"one tier, {single} every {every}: at these rates the tiers' plan wastes no "
                "less than it alone"
            )
        return (
            f"Recommendation (closed form): {text}. For the simulated optimum, which is what "
            "ckptsim recommends, add --simulate."
        )
    sim = r["simulated"]
    diff = sim["waste_saved_vs_single_tier"]
    waste = (
        f"waste {format_percent(r['optimal_waste_fraction'])} (95% CI "
        f"{format_percent(r['optimal_waste_fraction_ci95'][0])} to "
        f"{format_percent(r['optimal_waste_fraction_ci95'][1])})"
    )
    if "usd_lost_per_day" in r:
        waste += f", {format_usd(r['usd_lost_per_day'])}/day lost"
    schedule = ", ".join(
        f"{n} every {format_duration(v)}" for n, v in intervals.items() if math.isfinite(v)
    )
    alone = (
        f"one tier, {single} every {every} (waste "
        f"{format_percent(r['single_tier_waste_fraction'])})"
    )
    which = "the closed-form plan" if r["recommended_by"].startswith("closed") else "the tiers"
    if diff["lo"] == diff["hi"] == 0:
        text = f"{alone}: the best schedule found saves to it only"
    elif diff["hi"] < 0:
        text = f"{alone}: it wasted less than the tiers on the same failures"
    elif diff["lo"] > 0:
        text = f"{which} ({schedule or 'final save only'}): {waste}"
    else:
        text = (
            f"{which} ({schedule or 'final save only'}: {waste}) or {alone}: no difference "
            f"is shown at {sim['replicas']} replicas, and one tier is the simpler"
        )
    return f"Recommendation (simulated, {sim['replicas']} replicas a schedule): {text}."
