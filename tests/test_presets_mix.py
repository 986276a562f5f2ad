"""The llama3-mix and llama3-tiers presets: Llama 3's interruption table as failure classes."""

from __future__ import annotations

import dataclasses
import json
import math

import pytest

from simulator.cli import main
from simulator.model.scenario import load_scenario

HOUR = 3600.0
SNAPSHOT_S = 54 * 24 * HOUR  # Llama 3 (arXiv:2407.21783) §3.3.4: a 54-day snapshot

# Table 5 of the paper: the 419 unexpected interruptions by root cause, and the class each
# cause is grouped into in the presets (the grouping is the presets' own).
TABLE_5 = {
    "faulty GPU": (148, "gpu"),
    "GPU HBM3 memory": (72, "gpu"),
    "software bug": (54, "software"),
    "network switch/cable": (35, "network"),
    "host maintenance": (32, "host"),
    "GPU SRAM memory": (19, "gpu"),
    "GPU system processor": (17, "gpu"),
    "NIC": (7, "network"),
    "NCCL watchdog timeouts": (7, "hang"),
    "silent data corruption": (6, "sdc"),
    "GPU thermal interface + sensor": (6, "gpu"),
    "SSD": (3, "host"),
    "power supply": (3, "host"),
    "server chassis": (2, "host"),
    "IO expansion board": (2, "host"),
    "dependency": (2, "software"),
    "CPU": (2, "host"),
    "system memory": (2, "host"),
}
MIX = ("llama3-mix", "llama3-tiers")


def run_json(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out)


def class_counts(scenario) -> dict[str, float]:
    """Interruptions each class is expected to cause in the 54-day snapshot."""
    return {
        c.name: c.rate_per_s(scenario.gpus, scenario.nodes) * SNAPSHOT_S
        for c in scenario.failure_classes
    }


def test_the_table_sums_to_the_papers_419_interruptions():
    assert sum(n for n, _ in TABLE_5.values()) == 419


@pytest.mark.parametrize("preset", MIX)
def test_each_class_has_the_count_of_its_causes_and_all_sum_to_419_in_54_days(preset):
    scenario = load_scenario(preset)
    assert (scenario.gpus, scenario.nodes) == (16384, 2048)
    want: dict[str, int] = {}
    for n, group in TABLE_5.values():
        want[group] = want.get(group, 0) + n
    got = class_counts(scenario)
    assert set(got) == set(want)
    for name, n in want.items():
        assert got[name] == pytest.approx(n, abs=0.01), name  # MTBFs rounded to 0.1 h
    assert sum(got.values()) == pytest.approx(419, abs=0.05)
    # The same job rate as the single-class llama3 preset: one interruption every 3.09 h.
    assert scenario.system_mtbf_s == pytest.approx(load_scenario("llama3").system_mtbf_s, rel=1e-6)


def test_the_tiered_preset_is_the_mix_plus_a_memory_tier():
    mix, tiers = load_scenario("llama3-mix"), load_scenario("llama3-tiers")
    assert [t.name for t in mix.tiers] == ["persistent"]
    assert [t.name for t in tiers.tiers] == ["memory", "persistent"]
    assert tiers.tiers[1] == mix.tiers[0]
    assert tiers.failure_classes == mix.failure_classes
    assert dataclasses.replace(tiers, name=mix.name, tiers=mix.tiers) == mix
    memory = tiers.tiers[0]
    # Every class but silent data corruption leaves a copy in host or peer memory.
    assert memory.survives == {c.name for c in mix.failure_classes} - {"sdc"}
    # Hosts that survive lose no node; the others drain one.
    lost = {c.name: c.nodes_lost for c in mix.failure_classes}
    assert lost == {"gpu": 1, "sdc": 1, "software": 0, "hang": 0, "network": 1, "host": 1}


def test_optimize_saves_the_memory_tier_more_often_and_beats_the_single_tier(capsys):
    got = run_json(capsys, "optimize", "--scenario", "llama3-tiers", "--json")
    tau = got["tier_intervals_s"]
    assert set(tau) == {"memory", "persistent"}
    assert 0 < tau["memory"] < tau["persistent"] < math.inf
    # First order: each tier every sqrt(2 C / λ) for the failures it is the cheapest to serve.
    scenario = load_scenario("llama3-tiers")
    counts = class_counts(scenario)
    lam_persistent = counts["sdc"] / SNAPSHOT_S
    lam_memory = (sum(counts.values()) - counts["sdc"]) / SNAPSHOT_S
    assert tau["memory"] == pytest.approx(math.sqrt(2 * 2.0 / lam_memory))
    assert tau["persistent"] == pytest.approx(math.sqrt(2 * 60.0 / lam_persistent))
    assert got["optimal_waste_fraction"] < got["single_tier_waste_fraction"]
    assert got["usd_saved_per_day"] > 0
    # The single-tier answer beside it is the llama3-mix preset's own answer.
    single = run_json(capsys, "optimize", "--scenario", "llama3-mix", "--json")
    assert single["tier_intervals_s"] == {"persistent": got["single_tier_interval_s"]}
    assert single["optimal_waste_fraction"] == pytest.approx(got["single_tier_waste_fraction"])
    assert single["usd_lost_per_day"] == pytest.approx(got["single_tier_usd_lost_per_day"])
