"""The training stall of a reduced-precision save, against an exact one, in one process.

A save stalls training while the checkpointer captures the state and, for ``async_save``,
copies it out (``simulator.controller.state.stage``); a synchronous save stalls for the whole
write. ``optimizer_precision`` / ``weights_precision`` add the encode
(``simulator.controller.precision.reduce_state``). This script trains a stack of linear layers
(AdamW, so both moments hold real values) to build the state, then saves it through
``AdaptiveCheckpointer`` in each mode, interleaved round after round so load changes hit every
mode alike, and reads each save's stall from the run log (``stall_s``: the checkpointer's own
measurement, which excludes waiting for the previous write). It prints each mode's median stall
and its ratio to the exact save of the same kind (async or sync), median of the per-round
ratios with a bootstrap 95 % interval.

    python experiments/precision_stall.py [--mb 100] [--rounds 9]

Runs against whatever ``simulator`` is importable, so the same command times another checkout
(``PYTHONPATH=/other/checkout``); ``--weights`` is skipped where the controller has no
``weights_precision``.
"""

from __future__ import annotations

import argparse
import inspect
import json
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

if __package__ in (None, ""):
    sys.path.append(str(Path(__file__).resolve().parents[1]))  # after PYTHONPATH

WIDTH = 1024
"""A layer's weight is WIDTH x WIDTH fp32 (4 MB); with two moments 12 MB of state."""


def build(mb: int):
    import torch

    torch.manual_seed(0)
    layers = max(1, round(mb * 1e6 / (12 * WIDTH * WIDTH)))
    model = torch.nn.Sequential(*[torch.nn.Linear(WIDTH, WIDTH) for _ in range(layers)])
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    for _ in range(2):  # both moments hold real values
        loss = model(torch.randn(8, WIDTH)).square().mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    return model, opt


def modes(weights: bool) -> list[dict]:
    out = [dict(), dict(optimizer_precision="bf16"), dict(optimizer_precision="int8")]
    if weights:
        out += [
            dict(weights_precision="bf16"),
            dict(optimizer_precision="int8", weights_precision="bf16"),
        ]
    return out


def label(mode: dict) -> str:
    parts = [f"{k.split('_')[0]} {v}" for k, v in mode.items()]
    return ", ".join(parts) or "exact"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--mb", type=int, default=100, help="state size in MB (default 100)")
    parser.add_argument("--rounds", type=int, default=9, help="saves per mode (default 9)")
    args = parser.parse_args(argv)
    if args.mb < 1 or args.rounds < 2:
        parser.error("--mb must be >= 1 and --rounds >= 2")
    import torch

    from simulator.controller import AdaptiveCheckpointer
    from simulator.policies import FixedInterval

    torch.set_num_threads(1)
    model, opt = build(args.mb)
    has_weights = "weights_precision" in inspect.signature(AdaptiveCheckpointer).parameters
    stalls: dict[tuple[str, str], list[float]] = {}
    with tempfile.TemporaryDirectory(prefix="ckptsim-stall-") as tmp:
        cks = {}
        for kind in ("async", "sync"):
            for i, mode in enumerate(modes(has_weights)):
                cks[kind, label(mode)] = AdaptiveCheckpointer(
                    Path(tmp) / f"{kind}{i}",
                    model=model,
                    optimizer=opt,
                    policy=FixedInterval(1e12),
                    keep_last=2,
                    async_save=kind == "async",
                    preemption_signals=(),
                    **mode,
                )
        for r in range(args.rounds + 1):  # round 0 allocates the staging buffers: not counted
            order = list(cks.items())
            order = order[r % len(order) :] + order[: r % len(order)]
            for _, ck in order:
                ck.save(r + 1)
                # The next save reuses this one's staging buffers only once its write is over;
                # wait here so every timed save copies into buffers already mapped.
                ck._finish_inflight()
        for key, ck in cks.items():
            ck.close(finished=False)
            log = Path(ck.root) / "runlog.jsonl"
            saves = [json.loads(line) for line in log.read_text().splitlines()]
            stalls[key] = [e["stall_s"] for e in saves if e.get("event") == "save"][1:]
    nbytes = sum(t.numel() * t.element_size() for t in model.state_dict().values())
    nbytes += sum(
        t.numel() * t.element_size() for s in opt.state.values() for t in s.values() if t.dim()
    )
    print(f"state {nbytes / 1e6:.0f} MB, {args.rounds} saves per mode, one torch thread")
    rng = np.random.default_rng(0)
    for kind in ("async", "sync"):
        base = np.array(stalls[kind, "exact"])
        for (k, name), values in stalls.items():
            if k != kind:
                continue
            ratios = np.array(values) / base
            boots = np.median(rng.choice(ratios, (10_000, len(ratios))), axis=1)
            lo, hi = np.percentile(boots, [2.5, 97.5])
            print(
                f"{kind:5} {name:28} stall median {np.median(values):.3f} s; "
                f"/ exact {kind} {np.median(ratios):.2f} (95% CI {lo:.2f}-{hi:.2f})"
            )
    return 0


if __name__ == "__main__":
    t0 = time.perf_counter()
    rc = main()
    print(f"took {time.perf_counter() - t0:.0f} s")
    raise SystemExit(rc)
