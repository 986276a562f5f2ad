"""The discrete-event cluster model: time accounting, saves, recoveries, failure processes."""

from __future__ import annotations

import math

import numpy as np
import pytest
from scipy import stats

from simulator import analytic
from simulator.engines.des import ClusterJob
from simulator.engines.des_replicas import run_replica, simulate
from simulator.errors import InputError
from simulator.model.failure_source import ComponentFailures, MergedFailures
from simulator.model.failures import Exponential, LogNormal, Weibull
from simulator.model.scenario import Scenario
from simulator.model.trace import TraceFailures
from simulator.policies import FixedInterval

HOUR = 3600.0


def job(trace, **fields):
    """One deterministic replica whose failures come from ``trace`` (seconds)."""
    base = dict(work_h=3000 / HOUR, checkpoint_s=100.0, restart_s=50.0)
    base.update(fields)
    scenario = Scenario(**base)
    tau = fields.pop("interval_s", 1000.0) if "interval_s" in fields else 1000.0
    return ClusterJob(
        scenario, FixedInterval(tau), TraceFailures(trace), np.random.default_rng(0)
    ).run()


def assert_adds_up(r):
    total = r["useful_s"] + r["lost_s"] + r["checkpoint_s"] + r["recovery_s"]
    assert total == pytest.approx(r["wall_s"], rel=1e-12, abs=1e-9)
    assert r["compute_s"] == pytest.approx(r["useful_s"] + r["lost_s"], rel=1e-12)


# -- exact, hand-checked timelines (trace replay) -------------------------------------------
def test_without_failures_wall_is_work_plus_one_stall_per_checkpoint():
    r = job([])
    assert r["checkpoints"] == 3 and r["failures"] == 0
    assert r["wall_s"] == pytest.approx(3000 + 3 * 100)


def test_a_failure_during_a_write_loses_that_checkpoint_and_the_work_before_it():
    # compute 0-1000, write 1000-1100 struck at 1050: nothing saved, 1000 s of work lost.
    r = job([1050.0])
    assert r["failures"] == 1 and r["checkpoints"] == 3
    assert r["lost_s"] == pytest.approx(1000.0)
    assert r["checkpoint_s"] == pytest.approx(50 + 3 * 100)
    assert r["recovery_s"] == pytest.approx(50.0)
    assert r["wall_s"] == pytest.approx(1100 + 3 * 1100)
    assert_adds_up(r)


def test_lost_work_is_only_what_came_after_the_last_completed_checkpoint():
    # First save completes at 1100; the failure at 1600 loses the 500 s computed since.
    r = job([1600.0])
    assert r["lost_s"] == pytest.approx(500.0)
    assert r["wall_s"] == pytest.approx(1650 + 2 * 1100)
    assert_adds_up(r)


def test_a_failure_during_recovery_starts_the_recovery_over():
    r = job([500.0, 520.0])
    assert r["failures"] == 2 and r["failures_in_recovery"] == 1
    assert r["recovery_s"] == pytest.approx(20 + 50)
    assert r["lost_s"] == pytest.approx(500.0)
    assert r["wall_s"] == pytest.approx(570 + 3 * 1100)
    assert_adds_up(r)


def test_async_save_stalls_only_for_staging_and_waits_for_the_last_write():
    r = job([], async_checkpoint=True, staging_s=10.0)
    # 3 stagings, then the final background write (100 s) must finish before the job ends.
    assert r["checkpoint_s"] == pytest.approx(3 * 10 + 100)
    assert r["wall_s"] == pytest.approx(3000 + 3 * 10 + 100)
    assert r["checkpoints"] == 3


def test_async_write_slower_than_the_interval_delays_the_next_save():
    r = job([], async_checkpoint=True, staging_s=10.0, checkpoint_s=1500.0)
    # Each of the two later saves waits 500 s for the previous write; the last write 1500 s.
    assert r["wall_s"] == pytest.approx(3000 + 3 * 10 + 500 + 500 + 1500)
    assert_adds_up(r)


