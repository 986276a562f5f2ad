"""The run's own record of its starts, saves and clean stops: evidence about the failure rate.

Each process that trains appends JSON lines to ``runlog.jsonl`` in the checkpoint root: a
``start`` when it begins (a new session), a ``restore`` when training begins (after the
checkpoint, if any, is loaded), a ``save`` with the session's running time at each save (and the
step, its stall, the interval chosen then and the next due step: what ``ckptsim plot
controller`` draws), a ``preempted`` when a preemption signal made it save and end, a
``finished`` (with the step) when the run closed as complete, a ``stop`` when it closes cleanly
and a ``crashed`` when the training loop raised. A launch the checkpointer refused (another
configuration, no intact checkpoint, a pickle) records ``refused`` instead of ``restore``.
With a local tier (:mod:`simulator.controller.local_tier`) a ``start`` also records the run's
id and ``local_found`` (whether this run's local tier was there), a ``save`` its ``tier``, a
``restore`` the tier it used, and a ``preempted`` the tier, the grace period and the seconds
from the signal to the commit.

A ``train`` marks a session's first training step. A session that trained (a ``train`` or a
``save``), was followed by another start and wrote neither ``stop`` nor ``preempted`` ended in a
failure: a preemption is the
scheduler's doing, not the hardware's. Its exposure is its running time up to its last record:
the minutes between that record and the crash are unknown, and leaving them out errs towards a
higher failure rate, the safe side for checkpointing. A session that never began training —
refused, or crashed while setting up or between ``restore()`` and its first step (a bug, a
bad argument) — is no evidence about the hardware: neither a failure nor exposure. (Logs
written before ``train`` existed, whose ``start`` lacks ``records_train``, count a ``restore``
or a ``crashed`` as training, as they did.)

:func:`failure_evidence` turns the log into (failures, exposure seconds), the observation that
updates :class:`simulator.controller.estimate.FailureRatePosterior` (Gamma–Poisson);
:func:`failures_by_class` splits the failures into process failures and node losses by the
next session's ``local_found``. Lines torn by a
crash in mid-append are skipped. The log is never written through a symlink or into a file
with other hard links (:func:`open_regular`): either would write into another directory.

On an object store (:mod:`simulator.controller.objstore`), which cannot append, each session
writes its own object ``runlog/<UTC start>-<session>.jsonl``, put whole at every event (one
request: all of it or nothing, so no line is ever torn), and the log is those objects read in
name order: the same events, the same evidence.
"""

from __future__ import annotations

import errno
import json
import os
import stat
import time
import uuid
import warnings
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "RUNLOG",
    "RUNLOG_OBJECTS",
    "Evidence",
    "RunLog",
    "failure_evidence",
    "failures_by_class",
    "open_regular",
    "read_events",
]

RUNLOG = "runlog.jsonl"
RUNLOG_OBJECTS = "runlog"
"""On an object store: the prefix of the sessions' run-log objects."""
_TRAINING = frozenset({"train", "save"})
"""Events that show a session began training (a script that never calls restore() saves)."""
_TRAINING_BEFORE_TRAIN_RECORDS = frozenset({"restore", "save", "crashed"})
"""The same for a session whose ``start`` lacks ``records_train`` (a log from before ckptsim
recorded the first step): its ``restore`` or ``crashed`` is taken as training, as it was."""


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


_MAX_BYTES = 256 << 20
"""A run log larger than this is not read (a save line is ~200 bytes: a million saves fit)."""


def _valid(event: object) -> bool:
    """A record this module wrote: string event and session, a finite non-negative running
    time, a step that is a plain non-negative integer. Anything else (a foreign or edited
    line) is skipped rather than allowed to raise deep inside the checkpointer."""
    if not isinstance(event, dict):
        return False
    if not isinstance(event.get("event"), str) or not isinstance(event.get("session"), str):
        return False
    t = event.get("session_s", 0.0)
    if isinstance(t, bool) or not isinstance(t, int | float):
        return False
    try:
        if not (0.0 <= float(t) < 1e12):  # NaN, inf and a 4,000-digit integer all fail here
            return False
    except OverflowError:
        return False
    step = event.get("step")
    return step is None or (type(step) is int and 0 <= step < 2**63)


