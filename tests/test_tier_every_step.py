"""A tier saved after every training step (in-memory with a peer copy, as Gemini does), and the
job's final save in the first-order plan."""

from __future__ import annotations

import json
import math
import textwrap

import numpy as np
import pytest

from simulator.cli import main
from simulator.engines.budget import tier_estimate
from simulator.engines.des_replicas import simulate
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.model.tier_plan import first_order_plan, recommend_tiers, wall_per_work, waste_at
from simulator.model.tiers import TierSchedule

STEP = {"name": "memory", "every_step": True, "step_s": 5.0, "step_stall_s": 0.05,
        "restore_s": 10.0, "survives": ["process"]}  # fmt: skip
PERSISTENT = {"name": "persistent", "checkpoint_s": 10.0, "restore_s": 20.0,
              "survives": ["process", "node"]}  # fmt: skip
JOB = dict(
    gpus=64,
    work_h=200.0,
    restart_s=0.0,
    failure_classes=[
        {"name": "process", "mtbf_h": 10.0, "nodes_lost": 0, "detection_s": 30.0},
        {"name": "node", "mtbf_h": 100.0},
    ],
    tiers=[STEP, PERSISTENT],
)


def run(s, intervals, replicas=20, seed=3):
    return simulate(
        s, TierSchedule(intervals), replicas=replicas, seed=seed, workers=1, progress=False
    ).records


def test_a_failure_the_step_tier_survives_loses_only_the_step_under_way():
    rec = run(Scenario(**JOB), {"persistent": 2700.0})
    assert rec["failures_process"].sum() > 200
    # Each process failure loses less than one 5 s step; the node losses roll back further.
    assert (rec["lost_by_process_h"] * 3600 <= rec["failures_process"] * 5.0 + 1e-6).all()
    lost_per = rec["lost_by_process_h"].sum() * 3600 / rec["failures_process"].sum()
    assert lost_per == pytest.approx(2.5, rel=0.15)  # half a step on average
    assert rec["lost_by_node_h"].sum() * 3600 / rec["failures_node"].sum() > 100
    assert (rec["restores_memory"] <= rec["failures_process"]).all()
    assert (rec["restores_memory"] > 0).all()
    total = rec["useful_h"] + rec["lost_h"] + rec["checkpoint_h"] + rec["recovery_h"]
    np.testing.assert_allclose(total, rec["wall_h"], rtol=1e-12)


def test_every_step_stalls_training_by_its_share_of_the_compute():
    # No scheduled saves but the final one: the stalls are the steps' and that one save.
    rec = run(Scenario(**JOB), {"persistent": math.inf}, replicas=6)
    computed = rec["useful_h"] + rec["lost_h"]
    np.testing.assert_allclose(rec["checkpoint_h"], computed * 0.05 / 5.0 + 10.0 / 3600, rtol=1e-9)
    assert (rec["saves_memory"] == np.floor(computed * 3600 / 5.0)).all()
    assert (rec["saves_persistent"] == 1).all()


def test_the_first_order_plan_charges_half_a_step_and_the_stall_and_the_des_agrees():
    s = Scenario(**JOB)
    plan = first_order_plan(s)
    assert set(plan["tier_intervals_s"]) == {"persistent"}  # every step takes no interval
    lam_p, lam_n = 1 / 36000.0, 1 / 360000.0
    assert plan["tier_intervals_s"]["persistent"] == pytest.approx(math.sqrt(2 * 10 / lam_n))
    expected = (
        0.05 / 5.0  # each step's stall
        + lam_p * (30.0 + 10.0 + 2.5)  # detection, restore from memory, half a step
        + math.sqrt(2 * lam_n * 10.0)
        + lam_n * 20.0  # the persistent tier's first order
    )
    assert plan["waste_fraction"] == pytest.approx(expected, rel=1e-12)
    assert waste_at(s, plan["tier_intervals_s"]) == pytest.approx(expected, rel=1e-12)
    rec = run(s, plan["tier_intervals_s"], replicas=40, seed=11)
    waste = rec["waste_fraction"]
    half = 4 * waste.std(ddof=1) / math.sqrt(waste.size)
    assert abs(waste.mean() - (plan["waste_fraction"] + 10.0 / 720000.0)) < half
    assert half < 0.2 * plan["waste_fraction"]


