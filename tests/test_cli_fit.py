"""`ckptsim fit`: a user's failure log in, censored fits with honest intervals and a scenario out.

Every test writes a real CSV or Parquet file with known parameters and runs the real command
(in this process through ``simulator.cli.main``, or as ``python -m simulator`` for the
round trip), the way a user would.
"""

import json
import os
import subprocess
import sys

import _cli
import numpy as np
import pandas as pd
import pytest

from simulator.cli import main
from simulator.model.failures import LogNormal, Weibull

HOUR = 3600.0


def run_cli(capsys, *argv):
    """(exit status, stdout, stderr) of ``ckptsim fit ARGV`` run in this process."""
    return _cli.run_cli(capsys, "fit", *map(str, argv))


def fit_json(capsys, *argv):
    code, out, err = run_cli(capsys, *argv, "--json")
    assert code == 0, err
    return json.loads(out)


def family(result, name):
    return next(f for f in result["families"] if f["family"] == name)


def inside(ci, value):
    lo, hi = ci
    return lo <= value <= hi


def censor_mean_for(life, rate, rng):
    """Mean of exponential censoring times that censor about ``rate`` of ``life``'s units."""
    x = life.sample(rng, 40_000)
    e = rng.exponential(1.0, x.size)
    lo, hi = 1e-3 * life.mean_s, 1e4 * life.mean_s
    for _ in range(60):
        mid = np.sqrt(lo * hi)
        lo, hi = (mid, hi) if np.mean(e * mid < x) > rate else (lo, mid)
    return np.sqrt(lo * hi)


def lifetimes_csv(path, life, n, rate, seed):
    rng = np.random.default_rng(seed)
    x = life.sample(rng, n)
    if rate == 0:
        t, event = x, np.ones(n, int)
    else:
        c = rng.exponential(censor_mean_for(life, rate, rng), n)
        t, event = np.minimum(x, c), (x <= c).astype(int)
    pd.DataFrame({"duration": t / HOUR, "event": event}).to_csv(path, index=False)
    return 1 - event.mean()


@pytest.mark.parametrize("rate", [0.0, 0.3, 0.6, 0.9])
def test_weibull_parameters_are_recovered_within_their_intervals_at_any_censoring_rate(
    capsys, tmp_path, rate
):
    truth = Weibull(0.7, 100 * HOUR)
    log = tmp_path / "life.csv"
    seen = lifetimes_csv(log, truth, 3000, rate, seed=int(rate * 10) + 1)
    got = fit_json(capsys, log, "--unit", "h")
    assert got["censored"] == round(seen * 3000)
    assert abs(seen - rate) < 0.03
    w = family(got, "weibull")
    assert inside(w["ci95"]["shape"], 0.7), w
    assert inside(w["ci95"]["scale_s"], 100 * HOUR), w
    assert inside(w["ci95"]["mean_s"], truth.mean_s), w
    assert got["best"] == "weibull"
    # The intervals narrow with the number of failures, not of units.
    width = np.log(w["ci95"]["shape"][1] / w["ci95"]["shape"][0])
    assert width < 4 * 1.96 / np.sqrt(got["events"])


def test_lognormal_truth_is_ranked_first_and_recovered_under_heavy_censoring(capsys, tmp_path):
    truth = LogNormal(1.5, 20 * HOUR)
    log = tmp_path / "life.csv"
    lifetimes_csv(log, truth, 3000, 0.7, seed=8)
    got = fit_json(capsys, log)
    ln = family(got, "lognormal")
    assert got["best"] == "lognormal"
    assert got["families"][0]["family"] == "lognormal"
    aics = [f["aic"] for f in got["families"]]
    assert aics == sorted(aics)
    assert inside(ln["ci95"]["sigma"], 1.5) and inside(ln["ci95"]["scale_s"], 20 * HOUR)
    # The true model stays near Kaplan-Meier; the exponential one does not.
    assert ln["km"]["max_gap"] < 0.05 < family(got, "exponential")["km"]["max_gap"]


