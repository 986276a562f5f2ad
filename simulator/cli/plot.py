"""``ckptsim plot KIND``: draw one figure (PNG and SVG) from a scenario, a table or a log.

Kinds: ``interval`` (waste or cost against the interval, with the simulated optimum and the
closed form), ``size`` (optimum interval against cluster size), ``breakdown`` (where the
time goes, per policy), ``cost`` (distribution of the run's cost, per policy), ``tornado``
(sensitivity of the optimum to each input) and ``controller`` (the interval a live run
chose, from the controller's own ``runlog.jsonl``: give its checkpoint directory or the file;
a CSV/JSON table with columns step, time_s, interval_s works too).
"""

from __future__ import annotations

from simulator.cli.common import (
    add_budget_flags,
    add_scenario_flags,
    positive_float,
    positive_int,
    refuse_tiers,
    require_failure_rate,
    require_work,
    scenario_from_args,
    seed_int,
)
from simulator.errors import InputError

KINDS = ("interval", "size", "breakdown", "cost", "tornado", "controller")

EPILOG = """\
examples:
  ckptsim plot interval --out reports/figures/llama3-interval
  ckptsim plot interval --scenario opt175b --metric cost --replicas 200 --out opt-cost
  ckptsim plot size --sizes 1024,4096,16384,65536 --out size
  ckptsim plot breakdown --policies young,optimal,fixed:3600,fixed:10800 --out where
  ckptsim plot tornado --factor 2 --out tornado
  ckptsim plot controller --log ckpts/ --out controller

Each writes OUT.png and OUT.svg. The job is --scenario with the flags over it; without
--scenario the flags alone describe it; with neither, the embedded Llama-3 preset."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "plot",
        help="figures: interval curve, optimum vs size, time breakdown, cost, tornado",
        description=__doc__.split("\n\n", 1)[1],
        epilog=EPILOG,
    )
    p.add_argument("kind", choices=KINDS, metavar="KIND", help=" | ".join(KINDS))
    add_scenario_flags(p)
    g = p.add_argument_group("plot")
    g.add_argument("--out", required=True, metavar="STEM", help="writes STEM.png and STEM.svg")
    g.add_argument("--replicas", type=positive_int, default=100, metavar="N")
    g.add_argument("--seed", type=seed_int, default=0, metavar="S")
    g.add_argument("--metric", choices=("waste", "cost"), default="waste", help="interval plot")
    g.add_argument(
        "--policies",
        default="young,optimal,fixed:1800,fixed:3600,fixed:10800",
        metavar="LIST",
        help="breakdown/cost plots (default: %(default)s)",
    )
    g.add_argument("--sizes", metavar="LIST", help="size plot: GPU counts, comma list")
    g.add_argument("--table", metavar="FILE", help="size plot: a table with gpus, interval_s")
    g.add_argument(
        "--factor",
        type=positive_float("ratio"),
        default=2.0,
        help="tornado: low/high ratio, above 1 and at most 100",
    )
    g.add_argument(
        "--log",
        metavar="PATH",
        help="controller plot: a checkpoint directory or its runlog.jsonl (or a CSV/JSON table)",
    )
    add_budget_flags(p)
    p.set_defaults(func=run)


def _policies(text: str):
    from simulator.sweep import parse_policy

    specs = [s.strip() for s in text.split(",") if s.strip()]
    if not specs:
        raise InputError("--policies: give at least one policy")
    return specs, [parse_policy(s) for s in specs]


def run(args) -> int:
    from simulator import plots
    from simulator.cli.common import output_path

    output_path(args, plots.FIGURE_SUFFIXES)  # before the work, not after it
    if args.kind == "controller":
        if not args.log:
            raise InputError(
                "plot controller needs --log PATH: the checkpoint directory or its runlog.jsonl"
            )
        ax = plots.controller_intervals(args.log)
    elif args.kind == "size" and args.table:
        ax = plots.optimum_vs_size(_read_table(args.table))
    else:
        scenario = scenario_from_args(args)
        refuse_tiers(scenario, f"plot {args.kind}")
        require_failure_rate(scenario)
        require_work(scenario, f"plot {args.kind}")
        ax = _from_scenario(args, scenario)
    for path in plots.save(ax, args.out):
        print(path)
    return 0


def _read_table(path):
    import math

    import pandas as pd

    try:
        df = pd.read_parquet(path) if str(path).endswith(".parquet") else pd.read_csv(path)
    except (OSError, ValueError, UnicodeDecodeError) as exc:
        raise InputError(f"cannot read table {path}: {exc}") from None
    for col in ("gpus", "interval_s"):
        if col not in df:
            raise InputError(f"{path}: the size plot needs columns gpus and interval_s")
    values = df[["gpus", "interval_s"]].apply(pd.to_numeric, errors="coerce")
    if not ((values > 0) & values.apply(lambda c: c.map(math.isfinite))).all(axis=None):
        raise InputError(f"{path}: gpus and interval_s must be positive numbers in every row")
    if df.empty:
        raise InputError(f"{path}: no rows")
    return df


def _budget(args, scenario, kind: str, runs: int = 1, policies=None) -> None:
    """Refuse, before any work, a plot whose simulations would exceed the limits."""
    from simulator.cli.common import enforce_budget
    from simulator.engines import budget
    from simulator.engines.choose import choose_engine

    engine = choose_engine(scenario, "auto")
    if policies is None:
        intervals = budget.search_intervals(scenario, baselines=0 if kind != "interval" else 7)
    else:
        intervals = budget.policy_intervals(scenario, policies)
    est = budget.estimate(scenario, intervals * runs, args.replicas, engine=engine)
    enforce_budget(args, est)


def _from_scenario(args, scenario):
    from simulator import optimize, plots
    from simulator.sweep import SENSITIVITY_INPUTS, optimum_table, sensitivity

    if args.replicas < 2 and args.kind in ("interval", "size", "tornado"):
        raise InputError(f"plot {args.kind} needs --replicas 2 or more (the search fits to noise)")
    if args.kind == "tornado" and not 1 < args.factor <= 100:
        raise InputError(f"--factor must be above 1 and at most 100, got {args.factor:g}")
    if args.kind == "interval":
        _budget(args, scenario, "interval")
        res = optimize.optimize_by_simulation(
            scenario, replicas=args.replicas, seed=args.seed, adaptive=False, bootstrap=100
        )
        if args.metric == "cost" and res["objective"] != "cost_usd":
            raise InputError("--metric cost needs --usd-per-gpu-hour (or a scenario with a price)")
        return plots.interval_curve(res, scenario, metric=args.metric)
    if args.kind == "size":
        try:
            sizes = [int(s) for s in (args.sizes or "1024,4096,16384,65536").split(",")]
        except ValueError:
            raise InputError(f"--sizes {args.sizes!r}: a comma list of GPU counts") from None
        from simulator.cli.common import as_flags

        for n in sizes:
            try:
                _budget(args, scenario.with_overrides(gpus=n), "size")
            except InputError as exc:
                raise InputError(f"--sizes {n}: " + as_flags(str(exc), ["gpus"])) from None
        df = optimum_table(scenario, "gpus", sizes, replicas=args.replicas, seed=args.seed)
        return plots.optimum_vs_size(df)
    if args.kind == "tornado":
        # The inputs this job sets: a job from flags alone may leave out its price or size.
        inputs = [i for i in SENSITIVITY_INPUTS if i == "mtbf" or getattr(scenario, i) is not None]
        _budget(args, scenario, "tornado", runs=2 * len(inputs) + 1)
        base, df = sensitivity(
            scenario, factor=args.factor, inputs=inputs, replicas=args.replicas, seed=args.seed
        )
        return plots.tornado(df, base)
    specs, pols = _policies(args.policies)
    _budget(args, scenario, args.kind, policies=pols)
    out = optimize.evaluate(scenario, pols, replicas=args.replicas, seed=args.seed)
    if args.kind == "cost":
        if scenario.usd_per_gpu_hour is None:
            raise InputError("plot cost needs --usd-per-gpu-hour (or a scenario with a price)")
        return plots.cost_distribution(dict(zip(specs, out["cost_usd"], strict=True)))
    import pandas as pd

    df = pd.DataFrame(
        {
            "policy": specs,
            **{
                f"{k}_h": out[f"{k}_s"].mean(axis=1) / 3600.0
                for k in ("useful", "checkpoint", "lost", "recovery")
            },
        }
    )
    return plots.time_breakdown(df)
