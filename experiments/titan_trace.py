"""Study 3 — Titan's real GPU failures: exponential vs Weibull, judged on the replayed trace.

Both families are fitted (censored maximum likelihood, ``simulator.fitting.fit``) to the per-GPU
lifetimes of the Titan supercomputer's 18,688 GPU slots (``simulator.fitting.titan``). Each model
recommends an interval for a job on a random 8,192-slot subset: the exponential one by the
closed form, the Weibull one by simulation (per-GPU renewal processes at equilibrium age).
Then every recommendation — and the hourly habit — runs on the *real* failure times
replayed (random subset and random start in the trace per replica, common to all policies),
beside the best interval for the trace itself (an oracle found by the same search).
"""

from __future__ import annotations

import numpy as np
import pandas as pd

from experiments._report import Report, table
from simulator import analytic, optimize
from simulator.fitting import fit, titan
from simulator.model.scenario import Scenario
from simulator.optimize import paired_excess
from simulator.policies import FixedInterval

GPUS = 8192
WORK_H = 720.0
CHECKPOINT_S = 60.0
RESTART_S = 600.0
PRICE = 2.0
REPLICAS = 200
SEED = 1868


class TraceWindow:
    """A random subset of slots and a random start: one replica's real failure times."""

    def __init__(self, gpus: int, window_s: float):
        self.gpus, self.window_s = gpus, window_s

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        times = titan.failure_times_for_subset(self.gpus, rng)
        start = rng.uniform(0.0, titan.span_s() - self.window_s)
        return times[(times >= start) & (times < start + self.window_s)] - start


def main() -> None:
    rep = Report("titan_trace", "Titan GPU trace: exponential vs Weibull, replayed")
    durations, observed = titan.gpu_lifetimes()
    fits = {r.family: r for r in fit.fit_all(durations, observed, ("exponential", "weibull"))}
    expo, weib = fits["exponential"], fits["weibull"]
    shape = weib.params["shape"]
    base = dict(
        gpus=GPUS,
        checkpoint_s=CHECKPOINT_S,
        restart_s=RESTART_S,
        work_h=WORK_H,
        usd_per_gpu_hour=PRICE,
    )
    s_exp = Scenario(name="titan-exponential", gpu_mtbf_h=expo.mean_s / 3600, **base)
    s_weib = Scenario(
        name="titan-weibull",
        gpu_mtbf_h=weib.mean_s / 3600,
        failure=f"weibull:shape={shape:.4f}",
        **base,
    )
    tau_exp = float(analytic.optimal_interval(CHECKPOINT_S, s_exp.system_mtbf_s))
    res_w = optimize.optimize_by_simulation(
        s_weib, replicas=100, seed=SEED, adaptive=False, bootstrap=100, baselines=()
    )
    tau_weib = res_w["interval_s"]
    # The replayed trace: a job window long enough for the slowest candidate to finish.
    window = 4.0 * WORK_H * 3600.0
    trace = TraceWindow(GPUS, window)
    s_trace = Scenario(name="titan-trace", mtbf_h=s_exp.system_mtbf_s / 3600, **base)
    oracle = optimize.optimize_parameter(
        s_trace,
        FixedInterval,
        (600.0, 8 * 3600.0),
        replicas=REPLICAS,
        seed=SEED + 1,
        failure_times=trace,
        bootstrap=100,
    )
    labels = ["trace oracle", "exponential fit", "Weibull fit", "fixed 1 h", "fixed 3 h"]
    taus = [oracle.value, tau_exp, tau_weib, 3600.0, 10800.0]
    out = optimize.evaluate(
        s_trace,
        [FixedInterval(t) for t in taus],
        replicas=REPLICAS,
        seed=SEED + 2,
        failure_times=trace,
    )
    cost = out["cost_usd"]
    rows = []
    for i, (lab, t) in enumerate(zip(labels, taus, strict=True)):
        ex = paired_excess(cost[i], cost[0])
        rows.append(
            {
                "policy": lab,
                "interval (min)": t / 60.0,
                "mean cost (USD)": float(cost[i].mean()),
                "waste": float(1 - WORK_H * 3600 / out["wall_s"][i].mean()),
                "excess vs oracle (%)": 100 * ex["mean"] / cost[0].mean(),
                "95% CI (%)": f"{100 * ex['lo'] / cost[0].mean():.2f} – "
                f"{100 * ex['hi'] / cost[0].mean():.2f}",
                "failures/run": float(out["failures"][i].mean()),
            }
        )
    df = pd.DataFrame(rows)
    seen_rate = out["failures"][0].mean() / (out["wall_s"][0].mean() / 3600.0)
    rep.add(f"""
Data: {observed.size:,} GPU service periods, {int(observed.sum()):,} ending in a failure
(DBE/off-the-bus), the rest censored (``titan.gpu_lifetimes()``, first-event rule).

{fit.fits_table([weib, expo])}

The fits disagree sharply: Weibull shape {shape:.2f} (wear-out, not infant mortality) with a
mean life of {weib.mean_s / 3600:,.0f} h, against an exponential mean of
{expo.mean_s / 3600:,.0f} h. For a {GPUS:,}-GPU job that is a system MTBF of
{s_weib.system_mtbf_s / 3600:.1f} h (Weibull, long-run rate) vs
{s_exp.system_mtbf_s / 3600:.1f} h (exponential).

Recommendations (save {CHECKPOINT_S:g} s, restart {RESTART_S:g} s, {WORK_H:g} h of work):
exponential — closed-form optimum {tau_exp / 60:.1f} min; Weibull — optimum by simulation
{tau_weib / 60:.1f} min (95% CI {res_w["interval_ci_s"][0] / 60:.1f}–
{res_w["interval_ci_s"][1] / 60:.1f} min; 100 replicas, per-GPU renewals at equilibrium age).

Replay: {REPLICAS} replicas; each takes a random {GPUS:,} of the 18,688 slots and a random
start in the {titan.span_s() / 86400:.0f}-day trace, and replays the merged failure events
(``titan.failure_times_for_subset``) — the same windows for every policy (CRN). The fast
engine replays traces exactly as the DES does (tests/test_fastmc.py). The oracle is the
best fixed interval for the trace itself (same search as ``optimize``: grid + smoothed fit;
95% CI {oracle.ci[0] / 60:.1f}–{oracle.ci[1] / 60:.1f} min). Excess = paired cost difference
against the oracle, t 95% CI.

{table(df, ".4g")}

On the replayed windows the job saw {seen_rate:.3f} failures per hour of wall time
(an MTBF of {1 / seen_rate:.1f} h), against {3600 / s_exp.system_mtbf_s:.3f} (exponential
fit) and {3600 / s_weib.system_mtbf_s:.3f} (Weibull fit, long run).

**Verdict:** the better fit by AIC (Weibull, ΔAIC {expo.aic - weib.aic:,.0f}) recommends an
interval that costs {rows[2]["excess vs oracle (%)"]:.2f}% more than the oracle on the real
trace; the exponential fit's costs {rows[1]["excess vs oracle (%)"]:.2f}%. A lifetime model
can fit per-GPU ages better and still mis-state the job's failure rate, which is what sets
the interval: the Titan failures came in a wave, not at the equilibrium rate the Weibull
model implies.
""")
    rep.write()


if __name__ == "__main__":
    main()
