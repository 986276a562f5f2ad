"""One failure log, one meaning: the reading rules ``ckptsim fit``, ``simulate --trace`` and
``--failure empirical:FILE`` share (``simulator.fitting.faillog``), each case found by an audit
of hostile and ordinary logs from a fresh clone. Every test writes a real file and runs the
real command the way a user would."""

from __future__ import annotations

import json
import warnings

import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.model.trace import read_trace

HOUR = 3600.0
JOB = ["--checkpoint-s", "60", "--restart-s", "600", "--work-h", "50", "--no-progress"]


def cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``ckptsim ARGV`` run in this process, with every
    warning an error (a RuntimeWarning on the way to an answer is a defect too)."""
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        try:
            code = main([str(a) for a in argv])
        except SystemExit as exc:
            code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def fit_json(capsys, *argv):
    code, out, err = cli(capsys, "fit", *argv, "--json")
    assert code == 0, err
    return json.loads(out), err


def exp_mean_h(result) -> float:
    return next(f for f in result["families"] if f["family"] == "exponential")["mean_s"] / HOUR


def one_line_error(code, out, err):
    lines = [x for x in err.splitlines() if x.strip() and not x.startswith(("note:", "warning:"))]
    assert code == 2 and out == "" and len(lines) == 1, err
    assert "Traceback" not in err and "np." not in err, err
    return lines[0]


@pytest.fixture
def stamps():
    """Failure times of a system, MTBF about 5 h: dates, and the hours since the first."""
    gaps_h = np.random.default_rng(1).exponential(5.0, 300)
    t_h = np.round(np.concatenate(([0.0], np.cumsum(gaps_h))) * 3600) / 3600  # whole seconds
    return pd.Timestamp("2024-01-01") + pd.to_timedelta(np.round(t_h * 3600), unit="s"), t_h


# -- 1: datetime columns in Parquet are dates ----------------------------------------------------
@pytest.mark.parametrize("tz", [None, "UTC", "Europe/Berlin"])
def test_a_datetime_column_in_parquet_is_read_as_dates_as_its_csv_copy_is(
    capsys, tmp_path, stamps, tz
):
    when, t_h = stamps
    if tz:
        when = when.tz_localize("UTC").tz_convert(tz)
    pq, csv = tmp_path / "log.parquet", tmp_path / "log.csv"
    pd.DataFrame({"time": when}).to_parquet(pq)
    pd.DataFrame({"time": when.astype(str)}).to_csv(csv, index=False)
    a, _ = fit_json(capsys, pq)
    b, _ = fit_json(capsys, csv)
    assert exp_mean_h(a) == pytest.approx(exp_mean_h(b)) == pytest.approx(np.diff(t_h).mean())
    # The replay reads the same file the same way: hours since the first failure.
    np.testing.assert_allclose(read_trace(pq) / HOUR, t_h[1:], atol=1e-6)
    code, out, err = cli(capsys, "simulate", *JOB, "--trace", pq, "--replicas", "2", "--json")
    assert code == 0, err
    assert json.loads(out)["mtbf_h"] == pytest.approx(t_h[-1] / (t_h.size - 1))


# -- 2: columns found by role, said, and ambiguity refused ---------------------------------------
LANL_HEADER = (
    "System,machine type,nodes,nodenum,node install,node prod,node decom,fru type,"
    "Prob Started,Prob Fixed,Down Time,Hardware,Software,Same Event"
)


def lanl_like(path, systems=(20,), rows=40, seed=3):
    """A log with LANL's released columns (LA-UR-05-7318): times in m/d/Y H:M, down time in
    minutes, the cause spread over one column per category."""
    rng = np.random.default_rng(seed)
    lines = [LANL_HEADER]
    for system in systems:
        t = pd.Timestamp("2003-01-01") + pd.to_timedelta(np.cumsum(rng.exponential(20, rows)), "h")
        for when in t:
            node = int(rng.integers(0, 8))
            down = int(rng.integers(5, 600))
            fixed = when + pd.Timedelta(minutes=down)
            hw, sw = ("Memory Dimm", "") if rng.random() < 0.6 else ("", "Other Software")
            lines.append(
                f"{system},cluster,512,{node},5-Apr,5-Jun,current,part,"
                f"{when:%m/%d/%Y %H:%M},{fixed:%m/%d/%Y %H:%M},{down},{hw},{sw},No"
            )
    path.write_text("\n".join(lines) + "\n")
    return path


def test_lanl_columns_are_found_by_role_and_the_output_names_them(capsys, tmp_path):
    # Was: time = "Down Time" (a repair duration), component = nodenum, cause = "machine type".
    log = lanl_like(tmp_path / "lanl.csv")
    got, _ = fit_json(capsys, log, "--unit", "min")
    assert got["columns"] == {
        "time": "Prob Started",
        "component": "nodenum",
        "repair": "Down Time",
        "system": "System",
    }
    assert "causes" not in got  # "machine type" and "fru type" are no cause
    code, out, err = cli(capsys, "fit", log, "--unit", "min")
    assert code == 0, err
    line = next(x for x in out.splitlines() if x.startswith("columns used:"))
    assert "time 'Prob Started'" in line and "repair 'Down Time'" in line
    assert "none for cause" in line


def test_a_log_of_several_systems_is_refused_without_a_component_and_split_with_one(
    capsys, tmp_path
):
    log = lanl_like(tmp_path / "lanl.csv", systems=(18, 20))
    line = one_line_error(*cli(capsys, "fit", log, "--component-column", "none"))
    assert "column 'System' holds 2 different systems" in line and "--system-column none" in line
    line = one_line_error(*cli(capsys, "simulate", *JOB, "--trace", log))
    assert "holds 2 different systems" in line
    got, err = fit_json(capsys, log, "--unit", "min")
    assert "told apart by column 'System' and 'nodenum'" in err
    one = pd.read_csv(log)
    assert got["components"] == one.groupby(["System", "nodenum"]).ngroups


def test_two_columns_fit_for_one_role_are_refused_in_one_line_naming_the_flag(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,cause,category\n1,a,x\n2,b,y\n4,a,x\n7,b,x\n11,a,y\n")
    line = one_line_error(*cli(capsys, "fit", log))
    assert "'cause' and 'category'" in line and "--cause-column C (or none)" in line
    got, _ = fit_json(capsys, log, "--cause-column", "category")
    assert got["columns"]["cause"] == "category"


@pytest.mark.parametrize("name", ["Down Time", "down_min", "repair_time", "TTR"])
def test_a_repair_duration_is_never_taken_for_the_failure_time(capsys, tmp_path, name):
    log = tmp_path / "log.csv"
    pd.DataFrame({"Prob Started": ["2024-01-01 00:00", "2024-01-01 05:00", "2024-01-02 00:00"],
                  name: [30, 45, 60]}).to_csv(log, index=False)  # fmt: skip
    got, _ = fit_json(capsys, log, "--repair-unit", "min")
    assert got["columns"] == {"time": "Prob Started", "repair": name}
    log.write_text(f"{name},x\n30,1\n45,2\n")
    line = one_line_error(*cli(capsys, "fit", log))
    assert "--time-column" in line and "--duration-column" in line


# -- 3: event polarity ---------------------------------------------------------------------------
@pytest.mark.parametrize(
    "column, failed",
    [("event", 1), ("failed", 1), ("uncensored", 1), ("not_censored", 1), ("NonCensored", 1),
     ("censored", 0), ("is_censored", 0), ("Censored?", 0)],
)  # fmt: skip
def test_a_flag_column_means_failed_unless_its_name_says_censored(capsys, tmp_path, column,
                                                                    failed):  # fmt: skip
    # Was: any name containing "censor" flipped, so "uncensored" read failures as censored.
    log = tmp_path / "life.csv"
    flags = [failed, failed, failed, 1 - failed]
    pd.DataFrame({"duration": [5, 7, 9, 11], column: flags}).to_csv(log, index=False)
    got, _ = fit_json(capsys, log, "--event-column", column)
    assert (got["events"], got["censored"]) == (3, 1)


def test_words_in_a_flag_column_say_what_they_mean_whatever_its_name(capsys, tmp_path):
    log = tmp_path / "life.csv"
    log.write_text("duration,censored\n5,failed\n7,censored\n9,failed\n")
    got, _ = fit_json(capsys, log)
    assert (got["events"], got["censored"]) == (2, 1)


# -- 4: a best fit whose mean the log does not support ----------------------------------------
@pytest.fixture
def lanl20(tmp_path):
    """LANL system 20's failures (the committed derived table): per-node times in minutes."""
    from simulator.fitting.lanl import load_table

    table = load_table()
    rows = table[table["system"] == 20][["start", "node", "cause", "down_min"]]
    path = tmp_path / "lanl20.csv"
    rows.to_csv(path, index=False)
    return path


