"""Failure classes and checkpoint tiers: the scenario's data model and the first-order optimum."""

from __future__ import annotations

import math
import textwrap

import numpy as np
import pytest

from simulator import analytic
from simulator.engines import choose
from simulator.errors import InputError
from simulator.model.scenario import Scenario, load_scenario
from simulator.model.tiers import TierSchedule, first_order_plan

TWO_TIERS = """
gpus = 1024
work_h = 10
restart_s = 300
[[failure_class]]
name = "process"
gpu_mtbf_h = 100000
nodes_lost = 0
[[failure_class]]
name = "node"
node_mtbf_h = 20000
detection_s = 60
restart_s = 900
[[tier]]
name = "memory"
checkpoint_s = 2
restore_s = 10
survives = ["process"]
[[tier]]
name = "persistent"
checkpoint_bytes = 1e12
storage_bytes_per_s = 1e10
async = true
staging_s = 5
restore_s = 120
survives = ["process", "node"]
"""


def write(tmp_path, text: str, name: str = "job.toml"):
    path = tmp_path / name
    path.write_text(textwrap.dedent(text))
    return path


def one_line_error(tmp_path, text: str) -> str:
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_scenario(path)
    message = str(info.value)
    assert "\n" not in message and str(path) in message
    return message


def test_a_toml_scenario_holds_tier_and_failure_class_tables(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    assert [t.name for t in s.tiers] == ["memory", "persistent"]
    assert [c.name for c in s.failure_classes] == ["process", "node"]
    memory, persistent = s.tiers
    assert memory.survives == {"process"} and persistent.survives == {"process", "node"}
    assert persistent.asynchronous and persistent.stall_s(128) == 5.0
    assert persistent.write_s(128) == pytest.approx(100.0)  # 1 TB at 10 GB/s
    assert s.failure_classes[0].nodes_lost == 0


def test_classes_superpose_into_the_jobs_failure_rate(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    expected = 1024 / (100000 * 3600.0) + 128 / (20000 * 3600.0)
    assert s.failure_rate_per_s == pytest.approx(expected, rel=1e-12)
    assert s.system_mtbf_s == pytest.approx(1 / expected, rel=1e-12) and s.has_mtbf


def test_a_tiered_scenario_round_trips_through_its_dict(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    d = s.to_dict()
    assert d["tier"][1]["async"] is True and d["tier"][1]["survives"] == ["node", "process"]
    assert Scenario.from_mapping(d) == s
    hash(s)  # frozen all the way down: usable as a cache key


def test_a_scenario_without_tables_has_no_tier_keys_and_its_old_rate():
    s = Scenario(gpus=16, gpu_mtbf_h=1600.0, node_mtbf_h=800.0, work_h=1.0)
    assert s.tiers == () and s.failure_classes == ()
    assert "tier" not in s.to_dict() and "tiers" not in s.to_dict()
    assert s.failure_rate_per_s == 16 / (1600 * 3600.0) + 2 / (800 * 3600.0)


@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('survives = ["process"]', 'survives = ["proces"]'), "unknown failure class 'proces'"),
        (("checkpoint_s = 2", "checkpoint_s = 2\nbandwidth = 3"), "unknown field 'bandwidth'"),
        (("checkpoint_s = 2", "checkpoint_s = -2"), "checkpoint_s must be a positive"),
        (
            (
                "checkpoint_s = 2",
                "checkpoint_s = 2\ncheckpoint_bytes = 1e9\nstorage_bytes_per_s = 1e9",
            ),
            "either checkpoint_s or checkpoint_bytes",
        ),
        (("staging_s = 5", ""), "async needs staging_s"),
        (('name = "memory"', 'name = "persistent"'), "named 'persistent'"),
        (("gpu_mtbf_h = 100000", "gpu_mtbf_h = 100000\nmtbf_h = 5"), "exactly one of"),
        (("nodes_lost = 0", "nodes_lost = 1.5"), "nodes_lost must be a whole number"),
        (("nodes_lost = 0", "nodes_lost = 129"), "more than the job's 128 nodes"),
        (
            ("checkpoint_s = 2", "checkpoint_s = 2\nasync = true\nstaging_s = 3"),
            "staging_s = 3 s is longer than the whole write, checkpoint_s = 2 s",
        ),
        (("detection_s = 60", 'detection_s = "a minute"'), "detection_s must be"),
        (("work_h = 10", "work_h = 10\nmtbf_h = 3"), "classes are the failure model"),
        (("async = true", 'async = "yes"'), "async must be true or false"),
    ],
)
def test_a_bad_tier_or_class_is_one_line_naming_the_value(tmp_path, edit, expected):
    old, new = edit
    assert old in TWO_TIERS
    assert expected in one_line_error(tmp_path, TWO_TIERS.replace(old, new, 1))


