"""Trace replay: drive the simulated job's failures from recorded timestamps.

Instead of drawing failure times from a lifetime model, a replica can replay the failures a
real cluster logged (for Titan, ``simulator.titan.failure_times_for_subset``). Any sorted array
of timestamps works; they are shifted so the job starts at ``start_s`` into the trace, and the
trace simply runs out (no more failures) after its last entry.

``read_trace`` turns a user's failure log (CSV or Parquet: one column of failure times, as
numbers in a unit or as timestamps pandas parses) into such an array, taken relative to the
first failure; ``TraceStart`` makes each replica replay it from its own random start, so
replicas of a trace differ.
"""

from __future__ import annotations

import math
import warnings

import numpy as np

from simulator.errors import InputError

__all__ = ["UNITS_S", "TraceFailures", "TraceStart", "read_trace", "trace_mtbf_s"]

UNITS_S = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}
"""Seconds per unit of a log's numbers (``--unit``)."""

# Column names taken for the failure time when the user names none (case-insensitive).
_TIME_NAMES = ("time", "timestamp", "failure_time", "time_s", "t", "date", "datetime", "when")


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


def read_trace(path, *, time_column: str | None = None, unit: str = "s") -> np.ndarray:
    """Sorted failure times (s since the job's start) from the log at ``path``; one-line errors.

    The column is ``time_column``, or the only column, or one named like a time (``time``,
    ``timestamp``, ...). Numbers are seconds (or ``unit``: min, h, d) since the job started.
    Anything else is parsed as timestamps by pandas (ISO 8601 and the like); the job starts at
    the first of them (that row marks the start, it is not a failure that hits the job).
    """
    import pandas as pd

    if unit not in UNITS_S:
        raise InputError(f"unit must be one of {', '.join(UNITS_S)}, got {unit!r}")
    text = str(path)
    try:
        if text.endswith(".parquet"):
            df = pd.read_parquet(text)
        else:
            df = pd.read_csv(text)
    except FileNotFoundError:
        raise InputError(f"{text}: no such file") from None
    except (OSError, ValueError, UnicodeDecodeError, ImportError) as exc:
        reason = getattr(exc, "strerror", None) or str(exc).splitlines()[0]
        raise InputError(f"cannot read failure log {text}: {reason}") from None
    if df.empty:
        raise InputError(f"{text}: the failure log has no rows")
    column = _time_column(df, time_column, text)
    values = df[column].dropna()
    if values.empty:
        raise InputError(f"{text}: column {column!r} holds no failure times")
    numbers = pd.to_numeric(values, errors="coerce")
    if numbers.notna().all():
        seconds = np.sort(numbers.to_numpy(dtype=float) * UNITS_S[unit])
    else:
        with warnings.catch_warnings():  # "could not infer format": each row parsed alone
            warnings.simplefilter("ignore", UserWarning)
            stamps = pd.to_datetime(values, errors="coerce", utc=True)
        bad = values[stamps.isna()]
        if not bad.empty:
            raise InputError(
                f"{text}: {bad.iloc[0]!r} in column {column!r} is neither a number nor a timestamp"
            )
        seconds = np.sort((stamps - stamps.min()).dt.total_seconds().to_numpy(dtype=float))[1:]
    if not np.all(np.isfinite(seconds)) or np.any(seconds < 0):
        raise InputError(f"{text}: failure times must be finite and not negative")
    if seconds.size < 1 or seconds[-1] <= 0:
        raise InputError(f"{text}: the log holds no failure after the job's start")
    return seconds


def trace_mtbf_s(times_s) -> float:
    """The mean time between the trace's failures: its span over its count (s)."""
    times = np.asarray(times_s, dtype=float)
    return float(times[-1]) / times.size


def _time_column(df, wanted: str | None, where: str) -> str:
    if wanted is not None:
        if wanted not in df.columns:
            raise InputError(
                f"{where}: no column {wanted!r} (columns: {', '.join(map(str, df.columns))})"
            )
        return wanted
    if len(df.columns) == 1:
        return str(df.columns[0])
    by_name = {str(c).lower(): str(c) for c in df.columns}
    for name in _TIME_NAMES:
        if name in by_name:
            return by_name[name]
    raise InputError(
        f"{where}: which column holds the failure times? give --time-column "
        f"(columns: {', '.join(map(str, df.columns))})"
    )


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