def test_an_extrapolated_best_fit_is_warned_and_not_written_into_the_scenario(
    capsys, tmp_path, lanl20
):
    # Was: lognormal sigma 3.05 with a per-node mean of 90,358 h (system MTBF 176 h) written
    # silently, where the log has a failure every ~13 h.
    out = tmp_path / "l20.toml"
    code, _, err = cli(capsys, "fit", lanl20, "--unit", "min", "--component-column", "node",
                            "--scenario-out", out, "--gpus", "512")  # fmt: skip
    assert code == 0, err
    got, _ = fit_json(capsys, lanl20, "--unit", "min", "--component-column", "node")
    assert got["best"] == "lognormal"
    x = got["extrapolation"]
    assert x["reason"] == "rate" and x["ratio"] > 10
    warn = next(x for x in err.splitlines() if x.startswith("warning: the best fit (lognormal)"))
    assert "5.421e+06 min" in warn and "3.419e+05 min" in warn  # both numbers, in --unit
    # With the cause column each cause is a class whose fit passes over such fits too.
    assert "passed over the better by AIC lognormal" in out.read_text().replace("\n# ", " ")
    # The whole log's fit (no cause column) passes over the lognormal for the Weibull.
    whole = tmp_path / "whole.toml"
    code, _, err = cli(
        capsys, "fit", lanl20, "--unit", "min", "--component-column", "node",
        "--cause-column", "none", "--scenario-out", whole, "--gpus", "512",
    )  # fmt: skip
    assert code == 0, err
    assert "passed over a better fit whose mean the log does not support: lognormal" in err
    text = whole.read_text()
    assert 'failure = "weibull:shape=' in text
    weibull = next(f for f in got["families"] if f["family"] == "weibull")
    assert f"gpu_mtbf_h = {weibull['mean_s'] / HOUR:.6g}" in text
    assert "whose mean the log supports (weibull)" in text
    # Per-cause fits past the log are named in one warning line.
    _, err = cli(capsys, "fit", lanl20, "--unit", "min", "--component-column", "node")[1:]
    per_cause = [x for x in err.splitlines() if x.startswith("warning: per-cause")]
    assert len(per_cause) == 1 and "Hardware (lognormal" in per_cause[0]


