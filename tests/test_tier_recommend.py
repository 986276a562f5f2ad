"""What `ckptsim optimize` says for a tiered scenario (simulator.tier_recommend): the closed
form, where it is exact, where it is rough, and the simulated optimum as the recommendation."""

from __future__ import annotations

import itertools
import json
import math
import textwrap
from pathlib import Path

import numpy as np
import pytest
from _cli import run_cli as run

from simulator.model.scenario import Scenario, load_scenario
from simulator.model.tier_plan import first_order_plan, single_tier_plan
from simulator.model.tiers import TierSchedule
from simulator.recommend import recommend
from simulator.tier_recommend import recommend_tiers
from simulator.tier_search import evaluate_schedules

JOB = dict(gpus=16384, gpus_per_node=8, restart_s=600.0, work_h=1296.0, usd_per_gpu_hour=2.0)


# -- every failure needs the persistent tier: exactly today's single-tier optimum -------------
def one_class_one_tier(**tier) -> Scenario:
    return Scenario(
        **JOB,
        failure_classes=[{"name": "all", "gpu_mtbf_h": 50677.0, "restart_s": 600.0}],
        tiers=[{"name": "persistent", "checkpoint_s": 60.0, "survives": ["all"], **tier}],
    )


def test_one_tier_serving_every_class_is_todays_single_tier_optimum_to_the_bit():
    plain = recommend(Scenario(**JOB, gpu_mtbf_h=50677.0, checkpoint_s=60.0))
    got = recommend_tiers(one_class_one_tier())
    assert got["tier_intervals_s"] == {"persistent": plain["optimal_interval_s"]}
    assert got["optimal_waste_fraction"] == plain["optimal_waste_fraction"]
    assert got["usd_lost_per_day"] == plain["usd_lost_per_day"]
    assert got["single_tier_interval_s"] == plain["optimal_interval_s"]
    assert got["single_tier_waste_fraction"] == plain["optimal_waste_fraction"]
    assert "exact single-tier optimum" in got["method"] and got["warnings"] == []
    # An asynchronous tier whose write ends well inside the interval is today's too.
    plain = recommend(
        Scenario(**JOB, gpu_mtbf_h=50677.0, checkpoint_s=100.0, async_checkpoint=True,
                 staging_s=5.0)
    )  # fmt: skip
    got = recommend_tiers(one_class_one_tier(checkpoint_s=100.0, asynchronous=True, staging_s=5))
    assert got["tier_intervals_s"]["persistent"] == plain["optimal_interval_s"]
    assert got["optimal_waste_fraction"] == plain["optimal_waste_fraction"]


def test_several_classes_on_one_tier_are_one_job_at_their_total_rate_and_mean_recovery():
    s = Scenario(
        **JOB,
        failure_classes=[
            {"name": "gpu", "gpu_mtbf_h": 80000.0, "detection_s": 60.0},
            {"name": "hang", "node_mtbf_h": 20000.0, "detection_s": 600.0, "restart_s": 300.0},
        ],
        tiers=[
            {"name": "memory", "checkpoint_s": 2.0, "survives": []},
            {"name": "persistent", "checkpoint_s": 60.0, "restore_s": 30.0,
             "survives": ["gpu", "hang"]},
        ],
    )  # fmt: skip
    lam = [16384 / (80000 * 3600.0), 2048 / (20000 * 3600.0)]
    recovery = [60 + 600 + 30, 600 + 300 + 30]
    mean = sum(r * x for r, x in zip(lam, recovery, strict=True)) / sum(lam)
    plain = recommend(
        Scenario(**{**JOB, "restart_s": mean}, mtbf_h=1 / sum(lam) / 3600, checkpoint_s=60.0)
    )
    got = recommend_tiers(s)
    assert got["tier_intervals_s"] == {
        "memory": math.inf,
        "persistent": pytest.approx(plain["optimal_interval_s"], rel=1e-12),
    }
    assert got["optimal_waste_fraction"] == pytest.approx(plain["optimal_waste_fraction"], 1e-12)
    # The first-order plan stays the closed form it was (Young's interval), under its key.
    assert first_order_plan(s)["tier_intervals_s"]["persistent"] == pytest.approx(
        math.sqrt(2 * 60 / sum(lam))
    )


