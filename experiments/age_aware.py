"""Goal check — does the age-aware policy beat the best fixed interval on Weibull(0.7)?

Two readings of "Weibull(0.7) lifetimes", both with the Llama-3 preset's rates:

- per GPU: each of the 16,384 GPUs is a Weibull(0.7) renewal process at equilibrium age
  (the DES's model); the job's failures are their superposition;
- per job: the whole job renews at each failure and the time between failures is
  Weibull(0.7) with the job's MTBF (a job-level renewal process).

In each: the best fixed interval (simulated optimum), the age-aware ``Adaptive`` policy as
shipped, and ``Adaptive`` with its interval scaled by a tuned factor (the same search over
the factor). All then run on fresh common seeds; the gain is the paired cost difference.
"""

from __future__ import annotations

import pandas as pd

from experiments._report import Report, table
from simulator import analytic, optimize
from simulator.engines.results import goal_verdict
from simulator.model.scenario import load_scenario
from simulator.optimize import Scaled, paired_excess
from simulator.policies import Adaptive, FixedInterval

REPLICAS = 300
SEED = 70


def _case(s, process):
    anchor = float(analytic.optimal_interval(s.save_stall_s, s.system_mtbf_s))
    common = dict(replicas=REPLICAS, bootstrap=100, process=process)
    fixed = optimize.optimize_parameter(
        s, FixedInterval, (anchor / 8, anchor * 8), seed=SEED, **common
    )
    tuned = optimize.optimize_parameter(
        s, lambda f: Scaled(Adaptive(), f), (0.2, 5.0), seed=SEED, **common
    )
    pols = [FixedInterval(fixed.value), Adaptive(), Scaled(Adaptive(), tuned.value)]
    out = optimize.evaluate(s, pols, replicas=REPLICAS, seed=SEED + 1, process=process)
    c = out["cost_usd"]
    return fixed, tuned, c


def main() -> None:
    rep = Report("age_aware", "Age-aware policy vs the best fixed interval on Weibull(0.7)")
    s = load_scenario("llama3").with_overrides(failure="weibull:shape=0.7")
    rows, gains = [], {}
    for process, label in (("per_gpu", "per GPU (DES model)"), ("system", "per job (renewal)")):
        fixed, tuned, c = _case(s, process)
        base = c[0].mean()
        for i, name in enumerate(["best fixed", "adaptive", "adaptive × tuned factor"]):
            gain = paired_excess(c[0], c[i])  # positive: cheaper than the best fixed
            rows.append(
                {
                    "failure process": label,
                    "policy": name,
                    "setting": (
                        f"{fixed.value / 60:.1f} min"
                        if i == 0
                        else "as shipped"
                        if i == 1
                        else f"factor {tuned.value:.3f}"
                    ),
                    "mean cost (USD)": float(c[i].mean()),
                    "gain vs best fixed (%)": 100 * gain["mean"] / base,
                    "95% CI (%)": f"{100 * gain['lo'] / base:.3f} – {100 * gain['hi'] / base:.3f}",
                }
            )
            if i > 0:  # the interval of each age-aware policy's gain, in %
                gains.setdefault(label, []).append(
                    tuple(100 * gain[k] / base for k in ("mean", "lo", "hi"))
                )
    df = pd.DataFrame(rows)
    # A gain is claimed only where its whole interval is above zero (results.goal_verdict).
    lines = "\n".join(
        f"- {label}: best age-aware gain {m:+.3f}% (95% CI {lo:+.3f} to {hi:+.3f}%): "
        + {"met": "a gain", "not met": "no gain", "not shown": "no gain shown (a tie)"}[
            goal_verdict([(m, lo, hi)], at_least=0.0)
        ]
        for label, cases in gains.items()
        for m, lo, hi in [max(cases)]
    )
    rep.add(f"""
Scenario: Llama-3 preset ({s.gpus:,} GPUs, job MTBF {s.system_mtbf_s / 3600:.2f} h, save
{s.checkpoint_s:g} s, restart {s.restart_s:g} s, {s.work_h:g} h of work,
${s.usd_per_gpu_hour:g}/GPU-h) with Weibull shape 0.7.
Method: fast engine, {REPLICAS} replicas; optimum searches as in
``optimize.optimize_parameter`` (CRN, smoothed fit); final comparison on {REPLICAS} fresh
common seeds; gain = paired cost difference (best fixed − policy), t 95% CI. ``Adaptive``
gets the component model (per GPU: the GPU lifetime and 16,384 components; per job: the
job's lifetime) and the time since the last failure.

{table(df, ".4g")}

{lines}

Reading: with many GPUs at equilibrium age the superposed failures are nearly Poisson.
``Adaptive`` treats only the replaced GPU as new after a failure (``renews="one"``), so on
16,384 GPUs it lands on the exponential optimum and ties the best fixed interval; a policy
that took every GPU as new (``renews="all"``) would checkpoint several times too often.
Where the whole job renews at a failure, the hazard really does fall with time since
restart and the age-aware schedule gains on it. The numbers above say by how much, with
their intervals.
""")
    rep.write()


if __name__ == "__main__":
    main()
