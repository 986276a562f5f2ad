"""The ranges every number of a scenario lies in: one rule for its fields, its tiers' and its
failure classes'.

Every number must be finite and lie in a documented range (``MAX_GPUS``, ``MIN_SECONDS`` to
``MAX_HOURS``, ``MAX_USD``, ``MAX_BYTES``): wide enough for any real job, narrow enough that
every answer is a finite number of the right unit (no overflow in an exponential of 1e308 s).
"""

from __future__ import annotations

import math

from simulator.errors import InputError

__all__ = ["MAX_BYTES", "MAX_GPUS", "MAX_HOURS", "MAX_USD", "MIN_SECONDS", "UNIT_RANGE", "check"]

MAX_GPUS = 100_000_000
"""Most GPUs (or nodes, or spares) a scenario may have: 500x the largest cluster built by 2025,
and past it the per-GPU state of a single simulated replica alone outgrows memory."""
MAX_HOURS = 1e15
"""Longest duration accepted (hours, ~1e11 years). Huge MTBFs stand for "no failures", so the
cap is generous; it keeps every product of a duration, a GPU count and a price finite."""
MIN_SECONDS = 1e-6
"""Shortest positive duration accepted (seconds): nothing real is quicker than a microsecond,
and values like 1e-300 s only produce intervals of denormal seconds."""
MAX_USD = 1e6
"""Highest price accepted (per GPU-hour or per GB-month): keeps every cost a finite number."""
MAX_BYTES = 1e18
"""Largest checkpoint (an exabyte); bandwidths lie between 1 byte/s and this per second."""

UNIT_RANGE = {
    "hours": (MIN_SECONDS / 3600.0, MAX_HOURS),
    "seconds": (MIN_SECONDS, MAX_HOURS * 3600.0),
    "US dollars": (0.0, MAX_USD),
    "bytes": (1.0, MAX_BYTES),
    "bytes per second": (1.0, MAX_BYTES),
    "nodes": (0, MAX_GPUS),
    "GPUs": (1, MAX_GPUS),
    "checkpoints": (1, 1_000_000),
}
"""(lowest, highest) value of each unit; zero is allowed apart from the range where a field
says so."""


def check(name: str, value, unit: str, *, allow_zero: bool = False) -> None:
    """A finite number in the unit's range (``UNIT_RANGE``); zero too with ``allow_zero``. A
    unit not in the table is only checked to be finite and positive (or zero)."""
    if value is None:
        return
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise InputError(f"{name} must be a number of {unit}, got {value!r}")
    bad = value < 0 if allow_zero else value <= 0
    if not math.isfinite(value) or bad:
        sign = "non-negative" if allow_zero else "positive"
        raise InputError(f"{name} must be a {sign} number of {unit}, got {value!r}")
    if unit not in UNIT_RANGE:
        return
    low, high = UNIT_RANGE[unit]
    if value > high or (value < low and not (allow_zero and value == 0)):
        raise InputError(f"{name} must be between {low:g} and {high:g} {unit}, got {value!r}")
