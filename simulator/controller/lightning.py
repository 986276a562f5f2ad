"""Lightning integration: a Callback that saves complete training state when the policy says so.

The adaptive interval decides *when* (the same schedule the AdaptiveCheckpointer runs: the
policy, the failure-rate posterior, the measured save cost and iteration time); Lightning's own
``trainer.save_checkpoint`` decides *what*. We let Lightning write because only its checkpoint
holds everything a Lightning run needs to continue identically — the fit loop's progress
counters (which batch of which epoch, so ``on_train_batch_end`` saves resume mid-epoch), the
state of stateful dataloaders, every optimizer and LR scheduler, the precision plugin, other
callbacks' state — and ``trainer.fit(ckpt_path=...)`` already knows how to put it all back.
Writing through our AdaptiveCheckpointer instead would mean re-implementing Lightning's loop
state through private attributes, so the callback uses the AdaptiveCheckpointer only for its
schedule, run log and failure posterior. What Lightning does not give is atomicity and
retention, so each save goes into a temporary directory that is fsynced, given a manifest and
only then renamed to ``step-NNNNNNNN/`` (the controller's layout, manifest and retention rules,
so ``ckptio.verify_checkpoint`` checks these too). Lightning does not save RNG states; this
callback's ``state_dict`` carries every rank's, so a model with dropout resumes identically.
As with Lightning's own checkpoints, an identical mid-epoch resume also needs a resumable
dataloader (one with ``state_dict``/``load_state_dict``, e.g. torchdata's StatefulDataLoader).

Resume with ``trainer.fit(model, ckpt_path=latest_checkpoint(directory))``.
"""

from __future__ import annotations

import json
import os
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.controller.storage import (
    LocalStorage,
    apply_retention,
    checkpoint_name,
    checkpoint_step,
)

__all__ = ["CHECKPOINT_FILE", "AdaptiveCheckpoint", "latest_checkpoint"]

CHECKPOINT_FILE = "lightning.ckpt"
"""The file Lightning writes inside each ``step-NNNNNNNN/`` directory."""

try:  # Lightning is optional: without it this module still imports, the callback does not.
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - exercised only where lightning is absent
    _Callback = object


def latest_checkpoint(directory: str | os.PathLike) -> Path | None:
    """The newest intact Lightning checkpoint file under ``directory``, or None.

    Checkpoints whose files do not match their manifest (a torn or damaged write) are
    skipped with a warning, so a resume falls back to the previous good one.
    """
    directory = Path(directory)
    names = [n for n in LocalStorage(directory).list() if checkpoint_step(n) is not None]
    for name in sorted(names, key=checkpoint_step, reverse=True):
        try:
            ckptio.verify_checkpoint(directory / name)
        except ckptio.CorruptCheckpoint as exc:
            warnings.warn(f"{exc}; trying an older checkpoint", stacklevel=2)
            continue
        if (directory / name / CHECKPOINT_FILE).is_file():
            return directory / name / CHECKPOINT_FILE
    return None


