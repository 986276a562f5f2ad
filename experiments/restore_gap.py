"""Where a restore's time goes against the raw read: the I/O pattern, the CRC-32, the rest.

One ``ckptio`` checkpoint of the complete training state is written once; then, in rounds
whose order is shuffled (seeded), five cold reads of it are timed inside this process, each
after ``posix_fadvise(DONTNEED)`` of the checkpoint's files: the raw read of its tensor file
(:func:`simulator.bench.formats.raw_read`, plain: 64 MB ``readinto``), the same raw read done
the restore's way (``readahead=True``: 4 MB slices with a
:class:`~simulator.ckptio.readahead.Readahead` thread asking for the bytes ahead, nothing
else; the benchmark's restore baseline), and ``read_checkpoint(into=<the state's tensors>)``
with ``verify=False`` and with ``verify=True`` (the restore the controller and the benchmark
run), and the latter with its readahead thread never started (what the thread gains the
restore). Per round it forms raw/restore (bandwidth, higher is better) against each raw read,
verify=False/verify=True (what the CRC-32 costs) and no-readahead/readahead; prints the
medians with their distribution-free 95 % intervals
(:func:`simulator.engines.results.median_ci`). Then, with the page cache warm (no disk), the
restores again: what is CPU work. ``--report FILE`` also writes what it prints there.

    python experiments/restore_gap.py [--size 25M] [--rounds 150] [--dir DIR] [--report F]
"""

from __future__ import annotations

import argparse
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

from experiments._report import per_round_ratio, printed_report, report_option  # noqa: E402
from simulator import ckptio  # noqa: E402
from simulator.bench import formats as fmt_io  # noqa: E402
from simulator.bench.state import build_state, flatten, parse_size  # noqa: E402
from simulator.ckptio import read as ckptio_read  # noqa: E402
from simulator.ckptio.readahead import Readahead  # noqa: E402
from simulator.engines.results import MIN_REPEATS  # noqa: E402


class _NoReadahead(Readahead):
    """The restore's readahead thread, never started: the restore reads on its own."""

    def __enter__(self) -> _NoReadahead:
        return self


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="25M", help="model size in parameters (25M: ~290 MB)")
    ap.add_argument("--rounds", type=int, default=150, help="rounds of the five reads")
    ap.add_argument("--dir", type=Path, default=REPO, help="where the checkpoint is written")
    report_option(ap)
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.rounds < MIN_REPEATS:
        ap.error(
            f"--rounds must be at least {MIN_REPEATS} (a median's 95 % interval), got {args.rounds}"
        )
    state = build_state(parse_size(args.size)).state
    tensors, tree = flatten(state)
    work = Path(tempfile.mkdtemp(prefix="ckptsim-gap-", dir=args.dir))
    try:
        where = work / "ck"
        ckptio.write_checkpoint(where, tensors, {"tree": tree})
        nbytes = (where / ckptio.TENSOR_FILE).stat().st_size

        def restore(verify: bool, ahead: bool = True, cold: bool = True) -> float:
            if cold:
                fmt_io.drop_cache(where)
            # ahead=False: the same restore with its readahead thread never started.
            cls = ckptio_read.Readahead
            ckptio_read.Readahead = cls if ahead else _NoReadahead
            try:
                start = time.perf_counter()
                ckptio.read_checkpoint(where, verify=verify, into=tensors)
                return time.perf_counter() - start
            finally:
                ckptio_read.Readahead = cls

        reads = {
            "raw read": lambda: fmt_io.raw_read(where, ckptio.TENSOR_FILE),
            "raw read, readahead": lambda: fmt_io.raw_read(
                where, ckptio.TENSOR_FILE, readahead=True
            ),
            "restore, verify=False": lambda: restore(False),
            "restore, verify=True": lambda: restore(True),
            "restore, no readahead": lambda: restore(True, ahead=False),
        }
        rng = np.random.default_rng(0)
        times: dict[str, list[float]] = {k: [] for k in reads}
        for _ in range(args.rounds):
            for name in rng.permutation(list(reads)):
                times[name].append(reads[name]())
        # Warm: the file stays in the page cache (no drop), so what is left is CPU work.
        warm = {}
        for key, verify, ahead in (
            ("verify=False", False, True),
            ("verify=True", True, True),
            ("verify=True, no readahead", True, False),
        ):
            restore(verify, ahead, cold=False)
            warm[key] = statistics.mean(restore(verify, ahead, cold=False) for _ in range(10))
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"{args.size}: {nbytes / 1e9:.2f} GB tensor file, {len(tensors)} tensors, "
        f"{args.rounds} rounds (cold reads, shuffled order)"
    ]
    for name, t in times.items():
        lines.append(f"  {name:24s} median {statistics.median(t):.4f} s")

    def per_round(num: str, den: str) -> str:
        return per_round_ratio(times[num], times[den])

    lines.append("  median per-round ratio [95 % interval]:")
    for raw in ("raw read", "raw read, readahead"):
        for verify in (False, True):
            name = f"restore, verify={verify}"
            lines.append(f"    {raw}/{name:24s} {per_round(raw, name)}")
    lines += [
        f"    raw read/raw read, readahead    {per_round('raw read', 'raw read, readahead')}",
        "    verify=False/verify=True (CRC) "
        + per_round("restore, verify=False", "restore, verify=True"),
        "    no readahead/readahead (verify=True) "
        + per_round("restore, no readahead", "restore, verify=True"),
        "  warm page cache, mean of 10: "
        + ", ".join(f"{k} {v * 1e3:.1f} ms" for k, v in warm.items()),
    ]
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            f"Where a restore's time goes at {args.size}",
            "experiments/restore_gap.py",
            argv,
            started,
            "five cold reads a round in shuffled order, each after the checkpoint's pages were "
            "dropped; ratios are medians of per-round ratios with distribution-free 95 % "
            "intervals",
            lines,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
