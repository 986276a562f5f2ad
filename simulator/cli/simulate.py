"""``ckptsim simulate``: Monte-Carlo replicas of the discrete-event cluster model.

Where ``ckptsim optimize`` gives the closed-form mean for exponential failures, this runs the
job itself — per-GPU lifetimes (exponential, Weibull, lognormal), failures during saves and
recoveries, spare nodes and repairs, asynchronous saves — many times, and reports the
distribution of wall time, lost work, overheads and cost: mean, 95% CI, p50/p90/p99.
"""

from __future__ import annotations

import argparse
import math
import sys

from simulator.cli.common import (
    add_budget_flags,
    add_scenario_flags,
    nonnegative_float,
    positive_float,
    positive_int,
    seed_int,
)
from simulator.errors import InputError

POLICIES = ("young", "daly", "optimal", "adaptive")

DESCRIPTION = """\
Simulate a training job on a failing cluster, many times over, and report the distribution
(not just the mean) of its wall time, lost work, checkpoint and recovery overhead and cost.
Every GPU (and, with --node-mtbf-h, every node) ages and fails on its own; a failure can
strike while computing, while a checkpoint is written (that save does not count) or during
recovery, and rolls the job back to its last completed checkpoint. Saves follow a policy
(--policy) or a fixed interval (--interval-s)."""

EPILOG = """\
examples:
  ckptsim simulate
      the embedded default: Llama 3 405B on 16,384 H100s, optimal interval, 100 replicas
  ckptsim simulate --scenario llama3 --failure weibull:shape=0.7 --policy young --json
  ckptsim simulate --gpus 1024 --gpu-mtbf-h 50000 --checkpoint-s 90 --restart-s 900 \\
      --work-h 720 --interval-s 3600 --spares 2 --repair-h 24 --out runs.parquet

Replicas run in parallel on all cores and are reproducible from --seed on any core count.
Intervals are compute time between saves; --out writes one row per replica (.csv/.parquet)."""


def register(subparsers) -> None:
    parser = subparsers.add_parser(
        "simulate",
        help="Monte-Carlo discrete-event simulation: distribution of wall time and cost",
        description=DESCRIPTION,
        epilog=EPILOG,
    )
    parser.add_argument(
        "scenario_file",
        nargs="?",
        metavar="SCENARIO",
        help="scenario TOML file or preset (same as --scenario)",
    )
    add_scenario_flags(parser)
    pol = parser.add_argument_group("when to save")
    which = pol.add_mutually_exclusive_group()
    which.add_argument(
        "--policy",
        choices=POLICIES,
        help="interval policy (default: optimal, the exact optimum for exponential failures)",
    )
    which.add_argument(
        "--interval-s",
        type=positive_float("seconds"),
        metavar="S",
        help="save every S seconds of compute instead of a policy",
    )
    model = parser.add_argument_group("cluster model (defaults: Daly's model)")
    model.add_argument(
        "--detection-s",
        type=nonnegative_float("seconds"),
        metavar="S",
        help="time until a failure is noticed",
    )
    model.add_argument(
        "--warmup-s",
        type=nonnegative_float("seconds"),
        metavar="S",
        help="time after loading until full speed",
    )
    model.add_argument(
        "--spares", type=_count, metavar="K", help="spare nodes (default: always one free)"
    )
    model.add_argument(
        "--repair-h",
        type=positive_float("hours"),
        metavar="H",
        help="mean time to repair a failed node",
    )
    model.add_argument(
        "--node-mtbf-h",
        type=positive_float("hours"),
        metavar="H",
        help="per-node MTBF of node-level failures",
    )
    model.add_argument(
        "--staging-s",
        type=positive_float("seconds"),
        metavar="S",
        help="save asynchronously: training stalls S s, the write (--checkpoint-s) runs behind",
    )
    model.add_argument(
        "--component-age",
        choices=("stationary", "new"),
        help="GPU ages at the start: long in service (default) or all new",
    )
    mc = parser.add_argument_group("Monte Carlo and output")
    mc.add_argument(
        "--replicas", type=positive_int, default=100, metavar="N", help="replicas (default 100)"
    )
    mc.add_argument("--seed", type=seed_int, default=0, help="random seed (default 0)")
    mc.add_argument(
        "--workers",
        type=positive_int,
        metavar="P",
        help="worker processes (default and most: all cores)",
    )
    mc.add_argument("--out", metavar="FILE", help="write per-replica records: .csv or .parquet")
    mc.add_argument("--json", action="store_true", help="print one JSON object instead")
    mc.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_budget_flags(parser)
    parser.set_defaults(func=run)


def _count(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r} is not a whole number") from None
    if value < 0:
        raise argparse.ArgumentTypeError(f"must be a non-negative whole number, got {text}")
    return value


