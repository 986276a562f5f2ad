"""The options the benchmark's studies share (``save_phases.py``, ``carry_over.py``): the state's
size, how many times, the disk, the warm-up, the report; each checked before the run."""

from __future__ import annotations

import argparse
from pathlib import Path

from experiments._report import report_option
from simulator.bench.state import parse_size
from simulator.engines.results import MIN_REPEATS
from simulator.errors import InputError

REPO = Path(__file__).resolve().parents[1]


def bench_parser(doc: str, count: str, default: int, what: str) -> argparse.ArgumentParser:
    """A parser with ``--size``, ``--<count>`` (``what``, ``default``), ``--dir``,
    ``--no-warm-memory`` and ``--report``; add a study's own options, then :func:`parse`."""
    ap = argparse.ArgumentParser(description=doc.splitlines()[0])
    ap.add_argument(
        "--size", default="100M", help="model size in parameters (100M, the default: ~1.2 GB)"
    )
    ap.add_argument(f"--{count}", type=int, default=default, help=f"{what} ({default})")
    ap.add_argument(
        "--dir", type=Path, default=REPO, help="the disk the saves are timed on (the repository's)"
    )
    ap.add_argument(
        "--no-warm-memory",
        dest="warm_memory",
        action="store_false",
        help="leave out the benchmark's warm-up before each clock (--warm-memory, on by default "
        "as in the committed scale report)",
    )
    report_option(ap)
    return ap


def parse(ap: argparse.ArgumentParser, argv: list[str] | None, count: str) -> argparse.Namespace:
    """The options, every one refused in one line before the run where it cannot work."""
    args = ap.parse_args(argv)
    if getattr(args, count) < MIN_REPEATS:
        ap.error(f"--{count} must be at least {MIN_REPEATS}")
    if not args.dir.is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    try:
        parse_size(args.size)
    except InputError as exc:
        ap.error(str(exc))
    return args
