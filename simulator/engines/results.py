"""Simulation results: one record per replica, and the distribution they describe.

Each replica of the discrete-event model yields a record (wall time, useful and lost work,
checkpoint and recovery overhead in hours; failures and checkpoints counted; cost in US
dollars). ``SimulationResult`` holds them as a pandas DataFrame and summarises each column by
its mean, standard deviation, a 95% confidence interval for the mean (Student's t) and the
50th/90th/99th percentiles — the tail, not just the mean, is what a schedule has to survive.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from decimal import ROUND_CEILING, ROUND_FLOOR, Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
from scipy import stats

from simulator.errors import InputError

__all__ = [
    "METRICS",
    "PART_PREFIXES",
    "SimulationResult",
    "describe",
    "goal_verdict",
    "is_part",
    "mean_ci",
]

METRICS = (
    "wall_h",
    "useful_h",
    "lost_h",
    "checkpoint_h",
    "recovery_h",
    "spare_wait_h",
    "waste_fraction",
    "failures",
    "checkpoints",
    "failures_in_recovery",
    "usd",
)

PART_PREFIXES = ("failures_", "saves_", "restores_", "lost_by_", "recovery_by_")
"""A tiered run's per-part columns: failures, lost work (h) and recovery (h) per failure
class (``failures_gpu``, ``lost_by_gpu_h``, ``recovery_by_gpu_h``), saves and restores per
tier (``saves_memory``, ``restores_memory``)."""


def failure_label(scenario) -> str:
    """The failure model in a run's header: the family, or the classes and their families."""
    classes = scenario.failure_classes
    if not classes:
        return scenario.failure
    families = ", ".join(sorted({c.failure for c in classes}))
    return f"{len(classes)} failure class{'es' if len(classes) != 1 else ''}: {families}"


def is_part(column: str) -> bool:
    """Whether ``column`` is one of a tiered run's per-class or per-tier columns."""
    return column.startswith(PART_PREFIXES) and column != "failures_in_recovery"


"""Columns that ``summary()`` describes (``usd`` only when a price was given)."""

OUT_SUFFIXES = (".csv", ".parquet", ".pq")
"""Extensions ``SimulationResult.to_file`` writes."""


def mean_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """Mean and Student's t confidence interval of the mean: (mean, low, high).

    One value has no interval (NaN bounds); when every value agrees the interval collapses
    onto the mean. The one place the project computes this: summaries, sweeps and paired
    policy differences all call it.
    """
    x = np.asarray(values, dtype=float).ravel()
    n = x.size
    if n == 0:
        return math.nan, math.nan, math.nan
    mean = float(x.mean())
    if n < 2:
        return mean, math.nan, math.nan
    half = float(stats.t.ppf(0.5 + level / 2, n - 1) * x.std(ddof=1) / math.sqrt(n))
    return mean, mean - half, mean + half


MIN_REPEATS = 6
"""The fewest values with a 95 % interval of the median (:func:`median_ci`): with 5, even the
smallest and largest value cover the median with probability 1 - 2 / 2^5 < 95 %. Below it no
goal can be judged (:func:`ratio_intervals`)."""


def median_ci(values, level: float = 0.95) -> tuple[float, float, float]:
    """Median and distribution-free confidence interval of the median: (median, low, high).

    The bounds are order statistics chosen from the binomial distribution
    (``scipy.stats.quantile_test``; for 10 values the 2nd and 9th smallest, for 20 the 6th and
    15th, the ranks of published tables such as Le Boudec, *Performance Evaluation of Computer
    and Communication Systems*, Table A.1), so the interval holds whatever the distribution.
    Timings on a shared machine call for it: a repeat now and then stalls for a multiple of the
    others (a neighbour's burst of I/O), which moves a mean and widens its t-interval without
    saying anything about the code measured (Hoefler and Belli, "Scientific benchmarking of
    parallel computing systems", SC'15: check normality before assuming it, else report the
    median with a nonparametric interval). Too few values for ``level`` (fewer than
    :data:`MIN_REPEATS` at 95 %) give NaN bounds; so does any value that is not finite (a
    failed measurement).
    """
    x = np.asarray(values, dtype=float).ravel()
    if x.size == 0 or not np.isfinite(x).all():  # a NaN sorts last and would pass unseen
        return math.nan, math.nan, math.nan
    median = float(np.median(x))
    ci = stats.quantile_test(x, q=median, p=0.5).confidence_interval(level)
    return median, float(ci.low), float(ci.high)


