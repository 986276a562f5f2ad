"""The checkpoint benchmark at tiny sizes: complete state, every format, the CLI contract."""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import time
from collections import namedtuple
from pathlib import Path

import pytest
import torch

from simulator.bench import FORMATS, BenchConfig, build_state, parse_size, run_benchmark
from simulator.bench import formats as fmt_io
from simulator.bench.state import flatten, unflatten
from simulator.cli import main
from simulator.errors import InputError
from simulator.model.checkpoint_cost import CostProfile

STORED_BENCH = Path(__file__).parent / "data" / "bench-cpu-2core-2026-12-02.json"

# DCP's async writer thread warns that it assumes a single process; that is what we mean.
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled")


@pytest.fixture(scope="module")
def tiny():
    return build_state(parse_size("300K"), seed=1)


@pytest.fixture(scope="module")
def other():
    return build_state(parse_size("300K"), seed=2)


def test_size_names_parse_and_nonsense_is_refused():
    assert parse_size("25M") == 25_000_000
    assert parse_size("1B") == 1_000_000_000
    assert parse_size("1.5m") == 1_500_000
    for bad in ("3Q", "", "M", "10", "50B"):
        with pytest.raises(InputError):
            parse_size(bad)


@pytest.mark.parametrize("dtype, per_param", [("fp32", 12), ("bf16", 14)])
def test_state_holds_weights_both_adam_moments_scheduler_rng_and_data_position(dtype, per_param):
    ts = build_state(parse_size("300K"), dtype=dtype)
    s = ts.state
    assert set(s) >= {"model", "optimizer", "scheduler", "rng", "data"}
    n_params = len(s["model"])
    opt = s["optimizer"]["state"]
    assert len(opt) == n_params
    assert all({"step", "exp_avg", "exp_avg_sq"} <= set(v) for v in opt.values())
    assert all(v["exp_avg"].dtype == torch.float32 for v in opt.values())
    assert any(v["exp_avg"].abs().sum() > 0 for v in opt.values())  # a real step happened
    assert s["scheduler"]["last_epoch"] == 1 and s["data"]["step"] == 1
    assert isinstance(s["rng"]["torch"], torch.Tensor)
    assert ts.real_step
    want = next(iter(s["model"].values())).dtype
    assert want == (torch.bfloat16 if dtype == "bf16" else torch.float32)
    # Adam needs two fp32 moments per parameter, plus fp32 master weights under bf16.
    assert ts.tensor_bytes / ts.params == pytest.approx(per_param, rel=0.01)


def test_flatten_unflatten_restores_every_tensor_and_value(tiny):
    tensors, tree = flatten(tiny.state)
    json.dumps(tree)  # the non-tensor part is plain JSON
    back = unflatten(tensors, json.loads(json.dumps(tree)))
    again, tree2 = flatten(back)
    assert tree2 == tree
    assert all(torch.equal(again[k], v) for k, v in tensors.items())


@pytest.mark.parametrize("fmt", [*FORMATS, "ckptsim-async"])
def test_every_format_saves_and_restores_the_same_complete_state(fmt, tiny, other, tmp_path):
    out = fmt_io.SAVERS[fmt](tiny.state, tmp_path / fmt)
    assert out["save_s"] > 0
    if fmt in fmt_io.COPYING:
        assert 0 < out["stall_s"] <= out["save_s"]
    assert fmt_io.disk_bytes(tmp_path / fmt) >= tiny.tensor_bytes
    fmt_io.drop_cache(tmp_path / fmt)
    # DCP restores in place: give it a state with the same shapes and different values.
    template = {k: v for k, v in other.state.items()}
    template["model"] = {k: v.clone() for k, v in other.state["model"].items()}
    template["optimizer"] = {
        "state": {
            i: {k: v.clone() for k, v in d.items()}
            for i, d in other.state["optimizer"]["state"].items()
        },
        "param_groups": other.state["optimizer"]["param_groups"],
    }
    restored = fmt_io.LOADERS[fmt](tmp_path / fmt, template)
    want, want_tree = flatten(tiny.state)
    got, got_tree = flatten(restored)
    assert set(got) == set(want)
    assert all(torch.equal(got[k], v) for k, v in want.items())
    assert json.loads(json.dumps(got_tree)) == json.loads(json.dumps(want_tree))


def test_benchmark_reports_each_format_against_raw_and_cleans_up(tmp_path):
    cfg = BenchConfig(directory=tmp_path, sizes=("300K",), repeats=1)
    result = run_benchmark(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []
    by_format = {r["format"]: r for r in result.results}
    assert set(by_format) == {"raw", *FORMATS, "ckptsim-async"}
    raw = by_format["raw"]
    assert raw["ratio_to_raw"] == pytest.approx(1.0)
    assert result.raw_bytes_per_s == pytest.approx(raw["bytes_per_s"])
    for r in result.results:
        assert r["ratio_to_raw"] == pytest.approx(r["bytes_per_s"] / raw["bytes_per_s"])
        assert r["bytes"] >= 12 * r["params"]
    assert by_format["dcp-async"]["stall_s_median"] > 0
    assert {"writer_ratio_to_raw", "ckptsim-async_stall_ratio"} <= set(result.goals)


def test_interrupt_mid_benchmark_removes_everything_written(tmp_path, monkeypatch):
    real = fmt_io.SAVERS["ckptsim"]

    def interrupted(state, directory):
        real(state, directory)
        raise KeyboardInterrupt

    monkeypatch.setitem(fmt_io.SAVERS, "ckptsim", interrupted)
    with pytest.raises(KeyboardInterrupt):
        run_benchmark(
            BenchConfig(directory=tmp_path, sizes=("300K",), formats=("ckptsim",), repeats=1),
            progress=False,
        )
    assert list(tmp_path.iterdir()) == []


def test_cli_json_has_the_documented_keys_and_writes_a_loadable_profile(tmp_path, capsys):
    out = tmp_path / "profile.json"
    work = tmp_path / "w"
    work.mkdir()
    argv = ["bench", "--sizes", "300K,10M", "--formats", "torch,dcp-async", "--repeats", "2"]
    argv += ["--dir", str(work), "--out", str(out), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["raw_bytes_per_s"] > 0
    timed = sorted((s["size"], s["format"], s["repeat"]) for s in data["samples"])
    formats, sizes = ("dcp-async", "raw", "torch"), ("10M", "300K")
    assert timed == [(z, f, r) for z in sizes for f in formats for r in (0, 1)]  # every repeat
    assert all(s["save_s"] > 0 and s["load_s"] > 0 for s in data["samples"])
    keys = {"format", "params", "bytes", "save_s_median", "bytes_per_s", "ratio_to_raw"}
    keys |= {"load_s_median"}
    for r in data["results"]:
        assert keys <= set(r)
        assert ("stall_s_median" in r) == (r["format"] == "dcp-async")
    profile = CostProfile.load(out)
    assert {"torch", "dcp-async", "raw"} <= set(profile.fits)
    assert profile.predict(params=1e9, format="dcp-async").stall_s > 0


@pytest.mark.parametrize(
    "extra, message",
    [
        (["--formats", "torch,zip"], "unknown format zip"),
        (["--sizes", "3Q"], "unknown model size"),
        (["--dir", "/nonexistent/dir"], "not an existing directory"),
        (["--sizes", "1M", "--dtypes", "fp8"], "unknown dtype"),
        (["--sizes", "1M", "--writers", "1,0"], "writers must be whole numbers >= 1, got 1,0"),
        (["--sizes", "1M", "--writers", "two"], "--writers takes whole numbers"),
        (
            ["--sizes", "1M", "--optimizer-precision", "fp8"],
            "--optimizer-precision must be one of 'fp32', 'bf16', 'int8', got 'fp8'",
        ),
        (
            ["--sizes", "1M", "--weights-precision", "int8"],
            "--weights-precision must be one of 'fp32', 'bf16', got 'int8'",
        ),
        (
            ["--sizes", "1M", "--formats", "ckptsim,dcp", "--optimizer-precision", "int8"],
            "--formats dcp cannot be measured with --optimizer-precision int8",
        ),
        (["--sizes", "1M", "--pause", "700"], "--pause 700: at most 600 seconds"),
        (
            ["--sizes", "1M", "--pause", "1", "--warm-memory"],
            "--pause and --warm-memory time opposite cases",
        ),
        (
            ["--sizes", "1M", "--warm-memory", "--dir", "s3://bucket/run"],
            "--warm-memory times a local disk's page cache: give a local --dir (a path or a "
            "file:// URL)",
        ),
        (
            ["--sizes", "1M", "--out", "p.json"],
            "--out fits time = latency + bytes/bandwidth, which needs two or more different "
            "sizes; --sizes 1M gives one",
        ),
        (["--sizes", "1M,1000K", "--out", "p.json"], "--sizes 1M,1000K gives one"),
        (
            ["--sizes", "1M", "--pause", "5", "--dir", "s3://bucket/run"],
            "--pause times a local disk's page cache: give a local --dir",
        ),
    ],
)
def test_bad_input_is_one_line_and_exit_2(extra, message, tmp_path, capsys):
    argv = ["bench", "--dir", str(tmp_path), "--repeats", "1", *extra]
    assert main(argv) == 2
    err = capsys.readouterr().err.strip()
    assert message in err and "\n" not in err


@pytest.mark.parametrize(
    "pause, message",
    [
        ("-1", "must be a non-negative number of seconds, got -1"),
        ("nan", "must be a non-negative number of seconds, got nan"),
        ("inf", "must be a non-negative number of seconds, got inf"),
        ("2m", "'2m' is not a number of seconds"),
    ],
)
def test_a_pause_that_is_not_seconds_is_one_line(pause, message, tmp_path, capsys):
    with pytest.raises(SystemExit) as exit:
        main(["bench", "--dir", str(tmp_path), "--sizes", "1M", "--pause", pause])
    err = capsys.readouterr().err.strip()
    assert exit.value.code == 2 and message in err and "\n" not in err
    assert list(tmp_path.iterdir()) == []


def test_too_little_free_disk_is_refused_before_writing(tmp_path, capsys, monkeypatch):
    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 10**6, 10**6))
    assert main(["bench", "--dir", str(tmp_path), "--sizes", "1M", "--repeats", "1"]) == 2
    assert "too little free disk" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []


@pytest.mark.parametrize("fmt", ["dcp", "dcp-async"])
def test_a_disk_full_under_dcp_is_the_users_one_line_error(tiny, tmp_path, monkeypatch, fmt):
    # DCP raises a failed write as its CheckpointException, a BaseException whose message is a
    # traceback: the bench's OSError handler let it through to the user as a traceback.
    import errno

    from simulator.bench.runner import disk_errors_are_the_users

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(InputError) as refused:
        with disk_errors_are_the_users("the checkpoint", tmp_path):
            fmt_io.SAVERS[fmt](tiny.state, tmp_path / fmt)
    assert str(refused.value) == (
        f"writing the checkpoint in --dir {tmp_path} failed: No space left on device"
    )


def test_a_writer_ranks_disk_error_is_found_inside_dcps_wrapping(tiny, tmp_path, monkeypatch):
    # A --writers rank re-raised DCP's CheckpointException (a BaseException): torch's spawn
    # passes on only an Exception, so the parent printed the child's traceback.
    import errno

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.api import CheckpointException

    from simulator.bench.writers import disk_error

    def full(_fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointException) as wrapped:
        dcp.save(tiny.state, storage_writer=fmt_io._dcp_writer(tmp_path), no_dist=True)
    found = disk_error(wrapped.value, 0)
    assert isinstance(found, OSError) and found.errno == errno.ENOSPC
    plain = OSError(errno.EIO, "Input/output error")
    assert disk_error(plain, 0) is plain
    assert disk_error(RuntimeError("Connection closed by peer"), 1) is None


def test_human_output_has_one_raw_figure_and_no_goal_lines(tmp_path, capsys):
    argv = ["bench", "--sizes", "300K,1M", "--formats", "ckptsim", "--repeats", "2"]
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "goal" not in out.lower() and "met" not in out.split()
    head, _, _, *rows = out.splitlines()
    raw = [r.split() for r in rows if r.split()[2:3] == ["raw"]]
    largest = next(r for r in raw if r[0] == "1M")
    # The header's write figure is the raw row at the largest size, and raw is 1.00 of itself.
    assert f"write {largest[5]} GB/s" in head
    assert all(r[6] == "1.00" for r in raw)


def test_stored_benchmark_does_not_call_the_writer_goal_met_from_one_repeat():
    # A stored run (reports/bench-cpu-2core.json as measured on 2026-12-02, kept as test data:
    # the report itself is rerun): one 500M repeat at 1.29 x raw, the 100M sweep at 0.84.
    from simulator.bench.runner import summarise

    data = json.loads(STORED_BENCH.read_text())
    goals = summarise(data["samples"], [], data["machine"]).goals
    writer = goals["writer_ratio_to_raw"]
    assert writer["verdict"] == "not met" and writer["met"] is False
    assert {p["size"] for p in writer["per_size"]} == {"10M", "50M", "100M", "500M"}
    assert next(p for p in writer["per_size"] if p["size"] == "500M")["n"] == 1
    assert not any(g["met"] for g in goals.values())


def test_report_rerendered_from_stored_samples_is_honest(tmp_path):
    # The stored profile re-rendered through the report script, as `make reports` would.
    from experiments import bench_checkpoint

    stored = STORED_BENCH
    assert bench_checkpoint.main(["--from-json", str(stored), "--reports", str(tmp_path)]) == 0
    md = (tmp_path / "bench-cpu-2core.md").read_text()
    assert "- `writer_ratio_to_raw` (goal ≥ 0.9): **not met**." in md
    assert "**met**." not in md
    assert "the disk was not measured again" in md
    # Sizes of 2-5 repeats show no interval in either view (Student's t over two of them had
    # put a rate at "0.269 to inf"), and say why.
    goal_rows = [r for r in md.splitlines() if r.startswith("  | ") and "fp32 |" in r]
    assert goal_rows and not any(" inf " in r or "-" in r.split("|")[7] for r in goal_rows)
    assert all(r.count("— (too few repeats)") in (0, 2) for r in goal_rows)
    fits = md.split("## Fitted cost model")[1].split("R² is on seconds")[0]
    rows = [r.split("|") for r in fits.splitlines() if r.startswith("| ") and "latency" not in r]
    latencies = [float(r[i]) for r in rows for i in (2, 5)]
    assert latencies and min(latencies) >= 0
    # Residuals are shown: the 100M ckptsim restore is fitted within 10 % of the measured 2.7 s.
    row = next(r for r in md.splitlines() if r.startswith("| ckptsim | 100M | fp32 |"))
    measured, fitted = float(row.split("|")[7]), float(row.split("|")[8])
    assert abs(fitted / measured - 1) < 0.1
    stored_again = json.loads((tmp_path / "bench-cpu-2core.json").read_text())
    assert stored_again["samples"] == json.loads(stored.read_text())["samples"]


def test_restore_is_judged_against_the_raw_read_of_the_same_repeat(tmp_path, capsys):
    argv = ["bench", "--sizes", "300K,1M", "--formats", "ckptsim", "--repeats", "2"]
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "restore/raw-read ratio, same run" in out and "POSIX_FADV_DONTNEED" in out
    # two repeats: no interval, and the line says how to get one
    assert "[" not in out.split("restore/raw-read ratio")[1].splitlines()[0].split("):")[1]
    assert "no interval below 6 repeats: --repeats 6 or more gives one" in out
    assert main([*argv, "--dir", str(tmp_path), "--json"]) == 0
    restore = json.loads(capsys.readouterr().out)["goals"]["restore_ratio_to_raw"]
    assert restore["goal_min"] == 0.9
    assert [(p["size"], p["n"]) for p in restore["per_size"]] == [("300K", 2), ("1M", 2)]
    assert all(p["median"] > 0 and p["expected"] > 0 for p in restore["per_size"])
    # The per-repeat ratios behind each interval are kept (the report's figure plots them);
    # the expected cost is the mean time ratio, turned back into a bandwidth ratio.
    for p in restore["per_size"]:
        times = [1 / v for v in p["values"]]
        assert len(p["values"]) == 2 and p["expected"] == pytest.approx(2 / sum(times))