def test_a_failure_before_the_background_write_finishes_loses_that_checkpoint():
    # Staged at 1000-1010, written in the background 1010-1110; failure at 1050.
    r = job([1050.0], async_checkpoint=True, staging_s=10.0)
    assert r["lost_s"] == pytest.approx(1000 + 40)
    assert_adds_up(r)
    # The same failure after the write completed loses only the work since the snapshot.
    r = job([1200.0], async_checkpoint=True, staging_s=10.0)
    assert r["lost_s"] == pytest.approx(1200 - 1010)
    assert_adds_up(r)


def test_write_time_follows_per_writer_and_aggregate_bandwidth():
    common = dict(gpus=64, gpus_per_node=8, checkpoint_bytes=8e12, gpu_mtbf_h=1e15)
    # 8 nodes x 10 GB/s = 80 GB/s under a 1 TB/s cap: per-writer bound, 100 s.
    r = job([], write_bytes_per_s_per_node=10e9, storage_bytes_per_s=1e12, **common)
    assert r["checkpoint_s"] == pytest.approx(3 * 100.0)
    # Only 2 of them write at once under a 16 GB/s cap: aggregate bound, 500 s.
    r = job([], write_bytes_per_s_per_node=10e9, storage_bytes_per_s=16e9, writer_nodes=2, **common)
    assert r["checkpoint_s"] == pytest.approx(3 * 500.0)


def test_recovery_is_detection_restart_load_and_warmup():
    r = job([1600.0], detection_s=30.0, warmup_s=20.0, checkpoint_bytes=1e12, read_bytes_per_s=1e10)
    assert r["recovery_s"] == pytest.approx(30 + 50 + 100 + 20)
    assert_adds_up(r)


def test_without_a_free_spare_the_job_waits_for_a_repair():
    common = dict(gpus=16, gpus_per_node=8, gpu_mtbf_h=1e9, repair_h=2.0)
    plenty = job([1600.0, 2500.0], spares=2, **common)
    none = job([1600.0], spares=0, **common)
    assert plenty["spare_wait_s"] == 0.0
    assert plenty["recovery_s"] == pytest.approx(2 * 50)
    assert none["spare_wait_s"] > 0
    assert none["recovery_s"] == pytest.approx(50 + none["spare_wait_s"])
    assert_adds_up(none)
    # One spare, two failures 10 s apart, a repair of hours: the second failure waits.
    one = job([1600.0, 1610.0], spares=1, **common)
    assert one["spare_wait_s"] > 0
    assert_adds_up(one)


# -- against Daly's exact expected wall time ------------------------------------------------
DALY_CASES = [
    (900.0, 4 * HOUR, 60.0, 600.0),  # the usual regime, δ << M
    (1500.0, 3600.0, 600.0, 300.0),  # δ = M/6
    (1000.0, 1800.0, 1200.0, 900.0),  # δ comparable to M, τ + δ > M
]


def check_daly(tau_s, mtbf_s, delta_s, restart_s, *, segments, replicas, seed):
    work_s = segments * tau_s  # Daly counts whole segments, each saved
    scenario = Scenario(
        mtbf_h=mtbf_s / HOUR, checkpoint_s=delta_s, restart_s=restart_s, work_h=work_s / HOUR
    )
    result = simulate(
        scenario, FixedInterval(tau_s), replicas=replicas, seed=seed, workers=1, progress=False
    )
    expected_h = analytic.daly_wall_time(tau_s, delta_s, mtbf_s, restart_s, work_s) / HOUR
    lo, hi = result.summary()["wall_h_ci95"]
    # Within 4 standard errors, not inside the 95% CI: that misses 1 seed in 20 by design.
    wall = result.records["wall_h"]
    assert abs(wall.mean() - expected_h) < 4 * wall.std(ddof=1) / math.sqrt(wall.size)
    return (hi - lo) / expected_h


