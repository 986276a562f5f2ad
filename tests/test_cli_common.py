"""Scenario flags shared by the commands: every model input is a flag on every command."""

from __future__ import annotations

import pytest

from simulator.cli import build_parser, main
from simulator.cli.common import scenario_flags, scenario_from_args
from simulator.model.scenario import Scenario

SCENARIO_COMMANDS = ("optimize", "simulate", "sweep", "plot")

# One value per scenario flag, each unlike the field's default, valid all together.
VALUES = {
    "gpus": "64",
    "gpus_per_node": "4",
    "gpu_mtbf_h": "6400",
    "failure": "weibull:shape=0.7",
    "checkpoint_s": "45",
    "restart_s": "300",
    "work_h": "24",
    "usd_per_gpu_hour": "2.5",
    "node_mtbf_h": "9000",
    "detection_s": "30",
    "warmup_s": "20",
    "spares": "2",
    "repair_h": "12",
    "repair": "lognormal:sigma=1",
    "staging_s": "5",
    "component_age": "new",
    "checkpoint_bytes": "1e12",
    "write_bytes_per_s_per_node": "2e9",
    "storage_bytes_per_s": "1e10",
    "writer_nodes": "8",
    "read_bytes_per_s": "4e10",
    "usd_per_gb_month": "0.03",
    "checkpoints_retained": "3",
}
LEADING = {"plot": ["interval", "--out", "x"]}


def argv_for(command):
    flags = [
        a
        for f in scenario_flags()
        if f != "mtbf_h"
        for a in (f"--{f.replace('_', '-')}", VALUES[f])
    ]
    return [command, *LEADING.get(command, []), *flags]


@pytest.mark.parametrize("command", SCENARIO_COMMANDS)
def test_every_model_input_is_a_flag_of_every_command_and_reaches_the_scenario(command):
    assert set(VALUES) | {"mtbf_h"} == set(scenario_flags())
    args = build_parser().parse_args(argv_for(command))
    scenario = scenario_from_args(args)
    for field, text in VALUES.items():
        want = getattr(scenario, field)
        assert str(want) == text or want == float(text), field
    assert scenario.async_checkpoint  # a staging time means an asynchronous save
    assert scenario.name == "command-line"


@pytest.mark.parametrize("command", SCENARIO_COMMANDS)
def test_every_model_flag_says_its_unit_in_help(command, capsys):
    with pytest.raises(SystemExit):
        main([command, "--help"])
    text = " ".join(capsys.readouterr().out.split())
    for flag, unit in [
        ("--node-mtbf-h H", "hours"),
        ("--storage-bytes-per-s B", "bytes per second"),
        ("--write-bytes-per-s-per-node B", "bytes per second"),
        ("--read-bytes-per-s B", "bytes per second"),
        ("--writer-nodes N", "count"),
        ("--usd-per-gb-month USD", "US dollars per GB"),
        ("--checkpoint-bytes B", "bytes"),
        ("--detection-s S", "seconds"),
    ]:
        assert flag in text, flag
        assert unit in text.rsplit(flag, 1)[1][:160], flag  # its entry, not the usage line


def test_flags_alone_describe_the_job_with_documented_defaults_not_the_preset():
    args = build_parser().parse_args(["plot", "interval", "--out", "x", "--gpus", "1024"])
    scenario = scenario_from_args(args)
    defaults = Scenario()
    assert scenario.gpus == 1024 and scenario.name != "llama3-405b"
    assert scenario.checkpoint_s == defaults.checkpoint_s == 60.0
    assert scenario.restart_s == defaults.restart_s == 600.0
    assert scenario.checkpoint_bytes is None and scenario.gpu_mtbf_h is None


@pytest.mark.parametrize("command", SCENARIO_COMMANDS)
def test_flags_without_a_failure_rate_are_refused_in_one_line(command, capsys):
    argv = [command, *LEADING.get(command, []), "--gpus", "1024", "--work-h", "10"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "no failure rate" in err and "--mtbf-h" in err


@pytest.mark.parametrize("command", ("simulate", "sweep", "plot"))
def test_a_simulation_from_flags_without_work_is_refused_in_one_line(command, capsys):
    argv = [command, *LEADING.get(command, []), "--mtbf-h", "5"]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--work-h" in err
