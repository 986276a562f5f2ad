"""Trace replay: drive the simulated job's failures from recorded timestamps.

Instead of drawing failure times from a lifetime model, a replica can replay the failures a
real cluster logged (for Titan, ``simulator.fitting.titan.failure_times_for_subset``). Any
sorted array of timestamps works; they are shifted so the job starts at ``start_s`` into the
trace, and the trace simply runs out (no more failures) after its last entry.

``read_trace`` turns a user's failure log (CSV or Parquet, read as ``ckptsim fit`` reads it:
one column of failure times, numbers since the job's start or dates from the first) into
such an array; ``TraceStart`` makes each replica replay it from its own random start, so
replicas of a trace differ.

For a scenario with failure classes every replayed failure needs its class: ``read_causes``
reads the log's cause column (the one ``ckptsim fit`` reads), ``classes_of`` maps each cause
to a class name (the cause itself when it is a class's name, else a CAUSE=CLASS mapping;
an unmapped cause is an error), and a ``ClassTrace`` carries the times with their classes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator.errors import InputError

__all__ = [
    "ClassTrace",
    "TraceFailures",
    "TraceStart",
    "classes_of",
    "coverage",
    "read_causes",
    "read_trace",
    "read_trace_log",
    "trace_mtbf_s",
]


@dataclass(frozen=True, eq=False)
class ClassTrace:
    """Replayed failure times (s since the job's start, sorted) and each one's failure class
    (a name of the scenario's ``[[failure_class]]`` tables)."""

    times_s: np.ndarray
    classes: np.ndarray

    def __len__(self) -> int:
        return len(self.times_s)


class TraceFailures:
    """A ``FailureSource`` that replays sorted failure timestamps (seconds); with ``classes``
    (one per timestamp) ``next_failure`` also says each failure's class."""

    def __init__(self, times_s, *, start_s: float = 0.0, classes=None):
        times = np.asarray(times_s, dtype=float).ravel()
        if not np.all(np.isfinite(times)):
            raise InputError("failure trace timestamps must be finite seconds")
        if times.size and np.any(np.diff(times) < 0):
            raise InputError("failure trace timestamps must be sorted in increasing order")
        if not math.isfinite(start_s):
            raise InputError(f"trace start_s must be a finite number of seconds, got {start_s!r}")
        # Failures before the job starts cannot hit it.
        kept = times >= start_s
        self._times = (times[kept] - start_s).tolist()
        if classes is None:
            self._classes = [0] * len(self._times)
        else:
            classes = np.asarray(classes).ravel()
            if classes.shape != times.shape:
                raise InputError("a failure trace needs one class for each timestamp")
            self._classes = classes[kept].tolist()
        self._next = 0

    def __len__(self) -> int:
        return len(self._times)

    def next_failure_s(self) -> float:
        if self._next >= len(self._times):
            return math.inf
        self._next += 1
        return self._times[self._next - 1]

    def next_failure(self) -> tuple[float, object]:
        """The next failure time and its class (``math.inf`` and 0 when there are no more)."""
        if self._next >= len(self._times):
            return math.inf, 0
        self._next += 1
        return self._times[self._next - 1], self._classes[self._next - 1]


def coverage(failure_times, walls_h, seed=None) -> dict | None:
    """How replicas of ``walls_h`` hours sat in a replayed trace (an array of failure times in
    seconds, a ``ClassTrace``, or a ``TraceStart`` with the run's ``seed``; None for no
    trace): ``span_h`` to its last failure, ``first_h`` to its first after the start (None if
    none), ``past_end`` replicas that ran beyond the trace left after their start (optimistic:
    no failures came there), ``longest_h``, ``replicas``, and for a ``TraceStart`` ``fixed``
    (every replica started at 0: the job needs the whole trace)."""
    walls = np.asarray(walls_h, dtype=float)
    if isinstance(failure_times, TraceStart):
        draw = failure_times
        if not draw.times.size:
            return None
        left_h = draw.remaining_s(seed, walls.size) / 3600.0
        hitting = draw.times[draw.times > 0]
        return {
            "span_h": draw.span / 3600.0,
            "first_h": float(hitting[0]) / 3600.0 if hitting.size else None,
            "past_end": int((walls > left_h).sum()),
            "longest_h": float(walls.max()),
            "replicas": int(walls.size),
            "fixed": draw.fixed,
        }
    if isinstance(failure_times, ClassTrace):
        failure_times = failure_times.times_s
    if not isinstance(failure_times, np.ndarray) or not failure_times.size:
        return None
    hitting = failure_times[failure_times > 0]
    span_h = float(failure_times[-1]) / 3600.0
    return {
        "span_h": span_h,
        "first_h": float(hitting[0]) / 3600.0 if hitting.size else None,
        "past_end": int((walls > span_h).sum()),
        "longest_h": float(walls.max()),
        "replicas": int(walls.size),
    }


def read_trace(path, *, time_column: str | None = None, unit: str = "h") -> np.ndarray:
    """Sorted failure times (s since the job's start) from the log at ``path``; one-line errors.

    The log is read by the reader and the rules ``ckptsim fit`` uses
    (``simulator.fitting.faillog.read_failure_times``: CSV or Parquet, the time column named or
    recognised, blank times refused, rows at one instant one failure). Numbers are times since
    the job started in ``unit`` (s, min, h or d; hours by default, as ``ckptsim fit`` reads a
    log). Dates are parsed by pandas; the job starts at the first of them (that row marks the
    start, it is not a failure that hits the job).
    """
    return read_trace_log(path, time_column=time_column, unit=unit).times_s


def read_causes(
    path, *, time_column: str | None = None, unit: str = "h", cause_column: str | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """The failure times of :func:`read_trace` and each one's cause (as text, in the same
    order), from the log's cause column (``cause_column``, or one ``ckptsim fit`` recognises
    by name: cause, category, reason, type). A failure without a cause is an error: a replay
    against failure classes needs each one's class."""
    log = read_trace_log(path, time_column=time_column, unit=unit, cause_column=cause_column,
                         causes=True)  # fmt: skip
    return log.times_s, log.causes


def read_trace_log(
    path,
    *,
    time_column: str | None = None,
    unit: str = "h",
    cause_column: str | None = None,
    causes: bool = False,
    system_column: str | None = None,
):
    """The log as ``faillog.FailureTimes`` (times, causes, the columns used and the notes of
    what the reading rules merged), with a failure without a cause refused when ``causes``."""
    from simulator.fitting.faillog import read_failure_times

    log = read_failure_times(
        path,
        unit=unit,
        time_column=time_column,
        cause_column=cause_column,
        causes=causes,
        system_column=system_column,
    )
    if causes:
        blank = np.array([c is None for c in log.causes], dtype=bool)
        if blank.any():
            col = log.columns.get("cause")
            row = int(np.min(log.rows[blank])) + 1
            raise InputError(
                f"{path}: column {str(col)!r} row {row}: a failure with no cause "
                f"({int(blank.sum()):,} in all), so no failure class to replay it as; fill them "
                "in, or leave those rows out"
            )
    return log


def classes_of(causes, classes, mapping: dict[str, str] | None = None) -> np.ndarray:
    """Each cause's failure class: ``mapping[cause]`` (cause -> class name) where given, else
    the cause itself when it names a class. One-line errors for a mapping to no class and for
    causes that map to none (the first few named, with how to map them)."""
    names = list(classes)
    mapping = dict(mapping or {})
    bad = sorted({v for v in mapping.values() if v not in names})
    if bad:
        raise InputError(
            f"--cause-class maps to {bad[0]!r}, which is no failure class of the scenario "
            f"(classes: {', '.join(names)})"
        )
    causes = np.asarray(causes, dtype=object)
    out = np.array([mapping.get(c, c) for c in causes.tolist()], dtype=object)
    unmapped = sorted({c for c in causes.tolist() if mapping.get(c, c) not in names})
    if unmapped:
        shown = ", ".join(repr(c) for c in unmapped[:5]) + (" ..." if len(unmapped) > 5 else "")
        raise InputError(
            f"{len(unmapped)} cause{'s' if len(unmapped) > 1 else ''} in the trace "
            f"map{'' if len(unmapped) > 1 else 's'} to no "
            f"failure class ({shown}): map each with --cause-class CAUSE=CLASS (classes: "
            f"{', '.join(names)})"
        )
    return out


def trace_mtbf_s(times_s) -> float:
    """The mean time between the trace's failures: its span over its count (s)."""
    times = np.asarray(times_s, dtype=float)
    return float(times[-1]) / times.size


class TraceStart:
    """A replica's failure times: the trace replayed from a start drawn from its own stream.

    The start is uniform over [0, span - ``keep_s``], so a replica that runs ``keep_s`` still
    has trace ahead of it (give the job's expected *wall* time, with a margin: a replica's
    wall time, not its work, is what it spends in the trace); times are relative to the start.
    When ``keep_s`` is the whole span or more, every replica starts at 0 and replays the same
    failures (``fixed``). Picklable, so worker processes and both engines take it as
    ``failure_times``; ``remaining_s`` recovers each replica's trace left after its start.
    """

    def __init__(self, times_s, keep_s: float = 0.0, classes=None):
        times = np.asarray(times_s, dtype=float)
        order = np.argsort(times, kind="stable")
        self.times = times[order]
        self.classes = None if classes is None else np.asarray(classes, dtype=object)[order]
        self.span = float(self.times[-1]) if self.times.size else 0.0
        self.wanted_s = max(0.0, float(keep_s))
        self.keep_s = min(self.wanted_s, self.span)

    @property
    def fixed(self) -> bool:
        """Whether every replica starts at 0 (the job needs the whole trace or more)."""
        return self.keep_s >= self.span

    def start_s(self, rng: np.random.Generator) -> float:
        return float(rng.uniform(0.0, self.span - self.keep_s))

    def __call__(self, rng: np.random.Generator):
        start = self.start_s(rng)
        kept = self.times >= start
        if self.classes is None:
            return self.times[kept] - start
        return ClassTrace(self.times[kept] - start, self.classes[kept])

    def remaining_s(self, seed, replicas: int) -> np.ndarray:
        """The trace left after each replica's start (s), for a run of ``replicas`` from
        ``seed``: the engines hand replica i the GPU stream of ``replica_seed(seed, i)``."""
        from simulator.engines.streams import GPU, replica_seed, replica_streams

        starts = [self.start_s(replica_streams(replica_seed(seed, i))[GPU]) for i in
                  range(replicas)]  # fmt: skip
        return self.span - np.asarray(starts, dtype=float)
