"""A tiny epoch loop over a real data loader, for the kill-and-resume tests of data loaders.

It follows the README's "In training" pattern (``loader = ckpt.wrap(loader)``, ``restore()``,
one ``iter()`` per epoch, ``ckpt.step`` after each optimizer step) with a model that uses
dropout, over a shuffled torch ``DataLoader`` or torchdata ``StatefulDataLoader`` (64 samples,
batch 8), optionally with worker processes, optionally on several ranks under ``torchrun``
(gloo, DDP, ``DistributedSampler``). ``--prefetch`` trains nanoGPT's way instead: no loader,
``get_batch`` draws from the torch RNG and the next batch is fetched right after backward,
kept in ``ckpt.extra["batch"]``.

Saves happen at ``--save-at`` steps; ``--kill-at`` SIGKILLs the process (every rank) right after
that step. At the end each rank writes its final model, optimizer and RNG states to
``OUT/rank<r>.pt``. Prints ``START <step>`` after restoring and ``DONE`` last.
"""

from __future__ import annotations

import argparse
import os
import random
import signal
import sys
from pathlib import Path

import numpy as np
import torch

from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval

SAMPLES, BATCH, WIDTH = 64, 8, 4


def dataset() -> torch.utils.data.TensorDataset:
    g = torch.Generator().manual_seed(1234)
    x = torch.randn(SAMPLES, WIDTH, generator=g)
    return torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))


def make_loader(kind: str, workers: int, sampler) -> torch.utils.data.DataLoader:
    args = dict(batch_size=BATCH, num_workers=workers)
    args.update(shuffle=True) if sampler is None else args.update(sampler=sampler)
    if kind == "stateful":
        from torchdata.stateful_dataloader import StatefulDataLoader

        return StatefulDataLoader(dataset(), **args)
    return torch.utils.data.DataLoader(dataset(), **args)


def get_batch(data: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """nanoGPT's get_batch: random rows drawn from the global torch RNG."""
    ix = torch.randint(len(data), (BATCH,))
    x = data[ix]
    return x, x.sum(dim=1, keepdim=True)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("directory")
    p.add_argument("--out", required=True)
    p.add_argument("--loader", choices=("torch", "stateful"), default="torch")
    p.add_argument("--workers", type=int, default=0)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--save-at", default="")
    p.add_argument("--kill-at", type=int, default=None)
    p.add_argument("--prefetch", action="store_true")
    p.add_argument("--ddp", action="store_true")
    args = p.parse_args(argv)
    save_at = {int(s) for s in args.save_at.split(",") if s}
    torch.set_num_threads(1)

    backend, rank, sampler = None, 0, None
    if args.ddp:
        import torch.distributed as dist

        from simulator.controller.distributed import DistributedBackend

        dist.init_process_group("gloo")
        rank = dist.get_rank()
        sampler = torch.utils.data.DistributedSampler(dataset(), shuffle=True, seed=5)
    torch.manual_seed(0)
    random.seed(0)
    np.random.seed(0)  # noqa: NPY002
    model = torch.nn.Sequential(
        torch.nn.Linear(WIDTH, 32),
        torch.nn.Dropout(0.5),
        torch.nn.ReLU(),
        torch.nn.Linear(32, 1),
    )
    if args.ddp:
        backend = DistributedBackend()
        model = torch.nn.parallel.DistributedDataParallel(model)
        torch.manual_seed(100 + rank)  # each rank its own dropout masks
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    data = dataset().tensors[0]

    def train(x, y) -> None:
        loss = torch.nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()

    ckpt = AdaptiveCheckpointer(
        args.directory,
        model=model,
        optimizer=opt,
        policy=FixedInterval(3600.0),  # saves come from --save-at only
        backend=backend,
        extra={"batch": get_batch(data)} if args.prefetch else None,
    )
    step = 0

    def after_step() -> None:
        if step in save_at:
            ckpt.save(step)
        else:
            ckpt.step(step)
        if step == args.kill_at:
            os.kill(os.getpid(), signal.SIGKILL)  # no close, no flush: a crash

    if args.prefetch:
        step = ckpt.restore()
        say(f"START {step}", shared=args.ddp)
        x, y = ckpt.extra["batch"]
        while step < args.epochs * SAMPLES // BATCH:
            loss = torch.nn.functional.mse_loss(model(x), y)
            x, y = get_batch(data)  # the next batch, fetched before this step ends
            opt.zero_grad()
            loss.backward()
            opt.step()
            step += 1
            ckpt.extra["batch"] = (x, y)
            after_step()
    else:
        loader = ckpt.wrap(make_loader(args.loader, args.workers, sampler))
        step = ckpt.restore()
        say(f"START {step}", shared=args.ddp)
        for _epoch in range(loader.epoch, args.epochs):
            for x, y in loader:
                train(x, y)
                step += 1
                after_step()
    ckpt.close()
    np_state = np.random.get_state()  # noqa: NPY002
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    torch.save(
        {
            "step": step,
            "model": model.state_dict(),
            "optimizer": opt.state_dict(),
            "rng_torch": torch.get_rng_state(),
            "rng_python": random.getstate(),
            "rng_numpy": (np_state[0], np_state[1].tolist(), *np_state[2:]),
        },
        out / f"rank{rank}.pt",
    )
    say("DONE", shared=args.ddp)
    if args.ddp:
        torch.distributed.destroy_process_group()
        # No destructors after: DDP still holds the gloo group, and freeing it while this
        # frame unwinds can hang a rank (as it did in the HF two-rank child, in CI).
        os._exit(0)
    return 0


def say(line: str, *, shared: bool) -> None:
    """Print a line; on ranks that share torchrun's stdout, in one write of the whole line
    (print() may write a line's pieces apart, and another rank's output lands inside it).
    In one process it is print(), so a caller's redirect_stdout still applies."""
    if not shared:
        print(line, flush=True)
        return
    sys.stdout.flush()
    os.write(1, (line + "\n").encode())


if __name__ == "__main__":
    sys.exit(main())
