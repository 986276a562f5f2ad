"""Does the job before a timed save change its time? The benchmark's save after each kind of job.

In rounds, for each kind of job in a shuffled (seeded) order: one job of that kind, run as the
benchmark runs it (``runner._measure``: its save, restore and clean-up), then the benchmark's
``ckptsim`` job, whose save time is recorded against the kind before it. The kinds: ``raw``
(the raw job: a plain write of the state's bytes, a plain read back), ``raw, read the restore's
way`` (the same with the restore's readahead thread), and ``ckptsim-async`` (the async save and
its in-place restore). Every timed part follows the benchmark's ``--warm-memory`` warm-up
unless ``--no-warm-memory``. Prints each kind's median and quartiles, and a one-sided Mann-
Whitney U test of each ``raw`` kind being slower than the async one; ``--report FILE`` writes
it with the command and date. This is why ``simulator.bench.runner.interleaved`` balances which
job runs before which. About 6 minutes at the defaults on 2 shared cores.

    python experiments/carry_over.py [--size 100M] [--rounds 12] [--dir DIR]
        [--no-warm-memory] [--report reports/carry-over-1.2GB.md]
"""

from __future__ import annotations

import random
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments._bench_args import bench_parser, parse  # noqa: E402
from experiments._report import printed_report  # noqa: E402
from simulator.bench import BenchConfig, runner  # noqa: E402
from simulator.bench import formats as fmt_io  # noqa: E402
from simulator.bench.state import build_state, parse_size  # noqa: E402

BEFORE = ("raw", "raw, read the restore's way", "ckptsim-async")


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, "rounds", 12, "saves after each kind of job")
    args = parse(ap, argv, "rounds")
    from scipy import stats

    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cfg = BenchConfig(directory=args.dir, sizes=(args.size,), warm_memory=args.warm_memory)
    built = build_state(parse_size(args.size))
    held, nbytes = [built.state], built.tensor_bytes
    del built
    before_clock = runner._before_clock(cfg, nbytes)
    real_read = fmt_io.raw_read

    def read_the_restores_way(directory, *a, **kw):
        return real_read(directory, *a, **(kw | {"readahead": True}))

    work = Path(tempfile.mkdtemp(prefix="ckptsim-carry-over-", dir=args.dir))
    times: dict[str, list[float]] = {kind: [] for kind in BEFORE}
    rng = random.Random(0)
    count = iter(range(1 << 30))

    def job(name: str) -> dict:
        row = {"repeat": next(count)}
        runner._measure(name, held, work / f"j{row['repeat']}", row, before_clock)
        return row

    try:  # the first large write after the state was built is slow: not one of the kinds'
        fmt_io.raw_write(work / "first", fmt_io.state_bytes(held[0]))
        shutil.rmtree(work / "first")
        for _ in range(args.rounds):
            for kind in rng.sample(BEFORE, len(BEFORE)):
                fmt_io.raw_read = read_the_restores_way if kind == BEFORE[1] else real_read
                try:
                    job("raw" if kind.startswith("raw") else kind)
                finally:
                    fmt_io.raw_read = real_read
                times[kind].append(job("ckptsim")["save_s"])
    finally:
        shutil.rmtree(work, ignore_errors=True)
    lines = [
        f"{args.size} ({nbytes / 1e9:.2f} GB): the ckptsim save's time right after each kind of "
        f"job, {args.rounds} each" + (", every clock after the warm-up" if args.warm_memory else "")
    ]
    for kind, values in times.items():
        q1, q2, q3 = statistics.quantiles(values, n=4)
        lines.append(f"  after {kind}: median {q2:.3f} s (quartiles {q1:.3f}, {q3:.3f})")
    for kind in BEFORE[:2]:
        p = stats.mannwhitneyu(times[kind], times[BEFORE[2]], alternative="greater").pvalue
        lines.append(
            f"  after {kind} slower than after {BEFORE[2]}: one-sided Mann-Whitney p {p:.3g}"
        )
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            "The job before a save, and the save's time",
            "experiments/carry_over.py",
            argv,
            started,
            "the benchmark's own jobs (runner._measure), the kinds before each save shuffled "
            "within each round (seeded)",
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
