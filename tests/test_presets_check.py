"""experiments.presets_check: the presets agree with the numbers their sources publish."""

from __future__ import annotations

import math

import pytest

from experiments import presets_check
from experiments._calibrate import largest_within, lost_since_save_s, optimum
from simulator.model.scenario import load_scenario


@pytest.mark.parametrize(
    ("preset", "facts"),
    [("opt175b", presets_check.opt_facts), ("bloom176b", presets_check.bloom_facts)],
)
def test_every_published_number_of_a_preset_matches_and_the_rest_are_assumptions(preset, facts):
    rows = facts(load_scenario(preset))
    checks = {row[""]: row["check"] for row in rows}
    assert all(c.startswith(("matches", "in range")) or c == "assumption" for c in checks.values())
    assert "differs" not in " ".join(checks.values())
    for row in rows:  # an assumption is one no source gives
        assert (row["check"] == "assumption") == row["published"].startswith("not found")


def test_the_largest_restart_cost_is_the_one_whose_optimum_wastes_the_bound():
    s = load_scenario("opt175b")
    r = largest_within(s, "restart_s", 0.30, checkpoint_s=300.0)
    waste = optimum(s, checkpoint_s=300.0, restart_s=r)["optimal_waste_fraction"]
    assert waste == pytest.approx(0.30, abs=1e-6)
    # A bound under what even a free restart wastes allows none.
    assert largest_within(s, "restart_s", 0.01, checkpoint_s=300.0) is None


def test_lost_work_per_failure_is_half_a_short_segment_and_less_than_a_long_one():
    mtbf = 100.0 * 3600
    assert lost_since_save_s(60.0, mtbf) == pytest.approx(30.0, rel=1e-3)
    assert lost_since_save_s(1e-6, mtbf) == pytest.approx(5e-7)
    long = lost_since_save_s(10 * mtbf, mtbf)
    assert long < mtbf and math.isclose(long, mtbf, rel_tol=1e-3)
