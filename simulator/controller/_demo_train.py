"""A tiny seeded training run for the kill-and-resume tests: every kind of state, in one file.

It trains a small MLP with dropout (torch RNG), AdamW, a cosine LR schedule and an AMP grad
scaler, on batches from a seeded NumPy stream (the data position), and also draws from
Python's and NumPy's global RNGs, so a resume that misses any of them drifts. Killed at any
moment and started again with the same arguments, it resumes from its newest complete
checkpoint; when it finishes it dumps its final state with ``torch.save`` (read back by the
test with ``torch.load(weights_only=True)``, independently of the checkpoint format).

``python -m simulator.controller._demo_train DIR --steps 120 --out final.pt`` (``DIR`` may be
an object-store URL, ``s3://bucket/run``).
Prints ``START <step>`` after restoring, ``SAVE <step>`` just before each save, ``DONE`` last.
"""

from __future__ import annotations

import argparse
import os
import random
import sys
import time

import numpy as np
import torch

from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval


class SeededStream:
    """Batches from a seeded generator; its position is its generator's state."""

    def __init__(self, seed: int, batch: int = 16, width: int = 32):
        self.rng = np.random.default_rng(seed)
        self.batch, self.width = batch, width
        self.served = 0

    def next(self) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.rng.standard_normal((self.batch, self.width), dtype=np.float32)
        y = x[:, :4].sum(axis=1, keepdims=True) * np.float32(0.5)
        self.served += 1
        return torch.from_numpy(x), torch.from_numpy(y)

    def state_dict(self) -> dict:
        return {"bit_generator": self.rng.bit_generator.state, "served": self.served}

    def load_state_dict(self, state: dict) -> None:
        self.rng.bit_generator.state = state["bit_generator"]
        self.served = state["served"]


def build(seed: int, steps: int):
    torch.manual_seed(seed)
    random.seed(seed)
    np.random.seed(seed)  # noqa: NPY002 - the legacy global RNG is part of what is checked
    model = torch.nn.Sequential(
        torch.nn.Linear(32, 64),
        torch.nn.ReLU(),
        torch.nn.Dropout(0.1),
        torch.nn.Linear(64, 1),
    )
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=steps)
    scaler = torch.amp.GradScaler("cpu", init_scale=2.0**8, growth_interval=7)
    return model, optimizer, scheduler, scaler, SeededStream(seed + 1)


def train_step(model, optimizer, scheduler, scaler, data) -> None:
    x, y = data.next()
    x = x * (1.0 + 0.01 * random.random())  # Python's RNG
    x = x + torch.from_numpy(np.random.standard_normal(x.shape).astype(np.float32)) * 0.01  # noqa: NPY002
    optimizer.zero_grad(set_to_none=True)
    loss = torch.nn.functional.mse_loss(model(x), y)
    scaler.scale(loss).backward()
    scaler.step(optimizer)
    scaler.update()
    scheduler.step()


def final_state(model, optimizer, scheduler, scaler, data) -> dict:
    np_state = np.random.get_state()  # noqa: NPY002
    return {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "scaler": scaler.state_dict(),
        "data": data.state_dict(),
        "rng_torch": torch.get_rng_state(),
        "rng_python": random.getstate(),
        "rng_numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
    }


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--steps", type=int, default=120)
    p.add_argument("--out", required=True)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--interval-s", type=float, default=0.05)
    p.add_argument("--async-save", action="store_true")
    p.add_argument(
        "--fsync-delay-s",
        type=float,
        default=0.0,
        help="stretch every fsync by this long, so a test's kill can land inside a write",
    )
    p.add_argument(
        "--put-delay-s",
        type=float,
        default=0.0,
        help="on object storage, wait this long before each object's upload, so a test's "
        "kill can land inside an upload",
    )
    args = p.parse_args(argv)
    if args.put_delay_s > 0:
        from simulator.controller.objstore import FsspecStorage

        real_put = FsspecStorage._put

        def slow_put(self, *a, _delay=args.put_delay_s, **kw):
            time.sleep(_delay)
            real_put(self, *a, **kw)

        FsspecStorage._put = slow_put
    if args.fsync_delay_s > 0:
        # A fast disk finishes a tiny save before a kill sent "just after SAVE" arrives; a
        # slower fsync keeps the write's temp directory open long enough to be hit.
        real_fsync = os.fsync

        def slow_fsync(fd, _delay=args.fsync_delay_s):
            time.sleep(_delay)
            real_fsync(fd)

        os.fsync = slow_fsync
    torch.set_num_threads(1)  # one thread: the same reduction order in every run
    model, optimizer, scheduler, scaler, data = build(args.seed, args.steps)
    ckpt = AdaptiveCheckpointer(
        args.directory,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        dataloader=data,
        policy=FixedInterval(args.interval_s),
        keep_last=2,
        total_steps=args.steps,
        config={"seed": args.seed, "steps": args.steps},
        async_save=args.async_save,
        probe_steps=5,
    )
    start = ckpt.restore()
    print("START", start, flush=True)
    for step in range(start, args.steps):
        train_step(model, optimizer, scheduler, scaler, data)
        if step + 1 >= ckpt.next_due_step:
            print("SAVE", step + 1, flush=True)
        ckpt.step(step + 1)
    ckpt.close()
    torch.save(final_state(model, optimizer, scheduler, scaler, data), args.out)
    print("DONE", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
