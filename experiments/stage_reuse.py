"""The stall of an asynchronous save on a CPU: staging into fresh buffers against the last save's.

``AdaptiveCheckpointer(async_save=True)`` stalls training only while it copies the state out
(``simulator.controller.state.stage``); since the controller keeps the last save's staging
buffers and copies into them again once that save's write is over, later saves skip the
allocation. On a CPU a fresh allocation costs its page faults, which the copy then pays (a
GPU's pinned buffers cost page-locking instead: ``experiments/gpu_staging.py`` times that).

This script builds a GPT-like training state (weights and two AdamW moments, a few large
tensors and many small ones), then times ``stage(state)`` into fresh buffers and
``stage(state, reuse=previous)`` alternately, in one process, and prints each repeat and the
median ratio fresh/reused with a bootstrap 95 % interval over the repeats. The interval is
within one process; the ratio moves from one process to the next (1.2x to 5.1x over six runs
here, as the allocator hands freed memory back or keeps it), so run it more than once.

    python experiments/stage_reuse.py [--mb 300] [--repeats 15]
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from experiments._report import printed_report, report_option


def build_state(mb: int):
    import torch

    g = torch.Generator().manual_seed(0)
    n_big = max(1, mb // 12)  # 1024x1024 fp32 = 4 MB, three copies (weight, exp_avg, sq)
    weights = {f"w{i}": torch.randn(1024, 1024, generator=g) for i in range(n_big)}
    weights |= {f"b{i}": torch.randn(1024, generator=g) for i in range(4 * n_big)}
    moments = {
        name: {"exp_avg": torch.randn_like(t), "exp_avg_sq": torch.rand_like(t)}
        for name, t in weights.items()
    }
    return {"model": weights, "optimizer": {"state": moments}, "step": 1}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=300, help="state size in MB (default 300)")
    parser.add_argument("--repeats", type=int, default=15, help="pairs timed (default 15)")
    report_option(parser)
    args = parser.parse_args(argv)
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    from simulator.controller.state import stage

    state = build_state(args.mb)
    _, buffers = stage(state)  # the first save: allocates what later saves reuse
    fresh, reused = [], []
    for rep in range(args.repeats):
        for kind in ("fresh", "reused") if rep % 2 == 0 else ("reused", "fresh"):
            t0 = time.perf_counter()
            staged, out = stage(state, reuse=buffers if kind == "reused" else None)
            took = time.perf_counter() - t0
            (reused if kind == "reused" else fresh).append(took)
            del staged, out  # as when the background write is over
    ratios = np.array(fresh) / np.array(reused)
    rng = np.random.default_rng(0)
    boots = np.median(rng.choice(ratios, (10_000, len(ratios))), axis=1)
    lo, hi = np.percentile(boots, [2.5, 97.5])
    nbytes = sum(t.numel() * t.element_size() for t in buffers.values())
    lines = [
        f"state {nbytes / 1e6:.0f} MB in {len(buffers)} tensors, {args.repeats} pairs",
        "fresh  s: " + " ".join(f"{x:.3f}" for x in fresh),
        "reused s: " + " ".join(f"{x:.3f}" for x in reused),
        f"median stall: fresh {np.median(fresh):.3f} s, reused {np.median(reused):.3f} s; "
        f"fresh/reused {np.median(ratios):.2f} (95% CI {lo:.2f}-{hi:.2f})",
    ]
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            "An async save's staging copy: into fresh memory or the last save's buffers",
            "experiments/stage_reuse.py",
            argv,
            started,
            "pairs interleaved in one process, the order alternating; the interval is a "
            "bootstrap (10,000 resamples) of the median per-pair ratio",
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
