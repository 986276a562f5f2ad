"""The two-tier schedule: priors from a scenario's tables, classes from the run log, due steps."""

from __future__ import annotations

import math

import pytest

from simulator.controller.estimate import FailureRatePosterior
from simulator.controller.runlog import failure_evidence, failures_by_class
from simulator.controller.tier_schedule import (
    NEVER,
    TieredSchedule,
    default_process_share,
    scenario_priors,
    tier_scenario,
)
from simulator.model.scenario import load_scenario
from simulator.model.tiers import first_order_plan
from simulator.policies import Adaptive


def _events(*sessions):
    """Run-log events: each session is (id, local_found or None, how it ended)."""
    out = []
    for sid, found, end in sessions:
        start = {"event": "start", "session": sid, "session_s": 0.0, "records_train": True}
        if found is not None:
            start["local_found"] = found
        out += [start, {"event": "train", "session": sid, "session_s": 1.0, "step": 1}]
        out.append({"event": "save", "session": sid, "session_s": 10.0, "step": 5})
        if end != "crash":
            out.append({"event": end, "session": sid, "session_s": 11.0})
    return out


def test_a_restart_that_found_its_local_tier_was_a_process_failure_one_that_did_not_a_node_loss():
    events = _events(
        ("a", False, "crash"),  # the first session: found nothing, as any first one
        ("b", True, "crash"),  # a found it: a's failure was a process failure
        ("c", False, "preempted"),  # c did not: b lost its node; c was preempted (no failure)
        ("d", True, "crash"),  # after a preemption: no failure to classify
    )
    assert failures_by_class(events, exclude_session="now", local_found=False) == {
        "process": 1,
        "node": 2,  # b's, and d's (the current session found nothing)
    }
    assert failure_evidence(events, exclude_session="now").failures == 3
    # A successor that recorded nothing (no local tier then) counts on the safe side.
    events = _events(("a", None, "crash"), ("b", None, "stop"))
    assert failures_by_class(events, exclude_session="now", local_found=True) == {
        "process": 0,
        "node": 1,
    }


def test_the_default_split_is_llama3s_share_of_failures_whose_host_survived():
    # Table 5 of the Llama 3 paper: software (56) and hangs (7) of 419 interruptions leave
    # their hosts up; the preset's rates give the same share.
    assert default_process_share() == pytest.approx((56 + 7) / 419, rel=0.02)
    # One split for every caller: the classes' rates add up to the job's, in that share.
    from simulator.controller.tier_schedule import mtbf_by_class

    split = mtbf_by_class(3600.0)
    assert 1 / split["process"] + 1 / split["node"] == pytest.approx(1 / 3600.0, rel=1e-12)
    assert 3600.0 / split["process"] == pytest.approx(default_process_share(), rel=1e-12)


def test_priors_come_from_a_scenarios_tier_and_class_tables():
    mix = load_scenario("llama3-tiers")
    priors = scenario_priors(mix)
    host_lives = sum(
        c.rate_per_s(mix.gpus, mix.nodes) for c in mix.failure_classes if c.nodes_lost == 0
    )
    assert priors["mtbf_s"]["process"] == pytest.approx(1 / host_lives)
    assert priors["stall_s"] == {"local": 2.0, "persistent": 60.0}
    single = load_scenario("llama3")
    split = scenario_priors(single)["mtbf_s"]
    assert 1 / split["process"] + 1 / split["node"] == pytest.approx(1 / single.system_mtbf_s)


def _schedule(fixed=None, **kw):
    priors = {
        "process": FailureRatePosterior.from_prior(100.0),
        "node": FailureRatePosterior.from_prior(1000.0),
    }
    s = TieredSchedule(
        class_priors=priors, local_prior_s=0.02, fixed=fixed, policy=Adaptive(),
        prior=FailureRatePosterior.from_prior(1 / (1 / 100 + 1 / 1000)), restart_s=5.0,
        checkpoint_prior_s=0.5, asynchronous=False, probe_steps=10, **kw,
    )  # fmt: skip
    s.iteration.update(0.1)
    return s


def test_each_tier_counts_from_its_own_last_save_and_a_restart_from_its_newest_copy():
    s = _schedule()
    plan = s.plan_s()
    want = first_order_plan(
        tier_scenario(
            local_s=0.02, persistent_s=0.5, rates_per_s={"process": 0.01, "node": 0.001},
            restart_s=5.0,
        )
    )["tier_intervals_s"]  # fmt: skip
    assert plan == pytest.approx(want)
    assert plan["local"] == pytest.approx(math.sqrt(2 * 0.02 / 0.01))  # 2 s: 20 steps
    assert plan["persistent"] == pytest.approx(math.sqrt(2 * 0.5 / 0.001))  # 31.6 s: 316 steps
    assert s.next_due(0, age_s=0.0) == 20
    assert s.tiers_due(20) == ["local"]
    assert s.next_due(20, age_s=2.0, tier="local") == 40
    assert s.due == {"local": 40, "persistent": 316}
    # Restored at step 50 from a local copy; the newest persistent copy is at step 0.
    s.restart(50, 0)
    assert s.due == {"local": 70, "persistent": 316}
    plans = []
    s.plan_s = lambda plan=s.plan_s: plans.append(1) or plan()  # the plan is asked once
    s.restart(400, 0)  # the persistent tier is overdue: saved at the first step
    assert s.due["persistent"] == 401 and len(plans) == 1


def test_failures_of_a_class_shorten_only_the_interval_of_the_tier_it_needs():
    s = _schedule()
    before = s.plan_s()
    s.set_history(4, 200.0, {"process": 4, "node": 0})
    after = s.plan_s()
    # Gamma-Poisson: process (2 + 4) / (200 + 200) s, node (2 + 0) / (2000 + 200) s.
    assert after["local"] == pytest.approx(math.sqrt(2 * 0.02 * 400 / 6))
    assert after["persistent"] == pytest.approx(math.sqrt(2 * 0.5 * 2200 / 2))
    assert after["local"] < before["local"] < before["persistent"] < after["persistent"]


def test_a_disabled_local_tier_leaves_the_persistent_tier_serving_every_class():
    s = _schedule()
    s.local_enabled = False
    plan = s.plan_s()
    assert plan["persistent"] == pytest.approx(math.sqrt(2 * 0.5 / 0.011))
    s.next_due(0, age_s=0.0)
    assert s.due["local"] == NEVER and s.tiers_due(10**6) == ["persistent"]


def test_fixed_intervals_need_no_measured_save_and_milestones_are_persistent_saves():
    s = _schedule(fixed={"local": 1.0, "persistent": 5.0}, milestones=(30,))
    s.checkpoint_prior_s = s.local_prior_s = None
    assert not s.needs_first_save
    assert s.next_due(0, age_s=0.0) == 10
    assert s.due == {"local": 10, "persistent": 30}  # the milestone comes before step 50
