"""The vectorised engine: the DES's plain model, checked against the DES and Daly's formula."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from simulator import analytic, optimize
from simulator.engines import fast
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.policies import Adaptive, FixedInterval


def _trace(rng):
    return np.sort(rng.uniform(0.0, 300 * 3600.0, 120))


@pytest.mark.parametrize("policy", [FixedInterval(1800.0), FixedInterval(777.7), Adaptive()])
def test_replayed_trace_gives_the_des_numbers_replica_by_replica(policy):
    s = Scenario(gpus=64, mtbf_h=2.0, checkpoint_s=120, restart_s=300, work_h=40)
    fast = optimize.evaluate(s, [policy], replicas=6, seed=5, engine="fast", failure_times=_trace)
    des = optimize.evaluate(s, [policy], replicas=6, seed=5, engine="des", failure_times=_trace)
    for key in ("wall_s", "lost_s", "checkpoint_s", "recovery_s", "failures", "checkpoints"):
        np.testing.assert_allclose(fast[key], des[key], rtol=1e-9, atol=1e-6, err_msg=key)


def test_weibull_gpus_agree_with_the_des_within_monte_carlo_error():
    s = Scenario(
        gpus=32,
        gpu_mtbf_h=32 * 2.0,
        failure="weibull:shape=0.7",
        checkpoint_s=120,
        restart_s=300,
        work_h=40,
    )
    pol = [FixedInterval(1800.0)]
    des = optimize.evaluate(s, pol, replicas=60, seed=1, engine="des")["wall_s"][0]
    fast = optimize.evaluate(s, pol, replicas=1000, seed=2, engine="fast")["wall_s"][0]
    se = math.hypot(des.std(ddof=1) / math.sqrt(des.size), fast.std(ddof=1) / math.sqrt(fast.size))
    assert abs(des.mean() - fast.mean()) < 4 * se


def test_mean_wall_time_matches_dalys_expected_wall_time_on_exponential_failures():
    # Work a whole number of intervals, so every segment is τ + δ as in Daly's model.
    tau, delta, restart, mtbf = 1500.0, 120.0, 400.0, 7200.0
    s = Scenario(mtbf_h=mtbf / 3600, checkpoint_s=delta, restart_s=restart, work_h=tau * 200 / 3600)
    wall = fast.simulate_policies(s, [FixedInterval(tau)], replicas=400, seed=3).arrays["wall_s"]
    expected = analytic.daly_wall_time(tau, delta, mtbf, restart, s.work_s)
    se = wall.std(ddof=1) / math.sqrt(wall.size)
    assert abs(wall.mean() - expected) < 4 * se


@settings(max_examples=15, deadline=None)
@given(
    tau=st.floats(60.0, 20000.0),
    delta=st.floats(1.0, 900.0),
    restart=st.just(0.0) | st.floats(1e-3, 3000.0),  # a scenario takes 0 or >= 1 us
    mtbf_h=st.floats(0.5, 50.0),
)
def test_every_second_of_wall_time_lands_in_one_bucket(tau, delta, restart, mtbf_h):
    s = Scenario(mtbf_h=mtbf_h, checkpoint_s=delta, restart_s=restart, work_h=5.0)
    # A job expected to take ~1000x its work is refused as making no headway (tested apart).
    assume(analytic.daly_wall_time(tau, delta, mtbf_h * 3600, restart, s.work_s) < 100 * s.work_s)
    a = fast.simulate_policies(s, [FixedInterval(tau)], replicas=3, seed=0).arrays
    total = a["useful_s"] + a["checkpoint_s"] + a["lost_s"] + a["recovery_s"]
    np.testing.assert_allclose(total, a["wall_s"], rtol=1e-9)
    assert np.all(a["lost_s"] >= -1e-6) and np.all(a["recovery_s"] >= -1e-6)
    assert np.all(a["checkpoints"] >= math.ceil(s.work_s / tau))


def test_scenarios_outside_the_plain_model_are_refused():
    s = Scenario(mtbf_h=2.0, work_h=10.0, async_checkpoint=True, staging_s=5.0)
    assert not fast.fast_supported(s)
    with pytest.raises(InputError, match="discrete-event"):
        fast.simulate_policies(s, [FixedInterval(600.0)], replicas=2)