@pytest.mark.parametrize(("tau_s", "mtbf_s", "delta_s", "restart_s"), DALY_CASES)
def test_mean_wall_time_matches_dalys_formula_under_exponential_failures(
    tau_s, mtbf_s, delta_s, restart_s
):
    width = check_daly(tau_s, mtbf_s, delta_s, restart_s, segments=8, replicas=600, seed=7)
    assert width < 0.08  # the interval is tight enough to mean something


@pytest.mark.slow
@pytest.mark.parametrize(("tau_s", "mtbf_s", "delta_s", "restart_s"), DALY_CASES)
def test_mean_wall_time_matches_daly_to_a_fraction_of_a_percent(tau_s, mtbf_s, delta_s, restart_s):
    width = check_daly(tau_s, mtbf_s, delta_s, restart_s, segments=20, replicas=6000, seed=11)
    assert width < 0.015


def plain_loop_wall_s(failures_s, tau_s, delta_s, restart_s, segments):
    """Daly's model written as a bare loop: τ + δ, or R, must pass without a failure."""
    fails = [*failures_s, math.inf]
    t, i, done = 0.0, 0, 0
    while done < segments:
        end = t + tau_s + delta_s
        if fails[i] >= end:
            t, done = end, done + 1
            continue
        t, i = fails[i], i + 1
        while fails[i] < t + restart_s:
            t, i = fails[i], i + 1
        t += restart_s
    return t


def test_the_simpy_model_equals_a_plain_loop_on_the_same_failures():
    rng = np.random.default_rng(5)
    tau_s, mtbf_s, delta_s, restart_s = 1500.0, 3600.0, 600.0, 300.0
    scenario = Scenario(
        mtbf_h=mtbf_s / HOUR, checkpoint_s=delta_s, restart_s=restart_s, work_h=20 * tau_s / HOUR
    )
    for _ in range(200):
        failures = np.cumsum(rng.exponential(mtbf_s, 200))
        expected = plain_loop_wall_s(failures, tau_s, delta_s, restart_s, 20)
        r = ClusterJob(scenario, FixedInterval(tau_s), TraceFailures(failures), rng).run()
        assert r["wall_s"] == pytest.approx(expected, rel=1e-12)


def test_weibull_shape_one_per_gpu_matches_the_exponential_formula():
    # 64 GPUs, each Weibull(1): the superposition is Poisson with rate 64 / mean.
    tau_s, delta_s, restart_s = 1200.0, 120.0, 300.0
    system_mtbf_s = 2 * HOUR
    work_s = 20 * tau_s
    expected_h = analytic.daly_wall_time(tau_s, delta_s, system_mtbf_s, restart_s, work_s) / HOUR
    for family in ("weibull:shape=1", "exponential"):
        scenario = Scenario(
            gpus=64,
            gpu_mtbf_h=64 * system_mtbf_s / HOUR,
            failure=family,
            checkpoint_s=delta_s,
            restart_s=restart_s,
            work_h=work_s / HOUR,
        )
        summary = simulate(
            scenario, FixedInterval(tau_s), replicas=1000, seed=3, workers=1, progress=False
        ).summary()
        lo, hi = summary["wall_h_ci95"]
        assert lo <= expected_h <= hi, family