def test_parquet_and_csv_copies_of_a_log_give_the_same_fit(capsys, tmp_path):
    csv = tmp_path / "life.csv"
    lifetimes_csv(csv, Weibull(1.5, 10 * HOUR), 400, 0.4, seed=3)
    pq = tmp_path / "life.data"  # no suffix: recognised by its magic bytes
    pd.read_csv(csv).to_parquet(pq)
    a, b = fit_json(capsys, csv), fit_json(capsys, pq)
    assert a["families"] == b["families"]


def renewal_log(rng, life, nodes, window_s):
    """Failure times of ``nodes`` renewal processes over [0, window]: (node, time) rows."""
    rows = []
    for node in range(nodes):
        t = life.sample(rng, 1)[0] * rng.uniform()  # some age at the start of the log
        while t < window_s:
            rows.append((f"n{node:03d}", t))
            t += life.sample(rng, 1)[0]
    return pd.DataFrame(rows, columns=["node", "t"]).sample(frac=1.0, random_state=1)


def test_component_timestamps_become_gaps_censored_at_the_end_of_the_log(capsys, tmp_path):
    truth = Weibull(0.8, 200 * HOUR)
    window = 5000 * HOUR
    df = renewal_log(np.random.default_rng(11), truth, 120, window)
    df["when"] = pd.Timestamp("2021-03-01") + pd.to_timedelta(df.pop("t"), unit="s")
    log = tmp_path / "events.csv"
    df.to_csv(log, index=False)
    end = (pd.Timestamp("2021-03-01") + pd.Timedelta(seconds=window)).isoformat()
    got = fit_json(capsys, log, "--time-column", "when", "--component-column", "node",
                   "--end", end)  # fmt: skip
    assert got["components"] == 120
    # Each node: one gap fewer than its failures, plus one censored gap to the end.
    assert got["events"] == len(df) - 120
    assert got["censored"] == 120
    w = family(got, "weibull")
    assert inside(w["ci95"]["shape"], 0.8) and inside(w["ci95"]["scale_s"], 200 * HOUR), w


def test_without_an_end_the_last_failure_closes_the_log_and_numbers_are_in_the_unit(
    capsys, tmp_path
):
    times_d = np.cumsum(np.random.default_rng(5).exponential(2.0, 400))  # mean 2 days
    log = tmp_path / "system.csv"
    pd.DataFrame({"failure_time": times_d}).to_csv(log, index=False)
    got = fit_json(capsys, log, "--unit", "d")
    assert got["events"] == 399 and got["censored"] == 0
    e = family(got, "exponential")
    assert e["params"]["mean_s"] == pytest.approx(np.diff(times_d).mean() * 86400)
    assert inside(e["ci95"]["mean_s"], 2 * 86400)


def test_each_cause_gets_its_own_failure_and_repair_fit(capsys, tmp_path):
    rng = np.random.default_rng(21)
    # Two competing exponential causes, hardware mean 10 h and software mean 30 h; repairs
    # lognormal, hardware slower.
    hw, sw = rng.exponential(10.0, 3000), rng.exponential(30.0, 3000)
    cause = np.where(hw < sw, "hardware", "software")
    repair = np.where(cause == "hardware", rng.lognormal(np.log(4), 0.8, 3000),
                      rng.lognormal(np.log(0.5), 0.8, 3000))  # fmt: skip
    log = tmp_path / "system.csv"
    pd.DataFrame({"time": np.cumsum(np.minimum(hw, sw)), "cause": cause,
                  "down_time": repair}).to_csv(log, index=False)  # fmt: skip
    got = fit_json(capsys, log)
    causes = got["causes"]
    assert set(causes) == {"hardware", "software"}
    for name, mean_h, median_h in (("hardware", 10, 4), ("software", 30, 0.5)):
        c = causes[name]
        assert c["events"] + c["censored"] == got["units"]
        assert inside(family(c, "exponential")["ci95"]["mean_s"], mean_h * HOUR), name
        rep = c["repair"]
        assert rep["best"] == "lognormal"
        ln = family(rep, "lognormal")
        assert inside(ln["ci95"]["sigma"], 0.8) and inside(ln["ci95"]["scale_s"], median_h * HOUR)
    assert got["repair"]["events"] == 3000


