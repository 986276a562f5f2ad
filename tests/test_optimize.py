"""The optimum by simulation: found where the exact answer is known, with honest noise."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from simulator import analytic, optimize
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.policies import FixedInterval

SMALL = Scenario(
    gpus=1024,
    mtbf_h=2.0,
    checkpoint_s=300.0,
    restart_s=600.0,
    work_h=300.0,
    usd_per_gpu_hour=2.0,
)


def test_simulated_optimum_is_within_two_percent_of_the_exact_exponential_optimum():
    res = optimize.optimize_by_simulation(SMALL, replicas=120, seed=11, bootstrap=100)
    exact = analytic.optimal_interval(SMALL.save_stall_s, SMALL.system_mtbf_s)
    assert abs(res["interval_s"] / exact - 1) < 0.02
    lo, hi = res["interval_ci_s"]
    assert lo < res["interval_s"] < hi
    # A 3 h habit on a 2 h MTBF must cost measurably more than the optimum.
    assert res["policies"]["fixed-3h"]["excess_pct_lo"] > 0


def test_common_random_numbers_shrink_the_variance_of_paired_differences():
    pols = [FixedInterval(1500.0), FixedInterval(2500.0)]
    same = optimize.evaluate(SMALL, pols, replicas=200, seed=1)["wall_s"]
    other = optimize.evaluate(SMALL, pols[1:], replicas=200, seed=2)["wall_s"]
    paired = np.var(same[1] - same[0], ddof=1)
    independent = np.var(other[0] - same[0], ddof=1)
    assert paired < 0.25 * independent


def test_paired_excess_interval_is_scipys_paired_t_interval():
    rng = np.random.default_rng(0)
    ref = rng.normal(10.0, 2.0, 50)
    y = ref + rng.normal(0.3, 0.5, 50)
    ex = optimize.paired_excess(y, ref, level=0.9)
    ci = stats.ttest_rel(y, ref).confidence_interval(0.9)
    assert ex["lo"] == pytest.approx(ci.low) and ex["hi"] == pytest.approx(ci.high)


def test_scaled_family_recovers_the_optimum_as_a_factor_near_one():
    from simulator.policies import ExactOptimal

    opt = optimize.optimize_parameter(
        SMALL,
        lambda f: optimize.Scaled(ExactOptimal(), f),
        (0.3, 3.0),
        replicas=100,
        seed=4,
        bootstrap=50,
    )
    assert 0.95 < opt.value < 1.05
    assert opt.ci[0] <= opt.value <= opt.ci[1]


def test_bad_search_settings_are_one_line_input_errors():
    with pytest.raises(InputError, match="bounds"):
        optimize.optimize_parameter(SMALL, FixedInterval, (10.0, 5.0))
    with pytest.raises(InputError, match="objective"):
        optimize.optimize_parameter(SMALL, FixedInterval, (10.0, 50.0), objective="speed")


def test_with_node_failures_the_closed_form_interval_is_the_simulated_optimum():
    # Node failures make half the job's failures here (job MTBF 3.3 h; the GPUs alone: 10 h).
    # The DES simulates both; the closed form, given the job's whole rate, lands on its
    # optimum, where the GPU-only rate would have said 34 min.
    s = Scenario(
        gpus=64,
        gpu_mtbf_h=640.0,
        node_mtbf_h=40.0,
        checkpoint_s=60.0,
        restart_s=300.0,
        work_h=200.0,
    )
    closed = analytic.optimal_interval(60.0, s.system_mtbf_s)
    gpu_only = analytic.optimal_interval(60.0, 10 * 3600.0)
    found = optimize.optimize_parameter(
        s, FixedInterval, (closed / 4, closed * 4), replicas=30, coarse=9, fine=7, bootstrap=100
    )
    assert found.engine == "des"
    assert abs(found.value / closed - 1) < 0.08
    assert abs(found.value / gpu_only - 1) > 0.3
    # The baselines that optimize_by_simulation reports see the same rate.
    assert optimize._first_interval(optimize.Young(), s) == pytest.approx(
        analytic.young_interval(60.0, s.system_mtbf_s)
    )
    assert optimize._first_interval(optimize.Adaptive(), s) == pytest.approx(closed, rel=1e-6)


def test_des_evaluation_in_worker_processes_gives_the_serial_answer_and_counts_every_run():
    class Bar:  # what evaluate needs of a tqdm bar
        n = 0

        def update(self, k):
            self.n += k

    # Async saves need the DES; 2 policies x 6 replicas split across two processes.
    s = Scenario(mtbf_h=2.0, checkpoint_s=120.0, restart_s=300.0, work_h=6.0,
                 async_checkpoint=True, staging_s=10.0)  # fmt: skip
    pols = [FixedInterval(900.0), FixedInterval(2400.0)]
    serial = optimize.evaluate(s, pols, replicas=6, seed=4, engine="des", workers=1)
    bar = Bar()
    parallel = optimize.evaluate(s, pols, replicas=6, seed=4, engine="des", workers=2, bar=bar)
    assert bar.n == 12
    for key in ("wall_s", "lost_s", "checkpoints", "failures"):
        np.testing.assert_array_equal(parallel[key], serial[key])
    assert not np.isnan(parallel["wall_s"]).any()


def test_a_bad_baseline_name_fails_before_the_search_runs(monkeypatch):
    ran = []
    monkeypatch.setattr(optimize, "optimize_parameter", lambda *a, **k: ran.append(1))
    s = Scenario(mtbf_h=2.0, checkpoint_s=60.0, restart_s=300.0, work_h=6.0)
    with pytest.raises(InputError, match="unknown baseline 'yung'"):
        optimize.optimize_by_simulation(s, replicas=4, baselines=["yung"])
    assert not ran