@pytest.mark.parametrize(
    ("tau_s", "write_s", "mtbf_s"),
    [(1200.0, 1500.0, 2 * HOUR), (1800.0, 600.0, 0.5 * HOUR), (300.0, 7200.0, 3 * HOUR)],
)
def test_an_async_save_is_no_slower_than_a_blocking_save_of_stall_plus_write(
    tau_s, write_s, mtbf_s
):
    # budget.py bounds an async job's wall time by Daly's with δ = stall + write: each snapshot
    # is committed no later than such a blocking save would commit it. Checked where the write
    # outlasts the interval, where it is a third of the MTBF, and where it is 24 intervals
    # (the bound is nearly tight there: every save waits for the write).
    stall_s, restart_s, work_s = 5.0, 300.0, 20 * tau_s
    scenario = Scenario(
        gpus=64,
        gpu_mtbf_h=64 * mtbf_s / HOUR,
        checkpoint_s=write_s,
        staging_s=stall_s,
        async_checkpoint=True,
        restart_s=restart_s,
        work_h=work_s / HOUR,
    )
    bound_h = analytic.daly_wall_time(tau_s, stall_s + write_s, mtbf_s, restart_s, work_s) / HOUR
    stall_only_h = analytic.daly_wall_time(tau_s, stall_s, mtbf_s, restart_s, work_s) / HOUR
    summary = simulate(
        scenario, FixedInterval(tau_s), replicas=300, seed=1, workers=1, progress=False
    ).summary()
    lo, hi = summary["wall_h_ci95"]
    assert hi <= bound_h
    assert lo > stall_only_h  # the write costs something: the stall alone is no bound


def test_every_replica_adds_up_in_every_model_variant():
    variants = [
        dict(failure="weibull:shape=0.7"),
        dict(failure="lognormal:sigma=1.5", component_age="new"),
        dict(async_checkpoint=True, staging_s=5.0, checkpoint_s=400.0),
        dict(spares=1, repair_h=3.0, detection_s=30.0, warmup_s=60.0),
        dict(node_mtbf_h=2000.0, checkpoint_bytes=1e12, read_bytes_per_s=5e9),
    ]
    for extra in variants:
        fields = dict(gpus=256, gpu_mtbf_h=256 * 2.0, checkpoint_s=60.0, restart_s=300.0)
        scenario = Scenario(work_h=48.0, **{**fields, **extra})
        for seed in range(3):
            r = run_replica(scenario, "optimal", seed)
            total = r["useful_h"] + r["lost_h"] + r["checkpoint_h"] + r["recovery_h"]
            assert total == pytest.approx(r["wall_h"], rel=1e-12), extra
            assert r["useful_h"] == pytest.approx(48.0, rel=1e-12)
            assert r["failures"] > 0


# -- the failure process ------------------------------------------------------------------
def count_failures(source, horizon_s):
    n = 0
    while source.next_failure_s() <= horizon_s:
        n += 1
    return n


@pytest.mark.parametrize(
    "lifetime",
    [
        Weibull.from_mean(1000 * HOUR, 0.7),
        Weibull.from_mean(1000 * HOUR, 2.0),
        LogNormal.from_mean(1000 * HOUR, 1.2),
    ],
)
def test_stationary_components_fail_at_the_long_run_rate_from_the_start(lifetime):
    # A stationary renewal process has rate exactly 1/mean at every instant (renewal theory),
    # so the count over any window has mean n·T/mean — while the gaps are far from exponential.
    n, horizon = 200, 50 * HOUR
    counts = [
        count_failures(ComponentFailures(lifetime, n, np.random.default_rng(s)), horizon)
        for s in range(400)
    ]
    expected = n * horizon / lifetime.mean_s
    m, se = np.mean(counts), np.std(counts, ddof=1) / math.sqrt(len(counts))
    assert abs(m - expected) < 3.3 * se


def test_new_components_fail_at_their_first_lifetime_rate():
    # All new at t = 0 and T short enough that repeat failures are negligible: the count is
    # about n·F(T), F from scipy's own Weibull — with shape 0.7, well above the long-run n·T/μ.
    life = Weibull.from_mean(1000 * HOUR, 0.7)
    n, horizon = 200, 10 * HOUR
    counts = [
        count_failures(
            ComponentFailures(life, n, np.random.default_rng(s), stationary=False), horizon
        )
        for s in range(400)
    ]
    f = stats.weibull_min(0.7, scale=life.scale).cdf(horizon)
    m, se = np.mean(counts), np.std(counts, ddof=1) / math.sqrt(len(counts))
    assert abs(m - n * f) < 3.3 * se + n * f * f  # + the neglected second renewals
    assert m > 1.5 * n * horizon / life.mean_s


