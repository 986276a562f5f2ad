"""The discrete-event model with tiers and failure classes, against today's model and the
first-order closed form."""

from __future__ import annotations

import math

import numpy as np
import pytest

from simulator.engines.des_replicas import simulate
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.model.tiers import TierSchedule, first_order_plan
from simulator.policies import FixedInterval

BASE = dict(
    gpus=64,
    gpu_mtbf_h=64 * 5.0,
    node_mtbf_h=8 * 20.0,
    checkpoint_s=60.0,
    restart_s=120.0,
    work_h=30.0,
)
PERSISTENT = {"name": "persistent", "checkpoint_s": 60.0, "survives": ["failure"]}


def run(scenario, policy, replicas=20, seed=3):
    return simulate(scenario, policy, replicas=replicas, seed=seed, workers=1, progress=False)


def test_when_every_failure_needs_the_persistent_tier_the_records_are_todays_bit_for_bit():
    today = run(Scenario(**BASE), FixedInterval(1500.0)).records
    memory = {"name": "memory", "checkpoint_s": 1.0, "survives": []}
    tiered = Scenario(**BASE, tiers=[memory, PERSISTENT])
    got = run(tiered, TierSchedule({"memory": math.inf, "persistent": 1500.0})).records
    for column in today.columns.drop("events"):
        assert (got[column] == today[column]).all(), column
    assert (got["saves_persistent"] == today["checkpoints"]).all()
    assert (got["failures_failure"] == today["failures"]).all()


TWO = dict(
    gpus=64,
    work_h=200.0,
    restart_s=0.0,
    failure_classes=[
        {"name": "process", "mtbf_h": 10.0, "nodes_lost": 0},
        {"name": "node", "mtbf_h": 100.0},
    ],
    tiers=[
        {"name": "memory", "checkpoint_s": 0.5, "survives": ["process"]},
        {"name": "persistent", "checkpoint_s": 10.0, "survives": ["process", "node"]},
    ],
)


def test_the_des_meets_the_first_order_tier_formula_where_saves_are_cheap():
    s = Scenario(**TWO)
    plan = first_order_plan(s)
    res = run(s, TierSchedule(plan["tier_intervals_s"]), replicas=40, seed=11)
    waste = res.records["waste_fraction"]
    half = 4 * waste.std(ddof=1) / math.sqrt(waste.size)
    assert abs(waste.mean() - plan["waste_fraction"]) < half
    assert half < 0.25 * plan["waste_fraction"]  # tight enough to mean something
    # Each class is counted, and only a node loss needs the persistent copy.
    assert res.records["failures_process"].mean() == pytest.approx(20, rel=0.3)
    assert res.records["failures_node"].mean() == pytest.approx(2, rel=0.6)


def test_two_tier_schedules_on_one_seed_meet_the_same_failures():
    s = Scenario(**TWO)
    logs = []
    from simulator.engines.des_tiers import TieredClusterJob, class_sources
    from simulator.engines.streams import replica_seed, replica_streams

    for intervals in (
        {"memory": 150.0, "persistent": 2000.0},
        {"memory": 400.0, "persistent": 900.0},
    ):
        seed = replica_seed(5, 0)
        gpu, node, other = replica_streams(seed)
        job = TieredClusterJob(s, TierSchedule(intervals), class_sources(s, gpu, node, seed), other)
        job.run()
        logs.append(job.failure_log)
    n = min(map(len, logs))
    assert n > 10 and logs[0][:n] == logs[1][:n]
    assert {c for _, c in logs[0]} <= {"process", "node"}


def test_when_no_failure_needs_the_persistent_tier_only_the_final_save_goes_there():
    s = Scenario(
        **{
            **TWO,
            "failure_classes": [{"name": "process", "mtbf_h": 10.0, "nodes_lost": 0}],
            "tiers": [{**TWO["tiers"][0]}, {**TWO["tiers"][1], "survives": ["process"]}],
            "work_h": 50.0,
        }
    )
    assert first_order_plan(s)["tier_intervals_s"]["persistent"] == math.inf
    never = run(s, TierSchedule({"memory": 190.0, "persistent": math.inf}), replicas=10)
    hourly = run(s, TierSchedule({"memory": 190.0, "persistent": 3600.0}), replicas=10)
    assert (never.records["saves_persistent"] == 1).all()
    assert np.allclose(never.records["useful_h"], 50.0)
    # Same failures (same seed): skipping the persistent saves only ever saves time.
    assert (never.records["wall_h"] < hourly.records["wall_h"]).all()


def test_a_memory_copy_dies_with_its_node_and_the_job_restores_from_persistent():
    s = Scenario(**TWO)
    res = run(s, TierSchedule({"memory": 150.0, "persistent": 2000.0}), replicas=10)
    r = res.records
    assert (r["restores_memory"] <= r["failures_process"]).all()
    assert (r["restores_persistent"] + r["restores_memory"] <= r["failures"]).all()
    total = r["useful_h"] + r["lost_h"] + r["checkpoint_h"] + r["recovery_h"]
    assert np.allclose(total, r["wall_h"], rtol=1e-12)