def _logged_bench(tmp_path, monkeypatch, jobs, log=None, **config):
    """A 1M ckptsim benchmark run over ``jobs`` ((repeat, job) in order), logging its raw
    reads, restores, cache drops and page-fault counts as they happen into ``log`` (a new
    list by default), with ``config`` for its :class:`BenchConfig`: (log, result)."""
    from simulator.bench import runner

    log = [] if log is None else log
    real_read, real_drop, real_load = fmt_io.raw_read, fmt_io.drop_cache, fmt_io.LOADERS["ckptsim"]

    def raw_read(directory, name="raw.bin", *, readahead=False, before_clock=None):
        log.append(("raw read", directory.name, name) + (("readahead",) if readahead else ()))
        return real_read(directory, name, readahead=readahead, before_clock=before_clock)

    monkeypatch.setattr(fmt_io, "raw_read", raw_read)
    monkeypatch.setattr(fmt_io, "drop_cache", lambda d: log.append(("drop",)) or real_drop(d))
    monkeypatch.setitem(
        fmt_io.LOADERS, "ckptsim", lambda *a: log.append(("load",)) or real_load(*a)
    )
    monkeypatch.setattr(runner, "_minor_faults", lambda: log.append(("faults",)) or 0)
    monkeypatch.setattr(runner, "interleaved", lambda *_: iter(jobs))
    repeats = len({rep for rep, _ in jobs})
    cfg = BenchConfig(
        directory=tmp_path, sizes=("1M",), formats=("ckptsim",), repeats=repeats, **config
    )
    return log, run_benchmark(cfg, progress=False)


def test_each_restore_is_judged_against_a_raw_read_of_its_own_file_right_beside_it(
    tmp_path, monkeypatch
):
    from simulator import ckptio

    jobs = [(r, job) for r in range(2) for job in ("raw", "ckptsim")]
    log, result = _logged_bench(tmp_path, monkeypatch, jobs)
    log = [e for e in log if e[0] in ("raw read", "load")]  # the timed reads, in order
    # Repeat 0: the restore first, the raw read of the checkpoint's own tensor file right after;
    # repeat 1 the other way round. The raw job reads its own file, as before.
    # The pair's raw read is done the restore's way (4 MB slices, the readahead thread), the
    # raw job's plainly.
    assert log == [
        ("raw read", "raw-0", "raw.bin"),
        ("load",), ("raw read", "ckptsim-0", ckptio.TENSOR_FILE, "readahead"),
        ("raw read", "raw-1", "raw.bin"),
        ("raw read", "ckptsim-1", ckptio.TENSOR_FILE, "readahead"), ("load",),
    ]  # fmt: skip
    rows = [s for s in result.samples if s["format"] == "ckptsim"]
    raws = [s for s in result.samples if s["format"] == "raw"]
    assert rows[0]["raw_pair_load_bytes"] < rows[0]["bytes"]  # the tensor file, no meta.json
    restore = [
        (r["bytes"] / r["load_s"]) / (r["raw_pair_load_bytes"] / r["raw_pair_load_s"]) for r in rows
    ]
    assert result.goals["restore_ratio_to_raw"]["per_size"][0]["values"] == pytest.approx(restore)
    # The save is held to the raw job's write of the same repeat.
    save = [
        (r["bytes"] / r["save_s"]) / (w["bytes"] / w["save_s"])
        for r, w in zip(rows, raws, strict=True)
    ]
    assert result.goals["writer_ratio_to_raw"]["per_size"][0]["values"] == pytest.approx(save)
    assert "raw_pair_save_s" not in rows[0]


def _samples(restore_ratios, *, raw_pair_save_s=None):
    """Stored-profile samples: per repeat a raw job (1 s each way) and a ckptsim save of 1 s
    with a restore timed against a raw read of its own file at the given ratio."""
    samples = []
    for rep, ratio in enumerate(restore_ratios):
        base = dict(size="1M", dtype="fp32", repeat=rep, params=10, tensor_bytes=100)
        samples.append(base | dict(format="raw", save_s=1.0, bytes=100, load_s=1.0))
        row = dict(format="ckptsim", save_s=1.0, bytes=100, load_s=1.0 / ratio)
        row |= dict(raw_pair_load_s=1.0, raw_pair_load_bytes=100)
        if raw_pair_save_s is not None:  # what some profiles of 2026-12-06 hold
            row |= dict(raw_pair_save_s=raw_pair_save_s, raw_pair_save_bytes=100)
        samples.append(base | row)
    return samples


def test_a_restore_slow_in_9_of_30_repeats_is_not_met_whatever_its_median():
    from simulator.bench.runner import summarise

    goal = summarise(_samples([0.95] * 21 + [0.32] * 9), [], {}).goals["restore_ratio_to_raw"]
    (p,) = goal["per_size"]
    assert p["low"] > 0.9  # the typical repeat clears the goal...
    assert goal["verdict"] == "not met"  # ...the expected restore time does not
    goal = summarise(_samples([0.95] * 30), [], {}).goals["restore_ratio_to_raw"]
    assert goal["verdict"] == "met"


def test_the_save_goal_ignores_a_raw_write_beside_the_save_that_was_found_biased():
    # Review 2: profiles measured while a raw write ran beside each save (raw_pair_save_s,
    # reverted as flattering) were still judged against it.
    from simulator.bench.runner import summarise

    goals = summarise(_samples([1.0] * 6, raw_pair_save_s=3.0), [], {}).goals
    assert goals["writer_ratio_to_raw"]["per_size"][0]["values"] == [1.0] * 6  # the raw job's


def test_the_cli_claims_a_raw_read_beside_each_restore_only_where_the_samples_hold_one():
    from simulator.bench.runner import summarise
    from simulator.cli.bench import format_table

    data = json.loads(STORED_BENCH.read_text())  # measured before the pair (and s3 runs)
    assert not any("raw_pair_load_s" in s for s in data["samples"])
    out = format_table(summarise(data["samples"], [], data["machine"]))
    assert "restore/raw-read ratio, same run, per repeat (median" in out
    assert "beside a raw read of its own file" not in out
    out = format_table(summarise(_samples([0.95] * 6), [], {"cpu_count": 2}))
    assert "each restore beside a raw read of its own file" in out


def test_the_paired_read_is_outside_the_restore_fault_count_and_the_restore_is_cold(
    tmp_path, monkeypatch
):
    # From review 2: catches the raw-first read moved inside the restore's fault window, and
    # the drop_cache right before an in-place restore removed (the restore would then read the
    # file the raw read had just brought into the page cache).
    from simulator import ckptio

    # Repeat 1: the raw read first.
    log, _ = _logged_bench(tmp_path, monkeypatch, [(1, "raw"), (1, "ckptsim")])
    pair = log.index(("raw read", "ckptsim-1", ckptio.TENSOR_FILE, "readahead"))
    load = log.index(("load",))
    assert pair < load and log[pair + 1 : load].count(("faults",)) == 1  # read, then window
    # the read's own drop, then the restore's own right before its window opens
    assert log[pair + 1 : load].count(("drop",)) == 2
    assert log[load - 2 : load] == [("drop",), ("faults",)]


@pytest.mark.parametrize("pause", [-0.5, float("nan"), float("inf")])
def test_a_config_pause_must_be_finite_seconds(tmp_path, pause):
    with pytest.raises(InputError, match="pause must be a finite number of seconds >= 0"):
        BenchConfig(directory=tmp_path, pause_s=pause)


def test_a_pause_and_a_warm_up_are_not_taken_together(tmp_path):
    with pytest.raises(InputError, match="--pause and --warm-memory time opposite cases"):
        BenchConfig(directory=tmp_path, pause_s=1.0, warm_memory=True)


def test_the_warm_up_maps_every_page_it_is_given(monkeypatch):
    # warm_memory must write into each page (a fresh buffer never written maps no page, and
    # zeros would not do either: the kernel may map one shared zero page).
    import mmap

    import numpy as np

    touched = []
    real_empty = np.empty

    def empty(n, dtype):
        buf = real_empty(n, dtype)
        touched.append(buf)
        return buf

    monkeypatch.setattr(np, "empty", empty)
    fmt_io.warm_memory(0)
    fmt_io.warm_memory(-5)  # a budget that came out negative (little memory free) does nothing
    assert touched == []
    fmt_io.warm_memory(10 * mmap.PAGESIZE + 1)
    (buf,) = touched
    pages = buf.reshape(-1)[: 10 * mmap.PAGESIZE].reshape(10, mmap.PAGESIZE)
    assert (pages[:, 0] == 1).all() and buf[-1] == 1
    assert buf.nbytes == 10 * mmap.PAGESIZE + 1


def test_writer_repeats_are_validated_and_default_to_repeats(tmp_path):
    with pytest.raises(InputError, match="writer repeats must be at least 1, got 0"):
        BenchConfig(directory=tmp_path, writers=(1,), writer_repeats=0)
    assert BenchConfig(directory=tmp_path, repeats=4).writer_repeats is None