def test_failure_sources_yield_times_in_order():
    rng = np.random.default_rng(1)
    merged = MergedFailures(
        ComponentFailures(Weibull.from_mean(100.0, 0.5), 50, rng),
        ComponentFailures(Exponential(30.0), 5, rng),
    )
    times = [merged.next_failure_s() for _ in range(5000)]
    assert np.all(np.diff(times) >= 0)


def test_trace_replay_rejects_unsorted_timestamps_and_runs_out():
    with pytest.raises(InputError, match="sorted"):
        TraceFailures([5.0, 1.0])
    trace = TraceFailures([1.0, 2.0, 9.0], start_s=1.5)
    assert [trace.next_failure_s() for _ in range(3)] == [0.5, 7.5, math.inf]


def test_a_job_that_cannot_make_headway_is_reported_not_run_forever():
    scenario = Scenario(mtbf_h=60 / HOUR, checkpoint_s=600.0, restart_s=600.0, work_h=0.05)
    with pytest.raises(InputError, match="headway"):
        run_replica(scenario, FixedInterval(3600.0), 0)


# -- what the DES's policies see --------------------------------------------------------
def test_adaptive_in_the_des_counts_node_failures_in_the_jobs_rate():
    # Exponential GPUs and nodes: the job's failures are Poisson at the summed rate (30 h
    # MTBF), so the hazard-aware policy must save exactly as the exact optimum does; seeing
    # only the GPUs' rate (48.8 h) it saved every 1.26 h instead of every 59 min.
    scenario = Scenario(gpus=2048, gpus_per_node=16, gpu_mtbf_h=1e5, node_mtbf_h=1e4, work_h=100.0)
    adaptive = run_replica(scenario, "adaptive", 4)
    optimal = run_replica(scenario, "optimal", 4)
    assert adaptive["failures"] > 0
    assert adaptive["checkpoints"] == optimal["checkpoints"]
    assert adaptive["wall_h"] == pytest.approx(optimal["wall_h"], rel=1e-9)
    tau = analytic.optimal_interval(60.0, scenario.system_mtbf_s)
    assert optimal["checkpoints"] == pytest.approx(100 * HOUR / tau, abs=6)


def test_adaptive_in_the_des_sees_a_job_level_lifetime_without_a_gpu_count():
    # Only the job's MTBF and its Weibull(0.5) shape are known. The DES is the reference, so
    # it must give the hazard-aware policy that lifetime, and agree with the fast engine.
    from simulator.engines import fast
    from simulator.policies import Adaptive

    scenario = Scenario(
        mtbf_h=4.0, failure="weibull:shape=0.5", checkpoint_s=600.0, restart_s=600.0, work_h=400.0
    )
    runs = {
        p: simulate(scenario, p, replicas=30, seed=11, workers=1, progress=False).records
        for p in ("optimal", "adaptive")
    }
    saves = {p: r["checkpoints"].to_numpy() for p, r in runs.items()}
    waste = {p: r["waste_fraction"].to_numpy() for p, r in runs.items()}
    # Same failures for both (common random numbers): fewer saves, and less waste by far
    # more than the paired noise.
    assert saves["adaptive"].mean() < 0.88 * saves["optimal"].mean()
    d = waste["optimal"] - waste["adaptive"]
    assert d.mean() > 4 * d.std(ddof=1) / math.sqrt(d.size)
    arrays = fast.simulate_policies(scenario, [Adaptive()], replicas=400, seed=12).arrays
    f = arrays["checkpoints"][0]
    se = math.hypot(saves["adaptive"].std(ddof=1) / math.sqrt(30), f.std(ddof=1) / 20.0)
    assert abs(saves["adaptive"].mean() - f.mean()) < 4 * se


