"""``ckptsim bench``: measure real checkpoint saves and restores here, and fit the cost model."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from simulator.cli.common import nonnegative_float, positive_int, print_json

EXAMPLES = """\
examples:
  ckptsim bench --sizes 25M,200M --dir /scratch --repeats 3 --out profile.json
  ckptsim bench --sizes 1M,10M --formats torch,ckptsim --json
  ckptsim bench --sizes 5M,20M --formats ckptsim --writers 1,2,4,8 --out profile.json
  ckptsim bench --sizes 1M,25M --formats ckptsim --optimizer-precision int8
  ckptsim bench --sizes 25M --dir s3://my-bucket/bench --formats ckptsim,safetensors,torch
  ckptsim optimize --profile profile.json --params 70e9 --gpus 16384
"""


MAX_REPEATS = 100
"""Repeats beyond this no longer move a median; more is a typo that would run for days."""

MAX_PAUSE_S = 600.0
"""The longest ``--pause``: memory a host reclaims is gone within seconds; minutes more per
timed job is a typo that would run for days."""


def _csv(text: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in text.split(",") if p.strip())


def _counts(items: tuple[str, ...]) -> tuple[int, ...]:
    from simulator.errors import InputError

    try:
        return tuple(int(w) for w in items)
    except ValueError:
        raise InputError(
            f"--writers takes whole numbers, e.g. 1,2,4,8, got {','.join(items)}"
        ) from None


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
        default=".",
        metavar="PATH|URL",
        help="directory on the disk to measure (default: current directory), or an object "
        "store URL (s3://bucket/prefix; needs ckptsim[s3]; credentials and endpoint from the "
        "usual botocore environment, e.g. AWS_PROFILE, AWS_ENDPOINT_URL): there raw is one "
        "object put and read back, and torch, safetensors and ckptsim are written in a local "
        "temp directory and uploaded (restores download first); dcp and --writers are not "
        "measured there",
    )
    p.add_argument(
        "--repeats",
        type=positive_int,
        default=3,
        metavar="K",
        help=f"repeats per size and format (default 3, at most {MAX_REPEATS}); the goal "
        "verdicts need 6 or more for the median's 95%% interval, else they read 'not shown'",
    )
    p.add_argument(
        "--writers",
        type=_csv,
        default=(),
        metavar="LIST",
        help="also save the largest size sharded over N processes at once (gloo on "
        "127.0.0.1), against N raw writers, for each N (e.g. 1,2,4,8)",
    )
    p.add_argument(
        "--optimizer-precision",
        default="fp32",
        metavar="P",
        help="also save with AdamW's moments stored as the controller's optimizer_precision "
        "stores them: fp32 (default, exact only), bf16 (~2x smaller moments) or int8 "
        "(blockwise, one fp32 scale per 256 values, ~3.9x smaller moments); each format is "
        "then measured exact and reduced side by side, and a reduced row gives its bytes, "
        "save and restore time (decoding included) against the exact save's. Reduced saves are "
        "measured in torch, safetensors and ckptsim (the default formats then); dcp, "
        "dcp-async and an object-store --dir are refused. --out and --writers use the exact "
        "saves only",
    )
    p.add_argument(
        "--weights-precision",
        default="fp32",
        metavar="P",
        help="the same for the model's weights: fp32 (default) or bf16, for a run training "
        "under bf16 autocast with fp32 weights; with --dtypes bf16 the weights are bf16 "
        "already and only the moments can shrink",
    )
    p.add_argument(
        "--pause",
        type=nonnegative_float("seconds"),
        default=0.0,
        metavar="S",
        help="seconds left idle before each timed save and restore (default 0: back to back). "
        "A save made after a while of training meets memory nothing has used for that long; "
        "on a VM whose host reclaims freed memory (the table then says so in a note) it pays "
        "a fault on the host per page, which back-to-back saves do not: --pause 5 times that "
        "save, and --out fits the cost model to it (at most "
        f"{MAX_PAUSE_S:g}; a local --dir only)",
    )
    p.add_argument(
        "--warm-memory",
        action="store_true",
        help="the opposite of --pause: right before each timed save and restore (the raw "
        "jobs' too), touch and let go of twice the state's bytes of memory, so that every job "
        "takes memory the host backs, as on a machine that never reclaims it (a GPU node), "
        "instead of whichever job follows a lull paying for it. Untimed, but where the host "
        "took the memory back it costs up to ~6 s per GB of state per job; it touches at "
        "most the memory available less 256 MB (a local --dir only)",
    )
    p.add_argument("--out", metavar="FILE", help="write the cost profile JSON (.json) here")
    p.add_argument(
        "--json",
        action="store_true",
        help="one JSON object on stdout: the table's rows (results), every timed job of every "
        "repeat (samples: format, size, repeat, save_s, load_s, ...), the goal ratios (goals), "
        "the contention fit and the machine",
    )
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    from simulator.bench import FORMATS, BenchConfig, run_benchmark
    from simulator.bench.formats import REDUCIBLE
    from simulator.bench.remote import REMOTE_FORMATS
    from simulator.controller.objstore import is_url, local_path_of
    from simulator.errors import InputError

    remote = is_url(args.dir) and local_path_of(args.dir) is None
    reduced = (args.optimizer_precision, args.weights_precision) != ("fp32", "fp32")
    default = REMOTE_FORMATS if remote else FORMATS
    if reduced:
        default = tuple(f for f in default if f in REDUCIBLE)
    cfg = BenchConfig(
        directory=args.dir if is_url(args.dir) else Path(args.dir),
        sizes=args.sizes,
        formats=args.formats or default,
        dtypes=args.dtypes,
        repeats=args.repeats,
        writers=_counts(args.writers),
        optimizer_precision=args.optimizer_precision,
        weights_precision=args.weights_precision,
        pause_s=args.pause,
        warm_memory=args.warm_memory,
    )
    from simulator.cli.common import output_path

    if args.repeats > MAX_REPEATS:
        raise InputError(f"--repeats {args.repeats}: at most {MAX_REPEATS}")
    if args.pause > MAX_PAUSE_S:
        raise InputError(f"--pause {args.pause:g}: at most {MAX_PAUSE_S:g} seconds")
    output_path(args, (".json",))  # before the measurement, not after it
    if args.out is not None:
        from simulator.bench.state import parse_size

        if len({parse_size(s) for s in cfg.sizes}) < 2:
            raise InputError(
                f"--out fits time = latency + bytes/bandwidth, which needs two or more "
                f"different sizes; --sizes {','.join(cfg.sizes)} gives one (e.g. --sizes 25M,200M)"
            )
    result = run_benchmark(cfg, progress=not args.json and sys.stderr.isatty())
    if args.out is not None:
        profile = result.profile()
        profile.save(args.out)
        measured = {s["format"] for s in profile.samples if s.get("bench") != "writers"}
        for fmt in sorted(measured - set(profile.fits)):
            print(f"warning: {fmt} has no fit in {args.out}: {profile.unfitted(fmt)}",
                  file=sys.stderr)  # fmt: skip
    if args.json:
        print_json(result.to_json())
    else:
        print(format_table(result))
        if args.out is not None:
            only = " (exact saves only)" if cfg.reduced else ""
            print(f"cost profile written to {args.out}{only}")
    return 0


def _interval(low: float, high: float) -> str:
    """`` [low, high]`` rounded outward (:func:`~simulator.engines.results.outward`), or
    nothing where there is no interval (too few repeats: NaN)."""
    from simulator.engines.results import outward

    return "" if low != low or high != high else " [{}, {}]".format(*outward(low, high))


def format_table(result) -> str:
    """The human summary: the raw disk's figure, then one line per (size, dtype, format).

    The project's own goal ratios are in ``--json`` (``goals``) and in its benchmark report;
    a user measuring their disk gets the measurements only.
    """
    # The precision column (moments/weights) only where a reduced save was measured: an
    # exact run's table stays as it always was.
    reduced = any("bytes_ratio_to_exact" in r for r in result.results)
    head = (
        f"{'size':>6} {'dtype':>5} {'format':<14} "
        + (f"{'opt/wt':<9} " if reduced else "")
        + f"{'GB':>7} {'save s':>8} {'GB/s':>6} "
        f"{'vs raw':>6} {'load s':>7} {'vs raw':>6} {'stall s':>8}"
    )
    remote = "staging_dir" in result.machine  # an object store (simulator.bench.remote)
    raw = (
        "raw object store: put {:.3f} GB/s, get {:.3f} GB/s"
        if remote
        else ("raw disk: write {:.3f} GB/s, read {:.3f} GB/s")
    )
    lines = [
        raw.format(result.raw_bytes_per_s / 1e9, result.raw_read_bytes_per_s / 1e9)
        + " (the raw row at the largest size)",
        head,
        "-" * len(head),
    ]
    for r in result.results:
        stall = r.get("stall_s_median")
        lines.append(
            f"{r['size']:>6} {r['dtype']:>5} {r['format']:<14} "
            + (f"{precision(r):<9} " if reduced else "")
            + f"{r['bytes'] / 1e9:7.3f} "
            f"{r['save_s_median']:8.3f} {r['bytes_per_s'] / 1e9:6.3f} {r['ratio_to_raw']:6.2f} "
            f"{r['load_s_median']:7.3f} {r['load_ratio_to_raw']:6.2f} "
            f"{'' if stall is None else f'{stall:8.3f}'}"
        )
    lines.extend(
        f"{r['size']} {r['dtype']} {r['format']} {precision(r)} against exact, same run: "
        f"{r['bytes_ratio_to_exact']:.2f}x fewer bytes ({r['exact_bytes']:,} -> {r['bytes']:,}), "
        f"save {r['save_ratio_to_exact']:.2f}x and restore {r['load_ratio_to_exact']:.2f}x "
        "the exact time (encoding and decoding included)"
        + (
            f", stall {r['stall_ratio_to_exact']:.2f}x"
            if r.get("stall_ratio_to_exact") is not None
            else ""
        )
        for r in result.results
        if "bytes_ratio_to_exact" in r
    )
    restore = result.goals.get("restore_ratio_to_raw")
    if restore:
        from simulator.engines.results import MIN_REPEATS, no_interval

        # Say "beside a raw read of its own file" only where the samples hold that pair (not an
        # object store's run, nor a profile measured before it).
        paired = any("raw_pair_load_s" in s for s in result.samples)
        beside = (
            ", each restore beside a raw read of its own file done the restore's way (4 MB "
            "slices, the readahead thread)"
            if paired
            else ""
        )
        lines.append(
            f"restore/raw-read ratio, same run, per repeat{beside} (median, then expected from "
            "the mean time, each [95% interval]): "
            + ", ".join(
                f"{p['size']} {p['dtype']} {p['median']:.2f}{_interval(p['low'], p['high'])}"
                f", {p['expected']:.2f}{_interval(p['expected_low'], p['expected_high'])}"
                for p in restore["per_size"]
            )
            + (
                f" (no interval below {MIN_REPEATS} repeats: --repeats {MIN_REPEATS} or more "
                "gives one)"
                if any(no_interval(p) == "too few repeats" for p in restore["per_size"])
                else ""
            )
        )
    if not remote:
        lines.append(
            "cold reads: each file is fsync'ed, then its pages dropped with "
            "posix_fadvise(POSIX_FADV_DONTNEED) (no root needed; drop_caches is not used, so a "
            "hypervisor's cache below this VM may still serve some reads)"
        )
    lines.extend(format_writers(result))
    lines.extend(f"note: {n}" for n in result.notes)
    return "\n".join(lines)


def precision(row) -> str:
    """``moments/weights`` precision of a result row ("" for the raw disk)."""
    if "optimizer_precision" not in row:
        return "" if row["format"] == "raw" else "fp32/fp32"
    return f"{row['optimizer_precision']}/{row['weights_precision']}"


def format_writers(result) -> list[str]:
    """The parallel-writer table and its contention fit (empty without ``--writers``)."""
    if not result.writers:
        return []
    head = (
        f"{'writers':>7} {'format':<6} {'agg GB/s':>8} {'vs raw':>6} {'slowest s':>9} "
        f"{'commit s':>8} {'per-writer GB/s min/median':>26}"
    )
    lines = ["", "parallel writers (one shard each, gloo; medians over repeats):", head]
    for r in result.writers:
        ratio = "" if r["ratio_to_raw"] is None else f"{r['ratio_to_raw']:6.2f}"
        lines.append(
            f"{r['writers']:>7} {r['format']:<6} {r['aggregate_bytes_per_s'] / 1e9:8.3f} "
            f"{ratio:>6} {r['slowest_s']:9.3f} {r['commit_s']:8.4f} "
            f"{r['per_writer_bytes_per_s_min'] / 1e9:13.3f} / "
            f"{r['per_writer_bytes_per_s_median'] / 1e9:.3f}"
        )
    for fmt, c in result.profile().contention.items():
        worst = max(map(abs, c.residuals))
        lines.append(
            f"contention fit {fmt}: X(N) = {c.single_bytes_per_s / 1e9:.3f} GB/s * N / "
            f"(1 + {c.contention:.3f}(N-1) + {c.coherency:.4f}N(N-1)); residuals up to "
            f"{worst:.0%} of the fitted value"
        )
    return lines