def test_the_scenario_it_writes_is_what_optimize_and_simulate_take(capsys, tmp_path):
    truth = Weibull(0.7, 30 * HOUR)
    rng = np.random.default_rng(2)
    log = tmp_path / "cluster.csv"
    pd.DataFrame({"t_h": np.cumsum(truth.sample(rng, 600)) / HOUR}).to_csv(log, index=False)
    out = tmp_path / "mine.toml"
    got = fit_json(capsys, log, "--scenario-out", out, "--checkpoint-s", "120",
                   "--work-h", "200")  # fmt: skip
    best = got["families"][0]
    assert got["best"] == "weibull"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    opt = subprocess.run(
        [sys.executable, "-m", "simulator", "optimize", "--scenario", str(out), "--json"],
        capture_output=True, text=True, env=env, check=True,
    )  # fmt: skip
    scenario = json.loads(opt.stdout)["scenario"]
    assert scenario["mtbf_h"] == pytest.approx(best["mean_s"] / HOUR, rel=1e-5)
    assert scenario["failure"] == f"weibull:shape={best['params']['shape']:.6g}"
    assert scenario["checkpoint_s"] == 120
    sim = subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", str(out), "--replicas", "20",
         "--json", "--no-progress"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    assert json.loads(sim.stdout)


def test_a_lifetimes_log_needs_gpus_for_a_scenario_and_then_sets_the_per_unit_mtbf(
    capsys, tmp_path
):
    log = tmp_path / "life.csv"
    lifetimes_csv(log, Weibull(0.9, 500 * HOUR), 500, 0.5, seed=4)
    out = tmp_path / "s.toml"
    code, _, err = run_cli(capsys, log, "--scenario-out", out)
    assert code == 2 and "--gpus" in err and len(err.strip().splitlines()) == 1
    got = fit_json(capsys, log, "--scenario-out", out, "--gpus", "64")
    text = out.read_text()
    assert "gpus = 64" in text and "gpus_per_node = 1" in text
    mean_h = got["families"][0]["mean_s"] / HOUR
    assert f"gpu_mtbf_h = {mean_h:.6g}" in text


def test_plot_draws_the_survival_curves_to_a_png(capsys, tmp_path):
    log = tmp_path / "life.csv"
    lifetimes_csv(log, Weibull(0.9, 50 * HOUR), 300, 0.5, seed=6)
    png = tmp_path / "s.png"
    code, out, err = run_cli(capsys, log, "--plot", png)
    assert code == 0, err
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "best (lowest AIC)" in out


BAD_LOGS = {
    "no rows": ("duration,event\n", "no rows"),
    "negative duration": ("duration,event\n3,1\n-2,1\n5,0\n", "negative duration"),
    "unparseable time": ("time,node\n2024-01-01,a\nyesterday-ish,b\n2024-01-03,a\n", "parse"),
    "all censored": ("duration,event\n3,0\n4,0\n5,0\n", "censored"),
    "not a table": ("\x00\x01garbage", "row"),
    "a blank time": ("time,node\n2024-01-01,a\n,b\n2024-01-03,a\n2024-01-04,b\n", "blank"),
    "a blank event flag": ("duration,event\n5,1\n6,\n7,0\n", "row 2: the failed/censored flag"),
    "a blank duration": ("duration,event\n5,1\n,1\n7,0\n", "row 2: a blank is not a number"),
    "a duration of 1e300": ("duration,event\n5,1\n1e300,1\n7,0\n", "more than 100 years"),
    "a duration of 1e308": ("duration,event\n5,1\n1e308,1\n7,0\n", "more than 100 years"),
    "a negative repair": ("time,repair\n1,2\n2,-3\n4,1\n", "row 2: -3 is a negative repair"),
    "a node column all blank": ("time,node\n1,\n2,\n4,\n", "blank on every row"),
    "an empty header": ("a,b\n", "no rows"),
}


@pytest.mark.parametrize("case", sorted(BAD_LOGS))
def test_a_bad_log_gets_one_clear_line_and_status_2(capsys, tmp_path, case):
    text, needle = BAD_LOGS[case]
    log = tmp_path / "bad.csv"
    log.write_text(text)
    code, out, err = run_cli(capsys, log)
    assert code == 2
    lines = err.strip().splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith("ckptsim fit: error:") and needle in lines[0], lines[0]
    assert "Traceback" not in err and out == ""