def test_a_tiered_scenario_without_intervals_or_with_a_plain_policy_is_one_line():
    s = Scenario(**TWO)
    with pytest.raises(InputError, match="no interval") as info:
        TierSchedule.for_scenario(s)
    assert "\n" not in str(info.value) and "--tier-interval-s memory=SECONDS" in str(info.value)
    with pytest.raises(InputError, match="needs a tier schedule"):
        run(s, FixedInterval(600.0), replicas=1)
    with pytest.raises(InputError, match="no tier named 'disk'"):
        TierSchedule.for_scenario(s, {"disk": 5.0})


def test_lost_work_and_recovery_per_class_add_up_to_the_whole_of_each():
    # The per-class breakdown (lost_by_<class>_h, recovery_by_<class>_h) charges every second
    # of rollback and of recovery, one cut short by a second failure included, to one class.
    s = Scenario(**{**TWO, "work_h": 40.0, "restart_s": 1800.0})
    rec = run(s, TierSchedule({"memory": 300.0, "persistent": 3000.0}), replicas=12).records
    assert rec["failures_in_recovery"].sum() > 0  # recoveries were cut short
    for total, part in (("lost_h", "lost_by_"), ("recovery_h", "recovery_by_")):
        parts = rec[[f"{part}{c}_h" for c in ("process", "node")]].sum(axis=1)
        np.testing.assert_allclose(parts, rec[total], rtol=1e-12, atol=1e-9)
        assert (rec[f"{part}node_h"] > 0).any() and (rec[f"{part}process_h"] > 0).any()


JIT = dict(
    TWO,
    work_h=40.0,
    tiers=[
        {"name": "jit", "jit": True, "checkpoint_s": 30.0, "restore_s": 20.0,
         "survives": ["process"]},
        {"name": "persistent", "checkpoint_s": 10.0, "restore_s": 5.0,
         "survives": ["process", "node"]},
    ],
)  # fmt: skip


def test_a_just_in_time_tier_loses_no_work_and_its_recovery_pays_the_save():
    # Just-in-time checkpointing (EuroSys'24): after a process failure the healthy replicas
    # save the state they hold, so nothing is rolled back; the recovery pays that save (30 s)
    # and its restore (20 s) on top of detection and restart. Node losses still roll back to
    # the persistent tier, the only one saved on a schedule.
    s = Scenario(**JIT)
    rec = run(s, TierSchedule({"persistent": 3000.0}), replicas=12).records
    assert rec["failures_process"].sum() > 20 and (rec["failures_node"] > 0).any()
    assert (rec["lost_by_process_h"] == 0).all() and (rec["lost_by_node_h"] > 0).any()
    assert (rec["saves_jit"] == rec["failures_process"]).all()
    clean = rec["failures_in_recovery"] == 0
    per = (0.0 + 0.0 + 30.0 + 20.0) / 3600.0  # no detection or restart in TWO: save, restore
    np.testing.assert_allclose(
        rec.loc[clean, "recovery_by_process_h"], rec.loc[clean, "failures_process"] * per,
        rtol=1e-9,
    )  # fmt: skip


def test_the_first_order_plan_charges_a_jit_tiers_classes_no_lost_work():
    s = Scenario(**JIT)
    plan = first_order_plan(s)
    assert set(plan["tier_intervals_s"]) == {"persistent"}  # jit is never scheduled
    node_rate = 1.0 / (100.0 * 3600.0)
    assert plan["tier_intervals_s"]["persistent"] == pytest.approx(math.sqrt(2 * 10 / node_rate))
    with pytest.raises(InputError, match="jit tier is saved after a failure"):
        Scenario(**{**JIT, "tiers": [dict(JIT["tiers"][0], interval_s=60.0), JIT["tiers"][1]]})


def _replay(scenario, schedule, times_h, classes):
    from simulator.engines.des_tiers import run_tiered
    from simulator.engines.streams import replica_streams
    from simulator.model.trace import ClassTrace

    trace = ClassTrace(times_s=np.asarray(times_h) * 3600.0, classes=np.asarray(classes))
    return run_tiered(scenario, schedule, 1, replica_streams(1), failure_times=trace)


def test_a_tier_with_no_copy_counts_from_the_start_so_quicker_failures_cannot_put_it_off():
    # Process failures every 0.4 h of wall, each restored from memory; the persistent tier is
    # due every 1 h of compute. Counted from each restore point (the old rule) it was never
    # due, and the node loss at 5 h lost everything; counted from the start (the controller's
    # rule, tiers.interval_origin) it is saved as soon as 1 h of work is done.
    s = Scenario(**{**TWO, "work_h": 6.0})
    schedule = TierSchedule({"memory": 600.0, "persistent": 3600.0})
    times = [0.4 * k for k in range(1, 13)] + [5.0]
    got = _replay(s, schedule, times, ["process"] * 12 + ["node"])
    assert got["saves_persistent"] >= 2  # during the failures, and at the end
    assert got["restores_persistent"] == 1
    assert got["lost_by_node_s"] < 3600.0  # at most an interval back, not to the start


