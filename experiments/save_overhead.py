"""What a checkpoint save costs beyond the raw write of the same bytes, and what handing the
safetensors serializer each tensor's address saves.

Builds the complete training state once (weights, AdamW moments, scheduler, RNG, data
position), then in ``--rounds`` rounds, jobs shuffled (seeded), back to back:

1. On ``--dir``'s disk: ``ckptio.write_checkpoint`` of the state (the save: safetensors file,
   CRC-32, manifest, fsyncs, rename) against ``raw_write`` of the state's own bytes from its
   own memory, fsync'ed (the benchmark's baseline). Prints both medians, the ratio of the
   medians, and the median of the per-round time ratios with its distribution-free 95 %
   interval (:func:`simulator.engines.results.median_ci`).
2. In memory (``/dev/shm`` where it exists, no fsync, so the disk's noise is out): the
   safetensors library's ``safetensors.torch.save_file`` of the same tensors against
   ``safetensors.serialize_file`` handed a ``TensorSpec`` per tensor, as the save does. The
   difference is the per-tensor numpy wrapping ``save_file`` adds.

Writes nothing under ``reports/``; about a minute at the default size.

    python experiments/save_overhead.py [--size 25M] [--rounds 16] [--dir DIR]
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

from simulator import ckptio  # noqa: E402
from simulator.bench import formats as fmt_io  # noqa: E402
from simulator.bench.state import build_state, flatten, parse_size  # noqa: E402
from simulator.ckptio.write import _checked_tensors, _spec  # noqa: E402
from simulator.engines.results import MIN_REPEATS, median_ci  # noqa: E402


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="25M", help="model size in parameters (25M: ~290 MB)")
    ap.add_argument("--rounds", type=int, default=16, help="rounds of each comparison (16)")
    ap.add_argument("--dir", type=Path, default=REPO, help="the disk the saves are timed on")
    args = ap.parse_args(argv)
    if args.rounds < MIN_REPEATS:
        ap.error(f"--rounds must be at least {MIN_REPEATS} (a median's 95 % interval)")
    if not args.dir.is_dir():
        ap.error(f"--dir {args.dir} is not a directory")
    from safetensors import serialize_file
    from safetensors.torch import save_file

    state = build_state(parse_size(args.size)).state
    tensors = _checked_tensors(flatten(state)[0])
    own = fmt_io.state_bytes(state)
    nbytes = sum(len(v) for v in own)
    shm = Path("/dev/shm") if Path("/dev/shm").is_dir() else args.dir
    work = Path(tempfile.mkdtemp(prefix="ckptsim-save-overhead-", dir=args.dir))
    mem = Path(tempfile.mkdtemp(prefix="ckptsim-save-overhead-", dir=shm))
    count = iter(range(1 << 30))
    rng = random.Random(0)

    def timed(fn, where: Path) -> float:
        target = where / f"j{next(count)}"
        start = time.perf_counter()
        fn(target)
        took = time.perf_counter() - start
        shutil.rmtree(target) if target.is_dir() else target.unlink()
        return took

    disk = {
        "save": lambda p: ckptio.write_checkpoint(p, tensors, {"step": 1}),
        "raw": lambda p: fmt_io.raw_write(p, own),
    }
    memory = {
        "save_file": lambda p: save_file(tensors, p, metadata={"format": "pt"}),
        "serialize_file": lambda p: serialize_file(
            {k: _spec(t) for k, t in tensors.items()}, p, metadata={"format": "pt"}
        ),
    }
    times: dict[str, list[float]] = {k: [] for k in [*disk, *memory]}
    try:
        timed(disk["raw"], work)  # the first large write after the state was built is slow
        for _ in range(args.rounds):
            for jobs, where in ((disk, work), (memory, mem)):
                for name in rng.sample(list(jobs), len(jobs)):
                    times[name].append(timed(jobs[name], where))
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(mem, ignore_errors=True)

    med = {k: statistics.median(v) for k, v in times.items()}
    ratio, low, high = median_ci([s / r for s, r in zip(times["save"], times["raw"], strict=True)])
    print(
        f"{args.size}: {len(tensors)} tensors, {nbytes / 1e6:,.0f} MB, {args.rounds} rounds, "
        f"medians"
    )
    print(f"  on disk ({args.dir}): save {med['save'] * 1e3:.1f} ms, raw write "
          f"{med['raw'] * 1e3:.1f} ms; ratio of the medians {med['save'] / med['raw']:.3f} "
          f"(bandwidth {med['raw'] / med['save']:.2f} of raw); per-round time ratio "
          f"{ratio:.3f} [{low:.3f}, {high:.3f}] (bandwidth {1 / ratio:.2f} "
          f"[{1 / high:.2f}, {1 / low:.2f}])")  # fmt: skip
    print(f"  in memory ({shm}): safetensors.torch.save_file {med['save_file'] * 1e3:.1f} ms, "
          f"serialize_file with a TensorSpec per tensor {med['serialize_file'] * 1e3:.1f} ms: "
          f"{(med['save_file'] - med['serialize_file']) * 1e3:.1f} ms of per-tensor wrapping "
          "the save no longer pays")  # fmt: skip
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
