"""Closed-form helpers shared by the studies that set a preset against its published outcome.

``llama3_calibration`` and ``presets_check`` both ask what a published outcome allows of a cost
its source did not publish: the optimum of a scenario with some fields replaced
(:func:`optimum`), and the largest value of one field whose optimum still wastes at most a
given fraction of the wall time (:func:`largest_within`); and the work a failure loses on
average, to set against a published figure (:func:`lost_since_save_s`).
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


def lost_since_save_s(segment_s: float, mtbf_s: float) -> float:
    """Expected time since the last completed save when an exponential failure strikes.

    A failure within a segment of ``segment_s`` (one interval and its save) falls at time t
    with density ∝ e^(−t/M) on [0, L): E[t] = M − L / (e^(L/M) − 1), which is L/2 when L << M.
    """
    x = segment_s / mtbf_s
    if x < 1e-8:
        return segment_s / 2.0
    return mtbf_s - segment_s / math.expm1(x)
