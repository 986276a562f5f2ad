"""The closed-form comparison behind ``ckptsim optimize``: every usual interval, costed.

For exponential failures with system MTBF M, save cost δ and restart cost R, Daly's expected
wall time T_w(τ) is exact, so its minimiser τ* (Lambert W) is the best fixed interval.
:func:`recommend` sets Young's, Daly's first- and higher-order estimates and the usual
defaults (``policies.USUAL_INTERVALS``, every 500/1000 steps) beside τ*, each with its waste,
expected wall time and money lost per day, plus warnings and a one-paragraph recommendation:
the dict ``ckptsim optimize --json`` prints. The CLI only parses flags and renders it; ``ckptsim
demo`` and the reports call it too.

An interval here is compute time between saves (τ); each save stalls training for δ on top.
"""

from __future__ import annotations

import math
from typing import Any

from simulator.display import (
    format_duration,
    format_hours,
    format_percent,
    format_steps,
    format_usd,
)
from simulator.errors import InputError
from simulator.policies import USUAL_INTERVALS, USUAL_STEPS

__all__ = ["FORMULA_KEYS", "HOPELESS_WASTE", "recommend", "scenario_recovery_s", "scenario_stall_s"]

HOUR = 3600.0


def scenario_stall_s(scenario) -> float:
    """δ from a scenario: the staging copy of an async save, else the write (or checkpoint_s)."""
    stall = getattr(scenario, "save_stall_s", None)
    return float(scenario.checkpoint_s if stall is None else stall)


def scenario_recovery_s(scenario) -> float:
    """R from a scenario: detection + restart + checkpoint load + warm-up, seconds."""
    recovery = getattr(scenario, "recovery_s", None)
    return float(scenario.restart_s if recovery is None else recovery)


def recommend(
    scenario,
    step_s: float | None = None,
    *,
    checkpoint_s: float | None = None,
    source: str | None = None,
) -> dict[str, Any]:
    """Closed-form intervals, usual defaults and their costs for ``scenario`` (a dict).

    ``step_s`` (seconds per training step) adds the every-500/1000-steps defaults and step
    counts; ``checkpoint_s`` replaces the scenario's save stall δ (a measured cost);
    ``source`` says where the scenario came from. Money needs ``gpus`` and
    ``usd_per_gpu_hour``; expected wall time needs ``work_h``.
    """
    from simulator import analytic
    from simulator.model import money

    if step_s is not None and not (math.isfinite(step_s) and step_s > 0):
        raise InputError(f"step_s must be a positive number of seconds, got {step_s!r}")
    if checkpoint_s is not None and not (math.isfinite(checkpoint_s) and checkpoint_s > 0):
        raise InputError(f"checkpoint_s must be a positive number of seconds, got {checkpoint_s!r}")
    mtbf_s = scenario.system_mtbf_s
    delta_s = scenario_stall_s(scenario) if checkpoint_s is None else float(checkpoint_s)
    restart_s = scenario_recovery_s(scenario)
    work_h, gpus, price = scenario.work_h, scenario.gpus, scenario.usd_per_gpu_hour
    priced = gpus is not None and price is not None

    candidates = [
        ("young", "Young (1974)", analytic.young_interval(delta_s, mtbf_s)),
        (
            "daly_first_order",
            "Daly first order",
            analytic.daly_first_order_interval(delta_s, mtbf_s, restart_s),
        ),
        ("daly", "Daly higher order", analytic.daly_interval(delta_s, mtbf_s)),
        ("optimal", "exact optimum", analytic.optimal_interval(delta_s, mtbf_s)),
    ]
    candidates += [(u.label.replace(" ", "_"), u.label, u.interval_s) for u in USUAL_INTERVALS]
    if step_s is not None:
        candidates += [(f"every_{n}_steps", f"every {n} steps", n * step_s) for n in USUAL_STEPS]

    def evaluate(key, label, interval_s):
        waste = float(analytic.waste_fraction(interval_s, delta_s, mtbf_s, restart_s))
        row = {"key": key, "label": label, "interval_s": float(interval_s), "waste_fraction": waste}
        if step_s is not None:
            row["steps"] = interval_s / step_s
        if work_h is not None:
            row["expected_wall_h"] = float(
                money.expected_wall_h(interval_s, delta_s, mtbf_s, restart_s, work_h)
            )
        if priced:
            row["usd_lost_per_day"] = float(money.usd_lost_per_day(gpus, price, waste))
        return row

    rows = [evaluate(*c) for c in candidates]
    best = next(r for r in rows if r["key"] == "optimal")
    # Nothing beats the exact optimum; a negative excess could only be float rounding.
    for row in rows:
        row["excess_waste_fraction"] = max(0.0, row["waste_fraction"] - best["waste_fraction"])
        if work_h is not None:
            row["excess_wall_h"] = max(0.0, row["expected_wall_h"] - best["expected_wall_h"])
        if priced:
            excess = row["usd_lost_per_day"] - best["usd_lost_per_day"]
            row["excess_usd_per_day"] = max(0.0, excess)

    by_key = {r["key"]: r for r in rows}
    result: dict[str, Any] = {
        "scenario": scenario.to_dict(),
        "scenario_source": source,
        "failure": scenario.failure,
        "gpus": gpus,
        "system_mtbf_s": mtbf_s,
        "system_mtbf_h": mtbf_s / HOUR,
        "checkpoint_s": delta_s,
        "restart_s": restart_s,
        "step_s": step_s,
        "young_interval_s": by_key["young"]["interval_s"],
        "daly_first_order_interval_s": by_key["daly_first_order"]["interval_s"],
        "daly_interval_s": by_key["daly"]["interval_s"],
        "optimal_interval_s": best["interval_s"],
        "optimal_waste_fraction": best["waste_fraction"],
    }
    if work_h is not None:
        result["work_h"] = work_h
        result["expected_wall_h"] = best["expected_wall_h"]
    if priced:
        day = money.daily_cost(
            gpus=gpus,
            usd_per_gpu_hour=price,
            waste_fraction=best["waste_fraction"],
            checkpoint_bytes=scenario.checkpoint_bytes,
            checkpoints_retained=scenario.checkpoints_retained,
            usd_per_gb_month=scenario.usd_per_gb_month,
        )
        result["usd_per_gpu_hour"] = price
        result["ideal_usd_per_day"] = day.ideal_usd
        result["usd_lost_per_day"] = day.lost_usd
        result["storage_usd_per_day"] = day.storage_usd
        if work_h is not None:
            job = money.job_cost(
                gpus=gpus,
                usd_per_gpu_hour=price,
                work_h=work_h,
                expected_wall_h=best["expected_wall_h"],
                storage_usd_per_day=day.storage_usd,
            )
            result["ideal_job_usd"] = job.ideal_usd
            result["expected_job_usd"] = job.expected_usd
    result["rows"] = rows
    result["warnings"] = _warnings(scenario, delta_s, mtbf_s, best["interval_s"])
    result["recommendation"] = _recommendation(result)
    return result


