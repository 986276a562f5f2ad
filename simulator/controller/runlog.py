"""The run's own record of its starts, saves and clean stops: evidence about the failure rate.

Each process that trains appends JSON lines to ``runlog.jsonl`` in the checkpoint root: a
``start`` when it begins (a new session), a ``restore`` when training begins (after the
checkpoint, if any, is loaded), a ``save`` with the session's running time at each save (and the
step, its stall, the interval chosen then and the next due step: what ``ckptsim plot
controller`` draws), a ``preempted`` when a preemption signal made it save and end, a
``finished`` (with the step) when the run closed as complete, a ``stop`` when it closes cleanly
and a ``crashed`` when the training loop raised. A launch the checkpointer refused (another
configuration, no intact checkpoint, a pickle) records ``refused`` instead of ``restore``.

A session that trained (a ``restore``, a ``save`` or a ``crashed``), was followed by another
start and wrote neither ``stop`` nor ``preempted`` ended in a failure: a preemption is the
scheduler's doing, not the hardware's. Its exposure is its running time up to its last record:
the minutes between that record and the crash are unknown, and leaving them out errs towards a
higher failure rate, the safe side for checkpointing. A session that never began training —
refused, or crashed while setting up — is no evidence about the hardware: neither a failure
nor exposure.

:func:`failure_evidence` turns the log into (failures, exposure seconds), the observation that
updates :class:`simulator.estimate.FailureRatePosterior` (Gamma–Poisson). Lines torn by a
crash in mid-append are skipped.
"""

from __future__ import annotations

import json
import os
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = ["RUNLOG", "Evidence", "RunLog", "failure_evidence", "read_events"]

RUNLOG = "runlog.jsonl"
_TRAINING = frozenset({"restore", "save", "crashed"})
"""Events that show a session began training (a script that never calls restore() saves)."""


@dataclass(frozen=True, kw_only=True)
class Evidence:
    """What the run log says about past sessions (the current one excluded)."""

    failures: int
    """Sessions that trained, ended without a clean stop or a preemption and were followed by a
    restart."""
    exposure_s: float
    """Running time of the past sessions that trained, seconds."""
    sessions: int
    """Past sessions (those that never trained included)."""


def read_events(path: str | os.PathLike) -> list[dict]:
    """The log's events in order; torn or foreign lines are skipped."""
    events = []
    try:
        text = Path(path).read_text(encoding="utf-8", errors="replace")
    except OSError:  # none yet, or unreadable: no evidence either way
        return events
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except json.JSONDecodeError:
            continue
        if isinstance(event, dict) and "event" in event and "session" in event:
            events.append(event)
    return events


def failure_evidence(events: list[dict], *, exclude_session: str | None = None) -> Evidence:
    """Failures and exposure from run-log events (``exclude_session``: the one running now)."""
    order: list[str] = []
    exposure: dict[str, float] = {}
    stopped: dict[str, bool] = {}
    trained: dict[str, bool] = {}
    for e in events:
        sid = e["session"]
        if sid == exclude_session:
            continue
        if sid not in exposure:
            order.append(sid)
            exposure[sid] = 0.0
            stopped[sid] = trained[sid] = False
        exposure[sid] = max(exposure[sid], float(e.get("session_s", 0.0)))
        if e["event"] in ("stop", "preempted"):
            stopped[sid] = True
        elif e["event"] in _TRAINING:
            trained[sid] = True
    # A session is a failure when it did not stop cleanly and something ran after it: the last
    # past session counts too, since the current process is that "something".
    later = exclude_session is not None
    failures = 0
    for i, sid in enumerate(order):
        followed = later or i < len(order) - 1
        failures += int(followed and trained[sid] and not stopped[sid])
    exposure_s = sum(t for sid, t in exposure.items() if trained[sid])
    return Evidence(failures=failures, exposure_s=exposure_s, sessions=len(order))


class RunLog:
    """Appends this session's events to the run log (rank 0 only writes)."""

    def __init__(
        self, root: str | os.PathLike, *, enabled: bool = True, session: str | None = None
    ):
        self.path = Path(root) / RUNLOG
        self.enabled = enabled
        self.session = session or uuid.uuid4().hex[:12]
        self._tail_checked = False
        self._warned = False

    def evidence(self) -> Evidence:
        return failure_evidence(read_events(self.path), exclude_session=self.session)

    def append(self, event: str, *, session_s: float, **fields) -> None:
        """Append one event; a log that cannot be written (a full disk) is warned about once,
        never raised: it is evidence for the schedule, not the training state."""
        if not self.enabled:
            return
        try:
            self._append(event, session_s=session_s, **fields)
        except OSError as exc:
            if not self._warned:
                self._warned = True
                warnings.warn(f"cannot write the run log {self.path}: {exc}", stacklevel=3)

    def _append(self, event: str, *, session_s: float, **fields) -> None:
        record = {"event": event, "session": self.session, "session_s": round(session_s, 3)}
        record.update(fields)
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        self.path.parent.mkdir(parents=True, exist_ok=True)
        if not self._tail_checked:
            # A crash mid-append leaves a line without its newline; start on a fresh line so
            # the torn record does not swallow this one.
            self._tail_checked = True
            if self.path.exists() and self.path.stat().st_size:
                with open(self.path, "rb") as f:
                    f.seek(-1, os.SEEK_END)
                    if f.read(1) != b"\n":
                        line = b"\n" + line
        # One write per line on an O_APPEND descriptor, then fsync: a crash leaves at most one
        # torn final line, which read_events skips.
        fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT, 0o644)
        try:
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
