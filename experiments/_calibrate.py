"""Closed-form helpers shared by the studies that set a preset against its published outcome.

``llama3_calibration`` and ``presets_check`` both ask what a published outcome allows of a cost
its source did not publish: the optimum of a scenario with some fields replaced
(:func:`optimum`), and the largest value of one field whose optimum still wastes at most a
given fraction of the wall time (:func:`largest_within`).
"""

from __future__ import annotations

import math

from scipy import optimize

from simulator.recommend import recommend


def optimum(s, **overrides) -> dict:
    """``recommend`` for scenario ``s`` with the given fields replaced."""
    return recommend(s.with_overrides(**overrides))


def largest_within(s, field: str, bound: float, *, low: float = 0.0, **fixed) -> float | None:
    """The largest ``field`` whose optimum wastes at most ``bound`` (None: not even ``low`` does).

    The waste at the optimum grows with the save stall δ (``checkpoint_s``) and with the
    restart cost R (``restart_s``), so the answer is the root of waste − bound, bracketed by
    doubling from 1 s. ``fixed`` holds the other fields to replace.
    """

    def excess(value: float) -> float:
        return optimum(s, **fixed, **{field: value})["optimal_waste_fraction"] - bound

    if excess(low) > 0:
        return None
    hi = max(1.0, 2.0 * low)
    while excess(hi) < 0:
        hi *= 2
        if hi > 1e12:  # a waste that never reaches the bound (bound >= 1)
            return math.inf
    return optimize.brentq(excess, low, hi, xtol=1e-3)
