"""`ckptsim optimize`: its numbers are the closed forms', its errors are one line and status 2."""

import json
import subprocess
import sys

import pytest

from simulator import analytic
from simulator.cli import main
from simulator.cli.optimize import render
from simulator.model.scenario import load_scenario
from simulator.recommend import recommend

HOUR = 3600.0

JOB = [
    "--gpus", "1024", "--gpu-mtbf-h", "50000", "--checkpoint-s", "90", "--restart-s", "900",
    "--work-h", "720", "--usd-per-gpu-hour", "2.5",
]  # fmt: skip


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``ckptsim optimize ARGV`` run in this process."""
    try:
        code = main(["optimize", *argv])
    except SystemExit as exc:  # argparse's own errors exit from inside parse_args
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def run_json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out), err


def test_json_intervals_waste_wall_time_and_money_are_the_closed_forms(capsys):
    got, _ = run_json(capsys, *JOB)
    mtbf, delta, restart = 50000 * HOUR / 1024, 90.0, 900.0
    assert got["system_mtbf_s"] == pytest.approx(mtbf)
    assert got["young_interval_s"] == pytest.approx(analytic.young_interval(delta, mtbf))
    assert got["daly_interval_s"] == pytest.approx(analytic.daly_interval(delta, mtbf))
    assert got["daly_first_order_interval_s"] == pytest.approx(
        analytic.daly_first_order_interval(delta, mtbf, restart)
    )
    best = analytic.optimal_interval(delta, mtbf)
    waste = analytic.waste_fraction(best, delta, mtbf, restart)
    assert got["optimal_interval_s"] == pytest.approx(best)
    assert got["optimal_waste_fraction"] == pytest.approx(waste)
    assert got["expected_wall_h"] == pytest.approx(
        analytic.daly_wall_time(best, delta, mtbf, restart, 720.0)
    )
    assert got["usd_lost_per_day"] == pytest.approx(1024 * 2.5 * 24 * waste)
    assert got["ideal_job_usd"] == pytest.approx(1024 * 2.5 * 720)
    assert got["scenario"]["gpus"] == 1024


def test_every_row_is_evaluated_with_the_same_formula_and_none_beats_the_optimum(capsys):
    got, _ = run_json(capsys, *JOB, "--step-s", "4.2")
    keys = [row["key"] for row in got["rows"]]
    assert keys == [
        "young", "daly_first_order", "daly", "optimal", "every_30_min", "hourly", "every_3_h",
        "every_500_steps", "every_1000_steps",
    ]  # fmt: skip
    mtbf = 50000 * HOUR / 1024
    for row in got["rows"]:
        assert row["waste_fraction"] == pytest.approx(
            analytic.waste_fraction(row["interval_s"], 90.0, mtbf, 900.0)
        )
        assert row["excess_usd_per_day"] >= 0 and row["excess_wall_h"] >= 0
    by_key = {row["key"]: row for row in got["rows"]}
    assert by_key["hourly"]["interval_s"] == HOUR
    assert by_key["every_500_steps"]["interval_s"] == pytest.approx(500 * 4.2)
    assert by_key["every_1000_steps"]["steps"] == pytest.approx(1000)
    assert by_key["optimal"]["excess_usd_per_day"] == 0


def test_a_system_mtbf_alone_gives_intervals_without_money_or_wall_time(capsys):
    got, err = run_json(capsys, "--mtbf-h", "3")
    assert err == ""
    assert got["optimal_interval_s"] == pytest.approx(analytic.optimal_interval(60.0, 3 * HOUR))
    assert "usd_lost_per_day" not in got and "expected_wall_h" not in got
    assert "usd_lost_per_day" not in got["rows"][0]


def test_no_scenario_and_no_flags_uses_the_default_preset_and_says_so_in_one_line(capsys):
    got, err = run_json(capsys)
    llama = load_scenario("llama3")
    assert got["scenario"] == llama.to_dict()
    assert got["optimal_interval_s"] == pytest.approx(
        analytic.optimal_interval(llama.checkpoint_s, llama.system_mtbf_s)
    )
    assert len(err.strip().splitlines()) == 1 and "default preset llama3" in err
    # A single scenario flag means "flags describe the job": no preset note, no preset values.
    got, err = run_json(capsys, "--mtbf-h", "10")
    assert err == "" and got["scenario"]["name"] == "command-line"


def test_flags_override_a_preset(capsys):
    got, _ = run_json(capsys, "--scenario", "opt175b", "--checkpoint-s", "30")
    assert got["checkpoint_s"] == 30.0
    assert got["system_mtbf_h"] == pytest.approx(12.0)


def test_human_report_has_a_header_every_candidate_and_a_recommendation_in_100_columns(capsys):
    code, out, err = run_cli(capsys, *JOB, "--step-s", "4.2")
    assert code == 0 and err == ""
    lines = out.splitlines()
    assert max(len(line) for line in lines) <= 100
    assert "system MTBF 48.83 h" in out  # 50,000 h / 1,024 GPUs
    labels = ["Young (1974)", "Daly first order", "Daly higher order", "exact optimum"]
    labels += ["every 30 min", "hourly", "every 3 h", "every 500 steps", "every 1000 steps"]
    for label in labels:
        assert any(line.startswith(label) for line in lines), label
    assert any(line.startswith("Recommendation: save every") for line in lines)


def test_recommend_and_render_are_reusable_without_the_command_line():
    result = recommend(load_scenario("bloom176b"), step_s=10.0)
    text = render(result)
    assert "bloom-176b" in text and "every 1000 steps" in text
    assert json.loads(json.dumps(result))["optimal_interval_s"] == result["optimal_interval_s"]


def test_a_checkpoint_slower_than_the_mtbf_still_answers_and_warns(capsys):
    got, err = run_json(capsys, "--mtbf-h", "0.5", "--checkpoint-s", "4000")
    assert got["daly_interval_s"] == 0.5 * HOUR  # Daly's τ = M branch (δ >= 2M)
    assert 0 < got["optimal_interval_s"] < 0.5 * HOUR
    assert got["warnings"] and "cannot keep up" in got["warnings"][0]
    assert err.count("\n") == 1 and err.startswith("warning: checkpointing cannot keep up")
    code, out, err = run_cli(capsys, "--mtbf-h", "0.5", "--checkpoint-s", "2000")
    assert code == 0 and "warning: checkpointing cannot keep up" in out


def test_an_async_write_longer_than_the_interval_is_a_warning_not_a_silent_answer(capsys):
    # The closed forms count an async save's stall only; a write that outlasts the interval
    # (saves wait for it) or the MTBF (no save ever lands) must be said, not left out.
    flags = ("--mtbf-h", "3", "--staging-s", "5")
    got, _ = run_json(capsys, *flags, "--checkpoint-s", "3000")
    assert any("outlasts the interval" in w for w in got["warnings"]), got["warnings"]
    got, _ = run_json(capsys, *flags, "--checkpoint-s", "1e6")
    assert any("outlasts the system MTBF" in w for w in got["warnings"]), got["warnings"]
    got, _ = run_json(capsys, *flags, "--checkpoint-s", "60")
    assert not got["warnings"]


def test_a_weibull_scenario_warns_that_the_closed_forms_assume_exponential(capsys):
    code, out, _ = run_cli(capsys, "--mtbf-h", "3", "--failure", "weibull:shape=0.7")
    assert code == 0 and "assume exponential" in out


@pytest.mark.parametrize(
    ("argv", "needle"),
    [
        (["--checkpoint-s", "0"], "--checkpoint-s: must be a positive number of seconds"),
        (["--checkpoint-s", "-5"], "--checkpoint-s: must be a positive number of seconds"),
        (["--restart-s", "-1"], "--restart-s: must be a non-negative number of seconds"),
        (["--mtbf-h", "0"], "--mtbf-h: must be a positive number of hours"),
        (["--mtbf-h", "soon"], "'soon' is not a number of hours"),
        (["--step-s", "0"], "--step-s: must be a positive number of seconds"),
        (["--mtbf-h", "3", "--failure", "gamma"], "unknown failure distribution 'gamma'"),
        (["--mtbf-h", "3", "--gpu-mtbf-h", "5000"], "not allowed with argument"),
        (["--checkpoint-s", "60"], "no failure rate: give --mtbf-h HOURS"),
        (["--gpu-mtbf-h", "5000"], "--gpu-mtbf-h (per-GPU MTBF, hours) needs --gpus"),
        (["--scenario", "no-such-preset"], "neither a file nor a preset"),
    ],
)
def test_bad_input_is_one_line_on_stderr_and_status_2(capsys, argv, needle):
    code, out, err = run_cli(capsys, *argv)
    assert code == 2
    assert out == ""
    assert len(err.splitlines()) == 1 and "Traceback" not in err
    assert err.startswith("ckptsim optimize: error:")
    assert needle in err


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus = 64\nmtbf_h = [3\n", "malformed TOML"),
        ("gpus = 64\ncheckpoint_s = 60\n", "no failure rate"),  # incomplete: no MTBF at all
        ("mtbf_h = 3\ncheckpoint_s = -60\n", "checkpoint_s must be a positive number of seconds"),
        ("mtbf_h = 3\nmtbf = 4\n", "unknown field 'mtbf'"),
    ],
)
def test_a_bad_scenario_file_is_one_line_and_status_2(capsys, tmp_path, text, needle):
    path = tmp_path / "job.toml"
    path.write_text(text, encoding="utf-8")
    code, out, err = run_cli(capsys, "--scenario", str(path))
    assert (code, out) == (2, "")
    assert len(err.splitlines()) == 1 and needle in err


def test_help_teaches_with_a_description_and_examples(capsys):
    code, out, _ = run_cli(capsys, "--help")
    assert code == 0
    assert "examples:" in out and "ckptsim optimize --scenario opt175b" in out
    flags = ["--mtbf-h", "--gpu-mtbf-h", "--checkpoint-s", "--restart-s", "--work-h"]
    flags += ["--usd-per-gpu-hour", "--scenario", "--step-s", "--json"]
    for flag in flags:
        assert flag in out


def test_the_real_entry_point_prints_one_json_object():
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "optimize", "--json"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    got = json.loads(proc.stdout)
    llama = load_scenario("llama3")
    assert got["optimal_interval_s"] == pytest.approx(
        analytic.optimal_interval(llama.checkpoint_s, llama.system_mtbf_s)
    )
    assert "default preset" in proc.stderr


def test_the_real_entry_point_fails_with_status_2_and_no_traceback():
    proc = subprocess.run(
        [sys.executable, "-m", "simulator", "optimize", "--checkpoint-s", "0"],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    assert proc.returncode == 2
    assert proc.stdout == "" and len(proc.stderr.splitlines()) == 1


def test_a_job_smaller_than_a_default_node_needs_no_gpus_per_node_flag(capsys):
    got, _ = run_json(capsys, "--gpus", "4", "--mtbf-h", "3", "--usd-per-gpu-hour", "1")
    assert got["scenario"]["gpus_per_node"] == 4
    assert got["ideal_usd_per_day"] == pytest.approx(4 * 24.0)
    code, _, err = run_cli(capsys, "--gpus", "4", "--gpus-per-node", "8", "--mtbf-h", "3")
    assert code == 2 and "--gpus-per-node (8) exceeds --gpus (4)" in err


def test_saves_so_slow_that_the_expected_wall_time_overflows_still_answer(capsys):
    got, err = run_json(capsys, *JOB[:2], "--mtbf-h", "0.001", "--checkpoint-s", "3000",
                        "--work-h", "100", "--usd-per-gpu-hour", "1")  # fmt: skip
    assert got["expected_wall_h"] is None and got["expected_job_usd"] is None  # inf -> null
    assert "cannot keep up" in err
    code, out, _ = run_cli(capsys, "--mtbf-h", "0.001", "--checkpoint-s", "3000", "--work-h", "1")
    assert code == 0 and "> 1e308 h" in out and "Recommendation: none" in out


NODE_JOB = [
    "--gpus", "2048", "--gpus-per-node", "16", "--gpu-mtbf-h", "100000", "--node-mtbf-h", "10000",
    "--checkpoint-s", "60", "--restart-s", "600", "--work-h", "500",
]  # fmt: skip


def test_node_failures_shorten_the_mtbf_and_the_interval_it_recommends(capsys, tmp_path):
    got, _ = run_json(capsys, *NODE_JOB)
    # 2,048 GPUs at 100,000 h and 128 nodes at 10,000 h: rates add (exponential superposition).
    mtbf_h = 1 / (2048 / 100_000 + 128 / 10_000)
    assert got["system_mtbf_h"] == pytest.approx(mtbf_h) and 30.0 < mtbf_h < 30.1
    assert got["optimal_interval_s"] == pytest.approx(
        analytic.optimal_interval(60.0, mtbf_h * HOUR)
    )
    assert got["optimal_interval_s"] / HOUR == pytest.approx(0.99, abs=0.01)  # was 1.26 h
    assert got["young_interval_s"] == pytest.approx(analytic.young_interval(60.0, mtbf_h * HOUR))
    # The same job from a file gives the same answer, and the header names both rates.
    path = tmp_path / "nodes.toml"
    path.write_text(
        "gpus = 2048\ngpus_per_node = 16\ngpu_mtbf_h = 100000.0\nnode_mtbf_h = 10000.0\n"
        "checkpoint_s = 60.0\nrestart_s = 600.0\nwork_h = 500.0\n"
    )
    from_file, _ = run_json(capsys, "--scenario", str(path))
    assert from_file["optimal_interval_s"] == pytest.approx(got["optimal_interval_s"])
    code, out, _ = run_cli(capsys, "--scenario", str(path))
    assert code == 0 and "system MTBF 30.05 h (per GPU 100,000 h, per node 10,000 h)" in out


def test_an_asynchronous_save_from_flags_stalls_for_its_staging_copy(capsys):
    got, _ = run_json(capsys, "--mtbf-h", "5", "--checkpoint-s", "400", "--staging-s", "5")
    assert got["checkpoint_s"] == 5.0
    assert got["optimal_interval_s"] == pytest.approx(analytic.optimal_interval(5.0, 5 * HOUR))
    # Bytes and bandwidths set the write time, and a read bandwidth the load added to R.
    got, _ = run_json(
        capsys, "--gpus", "64", "--gpu-mtbf-h", "6400", "--checkpoint-bytes", "1e12",
        "--write-bytes-per-s-per-node", "2e9", "--storage-bytes-per-s", "1e10",
        "--read-bytes-per-s", "4e10", "--restart-s", "300",
    )  # fmt: skip
    assert got["checkpoint_s"] == pytest.approx(1e12 / 1e10)  # 8 nodes x 2 GB/s > the 10 GB/s cap
    assert got["restart_s"] == pytest.approx(300 + 1e12 / 4e10)


def test_simulate_on_the_des_in_two_worker_processes_gives_the_one_process_answer(capsys):
    # An asynchronous save needs the DES, whose runs --workers spreads over processes.
    job = ["--mtbf-h", "3", "--checkpoint-s", "120", "--staging-s", "5", "--restart-s", "300",
           "--work-h", "10", "--simulate", "--replicas", "4", "--no-progress"]  # fmt: skip
    one, _ = run_json(capsys, *job, "--workers", "1")
    two, _ = run_json(capsys, *job, "--workers", "2")
    assert two["simulated"] == one["simulated"] and one["simulated"]["engine"] == "des"


def test_the_closed_forms_say_they_leave_out_the_wait_for_a_spare(capsys):
    argv = ["--mtbf-h", "10", "--gpus", "64", "--spares", "1", "--repair-h", "4"]
    code, _, err = run_cli(capsys, *argv)
    assert code == 0 and "leave out waiting for a spare" in err
    code, _, err = run_cli(capsys, "--mtbf-h", "10", "--gpus", "64")
    assert code == 0 and "spare" not in err
