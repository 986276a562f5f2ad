"""A tiny Lightning run for the kill-and-resume tests, on one process or Lightning's own DDP.

A LightningModule with dropout (so every rank's RNG stream matters) trains with AdamW on a
shuffled torchdata ``StatefulDataLoader`` (the resumable loader Lightning needs for an exact
mid-epoch resume; under DDP with torchdata's ``StatefulDistributedSampler``, since Lightning
would wrap the loader's own sampler in one that is not resumable) for ``--epochs`` epochs.
A fake clock makes each step take one second, so ``FixedInterval(4 s)`` saves every four
steps after the two-step probe. Started again with the same arguments it resumes from
``latest_checkpoint(DIR)``. ``--kill-at N`` SIGKILLs every rank after step N (no hook runs:
a crash); ``--sigterm-at N`` sends SIGTERM to this process after step N (what a scheduler
does before a preemption; Lightning's launcher forwards it to the other ranks).

At the end each rank writes what it ended with to ``OUT/rank<r>.pt`` (read back with
``torch.load(weights_only=True)``, independently of the checkpoint format).

``python tests/_lightning_run.py DIR OUT [--devices 2] [--kill-at N | --sigterm-at N]``
"""

from __future__ import annotations

import argparse
import os
import signal
import sys
import warnings
from pathlib import Path

import lightning as L
import torch
from torchdata.stateful_dataloader import StatefulDataLoader
from torchdata.stateful_dataloader.sampler import StatefulDistributedSampler

from simulator.controller.lightning import AdaptiveCheckpoint, latest_checkpoint
from simulator.policies import FixedInterval

INTERVAL_S = 4.0
PROBE_STEPS = 2
SAMPLES = 48
BATCH = 4  # 12 batches an epoch on one process, 6 per rank on two


class Clock:
    def __init__(self):
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


class Tiny(L.LightningModule):
    def __init__(self, clock: Clock):
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(4, 16), torch.nn.Dropout(0.3), torch.nn.Tanh(), torch.nn.Linear(16, 1)
        )
        self.clock = clock
        self.seen: dict[int, torch.Tensor] = {}  # each step's batch, by global step

    def training_step(self, batch, batch_idx):
        self.clock.now += 1.0  # one second of "compute" per step
        x, y = batch
        self.seen[self.trainer.global_step + 1] = x.detach().clone()
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=0.01)


class Interrupt(L.Callback):
    """Sends ``signum`` to this process once ``step`` optimizer steps are done."""

    def __init__(self, step: int | None, signum: int):
        self.step, self.signum = step, signum

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        # A SIGKILL hits every rank (a node dies); a scheduler's SIGTERM reaches the launching
        # process, and Lightning's launcher passes it on to the ranks it started.
        if self.signum == signal.SIGTERM and trainer.global_rank != 0:
            return
        if trainer.global_step == self.step:
            self.step = None
            os.kill(os.getpid(), self.signum)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("directory")
    parser.add_argument("out")
    parser.add_argument("--devices", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--samples", type=int, default=SAMPLES)
    parser.add_argument("--no-shuffle", dest="shuffle", action="store_false")
    parser.add_argument("--kill-at", type=int)
    parser.add_argument("--sigterm-at", type=int)
    args = parser.parse_args()
    warnings.simplefilter("ignore")  # Lightning's tips about workers and loggers
    torch.set_num_threads(1)

    clock = Clock()
    callback = AdaptiveCheckpoint(
        args.directory, policy=FixedInterval(INTERVAL_S), clock=clock, probe_steps=PROBE_STEPS
    )
    callbacks = [callback]
    if args.kill_at is not None:
        callbacks.append(Interrupt(args.kill_at, signal.SIGKILL))
    if args.sigterm_at is not None:
        callbacks.append(Interrupt(args.sigterm_at, signal.SIGTERM))
    trainer = L.Trainer(
        max_epochs=args.epochs,
        accelerator="cpu",
        devices=args.devices,
        strategy="ddp" if args.devices > 1 else "auto",
        logger=False,
        enable_progress_bar=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        use_distributed_sampler=False,  # (a no-op on one process)
        callbacks=callbacks,
    )
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, 4, generator=g)
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True).sin())
    torch.manual_seed(2)  # the shuffling generator's seed (torch seeds each process afresh)
    if args.devices > 1:
        # torchdata's own sampler for DDP: Lightning would otherwise wrap the loader's
        # RandomSampler in a DistributedSamplerWrapper that is not resumable.
        sampler = StatefulDistributedSampler(
            data, trainer.world_size, trainer.global_rank, shuffle=args.shuffle, seed=0
        )
        loader = StatefulDataLoader(data, batch_size=BATCH, sampler=sampler)
    else:
        loader = StatefulDataLoader(data, batch_size=BATCH, shuffle=args.shuffle)
    model = Tiny(clock)
    torch.manual_seed(100 + trainer.global_rank)  # dropout differs per rank
    status = None
    try:
        trainer.fit(model, train_dataloaders=loader, ckpt_path=latest_checkpoint(args.directory))
    except SystemExit as exc:  # Lightning's SIGTERMException: the preemption path
        if not callback.preempted:
            raise
        status = exc.code  # exit with it once the results are written, as a script would
    optimizer = trainer.optimizers[0].state_dict()
    torch.save(
        {
            "global_step": trainer.global_step,
            "saved_steps": callback.saved_steps,
            "resumed_from": callback.stats.get("resumed_from"),
            "finished": callback.finished,
            "preempted": callback.preempted,
            "model": {k: v.detach().clone() for k, v in model.state_dict().items()},
            "optimizer": optimizer["state"],
            "rng": torch.get_rng_state(),
            "seen": model.seen,
        },
        Path(args.out) / f"rank{trainer.global_rank}.pt",
    )
    if status is not None:
        sys.exit(status)


if __name__ == "__main__":
    main()