def test_every_restore_and_raw_read_records_the_page_faults_it_took(tmp_path, monkeypatch):
    import itertools

    from simulator.bench import runner

    # A fault counter that moves by 7 between any two reads: each load must record exactly
    # the difference across it (a counter read in the wrong place, or not at all, fails).
    ticks = itertools.count(0, 7)
    monkeypatch.setattr(runner, "_minor_faults", lambda: next(ticks))
    # A warm-up before each clock faults pages in too: none of them may count as a load's.
    monkeypatch.setattr(fmt_io, "warm_memory", lambda n: [next(ticks) for _ in range(100)])
    cfg = BenchConfig(
        directory=tmp_path, sizes=("1M",), formats=("ckptsim",), repeats=2, warm_memory=True
    )
    result = run_benchmark(cfg, progress=False)
    loads = [s for s in result.samples if s.get("bench") != "writers"]
    assert {s["format"] for s in loads} == {"raw", "ckptsim", "ckptsim-async"}
    assert [s["load_minor_faults"] for s in loads] == [7] * len(loads)
    by_format = {r["format"]: r for r in result.results}
    assert by_format["raw"]["load_minor_faults_median"] == 7


def test_the_raw_write_writes_the_states_own_bytes_from_its_memory(tmp_path, monkeypatch):
    # The save's baseline writes the bytes the save writes: random bytes of the same count
    # took the storage below the project's VM up to 3.5x as long (experiments/write_content.py).
    from simulator.bench.state import build_state, parse_size

    written, real = [], fmt_io.raw_write

    def raw_write(directory, data):
        seconds = real(directory, data)
        written.append(((directory / "raw.bin").read_bytes(), data))
        return seconds

    monkeypatch.setattr(fmt_io, "raw_write", raw_write)
    cfg = BenchConfig(directory=tmp_path, sizes=("1M",), formats=("ckptsim",), repeats=2)
    result = run_benchmark(cfg, progress=False)
    expected = b"".join(bytes(v) for v in fmt_io.state_bytes(build_state(parse_size("1M")).state))
    # The warm-up write and both raw jobs: the state's bytes, tensor after tensor, nothing else.
    assert len(written) == 3
    assert all(not isinstance(data, int) and got == expected for got, data in written)
    raws = [s for s in result.samples if s["format"] == "raw"]
    assert [r["bytes"] for r in raws] == [len(expected)] * 2
    # A byte count still writes that many (random) bytes, for callers without a state.
    assert real(tmp_path / "n", 5 + (64 << 20)) > 0
    assert (tmp_path / "n" / "raw.bin").stat().st_size == 5 + (64 << 20)


@pytest.mark.slow
def test_parallel_writers_run_real_gloo_ranks_against_as_many_raw_writers(tmp_path, capsys):
    out = tmp_path / "profile.json"
    argv = ["bench", "--sizes", "300K,2M", "--formats", "ckptsim", "--repeats", "2"]
    argv += ["--writers", "1,2", "--dir", str(tmp_path), "--out", str(out), "--json"]
    assert main(argv) == 0
    data = json.loads(capsys.readouterr().out)
    rows = {(r["format"], r["writers"]): r for r in data["writers"]}
    assert set(rows) == {("raw", 1), ("dcp", 1), ("raw", 2), ("dcp", 2)}
    for (fmt, n), r in rows.items():
        assert r["repeats"] == 2 and r["slowest_s"] > 0 and r["aggregate_bytes_per_s"] > 0
        assert r["shard_bytes"] * n == pytest.approx(2e6 * 12, rel=0.01)
        assert r["per_writer_bytes_per_s_min"] <= r["per_writer_bytes_per_s_median"]
        assert (r["commit_s"] > 0) == (fmt == "dcp") or fmt == "raw"
    assert rows["dcp", 2]["ratio_to_raw"] > 0 and rows["raw", 2]["ratio_to_raw"] == 1.0
    profile = CostProfile.load(out)
    assert {"raw", "dcp"} <= set(profile.contention)
    assert profile.contention["dcp"].writers.count(2) == 2
    cost = profile.predict(params=405e9, nodes=2048, format="ckptsim")  # meets the raw curve
    assert any("1,024x the 2 measured" in w for w in cost.warnings)
    assert [p for p in tmp_path.iterdir() if p.name != "profile.json"] == []


def test_goal_ratio_figure_shows_every_repeat_and_the_interval_the_text_gives(tmp_path):
    from experiments import bench_cost_at_scale

    cfg = BenchConfig(directory=tmp_path, sizes=("300K", "1M"), formats=("ckptsim",), repeats=3)
    goals = run_benchmark(cfg, progress=False).goals
    from matplotlib.collections import PathCollection

    ax = bench_cost_at_scale._plot_ratios(goals)
    for axis, (goal, _, _) in zip(ax.figure.axes, bench_cost_at_scale.GOALS, strict=True):
        scatters = [c for c in axis.collections if isinstance(c, PathCollection)]
        values = sorted(float(y) for c in scatters for _, y in c.get_offsets())
        expected = sorted(v for p in goals[goal]["per_size"] for v in p["values"])
        assert values == pytest.approx(expected)
        assert goals[goal]["verdict"] in axis.get_title()


@pytest.mark.slow
def test_fresh_process_restore_study_times_each_load_in_its_own_process(tmp_path):
    from experiments import restore_fresh_process

    argv = ["--size", "300K", "--pairs", "2", "--dir", str(tmp_path), "--reports", str(tmp_path)]
    assert restore_fresh_process.main(argv) == 0
    data = json.loads((tmp_path / "restore-fresh-process.json").read_text())
    assert sorted((r["pair"], r["job"]) for r in data["rows"]) == sorted(
        (p, j) for p in range(2) for j in restore_fresh_process.JOBS
    )
    assert all(r["seconds"] > 0 for r in data["rows"])
    # Without the prefaulter a fresh process faults its new buffers in as it reads into them
    # (1.2 MB here: hundreds of 4 KiB pages); the count is the process's own, so it is seen.
    assert all(r["minor_faults"] > 100 for r in data["rows"] if r["job"] != "restore")
    assert all(r["prefaulted"] == 0 for r in data["rows"] if r["job"] != "restore")
    assert all(len(v) == 2 for v in data["ratios"].values())
    md = (tmp_path / "restore-fresh-process.md").read_text()
    assert "| restore/raw-read |" in md and "by the project's rule" in md
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "restore-fresh-process.json",
        "restore-fresh-process.md",
    ]


def test_restore_gap_study_times_five_cold_reads_a_round_and_leaves_nothing(
    tmp_path, capsys, monkeypatch
):
    from experiments import restore_gap
    from simulator import ckptio
    from simulator.ckptio.readahead import Readahead

    verifies = []
    real = ckptio.read_checkpoint

    def read_checkpoint(path, *, verify=True, into=None):
        # Which restore: verify, and whether its readahead thread is the real one.
        verifies.append((verify, ckptio.read.Readahead is Readahead))
        return real(path, verify=verify, into=into)

    raws = []
    real_raw = fmt_io.raw_read

    def raw_read(directory, name="raw.bin", *, readahead=False):
        raws.append(readahead)
        return real_raw(directory, name, readahead=readahead)

    monkeypatch.setattr(ckptio, "read_checkpoint", read_checkpoint)
    monkeypatch.setattr(fmt_io, "raw_read", raw_read)
    work, report = tmp_path / "work", tmp_path / "gap.md"
    work.mkdir()
    argv = ["--size", "300K", "--rounds", "6", "--dir", str(work), "--report", str(report)]
    assert restore_gap.main(argv) == 0
    out = capsys.readouterr().out
    text = report.read_text()  # what it printed, with the command that printed it
    assert "`python experiments/restore_gap.py --size 300K --rounds 6" in text
    assert out.split("\nwrote ")[0].strip() in text
    assert "6 rounds" in out and "verify=False/verify=True (CRC)" in out
    assert "raw read, readahead/restore, verify=True" in out
    assert raws.count(False) == raws.count(True) == 6
    assert "[nan" not in out  # 6 rounds: the medians' intervals exist
    # 6 cold restores each way, then 11 warm ones each way; the thread is put back after.
    for way in ((False, True), (True, True), (True, False)):
        assert verifies.count(way) == 6 + 11
    assert len(verifies) == 3 * (6 + 11) and ckptio.read.Readahead is Readahead
    assert "no readahead/readahead (verify=True)" in out
    assert list(work.iterdir()) == []  # the checkpoint is removed
    with pytest.raises(SystemExit):
        restore_gap.main(["--rounds", "5"])
    assert "at least 6" in capsys.readouterr().err


