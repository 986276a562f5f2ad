"""Scenarios: validation messages, TOML files, the shipped presets, and flag overrides."""

import dataclasses
from pathlib import Path

import pytest

from simulator.errors import InputError
from simulator.model.scenario import DEFAULT_PRESET, Scenario, load_scenario, preset_names

HOUR = 3600.0
ROOT = Path(__file__).resolve().parents[1]


def write(tmp_path, text, name="job.toml"):
    path = tmp_path / name
    path.write_text(text, encoding="utf-8")
    return path


# -- presets: the system MTBF each implies must match the failure counts in its source ------
@pytest.mark.parametrize(
    ("preset", "gpus", "system_mtbf_h"),
    [
        # Llama 3 paper §3.3.4: 419 unexpected interruptions in 54 days on 16,384 GPUs.
        ("llama3", 16384, 54 * 24 / 419),
        # OPT-175B: 992 A100s (arXiv:2205.01068 §2.4), ~2 machines down a day (its chronicles).
        ("opt175b", 992, 24 / 2),
        # BLOOM-176B: 1-2 GPU failures a week (1.5/week) on 384 A100s.
        ("bloom176b", 384, 7 * 24 / 1.5),
    ],
)
def test_presets_reproduce_the_failure_rates_of_their_sources(preset, gpus, system_mtbf_h):
    scenario = load_scenario(preset)
    assert scenario.gpus == gpus
    assert scenario.system_mtbf_s / HOUR == pytest.approx(system_mtbf_h, rel=1e-3)
    assert scenario.failure == "exponential"


def test_every_shipped_preset_loads_with_a_failure_rate():
    names = preset_names()
    assert {"llama3", "opt175b", "bloom176b"} <= set(names)
    for name in names:
        scenario = load_scenario(name)
        assert scenario.has_mtbf
        assert scenario.system_mtbf_s > 0
        assert scenario.system_lifetime().mean_s == pytest.approx(scenario.system_mtbf_s)


def test_no_name_loads_the_default_preset():
    assert DEFAULT_PRESET == "llama3"
    assert load_scenario() == load_scenario("llama3")


# -- TOML files -----------------------------------------------------------------------------
def test_a_toml_file_reads_into_the_same_fields_and_takes_its_name_from_the_file(tmp_path):
    path = write(tmp_path, "gpus = 64\nmtbf_h = 5.0\ncheckpoint_s = 30\nwork_h = 100.0\n")
    scenario = load_scenario(str(path))
    assert scenario.name == "job"
    assert (scenario.gpus, scenario.mtbf_h, scenario.checkpoint_s, scenario.work_h) == (
        64,
        5.0,
        30,
        100.0,
    )
    assert scenario.system_mtbf_s == 5 * HOUR
    assert scenario.restart_s == Scenario().restart_s  # unset fields keep their defaults


def test_round_trip_through_to_dict_gives_an_equal_scenario():
    scenario = load_scenario("opt175b")
    assert Scenario.from_mapping(scenario.to_dict()) == scenario


@pytest.mark.parametrize(
    ("text", "needle"),
    [
        ("gpus = [1, 2\n", "malformed TOML"),
        ("gpus = 64\nmtbf = 5.0\n", "unknown field 'mtbf'"),
        ('checkpoint_s = "fast"\n', "checkpoint_s must be a number of seconds"),
        ("checkpoint_s = 0\n", "checkpoint_s must be a positive number of seconds"),
        ("restart_s = -1\n", "restart_s must be a non-negative number of seconds"),
        ("mtbf_h = inf\n", "mtbf_h must be a positive number of hours"),
        ("gpus = 64.0\n", "gpus must be a whole number"),
        ("gpus = true\n", "gpus must be a whole number"),
        ("gpu_mtbf_h = 1000.0\n", "gpu_mtbf_h (per-GPU MTBF) needs gpus"),
        ("gpus = 8\nmtbf_h = 1.0\ngpu_mtbf_h = 8.0\n", "either mtbf_h"),
        ('failure = "gamma"\n', "unknown failure distribution 'gamma'"),
        ('failure = "weibull"\n', "needs shape=VALUE"),
        ("gpus = 4\ngpus_per_node = 8\n", "gpus_per_node (8) exceeds gpus (4)"),
        ("usd_per_gpu_hour = -2.0\n", "usd_per_gpu_hour must be a non-negative number of US"),
    ],
)
def test_bad_toml_is_one_line_naming_the_file_and_the_field(tmp_path, text, needle):
    path = write(tmp_path, text)
    with pytest.raises(InputError) as info:
        load_scenario(str(path))
    message = str(info.value)
    assert needle in message
    assert "\n" not in message
    assert str(path) in message


def test_a_missing_file_that_is_no_preset_lists_the_presets():
    with pytest.raises(InputError, match=r"neither a file nor a preset.*llama3"):
        load_scenario("no-such-scenario.toml")


def test_a_file_that_is_not_utf8_is_one_line_not_a_traceback(tmp_path):
    path = tmp_path / "latin1.toml"
    path.write_bytes(b'name = "caf\xe9"\n')
    with pytest.raises(InputError, match=r"latin1\.toml"):
        load_scenario(str(path))


def test_a_file_an_editor_saved_with_a_byte_order_mark_is_read(tmp_path):
    path = tmp_path / "bom.toml"
    path.write_bytes(b"\xef\xbb\xbfgpus = 64\nmtbf_h = 50000\nwork_h = 10\n")
    assert load_scenario(str(path)).gpus == 64


