"""`ckptsim simulate --trace FILE`: a user's failure log replayed against the job."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.errors import InputError
from simulator.model.trace import TraceStart, read_trace

JOB = ["--checkpoint-s", "60", "--restart-s", "600", "--work-h", "200", "--no-progress"]


def run_cli(capsys, *argv):
    try:
        code = main(["simulate", *argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


@pytest.fixture
def gaps_h():
    return np.random.default_rng(7).exponential(3.0, 300)  # ~900 h of failures, MTBF 3 h


def test_numbers_are_times_since_the_start_and_timestamps_start_at_the_first(tmp_path, gaps_h):
    t_h = np.cumsum(gaps_h)
    numbers = tmp_path / "hours.csv"
    pd.DataFrame({"t_h": t_h[::-1]}).to_csv(numbers, index=False)  # unsorted on purpose
    np.testing.assert_allclose(read_trace(numbers, unit="h"), t_h * 3600)
    stamps = tmp_path / "log.csv"
    start = pd.Timestamp("2024-03-01T00:00:00Z")
    when = [start, *(start + pd.to_timedelta(t_h, unit="h"))]
    pd.DataFrame({"node": range(len(when)), "failed_at": when}).to_csv(stamps, index=False)
    got = read_trace(stamps, time_column="failed_at")
    np.testing.assert_allclose(got, t_h * 3600, rtol=0, atol=1e-3)  # the first row is the start


def test_a_replica_meets_exactly_the_logs_failures_within_its_wall_time(capsys, tmp_path, gaps_h):
    path = tmp_path / "f.csv"
    t_h = np.cumsum(gaps_h)
    pd.DataFrame({"time": t_h}).to_csv(path, index=False)
    for engine in ("des", "fast"):
        code, out, err = run_cli(
            capsys, *JOB, "--trace", str(path), "--unit", "h", "--replicas", "1",
            "--engine", engine, "--json",
        )  # fmt: skip
        assert code == 0, err
        got = json.loads(out)
        assert got["failure"] == "trace" and got["engine"] == engine
        # No failure rate was given: the log's own (span / failures) sets the policy.
        assert got["mtbf_h"] == pytest.approx(t_h[-1] / t_h.size)
        assert got["failures_mean"] == np.sum(t_h < got["wall_h_mean"])


def test_random_starts_make_replicas_differ_and_are_reproducible(capsys, tmp_path, gaps_h):
    path = tmp_path / "f.csv"
    pd.DataFrame({"time": np.cumsum(gaps_h)}).to_csv(path, index=False)
    argv = [*JOB, "--trace", str(path), "--unit", "h", "--trace-start", "random", "--json",
            "--replicas", "8", "--out", str(tmp_path / "r.csv")]  # fmt: skip
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    first = pd.read_csv(tmp_path / "r.csv")
    assert first["failures"].nunique() > 1
    code, _, err = run_cli(capsys, *argv)
    assert code == 0, err
    pd.testing.assert_frame_equal(pd.read_csv(tmp_path / "r.csv"), first)


def test_a_random_start_leaves_the_job_a_full_window_of_the_trace():
    times = np.arange(1.0, 1001.0)
    draw = TraceStart(times, keep_s=900.0)
    rng = np.random.default_rng(0)
    for _ in range(50):
        t = draw(rng)
        assert t[0] >= 0 and t[-1] >= 900.0 - 1.0


@pytest.mark.parametrize(
    "content, argv, fragment",
    [
        (None, [], "No such file or directory"),
        ("", [], "the failure log is empty"),
        ("time\n", [], "no rows"),
        ("a,b\n1,2\n", [], "name it with --time-column"),
        ("a,b\n1,2\n", ["--time-column", "c"], "no column 'c'"),
        ("time\nfoo\n3\n", [], "cannot parse 'foo' as a time"),
        ("time\n-5\n3\n", [], "not negative"),
        ("time\n0\n", [], "no failure after the job's start"),
        ("time\n2024-01-01\n", [], "no failure after the job's start"),
    ],
)
def test_a_bad_log_is_one_line_and_status_2(capsys, tmp_path, content, argv, fragment):
    path = tmp_path / "log.csv"
    if content is not None:
        path.write_text(content)
    code, out, err = run_cli(capsys, *JOB, "--trace", str(path), *argv)
    assert code == 2 and out == ""
    assert len(err.strip().splitlines()) == 1 and fragment in err, err


def test_trace_flags_without_a_trace_are_refused(capsys):
    code, _, err = run_cli(capsys, *JOB, "--mtbf-h", "3", "--unit", "h")
    assert code == 2 and "need --trace FILE" in err
    with pytest.raises(InputError, match="unit must be one of"):
        read_trace("x.csv", unit="weeks")


def test_a_fifo_or_a_directory_is_refused_at_once_not_read(capsys, tmp_path):
    import os

    fifo = tmp_path / "log.csv"
    os.mkfifo(fifo)  # reading it would block forever: no writer
    for path, word in ((fifo, "not a regular file"), (tmp_path, "a directory")):
        code, _, err = run_cli(capsys, *JOB, "--trace", str(path))
        assert code == 2 and word in err and len(err.strip().splitlines()) == 1


def test_replicas_that_outrun_the_trace_are_warned_about_and_counted(tmp_path, capsys):
    # Past a trace's last failure none come: a replica still running there is optimistic.
    short = tmp_path / "short.csv"
    short.write_text("t\n0\n3600\n7200\n20000\n")  # failures end 5.6 h in; the job needs 200 h
    code, out, err = run_cli(capsys, *JOB, "--trace", str(short), "--unit", "s", "--json")
    assert code == 0
    got = json.loads(out)
    assert got["trace_span_h"] == pytest.approx(20000 / 3600)
    assert got["replicas_past_trace_end"] == got["replicas"] > 0
    assert "warning: the trace's failures end 5.6 h in" in err and "optimistic" in err
    long = tmp_path / "long.csv"
    long.write_text("t\n" + "".join(f"{h * 3600}\n" for h in range(0, 5000, 7)))
    code, out, err = run_cli(capsys, *JOB, "--trace", str(long), "--unit", "s", "--json")
    assert code == 0 and json.loads(out)["replicas_past_trace_end"] == 0
    assert "optimistic" not in err


def test_numbers_without_a_unit_are_hours_as_fit_reads_the_same_log(tmp_path, capsys):
    # Was: seconds here and hours in `ckptsim fit`, so one numeric log meant two things.
    log = tmp_path / "t.csv"
    log.write_text("t\n0\n2\n5\n9\n")
    code, out, err = run_cli(capsys, *JOB, "--trace", str(log), "--json", "--replicas", "2")
    assert code == 0, err
    assert json.loads(out)["trace_span_h"] == pytest.approx(9.0)
    fit = main(["fit", str(log), "--json"])
    assert fit == 0
    got = json.loads(capsys.readouterr().out)
    assert got["events"] == 3  # gaps 2, 3, 4 hours
    exp = next(f for f in got["families"] if f["family"] == "exponential")
    assert exp["params"]["mean_s"] == pytest.approx(3 * 3600)


def test_a_trace_whose_failures_all_come_after_the_job_says_to_check_the_unit(tmp_path, capsys):
    # Seconds read as hours: the first failure 36,000 h in, after a 200 h job. Was silent.
    log = tmp_path / "t.csv"
    log.write_text("t\n36000\n72000\n")
    code, out, err = run_cli(capsys, *JOB, "--trace", str(log), "--json", "--replicas", "2")
    assert code == 0 and json.loads(out)["failures_mean"] == 0
    assert "no failure of the trace came within any replica's wall time" in err
    assert "is --unit right?" in err


def test_a_random_start_leaves_room_for_the_wall_time_and_counts_replicas_past_the_end(
    tmp_path, capsys
):
    # Was: the window left only the job's work (not its longer wall time) and nothing counted
    # the replicas that ran off the end of the trace from a random start.
    log = tmp_path / "t.csv"
    t_h = np.cumsum(np.random.default_rng(3).exponential(2.0, 2000))  # ~4,000 h, MTBF 2 h
    pd.DataFrame({"time": t_h}).to_csv(log, index=False)
    argv = ["--checkpoint-s", "300", "--restart-s", "1800", "--work-h", "500", "--json",
            "--trace", str(log), "--trace-start", "random", "--replicas", "30"]  # fmt: skip
    argv.append("--no-progress")
    code, out, err = run_cli(capsys, *argv)
    assert code == 0, err
    got = json.loads(out)
    assert got["wall_h_mean"] > 1.3 * 500  # the wall time the old window did not leave
    assert got["trace_start"] == "random" and got["replicas_past_trace_end"] == 0, err
    # Each replica's start is recovered from its seed: a window of the work alone would have
    # run some past the end.
    from simulator.model.trace import TraceStart, coverage

    walls = np.full(30, got["wall_h_p99"])
    short = coverage(TraceStart(t_h * 3600, keep_s=500 * 3600), walls, 0)
    assert short["past_end"] > 0


def test_a_job_longer_than_the_trace_replays_it_from_its_start_and_says_so(tmp_path, capsys):
    # Was: every replica identical (p50 = p99) with no warning and no count in the JSON.
    log = tmp_path / "t.csv"
    pd.DataFrame({"time": np.arange(1.0, 101.0)}).to_csv(log, index=False)  # 100 h
    code, out, err = run_cli(capsys, *JOB, "--trace", str(log), "--trace-start", "random",
                             "--replicas", "5", "--json")  # fmt: skip
    assert code == 0, err
    got = json.loads(out)
    assert got["wall_h_p50"] == got["wall_h_p99"]
    assert got["replicas_past_trace_end"] == 5 and got["trace_start"].startswith("first")
    assert "every replica replays it from its start" in err


def test_the_header_gives_the_traces_own_mtbf_and_what_the_policy_plans_with(tmp_path, capsys):
    # Was: "job MTBF 3.09 h (trace)", the preset's rate, on a log with one failure every 8 h.
    log = tmp_path / "t.csv"
    pd.DataFrame({"time": np.arange(8.0, 8.0 * 301, 8.0)}).to_csv(log, index=False)
    code, out, err = run_cli(capsys, *JOB, "--mtbf-h", "3", "--trace", str(log),
                             "--replicas", "2")  # fmt: skip
    assert code == 0, err
    head = out.splitlines()[0]
    assert "job MTBF 8 h (the trace: 300 failures in 2,400.0 h)" in head
    assert "the policy plans with the scenario's 3 h" in head
    code, out, err = run_cli(capsys, *JOB, "--mtbf-h", "3", "--trace", str(log), "--json",
                             "--replicas", "2")  # fmt: skip
    got = json.loads(out)
    assert got["mtbf_h"] == pytest.approx(8.0) and got["planned_mtbf_h"] == pytest.approx(3.0)


@pytest.mark.parametrize(
    "argv", [["--failure", "weibull:shape=0.7"], ["--node-mtbf-h", "1000"],
             ["--component-age", "new"]],
)  # fmt: skip
def test_failure_model_flags_a_trace_replaces_are_refused(tmp_path, capsys, argv):
    log = tmp_path / "t.csv"
    log.write_text("time\n1\n5\n9\n")
    code, out, err = run_cli(capsys, *JOB, "--gpus", "8", "--gpu-mtbf-h", "30", "--trace",
                             str(log), *argv)  # fmt: skip
    assert code == 2 and out == "" and "which --trace replaces" in err
    assert len(err.strip().splitlines()) == 1


def test_gpus_with_a_trace_is_said_to_price_the_job_not_to_change_the_failures(tmp_path, capsys):
    log = tmp_path / "t.csv"
    log.write_text("time\n1\n5\n9\n30\n60\n")
    runs = []
    for gpus in ("8", "8192"):
        code, out, err = run_cli(capsys, *JOB, "--trace", str(log), "--gpus", gpus, "--json",
                                 "--replicas", "2", "--usd-per-gpu-hour", "1")  # fmt: skip
        assert code == 0, err
        assert f"note: --trace replays the log's failures as logged: --gpus {gpus}" in err
        runs.append(json.loads(out))
    assert runs[0]["failures_mean"] == runs[1]["failures_mean"]
    assert runs[1]["usd_mean"] > 500 * runs[0]["usd_mean"]


def test_the_help_example_of_a_replay_does_not_plan_for_another_rate(capsys):
    with pytest.raises(SystemExit):
        main(["simulate", "--help"])
    text = capsys.readouterr().out
    example = text[text.index("--trace my-failures.csv") - 200 : text.index("--trace my-failures")]
    assert "--gpu-mtbf-h" not in example.splitlines()[-1]
    assert "the policy plans with the log's own MTBF" in " ".join(text.split())
