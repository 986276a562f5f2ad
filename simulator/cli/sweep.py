"""``ckptsim sweep``: simulate policies over a grid of scenarios and save one tidy table.

Each ``--vary FIELD=VALUES`` adds an axis; every combination is a point, and at each point
every ``--policies`` entry runs on the same replicas. Points run in local processes, or on a
Dask cluster with ``--dask-scheduler``; seeds come from the point's index, so both give the
same numbers.
"""

from __future__ import annotations

import dataclasses
import math
import sys

import numpy as np

from simulator.cli.common import (
    add_budget_flags,
    add_scenario_flags,
    add_workers_flag,
    as_flags,
    positive_int,
    refuse_tiers,
    require_failure_rate,
    require_work,
    scenario_from_args,
    seed_int,
)
from simulator.display import format_duration, format_usd
from simulator.errors import InputError

EPILOG = """\
axis values: a comma list (1024,4096,16384), or log:START:STOP:N / lin:START:STOP:N.
policies: young, daly, optimal, adaptive, fixed:SECONDS.

examples:
  ckptsim sweep --vary gpus=log:1024:65536:7 --vary checkpoint_s=30,60,120 --out sweep.parquet
  ckptsim sweep --scenario opt175b --vary restart_s=300,900,1800 --replicas 200 --out s.csv
  ckptsim sweep --vary gpus=1024,16384 --dask-scheduler tcp://10.0.0.5:8786 --out s.parquet

The base is --scenario with the flags over it; without --scenario the flags alone describe the
job; with neither, the embedded Llama-3 preset is the base."""

_INT_FIELDS = {"gpus", "gpus_per_node", "checkpoints_retained", "spares", "writer_nodes"}
_TEXT_FIELDS = {
    "name",
    "failure",
    "repair",
    "component_age",
    "async_checkpoint",
    "tiers",
    "failure_classes",
}
"""Scenario fields that are no single number, so no --vary axis."""
MAX_AXIS_VALUES = 10_000
"""Most values one --vary axis may have."""
MAX_POINTS = 10_000
"""Most grid points a sweep may have (each point's cost is then estimated and budgeted)."""


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "sweep",
        help="simulate policies over a grid of scenarios (local or Dask)",
        description=__doc__.split("\n\n")[0].split(": ", 1)[1],
        epilog=EPILOG,
    )
    add_scenario_flags(p)
    g = p.add_argument_group("sweep")
    g.add_argument(
        "--vary",
        action="append",
        default=[],
        metavar="FIELD=VALUES",
        help="a scenario field and its values (repeatable)",
    )
    g.add_argument(
        "--policies",
        default="young,daly,optimal,fixed:3600",
        metavar="LIST",
        help="comma list of policies (default: %(default)s)",
    )
    g.add_argument("--replicas", type=positive_int, default=100, metavar="N")
    g.add_argument("--seed", type=seed_int, default=0, metavar="S")
    add_workers_flag(g, "local processes")
    g.add_argument("--dask-scheduler", metavar="ADDRESS", help="run on this Dask scheduler")
    g.add_argument("--engine", choices=("auto", "fast", "des"), default="auto")
    g.add_argument("--out", metavar="FILE", help="table to write (.parquet or .csv)")
    g.add_argument("--no-progress", action="store_true", help="no progress bar")
    add_budget_flags(p)
    p.set_defaults(func=run)


