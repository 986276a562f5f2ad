"""Failure classes whose detection time is drawn from a distribution, and classes in bursts."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

from simulator.cli import main
from simulator.engines.des_replicas import simulate
from simulator.engines.des_tiers import TieredClusterJob, class_sources
from simulator.engines.streams import replica_seed, replica_streams
from simulator.errors import InputError
from simulator.model.failure_source import BurstFailures
from simulator.model.scenario import Scenario
from simulator.model.tier_plan import first_order_plan
from simulator.model.tiers import FailureClass, TierSchedule
from simulator.model.trace import TraceFailures

TIERS = [
    {"name": "memory", "checkpoint_s": 0.5, "survives": ["process"]},
    {"name": "persistent", "checkpoint_s": 10.0, "survives": ["process", "node"]},
]
PROCESS = {"name": "process", "mtbf_h": 10.0, "nodes_lost": 0}
NODE = {"name": "node", "mtbf_h": 100.0}


def scenario(process=None, node=None, **extra):
    classes = [{**PROCESS, **(process or {})}, {**NODE, **(node or {})}]
    return Scenario(
        gpus=64, work_h=200.0, restart_s=0.0, failure_classes=classes, tiers=TIERS, **extra
    )


def job(s, intervals, seed=5):
    """One replica run to its end, for its failure and detection logs."""
    rs = replica_seed(seed, 0)
    gpu, node, other = replica_streams(rs)
    j = TieredClusterJob(s, TierSchedule(intervals), class_sources(s, gpu, node, rs), other)
    j.run()
    return j


def run(s, intervals, replicas=20, seed=3):
    return simulate(
        s, TierSchedule(intervals), replicas=replicas, seed=seed, workers=1, progress=False
    ).records


# -- detection-time distributions ----------------------------------------------------------
LOGNORMAL = {"detection_s": 300.0, "detection": "lognormal:sigma=1"}


def test_each_failure_draws_its_detection_time_with_the_classes_mean():
    j = job(scenario(process=LOGNORMAL), {"memory": 190.0, "persistent": 2700.0})
    times = np.array(j.detection_log)
    classes = np.array([c for _, c in j.failure_log])
    drawn, fixed = times[classes == "process"], times[classes == "node"]
    assert drawn.size > 10 and np.unique(drawn).size == drawn.size  # a draw per failure
    assert (fixed == 0.0).all()  # the node class keeps its fixed detection_s (0)
    # Many replicas: the mean of the draws is detection_s (lognormal sigma 1: sd ~ 1.3x mean).
    logs = np.concatenate(
        [job(scenario(process=LOGNORMAL), {"memory": 190.0, "persistent": 2700.0}, seed=k)
         .detection_log for k in range(30)]
    )  # fmt: skip
    logs = logs[logs > 0]
    half = 3 * logs.std(ddof=1) / math.sqrt(logs.size)
    assert abs(logs.mean() - 300.0) < half and half < 60.0


def test_the_recovery_pays_the_drawn_detection_time():
    rec = run(scenario(process=LOGNORMAL), {"memory": 190.0, "persistent": 2700.0}, replicas=12)
    clean = rec["failures_in_recovery"] == 0
    per_failure = (rec["recovery_by_process_h"] * 3600 / rec["failures_process"])[clean]
    # No restart, no restore in this scenario: the recovery is the detection alone, which
    # varies from failure to failure, so its replica means differ (a fixed 300 s would not).
    assert per_failure.std() > 10.0
    assert per_failure.mean() == pytest.approx(300.0, rel=0.25)


def test_schedules_on_one_seed_meet_the_same_detection_times_and_other_classes_are_untouched():
    s = scenario(process=LOGNORMAL)
    a = job(s, {"memory": 150.0, "persistent": 2000.0})
    b = job(s, {"memory": 400.0, "persistent": 900.0})
    n = min(len(a.failure_log), len(b.failure_log))
    assert n > 10 and a.failure_log[:n] == b.failure_log[:n]
    assert a.detection_log[:n] == b.detection_log[:n]
    # Drawing detection times takes nothing from any class's failure stream.
    fixed = job(scenario(process={"detection_s": 300.0}), {"memory": 150.0, "persistent": 2000.0})
    m = min(len(a.failure_log), len(fixed.failure_log))
    assert [t for t, _ in a.failure_log[:m]] == [t for t, _ in fixed.failure_log[:m]]


def test_the_first_order_plan_uses_the_detection_times_mean():
    drawn = first_order_plan(scenario(process=LOGNORMAL))
    fixed = first_order_plan(scenario(process={"detection_s": 300.0}))
    assert drawn == fixed
    assert fixed != first_order_plan(scenario())  # detection does enter it


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"detection": "lognormal:sigma=1"}, "needs detection_s > 0, its mean"),
        ({"detection": "gamma:k=2", "detection_s": 60.0}, "detection: unknown failure distrib"),
        ({"detection": "weibull:shape=99", "detection_s": 60.0}, "shape must be between"),
        ({"detection": 3, "detection_s": 60.0}, "detection must be a distribution"),
        ({"burst_followups": 2.0}, "burst_followups needs burst_window_s"),
        ({"burst_window_s": 60.0}, "burst_window_s needs burst_followups > 0"),
        ({"burst_followups": -1.0, "burst_window_s": 60.0}, "non-negative number of failures"),
        ({"burst_followups": 1e6, "burst_window_s": 60.0}, "at most 1000 failures"),
        ({"burst_followups": 1.0, "burst_window_s": 60.0, "burst_count": "zipf"},
         "burst_count must be poisson or geometric"),
    ],
)  # fmt: skip
def test_a_bad_detection_or_burst_field_is_one_line_naming_the_class(fields, fragment):
    with pytest.raises(InputError) as info:
        FailureClass(name="hang", mtbf_h=5.0, **fields)
    assert fragment in str(info.value) and "failure_class 'hang'" in str(info.value)
    assert "\n" not in str(info.value)


def test_a_bad_detection_spec_in_a_file_is_one_line_through_the_cli(capsys, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 64
        work_h = 10
        [[failure_class]]
        name = "hang"
        mtbf_h = 5
        detection_s = 1800
        detection = "lognormal:sigma=x"
        """)
    )
    code = main(["optimize", "--scenario", str(path)])
    out, err = capsys.readouterr()
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "failure_class 'hang': detection:" in err and "sigma must be a number" in err


