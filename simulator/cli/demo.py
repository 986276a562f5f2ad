"""``ckptsim demo``: the whole path on the embedded Llama-3-scale scenario.

1. The closed-form recommendation (the same table as ``ckptsim optimize``).
2. A short discrete-event simulation of the recommended interval, checked against the
   closed form's expected wall time.
3. The optimum by simulation (common random numbers) with its confidence interval, and the
   interval plot written to a file the command names.
"""

from __future__ import annotations

import argparse
from pathlib import Path

from simulator.cli.common import add_budget_flags, positive_int, seed_int


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "demo",
        help="the whole path on the embedded Llama-3-scale scenario (what `make demo` runs)",
        description=__doc__,
        epilog="examples:\n  ckptsim demo\n  ckptsim demo --scenario opt175b --out /tmp/demo",
    )
    p.add_argument(
        "--scenario",
        default=None,
        metavar="FILE|PRESET",
        help="scenario to run instead of the embedded Llama-3 preset",
    )
    p.add_argument(
        "--replicas",
        type=positive_int,
        default=40,
        help="discrete-event replicas for the check (default 40)",
    )
    p.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    p.add_argument(
        "--out",
        default="out/demo",
        metavar="DIR",
        help="folder for the interval plot (default out/demo)",
    )
    add_budget_flags(p)
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator import analytic
    from simulator.cli.common import enforce_budget
    from simulator.cli.optimize import render
    from simulator.engines import budget
    from simulator.engines.des_replicas import simulate
    from simulator.errors import InputError
    from simulator.model.scenario import load_scenario
    from simulator.optimize import _engine, optimize_by_simulation
    from simulator.outfile import check_output
    from simulator.policies import USUAL_INTERVALS, FixedInterval
    from simulator.recommend import recommend

    scenario = load_scenario(args.scenario)
    if scenario.work_h is None:
        raise InputError(f"scenario {scenario.name!r} has no work_h (hours of compute)")
    if not scenario.has_mtbf:
        raise InputError(f"scenario {scenario.name!r} has no failure rate (mtbf_h or gpu_mtbf_h)")
    if Path(args.out).exists() and not Path(args.out).is_dir():
        raise InputError(f"--out {args.out} is a file; give a folder for the plot")
    check_output(Path(args.out) / f"{scenario.name}-interval.png")  # before the work
    tau0 = float(analytic.optimal_interval(scenario.save_stall_s, scenario.system_mtbf_s))
    est = budget.estimate(scenario, [tau0], args.replicas) + budget.estimate(
        scenario, budget.search_intervals(scenario), 100, engine=_engine(scenario, "auto")
    )
    enforce_budget(args, est)

    print("== 1. closed form " + "=" * 60)
    result = recommend(scenario)
    print(render(result))

    tau = float(result["optimal_interval_s"])
    print()
    print(f"== 2. discrete-event check: {args.replicas} replicas at the optimum " + "=" * 20)
    sim = simulate(scenario, FixedInterval(tau), replicas=args.replicas, seed=args.seed)
    s = sim.summary()
    predicted_h = (
        float(
            analytic.daly_wall_time(
                tau,
                scenario.save_stall_s,
                scenario.system_mtbf_s,
                scenario.recovery_s,
                scenario.work_s,
            )
        )
        / 3600.0
    )
    lo, hi = s["wall_h_ci95"]
    inside = "inside" if lo <= predicted_h <= hi else "OUTSIDE"
    print(
        f"  simulated wall time {s['wall_h_mean']:,.1f} h (95% CI {lo:,.1f}-{hi:,.1f} h), "
        f"{s['failures_mean']:,.0f} failures and {s['checkpoints_mean']:,.0f} saves per run"
    )
    print(f"  Daly's closed form  {predicted_h:,.1f} h: {inside} the simulated interval")

    print()
    print("== 3. optimum by simulation (common random numbers) " + "=" * 25)
    opt = optimize_by_simulation(scenario, replicas=100, seed=args.seed)
    ci_lo, ci_hi = opt["interval_ci_s"]
    print(
        f"  simulated optimum {opt['interval_s'] / 60:.1f} min (95% CI {ci_lo / 60:.1f}-"
        f"{ci_hi / 60:.1f} min) vs exact closed form {tau / 60:.1f} min "
        f"({opt['engine']} engine, {opt['replicas']} replicas)"
    )
    for usual in USUAL_INTERVALS:
        name, label = usual.name, usual.short
        entry = opt["policies"].get(name)
        if entry:
            print(
                f"  every {label:<6} costs {entry['excess_pct']:+6.2f}% (95% CI "
                f"{entry['excess_pct_lo']:+.2f}% to {entry['excess_pct_hi']:+.2f}%) more"
            )

    from simulator import plots

    ax = plots.interval_curve(opt, scenario)
    paths = plots.save(ax, Path(args.out) / f"{scenario.name}-interval")
    print()
    print("interval plot: " + ", ".join(str(p) for p in paths))
    return 0
