"""Can the Llama 3 preset reproduce the outcome its source published? Which δ and R can?

The Llama 3 paper (arXiv:2407.21783, §3.3.4) reports 419 unexpected interruptions in 54 days
on 16,384 GPUs (a system MTBF of 3.09 h) and "higher than 90% effective training time". The
save stall δ and the restart cost R are not published. This study takes the published MTBF,
computes the optimum's waste (Daly's expected wall time, exact for exponential failures, at
its exact minimiser) over a grid of δ and R, and finds for each R the largest δ that still
leaves 90 % of the wall time to training, and so which (δ, R) the published outcome allows.
Failure and checkpoint overheads are not the only losses a real run has, so the 10 % bound
on them is a necessary condition, not a fit. The preset's δ is chosen inside that region and
checked by discrete-event simulation; the study also gives the tiered route to the same
outcome (`llama3-tiers`) and the range of the README's headline dollars over the (δ, R) the
outcome allows.

    python -m experiments.llama3_calibration
"""

from __future__ import annotations

import pandas as pd

from experiments._calibrate import largest_within, optimum
from experiments._report import Report, table
from simulator.display import format_duration, format_usd
from simulator.engines.des_replicas import simulate
from simulator.engines.results import goal_verdict, outward
from simulator.model.scenario import load_scenario
from simulator.model.tiers import first_order_plan as tiers_plan
from simulator.policies import FixedInterval

PUBLISHED_EFFECTIVE = 0.90  # "higher than 90% effective training time"
DELTAS_S = (3.0, 5.0, 10.0, 20.0, 30.0, 60.0)
RESTARTS_S = (120.0, 300.0, 600.0, 1200.0)
UNCALIBRATED_DELTA_S = 60.0  # the preset's stall before this calibration
REPLICAS, SEED = 40, 2407  # the discrete-event check of the calibrated preset


def largest_delta_s(s, restart_s: float, bound: float) -> float | None:
    """The largest δ whose optimum wastes at most ``bound`` (None: not even δ → 0 does)."""
    return largest_within(s, "checkpoint_s", bound, low=1e-3, restart_s=restart_s)


def simulated_waste(s, interval_s: float) -> tuple[float, float, float]:
    """Waste (mean, 95 % CI) of ``REPLICAS`` discrete-event replicas saving every ``interval_s``.

    Waste is 1 − work / wall per replica; its interval comes from the wall time's, which is
    monotone in it.
    """
    sim = simulate(s, FixedInterval(interval_s), replicas=REPLICAS, seed=SEED, progress=False)
    summary = sim.summary()
    return tuple(1.0 - s.work_h / w for w in (summary["wall_h_mean"], *summary["wall_h_ci95"]))