def test_an_empirical_detection_log_is_read_from_the_files_folder(tmp_path):
    (tmp_path / "hangs.csv").write_text("duration,event\n600,1\n1200,1\n3000,1\n")
    path = tmp_path / "job.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 64
        work_h = 10
        [[failure_class]]
        name = "hang"
        mtbf_h = 5
        detection_s = 1800
        detection = "empirical:hangs.csv"
        """)
    )
    from simulator.model.scenario import load_scenario

    c = load_scenario(path).failure_classes[0]
    assert c.detection_times().mean_s == pytest.approx(1800.0)
    draws = c.detection_times().sample(np.random.default_rng(0), 600)
    assert set(np.round(draws, 6)) == {675.0, 1350.0, 3375.0}  # the log x 1800 / 1600


# -- bursts ---------------------------------------------------------------------------------
def burst_times(count: str, mean: float, n: int = 4000):
    firsts = np.arange(1, n + 1) * 1000.0
    c = FailureClass(
        name="net", mtbf_h=1.0, burst_followups=mean, burst_window_s=60.0, burst_count=count
    )
    source = BurstFailures(TraceFailures(firsts), c.followups, 60.0, np.random.default_rng(1))
    out = []
    while math.isfinite(t := source.next_failure_s()):
        out.append(t)
    return firsts, np.array(out)


@pytest.mark.parametrize("count", ["poisson", "geometric"])
def test_a_burst_is_its_first_failure_and_followups_within_its_window(count):
    firsts, times = burst_times(count, 2.0)
    assert np.all(np.diff(times) >= 0)  # in time order, bursts interleaved or not
    assert np.isin(firsts, times).all()  # every failure of the lifetime model is still there
    offsets = times - np.floor(times / 1000.0) * 1000.0  # time since the burst's first
    assert offsets.max() <= 60.0
    per_burst = np.bincount(np.floor(times / 1000.0).astype(int))[1:] - 1
    assert per_burst.mean() == pytest.approx(2.0, abs=0.1)
    # Poisson: variance = mean; geometric (same mean): variance = m(1 + m) = 6.
    assert per_burst.var() == pytest.approx(2.0 if count == "poisson" else 6.0, rel=0.15)


def test_a_burst_class_fails_one_plus_followups_times_as_often_and_schedules_meet_the_same():
    bursty = {"burst_followups": 2.0, "burst_window_s": 60.0}
    s = scenario(process=bursty)
    assert s.failure_classes[0].rate_per_s(64, 8) == pytest.approx(3.0 / 36000.0)
    assert s.failure_rate_per_s == pytest.approx(3.0 / 36000.0 + 1.0 / 360000.0)
    a = job(s, {"memory": 150.0, "persistent": 2000.0})
    b = job(s, {"memory": 400.0, "persistent": 900.0})
    n = min(len(a.failure_log), len(b.failure_log))
    assert n > 30 and a.failure_log[:n] == b.failure_log[:n]
    # Each class meets exactly the failures it met without the process class's bursts: the
    # node class all of them, the process class its bursts' first failures.
    met = 0
    for seed in range(6):
        bursts = job(s, {"memory": 150.0, "persistent": 2000.0}, seed=seed).failure_log
        calm = job(scenario(), {"memory": 150.0, "persistent": 2000.0}, seed=seed).failure_log
        for name in ("node", "process"):
            got = [t for t, c in bursts if c == name]
            plain = [t for t, c in calm if c == name]
            if name == "node":
                m = min(len(got), len(plain))
                assert got[:m] == plain[:m]
                met += m
            elif got and plain:  # within the span both runs lasted
                horizon = min(got[-1], plain[-1])
                assert {t for t in plain if t <= horizon} <= set(got)
    assert met > 0
    rec = run(s, {"memory": 190.0, "persistent": 2700.0}, replicas=20)
    assert rec["failures_process"].mean() == pytest.approx(60.0, rel=0.15)  # 20 bursts of 3


def test_the_first_order_plan_counts_a_burst_as_one_failure_and_the_recovery_it_costs():
    recovery = {"detection_s": 30.0, "restart_s": 120.0}
    s = scenario(process={**recovery, "burst_followups": 3.0, "burst_window_s": 300.0})
    plan = first_order_plan(s)
    calm = first_order_plan(scenario(process=recovery))
    # A burst is one failure for the interval: the memory tier's rate is the bursts' rate.
    assert plan["rates_per_s"] == calm["rates_per_s"]
    span = 300.0 * (1.0 - (1.0 - math.exp(-3.0)) / 3.0)  # window · E[N/(N+1)], N ~ Poisson(3)
    assert s.failure_classes[0].burst_span_s == pytest.approx(span)
    assert plan["waste_fraction"] - calm["waste_fraction"] == pytest.approx(span / 36000.0)
    # The DES, which runs every follow-up (saves inside a burst included), agrees within its
    # Monte-Carlo error; each burst counted as a plain failure would be far below it.
    rec = run(s, plan["tier_intervals_s"], replicas=40, seed=11)
    waste = rec["waste_fraction"]
    half = 4 * waste.std(ddof=1) / math.sqrt(waste.size)
    final = plan["final_save_s"] / (200 * 3600.0)
    assert abs(waste.mean() - (plan["waste_fraction"] + final)) < half
    assert waste.mean() - half > calm["waste_fraction"] + final


def test_optimize_says_what_the_burst_treatment_assumes(capsys, tmp_path):
    path = tmp_path / "job.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 64
        work_h = 10
        [[failure_class]]
        name = "network"
        mtbf_h = 5
        burst_followups = 3
        burst_count = "geometric"
        burst_window_s = 300
        """)
    )
    code = main(["optimize", "--scenario", str(path), "--json"])
    err = capsys.readouterr().err
    assert code == 0, err
    assert "comes in bursts" in err and "no save falls inside its window" in err


def test_detection_draws_and_follow_ups_take_nothing_from_the_classes_failure_stream():
    # Past the first batch of lifetimes a class draws (hundreds), a stream shared with the
    # detection times or the follow-ups would shift every later failure: the class's failures
    # with either must stay exactly the plain class's (a burst's first failures, for bursts).
    def failures(**extra):
        s = Scenario(
            gpus=8, work_h=40.0, restart_s=0.0,
            failure_classes=[{**PROCESS, "mtbf_h": 0.05, **extra}],
            tiers=[{"name": "memory", "checkpoint_s": 0.1, "survives": ["process"]}],
        )  # fmt: skip
        return [t for t, _ in job(s, {"memory": 60.0}).failure_log]

    plain = failures()
    drawn = failures(detection_s=20.0, detection="exponential")
    assert len(plain) > 1000
    m = min(len(plain), len(drawn))
    assert drawn[:m] == plain[:m]
    bursty = failures(burst_followups=0.5, burst_window_s=30.0)
    horizon = min(plain[-1], bursty[-1])
    firsts = [t for t in plain if t <= horizon]
    assert len(firsts) > 1000 and set(firsts) <= set(bursty)