def open_regular(path: Path, flags: int, *, follow: bool = False) -> int:
    """An fd for ``path`` only if it is a regular file (never a FIFO or device that would
    block or never end), unless ``follow`` not a symbolic link, and, when opened for writing,
    the file's only name: a hard link (``cp -al`` makes them) would carry what is written here
    into another directory's file. Refusals are ``OSError`` with ``errno`` ELOOP, EINVAL or
    EMLINK and the reason as ``strerror``. Also used for the lock file."""
    flags |= os.O_NONBLOCK | (0 if follow else os.O_NOFOLLOW)
    try:
        fd = os.open(path, flags, 0o644)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise OSError(
                exc.errno, f"{path} is a symlink; it is never read or written through one"
            ) from None
        raise
    st = os.fstat(fd)
    if not stat.S_ISREG(st.st_mode):
        os.close(fd)
        raise OSError(errno.EINVAL, f"{path} is not a regular file")
    if flags & (os.O_WRONLY | os.O_RDWR) and st.st_nlink > 1:
        os.close(fd)
        raise OSError(
            errno.EMLINK,
            f"{path} has {st.st_nlink} hard links: writing it would change another "
            "directory's file too",
        )
    return fd


def read_events(path: str | os.PathLike, *, follow: bool = False) -> list[dict]:
    """The log's events in order; torn, foreign or malformed lines are skipped.

    A missing log is no evidence (an empty list). A log that is a symbolic link (unless
    ``follow``: a path a person gave on the command line), not a regular file, or larger than
    256 MiB raises ``OSError`` with the reason.
    """
    path = Path(path)
    try:
        fd = open_regular(path, os.O_RDONLY, follow=follow)
    except FileNotFoundError:
        return []
    with os.fdopen(fd, "rb") as f:
        size = os.fstat(f.fileno()).st_size
        if size > _MAX_BYTES:
            raise OSError(errno.EFBIG, f"{path} is {size} bytes, more than a run log holds")
        text = f.read(_MAX_BYTES + 1).decode("utf-8", errors="replace")
    return _parse(text)


def _parse(text: str) -> list[dict]:
    events = []
    for line in text.splitlines():
        try:
            event = json.loads(line)
        except (ValueError, RecursionError):  # torn, foreign, too deep or too long a number
            continue
        if _valid(event):
            events.append(event)
    return events


def _sessions(events: list[dict], exclude_session: str | None):
    """Per past session, in order: (id, trained, stopped cleanly, exposure s, its start)."""
    order: list[str] = []
    exposure: dict[str, float] = {}
    stopped: dict[str, bool] = {}
    trained: dict[str, bool] = {}
    starts: dict[str, dict] = {}
    marks: dict[str, frozenset[str]] = {}
    for e in events:
        sid = e["session"]
        if sid == exclude_session:
            continue
        if sid not in exposure:
            order.append(sid)
            exposure[sid] = 0.0
            stopped[sid] = trained[sid] = False
            marks[sid] = _TRAINING_BEFORE_TRAIN_RECORDS
        if e["event"] == "start":
            starts.setdefault(sid, e)
            if e.get("records_train") is True:
                marks[sid] = _TRAINING
        exposure[sid] = max(exposure[sid], float(e.get("session_s", 0.0)))
        if e["event"] in ("stop", "preempted"):
            stopped[sid] = True
        elif e["event"] in marks[sid]:
            trained[sid] = True
    return [(sid, trained[sid], stopped[sid], exposure[sid], starts.get(sid, {})) for sid in order]


def _failed(table, later: bool) -> list[int]:
    """Indices of the sessions that failed: trained, no clean stop, something ran after them
    (the last past session too when ``later``: the current process is that something)."""
    return [
        i
        for i, (_, trained, stopped, _, _) in enumerate(table)
        if (later or i < len(table) - 1) and trained and not stopped
    ]


def failure_evidence(events: list[dict], *, exclude_session: str | None = None) -> Evidence:
    """Failures and exposure from run-log events (``exclude_session``: the one running now)."""
    table = _sessions(events, exclude_session)
    failures = len(_failed(table, later=exclude_session is not None))
    exposure_s = sum(t for _, trained, _, t, _ in table if trained)
    return Evidence(failures=failures, exposure_s=exposure_s, sessions=len(table))


