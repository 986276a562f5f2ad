"""What the training-loop hook costs when no save is due: ``AdaptiveCheckpointer.step``.

The hook runs after every optimizer step, so its cost when nothing is due must vanish next to
an iteration (goal: under 10 µs). Method: ``timeit`` calls ``ckpt.step(n)`` with ``n`` below
the precomputed due step, ``--number`` calls per repeat, and reports the fastest of
``--repeat`` repeats (the usual timeit convention: the minimum is the cost without
interference from other processes), next to the same measurement for an empty Python method
call as a floor.

``python -m experiments.bench_hook``
"""

from __future__ import annotations

import argparse
import platform
import tempfile
import timeit

import torch

from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval


class _Empty:
    def step(self, step: int) -> bool:
        return False


def per_call_s(fn, number: int, repeat: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeat)) / number


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--number", type=int, default=200_000)
    p.add_argument("--repeat", type=int, default=7)
    args = p.parse_args(argv)
    with tempfile.TemporaryDirectory() as directory:
        model = torch.nn.Linear(16, 16)
        ckpt = AdaptiveCheckpointer(
            directory,
            model=model,
            optimizer=torch.optim.AdamW(model.parameters()),
            policy=FixedInterval(3600.0),
        )
        ckpt.restore()
        step = ckpt.next_due_step - 1
        assert ckpt.step(step) is False
        hook = per_call_s(lambda: ckpt.step(step), args.number, args.repeat)
        empty = _Empty()
        floor = per_call_s(lambda: empty.step(step), args.number, args.repeat)
        ckpt.close()
    print(f"python {platform.python_version()} on {platform.machine()}, torch {torch.__version__}")
    print(f"timeit: fastest of {args.repeat} repeats x {args.number:,} calls")
    print(f"AdaptiveCheckpointer.step, no save due: {hook * 1e9:8.1f} ns per call")
    print(f"empty method call (floor):              {floor * 1e9:8.1f} ns per call")
    verdict = "under" if hook < 10e-6 else "OVER"
    print(f"goal < 10 µs per call: {verdict}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
