"""Trace replay: drive the simulated job's failures from recorded timestamps.

Instead of drawing failure times from a lifetime model, a replica can replay the failures a
real cluster logged (for Titan, ``simulator.fitting.titan.failure_times_for_subset``). Any
sorted array of timestamps works; they are shifted so the job starts at ``start_s`` into the
trace, and the trace simply runs out (no more failures) after its last entry.

``read_trace`` turns a user's failure log (CSV or Parquet, read as ``ckptsim fit`` reads it:
one column of failure times, numbers since the job's start or dates from the first) into
such an array; ``TraceStart`` makes each replica replay it from its own random start, so
replicas of a trace differ.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import InputError

__all__ = ["TraceFailures", "TraceStart", "coverage", "read_trace", "trace_mtbf_s"]


class TraceFailures:
    """A ``FailureSource`` that replays sorted failure timestamps (seconds)."""

    def __init__(self, times_s, *, start_s: float = 0.0):
        times = np.asarray(times_s, dtype=float).ravel()
        if not np.all(np.isfinite(times)):
            raise InputError("failure trace timestamps must be finite seconds")
        if times.size and np.any(np.diff(times) < 0):
            raise InputError("failure trace timestamps must be sorted in increasing order")
        if not math.isfinite(start_s):
            raise InputError(f"trace start_s must be a finite number of seconds, got {start_s!r}")
        # Failures before the job starts cannot hit it.
        self._times = (times[times >= start_s] - start_s).tolist()
        self._next = 0

    def __len__(self) -> int:
        return len(self._times)

    def next_failure_s(self) -> float:
        if self._next >= len(self._times):
            return math.inf
        self._next += 1
        return self._times[self._next - 1]


def coverage(failure_times, walls_h) -> dict | None:
    """How replicas of ``walls_h`` hours sat in a trace replayed from its start (failure times
    in seconds, an array; None for a per-replica window, ``TraceStart``, or no trace):
    ``span_h`` to its last failure, ``first_h`` to its first after time 0 (None if none),
    ``past_end`` replicas that ran beyond the last (optimistic: no failures came there),
    ``longest_h`` and ``replicas``."""
    if not isinstance(failure_times, np.ndarray) or not failure_times.size:
        return None
    walls = np.asarray(walls_h, dtype=float)
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

    The log is read as ``ckptsim fit`` reads it (``simulator.fitting.faillog``: CSV or Parquet, the
    time column named or recognised). Numbers are times since the job started in ``unit``
    (s, min, h or d; hours by default, as ``ckptsim fit`` reads a log). Dates are parsed by
    pandas; the job starts at the first of them (that row marks the start, it is not a failure
    that hits the job).
    """
    from simulator.fitting.faillog import UNITS, parse_times, pick_column, read_table

    if unit not in UNITS:
        raise InputError(f"unit must be one of {', '.join(UNITS)}, got {unit!r}")
    df = read_table(path)
    where = str(path)
    if df.empty:
        raise InputError(f"{where}: the failure log has no rows")
    column = pick_column(df, "time", time_column, required=True)
    values = df[column].dropna()
    if values.empty:
        raise InputError(f"{where}: column {column!r} holds no failure times")
    seconds, dates = parse_times(values, column, UNITS[unit])
    seconds = np.sort(seconds)
    if dates:
        seconds = (seconds - seconds[0])[1:]
    if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
        raise InputError(f"{where}: failure times must be finite and not negative")
    if seconds.size < 1 or seconds[-1] <= 0:
        raise InputError(f"{where}: the log holds no failure after the job's start")
    return seconds


def trace_mtbf_s(times_s) -> float:
    """The mean time between the trace's failures: its span over its count (s)."""
    times = np.asarray(times_s, dtype=float)
    return float(times[-1]) / times.size


class TraceStart:
    """A replica's failure times: the trace replayed from a start drawn from its own stream.

    The start is uniform over [0, span - ``keep_s``] (so a job of that length still has trace
    ahead of it where it can); times are relative to the start. Picklable, so worker
    processes and both engines take it as ``failure_times``.
    """

    def __init__(self, times_s, keep_s: float = 0.0):
        self.times = np.sort(np.asarray(times_s, dtype=float))
        self.span = float(self.times[-1]) if self.times.size else 0.0
        self.keep_s = max(0.0, min(float(keep_s), self.span))

    def __call__(self, rng: np.random.Generator) -> np.ndarray:
        start = rng.uniform(0.0, self.span - self.keep_s)
        return self.times[self.times >= start] - start
