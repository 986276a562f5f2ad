"""The checkpointer's schedule without its writer, for frameworks that save their own state.

Lightning and Hugging Face Trainer write complete checkpoints in their own formats; what they
lack is *when*. ``ExternalSaveSchedule`` gives the callbacks in ``lightning`` and ``hf`` the
same schedule, run log and failure-rate posterior that ``AdaptiveCheckpointer.step`` uses.
"""

from __future__ import annotations

import math


class ExternalSaveSchedule:
    """An AdaptiveCheckpointer's schedule, for frameworks that write their own checkpoints.

    Lightning and Hugging Face Trainer save and resume their own (complete) state; what they
    lack is *when*. This drives the checkpointer's schedule, run log and failure posterior
    exactly as :meth:`AdaptiveCheckpointer.step` does, minus the writing: ``is_due`` is one int
    compare until the due step; at the due step (rank 0's, broadcast at save time only) the
    framework saves and reports the stall with ``record_save``. Its only
    collective is the backend's broadcast at save time.
    """

    def __init__(self, checkpointer):
        self.ckpt = checkpointer
        self.schedule = checkpointer.schedule
        self.backend = checkpointer.backend
        self.clock = checkpointer.clock
        self._session_start = self.clock()
        self._mark_step, self._mark_t = 0, self._session_start

    @property
    def next_due_step(self) -> int:
        """The checkpointer's own due step, so its ``stats`` and ``next_due_step`` stay current."""
        return self.ckpt._planned_due

    def _age_s(self) -> float:
        return self.clock() - self._session_start

    def _measure(self, step: int) -> None:
        now = self.clock()
        if step > self._mark_step and now > self._mark_t:
            self.schedule.iteration.update((now - self._mark_t) / (step - self._mark_step))

    def _plan(self, step: int) -> int:
        due = self.schedule.next_due(step, age_s=self._age_s())
        self.ckpt._set_due(self.ckpt._broadcast_point(step, due))
        self._mark_step, self._mark_t = step, self.clock()
        return self.next_due_step

    def start(self, step: int) -> int:
        """The framework (re)starts training after ``step`` steps; returns the first due step.

        A resumed run starts from the estimates logged with the newest save at or before
        ``step`` (the framework's checkpoint has no room for them; the run log does), so it
        needs no new probe, just as AdaptiveCheckpointer.restore seeds from its checkpoint.
        """
        from simulator.controller.schedule import Estimates

        if step > 0:
            seed = None
            if self.backend.rank == 0:
                for event in reversed(self.ckpt.runlog.events()):
                    est, at = event.get("estimates"), event.get("step")
                    if event["event"] == "save" and isinstance(est, dict) and at is not None:
                        if at <= step and Estimates.bad_entry(est) is None:
                            seed = est
                            break
            # Every rank seeds alike (only rank 0 reads the log): a rank left probing would
            # plan, and so broadcast, at steps where rank 0 does not.
            seed = self.backend.broadcast(seed)
            if seed is not None:
                self.schedule.seed(Estimates(**seed))
        self.ckpt.resumed_from = step if step > 0 else None
        self.ckpt.runlog.append("restore", session_s=self._age_s(), step=int(step))
        return self._plan(int(step))

    def is_due(self, step: int) -> bool:
        """True when the framework should save after ``step`` steps (collective only then).

        Also True at the first step after a preemption signal (on several ranks: at the first
        check point after rank 0 got it); :meth:`record_save` then sets ``ckpt.preempted``, and
        the framework should stop training.
        """
        ckpt = self.ckpt
        if step < ckpt._next_due:
            return False
        ckpt._note_began(step)
        if ckpt._preempting(step):
            self._measure(step)
            return True
        if step < ckpt._planned_due:
            return False
        if self.schedule.needs_probe and not self.schedule.needs_first_save:
            # The probe's end: the iteration time is known now, so the interval can be.
            self._measure(step)
            self._plan(step)
            return False
        self._measure(step)
        return True

    def record_save(
        self,
        step: int,
        *,
        stall_s: float,
        write_s: float | None = None,
        nbytes: int | None = None,
    ) -> int:
        """The framework saved after ``step`` steps, stalling ``stall_s``; returns the next due.

        Rank 0 logs the save in the AdaptiveCheckpointer's own line (step, tier, ``nbytes``,
        stall, next due step) on the ``simulator.controller`` logger."""
        from simulator.controller.checkpointer import logger

        step, stall_s = int(step), max(float(stall_s), 0.0)
        self.schedule.stall.update(stall_s)
        if write_s is not None:
            self.schedule.write.update(float(write_s))
        self.ckpt.saves += 1
        # Both: last_saved_step is what stats show (rank 0), _saved_step what close() marks
        # finished (every rank).
        self.ckpt.last_saved_step = self.ckpt._saved_step = step
        session_s = self._age_s()
        self.schedule.update_exposure(session_s)
        preempted_by = self.ckpt._agreed
        due = self._plan(step)
        interval_s = self.schedule.interval_s
        self.ckpt.runlog.append(
            "save",
            session_s=session_s,
            step=step,
            ok=True,
            estimates=vars(self.schedule.estimates()),
            stall_s=round(stall_s, 6),
            interval_s=interval_s if math.isfinite(interval_s) else None,
            next_due_step=due,
        )
        if self.backend.rank == 0:
            logger.info(
                "saved step %d (tier %s): %s bytes, stall %.3f s, next due step %d",
                step,
                "persistent",
                "?" if nbytes is None else f"{nbytes:,}",
                stall_s,
                due,
                extra={
                    "step": step,
                    "tier": "persistent",
                    "bytes": nbytes,
                    "stall_s": stall_s,
                    "next_due_step": due,
                },
            )
        if preempted_by is not None:
            self.ckpt._note_preempted(step, preempted_by)
        return due
