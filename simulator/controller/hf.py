"""Hugging Face integration: Trainer saves when the adaptive schedule says, and each save verifies.

Trainer already writes complete checkpoints in its own format (model, optimizer, scheduler,
scaler, every process's RNG state, ``trainer_state.json`` with the step and the data position)
and resumes from them, so :class:`AdaptiveSaveCallback` decides *when*: after each optimizer
step it compares the step with the adaptive schedule's next due step (an int compare) and sets
``control.should_save``; Trainer then writes ``checkpoint-<step>/`` and calls ``on_save``
(``_save_checkpoint`` runs, rotation included, before ``on_save``). The time from
``on_step_end`` to the end of ``on_save`` is the save's cost — it includes any logging or
evaluation Trainer ran at the same step, so keep evaluation off the save steps or accept a
slightly pessimistic cost. A resumed Trainer continues the schedule from the estimates that the
run log in ``output_dir`` holds for its checkpoint's step, without a new probe.

What Trainer lacks is atomicity: it writes the files of ``checkpoint-<step>/`` one by one, so a
kill during a save leaves a torn folder that ``resume_from_checkpoint=True`` picks anyway (and
crashes on, or resumes without RNG state). So in ``on_save``, after every rank has written its
files, rank 0 writes a completion marker into the folder: the ckptsim manifest
(``manifest.json``: size and CRC-32 of every file, written to a temporary name, fsynced and
renamed into place, see :func:`simulator.controller.integrity.write_manifest`).
:func:`latest_checkpoint` returns the newest folder whose files match its manifest, warning
about each newer one it skips and why. Resume with::

    trainer = Trainer(..., args=TrainingArguments(..., save_strategy="no"),
                      callbacks=[AdaptiveSaveCallback(mtbf_h=...)])
    resume_training(trainer)   # = trainer.train(resume_from_checkpoint=latest_checkpoint(...))

:func:`resume_training` also returns at once, saying so, when the newest complete checkpoint is
the run's last step (a scheduler relaunching a finished job), with that step's weights loaded;
Trainer itself would train one more step. After a preemption it exits with status 75 (see its
``on_preemption``). The callback saves the last step when training ends (the run can be relaunched
without retraining its tail) and, on a preemption signal (SIGTERM by default), saves at the next
step end and stops Trainer with ``control.should_training_stop``.

The adaptive interval is the only step-based schedule: ``save_strategy="steps"`` is refused
(its saves would reset the adaptive interval, which then never asks for one), and so is
``"best"`` (Trainer sets ``should_save`` to "a new best" after the callbacks run, dropping the
adaptive saves). ``"epoch"`` saves are fine and count as saves: the interval restarts from them.

No silent fresh start: when ``output_dir`` holds checkpoint folders but none is complete,
:func:`latest_checkpoint` (and so :func:`resume_training`) raises :class:`NoIntactCheckpoint`
unless ``allow_fresh_start=True``; a plain ``trainer.train()`` in a directory holding a
complete checkpoint is refused, and so is a resume (``resume_from_checkpoint=True`` included,
which checks nothing) from a damaged or misnamed folder, which is moved aside. When training
begins, rank 0 moves every ``checkpoint-N`` newer than the step it starts from aside to
``checkpoint-N.rejected-<why>`` (damaged ones, symlinks and plain files, or newer ones a resume
from an older step passed over), so Trainer never writes over or through them and retention
never deletes them.

Retention: ``save_total_limit`` counts complete checkpoints only. Trainer's own rotation counts
torn folders too and runs before the marker exists, so it could delete the last complete
checkpoint; the callback therefore switches it off for the run (``args.save_total_limit`` is
None while training, restored after) and, after each marker, keeps the newest
``save_total_limit`` complete folders (and ``best_model_checkpoint``) and deletes older ones and
this run's own torn folders older than the save just made (each renamed aside, then removed, so
a kill never leaves half a folder). Without ``save_total_limit`` nothing is deleted.
"""

from __future__ import annotations

