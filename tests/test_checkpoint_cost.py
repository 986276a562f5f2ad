"""The checkpoint cost model: the fit, the profile file, and the extrapolation to big jobs."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from simulator.errors import InputError
from simulator.model.checkpoint_cost import BYTES_PER_PARAM, CostProfile, fit_linear

REPO = Path(__file__).resolve().parents[1]


@settings(max_examples=50, deadline=None)
@given(
    latency_s=st.floats(0.0, 10.0),
    gb_per_s=st.floats(0.01, 100.0),
    sizes=st.lists(st.floats(1e6, 1e12), min_size=2, max_size=8, unique=True),
)
def test_fit_recovers_an_exact_line(latency_s, gb_per_s, sizes):
    bw = gb_per_s * 1e9
    x = np.array(sizes)
    if np.ptp(x) < 1e-3 * x.max():
        return  # nearly identical sizes carry no slope information
    fit = fit_linear(x, latency_s + x / bw)
    assert fit.bytes_per_s == pytest.approx(bw, rel=1e-6)
    assert fit.latency_s == pytest.approx(latency_s, abs=1e-6 * (1 + x.max() / bw))
    assert max(abs(r) for r in fit.residuals_s) <= 1e-6 * (1 + x.max() / bw)


def test_noisy_fit_is_numpy_polyfit_on_relative_residuals_and_keeps_residuals():
    rng = np.random.default_rng(3)
    x = np.repeat([1e8, 5e8, 2e9, 8e9], 3)
    y = (0.4 + x / 2.5e8) * rng.lognormal(0, 0.05, x.size)
    fit = fit_linear(x, y)
    slope, intercept = np.polyfit(x, y, 1, w=1 / y)  # polyfit weights the unsquared residual
    assert intercept > 0  # so the bound is inactive and both solve the same problem
    assert fit.bytes_per_s == pytest.approx(1 / slope, rel=1e-6)
    assert fit.latency_s == pytest.approx(intercept, rel=1e-6)
    assert len(fit.residuals_s) == x.size
    assert np.allclose(fit.residuals_s, y - (intercept + slope * x), atol=1e-6)
    assert 0.9 < fit.r2 <= 1


def test_fit_never_returns_a_negative_latency_where_least_squares_would():
    x = np.array([1e8, 1e8, 5e8, 5e8, 1e9, 1e9])
    y = np.array([0.2, 0.25, 1.9, 2.1, 4.1, 3.9])  # an ordinary line crosses zero below 0 s
    assert np.polyfit(x, y, 1)[1] < 0
    fit = fit_linear(x, y)
    assert fit.latency_s >= 0 and fit.bytes_per_s > 0
    assert fit.seconds(1e8) == pytest.approx(0.225, rel=0.3)  # clamped OLS: 0.42 s


def test_fit_of_the_stored_benchmark_predicts_the_restores_it_measured():
    # The report's own measurements: an unconstrained fit gave ckptsim a -3.5 s load latency
    # and, clamped, a 10.3 s restore at 100M parameters where 2.6-2.8 s were measured.
    data = json.loads((REPO / "reports" / "bench-cpu-2core.json").read_text())
    profile = CostProfile.from_samples(data["samples"], data["machine"])
    for f in profile.fits.values():
        for line in (f.save, f.load, f.stall):
            assert line is None or line.latency_s >= 0
    rows = [s for s in data["samples"] if s["format"] == "ckptsim" and s["size"] == "100M"]
    measured = [r["load_s"] for r in rows]
    predicted = profile.fits["ckptsim"].load.seconds(rows[0]["bytes"])
    assert min(measured) * 0.8 <= predicted <= max(measured) * 1.2


def test_fit_refuses_a_single_size():
    with pytest.raises(InputError, match="two or more distinct sizes"):
        fit_linear([1e9, 1e9], [1.0, 1.1])


def _profile(save_bw=2e8, load_bw=4e8, stall_bw=4e9, latency=0.5) -> CostProfile:
    samples = []
    for params in (1e7, 1e8, 1e9):
        nbytes = params * 12
        samples.append(
            {
                "format": "ckptsim-async",
                "dtype": "fp32",
                "params": params,
                "tensor_bytes": nbytes,
                "bytes": nbytes,
                "save_s": latency + nbytes / save_bw,
                "load_s": latency + nbytes / load_bw,
                "stall_s": 0.01 + nbytes / stall_bw,
            }
        )
        samples.append(samples[-1] | {"format": "torch", "stall_s": None})
    return CostProfile.from_samples(samples, {"cpu_count": 2})


def test_single_node_prediction_is_latency_plus_bytes_over_bandwidth():
    cost = _profile().predict(params=7e9, format="torch", dtype="bf16")
    total = 7e9 * BYTES_PER_PARAM["bf16"]
    assert cost.bytes == pytest.approx(total)
    assert cost.write_s == pytest.approx(0.5 + total / 2e8)
    assert cost.restore_s == pytest.approx(0.5 + total / 4e8)
    assert cost.stall_s == cost.write_s  # a synchronous format stalls for the whole write


def test_async_stall_is_the_staging_copy_and_is_not_storage_capped():
    profile = _profile()
    cost = profile.predict(params=7e9, nodes=8, format="ckptsim-async", dtype="fp32")
    shard = 7e9 * 12 / 8
    assert cost.stall_s == pytest.approx(0.01 + shard / 4e9)
    capped = profile.predict(
        params=7e9, nodes=8, format="ckptsim-async", dtype="fp32", aggregate_bytes_per_s=1e8
    )
    assert capped.stall_s == pytest.approx(cost.stall_s)
    assert capped.write_s > cost.write_s


@settings(max_examples=60, deadline=None)
@given(
    params=st.floats(1e8, 1e12),
    nodes=st.integers(1, 20000),
    cap_gb_per_s=st.one_of(st.none(), st.floats(0.1, 1e4)),
)
def test_sharded_write_never_beats_either_bandwidth_limit(params, nodes, cap_gb_per_s):
    cap = None if cap_gb_per_s is None else cap_gb_per_s * 1e9
    cost = _profile().predict(
        params=params, nodes=nodes, format="torch", dtype="bf16", aggregate_bytes_per_s=cap
    )
    shard = cost.bytes / nodes
    assert cost.write_s >= shard / 2e8 * (1 - 1e-12)  # one writer's bandwidth
    if cap is not None:
        assert cost.write_s >= cost.bytes / cap * (1 - 1e-12)  # all writers share the cap
    more = _profile().predict(
        params=params * 2, nodes=nodes, format="torch", dtype="bf16", aggregate_bytes_per_s=cap
    )
    assert more.write_s > cost.write_s


def test_profile_round_trips_through_json(tmp_path):
    profile = _profile()
    path = tmp_path / "p.json"
    profile.save(path)
    again = CostProfile.load(path)
    assert again.fits == profile.fits
    assert again.samples == json.loads(path.read_text())["samples"]
    kw = dict(params=70e9, nodes=1024, format="ckptsim-async", aggregate_bytes_per_s=5e10)
    assert again.predict(**kw) == profile.predict(**kw)


def test_bad_profile_and_bad_requests_are_one_line_input_errors(tmp_path):
    (tmp_path / "x.json").write_text("{not json")
    with pytest.raises(InputError, match="not JSON"):
        CostProfile.load(tmp_path / "x.json")
    with pytest.raises(InputError, match="cannot read"):
        CostProfile.load(tmp_path / "missing.json")
    profile = _profile()
    with pytest.raises(InputError, match="has no fit in this profile"):
        profile.predict(params=1e9, format="dcp")
    with pytest.raises(InputError, match="nodes"):
        profile.predict(params=1e9, nodes=0, format="torch")
    with pytest.raises(InputError, match="params"):
        profile.predict(params=-1, format="torch")


def test_costmodel_does_not_import_torch():
    code = "import sys, simulator.model.checkpoint_cost; sys.exit('torch' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code]).returncode == 0


def test_a_format_whose_times_do_not_grow_with_size_is_left_unfitted():
    rows = [
        {"format": f, "params": n, "tensor_bytes": b, "bytes": b, "save_s": t, "load_s": t}
        for f, n, b, t in [
            ("noisy", 1, 1e6, 0.5),
            ("noisy", 2, 2e6, 0.4),
            ("fine", 1, 1e6, 0.1),
            ("fine", 2, 2e6, 0.2),
        ]
    ]
    profile = CostProfile.from_samples(rows, {})
    assert set(profile.fits) == {"fine"}
    with pytest.raises(InputError, match="has no fit in this profile"):
        profile.predict(params=1e9, format="noisy")


def _writers_profile(sigma: float = 0.3, kappa: float = 0.01, stalled: int = 0) -> CostProfile:
    rng = np.random.default_rng(7)
    samples = [s for s in _profile().samples]
    lam = 2e8
    for n in (1, 2, 4, 8):
        for i in range(3 + stalled):
            agg = lam * n / (1 + sigma * (n - 1) + kappa * n * (n - 1)) * rng.lognormal(0, 0.03)
            agg /= 10 if i < stalled else 1  # a repeat the machine stalled
            samples.append(
                dict(bench="writers", format="torch", writers=n, shard_bytes=5e7, bytes=5e7 * n)
                | dict(aggregate_bytes_per_s=agg, save_s=5e7 * n / agg)
            )
    return CostProfile.from_samples(samples, {"cpu_count": 2})


def test_contention_curve_recovers_its_parameters_non_negative_with_residuals():
    curve = _writers_profile().contention["torch"]
    assert curve.single_bytes_per_s == pytest.approx(2e8, rel=0.1)
    assert curve.contention == pytest.approx(0.3, abs=0.1)
    assert curve.coherency >= 0 and curve.contention >= 0
    assert len(curve.residuals) == 12 and max(map(abs, curve.residuals)) < 0.15
    # Not a hard min(): 8 writers get less than 8x one, yet more than one writer's bandwidth.
    assert 2e8 < curve.aggregate_bytes_per_s(8) < 8 * 2e8


def test_a_stalled_repeat_at_every_count_does_not_drag_the_curve_down():
    # As in the committed scale run: five repeats a count, one of them stalled to a tenth.
    clean = _writers_profile().contention["torch"]
    curve = _writers_profile(stalled=1).contention["torch"]
    for n in (1, 2, 4, 8):
        assert curve.aggregate_bytes_per_s(n) == pytest.approx(
            clean.aggregate_bytes_per_s(n), rel=0.1
        ), n
    # The stalled repeats stay visible in the residuals.
    assert sorted(curve.residuals)[:4] == pytest.approx([-0.9] * 4, abs=0.05)


def test_a_flat_curve_fits_zero_coherency_rather_than_a_negative_one():
    curve = _writers_profile(sigma=0.0, kappa=0.0).contention["torch"]
    assert curve.coherency >= 0 and curve.contention >= 0
    assert curve.aggregate_bytes_per_s(8) == pytest.approx(8 * 2e8, rel=0.1)


def test_prediction_within_the_measured_writers_follows_the_curve_without_warning():
    profile = _writers_profile()
    cost = profile.predict(
        params=1e9, nodes=8, format="torch", dtype="fp32", aggregate_bytes_per_s=1e15
    )
    curve = profile.contention["torch"]
    assert cost.aggregate_bytes_per_s == pytest.approx(curve.aggregate_bytes_per_s(8))
    assert cost.write_s >= 1e9 * 12 / curve.aggregate_bytes_per_s(8)
    assert cost.warnings == ()


def test_far_past_the_measured_writers_warns_by_how_much_and_names_the_flag(tmp_path):
    profile = _writers_profile()
    cost = profile.predict(params=405e9, nodes=2048, format="torch", dtype="bf16")
    text = " ".join(cost.warnings)
    assert "256x the 8 measured" in text and "--storage-bytes-per-s" in text
    assert "Llama 3" in text  # the default cap and its source are named
    # 16,384 GPUs saving a 405B model: never under a second with nothing given.
    assert cost.write_s >= 405e9 * 14 / 2e12
    path = tmp_path / "p.json"
    profile.save(path)
    assert (
        CostProfile.load(path).predict(params=405e9, nodes=2048, format="torch", dtype="bf16")
        == cost
    )


def test_the_optimize_cli_prints_the_extrapolation_warning(tmp_path):
    path = tmp_path / "p.json"
    _writers_profile().save(path)
    out = subprocess.run(
        [
            sys.executable,
            "-m",
            "simulator",
            "optimize",
            "--profile",
            str(path),
            "--params",
            "405e9",
            "--format",
            "torch",
        ],
        capture_output=True,
        text=True,
        cwd=REPO,
        check=True,
    )
    assert "x the 8 measured" in out.stderr and "--storage-bytes-per-s" in out.stderr


def test_a_scenario_with_only_a_per_node_bandwidth_is_capped_by_the_published_default():
    from simulator.model.scenario import DEFAULT_STORAGE_BYTES_PER_S, Scenario

    s = Scenario(gpus=16384, checkpoint_bytes=405e9 * 14, write_bytes_per_s_per_node=5e9)
    assert s.checkpoint_write_s == pytest.approx(405e9 * 14 / DEFAULT_STORAGE_BYTES_PER_S)
    assert s.checkpoint_write_s > 1.0