def parse_axis(text: str) -> tuple[str, list]:
    """``FIELD=1,2,3`` or ``FIELD=log:A:B:N`` / ``lin:A:B:N`` -> (field, values)."""
    from simulator.model.scenario import Scenario

    field, sep, spec = text.partition("=")
    field = field.strip().replace("-", "_")
    known = {f.name for f in dataclasses.fields(Scenario)} - _TEXT_FIELDS
    if not sep or field not in known:
        raise InputError(
            f"--vary {text!r}: use FIELD=VALUES with a numeric scenario field "
            f"({', '.join(sorted(known))})"
        )
    ranged = spec.startswith(("log:", "lin:"))
    try:
        if ranged:
            kind, a, b, n = spec.split(":")
            a, b, n = float(a), float(b), int(n)
            if not (1 <= n <= MAX_AXIS_VALUES) or (kind == "log" and (a <= 0 or b <= 0)):
                raise ValueError
            if not (math.isfinite(a) and math.isfinite(b)):
                raise ValueError
            values = list((np.geomspace if kind == "log" else np.linspace)(a, b, n))
        else:
            values = [float(v) for v in spec.split(",") if v.strip()]
    except ValueError:
        raise InputError(
            f"--vary {text!r}: values must be finite numbers or log/lin:A:B:N "
            f"(N from 1 to {MAX_AXIS_VALUES:,})"
        ) from None
    if not values:
        raise InputError(f"--vary {text!r}: no values")
    if len(values) > MAX_AXIS_VALUES:
        raise InputError(f"--vary {text!r}: more than {MAX_AXIS_VALUES:,} values")
    if not all(math.isfinite(v) for v in values):
        raise InputError(f"--vary {text!r}: values must be finite numbers")
    if field in _INT_FIELDS:
        if not ranged and any(v != int(v) for v in values):
            raise InputError(f"--vary {text!r}: {field} takes whole numbers")
        values = [round(float(v)) for v in values]
    else:
        values = [float(v) for v in values]
    return field, values


def run(args) -> int:
    from simulator.cli.common import enforce_budget, output_path, workers_for
    from simulator.engines import budget
    from simulator.engines.choose import choose_engine
    from simulator.sweep import TABLE_SUFFIXES, grid_points, parse_policy, run_sweep, save_table

    out = output_path(args, TABLE_SUFFIXES)  # before the work, not after it
    base = scenario_from_args(args)
    refuse_tiers(base, "sweep")
    axes = {}
    for text in args.vary:
        field, values = parse_axis(text)
        if field in axes:
            raise InputError(f"--vary {field} is given twice; give its values once")
        axes[field] = values
    if not {"mtbf_h", "gpu_mtbf_h"} & set(axes):
        require_failure_rate(base)
    if "work_h" not in axes:
        require_work(base, "a sweep")
    policies = [p.strip() for p in args.policies.split(",") if p.strip()]
    if not policies:
        raise InputError("--policies: give at least one policy")
    pols = [parse_policy(p) for p in policies]
    points = math.prod(len(v) for v in axes.values())
    if points > MAX_POINTS:
        raise InputError(
            f"--vary: {points:,} grid points is more than {MAX_POINTS:,}; use fewer values"
        )
    workers = 1 if args.dask_scheduler else workers_for(args, points, "ckptsim sweep")
    est = None
    for pt in grid_points(axes, args.seed):
        try:
            sc = base.with_overrides(**pt.overrides)
        except InputError as exc:
            raise InputError(
                as_flags(str(exc), ()) + f" (at --vary point {pt.overrides})"
            ) from None
        require_work(sc, "a sweep")
        require_failure_rate(sc)
        engine = choose_engine(sc, args.engine, pols)
        point = budget.estimate(
            sc, budget.policy_intervals(sc, pols), args.replicas, engine=engine, workers=1
        )
        est = point if est is None else est + point
    enforce_budget(args, est, workers)
    df = run_sweep(
        base,
        axes,
        policies=policies,
        replicas=args.replicas,
        seed=args.seed,
        workers=workers,
        dask_scheduler=args.dask_scheduler,
        engine=args.engine,
        progress=sys.stderr.isatty() and not args.no_progress,
    )
    if out is not None:
        path = save_table(df, out)
        print(f"wrote {len(df)} rows ({len(df['point'].unique())} points) to {path}")
    cols = [*axes, "policy", "interval_s", "waste", "cost_usd"]
    # Intervals and money as a reader writes them (18.6 min, $49,820,000), not 1116 / 4.98e+07.
    shown = {"interval_s": format_duration, "cost_usd": format_usd}
    table = df[[c for c in cols if c in df]]
    print(table.to_string(index=False, float_format="%.4g", formatters=shown))
    return 0