# -- overrides (command-line flags over a file) ---------------------------------------------
def test_flags_override_file_values_and_none_means_keep():
    base = load_scenario("llama3")
    changed = base.with_overrides(checkpoint_s=30.0, restart_s=None, gpus=8192)
    assert changed.checkpoint_s == 30.0
    assert changed.restart_s == base.restart_s
    # Per-GPU MTBF stays, so halving the cluster doubles the system MTBF.
    assert changed.system_mtbf_s == pytest.approx(2 * base.system_mtbf_s)


def test_a_system_mtbf_flag_replaces_a_files_per_gpu_mtbf_and_back():
    base = load_scenario("llama3")
    system = base.with_overrides(mtbf_h=2.0)
    assert system.gpu_mtbf_h is None and system.system_mtbf_s == 2 * HOUR
    per_gpu = system.with_overrides(gpu_mtbf_h=16384 * 4.0)
    assert per_gpu.mtbf_h is None and per_gpu.system_mtbf_s == pytest.approx(4 * HOUR)


def test_an_override_is_validated_like_a_file_value():
    with pytest.raises(InputError, match="checkpoint_s must be a positive number of seconds"):
        load_scenario("llama3").with_overrides(checkpoint_s=-5.0)


def test_scenarios_are_frozen_and_a_missing_failure_rate_is_named():
    scenario = Scenario(gpus=8)
    with pytest.raises(dataclasses.FrozenInstanceError):
        scenario.gpus = 16
    assert not scenario.has_mtbf
    with pytest.raises(InputError, match="no failure rate"):
        _ = scenario.system_mtbf_s


# -- the job's failure rate: GPUs and nodes ------------------------------------------------
NODE_JOB = dict(
    gpus=2048, gpus_per_node=16, gpu_mtbf_h=100_000.0, node_mtbf_h=10_000.0, work_h=500.0
)


def test_the_jobs_mtbf_superposes_gpu_and_node_failures():
    scenario = Scenario(**NODE_JOB)
    # Independent exponential parts superpose into one Poisson process whose rate is the sum:
    # 2,048 GPUs at 100,000 h and 128 sixteen-GPU nodes at 10,000 h.
    rate_per_h = 2048 / 100_000 + 128 / 10_000
    assert scenario.system_mtbf_s / HOUR == pytest.approx(1 / rate_per_h, rel=1e-12)
    assert scenario.system_mtbf_s / HOUR == pytest.approx(30.05, abs=0.01)  # not 48.8 h
    assert scenario.system_lifetime().mean_s == pytest.approx(scenario.system_mtbf_s)
    # The per-GPU lifetime is the GPUs' own, not the job's MTBF spread over the GPUs.
    assert scenario.gpu_lifetime().mean_s == pytest.approx(100_000 * HOUR)


def test_the_jobs_mtbf_is_the_mean_gap_of_the_failures_the_des_draws():
    import numpy as np

    from simulator.engines.des import failure_source_for

    scenario = Scenario(**NODE_JOB)
    horizon = 20_000 * HOUR
    rng = np.random.default_rng(7)
    source = failure_source_for(scenario, rng, np.random.default_rng(8))
    count = 0
    while source.next_failure_s() <= horizon:
        count += 1
    expected = horizon / scenario.system_mtbf_s  # ~666 failures; Poisson sd ~26
    assert abs(count - expected) < 4 * expected**0.5


def test_a_whole_job_mtbf_and_a_node_mtbf_are_not_both_given():
    with pytest.raises(InputError, match="mtbf_h is the whole job's MTBF"):
        Scenario(gpus=64, mtbf_h=5.0, node_mtbf_h=1000.0)
    # A whole-job MTBF laid over a file replaces its per-part rates, nodes included.
    overridden = Scenario(**NODE_JOB).with_overrides(mtbf_h=5.0)
    assert overridden.node_mtbf_h is None and overridden.system_mtbf_s == 5 * HOUR


def test_the_titan_record_preset_has_the_whole_records_failure_rate():
    # One rule for a job's interruptions: the one the Titan replay counts them by
    # (titan.failure_events: a slot's events within 24 h are one), not every logged row.
    from importlib import resources

    from simulator.fitting import titan

    events = titan.failure_events()
    scenario = load_scenario("titan-record")
    assert scenario.gpus == titan.N_SLOTS and scenario.failure == "exponential"
    whole_record_h = titan.span_s() / HOUR / len(events)
    assert scenario.system_mtbf_s / HOUR == pytest.approx(whole_record_h, rel=1e-4)
    assert 8.6 < whole_record_h < 8.7  # vs the fitted Weibull's 3.0 h (the 2016 wave)
    assert load_scenario("titan").system_mtbf_s / HOUR == pytest.approx(3.01, abs=0.01)
    header = (resources.files("simulator") / "presets" / "titan-record.toml").read_text()
    raw = len(titan.failure_events(0.0))
    assert f"{len(events):,}\n#   interruptions" in header and f"logs {raw:,} DBE/OTB" in header
    report = (ROOT / "reports" / "titan-fit.md").read_text()
    assert f"{len(events):,} interruptions in" in report
    assert f"{whole_record_h:.2f} h: the preset `titan-record`" in report


def test_a_node_mtbf_without_gpus_is_one_line_even_beside_a_system_mtbf():
    # The job's-MTBF range check used to run first and divide by the missing node count.
    with pytest.raises(InputError, match=r"node_mtbf_h .* needs gpus"):
        Scenario(mtbf_h=3.0, node_mtbf_h=1.0)
