"""Study 2 — Llama-3 scale: 16,384 GPUs, the interval to use and the money at stake per day.

The embedded Llama-3 405B scenario (Meta's published 419 interruptions in 54 days on 16,384
GPUs; a 10 s save stall calibrated to the paper's > 90 % effective training time, see
reports/llama3-calibration.md; a 10 min restart assumed; $2/GPU-hour). The optimum by
simulation, its CI, and the excess cost of Young, Daly and the hourly/30 min/3 h habits,
measured as paired differences under common random numbers on fresh seeds.
"""

from __future__ import annotations

import pandas as pd

from experiments._report import Report, figure, table
from simulator import optimize, plots
from simulator.display import format_usd
from simulator.model.scenario import load_scenario
from simulator.sweep import parse_policy

REPLICAS = 200
SEED = 405


def main() -> None:
    rep = Report(
        "llama3_scale", "Llama-3 scale (16,384 GPUs): which interval, and what it is worth"
    )
    s = load_scenario("llama3")
    res = optimize.optimize_by_simulation(s, replicas=REPLICAS, seed=SEED, bootstrap=300)
    day_usd = s.gpus * s.usd_per_gpu_hour * 24.0
    pol = res["policies"]
    opt_mean = pol["optimum"]["mean"]
    wall_days = opt_mean / day_usd  # cost = wall × GPUs × price, so this is the run's length

    def per_day(p: dict) -> float:
        """Money lost per day of running, over the optimum's: the waste-fraction difference
        (waste = 1 - work / mean wall) times the cluster's day — `ckptsim optimize`'s
        definition, so the two agree."""
        useful_days = s.work_h / 24.0
        # waste_p - waste_opt = useful * (1/T_opt - 1/T_p), with T = run cost / day_usd
        t_opt, t_p = opt_mean, opt_mean + p["excess"]
        return day_usd * useful_days * day_usd * p["excess"] / (t_opt * t_p)

    rows = []
    for name, p in pol.items():
        rows.append(
            {
                "policy": name,
                "interval (min)": p["interval_s"] / 60.0,
                "run cost (USD)": p["mean"],
                "excess (USD)": p["excess"],
                "excess 95% CI": f"{format_usd(p['excess_lo'])} – {format_usd(p['excess_hi'])}",
                "excess (%)": p["excess_pct"],
                "excess per day (USD)": per_day(p),
            }
        )
    df = pd.DataFrame(rows)
    hourly = pol["fixed-1h"]
    waste = res["waste_fraction"]
    rep.add(f"""
Scenario: {s.name} — {s.gpus:,} GPUs, per-GPU MTBF {s.gpu_mtbf_h:,.0f} h (system MTBF
{s.system_mtbf_s / 3600:.2f} h), save stall {s.checkpoint_s:g} s, restart {s.restart_s:g} s,
{s.work_h:g} h of failure-free work, ${s.usd_per_gpu_hour:g}/GPU-hour
(cluster: {format_usd(day_usd)} per day). Failures: exponential per GPU.

Method: ``optimize.optimize_by_simulation`` with {REPLICAS} replicas (fast engine; CRN grid,
smoothed fit, 300-replica-bootstrap CI), then every policy re-run on {REPLICAS} fresh
replicas: the excess is the paired difference in run cost against the optimum, with a t
95% CI. Per day = the difference in waste fraction (1 − work / mean wall time) times the
cluster's day, as `ckptsim optimize` reports it (the optimum's run lasts {wall_days:.1f} days).

**Use {res["interval_s"] / 60:.1f} min** (95% CI {res["interval_ci_s"][0] / 60:.1f}–
{res["interval_ci_s"][1] / 60:.1f} min; the exact exponential optimum is
{res["exact_exponential_s"] / 60:.1f} min). Waste at the optimum: {100 * waste:.1f}% of wall
time, i.e. about {format_usd(waste * day_usd)} of every day's {format_usd(day_usd)}.

**Hourly instead of optimal costs {format_usd(per_day(hourly))} per day**
({hourly["excess_pct"]:.2f}% of the run, 95% CI {hourly["excess_pct_lo"]:.2f}–
{hourly["excess_pct_hi"]:.2f}%), {format_usd(hourly["excess"])} over the whole run.

{table(df, ".4g")}
""")
    rep.add(figure(plots.interval_curve(res, s, metric="cost"), "llama3-cost-curve"))
    specs = [f"fixed:{res['interval_s']:g}", "fixed:1800", "fixed:3600", "fixed:10800"]
    out = optimize.evaluate(s, [parse_policy(x) for x in specs], replicas=REPLICAS, seed=SEED + 1)
    names = ["optimum", "30 min", "1 h", "3 h"]
    bd = pd.DataFrame(
        {
            "policy": names,
            **{
                f"{k}_h": out[f"{k}_s"].mean(axis=1) / 3600
                for k in ("useful", "checkpoint", "lost", "recovery")
            },
        }
    )
    rep.add(
        "Where the time goes (mean hours per run, "
        f"{REPLICAS} replicas):\n\n{figure(plots.time_breakdown(bd), 'llama3-breakdown')}"
    )
    costs = dict(zip(names, out["cost_usd"], strict=True))
    here, there = float(out["cost_usd"][0].mean()), pol["optimum"]["mean"]
    rep.add(
        f"Distribution of the run's cost over a second, independent set of {REPLICAS} "
        f"replicas (seed {SEED + 1}), so its means differ from the table's by Monte-Carlo "
        f"noise: the optimum's mean is {format_usd(here)} here against {format_usd(there)} "
        f"above ({100 * (here / there - 1):+.2f} %).\n\n"
        f"{figure(plots.cost_distribution(costs), 'llama3-cost-distribution')}"
    )
    rep.write()


if __name__ == "__main__":
    main()