def test_a_missing_file_and_a_missing_column_are_one_line_each(capsys, tmp_path):
    code, _, err = run_cli(capsys, tmp_path / "nope.csv")
    assert code == 2 and "cannot read" in err and len(err.strip().splitlines()) == 1
    log = tmp_path / "x.csv"
    log.write_text("a,b\n1,2\n")
    code, _, err = run_cli(capsys, log)
    assert code == 2 and "--time-column" in err and len(err.strip().splitlines()) == 1
    code, _, err = run_cli(capsys, log, "--duration-column", "zzz")
    assert code == 2 and "'zzz'" in err


def test_help_explains_both_shapes_with_an_example(capsys):
    with pytest.raises(SystemExit):
        main(["fit", "--help"])
    text = capsys.readouterr().out
    for needle in ("lifetimes", "timestamps", "--unit", "--scenario-out", "examples:",
                   "ckptsim optimize --scenario"):  # fmt: skip
        assert needle in text


def test_timestamps_with_different_utc_offsets_are_one_clock(capsys, tmp_path):
    # A DST change or two sites in one log: +02:00, Z and naive (taken as UTC) rows together.
    log = tmp_path / "tz.csv"
    log.write_text(
        "time\n2024-01-01T00:00:00Z\n2024-01-02T02:00:00+02:00\n2024-01-04T00:00:00\n"
        "2024-01-07T00:00:00Z\n2024-01-11T00:00:00-01:00\n"
    )
    got = fit_json(capsys, log, "--unit", "d")
    exp = family(got, "exponential")
    # Gaps 1, 2, 3, 4 days + 1 h (the -01:00 row is 01:00 UTC): the mean is their average.
    assert got["events"] == 4 and exp["mean_s"] == pytest.approx((10 * 86400 + 3600) / 4)


def test_an_end_that_is_not_a_finite_time_is_one_line(capsys, tmp_path):
    log = tmp_path / "t.csv"
    log.write_text("time\n1\n2\n5\n9\n12\n")
    code, out, err = run_cli(capsys, log, "--end", "inf")
    assert code == 2 and out == "" and "finite" in err and len(err.strip().splitlines()) == 1


def _eight_failures(tmp_path):
    """Eight failures of three nodes over two weeks: the CLI fuzz's own timestamp log."""
    log = tmp_path / "t.csv"
    rows = [f"2024-01-{d:02d}T{h:02d}:00:00,{n}" for d, h, n in [
        (1, 3, 1), (2, 7, 2), (4, 1, 1), (5, 9, 3), (8, 2, 2), (9, 5, 1), (12, 8, 3), (15, 4, 2)
    ]]  # fmt: skip
    log.write_text("time,node\n" + "\n".join(rows) + "\n")
    return log


def test_an_end_centuries_past_the_log_is_one_line_not_an_overflow(capsys, tmp_path):
    # The CLI fuzz found --end 1e300 (and 1e12 h) raising OverflowError out of the CI math.
    log = _eight_failures(tmp_path)
    code, out, err = run_cli(capsys, log, "--end", "2200-01-01")
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
    assert "at most 100 years" in err
    assert run_cli(capsys, log, "--end", "2030-01-01")[0] == 0
    numbers = tmp_path / "n.csv"
    numbers.write_text("time\n1\n2\n5\n9\n12\n")
    for end in ("1e300", "1e12"):
        code, out, err = run_cli(capsys, numbers, "--end", end)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert "at most 100 years" in err


def test_a_number_as_the_end_of_a_log_of_dates_is_refused_not_read_as_hours_since_1970(
    capsys, tmp_path
):
    # Was: --end 5000 on dates meant 5000 h after 1970-01-01, before every failure.
    log = _eight_failures(tmp_path)
    for end in ("5000", "1e300", "1e12"):
        code, out, err = run_cli(capsys, log, "--end", end)
        assert code == 2 and out == "" and len(err.strip().splitlines()) == 1, err
        assert f"--end {end} is a number, but the log's times are dates" in err