def test_write_content_study_times_three_writes_a_round_and_leaves_nothing(tmp_path, capsys):
    from experiments import write_content

    work, report = tmp_path / "work", tmp_path / "content.md"
    work.mkdir()
    argv = ["--size", "300K", "--rounds", "6", "--gap", "0", "--dir", str(work)]
    assert write_content.main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "6 rounds" in out and out.count("over 2x its median in") == 3
    assert "random bytes / the state's bytes" in out and "[nan" not in out
    assert list(work.iterdir()) == []
    assert out.split("\nwrote ")[0].strip() in report.read_text()
    for bad, why in ((["--rounds", "5"], "at least 6"), (["--gap", "-1"], "at least 0")):
        with pytest.raises(SystemExit):
            write_content.main(bad)
        assert why in capsys.readouterr().err


@pytest.mark.parametrize("readahead", [False, True], ids=["64MB-reads", "restore-pattern"])
def test_the_raw_read_reads_every_byte_into_one_buffer_mapped_before_its_clock(tmp_path, readahead):
    # The baseline is the disk's speed: f.read() into a fresh buffer per call timed the
    # allocator too (no page mapped inside a long benchmark loop, every page in a fresh
    # process). Whatever the allocator holds, the timed read maps no fresh memory. The
    # restore's pattern (4 MB slices, a readahead thread) cycles through the same buffer.
    import os
    import resource

    nbytes = 3 * fmt_io._RAW_CHUNK + 5
    fmt_io.raw_write(tmp_path / "raw", nbytes)
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    rchar = _rchar() if os.path.exists("/proc/self/io") else None
    assert fmt_io.raw_read(tmp_path / "raw", readahead=readahead) > 0
    faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
    assert faults < 2_000  # 196 MB read: 48,000 pages had each call used fresh memory
    if rchar is not None:
        assert nbytes <= _rchar() - rchar < nbytes + (1 << 20)
    # the bytes that arrive are the file's (the last read's 5 bytes land at the front)
    with open(tmp_path / "raw" / "raw.bin", "rb") as f:
        assert bytes(fmt_io._raw_read_buffer()[:5]) == f.read()[-5:]


@pytest.mark.parametrize("readahead", [False, True], ids=["64MB-reads", "restore-pattern"])
def test_the_raw_read_done_the_restores_way_reads_its_slices_with_the_readahead_thread(
    tmp_path, monkeypatch, readahead
):
    # The restore's baseline must do the restore's I/O: READ_CHUNK slices reported to a
    # readahead thread that asks for the whole file. The plain read: 64 MB reads, no thread.
    from simulator.ckptio.layout import READ_CHUNK
    from simulator.ckptio.readahead import Readahead

    seen: list[Readahead] = []

    class Recorded(Readahead):
        def __init__(self, fd, size, **kw):
            super().__init__(fd, size, **kw)
            self.positions: list[int] = []
            seen.append(self)

        def at(self, pos):
            self.positions.append(pos)
            super().at(pos)
            # At the end, give the thread time to ask (the reader may outrun it on a warm
            # disk): a thread that never asks for the whole file still fails below.
            deadline = time.monotonic() + 10
            while threaded and pos == nbytes and self.asked_bytes < nbytes:
                if time.monotonic() > deadline:
                    break
                time.sleep(0.001)

    threaded = readahead and hasattr(os, "posix_fadvise")
    monkeypatch.setattr(fmt_io, "Readahead", Recorded)
    nbytes = 5 * READ_CHUNK + 7
    fmt_io.raw_write(tmp_path / "raw", nbytes)
    fmt_io.raw_read(tmp_path / "raw", readahead=readahead)
    (ahead,) = seen
    step = READ_CHUNK if readahead else fmt_io._RAW_CHUNK
    assert ahead.positions == [*range(step, nbytes, step), nbytes]
    assert ahead.asked_bytes == (nbytes if threaded else 0)


def _rchar() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


