"""Censored maximum-likelihood fits: recovery, model choice, censoring bias, scipy agreement."""

import json

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from simulator.errors import InputError
from simulator.fitting.fit import best_fit, fit_all, fit_lifetime, fits_table, plot_survival
from simulator.model.failures import Exponential, LogNormal, Weibull


def censored_sample(life, n, seed, censor_max):
    """Lifetimes from ``life``, right-censored by independent uniform(0, censor_max) limits."""
    rng = np.random.default_rng(seed)
    x = life.sample(rng, n)
    c = rng.uniform(0.0, censor_max, n)
    return np.minimum(x, c), x <= c


def covers(interval, value):
    lo, hi = interval
    return lo <= value <= hi


@pytest.mark.parametrize(
    ("life", "family", "truth"),
    [
        (Exponential(1000.0), "exponential", {"mean_s": 1000.0}),
        (Weibull(0.6, 1000.0), "weibull", {"shape": 0.6, "scale_s": 1000.0}),
        (Weibull(2.7, 1000.0), "weibull", {"shape": 2.7, "scale_s": 1000.0}),
        (LogNormal(0.8, 1000.0), "lognormal", {"sigma": 0.8, "scale_s": 1000.0}),
    ],
    ids=["exponential", "weibull-0.6", "weibull-2.7", "lognormal"],
)
def test_censored_fit_recovers_known_parameters_within_its_interval(life, family, truth):
    t, obs = censored_sample(life, 3000, seed=42, censor_max=2500.0)
    assert 0.2 < 1 - obs.mean() < 0.8  # a real share is censored
    result = fit_lifetime(t, obs, family)
    for name, value in truth.items():
        assert covers(result.ci95[name], value), (name, result.params, result.ci95[name])
        assert result.params[name] == pytest.approx(value, rel=0.1)
    assert covers(result.ci95["mean_s"], life.mean_s)
    assert result.n == 3000 and result.n_events == int(obs.sum())


@pytest.mark.parametrize(
    ("life", "family", "dist"),
    [
        (Weibull(0.6, 1000.0), "weibull", stats.weibull_min),
        (LogNormal(1.2, 1000.0), "lognormal", stats.lognorm),
    ],
)
def test_fit_matches_scipy_censored_data_fit(life, family, dist):
    t, obs = censored_sample(life, 600, seed=1, censor_max=3000.0)
    ours = fit_lifetime(t, obs, family)
    data = stats.CensoredData(uncensored=t[obs], right=t[~obs])
    p0, _, scale = dist.fit(data, floc=0)
    assert list(ours.params.values()) == pytest.approx([p0, scale], rel=1e-3)
    theirs = dist(p0, scale=scale)
    scipy_loglik = theirs.logpdf(t[obs]).sum() + theirs.logsf(t[~obs]).sum()
    assert ours.log_likelihood >= scipy_loglik - 1e-6


@pytest.mark.parametrize("family", ["exponential", "weibull", "lognormal"])
def test_log_likelihood_is_the_censored_sum_scipy_computes(family):
    t, obs = censored_sample(Weibull(1.5, 200.0), 500, seed=8, censor_max=400.0)
    result = fit_lifetime(t, obs, family)
    frozen = result.lifetime._frozen()
    expected = frozen.logpdf(t[obs]).sum() + frozen.logsf(t[~obs]).sum()
    assert result.log_likelihood == pytest.approx(expected, rel=1e-9)
    k = 1 if family == "exponential" else 2
    assert result.aic == pytest.approx(2 * k - 2 * expected, rel=1e-9)


def test_exponential_fit_is_events_over_exposure():
    t = np.array([10.0, 20.0, 30.0, 40.0])
    obs = np.array([True, False, True, False])
    assert fit_lifetime(t, obs, "exponential").params["mean_s"] == pytest.approx(100.0 / 2)


def test_aic_picks_weibull_for_infant_mortality_data():
    t, obs = censored_sample(Weibull(0.6, 1000.0), 2000, seed=3, censor_max=3000.0)
    ranked = fit_all(t, obs)
    assert ranked[0].family == "weibull"
    assert best_fit(t, obs).family == "weibull"
    assert ranked[-1].aic - ranked[0].aic > 10
    assert [r.aic for r in ranked] == sorted(r.aic for r in ranked)