import json
import logging
import os
import re
import signal
import time
import warnings
from collections.abc import Callable, Iterable
from pathlib import Path

from simulator import ckptio
from simulator.controller.commit import reject, rejected_aside
from simulator.controller.integrity import NoIntactCheckpoint, verify_once
from simulator.controller.objstore import refuse_url
from simulator.controller.storage import LocalStorage, delete_checkpoint, finish_deletions
from simulator.errors import InputError

__all__ = [
    "AdaptiveSaveCallback",
    "NoIntactCheckpoint",
    "RunFinished",
    "latest_checkpoint",
    "resume_training",
]

log = logging.getLogger("simulator.controller")

_CHECKPOINT = re.compile(r"^checkpoint-(\d+)$")  # transformers.trainer_utils' own pattern
_TRAINER_STATE = "trainer_state.json"

try:  # transformers is optional: without it this module still imports, the callback does not.
    from transformers import TrainerCallback as _TrainerCallback
except ImportError:  # pragma: no cover - exercised only where transformers is absent
    _TrainerCallback = object


class RunFinished(InputError):
    """Trainer was asked to resume a run that had already reached its last step."""


def _folders(output_dir: Path) -> list[tuple[int, Path]]:
    """``checkpoint-N`` entries of ``output_dir`` (symlinks and plain files included: Trainer
    cannot save over either), newest step first."""
    if not output_dir.is_dir():
        return []
    found = []
    for entry in output_dir.iterdir():
        m = _CHECKPOINT.match(entry.name)
        if m:
            found.append((int(m.group(1)), entry))
    return sorted(found, reverse=True)


def _why_not(step: int, folder: Path) -> str | None:
    """Why ``folder`` is no complete checkpoint of ``step`` (None: it is, CRCs checked)."""
    if folder.is_symlink():
        return "it is a symlink (never followed)"
    if not folder.is_dir():
        return "it is not a folder"
    if not (folder / ckptio.MANIFEST).is_file():
        return (
            f"no completion marker ({ckptio.MANIFEST}): the save was interrupted, or "
            "AdaptiveSaveCallback did not write it"
        )
    try:
        verify_once(folder)  # a folder this process verified unchanged is not read again
        state = json.loads((folder / _TRAINER_STATE).read_bytes())
        if state.get("global_step") != step:
            return f"{_TRAINER_STATE} holds step {state.get('global_step')!r}, not {step}"
    except ckptio.CorruptCheckpoint as exc:
        return str(exc)
    except (OSError, ValueError, AttributeError) as exc:
        return f"{_TRAINER_STATE} is unreadable: {exc}"
    return None


def latest_checkpoint(
    output_dir: str | os.PathLike, *, allow_fresh_start: bool = False
) -> str | None:
    """The newest complete ``checkpoint-N`` folder of ``output_dir`` (CRC-verified), or None.

    Each newer folder that is skipped (torn, damaged, unmarked, a symlink) gets a warning naming
    it and why. Pass the result to ``trainer.train(resume_from_checkpoint=...)``. None only when
    there is nothing to resume: a directory that holds checkpoint folders (or ones an earlier
    launch moved aside) none of which is complete raises :class:`NoIntactCheckpoint`, as the
    AdaptiveCheckpointer's restore does, unless ``allow_fresh_start`` (start from step 0 and
    keep the folders).
    """
    skipped = []
    for step, folder in _folders(Path(output_dir)):
        reason = _why_not(step, folder)
        if reason is None:
            return str(folder)
        warnings.warn(f"skipping {folder}: {reason}", stacklevel=2)
        skipped.append(f"{folder.name}: {reason}")
    aside = rejected_aside(LocalStorage(output_dir), step_of=_CHECKPOINT.match)
    skipped += [f"{name}: moved aside by an earlier launch" for name in aside]
    if skipped and not allow_fresh_start:
        raise NoIntactCheckpoint(
            f"no complete checkpoint to resume from in {output_dir}: {'; '.join(skipped)}. "
            "Nothing was deleted: rescue one by hand (rename it back), or pass "
            "allow_fresh_start=True to start from step 0"
        )
    return None