def test_the_quick_goal_check_prints_both_goal_ratios_and_writes_no_report(tmp_path, capsys):
    from experiments import bench_cost_at_scale

    argv = ["--quick", "--sizes", "300K", "--repeats", "2", "--dir", str(tmp_path)]
    assert bench_cost_at_scale.main([*argv, "--reports", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "restore/raw-read >= 90%" in out and "save/raw-write >= 90%" in out
    assert "300K: median" in out and "over 2 repeats" in out
    assert "parallel writers" not in out
    assert list(tmp_path.iterdir()) == []


@pytest.mark.slow  # two gloo groups of writers: ~20 s
def test_the_scale_report_says_how_it_was_measured_warm_memory_included(tmp_path, capsys):
    # The committed report's path: the command line that made it, and, with --warm-memory,
    # the Method line saying what ran before every clock, and the profile's samples.
    from experiments import bench_cost_at_scale

    work = tmp_path / "work"
    work.mkdir()
    argv = ["--sizes", "300K,1M", "--repeats", "2", "--writers", "1,2", "--writer-repeats", "1"]
    argv += ["--dir", str(work), "--reports", str(tmp_path), "--machine", "t", "--warm-memory"]
    assert bench_cost_at_scale.main(argv) == 0
    text = (tmp_path / "bench-scale-t.md").read_text()
    assert "--writers 1,2 --repeats 2 --writer-repeats 1 --warm-memory` on" in text
    assert "- Memory (`--warm-memory`): right before every clock" in text
    assert "`bench-scale-t.json`, beside this report" in text
    assert "(--warm-memory): each took memory its host backs" in text  # the run's own note
    samples = json.loads((tmp_path / "bench-scale-t.json").read_text())["samples"]
    single = [s for s in samples if s.get("bench") != "writers"]
    assert single and all(s["warm_memory"] is True for s in single)
    # Its figures beside it (the report links figures/...), none in the project's reports/.
    for kind in ("writers", "ratios"):
        assert f"![bench-scale-t-{kind}](figures/bench-scale-t-{kind}.png)" in text
        assert (tmp_path / "figures" / f"bench-scale-t-{kind}.png").is_file()
    assert not list((Path(__file__).parents[1] / "reports" / "figures").glob("bench-scale-t-*"))


@pytest.mark.parametrize("fmt", ["torch", "ckptsim"])
def test_a_restore_frees_the_state_it_replaces_or_reads_into_it(tmp_path, monkeypatch, fmt):
    # A format that builds a new state: only the restored copy is held (1x memory), and the
    # memory the previous one frees is the allocator's to hand to the restore; a reference
    # kept by the loop held two or three copies at once. ckptsim reads into the state's own
    # tensors, as the controller's restore does: the same tensors, filled.
    import weakref

    saved, alive_at_load, same = [], [], []
    save, load = fmt_io.SAVERS[fmt], fmt_io.LOADERS[fmt]

    def first(state):  # the state's own tensor object (flatten's are detached aliases)
        return next(iter(state["model"].values()))

    def saving(state, directory):
        saved.append((weakref.ref(first(state)), first(state).data_ptr()))
        return save(state, directory)

    def loading(directory, state=None):
        alive_at_load.append(saved[-1][0]() is not None)
        restored = load(directory, state)
        same.append(first(restored).data_ptr() == saved[-1][1])
        return restored

    monkeypatch.setitem(fmt_io.SAVERS, fmt, saving)
    monkeypatch.setitem(fmt_io.LOADERS, fmt, loading)
    cfg = BenchConfig(directory=tmp_path, sizes=("300K",), formats=(fmt,), repeats=3)
    run_benchmark(cfg, progress=False)
    in_place = fmt in fmt_io.IN_PLACE
    assert alive_at_load == [in_place] * 3
    if in_place:
        assert same == [True] * 3


# -- reduced precision (ckptsim bench --optimizer-precision / --weights-precision) ------------


def _moment_bytes(state) -> tuple[int, int]:
    """(bytes, values) of the AdamW moments the controller's encoding reduces."""
    from simulator.controller.precision import MIN_NUMEL

    moments = [
        t
        for entry in state["optimizer"]["state"].values()
        for name, t in entry.items()
        if name in ("exp_avg", "exp_avg_sq") and t.numel() >= MIN_NUMEL
    ]
    return sum(t.numel() * t.element_size() for t in moments), len(moments)


def test_bench_state_holds_fp32_adamw_moments_the_option_reduces(tiny):
    nbytes, count = _moment_bytes(tiny.state)
    # Two fp32 moments per parameter, nearly all in tensors large enough to be reduced.
    assert count >= 2 and count % 2 == 0
    assert nbytes > 0.9 * 8 * tiny.params
    assert all(
        v[m].dtype == torch.float32
        for v in tiny.state["optimizer"]["state"].values()
        for m in ("exp_avg", "exp_avg_sq")
    )
    assert all(v["exp_avg_sq"].min() >= 0 for v in tiny.state["optimizer"]["state"].values())


@pytest.mark.parametrize("fmt", fmt_io.REDUCIBLE)
def test_reduced_restore_decodes_into_the_original_dtypes(fmt, tiny, tmp_path):
    out = fmt_io.save_reduced(fmt, tiny.state, tmp_path / fmt, optimizer="int8", weights="bf16")
    assert out["save_s"] >= out["encode_s"] > 0
    fmt_io.drop_cache(tmp_path / fmt)
    restored = fmt_io.load_reduced(fmt, tmp_path / fmt)
    assert "precision" not in restored
    want, _ = flatten(tiny.state)
    got, _ = flatten(restored)
    assert set(got) == set(want)
    lossy = 0
    for k, v in want.items():
        assert got[k].dtype == v.dtype and got[k].shape == v.shape, k
        if not torch.equal(got[k], v):
            lossy += 1
            assert k.startswith(("model.", "optimizer.state.")), k  # nothing else is reduced
            assert torch.allclose(got[k], v, rtol=0.02, atol=float(v.abs().max()) / 100), k
    assert lossy > 0  # it did reduce something


def test_reduced_precision_shrinks_the_moments_by_the_expected_factor(tmp_path):
    cfg = BenchConfig(
        directory=tmp_path,
        sizes=("1M",),
        formats=("torch", "safetensors", "ckptsim"),
        repeats=1,
        optimizer_precision="int8",
    )
    result = run_benchmark(cfg, progress=False)
    assert list(tmp_path.iterdir()) == []
    moments, _ = _moment_bytes(build_state(parse_size("1M")).state)
    reduced = [r for r in result.results if r.get("optimizer_precision") == "int8"]
    assert sorted(r["format"] for r in reduced) == sorted(fmt_io.REDUCIBLE)
    for r in reduced:
        assert r["weights_precision"] == "fp32" and r["exact_bytes"] > r["bytes"]
        # The moments part: exact minus what the reduced save saved, against its fp32 bytes;
        # one byte a value plus a float32 scale per 256 is 4 / (1 + 4/256) = 3.94x smaller.
        ratio = moments / (moments - (r["exact_bytes"] - r["bytes"]))
        assert 3.8 < ratio < 3.95, (r["format"], ratio)
        # 12 B/param -> 4 + 2 * 1.016: the whole checkpoint about 2x smaller.
        assert r["bytes_ratio_to_exact"] == pytest.approx(r["exact_bytes"] / r["bytes"])
        assert 1.9 < r["bytes_ratio_to_exact"] < 2.0
        assert r["save_ratio_to_exact"] > 0 and r["load_ratio_to_exact"] > 0
        assert r["encode_s_median"] > 0
    exact_rows = [r for r in result.results if r["format"] != "raw" and "exact_bytes" not in r]
    assert {r["optimizer_precision"] for r in exact_rows} == {"fp32"}
    raw = next(r for r in result.results if r["format"] == "raw")
    assert "optimizer_precision" not in raw  # the disk, not a format
    # The goals and the cost profile are the exact saves' only.
    assert {p["n"] for p in result.goals["writer_ratio_to_raw"]["per_size"]} == {1}
    assert all(
        "optimizer_precision" not in s or s["optimizer_precision"] == "fp32"
        for s in result.profile().samples
    )


def test_bf16_moments_and_weights_halve_both(tmp_path, capsys):
    # Two sizes: --out fits time against bytes, which one size cannot give.
    argv = ["bench", "--sizes", "300K,1M", "--formats", "ckptsim", "--repeats", "1"]
    argv += ["--optimizer-precision", "bf16", "--weights-precision", "bf16"]
    out = tmp_path / "profile.json"
    work = tmp_path / "w"
    work.mkdir()
    assert main([*argv, "--dir", str(work), "--json", "--out", str(out)]) == 0
    rows = json.loads(capsys.readouterr().out)["results"]
    from simulator.controller.precision import MIN_NUMEL

    for size in ("300K", "1M"):
        ts = build_state(parse_size(size))
        weights = sum(
            t.numel() * t.element_size()
            for t in ts.state["model"].values()
            if t.numel() >= MIN_NUMEL
        )
        moments, _ = _moment_bytes(ts.state)
        reduced = [r for r in rows if r["size"] == size and r.get("optimizer_precision") == "bf16"]
        assert reduced
        for r in reduced:
            assert r["weights_precision"] == "bf16"
            saved = r["exact_bytes"] - r["bytes"]
            assert saved == pytest.approx((weights + moments) / 2, rel=0.01)
    assert {r["format"] for r in rows if "exact_bytes" in r} == {"ckptsim", "ckptsim-async"}
    profile = CostProfile.load(out)
    assert {s.get("optimizer_precision", "fp32") for s in profile.samples} == {"fp32"}


def test_bf16_weights_of_a_bf16_model_reduce_nothing_and_say_so(tmp_path):
    cfg = BenchConfig(
        directory=tmp_path,
        sizes=("300K",),
        dtypes=("bf16",),
        formats=("safetensors",),
        repeats=1,
        weights_precision="bf16",
    )
    result = run_benchmark(cfg, progress=False)
    row = next(r for r in result.results if "exact_bytes" in r)
    assert row["bytes"] == pytest.approx(row["exact_bytes"], abs=4096)  # metadata only
    assert any("reduces nothing at --dtypes bf16" in n for n in result.notes)


def test_human_table_shows_the_precision_and_the_ratio_to_the_exact_save(tmp_path, capsys):
    argv = ["bench", "--sizes", "300K", "--formats", "ckptsim", "--repeats", "1"]
    assert main([*argv, "--dir", str(tmp_path), "--optimizer-precision", "int8"]) == 0
    out = capsys.readouterr().out
    assert "opt/wt" in out.splitlines()[1]
    rows = [line.split() for line in out.splitlines()[3:] if line.startswith("  300K")]
    assert {r[2]: r[3] for r in rows if r[3] == "int8/fp32"} == {
        "ckptsim": "int8/fp32",
        "ckptsim-async": "int8/fp32",
    }
    assert "300K fp32 ckptsim int8/fp32 against exact, same run: 1.9" in out
    # An exact run's table keeps its columns.
    assert main([*argv, "--dir", str(tmp_path)]) == 0
    assert "opt/wt" not in capsys.readouterr().out


def test_help_teaches_the_precision_options(capsys):
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--optimizer-precision" in text and "--weights-precision" in text
    assert (
        "int8 (blockwise" in text and "dcp, dcp-async and an object-store --dir are refused" in text
    )


def test_reduced_precision_is_refused_over_an_object_store():
    from simulator.bench.remote import check_remote

    cfg = BenchConfig(directory="s3://bucket/run", formats=("ckptsim",), optimizer_precision="int8")
    with pytest.raises(InputError, match="is measured on a file system, not at s3://bucket/run"):
        check_remote(cfg)


def _virtio(root, name, device, features):
    dev = root / name
    dev.mkdir(parents=True)
    (dev / "device").write_text(device + "\n")
    (dev / "features").write_text(features + "\n")


@pytest.mark.parametrize(
    "devices, expected",
    [
        ([("virtio0", "0x0005", "0110010100000000")], True),  # the project's VM's balloon
        ([("virtio0", "0x0005", "0110000000000000")], False),  # a balloon, no reporting
        ([("virtio0", "0x0002", "0000010000000000")], None),  # a disk's bit 5 is not it
        ([("virtio1", "0x0001", "1"), ("virtio0", "0x0005", "00000")], False),  # short features
        ([], None),
    ],
)
def test_free_page_reporting_is_read_from_the_balloons_feature_bit(tmp_path, devices, expected):
    from simulator.bench.runner import free_page_reporting

    for name, device, features in devices:
        _virtio(tmp_path, name, device, features)
    assert free_page_reporting(tmp_path) is expected
    assert free_page_reporting(tmp_path / "absent") is None  # not Linux, or no virtio bus


def test_an_unreadable_virtio_device_does_not_hide_the_balloon(tmp_path):
    from simulator.bench.runner import free_page_reporting

    (tmp_path / "virtio0").mkdir()  # no device file: skipped, not the end of the scan
    _virtio(tmp_path, "virtio9", "0x0005", "0110010100000000")
    assert free_page_reporting(tmp_path) is True


@pytest.mark.parametrize("reporting", [True, None])
def test_a_run_on_a_vm_that_reports_free_pages_says_what_that_does_to_its_timings(
    tmp_path, monkeypatch, reporting
):
    from simulator.bench import runner
    from simulator.cli.bench import format_table

    monkeypatch.setattr(runner, "free_page_reporting", lambda: reporting)
    cfg = BenchConfig(directory=tmp_path, sizes=("300K",), formats=("ckptsim",), repeats=1)
    run = run_benchmark(cfg, progress=False)
    assert run.machine["free_page_reporting"] is reporting
    assert (runner.FREE_PAGE_NOTE in run.notes) is (reporting is True)
    # The note follows the machine facts, so a stored profile re-rendered says it too.
    again = runner.summarise(run.samples, [], json.loads(json.dumps(run.machine)))
    assert again.notes == run.notes
    said = f"note: {runner.FREE_PAGE_NOTE}" in format_table(again)
    assert said is (reporting is True)
    # A --warm-memory run paid no host faults in its timed jobs: the note would contradict
    # the run's own (review); a stored warmed profile re-rendered leaves it out too.
    monkeypatch.setattr(runner, "free_page_reporting", lambda: True)
    warmed = run_benchmark(dataclasses.replace(cfg, warm_memory=True), progress=False)
    assert runner.FREE_PAGE_NOTE not in warmed.notes
    assert any("(--warm-memory)" in n for n in warmed.notes)
    assert runner.FREE_PAGE_NOTE not in runner.summarise(warmed.samples, [], warmed.machine).notes


def test_the_vm_memory_experiment_times_writes_and_fills_after_each_pause(tmp_path, capsys):
    from experiments import vm_memory

    work, report = tmp_path / "work", tmp_path / "vm-memory.md"
    work.mkdir()
    argv = ["--mib", "2", "--gaps", "0,0.1", "--rounds", "2", "--dir", str(work)]
    assert vm_memory.main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert out.startswith("free page reporting to the host: ")
    rows = [r for r in map(str.split, out.splitlines()) if len(r) == 7 and r[0][0].isdigit()]
    assert [r[0] for r in rows] == ["0.0", "0.1"]
    # write, fsync, warm-up, write after it: seconds; fills: µs a page
    assert all(float(v) >= 0 for r in rows for v in r[1:5]) and all(float(r[5]) > 0 for r in rows)
    assert list(work.iterdir()) == []
    # the report holds what was printed, and the command that printed it
    text = report.read_text()
    assert "`python experiments/vm_memory.py --mib 2 --gaps 0,0.1 --rounds 2" in text
    assert all(line in text for line in out.splitlines()[:-1])
    bad_args = (
        (["--gaps", "x"], "not a list of seconds"),
        (["--gaps", "0,nan"], "seconds from 0 to 30"),
        (["--mib", "0"], "1 to 8192"),
    )
    for bad, why in bad_args:
        with pytest.raises(SystemExit):
            vm_memory.main(bad)
        assert why in capsys.readouterr().err


def test_the_save_overhead_experiment_compares_the_save_and_the_serializers(tmp_path, capsys):
    from experiments import save_overhead

    work, report = tmp_path / "work", tmp_path / "save-overhead.md"
    work.mkdir()
    argv = ["--size", "300K", "--rounds", "6", "--dir", str(work), "--warm-memory"]
    assert save_overhead.main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert "on disk" in out and "ratio of the medians" in out and "per-round time ratio" in out
    assert "the library's write alone (serialize_file + fsyncs)" in out
    assert "each after the untimed warm-up (--warm-memory)" in report.read_text()
    assert "describing the tensors to the serializer" in out and "ms less per save" in out
    assert list(work.iterdir()) == []
    text = report.read_text()
    assert "`python experiments/save_overhead.py --size 300K --rounds 6" in text
    assert all(line in text for line in out.splitlines()[:-1])
    with pytest.raises(SystemExit):
        save_overhead.main(["--rounds", "5", "--dir", str(tmp_path)])
    assert "at least 6" in capsys.readouterr().err
    with pytest.raises(SystemExit):  # refused before the run, not after it
        save_overhead.main(["--report", str(tmp_path / "absent" / "r.md")])
    assert "no folder" in capsys.readouterr().err


@pytest.mark.parametrize(
    "pause, warm", [(0.0, False), (0.0123, False), (0.0, True)], ids=["none", "pause", "warm"]
)
def test_a_pause_leaves_the_machine_idle_right_before_every_timed_save_and_read(
    tmp_path, monkeypatch, pause, warm
):
    # --pause: each clock (the raw job's write and read, the save, the restore, the paired raw
    # read) starts after an idle pause, and the pages that part does not use (the previous
    # job's files, the dropped cache) are let go before the pause, not after it. --warm-memory
    # touches memory at the same places instead (after the pages are let go, so that it
    # takes them back; right before the clock, so that nothing lets them go again).
    import time

    from simulator.bench.runner import WARM_FACTOR

    log, real_sleep, real_write = [], time.sleep, fmt_io.raw_write
    real_save, real_warm = fmt_io.SAVERS["ckptsim"], fmt_io.warm_memory
    warmed = []

    def sleep(seconds):
        if seconds == pause:  # the pause's own sleeps only (threads may sleep too)
            log.append(("idle",))
        return real_sleep(seconds)

    def warm_memory(nbytes):
        log.append(("idle",))
        warmed.append(nbytes)
        return real_warm(nbytes)

    monkeypatch.setattr(time, "sleep", sleep)
    monkeypatch.setattr(fmt_io, "warm_memory", warm_memory)
    monkeypatch.setattr(
        fmt_io, "raw_write", lambda d, b: log.append(("write",)) or real_write(d, b)
    )
    monkeypatch.setitem(fmt_io.SAVERS, "ckptsim", lambda *a: log.append(("save",)) or real_save(*a))
    jobs = [(r, job) for r in range(2) for job in ("raw", "ckptsim")]
    _, result = _logged_bench(tmp_path, monkeypatch, jobs, log=log, pause_s=pause, warm_memory=warm)
    timed = [i for i, e in enumerate(log) if e[0] in ("write", "save", "load", "raw read")]
    # Warm-up write (untimed, no pause), then per repeat: raw write + raw read, save + restore
    # + the paired raw read: 5 clocks a repeat.
    assert len(timed) == 1 + 5 * 2
    idles = [e for e in log if e == ("idle",)]
    state_bytes = result.samples[0]["tensor_bytes"]
    assert warmed == ([int(WARM_FACTOR * state_bytes)] * 5 * 2 if warm else [])
    if not (pause or warm):
        assert idles == []
    else:
        assert len(idles) == 5 * 2
        for i in timed[1:]:
            if log[i][0] in ("write", "save"):
                assert log[i - 1] == ("idle",), log[i - 3 : i + 1]
        # Each restore and raw read: its cache drop, then the pause, then the clock (a
        # restore's fault count opens after the pause or warm-up: not the warm-up's faults).
        for i, e in enumerate(log):
            if e == ("load",):
                assert log[i - 3 : i] == [("drop",), ("idle",), ("faults",)], log[i - 4 : i + 1]
            if e[0] == "raw read":
                assert log[i + 1 : i + 3] == [("drop",), ("idle",)], log[i : i + 4]
    rows = [s for s in result.samples if s.get("bench") != "writers"]
    assert rows and all(r["pause_s"] == pause and r["warm_memory"] is warm for r in rows)
    paused = any("idle (--pause)" in n for n in result.notes)
    assert paused is bool(pause)
    assert any("let go (--warm-memory)" in n for n in result.notes) is warm


def test_the_cli_pause_times_saves_after_idle_and_says_so(tmp_path, capsys):
    # A user's run: --pause through the CLI reaches every timed job, the table notes it, and
    # the profile (--out) keeps each sample's pause.
    out = tmp_path / "profile.json"
    work = tmp_path / "w"
    work.mkdir()
    argv = ["bench", "--sizes", "300K,1M", "--formats", "ckptsim", "--repeats", "1"]
    assert main([*argv, "--dir", str(work), "--pause", "0.05", "--out", str(out)]) == 0
    table = capsys.readouterr().out
    assert "began after 0.05 s idle (--pause)" in table
    samples = CostProfile.load(out).samples
    assert samples and {s["pause_s"] for s in samples} == {0.05}
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--pause S" in text and "at most 600; a local --dir only" in text


def test_the_cli_warm_up_reaches_every_timed_job_and_says_so(tmp_path, capsys):
    # --warm-memory through the CLI: every sample records it, the table notes it, --help
    # says what it costs and that it is the opposite of --pause.
    out = tmp_path / "profile.json"
    work = tmp_path / "w"
    work.mkdir()
    argv = ["bench", "--sizes", "300K,1M", "--formats", "ckptsim", "--repeats", "1"]
    assert main([*argv, "--dir", str(work), "--warm-memory", "--out", str(out)]) == 0
    table = " ".join(capsys.readouterr().out.split())
    assert "2x the state's bytes of memory were touched and let go (--warm-memory)" in table
    samples = CostProfile.load(out).samples
    assert samples and {s["warm_memory"] for s in samples} == {True}
    with pytest.raises(SystemExit):
        main(["bench", "--help"])
    text = " ".join(capsys.readouterr().out.split())
    assert "--warm-memory the opposite of --pause" in text


def test_a_profile_without_a_fit_for_a_format_says_why_where_it_is_used(tmp_path):
    # From the new-user review: one size wrote a profile with no fit, and optimize then said
    # only "fitted: none".
    from simulator.model.checkpoint_cost import CostProfile

    one = [{"format": "ckptsim", "bytes": 10**6, "save_s": 0.01, "load_s": 0.01}] * 3
    with pytest.raises(InputError, match="measured at one size only; a fit of time against"):
        CostProfile.from_samples(one, {}).predict(params=1e9, format="ckptsim")
    flat = [
        {"format": "ckptsim", "bytes": b, "save_s": 0.01, "load_s": 0.01, "tensor_bytes": b}
        for b in (10**6, 2 * 10**6, 4 * 10**6)
    ]
    profile = CostProfile.from_samples(flat, {})
    assert "ckptsim" not in profile.fits
    assert "did not grow with size" in profile.unfitted("ckptsim")
    assert profile.unfitted("torch") == "not measured"


@pytest.mark.parametrize(
    "jobs",
    [
        ["raw", "ckptsim", "ckptsim-async"],
        ["raw", "torch", "safetensors", "dcp", "dcp-async", "ckptsim", "ckptsim-async"],
        ["raw", "torch", "torch+reduced", "ckptsim", "ckptsim+reduced", "ckptsim-async"],
    ],
    ids=["scale-report", "every-format", "reduced"],
)
def test_every_job_follows_every_job_about_equally_often(jobs):
    # A rotation of one order put the save after the raw job in two repeats of three and the
    # raw job never after itself; the save right after the raw job wrote more slowly
    # (reports/carry-over-1.2GB.md), so the save met the slower predecessor more often than
    # its baseline did.
    from collections import Counter
    from itertools import pairwise

    from simulator.bench.runner import interleaved

    repeats = 40
    run = list(interleaved(jobs, repeats))
    assert run == list(interleaved(jobs, repeats))  # the same every time
    for rep in range(repeats):  # each repeat runs every job once
        assert sorted(job for r, job in run if r == rep) == sorted(jobs)
    follows = Counter(pairwise(job for _, job in run))
    reduced = [job for job in jobs if job.endswith("+reduced")]
    for job in reduced:  # a reduced save right after its exact one, every repeat
        assert follows[(job.removesuffix("+reduced"), job)] == repeats
    firsts = [job for job in jobs if job not in reduced]  # each unit's first job ...
    lasts = [job for job in jobs if job + "+reduced" not in jobs]  # ... and its last
    even = repeats / len(firsts)
    for after in firsts:  # every job meets each job before it, itself too, as often
        for before in lasts:
            assert 0.5 * even <= follows[(before, after)] <= 1.5 * even, (before, after)


def test_the_save_phases_experiment_splits_each_timed_write_and_leaves_nothing(tmp_path, capsys):
    from experiments import save_phases
    from simulator.bench import runner
    from simulator.ckptio import write

    def patched():
        timed = (write.os, write.serialize_file, write._crc_while_flushing, write.fsync_dir)
        timed += (write._write_bytes, fmt_io.os, fmt_io.ckptio, fmt_io.raw_write)
        return [*timed, runner._measure, dict(fmt_io.SAVERS)]

    before = patched()
    work, report = tmp_path / "work", tmp_path / "phases.md"
    work.mkdir()
    argv = ["--size", "300K", "--repeats", "6", "--dir", str(work), "--no-warm-memory"]
    assert (
        save_phases.main([*argv, "--json", str(tmp_path / "rows.json"), "--report", str(report)])
        == 0
    )
    out = capsys.readouterr().out
    rows = json.loads((tmp_path / "rows.json").read_text())
    assert sorted({r["job"] for r in rows}) == ["ckptsim", "ckptsim-async", "raw"]
    assert len(rows) == 3 * 6  # the benchmark's warm-up write is not one of them
    for r in rows:  # the phases add up to the job's own clock
        phases = [r.get(k, 0.0) for k in save_phases.PHASES[r["job"]]]
        assert sum(phases) == pytest.approx(r["clock_s"], abs=1e-9)
        assert all(p >= 0 for p in phases[:-1]) and r["steal_s"] >= 0
    saves = [r for r in rows if r["job"] == "ckptsim"]
    assert all(r["serialize"] > 0 and r["tensor_fsync"] > 0 and r["small"] > 0 for r in saves)
    assert all(r["fsync"] > 0 for r in rows if r["job"] == "raw")
    assert "ckptsim save against the raw write of its repeat" in out
    assert all(line in report.read_text() for line in out.splitlines()[:-1])
    assert list(work.iterdir()) == []
    assert patched() == before  # every timer taken out again


def test_the_save_crc_experiment_times_each_way_of_taking_the_crc(tmp_path, capsys, monkeypatch):
    from experiments import save_crc
    from simulator.ckptio import layout as ckptio_layout
    from simulator.ckptio import write

    read_back, small = [], []
    real_read, real_crc = write.crc32_read, write._crc_while_flushing
    monkeypatch.setattr(write, "crc32_read", lambda *a: read_back.append(a) or real_read(*a))
    monkeypatch.setattr(write, "crc32", lambda *a: small.append(a) or ckptio_layout.crc32(*a))
    work, report = tmp_path / "work", tmp_path / "crc.md"
    work.mkdir()
    argv = ["--size", "300K", "--rounds", "6", "--dir", str(work), "--no-warm-memory"]
    assert save_crc.main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    assert len(read_back) == 1 + 6  # the read-back way only: its untimed first save, 6 rounds
    assert len(small) == 2 * (1 + 6)  # its meta and manifest; none in the no-crc way
    assert all(f"{way:9s} quartiles" in out for way in save_crc.WAYS)
    assert "raw/read-back median ratio" in out and "read-back adds to no-crc" in out
    assert all(line in report.read_text() for line in out.splitlines()[:-1])  # "wrote ..."
    assert list(work.iterdir()) == []
    assert write._crc_while_flushing is real_crc  # undone


def test_the_carry_over_experiment_times_the_save_after_each_kind_of_job(tmp_path, capsys):
    from experiments import carry_over

    work, report = tmp_path / "work", tmp_path / "carry.md"
    work.mkdir()
    argv = ["--size", "300K", "--rounds", "6", "--dir", str(work), "--no-warm-memory"]
    assert carry_over.main([*argv, "--report", str(report)]) == 0
    out = capsys.readouterr().out
    for kind in carry_over.BEFORE:
        assert f"  after {kind}: median " in out
    assert out.count("one-sided Mann-Whitney p") == 2
    assert all(line in report.read_text() for line in out.splitlines()[:-1])
    assert list(work.iterdir()) == []
    with pytest.raises(SystemExit):
        carry_over.main(["--rounds", "5", "--dir", str(tmp_path)])
    assert "at least 6" in capsys.readouterr().err
    for bad, said in (  # refused before the run, in one line, not after it with a traceback
        (["--size", "3QQ"], "unknown model size '3QQ'"),
        (["--report", str(tmp_path)], "is a folder: name a file in it"),
    ):
        with pytest.raises(SystemExit):
            carry_over.main([*bad, "--dir", str(work)])
        assert said in capsys.readouterr().err
    from experiments import save_phases

    with pytest.raises(SystemExit):
        save_phases.main(["--json", str(tmp_path / "absent" / "rows.json"), "--dir", str(work)])
    assert "no folder" in capsys.readouterr().err
    assert list(work.iterdir()) == []
