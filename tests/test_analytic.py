"""Closed forms against Daly (FGCS 2006), Table 1, a high-precision Lambert W, a numerical
minimiser, and an independent Monte-Carlo run of the renewal model they describe."""

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import optimize

from simulator import analytic

MIN = 60.0
HOUR = 3600.0

# Seconds: checkpoint costs from 1 s to ~3 h, MTBFs from 1 min to ~3 years, restarts to ~3 h.
deltas = st.floats(min_value=1.0, max_value=1e4)
mtbfs = st.floats(min_value=60.0, max_value=1e8)
restarts = st.floats(min_value=0.0, max_value=1e4)


# The paper rounds to the digits shown, so each value must agree to half its last digit.
@pytest.mark.parametrize(
    ("mtbf_min", "published_min", "half_digit"),
    [(24 * 60, 117, 0.5), (6 * 60, 57, 0.5), (15, 9.1, 0.05)],
)
def test_daly_higher_order_matches_published_table(mtbf_min, published_min, half_digit):
    tau = analytic.daly_interval(5 * MIN, mtbf_min * MIN) / MIN
    assert tau == pytest.approx(published_min, abs=half_digit)


@pytest.mark.parametrize("ratio", [1e-14, 1e-9, 1e-6, 1e-4, 1e-3, 0.05, 0.5, 1.0, 3.0, 40.0])
def test_exact_optimum_matches_lambert_w_at_60_digits(ratio):
    mp = pytest.importorskip("mpmath")
    with mp.workdps(60):
        reference = 1 + mp.lambertw(-mp.exp(-1 - mp.mpf(ratio)))
    # Near the branch point (tiny δ/M) a plain double-precision W₀ loses ~log10(M/δ) digits.
    assert analytic.optimal_interval(ratio, 1.0) == pytest.approx(float(reference.real), rel=1e-13)


@pytest.mark.parametrize(
    ("delta", "mtbf", "restart"),
    [(60.0, 3.09 * HOUR, 600.0), (300.0, 12 * HOUR, 1800.0), (5 * MIN, 15 * MIN, 10 * MIN)],
)
def test_exact_optimum_agrees_with_a_numerical_minimiser(delta, mtbf, restart):
    def wall(log_tau):
        return analytic.daly_wall_time(np.exp(log_tau), delta, mtbf, restart, 100 * HOUR)

    found = optimize.minimize_scalar(
        wall, bounds=(0.0, np.log(10 * mtbf)), method="bounded", options={"xatol": 1e-10}
    )
    assert analytic.optimal_interval(delta, mtbf) == pytest.approx(np.exp(found.x), rel=1e-4)


@settings(max_examples=200, deadline=None)
@given(delta=deltas, mtbf=mtbfs, restart=restarts, factor=st.floats(1e-3, 1e3))
def test_no_interval_has_a_shorter_expected_wall_time_than_the_exact_optimum(
    delta, mtbf, restart, factor
):
    best = analytic.optimal_interval(delta, mtbf)
    at_best = analytic.daly_wall_time(best, delta, mtbf, restart, HOUR)
    other = analytic.daly_wall_time(best * factor, delta, mtbf, restart, HOUR)
    # Near τ* the difference is second order and can fall below float rounding of T_w.
    assert at_best <= other * (1 + 1e-12)


@settings(max_examples=200, deadline=None)
@given(delta=deltas, mtbf=mtbfs, restart=restarts)
def test_expected_wall_time_is_flat_at_the_exact_optimum(delta, mtbf, restart):
    best = analytic.optimal_interval(delta, mtbf)
    h = best * 1e-5

    def slope(tau):  # dT_w/dτ scaled by τ/T_w, by central differences of the formula itself
        up = analytic.daly_wall_time(tau + h, delta, mtbf, restart, HOUR)
        down = analytic.daly_wall_time(tau - h, delta, mtbf, restart, HOUR)
        return (
            (up - down) / (2 * h) * tau / analytic.daly_wall_time(tau, delta, mtbf, restart, HOUR)
        )

    assert abs(slope(best)) < 1e-7
    assert slope(best * 0.8) < 0 < slope(best * 1.25)


