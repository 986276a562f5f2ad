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

The run's life cycle follows the AdaptiveCheckpointer's. When training ends (``max_steps``,
``max_epochs`` or a stop such as EarlyStopping's) the last step is saved if it was not already
and the checkpoint is marked finished, so a relaunch restores it, trains nothing and says so
(``callback.finished``); a run ended by a requested stop (EarlyStopping) stays stopped. A
SIGTERM goes through Lightning's own SignalConnector, which stops the loops at a batch boundary
with ``SIGTERMException`` (a SystemExit); the callback then saves that step once, records the
preemption (not a failure) in the run log and closes, and Lightning's exception ends ``fit``.
The inner AdaptiveCheckpointer therefore installs no signal handler of its own: two handlers
would fight over SIGTERM. (Under DDP, Lightning 2.6's SIGTERM handler itself runs a
collective inside the signal handler, which can deadlock the ranks; that is Lightning's.)

Lightning cannot resume from a save at an epoch's last batch (it restores the loader at the
epoch's end and then counts the next epoch as run), so a save due there waits one step.

No silent fresh start: :func:`latest_checkpoint` raises :class:`NoIntactCheckpoint` when the
directory holds checkpoints but none is intact (unless ``allow_fresh_start=True``), and when
training starts rank 0 moves every checkpoint newer than the restored one (the damaged ones it
skipped) aside to ``step-N.rejected-<why>``, so retention never deletes them. A restored
checkpoint whose step is not its name's is moved aside as misnamed and ``fit`` stops.

Resume with ``trainer.fit(model, ckpt_path=latest_checkpoint(directory))``. Once the directory
holds a checkpoint, ``fit`` must resume from that newest one: no ``ckpt_path`` (a fresh start)
or any other file (an older step, a ModelCheckpoint's) would write a second history into the
same directory, whose newer checkpoints would then win the next resume, so it is refused with
one line. Lightning's default ModelCheckpoint (``enable_checkpointing=True``) may run alongside;
its extra saves at every epoch's end stall training outside the schedule, so that is warned.
"""

from __future__ import annotations

import json
import logging
import os
import signal
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path
from typing import Any

from simulator.controller.commit import choose_checkpoint, misnamed, reject, rejected_aside
from simulator.controller.integrity import NoIntactCheckpoint
from simulator.controller.objstore import refuse_url
from simulator.controller.storage import (
    LocalStorage,
    apply_retention,
    checkpoint_name,
    checkpoint_step,
)
from simulator.errors import InputError

__all__ = ["CHECKPOINT_FILE", "AdaptiveCheckpoint", "NoIntactCheckpoint", "latest_checkpoint"]

CHECKPOINT_FILE = "lightning.ckpt"
"""The file Lightning writes inside each ``step-NNNNNNNN/`` directory."""

log = logging.getLogger("simulator.controller")

try:  # Lightning is optional: without it this module still imports, the callback does not.
    from lightning.pytorch.callbacks import Callback as _Callback
except ImportError:  # pragma: no cover - exercised only where lightning is absent
    _Callback = object


def latest_checkpoint(
    directory: str | os.PathLike, *, allow_fresh_start: bool = False
) -> Path | None:
    """The newest intact Lightning checkpoint file under ``directory``, or None.

    The controller's own rules choose (``commit.choose_checkpoint``, reading only): a
    checkpoint whose files do not match its manifest (a torn or damaged write), a symlink, or
    one without ``lightning.ckpt`` is skipped with a warning, so a resume falls back to the
    previous good one. None only when there is nothing to resume: a directory holding
    checkpoints (or ones an earlier launch moved aside) none of which is intact raises
    :class:`NoIntactCheckpoint`, unless ``allow_fresh_start`` (start from step 0; when training
    starts they are moved aside, never deleted).
    """
    directory = Path(directory)
    storage = LocalStorage(directory)
    skipped: dict[str, str] = {}
    while True:
        name, rejected = choose_checkpoint(
            directory, storage, None, tidy=False, skip=frozenset(skipped)
        )
        if name is not None and not (directory / name / CHECKPOINT_FILE).is_file():
            rejected[name] = f"{name}: no {CHECKPOINT_FILE} in it (not a Lightning checkpoint)"
        for line in rejected.values():
            warnings.warn(f"{line}; trying an older checkpoint", stacklevel=2)
        skipped.update(rejected)
        if name is None:
            break
        if name not in rejected:
            return directory / name / CHECKPOINT_FILE
    lines = list(skipped.values()) + [
        f"{n}: moved aside by an earlier launch" for n in rejected_aside(storage)
    ]
    if lines and not allow_fresh_start:
        raise NoIntactCheckpoint(
            f"no intact checkpoint to resume from in {directory}: {'; '.join(lines)}. "
            "Nothing was deleted: rescue one by hand (rename it back), or pass "
            "allow_fresh_start=True to start from step 0"
        )
    return None


def _is_last_step(trainer, step: int) -> bool:
    """``step`` is the last optimizer step the Trainer's limits allow."""
    if trainer.max_steps is not None and 0 <= trainer.max_steps <= step:
        return True
    max_epochs = trainer.max_epochs
    return (
        trainer.is_last_batch
        and max_epochs is not None
        and 0 <= max_epochs <= trainer.current_epoch + 1
    )


class _TrainerBackend:
    """The controller's coordination seam over Lightning's strategy (rank 0 decides)."""

    def __init__(self, trainer):
        self.trainer = trainer
        self.rank = trainer.global_rank
        self.world_size = trainer.world_size

    def broadcast(self, obj):
        return self.trainer.strategy.broadcast(obj, src=0)

    def all_gather(self, obj) -> list:
        """Every rank's ``obj``, in rank order: torch.distributed's object all-gather, the
        process group Lightning's multi-process strategies run on (the controller gathers each
        rank's failure of its own work, ``shared_failure.failing_together``)."""
        import torch.distributed as dist

        if self.world_size == 1 or not (dist.is_available() and dist.is_initialized()):
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj)
        return out

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
    (or next to a ModelCheckpoint that keeps the best-k) and resume with
    ``trainer.fit(model, ckpt_path=latest_checkpoint(directory))``. The arguments are those of
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
        refuse_url("the Lightning adapter", directory)
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
        self.finished = False
        """The run had already finished: ``fit`` restored its final checkpoint, trained nothing."""
        self.preempted = False
        """A SIGTERM stopped this run; its step was saved."""
        self._last_step: int | None = None
        self._last_saved: int | None = None
        self._rng_to_restore = None
        # How the run whose checkpoint was restored had ended: None (it had not), "limits"
        # (max_steps/max_epochs) or "stopped" (trainer.should_stop); the final save records it.
        self._restored_finished: str | None = None
        self._finishing: str | None = None

    def _checkpointer_options(self) -> dict[str, Any]:
        options = dict(self._options)
        # Lightning's SignalConnector owns SIGTERM (see the module docstring).
        options["preemption_signals"] = ()
        return options

    def _validate(self) -> None:
        # Fail at construction, not minutes later when the Trainer starts: build one and drop it.
        import torch

        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.storage import MemoryStorage

        class _Rank1:  # a non-zero rank touches no files (no run log, no directory)
            rank, world_size = 1, 2

            def broadcast(self, obj):  # rank 0's verdict on the directory: free to use
                return None

            def all_gather(self, obj):  # every rank fared as this one
                return [obj] * self.world_size

        probe = AdaptiveCheckpointer(
            self.directory,
            model=torch.nn.Identity(),
            storage=MemoryStorage(),
            backend=_Rank1(),
            **self._checkpointer_options(),
        )
        probe.close()

    # -- what the schedule says -------------------------------------------------------------
    @property
    def next_due_step(self) -> int | None:
        """The step of the next scheduled save (None before training starts)."""
        return None if self.schedule is None else self.schedule.next_due_step

    @property
    def stats(self) -> dict[str, Any]:
        """The schedule's current estimates and counters (``AdaptiveCheckpointer.stats``)."""
        return {} if self.checkpointer is None else self.checkpointer.stats

    # -- Lightning hooks --------------------------------------------------------------------
    def on_fit_start(self, trainer, pl_module) -> None:
        self._check_resume_source(trainer)
        self._warn_about_other_periodic_saves(trainer)

    def on_train_start(self, trainer, pl_module) -> None:
        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.external import ExternalSaveSchedule

        if self._restored_finished == "stopped":
            # The run had ended by a requested stop (EarlyStopping, say): nothing to redo.
            # A run that ended by its limits needs nothing here: Lightning's own limit check
            # skips training, unless the relaunch raised them (a deliberate extension).
            trainer.should_stop = True
            return
        self._restored_finished = None
        self.checkpointer = AdaptiveCheckpointer(
            self.directory,
            model=pl_module,
            backend=_TrainerBackend(trainer),
            **self._checkpointer_options(),
        )
        self._set_aside_unusable(trainer)
        self.schedule = ExternalSaveSchedule(self.checkpointer)
        step = trainer.global_step
        self._last_step = step
        self._last_saved = step if step > 0 else None
        if self._rng_to_restore is not None:
            # Lightning restores callback state before the fit loop starts; setting the RNG
            # here, just before the first batch, puts it where the saved run was then.
            from simulator.controller.state import set_rng_state

            set_rng_state(self._rng_to_restore)
            self._rng_to_restore = None
        self.schedule.start(step)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        if self.checkpointer is None:  # a finished run that trains on (min_steps not met)
            return
        step = trainer.global_step
        if step == self._last_step:  # gradient accumulation: no optimizer step this batch
            return
        self._last_step = step
        if _is_last_step(trainer, step):
            return  # the last step's save comes at on_train_end
        if trainer.is_last_batch:
            # Lightning cannot resume from a save at an epoch's last batch: it restores the
            # data loader at that epoch's end, counts the next epoch as run and skips it. A
            # save due now waits one step, for the next epoch's first batch.
            return
        if self.schedule.is_due(step):
            self.save(trainer, step)

    def on_train_end(self, trainer, pl_module) -> None:
        # The fit loop ended by its limits or by a requested stop: the run is finished. Its
        # last step is saved here rather than mid-batch, so the checkpoint holds the ended
        # loop, which a relaunch restores and finds with no work left.
        if self.checkpointer is None or self.checkpointer._closed:
            return
        step = trainer.global_step
        if step > 0:
            self._finishing = "stopped" if trainer.should_stop else "limits"
            try:
                self.save(trainer, step)
            finally:
                self._finishing = None
        self.checkpointer.close(finished=True)

    def on_exception(self, trainer, pl_module, exception: BaseException) -> None:
        from lightning.pytorch.utilities.exceptions import SIGTERMException

        from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE

        if self.checkpointer is None or self.checkpointer._closed:
            return
        if not isinstance(exception, SIGTERMException):
            return  # a crash: no save, no clean stop (the run log counts it as a failure)
        # Lightning raises it at a batch boundary (after the batch's validation), the point
        # its own OnExceptionCheckpoint saves at; the exception is Lightning's way to stop,
        # so there is no trainer.should_stop to set.
        step = trainer.global_step
        if step > 0 and step != self._last_saved:
            self.save(trainer, step)
        self.preempted = True
        self.checkpointer._note_preempted(int(step), signal.SIGTERM)  # the core's record of it
        self.checkpointer.close(finished=False)
        if exception.code is None:
            # Lightning's SIGTERMException carries no status, so the process would exit 0, a
            # completed job to SLURM and torchrun: exit as the plain loop's preemption does.
            exception.code = PREEMPTED_EXIT_CODE
        log.warning(
            "preempted (SIGTERM): step %d saved in %s; exiting with status %s",
            step,
            self.directory,
            exception.code,
        )

    def on_fit_end(self, trainer, pl_module) -> None:
        if self.checkpointer is None and self._restored_finished:
            # The fit loop had nothing to do: Lightning restored the final checkpoint.
            self.finished = True
            log.info(
                "the run in %s had already finished at step %d; nothing to train",
                self.directory,
                trainer.global_step,
            )

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
        return {"rng_per_rank": every, "finished": self._finishing}

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        import torch.distributed as dist

        from simulator.controller.state import unflatten

        self._restored_finished = state_dict.get("finished")
        every = state_dict.get("rng_per_rank")
        if not every:
            return
        rank = dist.get_rank() if dist.is_available() and dist.is_initialized() else 0
        mine = every[rank] if rank < len(every) else every[0]  # a different world size
        self._rng_to_restore = unflatten(mine["tensors"], json.loads(mine["tree"]))

    # -- checks at the start of fit ---------------------------------------------------------
    def _check_resume_source(self, trainer) -> None:
        """Refuse a fit that would write a second history into a directory holding one."""
        problem = None
        if trainer.is_global_zero:
            problem = self._resume_problem(trainer.ckpt_path)
        problem = trainer.strategy.broadcast(problem, src=0)
        if problem is not None:
            raise InputError(problem)

    def _resume_problem(self, ckpt_path) -> str | None:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # a torn newest one: latest_checkpoint falls back
            newest = latest_checkpoint(self.directory, allow_fresh_start=True)
        if newest is None:
            return None
        how = (
            "resume with trainer.fit(model, ckpt_path=latest_checkpoint(directory)), "
            "or give AdaptiveCheckpoint a new directory"
        )
        if not ckpt_path:
            return (
                f"{self.directory} already holds this run's checkpoints up to "
                f"{newest.parent.name}, but trainer.fit got no ckpt_path (a fresh start): {how}"
            )
        if Path(ckpt_path).resolve() != newest.resolve():
            return (
                f"trainer.fit(ckpt_path={str(ckpt_path)!r}) is not the newest checkpoint in "
                f"{self.directory} ({newest.parent.name}); resuming from it would mix two "
                f"histories in one directory: {how}"
            )
        return None

    def _set_aside_unusable(self, trainer) -> None:
        """Rank 0, holding the directory's lock: move aside (never delete) every checkpoint
        newer than the one restored (the damaged ones ``latest_checkpoint`` skipped), so
        retention cannot delete them; refuse a restored checkpoint whose step is not its name's.

        The step inside is known only once Lightning has restored it: a copy named
        ``step-00000090`` holding step 30 would win every resume, and retention would delete
        the newer checkpoints. It is moved aside as misnamed, and ``fit`` stops before training.
        """
        strategy = trainer.strategy
        strategy.barrier("ckptsim-restored")  # every rank has restored before anything moves
        problem = None
        if trainer.is_global_zero:
            storage = LocalStorage(self.directory)
            restored = Path(trainer.ckpt_path) if trainer.ckpt_path else None
            named = restored.parent.name if restored is not None else ""
            mismatch = None
            if checkpoint_step(named) is not None:
                mismatch = misnamed(named, trainer.global_step)
            if mismatch is not None:
                line = f"{restored.parent}: {mismatch}"
                if restored.parent.resolve() == (self.directory / named).resolve():
                    line = reject(storage, named, "misnamed", mismatch)  # ours: set aside
                problem = f"refusing to train on from {restored}: {line}; relaunch to resume"
            else:
                self._set_aside_newer(storage, trainer.global_step)
        problem = strategy.broadcast(problem, src=0)
        if problem is not None:
            ckpt, self.checkpointer = self.checkpointer, None
            ckpt._refuse(problem)
            raise InputError(problem)

    def _set_aside_newer(self, storage: LocalStorage, step: int) -> None:
        """Move aside every checkpoint newer than ``step``, by the core's rules and reasons
        (``commit.choose_checkpoint``); those up to ``step`` (the restored one among them,
        verified by ``latest_checkpoint`` just before) are not read again. A newer one that
        verifies is no Lightning checkpoint (``latest_checkpoint`` skipped it): aside too."""
        skip = {n for n in storage.list() if (checkpoint_step(n) or 0) <= step}
        while True:
            name, rejected = choose_checkpoint(
                self.directory, storage, None, tidy=True, skip=frozenset(skip)
            )
            for line in rejected.values():
                warnings.warn(f"{line}; never deleted", stacklevel=4)
            skip |= set(rejected)
            if name is None:
                return
            why = f"no {CHECKPOINT_FILE} in it (not a Lightning checkpoint)"
            warnings.warn(f"{reject(storage, name, 'foreign', why)}; never deleted", stacklevel=4)
            skip.add(name)

    def _warn_about_other_periodic_saves(self, trainer) -> None:
        from lightning.pytorch.callbacks import ModelCheckpoint

        unmonitored = [
            cb
            for cb in trainer.checkpoint_callbacks
            if isinstance(cb, ModelCheckpoint) and cb.monitor is None
        ]
        if unmonitored and trainer.is_global_zero:
            warnings.warn(
                "a ModelCheckpoint without a monitor (Lightning adds one when "
                "enable_checkpointing=True, the default) also saves at every epoch's end, "
                "stalling training outside the adaptive schedule; pass "
                "Trainer(enable_checkpointing=False) unless you want those saves too",
                UserWarning,
                stacklevel=2,
            )

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
        # weights_only=False is Lightning's default spelled out: the complete state (optimizers,
        # loops, callbacks), without Lightning logging that it chose the default on every save.
        trainer.save_checkpoint(self.directory / tmp / CHECKPOINT_FILE, weights_only=False)
        nbytes = None
        if trainer.is_global_zero:
            nbytes = self._seal(storage, tmp, name)
        trainer.strategy.barrier("ckptsim-sealed")
        self.saved_steps.append(step)
        self._last_saved = step
        self.schedule.record_save(step, stall_s=self.clock() - start, nbytes=nbytes)
        return self.directory / name

    def _seal(self, storage: LocalStorage, tmp: str, name: str) -> int:
        """fsync and manifest (files, then the manifest last), rename, retention; the bytes."""
        from simulator.controller.integrity import write_manifest

        nbytes = int(write_manifest(self.directory / tmp)["bytes"])
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
        return nbytes
