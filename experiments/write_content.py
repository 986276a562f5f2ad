"""Does what a raw write writes change how long the storage takes? Random bytes against the
training state's own, beside the ``ckptsim`` save of that state.

The raw baseline of the benchmark once wrote a 64 MB buffer of random bytes over and over; a
save writes the state's own bytes. On a VM whose storage below compresses, deduplicates or
caches by content, those two cost different amounts for reasons that have nothing to do with
the writer. This script builds the complete training state once, then, in rounds whose order
is shuffled (seeded), each job followed by ``--gap`` seconds of rest, times three writes of it
(each a fresh directory, fsync'ed, then removed): ``raw_write`` of that many random bytes,
``raw_write`` of the state's own bytes from its memory (:func:`simulator.bench.formats.
state_bytes`, the benchmark's baseline since 2026-12-06), and ``ckptio.write_checkpoint`` of the
state. Prints each job's median, mean and slow rounds (over twice its median), and per-round
ratios with their distribution-free 95 % intervals (:func:`simulator.engines.results.
median_ci`). ``--report FILE`` also writes what it prints there.

    python experiments/write_content.py [--size 100M] [--rounds 20] [--gap 1.0] [--dir DIR]
        [--report FILE]
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
from simulator.engines.results import MIN_REPEATS  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100M", help="model size in parameters (100M: ~1.2 GB)")
    ap.add_argument("--rounds", type=int, default=20, help="rounds of the three writes")
    ap.add_argument("--gap", type=float, default=1.0, help="seconds of rest after each write")
    ap.add_argument("--dir", type=Path, default=REPO, help="where the files are written")
    report_option(ap)
    args = ap.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    if args.rounds < MIN_REPEATS:
        ap.error(
            f"--rounds must be at least {MIN_REPEATS} (a median's 95 % interval), got {args.rounds}"
        )
    if args.gap < 0:
        ap.error(f"--gap must be at least 0 seconds, got {args.gap}")
    state = build_state(parse_size(args.size)).state
    tensors, tree = flatten(state)
    own = fmt_io.state_bytes(state)
    nbytes = sum(len(view) for view in own)
    work = Path(tempfile.mkdtemp(prefix="ckptsim-content-", dir=args.dir))
    count = iter(range(1 << 30))

    def timed(write) -> float:
        where = work / f"w{next(count)}"
        try:
            return write(where)
        finally:
            shutil.rmtree(where, ignore_errors=True)

    def save(where: Path) -> float:
        start = time.perf_counter()
        ckptio.write_checkpoint(where, tensors, {"tree": tree})
        return time.perf_counter() - start

    jobs = {
        "raw, random bytes": lambda where: fmt_io.raw_write(where, nbytes),
        "raw, the state's bytes": lambda where: fmt_io.raw_write(where, own),
        "ckptsim save": save,
    }
    times: dict[str, list[float]] = {k: [] for k in jobs}
    rng = np.random.default_rng(0)
    try:
        for _ in range(args.rounds):
            for i in rng.permutation(len(jobs)):
                name = list(jobs)[i]
                times[name].append(timed(jobs[name]))
                time.sleep(args.gap)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    lines = [
        f"{args.size}: {nbytes / 1e9:.2f} GB, {args.rounds} rounds (shuffled order, "
        f"{args.gap:g} s rest after each write)"
    ]
    for name, t in times.items():
        med = statistics.median(t)
        slow = sum(x > 2 * med for x in t)
        lines.append(
            f"  {name:24s} median {med:.3f} s, mean {statistics.mean(t):.3f} s, "
            f"over 2x its median in {slow} of {len(t)}"
        )

    def per_round(num: str, den: str) -> str:
        return per_round_ratio(times[num], times[den])

    rand, own_name, save_name = list(jobs)
    lines += [
        "  median per-round time ratio [95 % interval]:",
        f"    random bytes / the state's bytes   {per_round(rand, own_name)}",
        f"    save / the state's bytes (raw)     {per_round(save_name, own_name)}",
        f"    save / random bytes (raw)          {per_round(save_name, rand)}",
    ]
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            f"Random bytes against the state's own, and the save, at {args.size}",
            "experiments/write_content.py",
            argv,
            started,
            f"three writes a round in shuffled order, each fsync'ed, {args.gap:g} s of rest "
            "after each; ratios are medians of per-round time ratios with distribution-free "
            "95 % intervals",
            lines,
        )
    return 0


if __name__ == "__main__":
    sys.exit(main())