def test_a_best_fit_no_simulation_can_sample_gives_way_to_the_next_best(capsys, tmp_path):
    # A long censored tail makes lognormal win with sigma above 5, which --failure refuses:
    # --scenario-out was a one-line refusal and no scenario; now the next best, said so. The
    # Weibull after it puts its mean 500x past the log's own rate, so it is passed over too.
    log = _eight_failures(tmp_path)
    out = tmp_path / "s.toml"
    code, _, err = run_cli(capsys, log, "--end", "2100-01-01", "--scenario-out", str(out))
    assert code == 0, err
    assert "passed over a better fit no simulation can sample: lognormal:sigma=" in err
    assert "passed over a better fit whose mean the log does not support: weibull:" in err
    text = out.read_text()
    assert 'failure = "exponential"' in text and "Passed over a better fit" in text
    assert main(["optimize", "--scenario", str(out)]) == 0


def test_outputs_that_cannot_be_written_are_refused_before_the_fit(capsys, tmp_path, monkeypatch):
    import simulator.fitting.fit

    log = tmp_path / "t.csv"
    log.write_text("time\n1\n2\n5\n9\n12\n")
    fitted = []
    monkeypatch.setattr(simulator.fitting.fit, "fit_log", lambda *a, **k: fitted.append(1))
    for flag, value in (("--scenario-out", "/proc/none/s.toml"), ("--plot", "p.xlsx")):
        code, out, err = run_cli(capsys, log, flag, value)
        assert code == 2 and out == "" and flag in err and len(err.strip().splitlines()) == 1
    assert not fitted


def test_repair_times_have_their_own_unit_and_are_shown_in_it(capsys, tmp_path):
    # Was: one --unit for both, so minutes of repair were read as hours.
    rng = np.random.default_rng(12)
    t_h = np.cumsum(rng.exponential(10.0, 400))
    down_min = rng.exponential(45.0, 400)
    log = tmp_path / "log.csv"
    pd.DataFrame({"time": t_h, "down_min": down_min}).to_csv(log, index=False)
    got = fit_json(capsys, log, "--repair-unit", "min")
    rep = family(got["repair"], "exponential")
    assert rep["mean_s"] == pytest.approx(down_min.mean() * 60)
    assert family(got, "exponential")["mean_s"] == pytest.approx(np.diff(t_h).mean() * HOUR)
    code, out, err = run_cli(capsys, log, "--repair-unit", "min")
    assert code == 0 and "repair/down time (400 failures, in min)" in out
    assert f"mean_min = {down_min.mean():.4g}" in out
    # Without it the column's name says minutes while it is read in hours: a note says so.
    code, out, err = run_cli(capsys, log)
    assert "note: column 'down_min' is read in h, but its name says min" in err


@pytest.mark.parametrize("name", ['my"x', "a\\b", 'evil\ngpus = 1\nx = "', "tab\there"])
def test_the_scenario_file_escapes_its_name_and_a_file_name_cannot_inject_a_key(
    capsys, tmp_path, name
):
    import tomllib

    log = tmp_path / "t.csv"
    log.write_text("time\n1\n2\n5\n9\n12\n20\n")
    out = tmp_path / f"{name}.toml"
    code, _, err = run_cli(capsys, log, "--scenario-out", out)
    assert code == 0, err
    data = tomllib.loads(out.read_text())
    assert data["name"] == name
    assert "gpus" not in data and set(data) == {"name", "failure", "mtbf_h"}
    # A file name with a newline cannot end a header comment and start a key either.
    evil = tmp_path / "x\nwork_h = 1\n.csv"
    evil.write_text("time\n1\n2\n5\n9\n12\n20\n")
    ok = tmp_path / "ok.toml"
    code, _, err = run_cli(capsys, evil, "--scenario-out", ok)
    assert code == 0, err
    assert "work_h" not in tomllib.loads(ok.read_text())


