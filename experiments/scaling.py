"""Study 5 — scaling from 1,000 to 100,000 GPUs: how the interval and the waste grow, and
where a fixed hourly checkpoint stops being viable.

Per-GPU failure rate, save stall, restart and price from the Llama-3 preset; only the GPU
count changes (the system MTBF shrinks as 1/N). At each size: the optimum by simulation
with its CI, its waste, and the paired excess cost of checkpointing hourly.
"""

from __future__ import annotations

import math

import numpy as np
import pandas as pd

from experiments._report import Report, figure, table
from simulator import optimize, plots
from simulator.model.scenario import load_scenario

SIZES = [int(round(x, -2)) for x in np.geomspace(1000, 100000, 9)]
REPLICAS = 100
SEED = 100
VIABLE_PCT = 5.0  # hourly is "viable" while it costs less than this much more than the optimum


def main() -> None:
    rep = Report("scaling", "Scaling: 1,000 to 100,000 GPUs")
    base = load_scenario("llama3")
    rows = []
    for i, n in enumerate(SIZES):
        s = base.with_overrides(gpus=n)
        res = optimize.optimize_by_simulation(
            s, replicas=REPLICAS, seed=SEED + i, adaptive=False, bootstrap=100
        )
        p = res["policies"]
        wall = {k: p[k]["mean"] / (n * s.usd_per_gpu_hour / 3600.0) for k in p}
        rows.append(
            {
                "gpus": n,
                "system MTBF (h)": s.system_mtbf_s / 3600.0,
                "interval_s": res["interval_s"],
                "interval_s_lo": res["interval_ci_s"][0],
                "interval_s_hi": res["interval_ci_s"][1],
                "waste at optimum": 1 - s.work_s / wall["optimum"],
                "waste hourly": 1 - s.work_s / wall["fixed-1h"],
                "hourly excess (%)": p["fixed-1h"]["excess_pct"],
                "hourly excess CI (%)": f"{p['fixed-1h']['excess_pct_lo']:.2f}–"
                f"{p['fixed-1h']['excess_pct_hi']:.2f}",
                "Young excess (%)": p["young"]["excess_pct"],
            }
        )
        print(f"{n} GPUs done", flush=True)
    df = pd.DataFrame(rows)
    # Interpolate the size at which hourly's excess crosses the threshold (log size).
    x, y = np.log(df["gpus"].to_numpy(float)), df["hourly excess (%)"].to_numpy()
    above = np.nonzero(y > VIABLE_PCT)[0]
    if above.size and above[0] > 0:
        j = above[0]
        cross = math.exp(np.interp(VIABLE_PCT, [y[j - 1], y[j]], [x[j - 1], x[j]]))
        verdict = (
            f"**A fixed hourly checkpoint stops being viable at about {cross:,.0f} GPUs**"
            f" (system MTBF {base.gpu_mtbf_h / cross:.1f} h): beyond it, hourly costs more "
            f"than {VIABLE_PCT:g}% over the optimum (linear interpolation in log size "
            "between the two grid points that straddle the threshold)."
        )
    elif above.size:
        verdict = f"Hourly already costs over {VIABLE_PCT:g}% more at the smallest size."
    else:
        verdict = f"Hourly stays within {VIABLE_PCT:g}% of the optimum over the whole range."
    slope = np.polyfit(x, np.log(df["interval_s"].to_numpy()), 1)[0]
    shown = df.drop(columns=["interval_s_lo", "interval_s_hi"]).copy()
    shown["interval (min)"] = shown.pop("interval_s") / 60.0
    rep.add(f"""
Method: the Llama-3 preset (per-GPU MTBF {base.gpu_mtbf_h:,.0f} h, exponential; save
{base.checkpoint_s:g} s; restart {base.restart_s:g} s; {base.work_h:g} h of work;
${base.usd_per_gpu_hour:g}/GPU-hour) at {len(SIZES)} sizes. At each: the optimum by
simulation ({REPLICAS} replicas, CRN grid + smoothed fit, 100-resample bootstrap CI), then the
optimum, Young and fixed 1 h on {REPLICAS} fresh replicas; excess = paired cost difference
against the optimum (t 95% CI). Waste = 1 − work / mean wall time.

{table(shown, ".4g")}

The optimum interval falls as N^{slope:.3f} (least-squares slope on log–log; Young's law
predicts N^-0.5 while δ ≪ M). {verdict}
""")
    rep.add(figure(plots.optimum_vs_size(df), "scaling-interval"))
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7, 4.2), layout="constrained")
    ax.plot(df["gpus"], 100 * df["waste at optimum"], "o-", label="optimum")
    ax.plot(df["gpus"], 100 * df["waste hourly"], "s-", label="hourly")
    ax.set_xscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("waste (% of wall time)")
    ax.legend()
    rep.add(figure(ax, "scaling-waste"))
    rep.write()


if __name__ == "__main__":
    main()