def _resumed_folder(output_dir: Path, step: int) -> Path | None:
    """The folder of ``output_dir`` a Trainer at ``step`` resumed from: the newest whose
    ``trainer_state.json`` holds that step (``checkpoint-<step>``, or a misnamed copy)."""
    from simulator.controller.runlog import open_regular

    for _, folder in _folders(output_dir):
        if not folder.is_dir():  # a symlink to a folder counts: Trainer follows it
            continue
        try:  # a regular file only: a FIFO planted there must not hang the launch
            with os.fdopen(open_regular(folder / _TRAINER_STATE, os.O_RDONLY, follow=True)) as f:
                state = json.loads(f.read(1 << 20))
        except (OSError, ValueError, RecursionError):
            continue
        if isinstance(state, dict) and state.get("global_step") == step:
            return folder
    return None


def _finished_at(checkpoint: str, max_steps: int) -> int | None:
    state = json.loads((Path(checkpoint) / _TRAINER_STATE).read_bytes())
    target = max_steps if max_steps > 0 else int(state.get("max_steps") or 0)
    step = int(state["global_step"])
    return step if target > 0 and step >= target else None


ON_PREEMPTION = ("exit", "return")


def resume_training(
    trainer, *, allow_fresh_start: bool = False, on_preemption: str = "exit", **train_kwargs
):
    """``trainer.train`` from the newest complete checkpoint; None at once if the run finished.

    A fresh start when the directory holds no checkpoint. When it holds some but none is
    complete, :class:`NoIntactCheckpoint` (see :func:`latest_checkpoint`), unless
    ``allow_fresh_start``: then training starts from step 0 and the folders are moved aside.

    A finished run (the newest complete checkpoint is the last step): its model weights are
    loaded into ``trainer.model`` (Trainer's own loader), so what the script does next (an
    evaluation, ``save_model``) has the trained model, and it says so in a warning.

    ``on_preemption``: after a preemption signal the callback saved and stopped Trainer, whose
    ``train`` then returns as if done. ``"exit"`` (the default) then exits the process with
    :data:`~simulator.controller.checkpointer.PREEMPTED_EXIT_CODE` (75, as the plain loop
    does): a scheduler does not take the job for completed, and no code after this call (a
    ``save_model``, a push to the hub) takes the half-trained model for the final one.
    ``"return"`` returns Trainer's output instead (check the callback's ``preempted``).
    """
    if on_preemption not in ON_PREEMPTION:
        raise InputError(
            f"on_preemption must be one of {', '.join(map(repr, ON_PREEMPTION))}, "
            f"got {on_preemption!r}"
        )
    checkpoint = latest_checkpoint(trainer.args.output_dir, allow_fresh_start=allow_fresh_start)
    if checkpoint is not None:
        step = _finished_at(checkpoint, trainer.args.max_steps)
        if step is not None:
            trainer._load_from_checkpoint(checkpoint)  # the model's weights, Trainer's way
            # and its state (global_step, the log history), which that leaves out
            trainer.state = type(trainer.state).load_from_json(
                str(Path(checkpoint) / _TRAINER_STATE)
            )
            warnings.warn(
                f"the run in {checkpoint} finished at step {step}: nothing to train; its "
                "model weights and trainer state are loaded into trainer.model and "
                "trainer.state",
                stacklevel=2,
            )
            return None
    output = trainer.train(resume_from_checkpoint=checkpoint, **train_kwargs)
    preempted = [
        cb
        for cb in trainer.callback_handler.callbacks
        if isinstance(cb, AdaptiveSaveCallback) and cb.preempted
    ]
    if preempted and on_preemption == "exit":
        from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE

        log.warning(
            "preempted: step %d saved in %s; exiting with status %d",
            trainer.state.global_step,
            trainer.args.output_dir,
            PREEMPTED_EXIT_CODE,
        )
        raise SystemExit(PREEMPTED_EXIT_CODE)
    return output