def test_a_system_gap_scenario_says_what_gpus_would_change_and_fit_does_not_write_them(
    capsys, tmp_path
):
    truth = Weibull(0.6, 10 * HOUR)
    log = tmp_path / "sys.csv"
    pd.DataFrame({"time": np.cumsum(truth.sample(np.random.default_rng(5), 800)) / HOUR}).to_csv(
        log, index=False
    )
    out = tmp_path / "s.toml"
    code, _, err = run_cli(capsys, log, "--scenario-out", out, "--gpus", "512")
    assert code == 0, err
    assert "note: --gpus 512 is not written" in err
    text = out.read_text()
    assert "weibull" in text and "\ngpus" not in text
    assert "Setting gpus" in text and "a different process from the one fitted here" in text


def test_the_readme_quick_start_runs_as_written_and_its_numbers_are_what_fit_prints(
    capsys, tmp_path, monkeypatch
):
    import re
    import shlex
    from pathlib import Path

    root = Path(__file__).resolve().parents[1]
    readme = (root / "README.md").read_text()
    section = readme[readme.index("### Your own failure data") : readme.index("## Commands")]
    block = section[section.index("```sh") + 5 : section.index("```", section.index("```sh") + 5)]
    commands = [shlex.split(line) for line in block.strip().splitlines()]
    assert [c[:2] for c in commands] == [["ckptsim", "fit"], ["ckptsim", "optimize"]]
    monkeypatch.chdir(tmp_path)
    (tmp_path / "experiments").symlink_to(root / "experiments")
    code = main(commands[0][1:])
    _, err = capsys.readouterr()
    assert code == 0, err
    assert main(commands[1][1:]) == 0
    capsys.readouterr()
    got = fit_json(capsys, *commands[0][2:])
    ln = family(got, "lognormal")
    mean_h = ln["mean_s"] / HOUR
    ratio = got["extrapolation"]["ratio"]
    assert f"{mean_h:,.0f} h, {ratio:.0f} times the log's own" in " ".join(section.split())
    shape = family(got, "weibull")["params"]["shape"]
    assert f"(a Weibull, shape {shape:.2f})" in " ".join(section.split())
    written = (tmp_path / "mine.toml").read_text()
    # One class per cause, as the section says; --cause-column none gives the Weibull it quotes.
    assert written.count("\n[[failure_class]]\n") == len(got["causes"]) == 6
    assert "all six classes are exponential" in " ".join(section.split())
    assert written.count('failure = "exponential"') == 6
    out = tmp_path / "whole.toml"
    assert main([*commands[0][1:-6], "--cause-column", "none", "--scenario-out", str(out)]) == 0
    assert re.search(rf'failure = "weibull:shape={shape:.6g}"', out.read_text())


def _classes(path):
    import tomllib

    return tomllib.loads(path.read_text())


