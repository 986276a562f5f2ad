"""Online estimates a running job learns about itself: its failure rate and its save cost.

The failure rate uses the conjugate Gamma–Poisson model: with a Gamma(α, β) prior on the rate λ
(α prior failures over β prior seconds of exposure), observing k failures over T seconds gives
Gamma(α + k, β + T). The prior comes from the scenario (the cluster's expected MTBF) with a
weight saying how many failures' worth of belief it carries, so a cluster that turns out
flakier than assumed tightens the interval after a few restarts, not after dozens.

Save cost and iteration time are tracked as exponentially weighted means, so a change in
storage speed shows up within a few saves while one slow outlier does not swing the interval.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.errors import InputError

__all__ = ["FailureRatePosterior", "RunningMean"]


@dataclass(frozen=True)
class FailureRatePosterior:
    """Gamma posterior on a failure rate (per second). Immutable: ``observe`` returns a new one."""

    failures: float
    """α: prior plus observed failures."""
    exposure_s: float
    """β: prior plus observed exposure, seconds."""

    def __post_init__(self):
        if not (self.failures > 0 and self.exposure_s > 0):
            raise InputError(
                f"failure-rate posterior needs positive failures and exposure_s, got "
                f"{self.failures!r} and {self.exposure_s!r}"
            )

    @classmethod
    def from_prior(cls, mtbf_s: float, weight: float = 2.0) -> FailureRatePosterior:
        """A prior centred on ``mtbf_s`` worth ``weight`` observed failures."""
        if not (math.isfinite(mtbf_s) and mtbf_s > 0):
            raise InputError(f"prior MTBF must be a positive number of seconds, got {mtbf_s!r}")
        return cls(failures=float(weight), exposure_s=float(weight) * float(mtbf_s))

    def observe(self, failures: int, exposure_s: float) -> FailureRatePosterior:
        """Update with ``failures`` seen over ``exposure_s`` seconds of running."""
        if failures < 0 or exposure_s < 0:
            raise InputError("observed failures and exposure must be non-negative")
        return FailureRatePosterior(self.failures + failures, self.exposure_s + exposure_s)

    @property
    def rate_per_s(self) -> float:
        """Posterior mean rate."""
        return self.failures / self.exposure_s

    @property
    def mtbf_s(self) -> float:
        """The MTBF the policy uses: 1 / posterior mean rate."""
        return self.exposure_s / self.failures

    def rate_interval(self, level: float = 0.95) -> tuple[float, float]:
        """Equal-tailed credible interval for the rate, per second."""
        from scipy import stats  # lazy: every training process imports this module

        g = stats.gamma(self.failures, scale=1.0 / self.exposure_s)
        lo, hi = g.ppf([(1 - level) / 2, (1 + level) / 2])
        return float(lo), float(hi)


class RunningMean:
    """Exponentially weighted mean; the first sample is taken as is."""

    def __init__(self, alpha: float = 0.3, initial: float | None = None):
        if not 0 < alpha <= 1:
            raise InputError(f"alpha must be in (0, 1], got {alpha!r}")
        self.alpha = alpha
        self.value = initial
        self.count = 0

    def update(self, sample: float) -> float:
        sample = float(sample)
        self.value = (
            sample if self.value is None else (self.alpha * sample + (1 - self.alpha) * self.value)
        )
        self.count += 1
        return self.value