def test_interval_origin_is_the_newest_copy_that_serves_the_tiers_failures():
    from simulator.model.tiers import Tier, interval_origin

    memory = Tier(name="memory", checkpoint_s=1.0, survives=frozenset({"process"}))
    persistent = Tier(name="persistent", checkpoint_s=9.0, survives=frozenset({"process", "node"}))
    tiers = [memory, persistent]
    # Restored from persistent after a node loss: memory counts from that copy.
    assert interval_origin({"memory": None, "persistent": 50.0}, tiers, "memory") == 50.0
    # Restored from memory, persistent never saved: persistent counts from the start.
    assert interval_origin({"memory": 80.0, "persistent": None}, tiers, "persistent") == 0.0
    assert interval_origin({"memory": 80.0, "persistent": 30.0}, tiers, "persistent") == 30.0
    assert interval_origin({"memory": 80.0, "persistent": 30.0}, tiers, "memory") == 80.0


def test_a_just_in_time_save_written_into_a_tier_is_rolled_back_to_by_its_failures():
    # A preemption's save on its notice lands in memory (into = "memory"); a process crash
    # after it rolls back there, not to the older scheduled memory copy.
    spec = {
        **TWO,
        "work_h": 3.0,
        "failure_classes": [*TWO["failure_classes"], {"name": "preempt", "mtbf_h": 50.0}],
        "tiers": [
            {"name": "memory", "checkpoint_s": 0.5, "survives": ["process", "preempt"]},
            {"name": "persistent", "checkpoint_s": 10.0,
             "survives": ["process", "node", "preempt"]},
            {"name": "notice", "jit": True, "checkpoint_s": 1.0, "survives": ["preempt"]},
        ],
    }  # fmt: skip
    schedule = TierSchedule({"memory": 3000.0, "persistent": 9000.0})
    times, classes = [1.0, 1.1], ["preempt", "process"]
    plain = _replay(Scenario(**spec), schedule, times, classes)
    spec["tiers"][2] = {**spec["tiers"][2], "into": "memory"}
    into = _replay(Scenario(**spec), schedule, times, classes)
    assert into["lost_by_process_s"] < plain["lost_by_process_s"]
    assert into["restores_memory"] == plain["restores_memory"] == 1
    with pytest.raises(InputError, match="into = 'nosuch' names no tier"):
        spec["tiers"][2] = {**spec["tiers"][2], "into": "nosuch"}
        Scenario(**spec)
    with pytest.raises(InputError, match="into names the tier a just-in-time save"):
        spec["tiers"][2] = {"name": "x", "checkpoint_s": 1.0, "survives": ["preempt"],
                            "into": "memory"}  # fmt: skip
        Scenario(**spec)


def _preempted(into: str | None) -> Scenario:
    # Preemptions every 2 h, each saved just in time on its notice; node losses every 50 h,
    # which only the costly persistent tier survives.
    notice = {"name": "notice", "jit": True, "checkpoint_s": 10.0, "restore_s": 20.0,
              "survives": ["preempt"]}  # fmt: skip
    if into is not None:
        notice["into"] = into
    return Scenario(
        gpus=64,
        work_h=400.0,
        restart_s=30.0,
        failure_classes=[
            {"name": "preempt", "mtbf_h": 2.0, "nodes_lost": 0},
            {"name": "node", "mtbf_h": 50.0},
        ],
        tiers=[
            {"name": "persistent", "checkpoint_s": 300.0, "restore_s": 60.0,
             "survives": ["preempt", "node"]},
            notice,
        ],
    )  # fmt: skip


def test_the_closed_form_counts_a_just_in_time_save_into_a_tier_as_a_copy_there_as_the_des():
    from simulator.tier_recommend import what_it_assumes

    # Each preemption's save lands in the persistent tier (into) and restarts its interval, so
    # a node loss rolls back less far and fewer scheduled saves are needed. The closed form
    # used to ignore `into` (the same plan and waste with it as without); it now counts those
    # saves as copies (tiers.refreshed_by) and agrees with the DES, which made them all along.
    plain, into = _preempted(None), _preempted("persistent")
    said = what_it_assumes(into, into.tiers[1])
    assert "save it into persistent, where it counts as a copy, in 10 s" in said
    assert first_order_plan(into)["tier_intervals_s"]["persistent"] > (
        1.2 * first_order_plan(plain)["tier_intervals_s"]["persistent"]
    )
    for s, other in ((plain, into), (into, plain)):
        plan = first_order_plan(s)
        waste = run(s, TierSchedule(plan["tier_intervals_s"]), replicas=40, seed=5).records
        waste = waste["waste_fraction"]
        half = 3 * waste.std(ddof=1) / math.sqrt(waste.size)
        assert waste.mean() == pytest.approx(plan["waste_fraction"], abs=half)
        # The two closed forms are far apart: the DES tells which one holds.
        assert abs(waste.mean() - first_order_plan(other)["waste_fraction"]) > 3 * half
