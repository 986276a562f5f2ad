"""The fits' 95% intervals cover the truth about 95% of the time, whatever the censoring.

One sample can miss by bad luck; the frequency over many samples is what a 95% interval
promises, so it is what is tested (at 0-90% independent censoring).
"""

import numpy as np
import pytest

from simulator.fitting.fit import fit_lifetime, km_check
from simulator.model.failures import LogNormal, Weibull

HOUR = 3600.0


def censored(life, n, rate, rng):
    x = life.sample(rng, n)
    if rate == 0:
        return x, np.ones(n, bool)
    # Exponential censoring whose mean gives about ``rate`` censored (found on a big sample).
    big, e = life.sample(rng, 20_000), rng.exponential(1.0, 20_000)
    lo, hi = 1e-3 * life.mean_s, 1e4 * life.mean_s
    for _ in range(50):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if np.mean(e * mid < big) > rate else (lo, mid)
    c = rng.exponential(np.sqrt(lo * hi), n)
    return np.minimum(x, c), x <= c


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.6, 0.9])
@pytest.mark.parametrize(
    ("life", "family", "truth"),
    [
        (Weibull(0.7, 50 * HOUR), "weibull", {"shape": 0.7, "scale_s": 50 * HOUR}),
        (LogNormal(1.2, 10 * HOUR), "lognormal", {"sigma": 1.2, "scale_s": 10 * HOUR}),
    ],
)
def test_intervals_cover_the_true_parameters_at_their_nominal_rate(life, family, truth, rate):
    rng = np.random.default_rng(1000 + int(100 * rate))
    replicates, hits = 40, {k: 0 for k in truth}
    for _ in range(replicates):
        t, obs = censored(life, 1500, rate, rng)
        fit = fit_lifetime(t, obs, family)
        for name, value in truth.items():
            lo, hi = fit.ci95[name]
            hits[name] += lo <= value <= hi
    for name, hit in hits.items():
        # 40 draws of a 95% interval: fewer than 34 hits has probability < 0.2%.
        assert hit >= 34, (family, rate, name, hit)


def test_the_true_family_stays_near_kaplan_meier_and_a_wrong_one_does_not():
    rng = np.random.default_rng(3)
    t, obs = censored(Weibull(0.5, 20 * HOUR), 2000, 0.5, rng)
    right = km_check(t, obs, fit_lifetime(t, obs, "weibull"))
    wrong = km_check(t, obs, fit_lifetime(t, obs, "exponential"))
    assert right["max_gap"] < 0.06 and wrong["max_gap"] > 0.12
    assert right["in_band"] > 0.9 > wrong["in_band"]