def test_the_cli_gives_a_one_tier_file_what_it_gives_the_same_job_without_tiers(capsys, tmp_path):
    head = "\n".join(f"{k} = {v!r}" for k, v in JOB.items()) + "\n"
    plain, tiered = tmp_path / "plain.toml", tmp_path / "tiered.toml"
    plain.write_text(head + "gpu_mtbf_h = 50677.0\ncheckpoint_s = 60.0\n")
    tiered.write_text(head + textwrap.dedent("""
        [[failure_class]]
        name = "all"
        gpu_mtbf_h = 50677.0
        [[tier]]
        name = "persistent"
        checkpoint_s = 60.0
        survives = ["all"]
    """))  # fmt: skip
    a = json.loads(run(capsys, "optimize", "--scenario", str(plain), "--json")[1])
    b = json.loads(run(capsys, "optimize", "--scenario", str(tiered), "--json")[1])
    assert b["tier_intervals_s"]["persistent"] == a["optimal_interval_s"]
    assert b["optimal_waste_fraction"] == a["optimal_waste_fraction"]
    assert b["usd_lost_per_day"] == a["usd_lost_per_day"]


# -- an asynchronous tier is saved no more often than its write lasts ------------------------
def async_job(**extra) -> Scenario:
    return Scenario(
        gpus=64, work_h=20.0, restart_s=60.0, usd_per_gpu_hour=2.0,
        failure_classes=[
            {"name": "crash", "mtbf_h": 2.0, "nodes_lost": 0},
            {"name": "node", "mtbf_h": 200.0},
        ],
        tiers=[
            {"name": "memory", "checkpoint_s": 1.0, "survives": ["crash"]},
            {"name": "persistent", "checkpoint_s": 600.0, "asynchronous": True,
             "staging_s": 5.0, "survives": ["crash", "node"], **extra},
        ],
    )  # fmt: skip


def test_an_async_tiers_interval_is_no_shorter_than_its_write_and_it_is_warned():
    from simulator.controller.schedule import after_the_write

    s = async_job()
    single = single_tier_plan(s)
    # Every save persistent at the exact optimum would be every ~4.5 min; the write is 10 min.
    assert single["raised_to_write_s"][0] < 300 and single["interval_s"] == 600.0
    assert single["interval_s"] == after_the_write(single["raised_to_write_s"][0], 600.0)
    fast = async_job(checkpoint_s=60.0)  # a write well inside the interval: unchanged
    assert single_tier_plan(fast)["raised_to_write_s"] is None
    got = recommend_tiers(s)
    assert got["single_tier_interval_s"] == 600.0
    assert any("'persistent' is asynchronous and its background write (10.0 min)" in w
               for w in got["warnings"])  # fmt: skip
    # The tiers' persistent interval (node losses alone) is longer than the write: not raised.
    assert first_order_plan(s)["raised_to_write_s"] == {}
    # The rule pays on the DES: saving at the unraised optimum makes every save wait for the
    # write before it; at the raised interval none does. The same failures for both.
    raised, unraised = (
        TierSchedule({"memory": math.inf, "persistent": x})
        for x in (single["interval_s"], single["raised_to_write_s"][0])
    )
    walls = evaluate_schedules(s, [raised, unraised], replicas=6, seed=3, workers=1)
    waste = 1 - s.work_s / walls
    assert np.all(waste[0] < waste[1] - 0.05)


def test_a_first_order_interval_shorter_than_its_tiers_write_is_raised_too():
    data = async_job().to_dict()  # node losses 50x as often
    data["failure_class"][1]["mtbf_h"] = 4.0
    s = Scenario.from_mapping(data)
    plan = first_order_plan(s)
    first = math.sqrt(2 * 5.0 / (1 / (4 * 3600.0)))
    assert plan["raised_to_write_s"] == {"persistent": (pytest.approx(first), 600.0)}
    assert plan["tier_intervals_s"]["persistent"] == 600.0
    got = recommend_tiers(s)
    assert any("outlasts its first-order interval" in w for w in got["warnings"])


