"""Money: what failures and checkpoints cost a training job, in US dollars.

A cluster is paid for by the GPU-hour whether its time is useful or not, so the failure-free
ideal day costs ``gpus × usd_per_gpu_hour × 24`` and the money lost per day is that times the
waste fraction (checkpoint stalls, work redone after failures, restarts: everything except
useful compute). Retained checkpoints add a storage bill, ``bytes × retained / 1e9 ×
usd_per_gb_month`` per month, spread over the 365.25/12-day average month. For a whole job of
``work_h`` failure-free hours, the expected bill scales with the expected wall time (Daly's T_w
for exponential failures, ``expected_wall_h``) instead of ``work_h``.

Pure functions (numpy arrays broadcast through the arithmetic ones) and frozen records.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator import analytic
from simulator.errors import InputError

__all__ = [
    "DAYS_PER_MONTH",
    "DailyCost",
    "JobCost",
    "daily_cost",
    "expected_wall_h",
    "gpu_usd_per_day",
    "job_cost",
    "storage_usd_per_day",
    "usd_lost_per_day",
]

HOURS_PER_DAY = 24.0
DAYS_PER_MONTH = 365.25 / 12.0
BYTES_PER_GB = 1e9


def _check(name: str, value, unit: str, *, allow_zero: bool = True, allow_inf=False) -> None:
    if value is None:
        return
    bad = value < 0 if allow_zero else value <= 0
    finite = math.isfinite(value) or (allow_inf and value == math.inf)
    if isinstance(value, bool) or not finite or bad:
        sign = "non-negative" if allow_zero else "positive"
        raise InputError(f"{name} must be a {sign} number of {unit}, got {value!r}")


def gpu_usd_per_day(gpus, usd_per_gpu_hour):
    """The failure-free ideal: what one day of the whole job costs, US dollars."""
    return gpus * usd_per_gpu_hour * HOURS_PER_DAY


def usd_lost_per_day(gpus, usd_per_gpu_hour, waste_fraction):
    """US dollars per day paid for GPU time that did no useful work."""
    return gpu_usd_per_day(gpus, usd_per_gpu_hour) * waste_fraction


def storage_usd_per_day(checkpoint_bytes, checkpoints_retained, usd_per_gb_month):
    """US dollars per day to keep ``checkpoints_retained`` checkpoints on storage."""
    gb = checkpoint_bytes * checkpoints_retained / BYTES_PER_GB
    return gb * usd_per_gb_month / DAYS_PER_MONTH


def expected_wall_h(interval_s, checkpoint_s, mtbf_s, restart_s, work_h):
    """Expected wall-clock hours to finish ``work_h`` of compute (Daly's T_w, exponential)."""
    return analytic.daly_wall_time(interval_s, checkpoint_s, mtbf_s, restart_s, work_h)


@dataclass(frozen=True, kw_only=True)
class DailyCost:
    """One day of the job, US dollars."""

    ideal_usd: float
    """GPU time for one day (``gpus × usd_per_gpu_hour × 24``): the bill with no failures."""
    lost_usd: float
    """The part of ``ideal_usd`` spent on checkpoint stalls, redone work and restarts."""
    storage_usd: float | None = None
    """Retained checkpoints on storage for one day; None when size or price is unknown."""

    def __post_init__(self):
        _check("ideal_usd", self.ideal_usd, "US dollars")
        _check("lost_usd", self.lost_usd, "US dollars")
        _check("storage_usd", self.storage_usd, "US dollars")
        if self.lost_usd > self.ideal_usd:
            raise InputError(
                f"lost_usd ({self.lost_usd} US dollars) exceeds ideal_usd ({self.ideal_usd})"
            )

    @property
    def useful_usd(self) -> float:
        """GPU time that went into useful compute."""
        return self.ideal_usd - self.lost_usd

    @property
    def total_usd(self) -> float:
        """GPU time plus storage (storage counted as zero when unknown)."""
        return self.ideal_usd + (self.storage_usd or 0.0)


@dataclass(frozen=True, kw_only=True)
class JobCost:
    """A whole job of ``work_h`` failure-free hours, US dollars."""

    work_h: float
    """Failure-free compute the job needs, hours."""
    expected_wall_h: float
    """Expected wall-clock time with failures and checkpoints, hours."""
    ideal_usd: float
    """GPU time for ``work_h`` hours: the bill with no failures and free checkpoints."""
    expected_usd: float
    """GPU time for ``expected_wall_h`` hours, plus storage over that time when known."""
    storage_usd: float | None = None
    """Storage of retained checkpoints over ``expected_wall_h``; None when unknown."""

    def __post_init__(self):
        # An infinite expected wall time is a real answer (saves far slower than the MTBF).
        _check("work_h", self.work_h, "hours", allow_zero=False)
        _check("expected_wall_h", self.expected_wall_h, "hours", allow_zero=False, allow_inf=True)
        _check("ideal_usd", self.ideal_usd, "US dollars")
        _check("expected_usd", self.expected_usd, "US dollars", allow_inf=True)
        _check("storage_usd", self.storage_usd, "US dollars", allow_inf=True)
        if self.expected_wall_h < self.work_h:
            raise InputError(
                f"expected_wall_h ({self.expected_wall_h} hours) is below work_h "
                f"({self.work_h} hours)"
            )

    @property
    def excess_usd(self) -> float:
        """What failures and checkpoints add to the ideal bill."""
        return self.expected_usd - self.ideal_usd


def daily_cost(
    *,
    gpus: int,
    usd_per_gpu_hour: float,
    waste_fraction: float,
    checkpoint_bytes: float | None = None,
    checkpoints_retained: int = 2,
    usd_per_gb_month: float | None = None,
) -> DailyCost:
    """The cost of one day of the job; storage only when its size and price are both given."""
    _check("gpus", gpus, "GPUs", allow_zero=False)
    _check("usd_per_gpu_hour", usd_per_gpu_hour, "US dollars")
    if not 0.0 <= waste_fraction <= 1.0:
        raise InputError(f"waste_fraction must lie in [0, 1], got {waste_fraction!r}")
    storage = None
    if checkpoint_bytes is not None and usd_per_gb_month is not None:
        _check("checkpoint_bytes", checkpoint_bytes, "bytes")
        _check("checkpoints_retained", checkpoints_retained, "checkpoints")
        _check("usd_per_gb_month", usd_per_gb_month, "US dollars")
        storage = float(
            storage_usd_per_day(checkpoint_bytes, checkpoints_retained, usd_per_gb_month)
        )
    return DailyCost(
        ideal_usd=float(gpu_usd_per_day(gpus, usd_per_gpu_hour)),
        lost_usd=float(usd_lost_per_day(gpus, usd_per_gpu_hour, waste_fraction)),
        storage_usd=storage,
    )


def job_cost(
    *,
    gpus: int,
    usd_per_gpu_hour: float,
    work_h: float,
    expected_wall_h: float,
    storage_usd_per_day: float | None = None,
) -> JobCost:
    """Ideal against expected cost of a whole job, given its expected wall time (hours)."""
    _check("gpus", gpus, "GPUs", allow_zero=False)
    _check("usd_per_gpu_hour", usd_per_gpu_hour, "US dollars")
    _check("storage_usd_per_day", storage_usd_per_day, "US dollars")
    storage = None
    if storage_usd_per_day is not None:
        storage = storage_usd_per_day * expected_wall_h / HOURS_PER_DAY
    gpu_time = gpus * usd_per_gpu_hour * expected_wall_h
    return JobCost(
        work_h=work_h,
        expected_wall_h=expected_wall_h,
        ideal_usd=gpus * usd_per_gpu_hour * work_h,
        expected_usd=gpu_time + (storage or 0.0),
        storage_usd=storage,
    )
