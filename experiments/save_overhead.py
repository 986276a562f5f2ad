"""What a checkpoint save costs beyond the raw write of the same bytes, and what handing the
safetensors serializer each tensor's address saves.

Builds the complete training state once (weights, AdamW moments, scheduler, RNG, data
position), then in ``--rounds`` rounds, jobs shuffled (seeded), back to back:

1. On ``--dir``'s disk: ``ckptio.write_checkpoint`` of the state (the save: safetensors file,
   CRC-32, manifest, fsyncs, rename) against ``raw_write`` of the state's own bytes from its
   own memory, fsync'ed (the benchmark's baseline). Prints both medians, the ratio of the
   medians, and the median of the per-round time ratios with its distribution-free 95 %
   interval (:func:`simulator.engines.results.median_ci`). Between the two, the library's
   write alone (``safetensors.serialize_file`` with the save's ``TensorSpec``s, then the
   file's and the directory's fsync: no CRC, no small files, no rename), which splits the
   save's extra time into the library's and ckptio's own. ``--warm-memory`` runs the
   benchmark's warm-up (:func:`simulator.bench.formats.warm_memory`, twice the state's bytes)
   right before each of these, untimed.
2. Without I/O: how long describing the tensors to the safetensors serializer takes, the two
   ways. ``safetensors.torch.save_file`` checks them and wraps each in a numpy array to learn
   its address (its ``_flatten_as_ptr``) before calling ``safetensors.serialize_file``; the
   save hands ``serialize_file`` a ``TensorSpec`` per tensor itself (``ckptio.write._spec``).
   The serializer call that follows is the same either way.

``--report FILE`` also writes what it prints, with the command and date (the committed
``reports/save-overhead.md``); about a minute at the default size.

    python experiments/save_overhead.py [--size 25M] [--rounds 16] [--dir DIR] [--warm-memory]
        [--report reports/save-overhead.md]
"""

from __future__ import annotations

import argparse
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

from experiments._report import printed_report, report_option  # noqa: E402
from simulator import ckptio  # noqa: E402
from simulator.bench import formats as fmt_io  # noqa: E402
from simulator.bench.runner import WARM_FACTOR  # noqa: E402
from simulator.bench.state import build_state, flatten, parse_size  # noqa: E402
from simulator.ckptio.write import _checked_tensors, _spec  # noqa: E402
from simulator.engines.results import MIN_REPEATS, median_ci  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="25M", help="model size in parameters (25M: ~290 MB)")
    ap.add_argument("--rounds", type=int, default=16, help="rounds of each comparison (16)")
    ap.add_argument("--dir", type=Path, default=REPO, help="the disk the saves are timed on")
    ap.add_argument(
        "--warm-memory",
        action="store_true",
        help="touch and let go of twice the state's bytes before each timed write, untimed "
        "(ckptsim bench --warm-memory)",
    )
    report_option(ap)
    args = ap.parse_args(argv)
    if args.rounds < MIN_REPEATS:
        ap.error(f"--rounds must be at least {MIN_REPEATS} (a median's 95 % interval)")
    if not args.dir.is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    from safetensors import serialize_file
    from safetensors.torch import _flatten_as_ptr  # what save_file runs first (private)

    state = build_state(parse_size(args.size)).state
    tensors = _checked_tensors(flatten(state)[0])
    own = fmt_io.state_bytes(state)
    nbytes = sum(len(v) for v in own)
    work = Path(tempfile.mkdtemp(prefix="ckptsim-save-overhead-", dir=args.dir))
    count = iter(range(1 << 30))
    rng = random.Random(0)

    def timed(fn, where: Path) -> float:  # a job writing ``where / <new name>``
        target = where / f"j{next(count)}"
        if args.warm_memory:
            fmt_io.warm_memory(int(WARM_FACTOR * nbytes))
        start = time.perf_counter()
        fn(target)
        took = time.perf_counter() - start
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        return took

    def serializer(where: Path) -> None:  # the library's write, fsync'ed, nothing else
        where.mkdir()
        serialize_file({k: _spec(t) for k, t in tensors.items()}, where / "f", metadata=None)
        ckptio.fsync_file(where / "f")
        ckptio.fsync_dir(where)

    disk = {
        "save": lambda p: ckptio.write_checkpoint(p, tensors, {"step": 1}),
        "serializer": serializer,
        "raw": lambda p: fmt_io.raw_write(p, own),
    }
    describe = {
        "save_file": lambda: _flatten_as_ptr(tensors, []),
        "TensorSpec": lambda: {k: _spec(t) for k, t in tensors.items()},
    }
    times: dict[str, list[float]] = {k: [] for k in [*disk, *describe]}
    try:
        timed(disk["raw"], work)  # the first large write after the state was built is slow
        for _ in range(args.rounds):
            for name in rng.sample(list(disk), len(disk)):
                times[name].append(timed(disk[name], work))
            for name in rng.sample(list(describe), len(describe)):
                start = time.perf_counter()
                describe[name]()
                times[name].append(time.perf_counter() - start)
    finally:
        shutil.rmtree(work, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}

    def per_round(a: str, b: str) -> str:
        mid, lo, hi = median_ci([x / y for x, y in zip(times[a], times[b], strict=True)])
        return f"{mid:.3f} [{lo:.3f}, {hi:.3f}]"

    ratio, low, high = median_ci([s / r for s, r in zip(times["save"], times["raw"], strict=True)])
    lines = [
        f"{args.size}: {len(tensors)} tensors, {nbytes / 1e6:,.0f} MB, {args.rounds} rounds, "
        "medians",
        f"  on disk ({args.dir}): save {med['save'] * 1e3:.1f} ms, raw write "
        f"{med['raw'] * 1e3:.1f} ms; ratio of the medians {med['save'] / med['raw']:.3f} "
        f"(bandwidth {med['raw'] / med['save']:.2f} of raw); per-round time ratio "
        f"{ratio:.3f} [{low:.3f}, {high:.3f}] (bandwidth {1 / ratio:.3f} "
        f"[{1 / high:.3f}, {1 / low:.3f}])",
        f"  the library's write alone (serialize_file + fsyncs) {med['serializer'] * 1e3:.1f} "
        f"ms: per-round time ratio to the raw write {per_round('serializer', 'raw')}; the "
        f"save's to it {per_round('save', 'serializer')}",
        f"  describing the tensors to the serializer: save_file's way (checks and numpy "
        f"wrapping) {med['save_file'] * 1e3:.2f} ms, a TensorSpec each "
        f"{med['TensorSpec'] * 1e3:.2f} ms ({(med['save_file'] - med['TensorSpec']) * 1e3:.1f} "
        "ms less per save)",
    ]
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            "What a save costs beyond the raw write of the same bytes",
            "experiments/save_overhead.py",
            argv,
            started,
            "jobs shuffled within each round, back to back"
            + (", each after the untimed warm-up (--warm-memory)" if args.warm_memory else "")
            + "; the per-round interval is the median's distribution-free 95 % interval",
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