def _backend():
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from simulator.controller.distributed import DistributedBackend

        return DistributedBackend()
    from simulator.controller.backend import LocalBackend

    return LocalBackend()


def _strategy(args) -> str:
    return str(getattr(args.save_strategy, "value", args.save_strategy))


def _refuse_steps(args) -> None:
    if _strategy(args) == "steps":
        raise InputError(
            f"save_strategy='steps' (save_steps={args.save_steps}) fights the adaptive interval: "
            "each of its saves restarts the interval, which then never comes due; use "
            "save_strategy='no' (or 'epoch') with AdaptiveSaveCallback"
        )
    if _strategy(args) == "best":
        raise InputError(
            "save_strategy='best' lets Trainer overrule every save the adaptive interval asks "
            "for (it sets should_save to 'is this a new best' after the callbacks ran), the "
            "final one included; use save_strategy='no' (or 'epoch') with AdaptiveSaveCallback "
            "and keep the best model with load_best_model_at_end on epoch saves"
        )


class AdaptiveSaveCallback(_TrainerCallback):
    """Sets ``control.should_save`` at the steps the adaptive checkpoint interval picks.

    The arguments are those of ``AdaptiveCheckpointer``, whose schedule, run log (kept in
    ``args.output_dir``) and failure-rate posterior decide. Under torch.distributed, rank 0's
    decision is broadcast at save time, so every process sets ``should_save`` at the same step;
    a signal in ``preemption_signals`` is the checkpointer's own (its handler only sets a flag;
    under torch.distributed every rank acts on rank 0's signal at the same check point), and
    makes the callback save that step and stop training. ``preemption_signals=()`` installs no
    handler.
    """

    def __init__(
        self,
        *,
        policy=None,
        mtbf_h: float | None = None,
        scenario=None,
        restart_s: float = 600.0,
        clock: Callable[[], float] = time.monotonic,
        probe_steps: int = 20,
        preemption_signals: Iterable[int] = (signal.SIGTERM,),
    ):
        if _TrainerCallback is object:
            raise ImportError("AdaptiveSaveCallback needs transformers (pip install 'ckptsim[hf]')")
        self.clock = clock
        self._options = dict(
            policy=policy,
            mtbf_h=mtbf_h,
            scenario=scenario,
            restart_s=restart_s,
            clock=clock,
            probe_steps=probe_steps,
        )
        self.preemption_signals = tuple(preemption_signals)
        self.checkpointer = None
        """The AdaptiveCheckpointer whose schedule decides (set when training begins)."""
        self.schedule = None
        self.requested_steps: list[int] = []
        """Steps at which this callback set ``should_save``."""
        self.saved_steps: list[int] = []
        """Steps at which Trainer reported a save (``on_save``)."""
        self.save_costs_s: list[float] = []
        """Measured cost of each of those saves (writing and marking), seconds."""
        self.preempted = False
        """A preemption signal arrived; the run saved and stopped."""
        self._step_end_t: float | None = None
        self._save_total_limit = None
        self._begin_step = 0

    @property
    def stats(self) -> dict:
        """The checkpointer's ``stats``, current after every step and save."""
        return self.checkpointer.stats

    def _sync_stats(self) -> None:
        # The schedule plans outside AdaptiveCheckpointer.step, so its due step is copied back.
        self.checkpointer._planned_due = self.schedule.next_due_step

    # -- life cycle --------------------------------------------------------------------------
    def on_init_end(self, args, state, control, **kwargs):
        _refuse_steps(args)
        return control

    def on_train_begin(self, args, state, control, model=None, **kwargs):
        from simulator.controller.checkpointer import AdaptiveCheckpointer
        from simulator.controller.external import ExternalSaveSchedule

        _refuse_steps(args)  # the arguments may have been changed after Trainer was built
        refuse_url("the Hugging Face adapter", args.output_dir)
        if state.global_step > 0 and state.global_step >= state.max_steps:
            raise RunFinished(
                f"the run in {args.output_dir} already finished at step {state.global_step} "
                f"(max_steps={state.max_steps}); Trainer would train one more step: start it with "
                "simulator.controller.hf.resume_training(trainer), which returns at once"
            )
        # Trainer's rotation runs before the marker and counts torn folders; ours replaces it.
        self._save_total_limit, args.save_total_limit = args.save_total_limit, None
        # The core handles the signals: its handler, its check points, its run-log record.
        options = dict(
            self._options, preemption_signals=self.preemption_signals, on_preemption="stop"
        )
        self.checkpointer = AdaptiveCheckpointer(
            args.output_dir, model=model, backend=_backend(), **options
        )
        self._begin_step = state.global_step
        self._check_start(Path(args.output_dir), state.global_step)
        self.schedule = ExternalSaveSchedule(self.checkpointer)
        self.schedule.start(state.global_step)
        self._sync_stats()
        return control

    def on_step_end(self, args, state, control, **kwargs):
        self._step_end_t = self.clock()
        step = state.global_step
        if self.schedule.is_due(step):
            control.should_save = True
            if self.checkpointer._agreed is not None:  # a preemption: save this step and stop
                self.preempted = True
                control.should_training_stop = True
                log.info("preemption signal: saving step %d and stopping", step)
            else:
                self.requested_steps.append(step)
        self._sync_stats()
        if step >= state.max_steps and self.checkpointer.last_saved_step != step:
            control.should_save = True  # the last step, so a relaunch has nothing to redo
        if control.should_save:
            self._drop_stale_marker(args, step)
        return control

    def on_epoch_end(self, args, state, control, **kwargs):
        if control.should_save and self.checkpointer.last_saved_step == state.global_step:
            # An "epoch" save at the step the adaptive one just saved: the same checkpoint
            # again, twice the cost and a second record of one save.
            control.should_save = False
        if control.should_save:  # an "epoch" save strategy
            self._drop_stale_marker(args, state.global_step)
        return control

    def on_save(self, args, state, control, **kwargs):
        folder = Path(args.output_dir) / f"checkpoint-{state.global_step}"
        backend = self.checkpointer.backend
        backend.barrier()  # every rank's files (its rng_state_<rank>.pth) are written
        nbytes = 0
        if backend.rank == 0:
            from simulator.controller.integrity import write_manifest

            nbytes = write_manifest(folder)["bytes"]
            if self._save_total_limit:
                self._rotate(Path(args.output_dir), state)
        now = self.clock()
        stall_s = 0.0 if self._step_end_t is None else max(now - self._step_end_t, 0.0)
        self.saved_steps.append(state.global_step)
        self.save_costs_s.append(stall_s)
        self.schedule.record_save(state.global_step, stall_s=stall_s, nbytes=nbytes or None)
        self._sync_stats()
        return control

    def on_train_end(self, args, state, control, **kwargs):
        if self._save_total_limit is not None:
            args.save_total_limit = self._save_total_limit
        if self.checkpointer is not None:
            # record_save noted the preemption in the run log (the core's record of it).
            finished = not self.preempted and state.global_step >= state.max_steps
            self.checkpointer.close(finished=finished)
        return control

    # -- helpers -----------------------------------------------------------------------------
    def _check_start(self, output_dir: Path, begin_step: int) -> None:
        """Refuse a start that would lose or mix histories; then move aside every
        ``checkpoint-N`` newer than the step this run starts from.

        Refused (one line, the run log's ``refused``, nothing trained): a fresh start
        (``begin_step`` 0) in a directory holding a complete checkpoint, and a resume from a
        folder that is damaged or whose ``trainer_state.json`` step is not its name's (it is
        moved aside, so a relaunch resumes from the newest good one). Trainer finds such a
        folder itself with ``resume_from_checkpoint=True``, which checks nothing.

        The newer folders are the ones :func:`latest_checkpoint` skipped (torn, damaged,
        misnamed, symlinks, plain files), or newer ones a deliberate resume from an older step
        passed over; Trainer would write its own saves over (or through) them and retention
        would then delete them. Moved to ``checkpoint-N.rejected-<why>`` (a symlink is renamed,
        never followed), they are kept for a person to rescue. Every rank has loaded its
        checkpoint by now (Trainer loads before ``on_train_begin``; each rank's RNG file, read
        later, is in the folder it resumed from, which stays).
        """
        backend = self.checkpointer.backend
        backend.barrier()  # every rank has chosen its folder before any is moved
        problem = None
        if backend.rank == 0:
            storage = LocalStorage(output_dir)
            problem = self._start_problem(output_dir, storage, begin_step)
            for step, folder in [] if problem else _folders(output_dir):
                if step <= begin_step:
                    continue
                reason = _why_not(step, folder)
                why = "newer" if reason is None else "unverified"
                reason = reason or f"newer than step {begin_step}, which this run starts from"
                line = reject(storage, folder.name, why, reason)
                warnings.warn(f"{line}; never deleted", stacklevel=4)
        problem = backend.broadcast(problem)  # and none trains on before they are moved
        if problem is not None:
            ckpt, self.checkpointer = self.checkpointer, None
            ckpt._refuse(problem)
            raise InputError(problem)

    def _start_problem(self, output_dir: Path, storage, begin_step: int) -> str | None:
        if begin_step == 0:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                newest = latest_checkpoint(output_dir, allow_fresh_start=True)
            if newest is None:
                return None
            return (
                f"{output_dir} already holds this run's checkpoints up to {Path(newest).name}, "
                "but trainer.train got no resume_from_checkpoint (a fresh start, which would "
                "write a second history over the first): resume with "
                "simulator.controller.hf.resume_training(trainer), or give Trainer a new "
                "output_dir"
            )
        folder = _resumed_folder(output_dir, begin_step)
        if folder is None:
            return None  # resumed from a checkpoint outside output_dir
        step = int(_CHECKPOINT.match(folder.name).group(1))
        reason = _why_not(step, folder)
        if reason is None:
            return None
        why = "misnamed" if step != begin_step else "unverified"
        line = reject(storage, folder.name, why, reason)
        return f"refusing to train on from {folder}: {line}; relaunch to resume"

    def _drop_stale_marker(self, args, step: int) -> None:
        # Trainer rewrites an existing checkpoint-<step> in place; until the new marker is
        # written, an old one must not vouch for files that are being replaced.
        if self.checkpointer.backend.rank == 0:
            marker = Path(args.output_dir) / f"checkpoint-{step}" / ckptio.MANIFEST
            if marker.is_file() and not marker.parent.is_symlink():
                marker.unlink()

    def _rotate(self, output_dir: Path, state) -> None:
        """Keep the newest ``save_total_limit`` complete folders (and the best); delete the rest
        that are older than the save just made. Torn folders do not count, and only this run's
        own are deleted (newer than its start): an older torn one is not known to be garbage."""
        finish_deletions(LocalStorage(output_dir))  # what a kill during a deletion left
        best = state.best_model_checkpoint
        best = Path(best).resolve() if best else None
        kept = 0
        for step, folder in _folders(output_dir):
            if folder.is_symlink() or not folder.is_dir():
                continue  # never delete through (or instead of) someone else's folder
            complete = ckptio.is_complete(folder)  # sizes only: CRCs were checked at save
            if complete and kept < self._save_total_limit:
                kept += 1
                continue
            if best is not None and folder.resolve() == best:
                continue
            if step >= state.global_step:
                continue  # newer torn folders are rewritten or deleted by later saves
            if not complete and step <= self._begin_step:
                continue  # torn before this run began: someone's data, not this run's garbage
            log.info("deleting %s (save_total_limit=%d)", folder, self._save_total_limit)
            # Renamed aside first, then removed: a kill leaves a .deleting- entry that the next
            # deletion finishes, never a half-deleted folder that still reads as a checkpoint.
            delete_checkpoint(LocalStorage(output_dir), folder.name)