def _warnings(scenario, delta_s: float, mtbf_s: float, interval_s: float) -> list[str]:
    warnings = []
    write_s = getattr(scenario, "background_write_s", 0.0)
    if write_s > min(interval_s, mtbf_s):
        what, bound = ("the interval", interval_s)
        if write_s > mtbf_s:
            what, bound = ("the system MTBF", mtbf_s)
        warnings.append(
            f"the async save's background write ({format_duration(write_s)}) outlasts {what}"
            f" ({format_duration(bound)}); the closed forms count only its "
            "stall, so saves that wait for the write, and failures before it lands, are left "
            "out — check with `ckptsim optimize --simulate`"
        )
    if delta_s >= mtbf_s:
        branch = " (Daly's τ = M branch)" if delta_s >= 2 * mtbf_s else ""
        warnings.append(
            f"checkpointing cannot keep up: a save ({format_duration(delta_s)}) outlasts the "
            f"system MTBF ({format_duration(mtbf_s)}){branch}; make saves cheaper first"
        )
    if not scenario.failure.strip().lower().startswith("exponential"):
        warnings.append(
            f"the closed forms assume exponential failures; {scenario.failure} enters only "
            "through its mean (system MTBF) — check with `ckptsim simulate`"
        )
    return warnings


HOPELESS_WASTE = 0.99
"""At this waste (wall time 100x the work) no interval is worth recommending."""


def _recommendation(result: dict[str, Any]) -> str:
    rows = result["rows"]
    best = next(r for r in rows if r["key"] == "optimal")
    if not best["waste_fraction"] < HOPELESS_WASTE or not math.isfinite(best["interval_s"]):
        return (
            "Recommendation: none. No interval lets this job make progress: even the best "
            f"wastes {format_percent(best['waste_fraction'])} of the time (a save of "
            f"{format_duration(result['checkpoint_s'])} and a restart of "
            f"{format_duration(result['restart_s'])} against a system MTBF of "
            f"{format_duration(result['system_mtbf_s'])}). Make saves and restarts cheaper or "
            "failures rarer first."
        )
    priced = "usd_lost_per_day" in best
    text = f"Recommendation: save every {format_duration(best['interval_s'])} of compute"
    if "steps" in best:
        text += f" (every {format_steps(best['steps'])} steps)"
    text += f": {format_percent(best['waste_fraction'])} waste"
    if priced:
        text += f", {format_usd(best['usd_lost_per_day'])}/day lost"
    defaults = [r for r in rows if r["key"] not in FORMULA_KEYS]
    closest = min(defaults, key=lambda r: r["waste_fraction"])
    if priced and closest["excess_usd_per_day"] >= 0.5:
        excess = f"loses {format_usd(closest['excess_usd_per_day'])}/day more"
    elif "excess_wall_h" in closest and not closest["excess_wall_h"] < 0.05:
        excess = f"takes {format_hours(closest['excess_wall_h'])} longer"
    elif not priced and closest["excess_waste_fraction"] >= 5e-5:
        excess = f"wastes {100 * closest['excess_waste_fraction']:.2f} points more"
    else:
        excess = "is as good"
    return f"{text}; the best usual default ({closest['label']}) {excess}."


FORMULA_KEYS = ("young", "daly_first_order", "daly", "optimal")