def test_a_fit_that_agrees_with_the_log_is_not_warned_about(capsys, tmp_path):
    log = tmp_path / "life.csv"
    t = np.random.default_rng(4).weibull(0.8, 2000) * 100
    pd.DataFrame({"duration": t, "event": 1}).to_csv(log, index=False)
    got, err = fit_json(capsys, log)
    assert "extrapolation" not in got and "warning" not in err


# -- 5: causes: rare ones skipped, blanks no class, detection turned off --------------------------
def test_a_rare_or_blank_cause_leaves_the_overall_fit_and_the_other_causes(capsys, tmp_path):
    # Was: exit 2 for a cause with one failure; blanks became a cause named "nan".
    rng = np.random.default_rng(9)
    t = np.cumsum(rng.exponential(4.0, 200))
    cause = rng.choice(["gpu", "software"], t.size).astype(object)
    cause[17] = "facilities"  # one failure
    cause[[30, 60, 90]] = None  # blank
    log = tmp_path / "log.csv"
    pd.DataFrame({"time": t, "cause": cause}).to_csv(log, index=False)
    got, err = fit_json(capsys, log)
    assert got["events"] == 200 - 1 and set(got["causes"]) == {"gpu", "software"}
    assert "facilities" in got["causes_skipped"] and got["blank_causes"] == 3
    assert "note: cause 'facilities' has no fit of its own (1 failure" in err
    assert "3 failures with a blank cause in column 'cause' (rows 31, 61, 91)" in err
    assert "nan" not in json.dumps(got["causes"])
    for off in ("none", ""):
        got, _ = fit_json(capsys, log, "--cause-column", off)
        assert "causes" not in got and "cause" not in got["columns"]