def _scenario(args: argparse.Namespace):
    from simulator.cli.common import scenario_from_args, uses_default_preset

    if args.scenario_file:
        if args.scenario and args.scenario != args.scenario_file:
            raise InputError("give the scenario once: as SCENARIO or as --scenario, not both")
        args.scenario = args.scenario_file
    extra = {
        "detection_s": args.detection_s,
        "warmup_s": args.warmup_s,
        "spares": args.spares,
        "repair_h": args.repair_h,
        "node_mtbf_h": args.node_mtbf_h,
        "staging_s": args.staging_s,
        "async_checkpoint": True if args.staging_s is not None else None,
        "component_age": args.component_age,
    }
    return scenario_from_args(args, extra), uses_default_preset(args, extra)


def run(args: argparse.Namespace) -> int:
    from simulator import budget
    from simulator.cli.common import enforce_budget, output_path, print_json, workers_for
    from simulator.montecarlo import simulate
    from simulator.policies import make_policy
    from simulator.results import OUT_SUFFIXES
    from simulator.scenario import DEFAULT_PRESET

    out = output_path(args, OUT_SUFFIXES)  # before the work, not after it
    scenario, default = _scenario(args)
    if not scenario.has_mtbf:
        raise InputError(
            "no failure rate: give --mtbf-h HOURS (system MTBF), or --gpus N with "
            "--gpu-mtbf-h HOURS, or a --scenario (file with mtbf_h or gpu_mtbf_h, or a preset)"
        )
    if scenario.work_h is None:
        raise InputError("simulating a job needs --work-h HOURS (failure-free compute)")
    if default:
        print(
            f"note: no scenario or flags given, so this is the embedded default preset "
            f"{DEFAULT_PRESET} ({scenario.gpus:,} GPUs); see --help to describe your own job",
            file=sys.stderr,
        )
    policy = make_policy(args.policy or "optimal", interval_s=args.interval_s)
    workers = workers_for(args, args.replicas, "ckptsim simulate")
    intervals = budget.policy_intervals(scenario, [policy])
    enforce_budget(
        args, budget.estimate(scenario, intervals, args.replicas, workers=workers), workers
    )
    result = simulate(
        scenario,
        policy,
        replicas=args.replicas,
        seed=args.seed,
        workers=workers,
        progress=not args.no_progress and sys.stderr.isatty(),
    )
    summary = result.summary()
    summary["interval_s"] = args.interval_s
    if out is not None:
        summary["out"] = str(result.to_file(out))
    if args.json:
        print_json(summary)
    else:
        print(render(summary))
    return 0


ROWS = (
    ("wall time (h)", "wall_h", "{:,.1f}"),
    ("lost work (h)", "lost_h", "{:,.1f}"),
    ("checkpoint stalls (h)", "checkpoint_h", "{:,.1f}"),
    ("recovery (h)", "recovery_h", "{:,.1f}"),
    ("waste (% of wall)", "waste_fraction", "{:.2%}"),
    ("failures", "failures", "{:,.1f}"),
    ("checkpoints", "checkpoints", "{:,.0f}"),
    ("cost (USD)", "usd", "{:,.0f}"),
)


def render(s: dict) -> str:
    """The human table and a one-line verdict."""
    policy = f"every {s['interval_s']:,.0f} s" if s.get("interval_s") else s["policy"]
    head = (
        f"{s['scenario']}: {s['replicas']} replicas, seed {s['seed']}, policy {policy}, "
        f"job MTBF {s['mtbf_h']:.3g} h ({s['failure']}), work {s['work_h']:,.1f} h"
    )
    lines = [head, ""]
    cols = ("mean", "95% CI of mean", "p50", "p90", "p99")
    lines.append(f"{'':24}" + "".join(f"{c:>27}" if c[0] == "9" else f"{c:>14}" for c in cols))
    for label, key, fmt in ROWS:
        if f"{key}_mean" not in s:
            continue
        lo, hi = s[f"{key}_ci95"]
        ci = f"{fmt.format(lo)} - {fmt.format(hi)}" if math.isfinite(lo) else "n/a"
        cells = [fmt.format(s[f"{key}_mean"]), ci] + [
            fmt.format(s[f"{key}_{p}"]) for p in ("p50", "p90", "p99")
        ]
        lines.append(
            f"{label:24}{cells[0]:>14}{cells[1]:>27}" + "".join(f"{c:>14}" for c in cells[2:])
        )
    extra = s["wall_h_mean"] - s["work_h"]
    verdict = (
        f"verdict: {s['work_h']:,.1f} h of work takes {s['wall_h_mean']:,.1f} h on average "
        f"(p99 {s['wall_h_p99']:,.1f} h): {extra:,.1f} h of saves, lost work and recovery, "
        f"{s['waste_fraction_mean']:.1%} of wall time"
    )
    if "usd_mean" in s:
        verdict += f", {s['usd_mean']:,.0f} USD per run"
    lines += ["", verdict + "."]
    if s.get("out"):
        lines.append(f"per-replica records: {s['out']}")
    return "\n".join(lines)
