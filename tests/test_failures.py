"""Lifetime families against scipy.stats, Monte Carlo, and renewal theory."""

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import integrate, stats

from simulator.errors import InputError
from simulator.model.failures import (
    Empirical,
    Exponential,
    LogNormal,
    MinOf,
    Weibull,
    first_failure,
    long_run_rate,
    parse_failure,
    system_mtbf_s,
)

HOUR = 3600.0
shapes = st.floats(0.3, 4.0)
sigmas = st.floats(0.2, 2.0)
means = st.floats(10.0, 1e6)
quantiles = st.floats(0.01, 0.99)


def lifetimes():
    return st.one_of(
        means.map(Exponential),
        st.builds(Weibull.from_mean, means, shapes),
        st.builds(LogNormal.from_mean, means, sigmas),
    )


def reference(life):
    """The same distribution built directly in scipy.stats (nobody here wrote it)."""
    if isinstance(life, Exponential):
        return stats.expon(scale=life.mean)
    if isinstance(life, Weibull):
        return stats.weibull_min(life.shape, scale=life.scale)
    return stats.lognorm(life.sigma, scale=life.scale)


@settings(max_examples=60, deadline=None)
@given(lifetimes(), quantiles)
def test_survival_pdf_and_mean_match_scipy(life, q):
    ref = reference(life)
    t = float(ref.ppf(q))
    assert float(life.survival(t)) == pytest.approx(ref.sf(t), rel=1e-9, abs=1e-12)
    assert float(life.cdf(t)) == pytest.approx(ref.cdf(t), rel=1e-9, abs=1e-12)
    assert float(life.pdf(t)) == pytest.approx(ref.pdf(t), rel=1e-9)
    assert life.mean_s == pytest.approx(ref.mean(), rel=1e-9)
    assert float(life.ppf(q)) == pytest.approx(t, rel=1e-9)


@settings(max_examples=60, deadline=None)
@given(lifetimes(), quantiles)
def test_hazard_is_density_over_survival_and_survival_is_one_minus_cdf(life, q):
    t = float(life.ppf(q))
    assert float(life.hazard(t)) == pytest.approx(
        float(life.pdf(t)) / float(life.survival(t)), rel=1e-7
    )
    assert float(life.survival(t)) + float(life.cdf(t)) == pytest.approx(1.0)


@settings(max_examples=40, deadline=None)
@given(lifetimes(), quantiles)
def test_density_is_minus_the_slope_of_survival(life, q):
    t = float(life.ppf(q))
    h = 1e-5 * t
    slope = (float(life.survival(t + h)) - float(life.survival(t - h))) / (2 * h)
    assert -slope == pytest.approx(float(life.pdf(t)), rel=1e-4)


@settings(max_examples=30, deadline=None)
@given(lifetimes())
def test_survival_before_age_zero_is_one(life):
    assert np.all(life.survival(np.array([-5.0, 0.0])) == 1.0)


@pytest.mark.parametrize(
    "life",
    [Exponential(50.0), Weibull.from_mean(50.0, 0.7), Weibull(2.7, 80.0), LogNormal(0.8, 40.0)],
    ids=["exponential", "weibull-0.7", "weibull-2.7", "lognormal"],
)
def test_sample_mean_is_within_monte_carlo_error_of_mean(life):
    x = life.sample(np.random.default_rng(7), 40_000)
    assert abs(x.mean() - life.mean_s) < 5 * x.std() / math.sqrt(x.size)


@settings(max_examples=30, deadline=None)
@given(st.floats(1.0, 1e6), st.floats(0.0, 5.0))
def test_weibull_with_shape_one_is_exponential(scale, t_rel):
    w, e = Weibull(1.0, scale), Exponential(scale)
    t = t_rel * scale
    assert float(w.survival(t)) == pytest.approx(float(e.survival(t)), rel=1e-12)
    assert float(w.hazard(t)) == pytest.approx(float(e.hazard(t)), rel=1e-12)
    assert w.mean_s == pytest.approx(e.mean_s, rel=1e-12)


@pytest.mark.parametrize("shape", [0.6, 2.5])
def test_first_failure_of_weibull_matches_minimum_of_sampled_lifetimes(shape):
    rng = np.random.default_rng(11)
    component, n = Weibull(shape, 1000.0), 64
    mins = component.sample(rng, (4000, n)).min(axis=1)
    assert stats.kstest(mins, first_failure(component, n).cdf).pvalue > 1e-3