def failures_by_class(
    events: list[dict], *, exclude_session: str, local_found: bool
) -> dict[str, int]:
    """The past failures split into ``process`` (the host survived) and ``node`` (it did not).

    The session after a failure says which: its ``start`` records whether it found the run's
    local tier (``local_found``; for the current session, ``local_found`` here). Found: the
    host had survived, a process failure (a crash, or a hang ended by a kill); not found: a
    node loss (or a move to another host, which for the local tier is the same). A failure
    whose successor recorded nothing (a session without a local tier) counts as a node loss:
    the class that needs the costlier tier, the safe side.
    """
    table = _sessions(events, exclude_session)
    out = {"process": 0, "node": 0}
    for i in _failed(table, later=True):
        found = table[i + 1][4].get("local_found") if i + 1 < len(table) else local_found
        out["process" if found is True else "node"] += 1
    return out


class RunLog:
    """Appends this session's events to the run log (rank 0 only writes)."""

    def __init__(
        self,
        root: str | os.PathLike,
        *,
        enabled: bool = True,
        session: str | None = None,
        store=None,
    ):
        """``store``: an object store (:class:`~simulator.controller.objstore.FsspecStorage`)
        holding the log as one object per session, instead of ``root``'s file."""
        self.store = store
        self.session = session or uuid.uuid4().hex[:12]
        if store is None:
            self.path = Path(root) / RUNLOG
        else:
            stamp = time.strftime("%Y%m%dT%H%M%SZ", time.gmtime())
            self._object = f"{RUNLOG_OBJECTS}/{stamp}-{self.session}.jsonl"
            self.path = store.describe(self._object)
            self._lines: list[bytes] = []
        self.enabled = enabled
        self._tail_checked = False
        self._warned = False

    def events(self) -> list[dict]:
        """The log's events; one that cannot be read safely (a symbolic link, not a regular
        file) is warned about once and holds none."""
        try:
            if self.store is not None:
                return self._object_events()
            return read_events(self.path)
        except OSError as exc:
            self._warn(exc, "read")
            return []

    def _object_events(self) -> list[dict]:
        events = []
        for name in self.store.names_under(RUNLOG_OBJECTS):
            data = self.store.read_bytes(name, _MAX_BYTES)
            events.extend(_parse(data.decode("utf-8", errors="replace")))
        return events

    def evidence(self) -> Evidence:
        """What the log says of past sessions."""
        return failure_evidence(self.events(), exclude_session=self.session)

    def _warn(self, exc: OSError, doing: str) -> None:
        if not self._warned:
            self._warned = True
            reason = exc.strerror or str(exc)
            warnings.warn(f"cannot {doing} the run log {self.path}: {reason}", stacklevel=4)

    def append(self, event: str, *, session_s: float, **fields) -> None:
        """Append one event; a log that cannot be written (a full disk) is warned about once,
        never raised: it is evidence for the schedule, not the training state."""
        if not self.enabled:
            return
        try:
            self._append(event, session_s=session_s, **fields)
        except OSError as exc:
            self._warn(exc, "write")

    def _append(self, event: str, *, session_s: float, **fields) -> None:
        record = {"event": event, "session": self.session, "session_s": round(session_s, 3)}
        record.update(fields)
        line = (json.dumps(record, sort_keys=True) + "\n").encode()
        if self.store is not None:
            self._lines.append(line)
            self.store.write_bytes(self._object, b"".join(self._lines))
            return
        self.path.parent.mkdir(parents=True, exist_ok=True)
        # One write per line on an O_APPEND descriptor, then fsync: a crash leaves at most one
        # torn final line, which read_events skips. Never through a symlink or a hard link: the
        # record would land in whatever file it names.
        fd = open_regular(self.path, os.O_RDWR | os.O_APPEND | os.O_CREAT)
        try:
            if not self._tail_checked:
                # A crash mid-append leaves a line without its newline; start on a fresh line
                # so the torn record does not swallow this one.
                self._tail_checked = True
                size = os.fstat(fd).st_size
                if size and os.pread(fd, 1, size - 1) != b"\n":
                    line = b"\n" + line
            os.write(fd, line)
            os.fsync(fd)
        finally:
            os.close(fd)
