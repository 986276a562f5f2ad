"""`ckptsim simulate --trace FILE` against [[failure_class]] and [[tier]] tables: every replayed
failure has its class, from the log's cause column."""

from __future__ import annotations

import json
import textwrap

import numpy as np
import pandas as pd
import pytest
from _cli import run_cli as cli

from simulator.errors import InputError
from simulator.model.trace import ClassTrace, TraceStart, classes_of, read_causes

TWO = """
name = "two-tier"
gpus = 1024
work_h = 100
restart_s = 300
[[failure_class]]
name = "process"
gpu_mtbf_h = 20000
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
checkpoint_s = 60
restore_s = 120
survives = ["process", "node"]
"""
CAUSES = ("GPU HBM3", "Software bug", "Network switch")
MAP = ["--cause-class", "GPU HBM3=node", "--cause-class", "Software bug=process",
       "--cause-class", "Network switch=node"]  # fmt: skip


@pytest.fixture
def files(tmp_path):
    scenario = tmp_path / "two.toml"
    scenario.write_text(textwrap.dedent(TWO))
    rng = np.random.default_rng(1)
    t_h = np.cumsum(rng.exponential(2.0, 200))
    causes = rng.choice(CAUSES, t_h.size)
    log = tmp_path / "log.csv"
    pd.DataFrame({"time": t_h[::-1], "cause": causes[::-1]}).to_csv(log, index=False)  # unsorted
    return scenario, log, t_h, causes


def simulate(capsys, scenario, log, *extra):
    return cli(capsys, "simulate", "--scenario", str(scenario), "--trace", str(log),
               "--no-progress", "--replicas", "1", "--json", *extra)  # fmt: skip


def test_causes_are_read_sorted_with_their_times_and_dates_drop_the_start_row(tmp_path, files):
    _, log, t_h, causes = files
    times, got = read_causes(log, unit="h")
    np.testing.assert_allclose(times, t_h * 3600)
    assert got.tolist() == causes.tolist()
    stamps = tmp_path / "stamps.csv"
    start = pd.Timestamp("2024-03-01T00:00:00Z")
    pd.DataFrame(
        {"when": [start + pd.Timedelta(hours=h) for h in (0, 5, 2)],
         "reason": ["job start", "Software bug", "GPU HBM3"]}
    ).to_csv(stamps, index=False)  # fmt: skip
    times, got = read_causes(stamps, time_column="when")
    np.testing.assert_allclose(times, [7200.0, 18000.0], atol=1e-3)
    assert got.tolist() == ["GPU HBM3", "Software bug"]  # the start row is no failure


def test_a_failure_without_a_cause_is_an_error_naming_its_row(tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,cause\n1,gpu\n2,\n3,gpu\n")
    with pytest.raises(InputError, match="column 'cause' row 2: a failure with no cause"):
        read_causes(log)


def test_causes_map_to_classes_by_name_or_by_mapping_and_unmapped_ones_are_refused():
    names = ["process", "node"]
    got = classes_of(["node", "Xid 79", "process"], names, {"Xid 79": "node"})
    assert got.tolist() == ["node", "node", "process"]
    with pytest.raises(InputError, match=r"1 cause in the trace maps to no failure class \('Xid"):
        classes_of(["node", "Xid 79"], names)
    with pytest.raises(InputError, match="maps to 'disk', which is no failure class"):
        classes_of(["node"], names, {"node": "disk"})


def test_each_replayed_failure_meets_the_job_as_its_class(capsys, files):
    scenario, log, t_h, causes = files
    code, out, err = simulate(capsys, scenario, log, *MAP)
    assert code == 0, err
    got = json.loads(out)
    within = t_h < got["wall_h_mean"]
    node = np.isin(causes, ["GPU HBM3", "Network switch"])
    assert got["failures_mean"] == within.sum() > 20
    assert got["failures_node_mean"] == (within & node).sum()
    assert got["failures_process_mean"] == (within & ~node).sum()
    # A process failure never needs the persistent copy, a node loss never finds memory's.
    assert got["restores_memory_mean"] <= got["failures_process_mean"]
    assert (
        got["restores_persistent_mean"]
        >= got["failures_node_mean"] - got["failures_in_recovery_mean"]
    )
    # The same log with every cause mapped to the process class: no node failures at all.
    every = [f"--cause-class={cause}=process" for cause in CAUSES]
    code, out, err = simulate(capsys, scenario, log, *every)
    assert code == 0, err
    alone = json.loads(out)
    assert alone["failures_node_mean"] == 0 and alone["wall_h_mean"] < got["wall_h_mean"]


def test_a_random_start_keeps_each_failures_class(files):
    _, log, _, causes = files
    times, got = read_causes(log, unit="h")
    trace = TraceStart(times, keep_s=3600.0, classes=got)(np.random.default_rng(3))
    assert isinstance(trace, ClassTrace) and 0 < len(trace) < times.size
    start = times[times.size - len(trace)] - trace.times_s[0]
    kept = times >= start
    assert trace.classes.tolist() == causes[kept].tolist()


@pytest.mark.parametrize(
    "extra, fragment",
    [
        ([], "3 causes in the trace map to no failure class"),
        (MAP[:4], "1 cause in the trace maps to no failure class ('Network switch')"),
        ([*MAP, "--cause-class", "GPU HBM3=node"], "is given twice"),
        (["--cause-class", "GPU HBM3"], "give CAUSE=CLASS"),
        ([*MAP, "--cause-column", "reason"], "no column 'reason' in the log"),
        ([*MAP[:2], "--cause-class", "Software bug=disk"], "'disk', which is no failure class"),
    ],
)
def test_a_trace_that_cannot_give_every_failure_its_class_is_one_line(capsys, files, extra,
                                                                      fragment):  # fmt: skip
    scenario, log, _, _ = files
    code, out, err = simulate(capsys, scenario, log, *extra)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


def test_a_log_without_causes_needs_one_only_when_the_scenario_has_several_classes(
    capsys, tmp_path, files
):
    scenario, _, t_h, _ = files
    log = tmp_path / "times.csv"
    pd.DataFrame({"time": t_h}).to_csv(log, index=False)
    code, out, err = simulate(capsys, scenario, log)
    assert code == 2 and "cannot tell which column holds the cause" in err
    one = tmp_path / "one.toml"  # one class: every failure is of it
    one.write_text(
        textwrap.dedent(TWO)
        .split('[[failure_class]]\nname = "node"')[0]
        .replace('survives = ["process", "node"]', 'survives = ["process"]')
        + '[[tier]]\nname = "persistent"\ncheckpoint_s = 60\nsurvives = ["process"]\n'
    )
    code, out, err = simulate(capsys, one, log, "--unit", "h")
    assert code == 0, err
    got = json.loads(out)
    assert got["failures_process_mean"] == np.sum(t_h < got["wall_h_mean"])


def test_cause_flags_need_a_trace_and_failure_classes(capsys, files, tmp_path):
    scenario, log, _, _ = files
    code, _, err = cli(capsys, "simulate", "--scenario", str(scenario), "--cause-column", "c")
    assert code == 2 and "need --trace FILE" in err
    code, _, err = cli(capsys, "simulate", "--mtbf-h", "5", "--work-h", "10", "--trace", str(log),
                       "--cause-class", "a=b")  # fmt: skip
    assert code == 2 and "this scenario has none" in err