def test_exact_optimum_does_not_move_with_restart_cost():
    taus = np.geomspace(60.0, 20 * HOUR, 20001)
    for restart in (0.0, 600.0, 3 * HOUR):
        wall = analytic.daly_wall_time(taus, 120.0, 4 * HOUR, restart, HOUR)
        grid_best = taus[np.argmin(wall)]
        assert grid_best == pytest.approx(analytic.optimal_interval(120.0, 4 * HOUR), rel=1e-3)


def _daly_beats_young(delta, mtbf):
    exact = analytic.optimal_interval(delta, mtbf)
    daly = analytic.daly_interval(delta, mtbf)
    young = analytic.young_interval(delta, mtbf)
    return np.abs(daly - exact) <= np.abs(young - exact)


@settings(max_examples=300, deadline=None)
@given(delta=deltas, mtbf=mtbfs)
def test_daly_higher_order_is_closer_to_the_exact_optimum_than_young(delta, mtbf):
    """Measured, not assumed: on a dense grid of δ/M from 1e-10 to 100 (the next test) and
    under hypothesis, Daly's τ is never farther from τ* than Young's — for δ < 2M, where the
    series applies, and also for δ >= 2M, where Daly's τ = M while Young's exceeds 2M and
    τ* < M. The expected wall time agrees: Daly's is never longer than Young's."""
    assert _daly_beats_young(delta, mtbf)
    walls = analytic.daly_wall_time(
        np.array([analytic.daly_interval(delta, mtbf), analytic.young_interval(delta, mtbf)]),
        delta,
        mtbf,
        0.0,
        HOUR,
    )
    assert walls[0] <= walls[1] * (1 + 1e-12)


def test_daly_higher_order_beats_young_on_a_dense_grid_of_checkpoint_to_mtbf_ratios():
    ratio = np.geomspace(1e-10, 100.0, 50_000)
    assert _daly_beats_young(ratio, 1.0).all()
    # The gap is real, not rounding: at δ = M/100 Young is ~5 % long, Daly ~1e-5 short.
    exact = analytic.optimal_interval(0.01, 1.0)
    assert analytic.young_interval(0.01, 1.0) / exact - 1 > 0.04
    assert abs(analytic.daly_interval(0.01, 1.0) / exact - 1) < 1e-4


def test_daly_returns_the_mtbf_once_a_checkpoint_costs_twice_the_mtbf():
    mtbf = np.array([100.0, 100.0, 100.0, 100.0])
    delta = np.array([199.0, 200.0, 250.0, 1e6])
    tau = analytic.daly_interval(delta, mtbf)
    assert tau[0] != pytest.approx(100.0)
    np.testing.assert_array_equal(tau[1:], mtbf[1:])


def test_functions_broadcast_arrays_and_return_floats_for_scalars():
    delta = np.array([30.0, 60.0, 120.0])[:, None]  # shape (3, 1)
    mtbf = np.array([HOUR, 10 * HOUR])  # shape (2,)
    for fn in (analytic.young_interval, analytic.daly_interval, analytic.optimal_interval):
        grid = fn(delta, mtbf)
        assert isinstance(grid, np.ndarray) and grid.shape == (3, 2)
        one = fn(60.0, 10 * HOUR)
        assert isinstance(one, float) and grid[1, 1] == pytest.approx(one, rel=1e-15)
    first = analytic.daly_first_order_interval(delta, mtbf, 600.0)
    assert first.shape == (3, 2)
    wall = analytic.daly_wall_time(np.array([600.0, 1200.0]), 60.0, HOUR, 600.0, delta)
    assert wall.shape == (3, 2)
    waste = analytic.waste_fraction(np.array([600.0, 1200.0]), delta, HOUR, 600.0)
    assert waste.shape == (3, 2)
    assert isinstance(analytic.waste_fraction(600.0, 60.0, HOUR, 600.0), float)


def test_daly_first_order_is_young_with_the_restart_added_to_the_mtbf():
    assert analytic.daly_first_order_interval(60.0, HOUR, 0.0) == analytic.young_interval(
        60.0, HOUR
    )
    assert analytic.daly_first_order_interval(60.0, HOUR, 600.0) > analytic.young_interval(
        60.0, HOUR
    )


