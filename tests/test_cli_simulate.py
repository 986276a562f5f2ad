"""``ckptsim simulate``: flags, JSON and human output, per-replica files, one-line errors."""

from __future__ import annotations

import json
import math
import re

import pandas as pd
import pytest

from simulator.cli import main

JOB = [
    "--gpus", "256", "--gpus-per-node", "8", "--gpu-mtbf-h", "1024", "--checkpoint-s", "60",
    "--restart-s", "300", "--work-h", "12", "--replicas", "6", "--workers", "1", "--seed", "3",
]  # fmt: skip


def run_json(capsys, *argv):
    assert main(["simulate", *argv, "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def _censored_weibull_log(path, shape=0.7, n=3000):
    import numpy as np

    rng = np.random.default_rng(1)
    t, c = rng.weibull(shape, n) * 1000.0, rng.uniform(0, 12000.0, n)
    rows = "".join(f"{a:.4f},{int(a == b)}\n" for a, b in zip(np.minimum(t, c), t, strict=True))
    path.write_text("duration,event\n" + rows)
    return path


@pytest.mark.parametrize("engine", ["fast", "des"])
def test_failure_empirical_file_draws_the_logs_lifetimes_in_both_engines(capsys, tmp_path, engine):
    # A log of Weibull(0.7) lifetimes, a tenth of them censored (few enough that the assumed
    # exponential tail past the longest lifetime barely moves the mean; heavy censoring is
    # checked on the survival itself in test_failures): its Kaplan-Meier shape, rescaled
    # to the scenario's MTBF, must simulate as Weibull(0.7) does (same seed, same job). New
    # GPUs, so the shape shows: infant mortality gives ~2.6x the exponential's failures.
    log = _censored_weibull_log(tmp_path / "life.csv")
    job = ["--gpus", "64", "--gpu-mtbf-h", "2000", "--checkpoint-s", "120", "--work-h", "200",
           "--replicas", "200", "--workers", "1", "--engine", engine,
           "--component-age", "new"]  # fmt: skip
    got = run_json(capsys, *job, "--failure", f"empirical:{log}")
    want = run_json(capsys, *job, "--failure", "weibull:shape=0.7")
    expo = run_json(capsys, *job, "--failure", "exponential")
    assert got["engine"] == engine
    assert got["failures_mean"] == pytest.approx(want["failures_mean"], rel=0.1)
    assert got["failures_mean"] > 2 * expo["failures_mean"]
    lo, hi = want["waste_fraction_ci95"]
    assert lo - (hi - lo) <= got["waste_fraction_mean"] <= hi + (hi - lo)


@pytest.mark.parametrize(
    ("spec", "fragment"),
    [
        ("empirical", "need a failure log: empirical:FILE"),
        ("empirical:", "need a failure log: empirical:FILE"),
        ("empirical:absent.csv", "empirical:absent.csv: cannot read the failure log"),
        ("empirical:censored.csv", "no failed lifetimes"),
    ],
)
def test_a_bad_empirical_spec_is_one_line(capsys, tmp_path, monkeypatch, spec, fragment):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "censored.csv").write_text("duration,event\n5,0\n7,0\n")
    code = main(["simulate", *JOB, "--failure", spec])
    err = capsys.readouterr().err
    assert code == 2 and len(err.strip().splitlines()) == 1 and fragment in err, err


def test_the_controller_policy_simulates_what_a_wrong_prior_costs_while_it_learns(capsys):
    # --policy controller runs the live AdaptiveCheckpointer's decision in the DES: with the
    # true MTBF as its prior it does what the optimum does; believing a 10x longer MTBF, it
    # saves too rarely until the failures it meets correct it, and that costs waste.
    job = ["--mtbf-h", "30", "--checkpoint-s", "120", "--restart-s", "600", "--work-h", "500",
           "--replicas", "80", "--workers", "1", "--seed", "5"]  # fmt: skip
    best = run_json(capsys, *job, "--engine", "des")
    right = run_json(capsys, *job, "--policy", "controller")
    wrong = run_json(capsys, *job, "--policy", "controller", "--prior-mtbf-h", "300")
    assert right["engine"] == wrong["engine"] == "des"
    lo, hi = best["waste_fraction_ci95"]
    assert lo - (hi - lo) / 2 <= right["waste_fraction_mean"] <= hi + (hi - lo) / 2
    assert wrong["waste_fraction_ci95"][0] > right["waste_fraction_ci95"][1]
    assert wrong["checkpoints_mean"] < 0.8 * right["checkpoints_mean"]


def test_with_step_s_the_controller_pays_for_its_probe_on_every_fresh_start(capsys):
    # --step-s adds the live controller's step rules: before its first save it probes 20
    # steps, here of 3 h each: 60 h of compute against a 30 h MTBF, so most fresh starts are
    # killed before their first save and start again from scratch.
    job = ["--mtbf-h", "30", "--checkpoint-s", "120", "--restart-s", "600", "--work-h", "500",
           "--replicas", "30", "--workers", "1", "--seed", "5",
           "--policy", "controller"]  # fmt: skip
    plain = run_json(capsys, *job)
    stepped = run_json(capsys, *job, "--step-s", "10800")
    assert stepped["waste_fraction_ci95"][0] > plain["waste_fraction_ci95"][1]
    assert stepped["lost_h_mean"] > 2 * plain["lost_h_mean"]


def test_json_carries_the_documented_keys(capsys):
    out = run_json(capsys, *JOB, "--usd-per-gpu-hour", "2.5")
    for key in ("wall_h_mean", "waste_fraction_mean", "failures_mean", "checkpoints_mean"):
        assert math.isfinite(out[key])
    lo, hi = out["wall_h_ci95"]
    assert lo <= out["wall_h_mean"] <= hi
    assert out["wall_h_mean"] > 12
    assert out["usd_mean"] == pytest.approx(out["wall_h_mean"] * 256 * 2.5)
    assert out["replicas"] == 6 and out["policy"] == "optimal"


def test_without_a_price_there_is_no_cost(capsys):
    assert "usd_mean" not in run_json(capsys, *JOB)


def test_a_fixed_interval_without_failures_costs_one_stall_per_save(capsys):
    argv = [a if a != "1024" else "1e12" for a in JOB]
    out = run_json(capsys, *argv, "--interval-s", "5000")
    saves = math.ceil(12 * 3600 / 5000)
    assert out["failures_mean"] == 0
    assert out["checkpoints_mean"] == saves
    assert out["wall_h_mean"] == pytest.approx(12 + saves * 60 / 3600)


def test_the_same_seed_gives_the_same_answer_and_policies_differ(capsys):
    a = run_json(capsys, *JOB, "--policy", "young")
    b = run_json(capsys, *JOB, "--policy", "young")
    c = run_json(capsys, *JOB, "--policy", "adaptive", "--failure", "weibull:shape=0.7")
    assert a["wall_h_mean"] == b["wall_h_mean"]
    assert c["policy"] == "adaptive" and c["failure"] == "weibull:shape=0.7"


def test_model_flags_reach_the_simulation(capsys):
    out = run_json(
        capsys, *JOB, "--staging-s", "5", "--spares", "0", "--repair-h", "2", "--detection-s",
        "30", "--node-mtbf-h", "5000",
    )  # fmt: skip
    assert out["checkpoint_stall_s"] == 5.0
    assert out["recovery_s"] == 330.0
    assert out["spare_wait_h_mean"] > 0


def test_records_go_to_csv_one_row_per_replica(tmp_path, capsys):
    path = tmp_path / "runs.csv"
    out = run_json(capsys, *JOB, "--out", str(path))
    records = pd.read_csv(path)
    assert len(records) == 6
    assert records["wall_h"].mean() == pytest.approx(out["wall_h_mean"])


def test_human_output_is_a_table_and_a_verdict(capsys):
    assert main(["simulate", *JOB, "--usd-per-gpu-hour", "2"]) == 0
    text = capsys.readouterr().out
    assert "wall time (h)" in text and "p99" in text and "cost (USD)" in text
    verdict = [line for line in text.splitlines() if line.startswith("verdict:")]
    assert len(verdict) == 1 and "of wall time" in verdict[0]
    # Money as a reader writes it, in the table and the verdict alike: $6,910, not 6910 USD.
    assert re.search(r", \$\d{1,3}(,\d{3})* per run\.$", verdict[0])
    cost = next(line for line in text.splitlines() if line.startswith("cost (USD)"))
    assert len(re.findall(r"\$\d{1,3}(?:,\d{3})*", cost)) == 6 and "e+" not in text


@pytest.mark.parametrize(
    ("argv", "fragment"),
    [
        (["--policy", "hourly"], "invalid choice"),
        (["--out", "runs.xlsx"], "use .csv, .parquet"),
        (["--spares", "-1"], ">= 0"),
        (["--failure", "gamma"], "unknown failure distribution"),
        (["--spares", "2"], "--repair-h"),
        (["--gpus", "8", "--checkpoint-s", "60", "--work-h", "10"], "no failure rate"),
        (["--mtbf-h", "3", "--checkpoint-s", "60"], "work-h"),
    ],
)
def test_bad_input_is_one_line_and_status_2(capsys, argv, fragment):
    base = [] if "--gpus" in argv or "--mtbf-h" in argv else JOB
    with pytest.raises(SystemExit) as exc:
        code = main(["simulate", *base, *argv])
        raise SystemExit(code)
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and fragment in err


@pytest.mark.parametrize(
    ("argv", "engine"),
    [
        ([], "fast"),  # auto, plain model: the fast engine applies
        (["--engine", "des"], "des"),
        (["--engine", "fast"], "fast"),
        (["--spares", "2", "--repair-h", "24"], "des"),  # auto: spares need the DES
    ],
)
def test_json_says_which_engine_ran(capsys, argv, engine):
    assert run_json(capsys, *JOB, *argv)["engine"] == engine


def test_the_human_output_names_the_engine(capsys):
    assert main(["simulate", *JOB, "--engine", "des"]) == 0
    assert "6 replicas on the des engine" in capsys.readouterr().out.splitlines()[0]


def test_asking_for_the_fast_engine_where_it_does_not_apply_is_one_line_and_status_2(capsys):
    code = main(["simulate", *JOB, "--spares", "2", "--repair-h", "24", "--engine", "fast"])
    assert code == 2
    captured = capsys.readouterr()
    err = captured.err.strip()
    assert captured.out == "" and len(err.splitlines()) == 1
    assert "does not model spares" in err and "--engine des" in err


def test_the_policy_flag_offers_every_policy_the_package_names():
    # Spelled out in the CLI so --help imports no numpy: the two lists must stay one.
    from simulator.cli.simulate import POLICIES
    from simulator.policies import POLICY_NAMES

    assert set(POLICIES) == set(POLICY_NAMES) - {"fixed"}


def test_a_long_probe_or_a_wrong_prior_is_budgeted_as_the_controller_settles_and_recorded(capsys):
    # The budget assumes the interval a learner settles on, not its first guess (a 25 h step,
    # or a prior MTBF 200,000x the job's), and the run records the controller's settings.
    job = ["--gpus", "1024", "--gpu-mtbf-h", "50000", "--work-h", "50", "--replicas", "4",
           "--workers", "1", "--policy", "controller"]  # fmt: skip
    out = run_json(capsys, *job, "--step-s", "90000", "--prior-mtbf-h", "1e7")
    assert out["step_s"] == 90000.0 and out["prior_mtbf_h"] == 1e7
    assert out["wall_h_mean"] > 50


def test_the_table_keeps_its_columns_apart_whatever_the_widths(capsys):
    # From the new-user review: a nine-digit dollar mean ran into its interval.
    from simulator.cli import main

    argv = ["simulate", "--scenario", "llama3", "--replicas", "5", "--checkpoint-s", "20000"]
    assert main([*argv, "--no-progress"]) == 0  # the preset's own work: $678,289,350 a run
    out = capsys.readouterr().out.splitlines()
    header = next(i for i, line in enumerate(out) if "95% CI of mean" in line)
    table = out[header : out.index("", header)]
    cost = next(line for line in table if line.startswith("cost (USD)"))
    cells = re.split(r"\s{2,}", cost.strip())
    assert len(cells) == 6 and all(c.startswith("$") for c in cells[1:]), cells
    assert len({len(line) for line in table}) == 1  # every row as wide as the header
