"""What the save's CRC-32 costs: read back from the file as it is flushed, or not taken at all.

A checkpoint's manifest carries each file's CRC-32. ``ckptio.write_checkpoint`` takes the
tensor file's in a thread that reads the file back from the page cache while the saving thread
fsyncs it. This script times, in one process, each round in a shuffled order after the
benchmark's memory warm-up, one save each way and the raw write of the same bytes:

- ``read-back``: the save as it ships;
- ``no-crc``: the same save with no CRC-32 at all (the tensor file only fsynced, the small
  files' CRC-32 a function that returns 0): the floor any way of taking the CRC is measured
  against;
- ``raw``: the benchmark's raw write of the state's bytes (one file, one fsync).

It prints each way's quartiles, the median over rounds of the time the read-back adds to
``no-crc`` within its round, and the median ratio raw/save (the issue's goal is 0.9), each with
its distribution-free 95 % interval.

At commit 0039c9d the save took the CRC from the tensors' memory during the write instead,
and this script timed that way too (``tensors``): ``reports/save-crc.md`` is that run, in which
neither way cost a time out of the noise, so the simpler read-back stayed. Its ``no-crc`` was
that commit's save with a CRC function that returns 0: the thread still walked the tensors and
the header was still read, a floor a little above this script's. Rerun with another
``--report`` path to keep that run.

    python experiments/save_crc.py --size 25M --rounds 120
"""

from __future__ import annotations

import os
import random
import shutil
import sys
import tempfile
import time
from contextlib import ExitStack
from pathlib import Path
from unittest import mock

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments._bench_args import bench_parser, parse
from experiments._report import per_round_ratio, printed_report
from simulator.engines.results import median_ci

WAYS = ("read-back", "no-crc", "raw")


def _patches(way: str) -> list:
    """What makes the shipped save take its CRC ``way``."""
    from simulator.ckptio import write

    if way != "no-crc":
        return []

    def fsync_only(file, fd, size, *, fsync):
        if fsync:
            os.fsync(fd)
        return 0

    return [
        mock.patch.object(write, "_crc_while_flushing", fsync_only),
        mock.patch.object(write, "crc32", lambda data, value=0: 0),
    ]


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, "rounds", 60, "rounds, each one save each way and a raw write")
    args = parse(ap, argv, "rounds")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    from simulator import ckptio
    from simulator.bench.formats import raw_write, state_bytes, warm_memory
    from simulator.bench.state import build_state, flatten, parse_size

    state = build_state(parse_size(args.size)).state
    tensors, tree = flatten(state)
    views = state_bytes(state)
    nbytes = sum(len(v) for v in views)

    def save(way: str, where: Path) -> float:
        with ExitStack() as stack:
            for patch in _patches(way):
                stack.enter_context(patch)
            t0 = time.perf_counter()
            ckptio.write_checkpoint(where, tensors, {"tree": tree})
            return time.perf_counter() - t0

    took: dict[str, list[float]] = {way: [] for way in WAYS}
    rng = random.Random(0)
    work = Path(tempfile.mkdtemp(prefix="save-crc-", dir=args.dir))
    try:
        for way in WAYS[:-1]:  # untimed: each way once, so no round pays a first call
            save(way, work / f"first-{way}")
        raw_write(work / "first-raw", views)
        for r in range(args.rounds):
            order = list(WAYS)
            rng.shuffle(order)
            for way in order:
                where = work / f"{way}-{r}"
                if args.warm_memory:
                    warm_memory(2 * nbytes)
                took[way].append(raw_write(where, views) if way == "raw" else save(way, where))
                shutil.rmtree(where)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [f"state {nbytes / 1e6:.0f} MB in {len(tensors)} tensors, {args.rounds} rounds"]
    for way in WAYS:
        q = np.percentile(took[way], [25, 50, 75]) * 1e3
        lines.append(f"{way:9s} quartiles {q[0]:.1f} / {q[1]:.1f} / {q[2]:.1f} ms")
    m, lo, hi = median_ci([a - b for a, b in zip(took["read-back"], took["no-crc"], strict=True)])
    lines.append(
        f"read-back adds to no-crc, within a round: median {m * 1e3:+.1f} ms "
        f"[{lo * 1e3:+.1f}, {hi * 1e3:+.1f}]"
    )
    for way in ("read-back", "no-crc"):
        lines.append(f"raw/{way:9s} median ratio {per_round_ratio(took['raw'], took[way])}")
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            "The save's CRC-32: read back from the file, or none",
            "experiments/save_crc.py",
            argv,
            started,
            "one process; each round a shuffled order of the three jobs, each after the "
            "benchmark's memory warm-up unless --no-warm-memory; intervals are distribution-"
            "free 95 % intervals of the median over rounds",
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
