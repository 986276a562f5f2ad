"""experiments.gpu_staging: its size arithmetic, its arguments, and its one line without CUDA.

The copies themselves need a GPU; here the plan of what a machine can hold, the parsing, the
table and the bench report's inclusion of a results file are checked, and a run on a machine
without CUDA says so in one line and exits 0.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from experiments import gpu_staging
from experiments.gpu_staging import METHODS, STATES, Plan, parse_args, parse_size, plan, rows_for
from simulator.model.checkpoint_cost import BYTES_PER_PARAM

REPO = Path(__file__).resolve().parents[1]
GB = 10**9


def test_each_state_carries_the_cost_models_bytes_a_parameter():
    for name, parts in STATES.items():
        assert sum(width for _, _, width in parts) == BYTES_PER_PARAM[name]


def test_a_state_that_fits_is_measured_whole_in_shards_no_larger_than_asked():
    p = plan(10**9, gpu_free_bytes=80 * GB, host_free_bytes=120 * GB, shard_bytes=256 << 20)
    assert (p.measured_params, p.limit, p.fraction) == (10**9, "none", 1.0)
    assert p.bytes == p.measured_bytes == 14 * 10**9
    shards = p.shards()
    width = {"bfloat16": 2, "float32": 4}
    assert sum(n * width[d] for _, d, n in shards) == p.bytes
    assert max(n * width[d] for _, d, n in shards) <= 256 << 20
    for part, dtype, _ in STATES["bf16"]:  # every part holds one value per parameter
        assert sum(n for name, d, n in shards if name.startswith(part + ".")) == 10**9
        assert all(d == dtype for name, d, _ in shards if name.startswith(part + "."))
    assert len({name for name, _, _ in shards}) == len(shards)


def test_7b_on_an_80_gb_gpu_measures_the_slice_that_fits_and_says_what_capped_it():
    # 7B x 14 B = 98 GB: more than an H100 holds. The GPU caps it here...
    p = plan(7 * 10**9, gpu_free_bytes=79 * GB, host_free_bytes=1000 * GB, gpu_fraction=0.9)
    assert p.limit == "gpu" and p.measured_params == int(0.9 * 79 * GB) // 14
    assert p.measured_bytes <= 0.9 * 79 * GB < p.bytes
    # ... and the host, when one set of buffers would not fit half its available memory.
    p = plan(7 * 10**9, gpu_free_bytes=140 * GB, host_free_bytes=120 * GB, host_fraction=0.5)
    assert p.limit == "host"
    assert p.measured_bytes + 4 * (256 << 20) <= 60 * GB
    assert 0 < p.fraction < 1


def test_no_memory_at_all_is_one_clear_error():
    with pytest.raises(ValueError, match="no memory for even one parameter"):
        plan(10**9, gpu_free_bytes=0, host_free_bytes=100 * GB)


@pytest.mark.parametrize(
    ("text", "params"),
    [
        ("1B", 10**9),
        ("7b", 7 * 10**9),
        ("350M", 350 * 10**6),
        ("1.3B", 1_300_000_000),
        ("7e9", 7 * 10**9),
        ("42", 42),
    ],
)
def test_sizes_parse_as_parameter_counts(text, params):
    assert parse_size(text) == params


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes", "7 GB"], "is not a parameter count"),
        (["--sizes", "inf"], "is not a parameter count"),
        (["--sizes", "0.5"], "less than one parameter"),
        (["--sizes", ","], "names no size"),
        (["--repeats", "0"], "--repeats must be at least 1"),
        (["--host-fraction", "1.5"], "--host-fraction must be in (0, 1]"),
        (["--shard-mib", "0"], "--shard-mib must be"),
    ],
)
def test_bad_arguments_are_one_line_errors(argv, message, capsys):
    with pytest.raises(SystemExit) as exit_:
        parse_args(argv)
    assert exit_.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert message in err[-1] and "Traceback" not in "".join(err)


def test_defaults_are_1b_and_7b_of_bf16_state():
    args = parse_args([])
    assert args.size_list == [10**9, 7 * 10**9] and args.state == "bf16" and args.out is None


def test_without_cuda_it_says_so_in_one_line_and_exits_0(tmp_path):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has CUDA: the script would measure")
    out = tmp_path / "staging.json"
    done = subprocess.run(
        [sys.executable, "-m", "experiments.gpu_staging", "--out", str(out)],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    lines = done.stdout.strip().splitlines()
    assert len(lines) == 1 and "no CUDA device" in lines[0] and "nothing measured" in lines[0]
    assert not out.exists()


def _doc(p: Plan) -> dict:
    times = {m: [2.0, 1.0, 3.0] for m in METHODS}
    return {
        "machine": {"gpu": "Test GPU", "gpu_memory_bytes": 80 << 30, "torch": "x", "cuda": "y"}
        | {"date_utc": "2025-01-01 00:00:00"},
        "state": p.state,
        "bytes_per_param": p.bytes_per_param,
        "repeats": 3,
        "rows": rows_for(p, times),
    }


def test_rows_extrapolate_a_slice_to_the_whole_state_at_its_measured_bandwidth():
    p = plan(7 * 10**9, gpu_free_bytes=40 * GB, host_free_bytes=1000 * GB)
    rows = rows_for(p, {"pinned": [2.0, 1.0, 3.0]})
    (row,) = rows
    assert row["median_s"] == 2.0 and row["extrapolated"]
    assert row["bytes_per_s"] == pytest.approx(p.measured_bytes / 2.0)
    assert row["full_state_s"] == pytest.approx(2.0 * p.bytes / p.measured_bytes)


def test_the_bench_report_includes_the_staging_table_once_its_file_exists(tmp_path, monkeypatch):
    from experiments import bench_checkpoint

    monkeypatch.setattr(gpu_staging, "DEFAULT_JSON", tmp_path / "gpu-staging.json")
    before = bench_checkpoint._gpu_staging_lines()
    assert len(before) == 1 and "not run yet" in before[0]
    p = plan(7 * 10**9, gpu_free_bytes=40 * GB, host_free_bytes=1000 * GB)
    (tmp_path / "gpu-staging.json").write_text(json.dumps(_doc(p)))
    after = "\n".join(bench_checkpoint._gpu_staging_lines())
    assert "## GPU staging (device to host)" in after and "Test GPU" in after
    for method in METHODS:
        assert f"| 7B | {p.measured_bytes / 1e9:.1f} (98.0) | {method} | 2.000 |" in after
    assert "(extrapolated)" in after and "does not fit this machine's gpu memory" in after
