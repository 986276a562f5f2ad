"""``ckptsim bench``: measure real checkpoint saves and restores here, and fit the cost model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.cli.common import positive_int, print_json

EXAMPLES = """\
examples:
  ckptsim bench --sizes 25M,200M --dir /scratch --repeats 3 --out profile.json
  ckptsim bench --sizes 1M,10M --formats torch,ckptsim --json
  ckptsim optimize --profile profile.json --params 70e9 --gpus 16384
"""


MAX_REPEATS = 100
"""Repeats beyond this no longer move a median; more is a typo that would run for days."""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def register(subparsers) -> None:
    p = subparsers.add_parser(
        "bench",
        help="measure checkpoint save/restore cost on this disk and fit a cost profile",
        description=(
            "Writes the complete training state (GPT-style model, AdamW after one step, LR "
            "scheduler, RNG states, data position) in each format with fsync, interleaved "
            "with a raw sequential write of the same bytes, reloads it with a cold page cache, "
            "and fits time = latency + bytes/bandwidth per format."
        ),
        epilog=EXAMPLES,
    )
    p.add_argument(
        "--sizes",
        type=_csv,
        default=("25M", "200M"),
        metavar="LIST",
        help="model sizes, parameters (default 25M,200M; e.g. 25M,200M,1B)",
    )
    p.add_argument(
        "--formats",
        type=_csv,
        default=None,
        metavar="LIST",
        help="torch,safetensors,dcp,dcp-async,ckptsim (default: all)",
    )
    p.add_argument(
        "--dtypes",
        type=_csv,
        default=("fp32",),
        metavar="LIST",
        help="fp32 (12 B/param) and/or bf16 with fp32 master weights (14 B/param)",
    )
    p.add_argument(
        "--dir",
        type=Path,
        default=Path("."),
        metavar="PATH",
        help="directory on the disk to measure (default: current directory)",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        metavar="K",
        help=f"repeats per size and format (default 3, at most {MAX_REPEATS})",
    )
    p.add_argument("--out", metavar="FILE", help="write the cost profile JSON (.json) here")
    p.add_argument("--json", action="store_true", help="one JSON object on stdout")
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.bench import FORMATS, BenchConfig, run_benchmark
    from simulator.errors import InputError

    cfg = BenchConfig(
        directory=args.dir,
        sizes=args.sizes,
        formats=args.formats or FORMATS,
        dtypes=args.dtypes,
        repeats=args.repeats,
    )
    from simulator.cli.common import output_path

    if args.repeats > MAX_REPEATS:
        raise InputError(f"--repeats {args.repeats}: at most {MAX_REPEATS}")
    output_path(args, (".json",))  # before the measurement, not after it
    result = run_benchmark(cfg, progress=not args.json and sys.stderr.isatty())
    if args.out is not None:
        result.profile().save(args.out)
    if args.json:
        print_json(result.to_json())
    else:
        print(format_table(result))
        if args.out is not None:
            print(f"cost profile written to {args.out}")
    return 0


def format_table(result) -> str:
    """The human summary: the raw disk's figure, then one line per (size, dtype, format).

    The project's own goal ratios are in ``--json`` (``goals``) and in its benchmark report;
    a user measuring their disk gets the measurements only.
    """
    head = (
        f"{'size':>6} {'dtype':>5} {'format':<14} {'GB':>7} {'save s':>8} {'GB/s':>6} "
        f"{'vs raw':>6} {'load s':>7} {'stall s':>8}"
    )
    lines = [
        f"raw disk: write {result.raw_bytes_per_s / 1e9:.3f} GB/s, "
        f"read {result.raw_read_bytes_per_s / 1e9:.3f} GB/s (the raw row at the largest size)",
        head,
        "-" * len(head),
    ]
    for r in result.results:
        stall = r.get("stall_s_median")
        lines.append(
            f"{r['size']:>6} {r['dtype']:>5} {r['format']:<14} {r['bytes'] / 1e9:7.3f} "
            f"{r['save_s_median']:8.3f} {r['bytes_per_s'] / 1e9:6.3f} {r['ratio_to_raw']:6.2f} "
            f"{r['load_s_median']:7.3f} {'' if stall is None else f'{stall:8.3f}'}"
        )
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)
