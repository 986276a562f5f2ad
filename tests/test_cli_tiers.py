"""`ckptsim optimize` and `ckptsim simulate` on a scenario with [[tier]] and [[failure_class]]."""

from __future__ import annotations

import json
import math
import textwrap

import pytest
from _cli import run_cli as run

from simulator import analytic
from simulator.model.scenario import load_scenario
from simulator.model.tier_plan import closed_form_plan
from simulator.model.tiers import first_order_plan

TWO_TIERS = """
name = "two-tier"
gpus = 1024
work_h = 200
restart_s = 300
usd_per_gpu_hour = 2.0
[[failure_class]]
name = "process"
gpu_mtbf_h = 20000
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


@pytest.fixture
def toml(tmp_path):
    path = tmp_path / "two.toml"
    path.write_text(textwrap.dedent(TWO_TIERS))
    return path


def test_optimize_gives_every_tiers_interval_and_the_best_single_tier_beside_it(capsys, toml):
    code, out, err = run(capsys, "optimize", "--scenario", str(toml), "--json")
    assert code == 0, err
    got = json.loads(out)
    s = load_scenario(toml)
    assert got["tier_intervals_s"] == first_order_plan(s)["tier_intervals_s"]
    # Memory serves the 1,024 GPUs' process failures, persistent the 128 nodes' losses.
    lam_mem, lam_node = 1024 / (20000 * 3600), 128 / (20000 * 3600)
    assert got["tier_intervals_s"]["memory"] == pytest.approx(math.sqrt(2 * 2 / lam_mem))
    assert got["tier_intervals_s"]["persistent"] == pytest.approx(math.sqrt(2 * 60 / lam_node))
    # One tier: every save persistent, against every failure, at today's single-tier optimum
    # (the exact one, as `ckptsim optimize` gives a job without tiers).
    assert got["single_tier"] == "persistent"
    lam = lam_mem + lam_node
    assert got["single_tier_interval_s"] == pytest.approx(analytic.optimal_interval(60, 1 / lam))
    assert got["optimal_waste_fraction"] < got["single_tier_waste_fraction"]
    day = 1024 * 2.0 * 24
    assert got["usd_lost_per_day"] == pytest.approx(day * got["optimal_waste_fraction"])
    assert got["usd_saved_per_day"] > 0
    code, out, _ = run(capsys, "optimize", "--scenario", str(toml))
    assert code == 0 and "Recommendation (closed form): the tiers as above." in out


def test_simulate_runs_the_tiers_and_counts_failures_per_class_and_saves_per_tier(capsys, toml):
    argv = ["simulate", "--scenario", str(toml), "--replicas", "3", "--no-progress", "--json"]
    code, out, err = run(capsys, *argv, "--tier-interval-s", "memory=600")
    assert code == 0, err
    often = json.loads(out)
    assert often["engine"] == "des"
    for key in ("failures_process", "failures_node", "saves_memory", "saves_persistent",
                "restores_memory", "restores_persistent"):  # fmt: skip
        assert f"{key}_mean" in often
    assert often["failures_mean"] == pytest.approx(
        often["failures_process_mean"] + often["failures_node_mean"]
    )
    code, out, err = run(capsys, *argv, "--tier-interval-s", "memory=3600")
    assert code == 0, err
    rarely = json.loads(out)
    # The same failures (common random numbers), fewer memory saves.
    assert rarely["failures_node_mean"] == often["failures_node_mean"]
    assert rarely["saves_memory_mean"] < often["saves_memory_mean"] / 4


@pytest.mark.parametrize(
    "extra, fragment",
    [
        (["--tier-interval-s", "memory"], "give NAME=SECONDS"),
        (["--tier-interval-s", "disk=60"], "no tier named 'disk'"),
        (["--tier-interval-s", "memory=0"], "must be a positive number"),
        (["--tier-interval-s", "memory=-inf"], "(or inf: no saves on a schedule)"),
        (["--tier-interval-s", "memory=ten"], "give NAME=SECONDS"),
        (["--tier-interval-s", "memory=5", "--tier-interval-s", "memory=6"], "given twice"),
        (["--policy", "young"], "not --policy"),
    ],
)
def test_bad_tier_flags_are_one_line(capsys, toml, extra, fragment):
    code, out, err = run(capsys, "simulate", "--scenario", str(toml), *extra)
    assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


def test_tier_flags_without_tiers_and_simulate_with_tiers_are_refused(capsys, toml):
    code, _, err = run(capsys, "simulate", "--mtbf-h", "3", "--work-h", "5",
                       "--tier-interval-s", "memory=5")  # fmt: skip
    assert code == 2 and "needs a scenario with [[tier]] tables" in err
    code, _, err = run(capsys, "optimize", "--scenario", str(toml), "--simulate", "--replicas", "1")
    assert code == 2 and "--replicas 2 or more" in err


def test_optimize_simulate_finds_every_tiers_interval_and_the_single_tier_on_fresh_seeds(
    capsys, toml
):
    job = ["optimize", "--scenario", str(toml), "--simulate", "--replicas", "8", "--workers", "1"]
    code, out, err = run(capsys, *job, "--json")
    assert code == 0, err
    sim = json.loads(out)["simulated"]
    assert sim["evaluations"] == 27 and sim["replicas"] == 8
    for name in ("memory", "persistent"):
        lo, hi = sim["tier_intervals_ci95_s"][name]
        assert lo <= sim["tier_intervals_s"][name] <= hi
    for s in (sim, sim["first_order"], sim["single_tier_simulated"]):
        lo, hi = s["waste_fraction_ci95"]
        assert 0 < lo <= s["waste_fraction"] <= hi
        assert s["usd_lost_per_day"] == pytest.approx(1024 * 2.0 * 24 * s["waste_fraction"])
    # Process crashes are 8x as frequent as node losses here (per GPU vs per node, same MTBF):
    # the memory tier pays, measured paired on the same failures.
    assert sim["single_tier"] == "persistent"
    assert sim["waste_saved_vs_single_tier"]["lo"] > 0
    code, out, _ = run(capsys, *job)
    assert code == 0 and "Simulated optimum" in out and "The tiers waste less" in out


def test_failure_classes_without_tiers_roll_back_to_the_scenarios_own_save(capsys, tmp_path):
    # Was: optimize ignored the classes' detection and restart times (the single-tier path) and
    # simulate said "no failure rate". Now the scenario's save is the one tier every class
    # rolls back to: the same answers as writing that tier out.
    head, _, _ = TWO_TIERS.partition("[[tier]]")
    implicit = tmp_path / "classes.toml"
    implicit.write_text("checkpoint_s = 60\n" + textwrap.dedent(head))  # a top-level key
    explicit = tmp_path / "one-tier.toml"
    explicit.write_text(
        textwrap.dedent(head)
        + '[[tier]]\nname = "persistent"\ncheckpoint_s = 60\nsurvives = ["process", "node"]\n'
    )
    got = [json.loads(run(capsys, "optimize", "--scenario", str(p), "--json")[1])
           for p in (implicit, explicit)]  # fmt: skip
    assert got[0]["tier_intervals_s"] == got[1]["tier_intervals_s"]
    assert got[0]["optimal_waste_fraction"] == got[1]["optimal_waste_fraction"]
    slower = tmp_path / "slow-detection.toml"
    slower.write_text(implicit.read_text().replace("detection_s = 60", "detection_s = 3600"))
    worse = json.loads(run(capsys, "optimize", "--scenario", str(slower), "--json")[1])
    assert worse["optimal_waste_fraction"] > got[0]["optimal_waste_fraction"]  # R per class
    sims = [
        json.loads(run(capsys, "simulate", "--scenario", str(p), "--replicas", "6",
                       "--workers", "1", "--seed", "2", "--json")[1])
        for p in (implicit, explicit)
    ]  # fmt: skip
    assert sims[0]["wall_h_mean"] == sims[1]["wall_h_mean"]  # same failures, same model
    assert sims[0]["failures_node_mean"] > 0


def _classes_only(tmp_path):
    head, _, _ = TWO_TIERS.partition("[[tier]]")
    path = tmp_path / "classes.toml"
    path.write_text("checkpoint_s = 60\n" + textwrap.dedent(head))
    return path


def test_flags_reach_the_implicit_tier_and_not_an_explicit_one(capsys, tmp_path):
    # The implicit tier is built from the scenario's save fields, after the flags: a helper
    # found --checkpoint-s 900 printed as the stall while 60 s saves were simulated.
    path = _classes_only(tmp_path)
    sim = ["simulate", "--scenario", str(path), "--replicas", "4", "--workers", "1", "--json"]
    base = json.loads(run(capsys, *sim)[1])
    slow = json.loads(run(capsys, *sim, "--checkpoint-s", "900")[1])
    assert slow["checkpoints_mean"] < base["checkpoints_mean"] / 2
    assert slow["checkpoint_h_mean"] == pytest.approx(
        slow["checkpoints_mean"] * 900 / 3600, rel=0.1
    )
    opt = ["optimize", "--scenario", str(path), "--json"]
    fast_tier = json.loads(run(capsys, *opt)[1])["tier_intervals_s"]["persistent"]
    slow_tier = json.loads(run(capsys, *opt, "--checkpoint-s", "900")[1])
    assert slow_tier["tier_intervals_s"]["persistent"] > 3 * fast_tier
    # A file's own [[tier]] tables are not reached by the flags: refused, not ignored.
    code, _, err = run(capsys, "optimize", "--scenario", "llama3-mix", "--checkpoint-s", "900")
    assert code == 2 and "does not reach the scenario's [[tier]] tables" in err


def test_one_implicit_tier_takes_a_fixed_interval_or_a_closed_form_policy(capsys, tmp_path):
    path = _classes_only(tmp_path)
    sim = ["simulate", "--scenario", str(path), "--replicas", "4", "--workers", "1", "--json"]
    fixed = json.loads(run(capsys, *sim, "--interval-s", "3600")[1])
    assert fixed["checkpoints_mean"] == pytest.approx(200, abs=2)  # 200 h of work, hourly
    young = json.loads(run(capsys, *sim, "--policy", "young")[1])
    assert young["checkpoints_mean"] > fixed["checkpoints_mean"]  # M ~8 h, delta 60 s: ~30 min
    code, _, err = run(capsys, *sim, "--policy", "controller")
    assert code == 2 and "not modelled with [[failure_class]] tables" in err


def test_a_relative_empirical_path_in_a_file_is_read_from_the_files_folder(
    capsys, tmp_path, monkeypatch
):
    folder = tmp_path / "scenarios"
    folder.mkdir()
    (folder / "log.csv").write_text("duration,event\n" + "".join(f"{h},1\n" for h in range(1, 30)))
    (folder / "emp.toml").write_text(
        'gpus = 64\ngpu_mtbf_h = 5000\nwork_h = 50\nfailure = "empirical:log.csv"\n'
    )
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run(capsys, "simulate", "--scenario", "../scenarios/emp.toml",
                         "--replicas", "2", "--workers", "1", "--json")  # fmt: skip
    assert code == 0, err
    assert json.loads(out)["failure"].endswith("scenarios/log.csv")


def test_the_implicit_tier_writes_as_long_as_the_scenarios_own_save():
    # One rule for the write time: bytes over the writer nodes' bandwidth, capped by the
    # storage default. The tier had its own (uncapped) rule and wrote 5x faster.
    from simulator.model.scenario import Scenario

    s = Scenario(
        gpus=16384, checkpoint_bytes=5.67e12, write_bytes_per_s_per_node=5e9, work_h=100,
        failure_classes=[{"name": "process", "gpu_mtbf_h": 50000}],
    )  # fmt: skip
    assert s.tiers[0].write_s(s.nodes) == s.checkpoint_write_s == pytest.approx(2.835)


def _variant(tmp_path, old, new):
    path = tmp_path / "variant.toml"
    text = textwrap.dedent(TWO_TIERS)
    assert old in text
    path.write_text(text.replace(old, new))
    return str(path)


def test_an_internal_tier_field_in_a_file_is_an_unknown_field_not_a_traceback(capsys, tmp_path):
    toml = _variant(tmp_path, 'name = "memory"\n', 'name = "memory"\nimplicit = true\n')
    code, out, err = run(capsys, "optimize", "--scenario", toml)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert "unknown field 'implicit'" in err and "implicit," not in err.split("known:")[1]


def test_the_budget_of_a_tiered_run_counts_the_tiers_saves_not_the_scenarios_one(capsys, tmp_path):
    # A memory tier of a microsecond (the least a duration may be) would be saved every
    # fraction of a second: a budget refusal for its millions of saves, not "no headway" from
    # a 60 s save the file does not have.
    toml = _variant(tmp_path, "checkpoint_s = 2\n", "checkpoint_s = 1e-6\n")
    code, _, err = run(capsys, "optimize", "--scenario", toml, "--simulate", "--replicas", "40")
    assert code == 2 and "of one core" in err and "no headway" not in err, err
    # ... and a tiered scenario that is hopeless even at its first-order intervals is refused
    # there, not printed with a waste over 100 %.
    toml = _variant(tmp_path, "checkpoint_s = 60\n", "checkpoint_s = 1e9\n")
    code, out, err = run(capsys, "optimize", "--scenario", toml)
    assert code == 2 and out == "" and "no headway" in err


def test_flags_the_tier_model_does_not_take_are_refused_and_a_tier_no_job_needs_is_final_only(
    capsys, tmp_path, toml
):
    code, _, err = run(capsys, "optimize", "--scenario", str(toml), "--step-s", "4")
    assert code == 2 and "--step-s with [[tier]] tables" in err
    # Node losses once in 1e12 h: no persistent save is worth it before the final one, and
    # the search says so instead of "searching" intervals longer than the job.
    rare = _variant(tmp_path, "node_mtbf_h = 20000\n", "node_mtbf_h = 1e12\n")
    job = ["optimize", "--scenario", rare, "--simulate", "--replicas", "4", "--workers", "1"]
    code, out, err = run(capsys, *job, "--json")
    assert code == 0, err
    sim = json.loads(out)["simulated"]
    assert sim["tier_intervals_s"]["persistent"] is None  # inf in JSON
    assert "persistent" not in sim["tier_intervals_ci95_s"]
    assert sim["evaluations"] == 2 * 3 + 2 * 3 + 3  # memory alone; the persistent tier alone


def test_a_just_in_time_tier_is_shown_searched_and_beats_one_tier_on_the_same_failures(
    capsys, tmp_path
):
    toml = _variant(
        tmp_path,
        'name = "memory"\ncheckpoint_s = 2\n',
        'name = "jit"\njit = true\ncheckpoint_s = 60\n',
    )
    code, out, _ = run(capsys, "optimize", "--scenario", toml)
    assert code == 0 and "on failure" in out and "(just in time)" in out
    job = ["optimize", "--scenario", toml, "--simulate", "--replicas", "8", "--workers", "1"]
    code, out, err = run(capsys, *job, "--json")
    assert code == 0, err
    res = json.loads(out)
    assert (
        set(res["tier_intervals_s"]) == {"persistent"} and res["jit_failure_rates_per_h"]["jit"] > 0
    )
    sim = res["simulated"]
    # The single tier runs without the just-in-time saves: the memory-less baseline.
    assert sim["single_tier"] == "persistent" and sim["waste_saved_vs_single_tier"]["lo"] > 0
    code, _, err = run(capsys, "simulate", "--scenario", toml, "--tier-interval-s", "jit=60")
    assert code == 2 and "saved just in time" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize(
    "flag", [["--failure", "weibull:shape=0.7"], ["--detection-s", "3000"], ["--restart-s", "60"]]
)
def test_scenario_wide_failure_flags_over_classes_that_set_their_own_are_refused(
    capsys, tmp_path, flag
):
    # Every class of this file sets its own restart; none takes the scenario's family or
    # detection time. A flag they would not reach is one line, not a run that ignores it
    # under a header naming the flag's family.
    toml = _variant(tmp_path, "[[failure_class]]\nname = \"process\"\n",
                    "[[failure_class]]\nname = \"process\"\nrestart_s = 300\n")  # fmt: skip
    code, out, err = run(capsys, "simulate", "--scenario", toml, *flag)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{flag[0]} does not reach the scenario's [[failure_class]] tables" in err


def test_the_run_header_names_the_failure_classes_and_their_families(capsys, tmp_path):
    toml = _variant(
        tmp_path, "gpu_mtbf_h = 20000\n", 'gpu_mtbf_h = 20000\nfailure = "weibull:shape=0.7"\n'
    )
    code, out, err = run(capsys, "simulate", "--scenario", toml, "--replicas", "2",
                         "--workers", "1", "--work-h", "20")  # fmt: skip
    assert code == 0, err
    assert "(2 failure classes: exponential, weibull:shape=0.7)" in out.splitlines()[0]


def test_optimize_warns_that_the_tier_closed_form_assumes_exponential_classes(capsys, tmp_path):
    toml = _variant(
        tmp_path, "gpu_mtbf_h = 20000\n", 'gpu_mtbf_h = 20000\nfailure = "weibull:shape=0.7"\n'
    )
    code, out, err = run(capsys, "optimize", "--scenario", toml, "--json")
    assert code == 0 and "class 'process' is weibull:shape=0.7" in err
    assert json.loads(out)["warnings"] and "warning:" not in out  # stderr, not the JSON


def test_every_strategy_says_what_it_assumes_in_the_table_and_the_json(capsys, toml, tmp_path):
    code, out, _ = run(capsys, "optimize", "--scenario", str(toml))
    assert code == 0
    lines = [line for line in out.splitlines() if line.startswith("  ")]
    assert lines and max(len(line) for line in lines) <= 100  # wrapped for a terminal
    assert not any(line.rstrip().endswith(tuple("0123456789")) for line in lines)  # "60 s"
    text = " ".join(out.split())
    assert "assumes memory: a copy that outlives process failures but not node" in text
    assert "(2 s stall per save, restore 10 s)" in text
    assert "assumes persistent: a copy every failure class leaves intact" in text
    code, out, _ = run(capsys, "optimize", "--scenario", str(toml), "--json")
    assumes = json.loads(out)["assumes"]
    assert [a.split(":")[0] for a in assumes["tiers"]] == ["memory", "persistent"]
    assert assumes["single_tier"].startswith("persistent: a copy every failure class")
    jit = _variant(
        tmp_path,
        'name = "memory"\ncheckpoint_s = 2\n',
        'name = "jit"\njit = true\ncheckpoint_s = 60\n',
    )
    code, out, _ = run(capsys, "optimize", "--scenario", jit, "--json")
    assert json.loads(out)["assumes"]["tiers"][0] == (
        "jit: healthy replicas still hold the whole state after a process failure and save it "
        "in 60 s (restore 10 s)"
    )


def _measured_profile(path):
    """A cost profile as ``ckptsim bench --out`` writes it: a synchronous format (torch) and an
    asynchronous one (ckptsim-async, staging at 4 GB/s), 200 MB/s writes, 400 MB/s reads."""
    from simulator.model.checkpoint_cost import CostProfile

    samples = []
    for params in (1e7, 1e8, 1e9):
        nbytes = params * 12
        row = {"dtype": "fp32", "params": params, "tensor_bytes": nbytes, "bytes": nbytes,
               "save_s": 0.5 + nbytes / 2e8, "load_s": 0.5 + nbytes / 4e8}  # fmt: skip
        samples += [
            row | {"format": "torch", "stall_s": None},
            row | {"format": "ckptsim-async", "stall_s": 0.01 + nbytes / 4e9},
        ]
    CostProfile.from_samples(samples, {"cpu_count": 2}).save(path)
    return CostProfile.load(path)


def test_a_measured_profile_replaces_the_save_and_restore_of_the_tier_it_measured(
    capsys, tmp_path, toml
):
    from simulator.model.tier_plan import closed_form_plan, first_order_plan
    from simulator.model.tiers import with_measured_tier

    profile = _measured_profile(tmp_path / "profile.json")
    job = ["optimize", "--scenario", str(toml), "--profile", str(tmp_path / "profile.json"),
           "--params", "70e9"]  # fmt: skip
    code, out, err = run(capsys, *job, "--format", "torch", "--json")
    assert code == 0, err
    got = json.loads(out)
    scenario = load_scenario(str(toml))
    cost = profile.predict(params=70e9, nodes=scenario.nodes, format="torch")
    assert got["measured_cost"]["tier"] == "persistent"  # the one tier surviving every class
    assert got["measured_cost"]["stall_s"] == pytest.approx(cost.stall_s)
    measured = with_measured_tier(scenario, "persistent", cost)
    tier = next(t for t in measured.tiers if t.name == "persistent")
    assert tier.checkpoint_s == pytest.approx(cost.write_s) and not tier.asynchronous
    assert tier.restore_s == pytest.approx(cost.restore_s)
    # The plan is the closed form of the measured tier, not of the table's 60 s save.
    plan = first_order_plan(measured)["tier_intervals_s"]
    assert got["tier_intervals_s"] == pytest.approx(plan)
    assert got["tier_intervals_s"] != pytest.approx(first_order_plan(scenario)["tier_intervals_s"])
    # An asynchronous format makes the tier asynchronous: it stalls for the staging copy only.
    code, out, _ = run(capsys, *job, "--format", "ckptsim-async", "--json")
    assert code == 0
    fast = profile.predict(params=70e9, nodes=scenario.nodes, format="ckptsim-async")
    assert fast.stall_s < fast.write_s
    measured = with_measured_tier(scenario, "persistent", fast)
    tier = next(t for t in measured.tiers if t.name == "persistent")
    assert tier.asynchronous and tier.staging_s == pytest.approx(fast.stall_s)
    assert tier.checkpoint_s == pytest.approx(fast.write_s)
    got = json.loads(out)
    assert got["measured_cost"]["stall_s"] == pytest.approx(fast.stall_s)
    # The memory tier is never saved (inf: null): persistent serves every class, so the
    # answer is its exact single-tier optimum, the closed form.
    plan = closed_form_plan(measured)["tier_intervals_s"]
    assert got["tier_intervals_s"] == {k: None if math.isinf(v) else pytest.approx(v)
                                       for k, v in plan.items()}  # fmt: skip
    # The human table says which tier was measured and what replaced the table's numbers.
    code, out, _ = run(capsys, *job, "--format", "torch")
    assert code == 0 and "measured cost of persistent (torch in" in out


@pytest.mark.parametrize(
    ("extra", "fragment"),
    [
        (["--profile-tier", "nosuch"], "no tier named 'nosuch'"),
        (["--profile-tier", "memory", "--params", "70e9"], None),  # any scheduled tier may be
        (["--params", "70e9", "--checkpoint-s", "5"], "does not reach the scenario's [[tier]]"),
    ],
)
def test_the_profiled_tier_is_named_or_found_and_bad_names_are_one_line(
    capsys, tmp_path, toml, extra, fragment
):
    _measured_profile(tmp_path / "p.json")
    args = ["optimize", "--scenario", str(toml), "--profile", str(tmp_path / "p.json"),
            "--format", "torch", "--json", *extra]  # fmt: skip
    if "--params" not in extra:
        args += ["--params", "70e9"]
    code, out, err = run(capsys, *args)
    if fragment is None:
        assert code == 0 and json.loads(out)["measured_cost"]["tier"] == "memory"
    else:
        assert code == 2 and out == "" and fragment in err and len(err.strip().splitlines()) == 1


def test_profile_tier_without_a_profile_is_refused(capsys, toml):
    code, _, err = run(capsys, "optimize", "--scenario", str(toml), "--profile-tier", "memory")
    assert code == 2 and "--profile-tier needs --profile FILE" in err


def test_profile_advice_is_actionable_with_tiers_and_said_once(capsys, tmp_path, toml):
    # The profile's warnings ask for --storage-bytes-per-s; with [[tier]] tables that flag
    # was refused ("does not reach the tiers"). Beside --profile it is the profiled tier's cap.
    _measured_profile(tmp_path / "p.json")
    job = ["optimize", "--scenario", str(toml), "--profile", str(tmp_path / "p.json"),
           "--params", "70e9", "--format", "torch", "--json"]  # fmt: skip
    code, out, err = run(capsys, *job)
    assert code == 0 and "no storage cap given" in err and "give --storage-bytes-per-s" in err
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == len(set(lines))  # each said once
    uncapped = json.loads(out)["measured_cost"]
    code, out, err = run(capsys, *job, "--storage-bytes-per-s", "1e8")
    assert code == 0, err
    capped = json.loads(out)["measured_cost"]
    assert "no storage cap given" not in err and "give --storage-bytes-per-s" not in err
    assert capped["write_s"] > uncapped["write_s"] and capped["aggregate_bytes_per_s"] <= 1e8
    lines = [line for line in err.splitlines() if line.startswith("warning:")]
    assert len(lines) == len(set(lines))
    # Without --profile the flag still does not reach the tiers: refused, not ignored.
    code, _, err = run(capsys, "optimize", "--scenario", str(toml), "--storage-bytes-per-s", "1e8")
    assert code == 2 and "does not reach the scenario's [[tier]] tables" in err


def test_simulate_says_which_intervals_ran_and_takes_inf_as_no_saves_on_a_schedule(
    capsys, toml, tmp_path
):
    argv = ["simulate", "--scenario", str(toml), "--replicas", "2", "--workers", "1"]
    code, out, err = run(capsys, *argv, "--tier-interval-s", "memory=600", "--json")
    assert code == 0, err
    got = json.loads(out)
    plan = closed_form_plan(load_scenario(toml))["tier_intervals_s"]
    assert got["tier_intervals_s"] == {"memory": 600.0, "persistent": plan["persistent"]}
    assert got["tier_intervals_from"] == {"memory": "--tier-interval-s",
                                          "persistent": "closed form"}  # fmt: skip
    code, out, err = run(capsys, *argv, "--tier-interval-s", "memory=inf")
    assert code == 0, err
    head = out.splitlines()[0]
    assert "policy tiers [memory never (--tier-interval-s); persistent every" in head
    assert "memory=inf: memory is never saved" in err
    code, out, err = run(capsys, *argv, "--tier-interval-s", "memory=inf", "--json")
    got = json.loads(out)
    assert got["tier_intervals_s"]["memory"] is None and got["saves_memory_mean"] == 0
    # A single-tier policy over failure classes says it ran that policy, not "tiers".
    code, out, err = run(capsys, "simulate", "--scenario", str(_classes_only(tmp_path)),
                         "--replicas", "2", "--workers", "1", "--policy", "young")  # fmt: skip
    assert code == 0, err
    assert "policy young [persistent every" in out.splitlines()[0]
    assert "(--policy young)]" in out.splitlines()[0]


@pytest.mark.parametrize("flag", [["--gpu-mtbf-h", "5000"], ["--mtbf-h", "5"]])
def test_a_rate_flag_over_failure_classes_says_it_does_not_reach_them(capsys, toml, flag):
    code, out, err = run(capsys, "optimize", "--scenario", str(toml), *flag)
    assert code == 2 and out == "" and len(err.strip().splitlines()) == 1
    assert f"{flag[0]} does not reach the scenario's [[failure_class]] tables" in err
    assert "own failure rate" in err and "drop the scenario's" not in err