def test_tier_must_be_tables_not_a_value(tmp_path):
    assert "[[tier]] tables" in one_line_error(tmp_path, "mtbf_h = 5\ntier = 3\n")


def test_tiered_scenarios_are_routed_away_from_the_fast_engine_with_the_reason(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    assert "tiers" in choose.fast_refusal(s) and "failure_classes" in choose.fast_refusal(s)
    assert choose.choose_engine(s) == "des"
    with pytest.raises(InputError, match="fast engine does not model tiers"):
        choose.choose_engine(s, "fast")


def test_a_tiered_scenario_runs_on_the_des_with_per_class_and_per_tier_counts(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    schedule = TierSchedule({"memory": 300.0, "persistent": 3600.0})
    res = choose.simulate(s, schedule, replicas=2, seed=0, workers=1, progress=False)
    assert res.meta["engine"] == "des"
    for column in ("failures_process", "failures_node", "saves_memory", "saves_persistent"):
        assert column in res.records
    assert (res.records["saves_persistent"] >= 1).all()  # the final state at least
    assert (res.records["saves_memory"] >= 100).all()


# -- the first-order closed form ----------------------------------------------------------
def test_each_tier_is_saved_every_sqrt_2c_over_its_own_failures_rate(tmp_path):
    s = load_scenario(write(tmp_path, TWO_TIERS))
    plan = first_order_plan(s)
    lam_mem, lam_node = 1024 / (100000 * 3600.0), 128 / (20000 * 3600.0)
    # The memory tier is the cheapest that survives a process crash, the persistent one the
    # only one that survives a node loss; its stall is the async staging copy.
    assert plan["rates_per_s"] == pytest.approx({"memory": lam_mem, "persistent": lam_node})
    assert plan["tier_intervals_s"]["memory"] == pytest.approx(math.sqrt(2 * 2 / lam_mem))
    assert plan["tier_intervals_s"]["persistent"] == pytest.approx(math.sqrt(2 * 5 / lam_node))
    restarts = lam_mem * (300 + 10) + lam_node * (60 + 900 + 120)
    waste = math.sqrt(2 * lam_mem * 2) + math.sqrt(2 * lam_node * 5) + restarts
    assert plan["waste_fraction"] == pytest.approx(waste, rel=1e-12)


def test_when_every_failure_needs_the_persistent_tier_the_optimum_is_todays_single_tier():
    s = Scenario(
        mtbf_h=20.0,
        checkpoint_s=60.0,
        restart_s=0.0,
        tiers=[
            {"name": "memory", "checkpoint_s": 1.0, "survives": []},
            {"name": "persistent", "checkpoint_s": 60.0, "survives": ["failure"]},
        ],
    )
    plan = first_order_plan(s)
    assert plan["tier_intervals_s"]["memory"] == math.inf
    assert plan["tier_intervals_s"]["persistent"] == analytic.young_interval(60.0, 20 * 3600.0)
    assert plan["waste_fraction"] == pytest.approx(math.sqrt(2 * 60.0 / (20 * 3600.0)))


def test_when_no_failure_needs_the_persistent_tier_only_the_final_save_goes_there():
    s = Scenario(
        mtbf_h=20.0,
        tiers=[
            {"name": "memory", "checkpoint_s": 1.0, "survives": ["failure"]},
            {"name": "persistent", "checkpoint_s": 60.0, "survives": ["failure"]},
        ],
    )
    plan = first_order_plan(s)
    assert plan["tier_intervals_s"]["persistent"] == math.inf
    assert plan["tier_intervals_s"]["memory"] == pytest.approx(math.sqrt(2 * 20 * 3600.0))


def test_a_class_no_tier_survives_is_refused_by_the_closed_form(tmp_path):
    text = TWO_TIERS.replace('survives = ["process", "node"]', 'survives = ["process"]')
    with pytest.raises(InputError, match="no tier survives failure class 'node'"):
        first_order_plan(load_scenario(write(tmp_path, text)))


def test_the_closed_form_is_vectorised_and_rejects_bad_costs():
    tau, waste = analytic.tier_first_order([2.0, 50.0], [1e-4, 0.0])
    assert np.isinf(tau[1]) and tau[0] == pytest.approx(200.0)
    assert waste == pytest.approx(math.sqrt(4e-4))
    with pytest.raises(InputError):
        analytic.tier_first_order([0.0], [1e-4])


# -- hostile and half-written tables: one line each, never a traceback or a silent default --
@pytest.mark.parametrize(
    ("edit", "expected"),
    [
        (('name = "memory"\n', ""), "every [[tier]] needs a name"),
        (('name = "node"\n', ""), "every [[failure_class]] needs a name"),
        (('survives = ["process"]\n', ""), "tier 'memory': give survives"),
        (("checkpoint_s = 2", "checkpoint_s = 2\nstaging_s = 1"), "add async = true"),
        (
            ("checkpoint_s = 2", "checkpoint_s = 2\nwrite_bytes_per_s_per_node = 1e9"),
            "not both (write_bytes_per_s_per_node with checkpoint_s)",
        ),
        (("checkpoint_s = 2", "checkpoint_s = 1e308"), "between 1e-06 and 3.6e+18 seconds"),
        (("detection_s = 60", "detection_s = 1e308"), "between 1e-06 and 3.6e+18 seconds"),
        (  # was an infinite write time, refused later as "got [inf, 2.0]" naming no tier
            ("checkpoint_bytes = 1e12", "checkpoint_bytes = 1e300"),
            "tier 'persistent': checkpoint_bytes must be between 1 and 1e+18 bytes",
        ),
        (('name = "memory"', 'name = "mem=ory"'), "may not hold '='"),
        (('name = "process"', 'name = "in_recovery"'), "failures_in_recovery is already"),
        (('name = "process"', 'name = "process_mean"'), "may not be or end in '_mean'"),
        (("work_h = 10", "work_h = 10\ncheckpoint_s = 30"), "checkpoint_s describes the scen"),
        (("work_h = 10", "work_h = 10\nstaging_s = 3"), "staging_s describes the scenario"),
        (("work_h = 10", "work_h = 10\nstorage_bytes_per_s = 1e9"), "drop storage_bytes_per_s"),
        (("work_h = 10", "work_h = 10\ncheckpoints_retained = 3"), "(retention in its [[tier]]"),
    ],
)
def test_a_half_written_or_hostile_table_is_one_line(tmp_path, edit, expected):
    old, new = edit
    assert old in TWO_TIERS
    assert expected in one_line_error(tmp_path, TWO_TIERS.replace(old, new, 1))


def test_a_failure_class_that_is_a_number_is_one_line_not_a_traceback(tmp_path):
    assert "[[failure_class]] tables" in one_line_error(tmp_path, "gpus = 8\nfailure_class = 5\n")


def test_the_reserved_names_are_the_records_own_columns_and_the_summarys_statistics():
    # The reserved names follow the record and its summary: if either grows a column or a
    # statistic a class could collide with, this fails before a user meets it.
    from simulator.engines.results import METRICS, PART_PREFIXES, describe
    from simulator.model.tiers import RESERVED_CLASS_NAMES, SUMMARY_STATS

    assert tuple(describe([1.0, 2.0])) == SUMMARY_STATS
    prefixed = {m for m in METRICS if m.startswith(PART_PREFIXES)}
    assert prefixed == {f"failures_{n}" for n in RESERVED_CLASS_NAMES}