def test_a_cause_column_of_which_no_cause_can_be_fitted_is_one_line_and_status_2(capsys, tmp_path):
    # Issue 15 lists "a cause column with one class of one event" among the bad logs: the
    # per-cause fits it asks for cannot be given, so it is refused, naming the way out.
    log = tmp_path / "log.csv"
    log.write_text("duration,event,cause\n10,1,gpu\n20,0,gpu\n30,0,gpu\n")
    err = one_line_error(*cli(capsys, "fit", log))
    assert "no cause in the log has a fit of its own (cause 'gpu': 1 failure" in err
    assert "--cause-column none" in err
    got, _ = fit_json(capsys, log, "--cause-column", "none")
    assert got["events"] == 1 and "causes" not in got


# -- 6, 7: no tracebacks; blank components refused ------------------------------------------------
@pytest.mark.parametrize(
    "text, needle",
    [
        ("time,node\n1,\n2,\n4,\n", "blank on every row"),
        ("time,node\n1,a\n2,\n4,a\n5,\n7,a\n", "rows 2, 4: 2 failures with a blank component"),
        ("duration,event\n5,1\n1e300,1\n7,0\n", "more than 100 years"),
        ("duration,event\n5,1\n1e308,1\n7,0\n", "more than 100 years"),
        ("time\n1\n1e308\n", "more than 100 years"),
    ],
)
def test_hostile_values_are_one_line_with_no_warning_on_every_path(capsys, tmp_path, text,
                                                                    needle):  # fmt: skip
    log = tmp_path / "log.csv"
    log.write_text(text)
    assert needle in one_line_error(*cli(capsys, "fit", log))
    if text.startswith("duration"):
        failure = f"empirical:{log}"
        got = one_line_error(*cli(capsys, "simulate", *JOB, "--gpus", "8", "--gpu-mtbf-h",
                                  "1000", "--failure", failure, "--replicas", "2"))  # fmt: skip
        assert needle in got


