"""The live-training checkpointer: saves complete state when the policy says so, resumes exactly.

Call :meth:`AdaptiveCheckpointer.restore` once before training and
:meth:`AdaptiveCheckpointer.step` after every optimizer step. ``step`` is one integer compare
against a precomputed due step until a save is due; the interval is recomputed only at save
time, from the measured save stall and iteration time and the failure-rate posterior (see
:mod:`simulator.controller.schedule`), and on several ranks rank 0's answer is broadcast then,
so no collective runs on the other steps (with preemption handlers, also at a check point
about every 5 s of training; every broadcast carries rank 0's preemption flag).

With ``local_dir`` a second, host-local tier is saved at its own interval and restored from
when it holds the newest intact state (:mod:`simulator.controller.tiered`).

The life cycle: ``close()`` saves the tail (the last step seen, if newer than the last save)
and records ``finished`` in the run log; a relaunch of a finished run restores that step and
says so (:attr:`AdaptiveCheckpointer.finished`). A preemption signal (SIGTERM by default) only
sets a flag; the next ``step()`` saves, records ``preempted`` (not a failure) and exits with
:data:`PREEMPTED_EXIT_CODE` or, with ``on_preemption="stop"``, returns True. Each save is
logged on the ``simulator.controller`` logger (INFO) with its step, tier, bytes, stall and the
next due step.

A save captures the whole run (:mod:`simulator.controller.state`), writes it so that it counts
only once complete (:mod:`simulator.ckptio`, or temp dir + manifest + rename around a
distributed backend), then applies retention (:mod:`simulator.controller.storage`). Restore
takes the newest checkpoint that verifies, warns and falls back past corrupt ones (moving them
aside, never deleting them), refuses a checkpoint carrying a pickle, and refuses one written
with a different configuration (naming every differing key; ``ignore_config_keys`` lists those
that may differ). It never starts afresh silently: when the directory holds checkpoints but
none is intact it raises :class:`NoIntactCheckpoint` unless the user allowed it. One
checkpointer at a time writes a directory (:mod:`simulator.controller.lock`); a read-only
directory can still be restored from. The root may also be an object-store URL
(``s3://bucket/run``, ``memory://run``; :mod:`simulator.controller.objstore`): the same
commit, retention and restore run through its storage, with no lock there.
"""

from __future__ import annotations