@settings(max_examples=200, deadline=None)
@given(delta=deltas, mtbf=mtbfs, restart=restarts, tau_over_mtbf=st.floats(1e-6, 20.0))
def test_waste_fraction_lies_strictly_between_zero_and_one(delta, mtbf, restart, tau_over_mtbf):
    tau = tau_over_mtbf * mtbf
    # Once T_w/Ts passes 2^53, 1 − Ts/T_w rounds to exactly 1 in doubles.
    assume(analytic.daly_wall_time(tau, delta, mtbf, restart, 1.0) < 1e15)
    waste = analytic.waste_fraction(tau, delta, mtbf, restart)
    assert 0.0 < waste < 1.0
    wall = analytic.daly_wall_time(tau, delta, mtbf, restart, 7.0)
    assert waste == pytest.approx(1 - 7.0 / wall, rel=1e-12, abs=1e-15)


def _simulate_segment_times(rng, segment_s, restart_s, mtbf_s, n):
    """Time to finish ``n`` segments of τ + δ under exponential failures; failures also strike
    restarts (a failed restart starts over), as in Daly's model. Vectorised over segments."""
    total = np.zeros(n)
    restarting = np.zeros(n, dtype=bool)
    active = np.ones(n, dtype=bool)
    while active.any():
        idx = np.flatnonzero(active)
        need = np.where(restarting[idx], restart_s, segment_s)
        until_failure = rng.exponential(mtbf_s, idx.size)
        ok = until_failure >= need
        total[idx] += np.where(ok, need, until_failure)
        active[idx[ok & ~restarting[idx]]] = False
        restarting[idx] = ~ok
    return total


def test_daly_wall_time_matches_a_monte_carlo_run_of_the_renewal_model():
    tau, delta, mtbf, restart = 1.0 * HOUR, 10 * MIN, 2.0 * HOUR, 1.0 * HOUR
    n = 20_000
    times = _simulate_segment_times(np.random.default_rng(20060301), tau + delta, restart, mtbf, n)
    mean, se = times.mean(), times.std(ddof=1) / np.sqrt(n)
    per_segment = analytic.daly_wall_time(tau, delta, mtbf, restart, tau)  # Ts = τ: one segment
    assert abs(mean - per_segment) < 4 * se
    # Discriminating: the model that lets restarts never fail, (M + R)·(e^((τ+δ)/M) − 1),
    # is ~10 % lower here and must be rejected by the same run.
    restarts_never_fail = (mtbf + restart) * np.expm1((tau + delta) / mtbf)
    assert abs(mean - restarts_never_fail) > 4 * se


def test_a_refreshed_tier_is_youngs_without_refreshes_and_its_interval_minimises_its_waste():
    from scipy.optimize import minimize_scalar

    from simulator.analytic import refreshed_age_s, refreshed_interval, refreshed_saves_per_s

    assert refreshed_interval(10.0, 1e-4, 0.0) == pytest.approx(math.sqrt(2 * 10.0 / 1e-4))
    assert refreshed_interval(1.0, 1e-6, 1e-12) == pytest.approx(math.sqrt(2e6), rel=1e-6)
    assert refreshed_interval(10.0, 0.0, 1e-3) == math.inf  # nothing rolls back to it
    assert refreshed_age_s(100.0, 0.0) == 50.0 and refreshed_saves_per_s(100.0, 0.0) == 0.01
    assert refreshed_age_s(math.inf, 0.5) == 2.0 and refreshed_saves_per_s(math.inf, 0.5) == 0
    # Series and direct form meet where they switch (x = ρτ = 1e-3).
    assert refreshed_age_s(0.999e-3, 1.0) == pytest.approx(refreshed_age_s(1.001e-3, 1.0), 3e-3)
    for cost, rate, rho in [(300.0, 1 / 72000, 1 / 3600), (10.0, 1 / 3.6e5, 1 / 3.6e4),
                            (600.0, 1 / 3600, 1 / 3.6e5)]:  # fmt: skip

        def waste(log_tau, cost=cost, rate=rate, rho=rho):
            tau = math.exp(log_tau)
            return cost * refreshed_saves_per_s(tau, rho) + rate * refreshed_age_s(tau, rho)

        best = refreshed_interval(cost, rate, rho)
        near = minimize_scalar(waste, bracket=(math.log(best) - 1, math.log(best) + 1))
        assert best == pytest.approx(math.exp(near.x), rel=1e-3)
        assert waste(math.log(best)) <= waste(near.x) * (1 + 1e-12)
        assert waste(math.log(best)) < rate / rho  # better than saving only on refreshes