def test_a_cause_column_writes_one_failure_class_per_cause_that_optimize_and_simulate_run(
    capsys, tmp_path
):
    # The committed LANL log: per-node gaps, six causes, down times in minutes.
    from pathlib import Path

    log = Path(__file__).resolve().parents[1] / "experiments" / "logs" / "lanl-system20.csv"
    out = tmp_path / "m.toml"
    got = fit_json(capsys, log, "--repair-unit", "min", "--scenario-out", out)
    data = _classes(out)
    classes = {c["name"]: c for c in data["failure_class"]}
    assert set(classes) == set(got["causes"])  # every cause here has a fit of its own
    assert not any(k in data for k in ("failure", "gpu_mtbf_h", "mtbf_h"))
    assert data["gpus"] == got["components"] and data["gpus_per_node"] == 1
    rate = 0.0
    for name, c in classes.items():
        sub = got["causes"][name]
        fam = family(sub, c["failure"].split(":")[0])
        # The class's lifetime is that cause's own fit, per component.
        assert c["gpu_mtbf_h"] == pytest.approx(fam["mean_s"] / HOUR, rel=1e-5), name
        # Its restart_s is the mean of that cause's down-time fit (the best one the log backs).
        means = [f["mean_s"] for f in sub["repair"]["families"]]
        assert any(c["restart_s"] == pytest.approx(m, rel=1e-5) for m in means), name
        rate += 1 / c["gpu_mtbf_h"]
    text = out.read_text()
    assert "standing in for the job's restart cost" in text and "mean of its" in text
    # On this log every cause's own fit is exponential (the README says so), and then the
    # classes' rates add up to the log's own.
    assert all(c["failure"] == "exponential" for c in classes.values())
    assert rate == pytest.approx(1 / (family(got, "exponential")["mean_s"] / HOUR), rel=1e-5)
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    opt = subprocess.run(
        [sys.executable, "-m", "simulator", "optimize", "--scenario", str(out), "--json"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert opt.returncode == 0, opt.stderr
    plan = json.loads(opt.stdout)
    assert {c["name"] for c in plan["scenario"]["failure_class"]} == set(classes)
    sim = subprocess.run(
        [sys.executable, "-m", "simulator", "simulate", "--scenario", str(out), "--work-h", "200",
         "--replicas", "20", "--json", "--no-progress"],
        capture_output=True, text=True, env=env,
    )  # fmt: skip
    assert sim.returncode == 0, sim.stderr
    summary = json.loads(sim.stdout)
    assert all(f"failures_{name}_mean" in json.dumps(summary) for name in classes)


def test_causes_without_a_fit_of_their_own_are_pooled_into_one_class_and_said(capsys, tmp_path):
    rng = np.random.default_rng(8)
    gaps = rng.exponential(5.0, 400)
    cause = rng.choice(["gpu", "network"], 400, p=[0.7, 0.3]).astype(object)
    cause[17] = "power=grid"  # one failure: no fit of its own; a name no class may take
    cause[[40, 41, 90]] = ""  # blank causes
    cause[[5, 60, 200]] = "rack=3"  # a fit of its own, under a name a class may take
    log = tmp_path / "sys.csv"
    pd.DataFrame({"time": np.cumsum(gaps), "cause": cause}).to_csv(log, index=False)
    out = tmp_path / "s.toml"
    got = fit_json(capsys, log, "--scenario-out", out, "--restart-s", "300")
    data = _classes(out)
    names = [c["name"] for c in data["failure_class"]]
    assert names == ["gpu", "network", "cause_rack_3", "other"]
    other = data["failure_class"][-1]
    # System gaps: each class's rate is the whole system's (mtbf_h), no gpus written.
    assert all("mtbf_h" in c and "gpu_mtbf_h" not in c for c in data["failure_class"])
    pooled = got["events"] - sum(c["events"] for c in got["causes"].values())
    assert pooled == 4
    text = " ".join(out.read_text().replace("\n# ", " ").split())
    assert "cause 'rack=3' as 'cause_rack_3': 3 of" in text
    assert f"pooled: {pooled} of {got['events']:,}" in text and "'power=grid'" in text
    assert "3 with a blank cause" in text
    # --restart-s is every class's restart: no class overrides it.
    assert data["restart_s"] == 300 and not any("restart_s" in c for c in data["failure_class"])
    assert other["mtbf_h"] > 0
    assert main(["optimize", "--scenario", str(out)]) == 0


def test_the_committed_lanl_class_mix_is_what_fit_writes_from_the_committed_log(
    capsys, tmp_path, monkeypatch
):
    from pathlib import Path

    from experiments import example_log

    root = Path(__file__).resolve().parents[1]
    committed = example_log.SCENARIO.read_text()
    monkeypatch.chdir(root)  # the header names the log as the generator does
    out = tmp_path / example_log.SCENARIO.name
    log = str(example_log.OUT.relative_to(root))
    assert main(["fit", log, *example_log.CLASSES_ARGS, "--scenario-out", str(out)]) == 0
    capsys.readouterr()
    assert out.read_text() == committed
    assert main(["optimize", "--scenario", str(example_log.SCENARIO)]) == 0
    # reports/lanl-fit.md's class table shows the file's classes, number for number.
    report = (root / "reports" / "lanl-fit.md").read_text()
    for c in _classes(example_log.SCENARIO)["failure_class"]:
        row = f"| {c['name']} | "
        line = next(x for x in report.splitlines() if x.startswith(row) and " %) |" in x)
        assert f"| {c['failure']} | {c['gpu_mtbf_h']:,.0f} | {c['restart_s'] / HOUR:.2f} |" in line