# -- fast-forward: cycles before the next failure booked without a SimPy event each --------
def _fast_forward_cases():
    from simulator.controller.schedule import ControllerPolicy
    from simulator.optimize import Scaled
    from simulator.policies import Adaptive, Daly, ExactOptimal, Young

    base = Scenario(
        gpus=256,
        gpus_per_node=8,
        gpu_mtbf_h=2000.0,
        failure="weibull:shape=0.7",
        checkpoint_s=60.0,
        restart_s=300.0,
        work_h=200.0,
    )
    scenarios = {
        "weibull": base,
        "nodes+spares": base.with_overrides(node_mtbf_h=3000.0, spares=1, repair_h=2.0),
        "detection+warmup": base.with_overrides(detection_s=45.0, warmup_s=10.0),
        "job-level": Scenario(
            mtbf_h=4.0,
            failure="weibull:shape=0.5",
            checkpoint_s=60.0,
            restart_s=120.0,
            work_h=100.0,
        ),
    }
    policies = [
        FixedInterval(1500.0),
        Young(),
        Daly(),
        ExactOptimal(),
        Adaptive(),
        Scaled(ExactOptimal(), 0.5),
        Scaled(Adaptive(), 2.0),
        ControllerPolicy(),
        ControllerPolicy(step_s=7.0),
    ]
    return [(k, s, p) for k, s in scenarios.items() for p in policies]


@pytest.mark.parametrize(
    "label,scenario,policy", _fast_forward_cases(), ids=lambda x: getattr(x, "name", None)
)
def test_fast_forward_books_exactly_what_the_simpy_events_would(label, scenario, policy):
    """The job books the cycles that end before the next failure without yielding to SimPy.
    Every count and every time bucket must come out as when each cycle is two SimPy
    timeouts (``fast_forward=False``), under every policy, the learning and step-bound ones
    included, with node failures, spares, detection and a job-level lifetime."""
    from simulator.engines.des import failure_source_for
    from simulator.engines.streams import replica_streams

    for seed in range(3):
        runs = []
        for forward in (True, False):
            gpu, node, other = replica_streams(seed)
            source = failure_source_for(scenario, gpu, node)
            runs.append(ClusterJob(scenario, policy, source, other, fast_forward=forward).run())
        fast, slow = runs
        assert slow["failures"] > 0 and slow["checkpoints"] > slow["failures"]
        for key, value in slow.items():
            if isinstance(value, int):
                assert fast[key] == value, (label, key)
            else:
                assert fast[key] == pytest.approx(value, rel=1e-12, abs=1e-9), (label, key)


def test_fast_forward_replays_a_trace_with_failures_at_the_exact_save_boundaries():
    # After the first failure (1100, the end of the first save) the job resumes at 1150 with
    # the next failure known: saves end at 2250 and 3350. A failure exactly at 3350 strikes
    # that save before it lands (SimPy runs the failure's earlier-scheduled event first), so
    # the booked path must stop strictly before the failure; then one at a segment's end
    # (3400 + 1000) and one mid-save.
    trace = [1100.0, 3350.0, 4400.0, 6000.0, 6050.0, 9999.0]
    scenario = Scenario(work_h=12000 / HOUR, checkpoint_s=100.0, restart_s=50.0)
    runs = [
        ClusterJob(
            scenario,
            FixedInterval(1000.0),
            TraceFailures(trace),
            np.random.default_rng(0),
            fast_forward=forward,
        ).run()
        for forward in (True, False)
    ]
    assert runs[0] == runs[1]
    assert runs[1]["failures"] == len(trace)
    # Lost, by hand: 1000 (save cut at 1100) + 1000 (save cut at 3350) + 1000 (segment cut at
    # its end, 4400) + 450 (5550-6000) + 0 (6050 strikes the recovery) + 599 (9400-9999).
    assert runs[1]["lost_s"] == pytest.approx(4049.0, abs=1e-6)
    assert runs[1]["failures_in_recovery"] == 1