class _TrainerBackend:
    """The controller's coordination seam over Lightning's strategy (rank 0 decides)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.rank = trainer.global_rank
        self.world_size = trainer.world_size

    def broadcast(self, obj):
        return self.trainer.strategy.broadcast(obj, src=0)

    def barrier(self) -> None:
        self.trainer.strategy.barrier("ckptsim")

    def writes_manifest(self) -> bool:
        return True

    def write(self, tmp_dir, state):  # pragma: no cover - Lightning writes, never the controller
        raise NotImplementedError("Lightning writes its own checkpoints")

    read = write


class AdaptiveCheckpoint(_Callback):
    """Saves ``step-NNNNNNNN/lightning.ckpt`` under ``directory`` when the adaptive interval is due.

    Use it with ``Trainer(enable_checkpointing=False, callbacks=[AdaptiveCheckpoint(...)])``
    (or next to a ModelCheckpoint that keeps the best-k). The arguments are those of
    ``AdaptiveCheckpointer``, whose schedule, run log (in ``directory``) and failure-rate
    posterior this callback uses; Lightning writes the checkpoint itself.
    """

    def __init__(
        self,
        directory: str | os.PathLike,
        *,
        policy=None,
        mtbf_h: float | None = None,
        scenario=None,
        restart_s: float = 600.0,
        keep_last: int = 2,
        milestones: Iterable[float] = (),
        total_steps: int | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_steps: int = 20,
    ):
        if _Callback is object:
            raise ImportError(
                "AdaptiveCheckpoint needs lightning (pip install 'ckptsim[lightning]')"
            )
        self.directory = Path(directory)
        self.clock = clock
        self._options = dict(
            policy=policy,
            mtbf_h=mtbf_h,
            scenario=scenario,
            restart_s=restart_s,
            keep_last=keep_last,
            milestones=tuple(milestones),
            total_steps=total_steps,
            clock=clock,
            probe_steps=probe_steps,
        )
        self._validate()
        self.checkpointer = None
        """The AdaptiveCheckpointer whose schedule decides (set when training starts)."""
        self.schedule = None
        self.saved_steps: list[int] = []
        """Steps this callback saved at, in this process."""
        self._last_step: int | None = None
        self._rng_to_restore = None

    def _validate(self) -> None:
        # Fail at construction, not minutes later when the Trainer starts: build one and drop it.
        import torch

        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.storage import MemoryStorage

        class _Rank1:  # a non-zero rank touches no files (no run log, no directory)
            rank, world_size = 1, 2

            def broadcast(self, obj):  # rank 0's verdict on the directory: free to use
                return None

        AdaptiveCheckpointer(
            self.directory,
            model=torch.nn.Identity(),
            storage=MemoryStorage(),
            backend=_Rank1(),
            **self._options,
        )

    # -- Lightning hooks --------------------------------------------------------------------
    def on_train_start(self, trainer, pl_module) -> None:
        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.external import ExternalSaveSchedule

        self.checkpointer = AdaptiveCheckpointer(
            self.directory, model=pl_module, backend=_TrainerBackend(trainer), **self._options
        )
        self.schedule = ExternalSaveSchedule(self.checkpointer)
        step = trainer.global_step
        self._last_step = step
        if self._rng_to_restore is not None:
            # Lightning restores callback state before the fit loop starts; setting the RNG
            # here, just before the first batch, puts it where the saved run was then.
            from simulator.controller.state import set_rng_state

            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        self.schedule.start(step)

    def on_train_end(self, trainer, pl_module) -> None:
        if self.checkpointer is not None:
            self.checkpointer.close()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        step = trainer.global_step
        if step == self._last_step:  # gradient accumulation: no optimizer step this batch
            return
        self._last_step = step
        if self.schedule.is_due(step):
            self.save(trainer, step)

    def state_dict(self) -> dict[str, Any]:
        # Tensors plus a JSON string: Lightning loads checkpoints with weights_only=True,
        # which refuses the NumPy array inside NumPy's RNG state. Only rank 0's dict reaches
        # the file, so every rank's RNG state is gathered into it (all ranks call this
        # from trainer.save_checkpoint).
        import torch.distributed as dist

        from simulator.controller.state import flatten, rng_state

        tensors, tree = flatten(rng_state())
        mine = {"tensors": tensors, "tree": json.dumps(tree)}
        every = [mine]
        if dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1:
            every = [None] * dist.get_world_size()
            dist.all_gather_object(every, mine)
        return {"rng_per_rank": every}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        import torch.distributed as dist

        from simulator.controller.state import unflatten

        every = state_dict.get("rng_per_rank")
        if not every:
            return
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        mine = every[rank] if rank < len(every) else every[0]  # a different world size
        self._rng_to_restore = unflatten(mine["tensors"], json.loads(mine["tree"]))

    # -- saving -----------------------------------------------------------------------------
    def save(self, trainer, step: int) -> Path:
        """Write a complete checkpoint of ``trainer`` at ``step`` atomically (all ranks call)."""
        storage = LocalStorage(self.directory)
        name = checkpoint_name(step)
        tmp = f".tmp-{name}"
        start = self.clock()
        if trainer.is_global_zero:
            self.directory.mkdir(parents=True, exist_ok=True)
            storage.remove(tmp)  # left by a save that crashed at this very step
            (self.directory / tmp).mkdir()
        trainer.strategy.barrier("ckptsim-mkdir")
        trainer.save_checkpoint(self.directory / tmp / CHECKPOINT_FILE)  # collective
        if trainer.is_global_zero:
            self._seal(storage, tmp, name)
        trainer.strategy.barrier("ckptsim-sealed")
        self.saved_steps.append(step)
        self.schedule.record_save(step, stall_s=self.clock() - start)
        return self.directory / name

    def _seal(self, storage: LocalStorage, tmp: str, name: str) -> None:
        """fsync and manifest (files, then the manifest last), rename, retention."""
        from simulator.controller.integrity import write_manifest

        write_manifest(self.directory / tmp)
        old = f".old-{name}"
        if storage.exists(name):  # an earlier save of this step: it leaves once this one is in
            storage.remove(old)
            storage.rename(name, old)
        storage.rename(tmp, name)
        storage.sync()
        storage.remove(old)
        ckpt = self.checkpointer
        apply_retention(
            storage,
            keep_last=ckpt.keep_last,
            milestones=ckpt.milestone_steps,
            resumed_from=ckpt.resumed_from,
        )
