"""Why a checkpoint's time on a VM depends on how long ago memory was freed: the cost of
touching memory again after a pause, and what it does to a file write.

A VM whose balloon device reports free memory to its host (virtio-balloon's free page
reporting, Linux ``page_reporting``: blocks of 2^``page_reporting_order`` pages that stay free
for about 2 s are handed back, and the host discards their contents) pays a fault on the host
the next time the guest uses such a page. A write goes through the page cache, whose pages
come from that free memory, so the same write is fast right after the previous file was
deleted (its pages are reused while still backed) and slow after a pause. In the benchmark,
which job meets that pause is an accident of order and timing, on the code path and on the
raw baseline alike.

This script says whether this machine reports free pages, then, in shuffled rounds, frees
``--mib`` MiB (a deleted file's page cache, or a freed buffer), waits each ``--gaps``
seconds, and times (1) ``os.write`` of that many bytes into a new file, then its fsync
separately, (2) the same write after the benchmark's ``--warm-memory`` touched and let go of
twice that memory (:func:`simulator.bench.formats.warm_memory`, timed apart: what it costs),
and (3) filling a fresh buffer of that many bytes. Medians, in µs per 4 KiB page for the
fill. ``--report FILE`` also writes that, with the command and date (the committed
``reports/vm-memory.md``); about 3 minutes with the defaults.

    python experiments/vm_memory.py [--mib 290] [--gaps 0,0.5,1,2,4] [--rounds 6] [--dir DIR]
        [--report reports/vm-memory.md]
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments._report import printed_report, report_option  # noqa: E402
from simulator.bench.formats import warm_memory  # noqa: E402
from simulator.bench.runner import WARM_FACTOR, free_page_reporting  # noqa: E402

PAGE = 4096


def _gaps(text: str) -> list[float]:
    try:
        gaps = [float(g) for g in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"not a list of seconds like 0,1,2: {text!r}") from None
    if not gaps or not all(0 <= g <= 30 for g in gaps):  # NaN fails every comparison
        raise argparse.ArgumentTypeError(f"--gaps must be seconds from 0 to 30, got {text}")
    return gaps


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--mib", type=int, default=290, help="MiB (2^20 bytes) per write (290)")
    ap.add_argument(
        "--gaps", type=_gaps, default=_gaps("0,0.5,1,2,4"), help="pauses in seconds (0,0.5,1,2,4)"
    )
    ap.add_argument("--rounds", type=int, default=6, help="rounds, each every gap once (6)")
    ap.add_argument("--dir", type=Path, default=REPO, help="where the files are written")
    report_option(ap)
    args = ap.parse_args(argv)
    if args.rounds < 1:
        ap.error(f"--rounds must be at least 1, got {args.rounds}")
    if not 1 <= args.mib <= 8192:
        ap.error(f"--mib must be 1 to 8192, got {args.mib}")
    args.size = args.mib << 20
    if not args.dir.is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    reporting = free_page_reporting()
    lines = [
        "free page reporting to the host: "
        + {True: "yes", False: "no", None: "unknown (no virtio balloon found)"}[reporting]
    ]
    print(lines[0])
    source = np.random.default_rng(0).integers(0, 256, args.size, dtype=np.uint8)
    work = Path(tempfile.mkdtemp(prefix="ckptsim-vm-memory-", dir=args.dir))
    rng = random.Random(0)
    writes: dict[float, list[tuple[float, float]]] = {g: [] for g in args.gaps}
    warmed: dict[float, list[tuple[float, float]]] = {g: [] for g in args.gaps}
    fills: dict[float, list[float]] = {g: [] for g in args.gaps}
    try:
        previous = _write(work, source)[0]  # a file whose deletion frees the pages
        for _ in range(args.rounds):
            for gap in rng.sample(args.gaps, len(args.gaps)):
                shutil.rmtree(previous)
                time.sleep(gap)
                previous, write_s, fsync_s = _write(work, source)
                writes[gap].append((write_s, fsync_s))
            for gap in rng.sample(args.gaps, len(args.gaps)):
                shutil.rmtree(previous)
                time.sleep(gap)
                start = time.perf_counter()
                warm_memory(int(WARM_FACTOR * args.size))
                warm_s = time.perf_counter() - start
                previous, write_s, _ = _write(work, source)
                warmed[gap].append((warm_s, write_s))
            for gap in rng.sample(args.gaps, len(args.gaps)):
                held = np.ones(args.size, dtype=np.uint8)  # memory in use, then freed
                del held
                time.sleep(gap)
                start = time.perf_counter()
                fresh = np.ones(args.size, dtype=np.uint8)
                fills[gap].append(time.perf_counter() - start)
                del fresh
    finally:
        shutil.rmtree(work, ignore_errors=True)
    pages = args.size / PAGE
    lines += [
        f"{args.mib:,} MiB ({args.size / 1e6:,.0f} MB) per write, {args.rounds} rounds "
        "(medians, and the slowest fill)",
        f"{'pause s':>8} {'write s':>8} {'fsync s':>8} {'warm s':>7} {'then write s':>13} "
        f"{'fill µs/page':>13} {'slowest fill':>13}",
    ]
    for gap in args.gaps:
        lines.append(
            f"{gap:8.1f} {statistics.median(x[0] for x in writes[gap]):8.3f} "
            f"{statistics.median(x[1] for x in writes[gap]):8.3f} "
            f"{statistics.median(x[0] for x in warmed[gap]):7.3f} "
            f"{statistics.median(x[1] for x in warmed[gap]):13.3f} "
            f"{statistics.median(fills[gap]) / pages * 1e6:13.2f} "
            f"{max(fills[gap]) / pages * 1e6:13.2f}"
        )
    print("\n".join(lines[1:]))
    if args.report is not None:
        printed_report(
            args.report,
            "Memory freed, then used again after a pause, on this VM",
            "experiments/vm_memory.py",
            argv,
            started,
            "write = `os.write` of the bytes into a new file, right after the previous file "
            "was deleted and the pause; fsync timed apart; warm = `ckptsim bench "
            "--warm-memory`'s touch of twice the bytes after the pause, then write = the same "
            "write right after it; fill = writing a fresh buffer of the same size after freeing "
            "one and the pause",
            lines,
        )
    return 0


def _write(work: Path, source: np.ndarray) -> tuple[Path, float, float]:
    """A new directory with one file of ``source``'s bytes: (directory, write s, fsync s)."""
    where = Path(tempfile.mkdtemp(dir=work))
    fd = os.open(where / "data", os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        start = time.perf_counter()
        view = memoryview(source)
        while view:
            view = view[os.write(fd, view) :]
        wrote = time.perf_counter()
        os.fsync(fd)
        synced = time.perf_counter()
    finally:
        os.close(fd)
    return where, wrote - start, synced - wrote


if __name__ == "__main__":
    raise SystemExit(main())