import atexit
import json
import logging
import math
import os
import signal
import sys
import threading
import time
import warnings
import weakref
from collections.abc import Callable, Iterable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.controller._warn import user_stacklevel
from simulator.controller.backend import Backend, LocalBackend
from simulator.controller.commit import (
    check_config,
    choose_checkpoint,
    misnamed,
    normalise_config,
    reject,
    rejected_aside,
    write_and_commit,
)
from simulator.controller.estimate import FailureRatePosterior
from simulator.controller.integrity import (
    CheckpointLocked,
    CheckpointWriteError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoIntactCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.loader import ResumableLoader, refuse_unwrapped_loader
from simulator.controller.local_tier import LocalTier
from simulator.controller.lock import READ_ONLY, DirectoryLock, open_directory
from simulator.controller.objstore import (
    NoLock,
    is_url,
    local_path_of,
    open_storage,
    open_store,
)
from simulator.controller.precision import (
    WEIGHT_PRECISIONS,
    check_precision,
    expand_state,
    reduce_state,
)
from simulator.controller.runlog import RunLog, failures_by_class
from simulator.controller.schedule import DEFAULT_MTBF_S, Estimates, Schedule
from simulator.controller.shared_failure import (
    describe,
    failing_together,
    gather_work,
    raise_described,
    was_heard,
)
from simulator.controller.state import (
    capture_state,
    check_state,
    restore_state,
    stage,
    summary,
)
from simulator.controller.storage import (
    CheckpointStorage,
    apply_retention,
    checkpoint_name,
    complete_names,
    complete_steps,
    retention_plan,
)
from simulator.controller.tier_schedule import LOCAL, PERSISTENT
from simulator.controller.tiered import TierMixin, open_local_tier, tiered_schedule
from simulator.errors import InputError
from simulator.policies import Adaptive, Policy

__all__ = ["PREEMPTED_EXIT_CODE", "AdaptiveCheckpointer"]

logger = logging.getLogger("simulator.controller")

PREEMPTED_EXIT_CODE = 75
"""Exit status after a preemption save (``on_preemption="exit"``): ``EX_TEMPFAIL``.

Not 0, so that SLURM, torchrun and job dependencies (``afterok``) do not take the job as
finished: torchrun's elastic agent counts a non-zero worker as a failed attempt and restarts
the group while ``--max-restarts`` allows, and a SLURM job preempted with ``--requeue`` is put
back in the queue whatever the status. Not 1 (an ordinary crash) nor 128+N (a death by signal
N, which is what the job would have suffered without the save), so a wrapper script can tell
"saved, run me again" apart: ``[ $? -eq 75 ] && scontrol requeue $SLURM_JOB_ID``.
"""

_PREEMPTION_CHECK_S = 5.0
# On several ranks the signal is acted on at a check point, a step every rank computes the
# same (from values rank 0 broadcast): about this much training time apart.
_NEVER = sys.maxsize


class AdaptiveCheckpointer(TierMixin):
    """Saves a training run's complete state at the interval the policy deems best.

    ``directory`` holds the ``step-NNNNNNNN`` checkpoints and ``runlog.jsonl``. The objects
    (``model``, ``optimizer``, ``scheduler``, ``scaler``, ``dataloader``) need
    ``state_dict``/``load_state_dict``; a torch DataLoader goes through :meth:`wrap` instead.
    A value of ``extra`` is such an object or a plain value (tensors and containers of them),
    read from :attr:`extra` at each save and put back by :meth:`restore`. ``policy`` defaults to
    :class:`simulator.policies.Adaptive`; the failure-rate prior comes from ``mtbf_h``, else
    ``scenario`` (which also gives ``restart_s`` and the first guess of the save cost), else a
    weak 24 h default. ``keep_last`` checkpoints are kept (at least 2 with ``async_save``)
    plus the ``milestones`` (fractions of ``total_steps``, saved exactly at those steps).
    ``config`` is a JSON-able snapshot that a resume must match. ``directory`` may be an
    fsspec URL (``s3://bucket/run``, ``memory://run``; ``file://`` is a local path): checkpoints
    are then uploaded (manifest last) and downloaded to restore, with one process only and no
    lock (:mod:`simulator.controller.objstore` says what counts and what retention may touch
    there). ``storage`` must address ``directory`` (a :class:`LocalStorage`, or for a URL a
    :class:`~simulator.controller.objstore.FsspecStorage`, to pass its options:
    ``exclusive=True``, ``staging_dir``, s3fs's); ``clock`` is injectable for tests;
    ``probe_steps`` steps measure the iteration time before the first interval is chosen.

    Life cycle. ``close()`` (or leaving a ``with`` block normally) saves the last step passed
    to :meth:`step` if it is newer than the last save and records the run as finished at that
    step; a relaunch then restores that step and :attr:`finished` is True (it logs "run already
    finished at step N"), so ``while step < total_steps`` does nothing. Finished only means
    "nothing newer to do at that step count": relaunched with a larger ``total_steps``
    (continuing training; declare ``total_steps`` ignorable if ``config`` holds it), the run
    simply goes on and :attr:`finished` is False. ``ignore_config_keys`` names the ``config``
    keys that may differ between launches (output paths, total steps, logging); a dotted name
    (``"data.path"``) reaches into nested dicts, a plain name covers everything under it.

    Preemption. A signal in ``preemption_signals`` (SLURM's ``--signal=USR1@90`` sends USR1;
    clusters send SIGTERM before the kill) makes the next :meth:`step` save at once and record
    ``preempted`` in the run log (not a failure). With ``on_preemption="exit"`` it then closes
    and raises ``SystemExit(PREEMPTED_EXIT_CODE)``; with ``"stop"`` it returns True and
    :attr:`preempted` is True, and the caller stops and calls ``close(finished=False)``. The
    handlers are installed only from the main thread, call a previous Python handler too,
    and are put back at close. On several ranks the save happens at the first check point
    (about every 5 s of training, a step every rank knows) after rank 0 got the signal, so every
    rank saves at the same step without a collective on each step. A write in flight is
    finished first. ``preemption_grace_s`` (the scheduler's seconds between its signal and the
    kill) sends that save to the local tier when the measured persistent save would not fit in
    what is left of it (:mod:`simulator.controller.tiered`).

    Local tier. ``local_dir`` (``/dev/shm/<job>`` or local NVMe) keeps complete checkpoints of
    this run in ``<local_dir>/<run id>/`` too, made and checked by the same code, kept
    ``local_keep_last`` deep (1; 2 with ``async_save``); ``restore()`` takes the newest intact
    copy across both tiers and says which (:mod:`simulator.controller.local_tier`). ``policy``
    is then None (each tier's interval from the model's first-order tier plan at the measured
    costs and per-class failure rates: :mod:`simulator.controller.tier_schedule`) or a
    :class:`simulator.model.tiers.TierSchedule` of both tiers' intervals. Under torch.distributed
    (:class:`~simulator.controller.distributed.DistributedBackend`) each rank keeps its own
    snapshot and a copy of its ring predecessor's, and restore gathers each rank's from wherever
    it survives (:mod:`simulator.controller.local_ring`); ``{rank}`` in ``local_dir`` is
    replaced by the rank.

    ``allow_fresh_start``: when the directory holds checkpoints but none is intact, restore
    from step 0 with a warning instead of raising :class:`NoIntactCheckpoint`. Without it a
    restore reads straight into the model's and optimizer's tensors (as DCP's load does: no
    fresh memory, no second copy); with it into fresh memory, so that a fresh start finds them
    as they were.

    ``optimizer_precision``: ``"fp32"`` (the default) saves the optimizer exactly; ``"bf16"``
    and ``"int8"`` (blockwise, per-block float32 scales) store its large moment tensors in
    reduced precision, ~2x and ~3.9x smaller. ``weights_precision="bf16"`` stores the model's
    fp32 weights as bfloat16, for a run that trains under bf16 autocast with fp32 parameters
    (they lose their low 16 mantissa bits; weights already bf16 stay exact). Local backend
    only (:mod:`simulator.controller.precision`). The checkpoint records what was reduced;
    restoring one warns that it is not bit-exact. A synchronous save encodes in its stall, an
    asynchronous one in the background writer, from the staged copy.

    Rank 0 holds an exclusive lock on ``directory`` until :meth:`close` (or its death); a
    second process raises :class:`CheckpointLocked` naming the holder. (An object store has no
    lock: there retention deletes only what this process wrote unless ``exclusive=True``.)
    A read-only ``directory`` is opened for restoring only: nothing is written there, and a
    save raises :class:`CheckpointWriteError`.
    """

    def __init__(
        self,
        directory: str | Path,
        *,
        model,
        optimizer=None,
        scheduler=None,
        scaler=None,
        dataloader=None,
        extra: Mapping[str, Any] | None = None,
        policy: Policy | None = None,
        mtbf_h: float | None = None,
        scenario=None,
        restart_s: float = 600.0,
        keep_last: int = 2,
        milestones: tuple[float, ...] = (),
        total_steps: int | None = None,
        config: Mapping[str, Any] | None = None,
        async_save: bool = False,
        storage: CheckpointStorage | None = None,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_steps: int = 20,
        ignore_config_keys: Iterable[str] = (),
        preemption_signals: Iterable[int] | None = (signal.SIGTERM,),
        on_preemption: str = "exit",
        allow_fresh_start: bool = False,
        optimizer_precision: str = "fp32",
        weights_precision: str = "fp32",
        local_dir: str | os.PathLike | None = None,
        local_keep_last: int | None = None,
        preemption_grace_s: float | None = None,
    ):
        refuse_unwrapped_loader(dataloader)
        self.optimizer_precision = check_precision(optimizer_precision)
        self.weights_precision = check_precision(
            weights_precision, name="weights_precision", allowed=WEIGHT_PRECISIONS
        )
        local = local_path_of(str(directory)) if is_url(str(directory)) else Path(directory)
        self._remote = local is None  # an object store (objstore module)
        self.root: Path | str = str(directory).rstrip("/") if local is None else local
        self.storage: CheckpointStorage = (
            storage if storage is not None else open_storage(directory)
        )
        self._objects = dict(
            model=model,
            optimizer=optimizer,
            scheduler=scheduler,
            scaler=scaler,
            dataloader=dataloader,
            extra=dict(extra or {}),
        )
        self.config = normalise_config(config)
        self.backend: Backend = backend if backend is not None else LocalBackend()
        if self._remote and self.backend.writes_manifest():
            raise InputError(
                f"a torch.distributed backend writes to a shared file system path, not to "
                f"{self.root}: give a directory (object storage is for one process)"
            )
        for name in ("optimizer_precision", "weights_precision"):
            if getattr(self, name) != "fp32" and self.backend.writes_manifest():
                raise InputError(
                    f"{name}={getattr(self, name)!r} is for the local backend; "
                    "a distributed backend saves its shards exactly"
                )
        self.clock = clock
        self.async_save = bool(async_save)
        fixed_tiers = self._tier_options(local_dir, local_keep_last, policy, preemption_grace_s)
        if isinstance(keep_last, bool) or not isinstance(keep_last, int) or keep_last < 1:
            raise InputError(
                f"keep_last must be a whole number of checkpoints >= 1, got {keep_last!r}"
            )
        # While a write is in flight the newest complete checkpoint and its predecessor are
        # both needed: the write may still fail.
        self.keep_last = max(keep_last, 2) if self.async_save else keep_last
        if total_steps is not None and (isinstance(total_steps, bool) or total_steps < 1):
            raise InputError(f"total_steps must be a positive number of steps, got {total_steps!r}")
        for f in milestones:
            if not (0 < f < 1):
                raise InputError(f"milestones are fractions of total_steps in (0, 1), got {f!r}")
        if milestones and total_steps is None:
            raise InputError("milestones are fractions of the run: give total_steps too")
        self.milestone_steps = (
            tuple(sorted({max(1, round(f * total_steps)) for f in milestones}))
            if milestones
            else ()
        )
        if restart_s is None or not (math.isfinite(restart_s) and restart_s >= 0):
            raise InputError(
                f"restart_s must be a non-negative number of seconds, got {restart_s!r}"
            )
        if probe_steps < 1:
            raise InputError(f"probe_steps must be at least 1 step, got {probe_steps!r}")

        # The failure-rate prior: mtbf_h over the scenario over a weak default.
        component, n_components, checkpoint_prior_s = None, 1, None
        if mtbf_h is not None:
            if not (math.isfinite(mtbf_h) and mtbf_h > 0):
                raise InputError(f"mtbf_h must be a positive number of hours, got {mtbf_h!r}")
            prior, self.prior_source = FailureRatePosterior.from_prior(mtbf_h * 3600.0), "mtbf_h"
        elif scenario is not None and scenario.has_mtbf:
            prior, self.prior_source = (
                FailureRatePosterior.from_prior(scenario.system_mtbf_s),
                "scenario",
            )
        else:
            prior = FailureRatePosterior.from_prior(DEFAULT_MTBF_S, weight=1.0)
            self.prior_source = "default 24 h"
        if scenario is not None:
            restart_s = scenario.restart_s
            checkpoint_prior_s = scenario.checkpoint_s
            if scenario.failure != "exponential" and scenario.gpus is not None:
                component, n_components = scenario.gpu_lifetime(), scenario.gpus
        base = dict(
            policy=policy if policy is not None and not fixed_tiers else Adaptive(),
            prior=prior,
            restart_s=restart_s,
            checkpoint_prior_s=checkpoint_prior_s,
            asynchronous=self.async_save,
            milestones=self.milestone_steps,
            component=component,
            n_components=n_components,
            probe_steps=probe_steps,
        )
        if self._local_dir is None:
            self.schedule = Schedule(**base)
        else:
            self.schedule = tiered_schedule(base, mtbf_h, scenario, fixed_tiers)

        self._life_cycle_options(total_steps, ignore_config_keys, preemption_signals, on_preemption)
        is_rank0 = self.backend.rank == 0
        self.allow_fresh_start = bool(allow_fresh_start)
        # Only rank 0 locks: every rank shares the directory, and only rank 0 deletes in it.
        if not self._remote:
            self._lock = DirectoryLock(self.root)
            opened = open_directory(self.root, self._lock) if is_rank0 else None
        else:
            # An object store has no lock that ends with its holder (objstore module): held
            # only on the user's word (exclusive=True), else the unlocked directory's rules.
            self._lock = NoLock(held=getattr(self.storage, "exclusive", False))
            opened = open_store(self.storage) if is_rank0 else None
        if self.backend.world_size > 1:
            # Every rank refuses together, and knows whether a save can be written at all.
            opened = self.backend.broadcast(opened)
        self.read_only = opened == READ_ONLY
        """The directory cannot be written: restore works, a save raises."""
        if opened is not None and not self.read_only:
            raise CheckpointLocked(opened)
        self.runlog = RunLog(
            self.root,
            enabled=is_rank0 and not self.read_only,
            store=self.storage if self._remote else None,
        )
        self.local: LocalTier | None = None
        if self._local_dir is not None:
            self.local = open_local_tier(self)
        self._session_start = clock()
        # Rank 0's: a warning here that a filter makes an error must reach every rank, which
        # would otherwise wait for rank 0 in the restore.
        with failing_together(self.backend, f"reading the run log of {self.root}"):
            if is_rank0:
                evidence = self.runlog.evidence()
                if self.local is None:
                    self.schedule.set_history(evidence.failures, evidence.exposure_s)
                else:
                    by_class = failures_by_class(
                        self.runlog.events(),
                        exclude_session=self.runlog.session,
                        local_found=self.local.found,
                    )
                    self.schedule.set_history(evidence.failures, evidence.exposure_s, by_class)
            # records_train: this session writes "train" at its first step (runlog module).
            self.runlog.append("start", session_s=0.0, records_train=True, **self._start_fields())
        self._began = False

        self.resumed_from: int | None = None
        self.last_saved_step: int | None = None
        self.saves = 0
        self._written: set[int] = set()
        # Rejected by the restore, but left in place (no lock, or the move failed): rank 0
        # moves each aside before a save replaces it; every rank names none of them as intact.
        self._rejected_in_place: set[str] = set()
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future | None = None
        self._inflight_step: int | None = None
        self._inflight_tier = PERSISTENT
        # The last async save's staging buffers and the write that reads them: copied into
        # again by the next async save only once that write is over (never while it may read).
        self._staging: tuple[dict, Future] | None = None
        self._write_failed = False
        self._mark_step = 0
        self._mark_t = clock()
        self._planned_due = self.schedule.next_due(0, age_s=0.0)
        self._next_due = -1  # the first step() takes the slow path: it records "train"
        self._exit_hook = _exit_hook(weakref.ref(self))
        _watch_sys_exit()
        atexit.register(self._exit_hook)
        self._install_preemption_handlers()

    # -- the hot path -----------------------------------------------------------------------
    @property
    def next_due_step(self) -> int:
        return self._planned_due

    def step(self, step: int) -> bool:
        """Call after each optimizer step with the number of steps done; True when it saved.

        After a preemption signal it saves at once; then with ``on_preemption="exit"`` it
        closes and raises ``SystemExit(PREEMPTED_EXIT_CODE)``, with ``"stop"`` it returns True
        and :attr:`preempted` is True.
        """
        self._last_step = step
        if step < self._next_due:
            return False
        return self._due(step)

    def _note_began(self, step: int) -> None:
        """The session's first training step: from here a crash is evidence about the hardware
        (before it, a crash is the script's, as a refused launch is: runlog module)."""
        if not self._began:
            self._began = True
            self.runlog.append(
                "train", session_s=self.clock() - self._session_start, step=int(step)
            )

    def _due(self, step: int) -> bool:
        self._note_began(step)
        # One process raises a failed background write at the next step. Several ranks learn
        # of it where they all are at once (the next check point, ~5 s apart with a preemption
        # handler, else the next save; close; _finish_together): a rank raising alone here
        # would leave the others waiting in the next collective.
        if self._inflight is not None and self._inflight.done() and self.backend.world_size == 1:
            self._finish_inflight()
        if self._preempting(step):
            return self._preempt(step)
        if step < self._planned_due:
            return False
        if self.schedule.needs_probe and not self.schedule.needs_first_save:
            self._measure_iterations(step)
            due = self.schedule.next_due(step, age_s=self.clock() - self._session_start)
            self._set_due(self._broadcast_point(step, due))
            if self._agreed is not None:
                return self._preempt(step)
            return False
        self._save_due(step)
        if self._agreed is not None:
            return self._preempt(step)
        return True

    def _preempting(self, step: int) -> bool:
        """Whether every rank acts on a preemption at ``step`` (the slow path's first question).

        One process acts on its own signal. Several ranks act only on rank 0's, heard at a check
        point (a due step, or every ~5 s of training) that every rank reaches at the same step.
        When not preempting, the fast path's due step is set again. ``step()`` and the
        frameworks' :class:`~simulator.controller.external.ExternalSaveSchedule` both ask here.
        """
        if self.backend.world_size == 1:
            self._agreed = self._signalled
        elif self._agreed is None and step >= min(self._planned_due, self._check_due):
            self._broadcast_point(step, None)
        if self._agreed is not None:
            return True
        self._set_due(self._planned_due)
        return False

    def _set_due(self, due: int) -> None:
        self._planned_due = int(due)
        self._next_due = min(self._planned_due, self._check_due)
        # After the store: a signal or a failed background write landing at any moment still
        # sends the next step() down the slow path (as does the session's first step).
        if self._write_failed or self._signalled is not None or not self._began:
            self._next_due = -1

    def _broadcast_point(self, step: int, payload: Any) -> Any:
        """Rank 0's ``payload`` on every rank, with its preemption state and check cadence.

        Every collective of the checkpointer goes through here, so each one doubles as a
        preemption check point, and the next check point (``step + k``) is a step every rank
        computes from the same broadcast value.
        """
        rank0 = self.backend.rank == 0
        # Rank 0's failed background write (its commit also hears every rank's failed write):
        # raised by every rank here, at once, within a check point of the failure.
        failed = rank0 and self.backend.world_size > 1 and self._write_failed
        mine = (payload, self._signalled if rank0 else None, self._check_steps() if rank0 else 0)
        payload, signalled, k, failed = self.backend.broadcast((*mine, failed))
        self._check_due = step + int(k) if k else _NEVER
        if signalled is not None:
            self._agreed = signalled
            self._signalled = signalled
        if failed:
            self._finish_together()
        return payload

    def _check_steps(self) -> int:
        """Rank 0: steps between preemption check points (0: none, one process needs none)."""
        if self.backend.world_size == 1 or not self._handlers:
            return 0
        iteration_s = self.schedule.iteration.value
        if not iteration_s:
            return self.schedule.probe_steps
        return max(1, int(_PREEMPTION_CHECK_S / iteration_s))

    # -- saving -----------------------------------------------------------------------------
    def _measure_iterations(self, step: int) -> None:
        now = self.clock()
        if step > self._mark_step and now > self._mark_t:
            self.schedule.iteration.update((now - self._mark_t) / (step - self._mark_step))

    def save(self, step: int, *, tier: str = PERSISTENT) -> None:
        """Save the complete state after ``step`` steps now (waits for a write in flight).

        ``tier="local"`` saves to the local tier (``local_dir``) instead; a failure there is
        warned about, never raised: the persistent tier carries on.
        """
        if self._closed:
            raise RuntimeError("the checkpointer is closed")
        step = int(step)
        self._check_tier(tier)
        self._finish_together()
        self._settle_generation()  # a session that never restored starts a branch of its own
        t0 = self.clock()
        self._measure_iterations(step)
        error: BaseException | None = None
        try:
            # A ring's local save exchanges copies between ranks: on the training thread.
            ring = tier == LOCAL and self._ring is not None
            background = self.async_save and not self._sync_only and not ring
            # A rank whose capture fails, or rank 0 unable to move aside a rejected checkpoint
            # this save would replace, must not leave the others in the collective write.
            with failing_together(self.backend, f"preparing the save of step {step}"):
                if tier == PERSISTENT and not self.read_only and self.backend.rank == 0:
                    self._keep_rejected(step)
                state = capture_state(
                    step=step, config=self.config, backend=self.backend, **self._objects
                )
                state["controller"] = vars(self.schedule.estimates())
                self._add_tier_state(state)
                buffers = None
                if background:
                    state, buffers = stage(state, reuse=self._free_staging())
            if background:
                self._inflight_step, self._inflight_tier = step, tier
                self._inflight = self._pool().submit(self._write_in_background, step, state, tier)
                self._staging = (buffers, self._inflight)
            else:
                self._write_and_commit(step, state, tier)
        except BaseException as exc:  # reported below, after the schedule has moved on
            if not isinstance(exc, Exception) and not was_heard(exc):
                raise  # an interrupt no other rank has heard of: they are not at the broadcast
            error = exc  # an interrupt every rank has heard of: raised after the broadcast
        t1 = self.clock()
        if error is None:
            self._stall_of(tier).update(t1 - t0)
            self._count_save(tier)
        session_s = t1 - self._session_start
        self.schedule.update_exposure(session_s)
        due = self._due_after(tier, step, session_s)
        interval_s = self._interval_of(tier)
        fatal = None
        try:  # rank 0's log (its warning a filter may make fatal): heard in the broadcast below
            self.runlog.append(
                "save",
                session_s=session_s,
                step=step,
                ok=error is None,
                stall_s=round(t1 - t0, 6),
                interval_s=interval_s if math.isfinite(interval_s) else None,
                next_due_step=int(due),
                **self._tier_field(tier),
            )
        except BaseException as exc:
            fatal = exc
        shared = None if fatal is None else describe(fatal, f"logging the save of step {step}", 0)
        due, message, shared = self._broadcast_point(
            step, (due, None if error is None else repr(error), shared)
        )
        if error is not None and not isinstance(error, Exception):
            raise error  # this rank's own Ctrl-C or SystemExit first, as gather_work's rule
        if fatal is not None:
            raise fatal
        if shared is not None:
            raise_described(shared)
        self._set_due(due)
        self._mark_step, self._mark_t = step, self.clock()
        if error is not None or message is not None:
            self._report(step, failed=True, tier=tier)
            if tier == LOCAL:
                self._local_failed(step, error or message)
                return
            raise CheckpointWriteError(
                f"saving step {step} failed ({error or message}); the previous checkpoint "
                f"({self._last_good()}) is intact"
            ) from error
        self._note_saved(tier, step, t1 - t0)
        if tier == PERSISTENT:  # rank 0 moved a rejected one of that name aside (_keep_rejected)
            self._rejected_in_place.discard(checkpoint_name(step))
        if self.backend.rank == 0:
            self._report(step, tier=tier, stall_s=t1 - t0, next_due_step=self._planned_due)

    def _report(self, step: int, *, failed: bool = False, tier: str = PERSISTENT, **fields) -> None:
        """Log a save once both halves are known: bytes (at commit) and stall, next due (now).

        An asynchronous write commits in the background, before or after save() returns, so
        whichever half comes second writes the line.
        """
        with self._report_lock:
            if failed:
                self._pending_reports.pop((tier, step), None)
                return
            pending = self._pending_reports.setdefault((tier, step), {})
            pending.update(fields)
            if not {"bytes", "stall_s", "next_due_step"} <= pending.keys():
                return
            del self._pending_reports[(tier, step)]
        size = pending["bytes"]
        logger.info(
            "saved step %d (tier %s): %s bytes, stall %.3f s, next due step %d",
            step,
            tier,
            "?" if size is None else f"{size:,}",
            pending["stall_s"],
            pending["next_due_step"],
            extra={"step": step, "tier": tier, **pending},
        )

    def _free_staging(self) -> dict | None:
        """The previous async save's staging buffers if its write is over, else None (fresh
        buffers: a write still running, e.g. after an interrupted wait, must keep its own)."""
        if self._staging is None:
            return None
        buffers, writer = self._staging
        return buffers if writer.done() else None

    def _write_in_background(self, step: int, state: dict, tier: str = PERSISTENT) -> None:
        try:
            self._write_and_commit(step, state, tier)
        except BaseException:
            self._report(step, failed=True, tier=tier)
            if tier == LOCAL:
                raise  # warned about on the training thread, never raised there
            # Before the future completes: the next step() takes the slow path, which raises
            # the error on the training thread (one process; several ranks raise it together
            # at the next check point: _broadcast_point); the fast path stays one compare.
            # The flag covers a failure that lands before save() has stored its next due step.
            self._write_failed = True
            self._next_due = -1
            raise

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        return self._executor

    def _last_good(self) -> str:
        """The newest complete checkpoint by the name it has (a rescue named by hand too), for
        a failure's message: never one the restore rejected but had to leave in place."""
        names = complete_names(self.storage)
        good = [
            (step, n) for step, ns in names.items() for n in ns if n not in self._rejected_in_place
        ]
        return max(good)[1] if good else "none yet"

    def _finish_together(self) -> None:
        """:meth:`_finish_inflight` where every rank calls it at the same step: a failed
        background write on any rank (rank 0's commit, which also hears of every other rank's
        failed write) is raised on every rank at once (one all-gather where there are several
        ranks), instead of on that rank alone with the others left in the next collective."""
        with failing_together(self.backend, "finishing the last background write"):
            self._finish_inflight()

    def _finish_inflight(self) -> None:
        """Wait for the background write; raise its error here, on the training thread."""
        future, self._inflight = self._inflight, None
        if future is None:
            return
        try:
            future.result()
        except Exception as exc:
            if self._inflight_tier == LOCAL:
                self._local_failed(self._inflight_step, exc)
                return
            raise CheckpointWriteError(
                f"background write of step {self._inflight_step} failed ({exc}); the previous "
                f"checkpoint ({self._last_good()}) is intact"
            ) from exc
        finally:
            self._write_failed = False

    def _write_and_commit(self, step: int, state: dict, tier: str = PERSISTENT) -> None:
        # Here, not before staging: an async save encodes its staged CPU copy in the
        # background, so its stall is the exact save's (the copy, not the encode).
        state = reduce_state(state, self.optimizer_precision, weights=self.weights_precision)
        if tier == LOCAL:
            self._write_local(step, state)
            return
        if self.read_only:
            raise CheckpointWriteError(
                f"checkpoint directory {self.root} is read-only (opened for restoring only); "
                "give a writable directory to save"
            )
        t0 = self.clock()
        write_and_commit(
            self.root, self.storage, self.backend, step, state, barriers=not self.async_save
        )
        if self.backend.rank == 0:
            self.last_saved_step = step
            self._written.add(step)  # without the lock, retention deletes only these
            self.schedule.write.update(self.clock() - t0)
            self._report(step, bytes=self._checkpoint_bytes(step))
            try:
                apply_retention(
                    self.storage,
                    keep_last=self.keep_last,
                    milestones=self.milestone_steps,
                    resumed_from=self.resumed_from,
                    among=None if self._lock.held else self._written,
                )
            except OSError as exc:
                warnings.warn(f"checkpoint retention failed: {exc}", stacklevel=user_stacklevel())

    # -- restoring --------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest intact checkpoint; returns the steps it holds (0: none found).

        Raises :class:`NoIntactCheckpoint` when there are checkpoints but none is intact
        (unless ``allow_fresh_start``), :class:`IncompatibleCheckpoint` for another
        configuration or model, :class:`UnsafeCheckpoint` for a pickle. The run log records
        such a launch as ``refused``: it never trained, so it is no failure of the hardware.
        A refusal also closes the checkpointer (the lock is released; nothing is saved).
        After one, the model's and optimizer's tensors may hold part of a checkpoint (the
        restore reads into them, unless ``allow_fresh_start``): build them anew to use them.
        """
        try:
            step = self._load_newest()
        except (IncompatibleCheckpoint, NoIntactCheckpoint, UnsafeCheckpoint) as exc:
            self._refuse(str(exc))
            raise
        finally:
            self.storage.drop_local_copies()  # an object store's downloads

        # Rank 0's warnings and run log, every rank's tiers; a failure on any rank raised on
        # all; then rank 0's due step and verdict for everyone.
        due, marked = None, False
        with failing_together(self.backend, f"after restoring from {self.root}"):
            self._restored(step)
            self._warn_of_what_retention_keeps()
            now = self.clock()
            self._mark_step, self._mark_t = step, now
            if self.backend.rank == 0 and step > 0:  # whether the run had finished there
                marked = any(
                    e["event"] == "finished" and e.get("step") == step for e in self.runlog.events()
                )
            self.runlog.append(
                "restore", session_s=now - self._session_start, step=step, **self._restore_fields()
            )
            due = self._due_after_restore(step, now - self._session_start)
        # Rank 0's own rejections reach every rank: a failure's message on any rank must not
        # call one of them the intact previous checkpoint (_last_good).
        due, marked, in_place = self._broadcast_point(
            step, (due, marked, sorted(self._rejected_in_place))
        )
        self._rejected_in_place = set(in_place)
        self._set_due(int(due))
        self._after_restore(step, marked)
        return step

    def _load_newest(self) -> int:
        self._rejected: dict[str, str] = {}  # rank 0: name -> why, in this restore
        self._aside_before: list[str] = []
        # Rank 0's own work between broadcasts (listing what earlier launches moved aside,
        # moving a rejected checkpoint aside) fails into the next choice's broadcast, so that
        # every rank hears of it (see _choose_everywhere), never on rank 0 alone.
        self._deferred: tuple[BaseException, str] | None = None  # and what rank 0 was doing
        if self.backend.rank == 0:
            try:
                self._aside_before = rejected_aside(self.storage)
            except BaseException as exc:
                self._deferred = exc, f"listing what earlier launches moved aside in {self.root}"
        self._restore_tier = PERSISTENT
        while (name := self._choose_everywhere()) is not None:
            store = self._tier_storage(self._restore_tier)
            template = capture_state(
                step=0, config=self.config, backend=self.backend, **self._objects
            )
            if self._restore_tier == LOCAL and self._ring is not None:
                state, lost = self._ring_state(name, template), None  # checked by every rank
                if state is None:
                    continue
            elif self.backend.world_size > 1:
                # Verified by rank 0, so a rank that cannot read its part ends the launch (no
                # silent divergence), on every rank: each step a rank takes alone is gathered.
                state, lost = self._read_everywhere(store, name, template)
            else:
                try:
                    local = store.local_copy(name)
                    # Straight into the live tensors, unless a restore that finds nothing
                    # intact may go on from step 0 with them (a corrupt read leaves them
                    # holding part of its bytes; any other failure ends the launch).
                    state = self.backend.read(local, template, in_place=not self.allow_fresh_start)
                    state = check_state(state, where=name)
                    state, lost = expand_state(state, where=name)
                except CorruptCheckpoint as exc:
                    self._reject(name, "corrupt", str(exc))
                    continue
            # A distributed checkpoint's step is known only now; every rank reads the same.
            mismatch = misnamed(name, state.get("step"))
            if mismatch is not None:
                self._reject(name, "misnamed", mismatch)
                continue
            foreign = self._foreign(state)
            if foreign is not None:
                self._reject(name, *foreign)
                continue
            world = self.backend.world_size

            def restore_here(state=state, store=store, lost=lost, name=name, world=world) -> int:
                check_config(
                    store.describe(name),
                    state.get("config"),
                    self.config,
                    ignore=self.ignore_config_keys,
                )
                try:
                    step = restore_state(state, backend=self.backend, **self._objects)
                except (KeyError, RuntimeError, ValueError) as exc:
                    raise IncompatibleCheckpoint(
                        f"checkpoint {store.describe(name)} does not fit this run: {summary(exc)}"
                    ) from None
                if lost is not None:
                    warnings.warn(f"{lost} ({name})", stacklevel=4 if world == 1 else 5)
                self.schedule.seed(Estimates(**state.get("controller", {})))
                self._seed_tier(state)
                return step

            if world > 1:  # a refusal or failure on one rank (its own objects) reaches all
                rank = self.backend.rank
                doing = f"restoring {name} into this run"
                step = gather_work(self.backend.all_gather, restore_here, doing, rank)[rank]
            else:
                step = restore_here()
            self.resumed_from = self.last_saved_step = step
            return step
        return 0

    def _read_everywhere(self, store, name: str, template: dict) -> tuple[dict, str | None]:
        """Collective: ``name`` read by every rank (DCP), checked and expanded, or every rank
        raising when any rank fails (its download, or its own part after DCP's load: each rank
        checks the per-rank values it alone holds)."""
        gather, rank = self.backend.all_gather, self.backend.rank
        local = gather_work(gather, lambda: store.local_copy(name), f"fetching {name}", rank)
        read: list = []

        def read_here() -> None:  # DCP's load is collective and fails on every rank alike
            state = self.backend.read(local[rank], template, in_place=not self.allow_fresh_start)
            read.append(expand_state(check_state(state, where=name), where=name))

        gather_work(gather, read_here, f"reading {name}", rank)
        return read[0]

    def _warn_of_what_retention_keeps(self) -> None:
        """Without the lock (an object store without ``exclusive=True``) retention deletes only
        what this process writes, so each relaunch leaves its last ``keep_last`` checkpoints
        for good: say so, once, when a relaunch finds more than a lock holder would keep."""
        if self._lock.held or self.read_only or self.backend.rank != 0:
            return
        try:
            plan = retention_plan(
                complete_steps(self.storage),
                keep_last=self.keep_last,
                milestones=self.milestone_steps,
                resumed_from=self.resumed_from,
            )
        except OSError:
            return  # the restore itself has listed the store; nothing to add here
        beyond = [step for step in plan if step not in self._written]  # ours go by retention
        if beyond:
            warnings.warn(
                f"{self.root} holds {len(beyond)} complete checkpoint(s) beyond "
                f"keep_last={self.keep_last} (oldest {checkpoint_name(beyond[0])}) that earlier "
                "processes wrote; without a lock retention deletes only this process's saves, "
                "so they stay and each relaunch adds more: pass exclusive=True if no other "
                "process writes here, or delete them",
                stacklevel=3,
            )

    def _reject(self, name: str, why: str, reason: str) -> None:
        """Rank 0 moves ``name`` aside (or notes it); a failure doing so is raised by the next
        choice, on every rank (:meth:`_choose_everywhere`)."""
        if self.backend.rank != 0:
            return
        try:
            if self._restore_tier == LOCAL:
                self._reject_local(name, why, reason)
                return
            line = reject(self.storage, name, why, reason, move=self._lock.held)
            self._note_rejected(name, line)
        except BaseException as exc:
            self._deferred = exc, f"moving the rejected {name} aside"

    def _note_rejected(self, name: str, line: str) -> None:
        warnings.warn(f"{line}; falling back to an older checkpoint", stacklevel=5)
        self._rejected[name] = line
        if self.storage.exists(name) or self.storage.is_symlink(name):
            self._rejected_in_place.add(name)

    def _keep_rejected(self, step: int) -> None:
        """Before saving over a ``step-N`` the restore rejected but left in place (no lock, or
        the move failed): move it aside now, since a re-save drops the checkpoint it replaces."""
        name = checkpoint_name(step)
        if name not in self._rejected_in_place:
            return
        reject(self.storage, name, "unverified", "rejected at restore")
        if self.storage.exists(name) or self.storage.is_symlink(name):
            raise CheckpointWriteError(
                f"{name} failed verification at restore and cannot be moved aside; it is kept: "
                "move it out of the directory to save this step"
            )
        self._rejected_in_place.discard(name)

    def _choose_everywhere(self) -> str | None:
        """Rank 0 chooses; every rank gets the choice and its tier, or raises the same
        refusal. (With a ring of local tiers the ranks first agree on what it holds.) Any
        other failure of rank 0's (a disk error while listing or reading, say) reaches every
        rank too (:meth:`_share`: rank 0 raises its own, the others one of its kind that
        quotes it), instead of waiting in the broadcast for a rank that has left it. A
        failure of rank 0's own work since the last choice (:attr:`_deferred`) is raised here
        the same way."""
        choice, failed = None, None
        doing = f"while choosing a checkpoint in {self.root}"
        self._agree_ring()
        if self.backend.rank == 0:
            if self._deferred is not None:
                (failed, doing), self._deferred = self._deferred, None
            else:
                try:
                    choice = self._choose()
                except BaseException as exc:  # an interrupt too: the others must not wait
                    failed = exc
        choice, self._restore_tier = self._share((choice, self._restore_tier), failed, doing)
        return choice

    def _share(self, payload: Any, failed: BaseException | None, doing: str) -> Any:
        """Rank 0's ``payload`` on every rank, or its failure (``failed``) raised on every
        rank: rank 0 raises its own, the others one of its kind that quotes it, a refusal word
        for word (:mod:`~simulator.controller.shared_failure`)."""
        error = None if failed is None else describe(failed, doing, 0)
        payload, error = self.backend.broadcast((payload, error))
        if failed is not None:
            raise failed
        if error is not None:
            raise_described(error)
        return payload

    def _on_rank0(self, work: Callable[[], Any], doing: str) -> Any:
        """``work()`` on rank 0 alone, its result on every rank, or its failure raised on
        every rank (:meth:`_share`)."""
        value, failed = None, None
        if self.backend.rank == 0:
            try:
                value = work()
            except BaseException as exc:  # an interrupt too: the others must not wait
                failed = exc
        return self._share(value, failed, doing)

    def _choose(self) -> str | None:
        if self.local is not None and self.local.usable:
            return self._choose_tiered()
        choice = self._choose_persistent()
        if choice is not None:
            return choice
        self._nothing_to_restore()
        return None

    def _choose_persistent(self) -> str | None:
        """The newest intact persistent checkpoint (rejections noted), or None."""
        choice, rejected = choose_checkpoint(
            self.root,
            self.storage,
            self.config,
            tidy=self._lock.held,
            skip=frozenset(self._rejected),
            ignore=self.ignore_config_keys,
            checksums_at_load=self._checksums_at_load,
        )
        for name, line in rejected.items():
            self._note_rejected(name, line)
        return choice

    @property
    def _checksums_at_load(self) -> bool:
        """Whether the backend's read checks every CRC-32 as it loads (one pass over the
        checkpoint), so the choice need not read it all first: the backend says so."""
        return bool(getattr(self.backend, "verifies_on_read", False))

    def _nothing_to_restore(self) -> None:
        """No intact checkpoint: refuse when some were rejected (unless a fresh start is
        allowed, which is warned about)."""
        lines = self._rejected_lines() + [
            f"{n}: moved aside by an earlier launch" for n in self._aside_before
        ]
        if lines and not self.allow_fresh_start:
            raise NoIntactCheckpoint(
                f"no intact checkpoint to resume from in {self.root}: {'; '.join(lines)}. "
                "Nothing was deleted: rescue one by hand (rename it back), or pass "
                "allow_fresh_start=True to start from step 0"
            )
        if lines:
            warnings.warn(
                f"no intact checkpoint in {self.root}; starting from step 0 as "
                "allow_fresh_start permits",
                stacklevel=5,
            )

    # -- data ------------------------------------------------------------------------------
    def wrap(self, loader, *, fast_forward: str = "indices") -> ResumableLoader:
        """``loader`` (a torch DataLoader or StatefulDataLoader) made to resume exactly.

        Iterate the result instead of ``loader``, one epoch per ``iter()``; its epoch and
        position are saved with each checkpoint (see :mod:`simulator.controller.loader`).
        Call before :meth:`restore`.
        """
        if self.resumed_from is not None:
            raise InputError("call ckpt.wrap(loader) before ckpt.restore()")
        current = self._objects["dataloader"]
        if current is not None and not isinstance(current, ResumableLoader):
            raise InputError(
                "this checkpointer already saves dataloader=...; one data position per run"
            )
        wrapped = ResumableLoader(loader, fast_forward=fast_forward)
        self._objects["dataloader"] = wrapped
        return wrapped

    @property
    def extra(self) -> dict[str, Any]:
        """The ``extra`` entries, live: assign a new value (a prefetched batch) before a save;
        after :meth:`restore` the plain values hold what was saved."""
        return self._objects["extra"]

    # -- the rest ---------------------------------------------------------------------------
    @property
    def stats(self) -> dict[str, Any]:
        s = self.schedule
        return {
            "interval_s": s.interval_s,
            "interval_steps": s.interval_steps,
            "next_due_step": self._planned_due,
            "save_stall_s": s.stall.value,
            "write_s": s.write.value,
            "iteration_s": s.iteration.value,
            "checkpoint_s": s.checkpoint_s,
            "checkpoint_s_source": s.checkpoint_s_source,
            "mtbf_s": s.posterior.mtbf_s,
            "mtbf_prior_s": s.prior.mtbf_s,
            "mtbf_prior_source": self.prior_source,
            "failures_seen": s.past_failures,
            "exposure_s": s.posterior.exposure_s - s.prior.exposure_s,
            "saves": self.saves,
            "last_saved_step": self.last_saved_step,
            "resumed_from": self.resumed_from,
            "finished": self.finished,
            "preempted": self.preempted,
            "policy": s.policy.name,
            **self._tier_stats(),
        }

    def close(self, *, finished: bool = True) -> None:
        """End the session: wait for a write in flight (raising its error), record a clean stop.

        With ``finished`` (the default) the last step passed to :meth:`step` is saved first if
        it is newer than the last save, and the run log records the run as finished at that
        step, so a relaunch restores it and returns at once (:attr:`finished`). Pass
        ``finished=False`` when stopping early to be continued (after a preemption with
        ``on_preemption="stop"``, a time limit): no final save is forced.
        """
        self._close(finished=finished, clean=True)

    def _close(self, *, finished: bool, clean: bool) -> None:
        if self._closed:
            return
        try:
            if clean and finished:  # every rank closes here, before a final save's collective
                self._finish_together()
            elif clean:  # no collective: a rank may close alone (at exit, on Ctrl-C)
                self._finish_inflight()
            else:
                try:  # the training loop crashed: keep its error, report this one
                    self._finish_inflight()
                except CheckpointWriteError as exc:
                    logger.warning("%s", exc)
            if finished:
                last = self._last_step if self._last_step is not None else self._final_step()
                if last is not None and (self._saved_step is None or last > self._saved_step):
                    self.save(last)
                    self._finish_together()
                if self._saved_step is not None:
                    self.runlog.append(
                        "finished",
                        session_s=self.clock() - self._session_start,
                        step=self._saved_step,
                    )
                    logger.info("run finished at step %d", self._saved_step)
        finally:
            if clean:
                self._end_session("stop")
            elif self._last_step is not None:
                # The loop raised after training began: evidence of a failure even when the
                # session never restored or saved (a SIGKILL leaves only its start and saves).
                self._end_session("crashed", step=self._last_step)
            else:
                self._end_session()

    def _refuse(self, reason: str) -> None:
        """This launch is refused before training (a restore's verdict, or a framework
        adapter's): the run log's ``refused``, which is no evidence about the hardware, and the
        session ends with no ``stop`` and nothing saved."""
        self._end_session("refused", reason=reason)

    def _end_session(self, event: str | None = None, **fields) -> None:
        """Closed for good: no exit hook, the signal handlers put back, writes finished, the
        session's last run-log ``event`` recorded, and then the directory lock given back."""
        self._closed = True
        atexit.unregister(self._exit_hook)
        self._restore_signal_handlers()
        if self._executor is not None:
            self._executor.shutdown(wait=True)
        self._staging = None  # the staging buffers' memory goes back
        if event is not None:
            self.runlog.append(event, session_s=self.clock() - self._session_start, **fields)
        self._lock.release()

    def __enter__(self) -> AdaptiveCheckpointer:
        return self

    def __exit__(self, exc_type, exc, tb) -> None:
        """A normal exit is :meth:`close`; an exception is not a finished run (no final save).

        An ``Exception`` once training has begun (a step() was seen) leaves no clean stop in
        the run log, so the next launch counts this session as a failure; an exception before
        the first step (a refused restore, a bad argument), Ctrl-C and ``SystemExit`` are
        clean, unfinished stops.
        """
        if exc_type is None:
            self.close()
        else:
            crashed = issubclass(exc_type, Exception) and self._last_step is not None
            self._close(finished=False, clean=not crashed)

    # -- life cycle and preemption ------------------------------------------------------------
    def _life_cycle_options(self, total_steps, ignore_config_keys, signals, on_preemption) -> None:
        """Check the life-cycle arguments (before anything is written) and set the state."""
        if isinstance(ignore_config_keys, str):
            raise InputError(
                f"ignore_config_keys takes a collection of key names, e.g. "
                f"ignore_config_keys=({ignore_config_keys!r},), not one string"
            )
        keys = tuple(ignore_config_keys or ())
        for key in keys:
            if not isinstance(key, str) or not key:
                raise InputError(f"ignore_config_keys: each key is a non-empty string, got {key!r}")
        self.ignore_config_keys = keys
        if on_preemption not in ("exit", "stop"):
            raise InputError(f'on_preemption must be "exit" or "stop", got {on_preemption!r}')
        self.on_preemption = on_preemption
        if isinstance(signals, int):
            signals = (signals,)
        wanted = []
        for sig in signals or ():
            try:
                sig = signal.Signals(sig)
            except (ValueError, TypeError):
                raise InputError(f"preemption_signals: {sig!r} is not a signal") from None
            if sig in (getattr(signal, "SIGKILL", None), getattr(signal, "SIGSTOP", None)):
                raise InputError(f"preemption_signals: {sig.name} cannot be caught")
            wanted.append(sig)
        self.preemption_signals = tuple(dict.fromkeys(wanted))
        self.total_steps = total_steps
        self.finished = False
        """True after restore() when the run had already finished at the step restored."""
        self.preempted = False
        """True once a preemption signal made step() save (``on_preemption="stop"``)."""
        self._last_step: int | None = None
        self._saved_step: int | None = None  # the same on every rank (last_saved_step: rank 0)
        self._sync_only = False
        self._signalled: int | None = None  # set by the signal handler
        self._signal_t: float | None = None  # when it was first set (the grace period's start)
        self._agreed: int | None = None  # rank 0's signal, as broadcast: act on it now
        self._check_due = _NEVER
        self._handlers: dict[int, Any] = {}
        self._report_lock = threading.Lock()
        self._pending_reports: dict[tuple[str, int], dict] = {}

    def _install_preemption_handlers(self) -> None:
        if not self.preemption_signals:
            return
        if threading.current_thread() is not threading.main_thread():
            warnings.warn(
                "AdaptiveCheckpointer created outside the main thread: signal handlers can "
                "only be installed from the main thread, so preemption signals "
                f"({', '.join(s.name for s in self.preemption_signals)}) are not handled",
                stacklevel=3,
            )
            return
        ref = weakref.ref(self)
        for sig in self.preemption_signals:
            previous = signal.getsignal(sig)
            handler = _preemption_handler(ref, previous)
            signal.signal(sig, handler)
            self._handlers[sig] = (handler, previous)

    def _restore_signal_handlers(self) -> None:
        for sig, (handler, previous) in self._handlers.items():
            try:
                if signal.getsignal(sig) is handler:  # someone else's since: leave theirs
                    signal.signal(sig, previous if previous is not None else signal.SIG_DFL)
            except ValueError:  # closed off the main thread; the handler now passes through
                pass
        self._handlers = {}

    def _preempt(self, step: int) -> bool:
        """Save ``step`` now (unless it is saved), record the preemption, then exit or stop.

        A write in flight is finished first, never abandoned. With ``preemption_grace_s`` the
        save goes to the local tier when the persistent one is expected to take longer than
        what is left of the grace period (:meth:`_preemption_tier`).
        """
        signum = self._agreed if self._agreed is not None else self._signalled
        tier = self._preemption_tier(step)
        if self.backend.world_size > 1:
            tier = self.backend.broadcast(tier)  # rank 0's clock decides, as for the step
        if self._saved_in(tier) != step:
            self.save(step, tier=tier)
        self._finish_together()
        name = self._note_preempted(step, signum, tier=tier)
        if self.on_preemption == "exit":
            logger.warning(
                "preempted by %s: saved step %d; exiting with status %d",
                name,
                step,
                PREEMPTED_EXIT_CODE,
            )
            self.close(finished=False)
            raise SystemExit(PREEMPTED_EXIT_CODE)
        logger.warning("preempted by %s: saved step %d; stopping", name, step)
        self._set_due(self._planned_due)
        return True

    def _note_preempted(self, step: int, signum: int | None, *, tier: str | None = None) -> str:
        """Step ``step`` is saved after a preemption signal: record it (not a failure)."""
        fields = self._preempted_fields(tier)  # before the signal's time is forgotten
        self._signalled = self._agreed = self._signal_t = None
        self.preempted = True
        name = _signal_name(signum)
        self.runlog.append(
            "preempted",
            session_s=self.clock() - self._session_start,
            step=step,
            signal=name,
            **fields,
        )
        return name

    def _after_restore(self, step: int, marked: bool) -> None:
        """After the restore's broadcast: ``marked``, rank 0 found the run finished at
        ``step``."""
        if step > 0:
            self._saved_step = step
        self.finished = marked and (self.total_steps is None or step >= self.total_steps)
        self._after_tiered_restore(step)
        if self.finished:
            logger.warning("run already finished at step %d: nothing newer to do", step)
        elif marked:
            logger.info(
                "the run had finished at step %d; continuing to total_steps=%d",
                step,
                self.total_steps,
            )

    def _checkpoint_bytes(self, step: int, storage=None) -> int | None:
        """The size of the committed checkpoint (its manifest's sum), or None if unreadable."""
        try:
            manifest = json.loads(
                (storage or self.storage).read_bytes(
                    f"{checkpoint_name(step)}/{ckptio.MANIFEST}", ckptio.MAX_MANIFEST_BYTES
                )
            )
            return int(sum(entry["bytes"] for entry in manifest["files"].values()))
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def _signal_name(signum: int | None) -> str:
    try:
        return signal.Signals(signum).name
    except (ValueError, TypeError):
        return str(signum)


def _preemption_handler(ref: weakref.ref, previous) -> Callable:
    """The handler: only set a flag and send the next step() down the slow path.

    A previous Python handler is called too. Once its checkpointer is closed or gone, the
    handler passes the signal on as if it had never been installed.
    """

    def handler(signum, frame):
        ckpt = ref()
        live = ckpt is not None and not ckpt._closed
        if live:
            if ckpt._signalled is None:
                ckpt._signal_t = ckpt.clock()
            ckpt._signalled = signum
            ckpt._next_due = -1
        if callable(previous):
            previous(signum, frame)
        elif not live and previous in (signal.SIG_DFL, None):
            # Only when nobody chained on top of this handler: a newer checkpointer that
            # calls it as its "previous" has taken the signal in hand.
            if signal.getsignal(signum) is handler:
                signal.signal(signum, signal.SIG_DFL)
                os.kill(os.getpid(), signum)

    return handler


def _exit_hook(ref: weakref.ref) -> Callable[[], None]:
    """Close a checkpointer its script left open when the interpreter exits normally.

    A script that ends normally without ``close()`` is taken as finished (one process): its
    last step is saved and the run log says finished, exactly as ``close()`` would. On several
    ranks it is closed unfinished, with no final save: a collective at interpreter exit could
    hang on a rank that is already gone. After a preemption (``"stop"``) it is not finished.
    Without it a run whose script ends without ``close()`` would be logged as a failure and
    inflate the failure rate of every later run in the directory. An interpreter dying of an
    unhandled exception (``sys.last_value`` set) is left unclosed: that session did fail. A
    script that called ``sys.exit`` with a failing status (``sys.exit(1)``, ``sys.exit("loss
    is NaN")``: :func:`_exit_status`) is closed as a ``with`` block left by ``SystemExit`` is:
    a clean stop, not finished, and no final save, which could write a diverged state as the
    newest checkpoint. A SIGKILL runs no hook at all, as it should. By the time atexit hooks
    run, Python has already finished the write threads' queued saves, so none is lost.
    """

    def hook() -> None:
        ckpt = ref()
        if ckpt is None or ckpt._closed or getattr(sys, "last_value", None) is not None:
            return
        status = _exit_status()
        try:
            # Python has shut the write threads down by now: a final save is synchronous.
            ckpt._sync_only = True
            if status is not None:
                logger.warning(
                    "ckptsim: the script exited with status %r before close(): the run is not "
                    "finished and its last steps were not saved",
                    status,
                )
            finished = ckpt.backend.world_size == 1 and not ckpt.preempted and status is None
            ckpt.close(finished=finished)
        except Exception as exc:  # at exit: report it and let the interpreter go
            print(f"ckptsim: closing the checkpointer at exit failed: {exc}", file=sys.stderr)

    return hook


_LAST_EXIT: list[object] = [None]
"""The status ``sys.exit`` was last called with in this process (None: not called, or with
None), once :func:`_watch_sys_exit` has wrapped it."""


def _watch_sys_exit() -> None:
    """Wrap ``sys.exit`` (once a process) to note the status it is called with, then exit as
    it would: an atexit hook learns nothing else of how the interpreter is ending
    (``SystemExit`` sets no ``sys.last_value``). A ``raise SystemExit(1)`` written out is not
    seen, and a ``sys.exit`` whose ``SystemExit`` the script caught still counts as the last
    status: ``close()`` says how the run ended where either matters."""
    current = sys.exit
    if getattr(current, "_ckptsim_watched", False):
        return

    def exit(status: object = None) -> None:
        _LAST_EXIT[0] = status
        current(status)

    exit._ckptsim_watched = True  # type: ignore[attr-defined]
    exit.__doc__ = current.__doc__
    sys.exit = exit


def _exit_status() -> object:
    """The failing status of the last ``sys.exit`` call (a nonzero number, a message), or
    None where there was none or it succeeded (0, None)."""
    status = _LAST_EXIT[0]
    return None if status is None or status == 0 else status