# -- where the first order is rough, it says so; --simulate is the recommendation ------------
def test_the_first_order_plan_says_it_is_rough_where_failures_are_not_rare(capsys):
    code, _, err = run(capsys, "optimize", "--scenario", "llama3-tiers", "--json")
    assert code == 0 and "failures are not rare against the tiers' intervals" in err
    assert "above 0.05" in err and "--simulate gives the recommendation" in err
    code, _, err = run(capsys, "optimize", "--scenario", "llama3-tiers", "--gpus", "1024",
                       "--json")  # fmt: skip
    assert code == 0 and "not rare" not in err
    code, out, _ = run(capsys, "optimize", "--scenario", "llama3-tiers")
    assert "Recommendation (closed form)" in out and "add --simulate" in " ".join(out.split())


def test_with_simulate_the_recommendation_and_its_keys_are_the_simulated_optimum(capsys, tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 1024
        work_h = 100
        restart_s = 300
        usd_per_gpu_hour = 2.0
        [[failure_class]]
        name = "process"
        gpu_mtbf_h = 20000
        [[failure_class]]
        name = "node"
        node_mtbf_h = 20000
        [[tier]]
        name = "memory"
        checkpoint_s = 2
        survives = ["process"]
        [[tier]]
        name = "persistent"
        checkpoint_s = 60
        survives = ["process", "node"]
    """)
    )
    closed = recommend_tiers(load_scenario(path))
    job = ["optimize", "--scenario", str(path), "--simulate", "--replicas", "6", "--workers", "1"]
    code, out, err = run(capsys, *job, "--json")
    assert code == 0, err
    got = json.loads(out)
    sim = got["simulated"]
    assert got["recommended_by"] == "simulated optimum" or got["recommended_by"].startswith(
        "closed form, simulated"
    )
    picked = sim if got["recommended_by"] == "simulated optimum" else sim["first_order"]
    if got["recommended_by"] == "simulated optimum":
        assert got["tier_intervals_s"] == sim["tier_intervals_s"]
    assert got["optimal_waste_fraction"] == picked["waste_fraction"]
    assert got["usd_lost_per_day"] == picked["usd_lost_per_day"]
    assert got["single_tier_interval_s"] == sim["single_tier_interval_s"]
    assert got["single_tier_waste_fraction"] == sim["single_tier_simulated"]["waste_fraction"]
    # The closed form stays, whole, under its own key.
    assert got["closed_form"]["tier_intervals_s"] == closed["closed_form"]["tier_intervals_s"]
    assert got["closed_form"]["optimal_waste_fraction"] == closed["optimal_waste_fraction"]
    assert got["recommendation"].startswith("Recommendation (simulated, 6 replicas")
    code, out, _ = run(capsys, *job)
    assert code == 0 and out.rstrip().splitlines()[-1].strip().endswith(".")
    text = " ".join(out.split())
    assert "Recommendation (simulated, 6 replicas a schedule)" in text
    assert "Recommendation (closed form)" not in text


# -- what it says is true ---------------------------------------------------------------------
def test_when_the_cheap_tier_is_the_single_tier_it_is_not_called_a_cheaper_tier(capsys, tmp_path):
    # Both tiers survive every class: memory, the cheaper, is the one tier; persistent takes
    # only the final save. Was: "one tier (memory); the cheaper tiers do not pay for their
    # saves", though memory is the cheap one.
    path = tmp_path / "allmem.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 1024
        work_h = 200
        restart_s = 600
        [[failure_class]]
        name = "gpu"
        gpu_mtbf_h = 80000
        [[tier]]
        name = "memory"
        checkpoint_s = 2
        survives = ["gpu"]
        [[tier]]
        name = "persistent"
        checkpoint_s = 60
        survives = ["gpu"]
    """)
    )
    code, out, _ = run(capsys, "optimize", "--scenario", str(path))
    text = " ".join(out.split())
    assert code == 0 and "cheaper tiers" not in text
    assert "save to memory every" in text and "persistent takes no saves on a schedule" in text
    assert "persistent final save only" in text


