"""The live-training checkpointer: saves complete state when the policy says so, resumes exactly.

Call :meth:`AdaptiveCheckpointer.restore` once before training and
:meth:`AdaptiveCheckpointer.step` after every optimizer step. ``step`` is one integer compare
against a precomputed due step until a save is due; the interval is recomputed only at save
time, from the measured save stall and iteration time and the failure-rate posterior (see
:mod:`simulator.controller.schedule`), and on several ranks rank 0's answer is broadcast then,
so no collective runs on the other steps.

A save captures the whole run (:mod:`simulator.controller.state`), writes it so that it counts
only once complete (:mod:`simulator.ckptio`, or temp dir + manifest + rename around a
distributed backend), then applies retention (:mod:`simulator.controller.storage`). Restore
takes the newest checkpoint that verifies, warns and falls back past corrupt ones (moving them
aside, never deleting them), refuses a checkpoint carrying a pickle, and refuses one written
with a different configuration. It never starts afresh silently: when the directory holds
checkpoints but none is intact it raises :class:`NoIntactCheckpoint` unless the user allowed
it. One checkpointer at a time writes a directory (:mod:`simulator.controller.lock`); a
read-only directory can still be restored from.
"""

from __future__ import annotations

import atexit
import math
import sys
import time
import warnings
import weakref
from collections.abc import Callable, Mapping
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

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
from simulator.controller.integrity import (
    CheckpointLocked,
    CheckpointWriteError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoIntactCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.lock import READ_ONLY, DirectoryLock, open_directory
from simulator.controller.runlog import RunLog
from simulator.controller.schedule import DEFAULT_MTBF_S, Estimates, Schedule
from simulator.controller.state import capture_state, restore_state, stage
from simulator.controller.storage import (
    LocalStorage,
    Storage,
    apply_retention,
    checkpoint_name,
    complete_steps,
)
from simulator.errors import InputError
from simulator.estimate import FailureRatePosterior
from simulator.policies import Adaptive, Policy

__all__ = ["AdaptiveCheckpointer"]


class AdaptiveCheckpointer:
    """Saves a training run's complete state at the interval the policy deems best.

    ``directory`` holds the ``step-NNNNNNNN`` checkpoints and ``runlog.jsonl``. The objects
    (``model``, ``optimizer``, ``scheduler``, ``scaler``, ``dataloader``, each value of
    ``extra``) need ``state_dict``/``load_state_dict``. ``policy`` defaults to
    :class:`simulator.policies.Adaptive`; the failure-rate prior comes from ``mtbf_h``, else
    ``scenario`` (which also gives ``restart_s`` and the first guess of the save cost), else a
    weak 24 h default. ``keep_last`` checkpoints are kept (at least 2 with ``async_save``)
    plus the ``milestones`` (fractions of ``total_steps``, saved exactly at those steps).
    ``config`` is a JSON-able snapshot that a resume must match. ``storage`` must address
    ``directory`` (a :class:`LocalStorage` or a subclass); ``clock`` is injectable for tests;
    ``probe_steps`` steps measure the iteration time before the first interval is chosen.
    ``allow_fresh_start``: when the directory holds checkpoints but none is intact, restore
    from step 0 with a warning instead of raising :class:`NoIntactCheckpoint`.

    Rank 0 holds an exclusive lock on ``directory`` until :meth:`close` (or its death); a
    second process raises :class:`CheckpointLocked` naming the holder. A read-only
    ``directory`` is opened for restoring only: nothing is written there, and a save raises
    :class:`CheckpointWriteError`.
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
        storage: Storage | None = None,
        backend: Backend | None = None,
        clock: Callable[[], float] = time.monotonic,
        probe_steps: int = 20,
        allow_fresh_start: bool = False,
    ):
        self.root = Path(directory)
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
        self.storage: Storage = storage if storage is not None else LocalStorage(self.root)
        self.clock = clock
        self.async_save = bool(async_save)
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
        self.schedule = Schedule(
            policy=policy if policy is not None else Adaptive(),
            prior=prior,
            restart_s=restart_s,
            checkpoint_prior_s=checkpoint_prior_s,
            asynchronous=self.async_save,
            milestones=self.milestone_steps,
            component=component,
            n_components=n_components,
            probe_steps=probe_steps,
        )

        is_rank0 = self.backend.rank == 0
        self.allow_fresh_start = bool(allow_fresh_start)
        # Only rank 0 locks: every rank shares the directory, and only rank 0 deletes in it.
        self._lock = DirectoryLock(self.root)
        opened = open_directory(self.root, self._lock) if is_rank0 else None
        if self.backend.world_size > 1:
            # Every rank refuses together, and knows whether a save can be written at all.
            opened = self.backend.broadcast(opened)
        self.read_only = opened == READ_ONLY
        """The directory cannot be written: restore works, a save raises."""
        if opened is not None and not self.read_only:
            raise CheckpointLocked(opened)
        self.runlog = RunLog(self.root, enabled=is_rank0 and not self.read_only)
        if is_rank0:
            evidence = self.runlog.evidence()
            self.schedule.set_history(evidence.failures, evidence.exposure_s)
        self._session_start = clock()
        self.runlog.append("start", session_s=0.0)

        self.resumed_from: int | None = None
        self.last_saved_step: int | None = None
        self.saves = 0
        self._closed = False
        self._executor: ThreadPoolExecutor | None = None
        self._inflight: Future | None = None
        self._inflight_step: int | None = None
        self._write_failed = False
        self._mark_step = 0
        self._mark_t = clock()
        self._planned_due = self._next_due = self.schedule.next_due(0, age_s=0.0)
        self._exit_hook = _exit_hook(weakref.ref(self))
        atexit.register(self._exit_hook)

    # -- the hot path -----------------------------------------------------------------------
    @property
    def next_due_step(self) -> int:
        return self._planned_due

    def step(self, step: int) -> bool:
        """Call after each optimizer step with the number of steps done; True when it saved."""
        if step < self._next_due:
            return False
        return self._due(step)

    def _due(self, step: int) -> bool:
        self._next_due = self._planned_due
        if self._inflight is not None and self._inflight.done():
            self._finish_inflight()
        if step < self._planned_due:
            return False
        if self.schedule.needs_probe and not self.schedule.needs_first_save:
            self._measure_iterations(step)
            due = self.schedule.next_due(step, age_s=self.clock() - self._session_start)
            self._planned_due = self._next_due = int(self.backend.broadcast(due))
            return False
        self.save(step)
        return True

    # -- saving -----------------------------------------------------------------------------
    def _measure_iterations(self, step: int) -> None:
        now = self.clock()
        if step > self._mark_step and now > self._mark_t:
            self.schedule.iteration.update((now - self._mark_t) / (step - self._mark_step))

    def save(self, step: int) -> None:
        """Save the complete state after ``step`` steps now (waits for a write in flight)."""
        if self._closed:
            raise RuntimeError("the checkpointer is closed")
        step = int(step)
        self._finish_inflight()
        t0 = self.clock()
        self._measure_iterations(step)
        error: BaseException | None = None
        try:
            state = capture_state(
                step=step, config=self.config, backend=self.backend, **self._objects
            )
            state["controller"] = vars(self.schedule.estimates())
            if self.async_save:
                staged = stage(state)
                self._inflight_step = step
                self._inflight = self._pool().submit(self._write_in_background, step, staged)
            else:
                self._write_and_commit(step, state)
        except Exception as exc:  # reported below, after the schedule has moved on
            error = exc
        t1 = self.clock()
        if error is None:
            self.schedule.stall.update(t1 - t0)
            self.saves += 1
        session_s = t1 - self._session_start
        self.schedule.update_exposure(session_s)
        self.runlog.append("save", session_s=session_s, step=step, ok=error is None)
        due = self.schedule.next_due(step, age_s=session_s)
        due, message = self.backend.broadcast((due, None if error is None else repr(error)))
        self._planned_due = self._next_due = int(due)
        if self._write_failed:
            self._next_due = -1
        self._mark_step, self._mark_t = step, self.clock()
        if error is not None or message is not None:
            raise CheckpointWriteError(
                f"saving step {step} failed ({error or message}); the previous checkpoint "
                f"({self._last_good()}) is intact"
            ) from error

    def _write_in_background(self, step: int, state: dict) -> None:
        try:
            self._write_and_commit(step, state)
        except BaseException:
            # Before the future completes: the next step() takes the slow path, which raises
            # the error on the training thread; the fast path stays one compare. The flag
            # covers a failure that lands before save() has stored its next due step.
            self._write_failed = True
            self._next_due = -1
            raise

    def _pool(self) -> ThreadPoolExecutor:
        if self._executor is None:
            self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckpt-writer")
        return self._executor

    def _last_good(self) -> str:
        steps = complete_steps(self.storage)
        return checkpoint_name(steps[-1]) if steps else "none yet"

    def _finish_inflight(self) -> None:
        """Wait for the background write; raise its error here, on the training thread."""
        future, self._inflight = self._inflight, None
        if future is None:
            return
        try:
            future.result()
        except Exception as exc:
            raise CheckpointWriteError(
                f"background write of step {self._inflight_step} failed ({exc}); the previous "
                f"checkpoint ({self._last_good()}) is intact"
            ) from exc
        finally:
            self._write_failed = False

    def _write_and_commit(self, step: int, state: dict) -> None:
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
            self.schedule.write.update(self.clock() - t0)
            try:
                apply_retention(
                    self.storage,
                    keep_last=self.keep_last,
                    milestones=self.milestone_steps,
                    resumed_from=self.resumed_from,
                )
            except OSError as exc:
                warnings.warn(f"checkpoint retention failed: {exc}", stacklevel=2)

    # -- restoring --------------------------------------------------------------------------
    def restore(self) -> int:
        """Load the newest intact checkpoint; returns the steps it holds (0: none found).

        Raises :class:`NoIntactCheckpoint` when there are checkpoints but none is intact
        (unless ``allow_fresh_start``), :class:`IncompatibleCheckpoint` for another
        configuration or model, :class:`UnsafeCheckpoint` for a pickle. The run log records
        such a launch as ``refused``: it never trained, so it is no failure of the hardware.
        A refusal also closes the checkpointer (the lock is released; nothing is saved).
        """
        try:
            step = self._load_newest()
        except (IncompatibleCheckpoint, NoIntactCheckpoint, UnsafeCheckpoint) as exc:
            self.runlog.append(
                "refused", session_s=self.clock() - self._session_start, reason=str(exc)
            )
            self._closed = True  # no "stop": the launch ended before training
            atexit.unregister(self._exit_hook)
            self._lock.release()
            raise
        now = self.clock()
        self._mark_step, self._mark_t = step, now
        self.runlog.append("restore", session_s=now - self._session_start, step=step)
        due = self.schedule.next_due(step, age_s=now - self._session_start)
        self._planned_due = self._next_due = int(self.backend.broadcast(due))
        return step

    def _load_newest(self) -> int:
        self._rejected: dict[str, str] = {}  # rank 0: name -> why, in this restore
        self._aside_before = rejected_aside(self.storage) if self.backend.rank == 0 else []
        while (name := self._choose_everywhere()) is not None:
            template = capture_state(
                step=0, config=self.config, backend=self.backend, **self._objects
            )
            try:
                state = self.backend.read(self.root / name, template)
            except CorruptCheckpoint as exc:
                if self.backend.world_size > 1:
                    raise  # verified by rank 0 yet unreadable here: no silent divergence
                self._reject(name, "corrupt", str(exc))
                continue
            # A distributed checkpoint's step is known only now; every rank reads the same.
            mismatch = misnamed(name, state.get("step"))
            if mismatch is not None:
                self._reject(name, "misnamed", mismatch)
                continue
            check_config(self.root / name, state.get("config"), self.config)
            try:
                step = restore_state(state, backend=self.backend, **self._objects)
            except (KeyError, RuntimeError, ValueError) as exc:
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else repr(exc)
                raise IncompatibleCheckpoint(
                    f"checkpoint {self.root / name} does not fit this run: {first}"
                ) from None
            self.schedule.seed(Estimates(**state.get("controller", {})))
            self.resumed_from = self.last_saved_step = step
            return step
        return 0

    def _reject(self, name: str, why: str, reason: str) -> None:
        if self.backend.rank != 0:
            return
        line = reject(self.storage, name, why, reason, move=self._lock.held)
        warnings.warn(f"{line}; falling back to an older checkpoint", stacklevel=4)
        self._rejected[name] = line

    def _choose_everywhere(self) -> str | None:
        """Rank 0 chooses; every rank gets the choice, or raises the same refusal."""
        choice, error = None, None
        if self.backend.rank == 0:
            try:
                choice = self._choose()
            except (IncompatibleCheckpoint, NoIntactCheckpoint) as exc:
                error = (isinstance(exc, NoIntactCheckpoint), str(exc))
        choice, error = self.backend.broadcast((choice, error))
        if error is not None:
            raise (NoIntactCheckpoint if error[0] else IncompatibleCheckpoint)(error[1])
        return choice

    def _choose(self) -> str | None:
        choice, rejected = choose_checkpoint(
            self.root,
            self.storage,
            self.config,
            tidy=self._lock.held,
            skip=frozenset(self._rejected),
        )
        for name, line in rejected.items():
            warnings.warn(f"{line}; falling back to an older checkpoint", stacklevel=4)
            self._rejected[name] = line
        if choice is not None:
            return choice
        lines = list(self._rejected.values()) + [
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
                stacklevel=4,
            )
        return None

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
            "policy": s.policy.name,
        }

    def close(self) -> None:
        """Wait for a write in flight (raising its error), and record a clean stop."""
        if self._closed:
            return
        self._closed = True
        atexit.unregister(self._exit_hook)
        try:
            self._finish_inflight()
        finally:
            if self._executor is not None:
                self._executor.shutdown(wait=True)
            self.runlog.append("stop", session_s=self.clock() - self._session_start)
            self._lock.release()

    def __enter__(self) -> AdaptiveCheckpointer:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()


def _exit_hook(ref: weakref.ref) -> Callable[[], None]:
    """Close a checkpointer its script left open when the interpreter exits normally.

    Without it a run whose script ends without ``close()`` would be logged as a failure and
    inflate the failure rate of every later run in the directory. An interpreter dying of an
    unhandled exception (``sys.last_value`` set) is left unclosed: that session did fail. A
    SIGKILL runs no hook at all, as it should. By the time atexit hooks run, Python has already
    finished the write threads' queued saves, so none is lost.
    """

    def hook() -> None:
        ckpt = ref()
        if ckpt is None or ckpt._closed or getattr(sys, "last_value", None) is not None:
            return
        try:
            ckpt.close()
        except Exception as exc:  # at exit: report it and let the interpreter go
            print(f"ckptsim: closing the checkpointer at exit failed: {exc}", file=sys.stderr)

    return hook
