"""Can the Llama 3 preset reproduce the outcome its source published? Which δ and R can?

The Llama 3 paper (arXiv:2407.21783, §3.3.4) reports 419 unexpected interruptions in 54 days
on 16,384 GPUs (a system MTBF of 3.09 h) and "higher than 90% effective training time". The
save stall δ and the restart cost R are not published. This study takes the published MTBF,
computes the optimum's waste (Daly's expected wall time, exact for exponential failures, at
its exact minimiser) over a grid of δ and R, and finds for each R the largest δ that still
leaves 90 % of the wall time to training, and so which (δ, R) the published outcome allows.
Failure and checkpoint overheads are not the only losses a real run has, so the 10 % bound
on them is a necessary condition, not a fit.

    python -m experiments.llama3_calibration
"""

from __future__ import annotations

import pandas as pd

from experiments._calibrate import largest_within, optimum
from experiments._report import Report, table
from simulator.display import format_usd
from simulator.model.scenario import load_scenario

PUBLISHED_EFFECTIVE = 0.90  # "higher than 90% effective training time"
DELTAS_S = (3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
RESTARTS_S = (120.0, 300.0, 600.0, 1200.0)


def largest_delta_s(s, restart_s: float, bound: float) -> float | None:
    """The largest δ whose optimum wastes at most ``bound`` (None: not even δ → 0 does)."""
    return largest_within(s, "checkpoint_s", bound, low=1e-3, restart_s=restart_s)


def main() -> None:
    rep = Report("llama3_calibration", "Llama 3 preset against its published outcome")
    s = load_scenario("llama3")
    bound = 1.0 - PUBLISHED_EFFECTIVE
    preset = optimum(s)
    rep.add(
        f"Published: {s.gpus:,} GPUs, system MTBF {s.system_mtbf_s / 3600:.2f} h (419 "
        "interruptions in 54 days), and more than 90 % effective training time "
        "(arXiv:2407.21783, §3.3.4). Not published: the save stall δ and the restart cost R; "
        f"the preset assumes δ = {s.checkpoint_s:g} s and R = {s.restart_s:g} s."
    )
    rep.add(
        f"With those, the optimum (every {preset['optimal_interval_s'] / 60:.1f} min) wastes "
        f"**{preset['optimal_waste_fraction']:.1%}** of the wall time on saves, lost work and "
        f"restarts: more than the {bound:.0%} the published outcome leaves for all losses "
        "together. The preset's assumptions do not reproduce the source."
    )
    rows = []
    for r in RESTARTS_S:
        row = {"R": f"{r / 60:g} min"}
        for d in DELTAS_S:
            o = optimum(s, checkpoint_s=d, restart_s=r)
            mark = "" if o["optimal_waste_fraction"] <= bound else " ✗"
            row[f"δ = {d:g} s"] = f"{o['optimal_waste_fraction']:.1%}{mark}"
        rows.append(row)
    rep.add(
        "Waste at the optimum over δ and R (closed form: Daly's expected wall time at its exact "
        f"minimiser; ✗ marks more than {bound:.0%}):"
    )
    rep.add(table(pd.DataFrame(rows)))
    limits = []
    for r in (0.0, *RESTARTS_S):
        d = largest_delta_s(s, r, bound)
        limits.append(
            {
                "R": f"{r / 60:g} min",
                "largest δ for ≥ 90 % effective": "none" if d is None else f"{d:.1f} s",
            }
        )
    rep.add(
        f"For each R, the largest δ whose optimum leaves {PUBLISHED_EFFECTIVE:.0%} of the time:"
    )
    rep.add(table(pd.DataFrame(limits)))
    pure_io_s = s.checkpoint_bytes / 2e12
    rep.add(
        f"For scale: the preset's {s.checkpoint_bytes / 1e12:.2f} TB checkpoint at the paper's "
        f"2 TB/s sustained Tectonic throughput (§3.3.1) is {pure_io_s:.1f} s of pure I/O, so a "
        "stall of a few seconds to a few tens of seconds (an asynchronous or in-memory first "
        "copy) is what the published outcome implies. Even a free restart (R = 0) would allow "
        f"at most δ = {largest_delta_s(s, 0.0, bound):.1f} s; with a restart of minutes, as "
        f"real ones take, the preset's {s.checkpoint_s:g} s stall exceeds the bound."
    )
    usd = [
        optimum(s, checkpoint_s=d, restart_s=r)["usd_lost_per_day"]
        for r in RESTARTS_S
        for d in DELTAS_S
    ]
    feasible = [
        optimum(s, checkpoint_s=d, restart_s=r)["usd_lost_per_day"]
        for r in RESTARTS_S
        for d in DELTAS_S
        if optimum(s, checkpoint_s=d, restart_s=r)["optimal_waste_fraction"] <= bound
    ]
    rep.add(
        f"The headline (dollars lost per day at the optimum, ${s.usd_per_gpu_hour:.2f} per "
        f"GPU-hour) over this whole grid runs from {format_usd(min(usd))} to "
        f"{format_usd(max(usd))}; over the (δ, R) the published outcome allows, from "
        f"{format_usd(min(feasible))} to {format_usd(max(feasible))}. The preset's "
        f"{format_usd(preset['usd_lost_per_day'])} lies above every one of those."
    )
    rep.write()


if __name__ == "__main__":
    main()