def ratio_intervals(values, *, rate: bool) -> dict[str, Any]:
    """The two views of per-repeat ratios (one code path against a baseline, repeat by repeat)
    a goal is judged on, by :func:`ratio_verdict`.

    - The typical repeat: the median and its distribution-free interval (:func:`median_ci`),
      which a neighbour's stall of one repeat does not move.
    - The expected cost: the mean of the per-repeat time ratios with Student's t interval
      (:func:`mean_ci`), the arithmetic mean being the one that sums costs. It counts every
      slow repeat in full, so a slow path the code takes in a minority of repeats, which the
      median cannot see, fails it. Per repeat, a stall of the baseline alone can give back at
      most that repeat's time, never more. (Total time over total time, tried instead, is free
      of this view's bias against the code under noise both sides share, E[a/b] > E[a]/E[b],
      but credits the code with every stall only the baseline takes: in one 60-repeat run on
      the project's VM the raw write stalled >2x its median in 7 repeats, the save in 2; a code
      path 3x slow in 9 of 60 repeats, beside a baseline stalled 3x in 18 others, came out
      "met". This view errs on the safe side.) With ``rate`` the ratios are rates (bandwidth
      against the baseline's, higher is better): each repeat's time ratio is 1 / ratio, and
      the mean and its bounds are turned back into a rate (an interval reaching 0 time leaves
      the rate unbounded above). Otherwise the ratios are times already (a stall over a save).

    Where the typical repeat has no interval (fewer than :data:`MIN_REPEATS` repeats, or a
    value that is not finite), neither has the expected cost: Student's t over 2-5 timings
    that now and then stall for a multiple of the others can reach 0 or a negative time, a
    rate of "0.27 to inf" that says nothing (the verdict is "not shown" there either way).
    :func:`no_interval` says which of the two it was.

    Returns n, the median with ``low``/``high``, ``expected`` with ``expected_low``/
    ``expected_high``, and the ``values``.
    """
    x = [float(v) for v in values]
    median, low, high = median_ci(x)
    if rate:
        m, lo, hi = mean_ci([1 / v if v else math.inf for v in x])

        def back(c: float) -> float:
            return math.inf if c <= 0 else 1 / c  # NaN stays NaN

        expected, e_low, e_high = back(m), back(hi), back(lo)
    else:
        expected, e_low, e_high = mean_ci(x)
    if low != low:  # too few repeats (or a failed one): no interval in either view
        e_low = e_high = math.nan
    return dict(n=len(x), median=median, low=low, high=high) | dict(
        expected=expected, expected_low=e_low, expected_high=e_high, values=x
    )


def no_interval(point: dict[str, Any]) -> str | None:
    """Why a :func:`ratio_intervals` point has no interval, in words for a report ("too few
    repeats", "a failed repeat"), or None where it has one."""
    if point["low"] == point["low"]:
        return None
    return "too few repeats" if point["n"] < MIN_REPEATS else "a failed repeat"


def interval_texts(point: dict[str, Any], spec: str = ".2f") -> tuple[str, str]:
    """A :func:`ratio_intervals` point's two intervals as a report prints them, ``"low to
    high"`` in format ``spec``, or ``"— (too few repeats)"`` / ``"— (a failed repeat)"``
    where it has none (:func:`no_interval`): the typical repeat's, then the expected cost's."""
    why = no_interval(point)
    if why is not None:
        return (f"— ({why})",) * 2
    return (
        "{} to {}".format(*outward(point["low"], point["high"], spec)),
        "{} to {}".format(*outward(point["expected_low"], point["expected_high"], spec)),
    )


def outward(low: float, high: float, spec: str = ".2f") -> tuple[str, str]:
    """An interval's bounds as text in fixed-point format ``spec`` (``".2f"``), rounded
    outward: the low end down, the high end up, so the printed interval holds the computed
    one and a bound that misses a goal never reads as meeting it (a low end of 0.8997 against
    a goal of 0.90 prints 0.89, not 0.90). Infinite bounds print as Python formats them."""
    digits = int(spec.strip(".f"))
    step = Decimal(1).scaleb(-digits)

    def text(value: float, rounding: str) -> str:
        value = float(value)  # a numpy float's repr is "np.float64(...)"
        if not math.isfinite(value) or abs(value) >= 2.0**53:  # an integer already: exact
            return f"{value:{spec}}"
        rounded = Decimal(repr(value)).quantize(step, rounding=rounding)
        return f"{rounded.copy_abs() if rounded.is_zero() else rounded:f}"  # never "-0.00"

    return text(low, ROUND_FLOOR), text(high, ROUND_CEILING)


def ratio_verdict(points, *, at_least: float | None = None, at_most: float | None = None) -> str:
    """:func:`goal_verdict` of :func:`ratio_intervals` points: *met* only when at every point
    both the typical repeat's and the expected cost's whole intervals meet the goal."""
    views = [(p["median"], p["low"], p["high"]) for p in points]
    views += [(p["expected"], p["expected_low"], p["expected_high"]) for p in points]
    return goal_verdict(views, at_least=at_least, at_most=at_most)