def test_a_scenario_without_jit_or_every_step_tiers_says_how_to_weigh_them(capsys):
    code, out, _ = run(capsys, "optimize", "--scenario", "llama3-tiers")
    text = " ".join(out.split())
    assert code == 0 and "add a [[tier]] with jit = true" in text
    assert "every_step = true, step_s and step_stall_s" in text
    example = Path(__file__).parents[1] / "experiments/scenarios/llama3-every-step-bursts.toml"
    code, out, _ = run(capsys, "optimize", "--scenario", str(example))
    assert code == 0 and "add a [[tier]] with jit" not in out


def test_the_tier_table_keeps_its_columns_aligned(capsys, tmp_path):
    path = tmp_path / "rare.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 1024
        work_h = 200
        [[failure_class]]
        name = "process"
        gpu_mtbf_h = 20000
        [[tier]]
        name = "memory"
        checkpoint_s = 2
        survives = ["process"]
        [[tier]]
        name = "persistent"
        checkpoint_s = 60
        survives = ["process"]
    """)
    )
    code, out, _ = run(capsys, "optimize", "--scenario", str(path))
    rows = out.splitlines()
    head = next(i for i, line in enumerate(rows) if line.startswith("tier "))
    widths = {len(line) for line in rows[head : head + 3]}
    assert code == 0 and "final save only" in rows[head + 2] and len(widths) == 1


# -- the work budget of a tiered run ------------------------------------------------------------
def test_the_tier_budget_lets_a_routine_search_run_and_counts_stalls_against_the_compute(capsys):
    from simulator.engines import budget
    from simulator.tier_search import budget_schedules

    s = load_scenario("llama3-tiers")
    # 200 replicas of the search ran in ~650 s of one core; it was estimated at 5.4 h and
    # refused. Now it is estimated within the default half hour (and above what it took:
    # experiments/bench_tier_budget.py measures the ratio: reports/tier-budget.md).
    est = budget.tier_estimate(s, budget_schedules(s), 200)
    assert 650 < est.core_s < budget.DEFAULT_MAX_CORE_HOURS * 3600
    # A memory save every 2 s that stalls 2 s doubles the wall time: not "no headway".
    est = budget.tier_estimate(s, [TierSchedule({"memory": 2.0, "persistent": 3600.0})], 1)
    assert 2.0 < est.wall_factor < 2.5
    code, out, err = run(capsys, "simulate", "--scenario", "llama3-tiers", "--work-h", "1",
                         "--tier-interval-s", "memory=2", "--replicas", "2", "--workers", "1",
                         "--json")  # fmt: skip
    assert code == 0, err
    assert 0.45 < json.loads(out)["waste_fraction_mean"] < 0.6  # the DES: about half the wall


def test_a_heavily_failing_job_runs_with_tier_tables_as_it_does_without(capsys, tmp_path):
    # An MTBF of 586 s against a 600 s restart: the first-order charge passes 1, where the
    # budget's old (1 + S)/(1 - F) had a pole and refused the job as "no headway" although
    # the same job without tables ran (the untiered budget uses Daly's exact wall time).
    job = "gpus = 1024\ngpus_per_node = 8\nwork_h = 5\nusd_per_gpu_hour = 2\n"
    tiered = tmp_path / "tiered.toml"
    tiered.write_text(
        job + '[[failure_class]]\nname = "f"\nmtbf_h = 0.16276\nrestart_s = 600\n'
        '[[tier]]\nname = "p"\ncheckpoint_s = 60\nsurvives = ["f"]\n'
    )
    flat = tmp_path / "flat.toml"
    flat.write_text(job + "mtbf_h = 0.16276\nrestart_s = 600\ncheckpoint_s = 60\n")
    walls = {}
    for path, flags in ((tiered, ["--tier-interval-s", "p=300"]), (flat, ["--interval-s", "300"])):
        code, out, err = run(capsys, "simulate", "--scenario", str(path), *flags,
                             "--replicas", "8", "--workers", "1", "--json")  # fmt: skip
        assert code == 0, err
        walls[path.stem] = json.loads(out)["wall_h_mean"]
    assert walls["tiered"] == pytest.approx(walls["flat"], rel=0.35)  # the same job, ~25 h
    assert walls["flat"] > 3 * 5


# -- storage: the retained copies of the tiers the price applies to ---------------------------
def test_the_storage_bill_counts_each_persistent_tiers_retained_copies():
    from simulator.model.money import storage_usd_per_day

    s = load_scenario("llama3-tiers")  # 5.67 TB a checkpoint, 2 kept, $0.02 per GB-month
    got = recommend_tiers(s)
    expected = storage_usd_per_day(5.67e12, 2, 0.02)  # host memory is not billed
    assert got["storage_usd_per_day"] == pytest.approx(expected)
    assert got["single_tier_storage_usd_per_day"] == pytest.approx(expected)
    more = Scenario.from_mapping(
        {**s.to_dict(), "tier": [dict(t, retention=5) if t["name"] == "persistent" else t
                                 for t in s.to_dict()["tier"]]}
    )  # fmt: skip
    assert recommend_tiers(more)["storage_usd_per_day"] == pytest.approx(expected * 5 / 2)
    # A tier's own checkpoint_bytes is its size; without a price there is no bill.
    own = Scenario.from_mapping(
        {**s.to_dict(), "tier": [dict(t, checkpoint_bytes=1e12) if t["name"] == "persistent"
                                 else t for t in s.to_dict()["tier"]]}
    )  # fmt: skip
    assert recommend_tiers(own)["storage_usd_per_day"] == pytest.approx(
        storage_usd_per_day(1e12, 2, 0.02)
    )
    free = Scenario.from_mapping({k: v for k, v in s.to_dict().items() if k != "usd_per_gb_month"})
    assert recommend_tiers(free)["storage_usd_per_day"] is None


def test_simulates_summary_shows_the_just_in_time_tier_too(capsys, tmp_path):
    path = tmp_path / "jit.toml"
    path.write_text(
        textwrap.dedent("""
        gpus = 1024
        work_h = 50
        restart_s = 300
        [[failure_class]]
        name = "process"
        gpu_mtbf_h = 20000
        [[failure_class]]
        name = "node"
        node_mtbf_h = 20000
        [[tier]]
        name = "jit"
        jit = true
        checkpoint_s = 60
        survives = ["process"]
        [[tier]]
        name = "persistent"
        checkpoint_s = 60
        survives = ["process", "node"]
    """)
    )
    code, out, err = run(capsys, "optimize", "--scenario", str(path), "--simulate",
                         "--replicas", "3", "--workers", "1")  # fmt: skip
    assert code == 0, err
    simulated = out[out.index("Simulated optimum") :]
    assert "jit" in simulated and "on failure" in simulated


def test_the_help_examples_show_what_the_commands_print(capsys):
    from simulator.cli import optimize, simulate

    code, out, _ = run(capsys, "optimize", "--scenario", "llama3-tiers")
    shown = [line.strip() for line in optimize.EPILOG.splitlines() if line.startswith(" " * 8)]
    assert code == 0 and shown and all(line in out for line in shown[:3])
    assert "--tier-interval-s memory=600" in simulate.EPILOG
    assert "[[tier]]" in optimize.DESCRIPTION and "closed_form" in optimize.DESCRIPTION
    # Every example that goes on to a further line ends its line with a continuation.
    for text in (optimize.EPILOG, simulate.EPILOG):
        lines = text.splitlines()
        for line, after in itertools.pairwise(lines):
            if line.startswith("  ckptsim") and after.startswith("      --"):
                assert line.endswith(" \\"), line