@pytest.mark.parametrize("component", [Exponential(500.0), Weibull(0.7, 500.0), Weibull(3, 500)])
def test_min_of_agrees_with_closed_form_first_failure(component):
    n = 1000
    closed, generic = first_failure(component, n), MinOf(component, n)
    assert not isinstance(closed, MinOf)
    t = np.linspace(0.0, 3 * closed.mean_s, 7)
    np.testing.assert_allclose(generic.survival(t), closed.survival(t), rtol=1e-9)
    np.testing.assert_allclose(generic.ppf([0.1, 0.5, 0.9]), closed.ppf([0.1, 0.5, 0.9]), 1e-9)
    assert generic.mean_s == pytest.approx(closed.mean_s, rel=1e-6)


def test_first_failure_of_lognormal_matches_minimum_of_sampled_lifetimes():
    component, n = LogNormal(1.0, 100.0), 20
    mins = component.sample(np.random.default_rng(3), (4000, n)).min(axis=1)
    assert stats.kstest(mins, first_failure(component, n).cdf).pvalue > 1e-3


@pytest.mark.parametrize(
    "life",
    [Exponential(100.0), Weibull(0.7, 100.0), Weibull(2.7, 100.0), LogNormal(1.0, 100.0)],
    ids=["exponential", "weibull-0.7", "weibull-2.7", "lognormal"],
)
def test_residual_life_has_the_conditional_distribution(life):
    age = 80.0
    x = life.residual_sample(np.random.default_rng(5), age, 4000)

    def conditional_cdf(r):
        return 1.0 - life.survival(age + r) / life.survival(age)

    assert np.all(x >= 0)
    assert stats.kstest(x, conditional_cdf).pvalue > 1e-3


def test_residual_life_of_the_first_of_n_is_the_first_of_n_residuals():
    component, n, age = Weibull(2.0, 100.0), 8, 50.0
    rng = np.random.default_rng(9)
    direct = MinOf(component, n).residual_sample(rng, age, 3000)
    via_components = component.residual_sample(rng, np.full((3000, n), age)).min(axis=1)
    assert stats.ks_2samp(direct, via_components).pvalue > 1e-3


def test_empirical_resamples_and_survives_like_its_data():
    data = np.array([1.0, 2.0, 2.0, 5.0])
    e = Empirical(data)
    assert e.mean_s == pytest.approx(2.5)
    np.testing.assert_allclose(e.survival([0.5, 2.0, 4.0, 6.0]), [1.0, 0.25, 0.25, 0.0])
    assert set(e.sample(np.random.default_rng(0), 100)) <= set(data)
    assert e.with_mean(5.0).mean_s == pytest.approx(5.0)


def _censored_weibull(n=4000, shape=0.7, seed=1):
    rng = np.random.default_rng(seed)
    life = Weibull(shape, 1000.0)
    t, c = life.sample(rng, n), rng.uniform(0, 3000.0, n)  # about half censored
    return life, np.minimum(t, c), t <= c


def test_empirical_from_a_censored_log_recovers_the_true_survival():
    # Kaplan-Meier: the censored lifetimes count as survivors, so the drawn lifetimes are not
    # the short ones alone (resampling the failures only would put the median near 170 s).
    life, x, obs = _censored_weibull()
    assert 0.3 < 1 - obs.mean() < 0.7
    e = Empirical(x, obs)
    q = life.ppf(np.array([0.1, 0.25, 0.5, 0.75, 0.8]))
    np.testing.assert_allclose(e.survival(q), life.survival(q), atol=0.025)
    draws = e.sample(np.random.default_rng(2), 20000)
    np.testing.assert_allclose((draws[:, None] > q).mean(axis=0), life.survival(q), atol=0.03)
    naive = np.median(x[obs])
    assert np.median(draws) == pytest.approx(
        float(life.ppf(0.5)), rel=0.1
    ) and naive < 0.6 * np.median(draws)


def test_empirical_tail_beyond_the_longest_time_is_exponential_with_the_logs_mean():
    x, obs = np.array([1.0, 2.0, 4.0]), np.array([True, False, False])
    e = Empirical(x, obs)  # KM: S = 2/3 after t=1 and nothing more is seen
    theta = x.sum() / obs.sum()  # 7 s of exposure per failure
    assert e.tail_mass == pytest.approx(2 / 3) and e.tail_mean_s == pytest.approx(theta)
    assert e.mean_s == pytest.approx(1 / 3 * 1.0 + 2 / 3 * (4.0 + theta))
    t = np.array([0.5, 1.0, 3.9, 4.0, 10.0])
    want = [1.0, 2 / 3, 2 / 3, 2 / 3, 2 / 3 * math.exp(-6.0 / theta)]
    np.testing.assert_allclose(e.survival(t), want)
    draws = e.sample(np.random.default_rng(0), 200000)
    assert draws.mean() == pytest.approx(e.mean_s, rel=0.01)
    assert (draws == 1.0).mean() == pytest.approx(1 / 3, abs=0.005)
    scaled = e.with_mean(100.0)
    assert scaled.mean_s == pytest.approx(100.0)
    np.testing.assert_allclose(scaled.survival(t * 100 / e.mean_s), e.survival(t))