def test_exponential_data_gives_weibull_shape_near_one_and_no_real_aic_gain():
    t, obs = censored_sample(Exponential(1000.0), 2000, seed=4, censor_max=3000.0)
    fits = {r.family: r for r in fit_all(t, obs)}
    assert covers(fits["weibull"].ci95["shape"], 1.0)
    # Nested models: AIC_exp - AIC_weib = LR - 2 with LR ~ chi2(1) under the exponential.
    assert fits["exponential"].aic - fits["weibull"].aic < stats.chi2.ppf(0.999, 1) - 2


def test_censored_fit_is_unbiased_where_ignoring_censoring_is_not():
    life = Weibull(1.5, 1000.0)
    t, obs = censored_sample(life, 4000, seed=12, censor_max=1500.0)
    honest = fit_lifetime(t, obs, "weibull")
    as_failures = fit_lifetime(t, np.ones_like(obs), "weibull")  # censored treated as failed
    failures_only = fit_lifetime(t[obs], obs[obs], "weibull")  # censored units dropped
    assert covers(honest.ci95["mean_s"], life.mean_s)
    for naive in (as_failures, failures_only):
        assert naive.ci95["mean_s"][1] < life.mean_s  # both biased short, beyond their CI


def test_exponential_interval_covers_the_truth_about_95_percent_of_the_time():
    life = Exponential(100.0)
    hits = [
        covers(
            fit_lifetime(*censored_sample(life, 80, seed, 200.0), "exponential").ci95["mean_s"],
            100.0,
        )
        for seed in range(400)
    ]
    assert 0.92 <= np.mean(hits) <= 0.98


@settings(max_examples=15, deadline=None)
@given(st.floats(1e-3, 1e6), st.integers(0, 10_000))
def test_weibull_fit_scales_with_the_time_unit(factor, seed):
    t, obs = censored_sample(Weibull(0.8, 50.0), 300, seed=seed, censor_max=150.0)
    a, b = fit_lifetime(t, obs, "weibull"), fit_lifetime(t * factor, obs, "weibull")
    assert b.params["shape"] == pytest.approx(a.params["shape"], rel=1e-4)
    assert b.params["scale_s"] == pytest.approx(a.params["scale_s"] * factor, rel=1e-4)


@pytest.mark.parametrize(
    ("durations", "observed", "family"),
    [
        ([1.0, -2.0, 3.0], [True, True, False], "weibull"),
        ([1.0, 0.0, 3.0], [True, True, False], "weibull"),
        ([1.0, np.nan], [True, True], "exponential"),
        ([1.0, 2.0, 3.0], [True, False], "exponential"),
        ([1.0, 2.0, 3.0], [False, False, False], "exponential"),
        ([], [], "exponential"),
        ([1.0, 2.0], [1, 2], "exponential"),
        ([1.0, 2.0], [True, True], "gamma"),
        ([1.0, 2.0, 3.0], [True, False, False], "weibull"),  # one failure: no shape to fit
    ],
)
def test_bad_input_raises_input_error(durations, observed, family):
    with pytest.raises(InputError):
        fit_lifetime(durations, observed, family)


def test_results_render_and_serialise():
    t, obs = censored_sample(Weibull(0.7, 100.0), 300, seed=2, censor_max=300.0)
    results = fit_all(t, obs)
    table = fits_table(results)
    assert all(r.family in table for r in results)
    assert "shape" in results[0].table() or "sigma" in results[0].table()
    json.dumps([r.to_dict() for r in results])


def test_plot_survival_draws_kaplan_meier_and_fits_on_a_given_axis():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    t, obs = censored_sample(Weibull(0.7, 100.0), 200, seed=2, censor_max=300.0)
    fig, ax = plt.subplots()
    returned = plot_survival(t, obs, fit_all(t, obs), ax=ax)
    assert returned is ax
    assert len(ax.get_lines()) == 4  # Kaplan–Meier + three fitted curves
    plt.close(fig)
