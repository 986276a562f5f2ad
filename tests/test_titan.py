"""The Titan GPU trace (Ostrouchov et al., SC '20): derived tables, lifetimes, replay, preset."""

import numpy as np
import pandas as pd
import pytest

from simulator.errors import InputError
from simulator.fitting import titan
from simulator.fitting.fit import fit_lifetime
from simulator.model.failures import Weibull
from simulator.model.scenario import load_scenario


def test_lifetimes_are_positive_with_a_minority_of_failures():
    d, o = titan.gpu_lifetimes()
    assert d.shape == o.shape == (len(titan.gpu_table()),)
    assert o.dtype == bool and np.all(d > 0) and np.all(np.isfinite(d))
    # No GPU served longer than the trace (a few were installed up to 2 months before its
    # first full inventory, as the paper's data cleaning allows).
    assert d.max() <= titan.span_s() + 90 * 86400
    assert 0.05 < o.mean() < 0.5


def test_first_event_never_comes_after_the_gpus_total_service():
    table = titan.gpu_table()
    has = table["first_event_s"].notna()
    assert np.all(table.loc[has, "first_event_s"] <= table.loc[has, "service_s"])
    # A GPU the paper counts as dead (removed after an event) had an event.
    assert not np.any(table["removed_after_event"] & ~has)


def test_rules_and_batches_partition_the_gpus():
    _, o_first = titan.gpu_lifetimes()
    _, o_removal = titan.gpu_lifetimes(rule="removal")
    assert o_removal.sum() <= o_first.sum()
    d_old, o_old = titan.gpu_lifetimes(batch="old")
    d_new, o_new = titan.gpu_lifetimes(batch="new")
    assert d_old.size + d_new.size == o_first.size
    # The paper's finding: the old batch failed far more often than the new one.
    assert o_old.mean() > 5 * o_new.mean()
    with pytest.raises(InputError):
        titan.gpu_lifetimes(rule="nope")
    with pytest.raises(InputError):
        titan.gpu_lifetimes(batch="middle")


def test_failure_events_are_sorted_inside_the_trace_and_bursts_merge():
    events = titan.failure_events()
    raw = titan.failure_events(0.0)
    assert list(events.columns[:3]) == ["time_s", "slot", "location"]
    assert set(events["event"]) == {"DBE", "OTB"}
    for table in (events, raw):
        t = table["time_s"].to_numpy()
        assert np.all(np.diff(t) >= 0) and t[0] >= 0 and t[-1] <= titan.span_s()
    assert 0.8 * len(raw) < len(events) < len(raw)  # README: "roughly 6,400" logged events
    assert 6000 < len(raw) < 7000
    # After merging, no slot has two kept failures within the merge window.
    by_slot = events.sort_values(["slot", "time_s"])
    same_slot = np.diff(by_slot["slot"].to_numpy()) == 0
    gaps = np.diff(by_slot["time_s"].to_numpy())[same_slot]
    assert gaps.size > 0 and np.all(gaps > titan.BURST_MERGE_S)
    assert events["slot"].between(0, titan.N_SLOTS - 1).all()


def test_loading_is_cached():
    assert titan.gpu_table() is titan.gpu_table()
    assert titan.failure_events() is titan.failure_events()


def test_subset_replay_is_reproducible_and_proportional_to_job_size():
    total = len(titan.failure_events())
    everything = titan.failure_times_for_subset(titan.N_SLOTS, np.random.default_rng(0))
    np.testing.assert_array_equal(everything, titan.failure_events()["time_s"].to_numpy())
    a = titan.failure_times_for_subset(2048, np.random.default_rng(5))
    b = titan.failure_times_for_subset(2048, np.random.default_rng(5))
    np.testing.assert_array_equal(a, b)
    assert np.all(np.diff(a) >= 0)
    rng = np.random.default_rng(6)
    counts = [titan.failure_times_for_subset(2048, rng).size for _ in range(60)]
    expected = total * 2048 / titan.N_SLOTS
    assert np.mean(counts) == pytest.approx(expected, rel=0.1)


@pytest.mark.parametrize("n", [0, -1, titan.N_SLOTS + 1, 2.5, True])
def test_subset_replay_rejects_a_bad_gpu_count(n):
    with pytest.raises(InputError):
        titan.failure_times_for_subset(n, np.random.default_rng(0))


def test_titan_preset_carries_the_weibull_fitted_to_the_trace():
    scenario = load_scenario("titan")
    assert scenario.gpus == titan.N_SLOTS and scenario.gpus_per_node == 1
    fitted = fit_lifetime(*titan.gpu_lifetimes(), "weibull")
    life = scenario.gpu_lifetime()
    assert isinstance(life, Weibull)
    assert life.shape == pytest.approx(fitted.params["shape"], abs=1e-3)
    assert scenario.gpu_mtbf_h * 3600 == pytest.approx(fitted.mean_s, rel=1e-3)


@pytest.mark.skipif(not titan.SOURCE_CSV.exists(), reason="shared Titan trace not present")
def test_derived_tables_regenerate_byte_for_byte_from_the_published_csv(tmp_path):
    counts = titan.build_tables(titan.SOURCE_CSV, tmp_path)
    data_dir = titan.Path(titan.__file__).parents[1] / "data"
    for name in (titan.GPU_FILE, titan.EVENT_FILE):
        assert (tmp_path / name).read_bytes() == (data_dir / name).read_bytes(), name
    source = pd.read_csv(titan.SOURCE_CSV, dtype=str)
    assert counts["gpus"] == source["SN"].nunique()
    assert counts["events"] == source["event"].notna().sum()