def test_optimize_shows_the_step_tier_and_its_simulation_runs_the_single_tier_without_it(
    capsys, tmp_path
):
    path = tmp_path / "step.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 64
        work_h = 20
        restart_s = 0
        usd_per_gpu_hour = 2.0
        [[failure_class]]
        name = "process"
        mtbf_h = 2
        nodes_lost = 0
        [[failure_class]]
        name = "node"
        mtbf_h = 20
        [[tier]]
        name = "memory"
        every_step = true
        step_s = 5
        step_stall_s = 0.05
        survives = ["process"]
        [[tier]]
        name = "persistent"
        checkpoint_s = 10
        survives = ["process", "node"]
        """)
    )
    assert main(["optimize", "--scenario", str(path), "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert got["every_step_failure_rates_per_h"] == {"memory": pytest.approx(0.5)}
    assert set(got["tier_intervals_s"]) == {"persistent"}
    assert "after every 5 s step" in got["assumes"]["tiers"][0]
    assert main(["optimize", "--scenario", str(path)]) == 0
    out = capsys.readouterr().out
    assert "every step" in out and "one tier (persistent" in out
    argv = ["optimize", "--scenario", str(path), "--simulate", "--replicas", "4", "--json",
            "--no-progress"]  # fmt: skip
    assert main(argv) == 0
    sim = json.loads(capsys.readouterr().out)["simulated"]
    # The single tier (persistent alone) pays every process failure with lost work.
    assert sim["single_tier_simulated"]["waste_fraction"] > sim["waste_fraction"]
    code = main(["simulate", "--scenario", str(path), "--tier-interval-s", "memory=60"])
    err = capsys.readouterr().err
    assert code == 2 and "saved after every training step (every_step): it takes no interval" in err


@pytest.mark.parametrize(
    "fields, fragment",
    [
        ({"checkpoint_s": 2.0}, "an every_step tier is saved after every step"),
        ({"interval_s": 60.0}, "it takes no interval_s"),
        ({"step_s": None}, "every_step needs step_s"),
        ({"step_stall_s": -1.0}, "step_stall_s must be a non-negative number of seconds"),
        ({"every_step": "yes"}, "every_step must be true or false"),
        ({"every_step": False}, "step_s and step_stall_s need every_step = true"),
    ],
)
def test_a_bad_every_step_tier_is_one_line(fields, fragment):
    tier = {k: v for k, v in {**STEP, **fields}.items() if v is not None}
    with pytest.raises(InputError) as info:
        Scenario(**{**JOB, "tiers": [tier, PERSISTENT]})
    assert fragment in str(info.value) and "\n" not in str(info.value)


def test_a_job_has_one_training_step_so_one_every_step_tier():
    other = {**STEP, "name": "peer"}
    with pytest.raises(InputError, match="'memory' and 'peer' are both saved every step"):
        Scenario(**{**JOB, "tiers": [STEP, other, PERSISTENT]})


def test_the_budget_counts_no_event_per_step_and_the_stall_in_the_wall_time():
    s = Scenario(**JOB)
    plan = first_order_plan(s)
    est = tier_estimate(s, [TierSchedule(plan["tier_intervals_s"])], replicas=1)
    wall = 200 * 3600.0 * wall_per_work(s, plan["tier_intervals_s"])
    saves = wall / plan["tier_intervals_s"]["persistent"]
    failures = wall * s.failure_rate_per_s
    assert est.events == pytest.approx(failures + saves + 1.0)  # components cost time apart
    # The step's stall is in the wall time: more than the work alone, with the same failures.
    assert wall > 200 * 3600.0 * (1 + 0.05 / 5.0)


# -- the job's final save ------------------------------------------------------------------
def test_the_final_save_is_paid_once_and_the_job_waste_adds_it_to_the_rate():
    s = Scenario(
        gpus=64, work_h=10.0, restart_s=0.0,
        failure_classes=[{"name": "rare", "mtbf_h": 1e9}],
        tiers=[
            {"name": "memory", "checkpoint_s": 1.0, "survives": []},
            {"name": "persistent", "checkpoint_s": 30.0, "asynchronous": True, "staging_s": 5.0,
             "survives": ["rare"]},
        ],
    )  # fmt: skip
    plan = first_order_plan(s)
    # The final state goes to persistent alone (its copy outlives memory's): its 5 s staging
    # stall and the 30 s write the job waits for before it ends.
    assert plan["final_save_s"] == 35.0
    out = recommend_tiers(s)
    work = 10 * 3600.0
    wall = work / (1 - out["optimal_waste_fraction"]) + 35.0
    assert out["job_waste_fraction"] == pytest.approx(1 - work / wall, rel=1e-12)
    # With no failure in the job, the DES's waste is exactly the final save's share.
    rec = run(s, {"memory": math.inf, "persistent": math.inf}, replicas=2)
    assert (rec["failures"] == 0).all()
    np.testing.assert_allclose(rec["waste_fraction"], 35.0 / (work + 35.0), rtol=1e-12)
    # The plan's job waste says the same, less than its own rate term (~2e-6) apart.
    assert abs(rec["waste_fraction"][0] - out["job_waste_fraction"]) < 3e-6
    assert abs(rec["waste_fraction"][0] - out["optimal_waste_fraction"]) > 9e-4  # the rate alone


def test_the_checks_per_replica_waste_pairs_strategies_on_the_same_failures():
    from simulator.tier_search import simulate_tier_plan

    s = Scenario(**{**JOB, "work_h": 20.0})
    step = simulate_tier_plan(s, replicas=3, seed=4, per_replica=True)
    memory = {"name": "memory", "checkpoint_s": 1.0, "restore_s": 10.0, "survives": ["process"]}
    two = simulate_tier_plan(
        Scenario(**{**JOB, "work_h": 20.0, "tiers": [memory, PERSISTENT]}), replicas=3, seed=4,
        per_replica=True,
    )  # fmt: skip
    for sim in (step, two):
        assert np.mean(sim["check_waste"]["tiers"]) == pytest.approx(sim["waste_fraction"])
        assert set(sim["check_waste"]) == {"tiers", "single_tier", "first_order"}
    # The single tier (persistent alone) is the same schedule on the same failures in both.
    assert step["check_waste"]["single_tier"] == two["check_waste"]["single_tier"]


def test_the_example_file_with_every_new_field_loads_and_is_planned(capsys):
    from pathlib import Path

    path = Path(__file__).parents[1] / "experiments/scenarios/llama3-every-step-bursts.toml"
    assert main(["optimize", "--scenario", str(path), "--json"]) == 0
    captured = capsys.readouterr()
    got = json.loads(captured.out)
    assert set(got["tier_intervals_s"]) == {"persistent"}
    assert got["every_step_failure_rates_per_h"]["memory"] > 0.3
    assert "failure class 'network' comes in bursts" in captured.err
    classes = {c["name"]: c for c in got["scenario"]["failure_class"]}
    assert classes["hang"]["detection"] == "lognormal:sigma=1"
