"""Trace replay: drive the simulated job's failures from recorded timestamps.

Instead of drawing failure times from a lifetime model, a replica can replay the failures a
real cluster logged (for Titan, ``simulator.titan.failure_times_for_subset``). Any sorted array
of timestamps works; they are shifted so the job starts at ``start_s`` into the trace, and the
trace simply runs out (no more failures) after its last entry.
"""

from __future__ import annotations

import math

import numpy as np

from simulator.errors import InputError

__all__ = ["TraceFailures"]


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