def main() -> None:
    rep = Report("llama3_calibration", "Llama 3 preset against its published outcome")
    s = load_scenario("llama3")
    bound = 1.0 - PUBLISHED_EFFECTIVE
    preset = optimum(s)
    before = optimum(s, checkpoint_s=UNCALIBRATED_DELTA_S)
    rep.add(
        f"Published: {s.gpus:,} GPUs, system MTBF {s.system_mtbf_s / 3600:.2f} h (419 "
        "interruptions in 54 days), and more than 90 % effective training time "
        "(arXiv:2407.21783, §3.3.4). Not published: the save stall δ and the restart cost R. "
        f"The `llama3` preset assumes R = {s.restart_s / 60:g} min and takes δ = "
        f"{s.checkpoint_s:g} s from the calibration below; before it, the preset assumed "
        f"δ = {UNCALIBRATED_DELTA_S:g} s, whose optimum wastes "
        f"{before['optimal_waste_fraction']:.1%}: more than the {bound:.0%} the published "
        "outcome leaves for all losses together."
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
    limit_s = largest_delta_s(s, s.restart_s, bound)
    rep.add(
        f"For scale: the preset's {s.checkpoint_bytes / 1e12:.2f} TB checkpoint at the paper's "
        f"2 TB/s sustained Tectonic throughput (§3.3.1) is {pure_io_s:.1f} s of pure I/O, so a "
        "stall of a few seconds to a few tens of seconds (an asynchronous or in-memory first "
        "copy) is what the published outcome implies. Even a free restart (R = 0) would allow "
        f"at most δ = {largest_delta_s(s, 0.0, bound):.1f} s."
    )

    sim_mean, lo_w, hi_w = simulated_waste(s, preset["optimal_interval_s"])
    verdict = goal_verdict([(sim_mean, lo_w, hi_w)], at_most=bound)
    low, high = outward(100 * lo_w, 100 * hi_w)  # a bound past the goal never prints inside
    rep.add(
        "## The calibration\n\n"
        f"With R = {s.restart_s / 60:g} min the published outcome needs δ ≤ {limit_s:.1f} s. "
        f"The preset takes δ = {s.checkpoint_s:g} s: {s.checkpoint_s / pure_io_s:.1f}x the "
        "pure I/O, leaving room for coordination and stragglers, and below the bound with "
        "room for the losses this model leaves out (stragglers, slow steps, evaluation). "
        'The paper gives the intent, not the number: it aims "to minimize GPU pause time '
        'during checkpointing and increase checkpoint frequency" (§3.3.1).\n\n'
        f"The calibrated preset's optimum saves every "
        f"{preset['optimal_interval_s'] / 60:.1f} min and wastes "
        f"**{preset['optimal_waste_fraction']:.1%}** in closed form "
        f"({1 - preset['optimal_waste_fraction']:.1%} effective). Simulated ({REPLICAS} "
        f"discrete-event replicas of the whole {s.work_h:,.0f} h job at that interval, seed "
        f"{SEED}): {sim_mean:.2%} (95 % CI {low}% to {high}%). Waste ≤ {bound:.0%} over "
        f"the whole interval: **{verdict}**."
    )
    tiers = load_scenario("llama3-tiers")
    plan = tiers_plan(tiers)
    persistent = next(t for t in tiers.tiers if t.name == "persistent")
    shown = ", ".join(
        f"{name} every {format_duration(x)}" for name, x in plan["tier_intervals_s"].items()
    )
    rep.add(
        "The other way to the published outcome keeps a slow persistent save and puts a fast "
        "first copy in front of it. The `llama3-tiers` preset (Llama 3's interruptions split "
        "by cause, Table 5, with a Gemini-style host-memory/peer tier that survives every "
        f"class but silent data corruption) keeps a {persistent.checkpoint_s:g} s synchronous "
        f"persistent save; at its first-order plan ({shown}) it wastes "
        f"**{plan['waste_fraction']:.1%}** (`reports/tiers.md` simulates it). Both routes "
        "are consistent with the source; the single-tier preset is the default because it "
        "has the fewest unpublished numbers."
    )

    grid = [(d, r, optimum(s, checkpoint_s=d, restart_s=r)) for r in RESTARTS_S for d in DELTAS_S]
    allowed = [(d, r, o) for d, r, o in grid if o["optimal_waste_fraction"] <= bound]

    def hourly_excess(o: dict) -> float:
        return next(x for x in o["rows"] if x["key"] == "hourly")["excess_usd_per_day"]

    rows = [
        {
            "δ": f"{d:g} s",
            "R": f"{r / 60:g} min",
            "optimum": f"{o['optimal_interval_s'] / 60:.1f} min",
            "waste": f"{o['optimal_waste_fraction']:.1%}",
            "lost per day at the optimum (USD)": o["usd_lost_per_day"],
            "hourly saves cost more per day (USD)": hourly_excess(o),
        }
        for d, r, o in allowed
    ]
    usd = [o["usd_lost_per_day"] for _, _, o in grid]
    lost = [o["usd_lost_per_day"] for _, _, o in allowed]
    gain = [hourly_excess(o) for _, _, o in allowed]
    rep.add(
        "## The headline over the plausible δ and R\n\n"
        f"The README's headline is what the optimum saves per day over hourly saves "
        f"({format_usd(hourly_excess(preset))} with the preset) at ${s.usd_per_gpu_hour:.2f} "
        "per GPU-hour. Over every (δ, R) of the grid above that the published outcome allows:"
    )
    rep.add(table(pd.DataFrame(rows)))
    rep.add(
        f"Over those, the money lost per day at the optimum runs from {format_usd(min(lost))} "
        f"to {format_usd(max(lost))} (the preset: {format_usd(preset['usd_lost_per_day'])}), "
        f"and what the optimum saves over hourly saves from {format_usd(min(gain))} to "
        f"{format_usd(max(gain))}. Over the whole grid, allowed or not, the money lost per day "
        f"runs from {format_usd(min(usd))} to {format_usd(max(usd))}; with the uncalibrated "
        f"{UNCALIBRATED_DELTA_S:g} s stall it was {format_usd(before['usd_lost_per_day'])}."
    )
    rep.write()


if __name__ == "__main__":
    main()