def goal_verdict(intervals, *, at_least: float | None = None, at_most: float | None = None) -> str:
    """'met', 'not met' or 'not shown' for a goal checked at every measured point.

    ``intervals`` holds one ``(mean, low, high)`` per measured point (a size, a case, a
    comparison), as :func:`mean_ci` returns it (or a median and its interval, :func:`median_ci`:
    then "mean" below reads "median"). The goal is the value ``>= at_least`` and/or ``<=
    at_most``. Reports claim no more than the data show: *met* only when every point's whole
    interval meets the goal; *not met* when some point's mean misses it; *not shown* otherwise
    (an interval straddles the bound, or a point has one sample and so no interval).
    The one place every report and ``ckptsim bench`` decide a verdict.
    """
    if at_least is None and at_most is None:
        raise InputError("a goal needs at_least and/or at_most")
    points = [tuple(float(v) for v in p) for p in intervals]
    if not points:
        return "not shown"

    def ok(v: float) -> bool:
        return (at_least is None or v >= at_least) and (at_most is None or v <= at_most)

    if any(not math.isnan(m) and not ok(m) for m, _, _ in points):
        return "not met"
    if all(not (math.isnan(lo) or math.isnan(hi)) and ok(lo) and ok(hi) for _, lo, hi in points):
        return "met"
    return "not shown"


def describe(values) -> dict[str, Any]:
    """Mean, std, 95% t-interval of the mean, and p50/p90/p99 of one column.

    A column that is never negative (times, counts, dollars) has a mean that is not either, so
    its interval stops at 0 rather than showing, say, -0.1 failures (the truncated interval
    holds the true mean whenever the t-interval does)."""
    x = np.asarray(values, dtype=float)
    n = x.size
    mean, lo, hi = mean_ci(x, 0.95)
    if n and math.isfinite(lo) and float(x.min()) >= 0.0:
        lo = max(lo, 0.0)
    std = float(x.std(ddof=1)) if n > 1 else math.nan
    p50, p90, p99 = np.percentile(x, [50, 90, 99]) if n else [math.nan] * 3
    return {
        "mean": mean,
        "std": std,
        "ci95": [float(lo), float(hi)],
        "p50": float(p50),
        "p90": float(p90),
        "p99": float(p99),
    }


def check_replicas(replicas: object) -> int:
    """``replicas`` as a run's replica count, or a one-line InputError."""
    if isinstance(replicas, bool) or not isinstance(replicas, int) or replicas < 1:
        raise InputError(f"replicas must be a positive whole number, got {replicas!r}")
    return replicas


@dataclass(frozen=True)
class SimulationResult:
    """The replicas of one (scenario, policy) simulation."""

    records: pd.DataFrame
    """One row per replica, ordered by replica index."""
    scenario_name: str = "custom"
    policy_name: str = ""
    seed: int | None = None
    meta: dict[str, Any] = field(default_factory=dict)
    """Inputs worth echoing in a report (GPUs, MTBF, interval...)."""

    @classmethod
    def of_run(
        cls, records: pd.DataFrame, *, scenario, policy, seed: int, trace: bool, engine: str
    ) -> SimulationResult:
        """The result of one engine's replicas (``records`` in replica order), with the
        inputs every engine echoes: one schema whichever engine ran."""
        records.insert(0, "replica", np.arange(len(records)))
        meta = {
            "gpus": scenario.gpus,
            "work_h": scenario.work_h,
            "mtbf_h": scenario.system_mtbf_s / 3600.0 if scenario.has_mtbf else None,
            "failure": "trace" if trace else failure_label(scenario),
            "checkpoint_stall_s": scenario.save_stall_s,
            "recovery_s": scenario.recovery_s,
            "engine": engine,
        }
        return cls(
            records=records,
            scenario_name=scenario.name,
            policy_name=getattr(policy, "name", type(policy).__name__),
            seed=seed,
            meta=meta,
        )

    @property
    def replicas(self) -> int:
        return len(self.records)

    def summary(self) -> dict[str, Any]:
        """Flat dict: ``<metric>_mean``, ``_std``, ``_ci95`` ([low, high]), ``_p50/_p90/_p99``."""
        out: dict[str, Any] = {
            "scenario": self.scenario_name,
            "policy": self.policy_name,
            "replicas": self.replicas,
            "seed": self.seed,
            **self.meta,
        }
        # A tiered run also counts failures per class and saves and restores per tier.
        per_part = [c for c in self.records if is_part(c)]
        for metric in (*METRICS, *(c for c in per_part if c not in METRICS)):
            if metric not in self.records:
                continue
            for key, value in describe(self.records[metric]).items():
                out[f"{metric}_{key}"] = value
        return out

    def to_file(self, path: str | Path) -> Path:
        """Write the per-replica records: ``.csv`` or ``.parquet`` by the file's extension.

        The file is replaced in one step (``simulator.outfile.write_atomic``): never half-written.
        """
        from simulator.outfile import check_output, write_atomic

        path = check_output(path, suffixes=OUT_SUFFIXES)
        if path.suffix.lower() == ".csv":
            write_atomic(path, lambda tmp: self.records.to_csv(tmp, index=False))
            return path
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(
                "Parquet output needs pyarrow (pip install ckptsim[parquet])"
            ) from None
        write_atomic(path, lambda tmp: self.records.to_parquet(tmp, index=False))
        return path
