"""The command line the closed-loop studies share (``experiments/closed_loop.py`` and
``experiments/closed_loop_tiers.py``): where to work and write, the failure clock and job
size laid over the study's defaults, re-accounting earlier runs, and redrawing figures from
the data a report keeps."""

from __future__ import annotations

import argparse
from collections.abc import Callable
from pathlib import Path

CLOCK_FIELDS = ("mtbf_s", "work_s", "repeats", "workers", "seed")
"""The config fields every study takes from flags of the same name."""


def study_parser(
    description: str, out: Path, *, quick: str, mtbf: str, repeats: str, epilog: str | None = None
) -> argparse.ArgumentParser:
    """A parser with the flags every closed-loop study takes; ``quick``, ``mtbf`` and
    ``repeats`` are those flags' help, which says what they mean for the study."""
    p = argparse.ArgumentParser(description=description, epilog=epilog)
    p.add_argument("--quick", action="store_true", help=quick)
    p.add_argument("--workdir", type=Path, help="scratch directory (default: a temp dir)")
    p.add_argument("--out", type=Path, default=out)
    p.add_argument("--mtbf-s", type=float, help=mtbf)
    p.add_argument("--work-s", type=float, help="failure-free compute per job, seconds")
    p.add_argument("--repeats", type=int, help=repeats)
    p.add_argument("--workers", type=int, help="jobs at once")
    p.add_argument("--seed", type=int)
    p.add_argument(
        "--reuse", action="store_true", help="re-account the runs already in --workdir (no runs)"
    )
    p.add_argument(
        "--render-only",
        action="store_true",
        help="redraw the figures from reports/data/<report>-runs.json (no runs, no report)",
    )
    return p


def overrides(args: argparse.Namespace, base: dict, fields=CLOCK_FIELDS) -> dict:
    """``base`` (the study's defaults, or --quick's) with each of ``fields`` given as a flag."""
    return base | {k: getattr(args, k) for k in fields if getattr(args, k) is not None}


def render_only(p: argparse.ArgumentParser, args: argparse.Namespace, render: Callable) -> bool:
    """With --render-only, redraw the figures from the report's kept data with ``render``
    (a report module's ``render_figures``) and say so: True when that was all to do."""
    if not args.render_only:
        return False
    data = args.out.parent / "data" / f"{args.out.stem}-runs.json"
    if not data.exists():
        p.error(f"{data} not found: the figures' data are written by a full or --reuse run")
    for path in render(data, args.out.parent / "figures", args.out.stem):
        print(f"wrote {path}")
    return True