def test_empirical_residual_lives_follow_the_conditional_survival():
    _, x, obs = _censored_weibull(n=2000)
    e = Empirical(x, obs)
    age = float(e.ppf(0.3))
    r = e.residual_sample(np.random.default_rng(3), np.full(40000, age))
    grid = np.array([0.0, 50.0, 300.0, 1500.0, 6000.0])
    want = e.survival(age + grid) / e.survival(age)
    np.testing.assert_allclose((r[:, None] > grid).mean(axis=0), want, atol=0.01)


def test_empirical_stationary_residual_has_the_renewal_mean():
    # In equilibrium the remaining life has mean E[L^2] / (2 E[L]) (renewal theory).
    from simulator.model.failure_source import stationary_residual

    _, x, obs = _censored_weibull(n=2000)
    e = Empirical(x, obs)
    t0, th = e.tail_start_s, e.tail_mean_s
    second = e.probs @ e.times**2 + e.tail_mass * (t0**2 + 2 * t0 * th + 2 * th**2)
    r = stationary_residual(e, np.random.default_rng(4), 400000)
    assert r.mean() == pytest.approx(second / (2 * e.mean_s), rel=0.02)


@pytest.mark.parametrize(
    ("spec", "kind"),
    [
        ("exponential", Exponential),
        ("weibull:shape=0.7", Weibull),
        ("Weibull: shape = 2.5", Weibull),
        ("lognormal:sigma=1.2", LogNormal),
    ],
)
def test_parse_failure_builds_the_family_with_the_given_mean(spec, kind):
    life = parse_failure(spec, 5 * HOUR)
    assert isinstance(life, kind)
    assert life.mean_s == pytest.approx(5 * HOUR, rel=1e-12)


@pytest.mark.parametrize(
    "spec",
    [
        "",
        "gamma",
        "weibull",
        "weibull:",
        "weibull:shape",
        "weibull:shape=abc",
        "weibull:sigma=1",
        "weibull:shape=-1",
        "weibull:shape=0",
        "weibull:shape=nan",
        "lognormal:sigma=0",
        "exponential:shape=1",
        "exponential:1",
    ],
)
def test_parse_failure_rejects_bad_specs_with_input_error(spec):
    with pytest.raises(InputError):
        parse_failure(spec, HOUR)


@pytest.mark.parametrize("mean_s", [0.0, -1.0, math.nan, math.inf])
def test_parse_failure_rejects_a_non_positive_mean(mean_s):
    for spec in ("exponential", "weibull:shape=1", "lognormal:sigma=1"):
        with pytest.raises(InputError):
            parse_failure(spec, mean_s)


@pytest.mark.parametrize("n", [0, -3, 2.5, True, math.nan, "many"])
def test_cluster_helpers_reject_a_bad_component_count(n):
    for fn in (first_failure, long_run_rate, system_mtbf_s, MinOf):
        with pytest.raises(InputError):
            fn(Exponential(10.0), n)


def test_weibull_cluster_settles_to_n_over_mean_yet_first_failure_comes_much_sooner():
    # n components, each replaced on failure: a superposition of renewal processes.
    rng = np.random.default_rng(2024)
    component, n = Weibull.from_mean(1.0, 0.7), 50
    horizon = 4000.0 * component.mean_s
    per_component = int(horizon / component.mean_s * 1.3) + 200
    arrivals = np.cumsum(component.sample(rng, (n, per_component)), axis=1)
    assert np.all(arrivals[:, -1] > horizon)  # enough renewals drawn to cover the horizon
    rate = np.count_nonzero(arrivals <= horizon) / horizon
    assert rate == pytest.approx(long_run_rate(component, n), rel=0.03)
    assert system_mtbf_s(component, n) == pytest.approx(1.0 / long_run_rate(component, n))
    # The first failure of n fresh components: young Weibull(0.7) parts fail early.
    first = component.sample(rng, (2000, n)).min(axis=1)
    assert first.mean() < 0.4 * system_mtbf_s(component, n)
    assert first.mean() == pytest.approx(first_failure(component, n).mean_s, rel=0.1)


def test_minof_mean_is_the_integral_of_its_survival():
    m = MinOf(LogNormal(1.0, 100.0), 10)
    value, _ = integrate.quad(lambda t: float(m.survival(t)), 0, np.inf, limit=200)
    assert m.mean_s == pytest.approx(value, rel=1e-6)