# -- 9: fit and the replay apply the same rules -------------------------------------------------
def test_fit_and_the_replay_read_one_log_by_the_same_rules(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time\n1\n2\n2\n5\n9\n9\n9\n12\n")  # duplicates at 2 h and 9 h
    got, err = fit_json(capsys, log)
    assert got["events"] == 4 and "3 rows (rows 3, 6, 7) repeat a failure" in err
    assert read_trace(log).size == 5  # the same five failures
    code, out, err = cli(capsys, "simulate", *JOB, "--trace", log, "--json", "--replicas", "1")
    assert code == 0 and "3 rows (rows 3, 6, 7) repeat a failure" in err
    assert json.loads(out)["trace_failures"] == 5
    for text, needle in (("time\n1\n\n2\nx\n", "row 3: 'x' is not a number"),
                         ("time\n1\n2\n-3\n5\n", "-3 is a negative time"),
                         ("time,n\n1,a\n,b\n3,c\n", "the failure time is blank")):  # fmt: skip
        log.write_text(text)
        a = one_line_error(*cli(capsys, "fit", log))
        b = one_line_error(*cli(capsys, "simulate", *JOB, "--trace", log))
        assert needle in a and needle in b


# -- 10: explicit flags are used or refused, never ignored ---------------------------------------
@pytest.mark.parametrize(
    "text, argv, needle",
    [
        ("time,node\n1,a\n2,b\n4,a\n", ["--event-column", "nosuch"], "no column 'nosuch'"),
        ("time,node\n1,a\n2,b\n4,a\n", ["--event-column", "node"], "for a lifetimes log"),
        ("time,node\n1,a\n2,b\n4,a\n", ["--component-column", "time"],
         "--component-column names column 'time', the failure time"),
        ("duration,event,t\n3,1,1\n4,0,2\n", ["--time-column", "t", "--duration-column",
                                              "duration"], "give one"),
        ("duration,event\n3,1\n4,0\n", ["--end", "10"], "--end closes a log of failure times"),
        ("duration,event\n3,1\n4,0\n", ["--component-column", "event"], "a log of failure times"),
        ("time\n1\n2\n4\n", ["--gpus", "8"], "--gpus describes the job written into"),
    ],
)  # fmt: skip
def test_a_flag_the_log_cannot_use_is_refused_in_one_line(capsys, tmp_path, text, argv, needle):
    log = tmp_path / "log.csv"
    log.write_text(text)
    assert needle in one_line_error(*cli(capsys, "fit", log, *argv))


def test_a_component_column_with_a_new_value_on_every_row_is_said_not_dropped(capsys, tmp_path):
    log = tmp_path / "log.csv"
    log.write_text("time,host\n1,a\n2,b\n4,c\n7,d\n")
    got, err = fit_json(capsys, log)
    assert "components" not in got and got["events"] == 3
    assert "column 'host' has a different value on every row" in err


# -- 15: messages a person reads ---------------------------------------------------------------
@pytest.mark.parametrize(
    "text, needle",
    [
        ("duration,event\n3,1\n-3,1\n", "row 2: -3 is a negative duration"),
        ("duration,event\n3,1\n,1\n", "row 2: a blank is not a number"),
        ("time,cause,repair\n1,gpu,1\n2,gpu,-2\n", "row 2: -2 is a negative repair time"),
        ("duration,event\n" + "9" * 5000 + ",1\n3,1\n", "... (5,000 characters)"),
        ("hours_up,failed\n3,1\n4,0\n", "--duration-column C with --event-column C"),
    ],
)
def test_errors_show_values_as_written_cut_short_and_name_the_right_flag(capsys, tmp_path, text,
                                                                         needle):  # fmt: skip
    log = tmp_path / "log.csv"
    log.write_text(text)
    line = one_line_error(*cli(capsys, "fit", log))
    assert needle in line and len(line) < 300


def test_a_family_that_cannot_be_fitted_is_skipped_and_said(capsys, tmp_path):
    # Was: every failure lasting 5 h aborted the fit; the exponential fits it.
    log = tmp_path / "life.csv"
    log.write_text("duration,event\n5,1\n5,1\n5,1\n8,0\n")
    got, err = fit_json(capsys, log)
    assert [f["family"] for f in got["families"]] == ["exponential"]
    assert exp_mean_h(got) == pytest.approx(23 / 3)
    assert "note: no weibull fit: a weibull fit needs failures at two or more" in err


# -- 17: smaller rules ---------------------------------------------------------------------------
def test_a_headerless_one_column_log_keeps_its_first_failure(capsys, tmp_path):
    log = tmp_path / "t.csv"
    log.write_text("1.5\n3\n7\n8.5\n")
    got, err = fit_json(capsys, log)
    assert got["events"] == 3 and exp_mean_h(got) == pytest.approx(7 / 3)
    assert "first row holds no column names" in err
    np.testing.assert_allclose(read_trace(log) / HOUR, [1.5, 3, 7, 8.5])


def test_a_lifetime_of_zero_is_left_out_and_said_in_both_shapes(capsys, tmp_path):
    log = tmp_path / "life.csv"
    log.write_text("duration,event\n5,1\n0,1\n7,0\n9,1\n")
    got, err = fit_json(capsys, log)
    assert (got["events"], got["censored"]) == (2, 1)
    assert "1 lifetime of length 0 (row 2) left out" in err
    log.write_text("time,node\n1,a\n1,a\n4,a\n")  # the same failure twice: one failure
    got, err = fit_json(capsys, log)
    assert got["events"] == 1 and "1 row (row 2) repeat" in err


def test_what_the_reader_leaves_out_of_an_empirical_log_is_said_too(capsys, tmp_path):
    log = tmp_path / "life.csv"
    log.write_text("duration,event\n5,1\n0,1\n7,0\n9,1\n12,1\n")
    code, _, err = cli(capsys, "simulate", *JOB, "--gpus", "8", "--gpu-mtbf-h", "1000",
                       "--failure", f"empirical:{log}", "--replicas", "2")  # fmt: skip
    assert code == 0, err
    assert f"note: empirical:{log}: 1 lifetime of length 0 (row 2) left out" in err


def test_a_lifetimes_log_given_as_a_trace_is_told_what_it_is(capsys, tmp_path):
    log = tmp_path / "life.csv"
    log.write_text("duration,event\n5,1\n7,0\n9,1\n")
    line = one_line_error(*cli(capsys, "simulate", *JOB, "--trace", log))
    assert "holds lifetimes (column 'duration'), not failure times" in line
    assert "--failure empirical:FILE" in line


# -- dates in one format for the whole column (from the new-user review) ------------------------
def _log(tmp_path, times):
    path = tmp_path / "log.csv"
    path.write_text("time,node\n" + "".join(f"{t},a\n" for t in times))
    return path


def test_slash_dates_are_read_in_one_order_for_the_whole_column(capsys, tmp_path):
    # Row by row, 01/02 and 01/03 were read month first and 13/03 day first in one column
    # (mean 852 h); read day first throughout, as the 13 demands, the gaps are 28 and 12 days.
    result, err = fit_json(capsys, _log(tmp_path, ["01/02/2024", "01/03/2024", "13/03/2024"]))
    assert exp_mean_h(result) == pytest.approx((29 + 12) * 24 / 2)
    assert "dates read as %d/%m/%Y, the reading every row fits" in err  # and says which
    # Month first where a 13 demands that instead.
    result, _ = fit_json(capsys, _log(tmp_path, ["02/01/2024", "02/13/2024", "03/01/2024"]))
    assert exp_mean_h(result) == pytest.approx((12 + 17) * 24 / 2)
    # Day-first dates with dots and times, as a European log writes them.
    result, _ = fit_json(capsys, _log(tmp_path, ["02.01.2024 10:00", "15.01.2024 10:00"]))
    assert exp_mean_h(result) == pytest.approx(13 * 24)


def test_dates_that_read_both_ways_are_refused_not_guessed(capsys, tmp_path):
    code, out, err = cli(capsys, "fit", _log(tmp_path, ["01/02/2024", "01/03/2024", "05/04/2024"]))
    line = one_line_error(code, out, err)
    assert "read day first or month first, and every date in the column fits both" in line
    assert "ISO 8601" in line


def test_a_column_of_two_formats_names_the_row_that_differs(capsys, tmp_path):
    code, out, err = cli(capsys, "fit", _log(tmp_path, ["2024-01-01", "2024-01-03", "banana"]))
    assert "row 3: cannot parse 'banana'" in one_line_error(code, out, err)


def test_times_with_and_without_an_offset_in_one_column_are_noted(capsys, tmp_path):
    times = ["2024-01-01 00:00", "2024-01-02T00:00:00+05:00", "2024-01-05 00:00"]
    result, err = fit_json(capsys, _log(tmp_path, times))
    assert "1 of 3 times carry a UTC offset and the others none" in err
    assert exp_mean_h(result) == pytest.approx(4 * 24 / 2)  # 19 h, then 77 h: UTC throughout
    result, err = fit_json(capsys, _log(tmp_path, ["2024-01-01 00:00", "2024-01-02 00:00"]))
    assert "UTC offset" not in err
