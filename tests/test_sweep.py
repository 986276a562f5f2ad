"""Sweeps: one tidy table, the same numbers wherever the points run."""

from __future__ import annotations

import re

import pandas as pd
import pytest

from simulator import sweep
from simulator.cli import main
from simulator.model.scenario import Scenario

BASE = Scenario(
    gpus=512,
    gpu_mtbf_h=2000.0,
    checkpoint_s=60.0,
    restart_s=300.0,
    work_h=48.0,
    usd_per_gpu_hour=2.0,
)
AXES = {"gpus": [256, 1024], "checkpoint_s": [30.0, 120.0]}
POLICIES = ("young", "fixed:3600")


def _numbers(df):
    return df.sort_values(["point", "policy"]).reset_index(drop=True)


def test_sweep_gives_identical_numbers_in_process_in_a_pool_and_on_dask():
    from dask.distributed import Client, LocalCluster

    inline = sweep.run_sweep(
        BASE, AXES, policies=POLICIES, replicas=20, seed=9, workers=1, progress=False
    )
    pool = sweep.run_sweep(
        BASE, AXES, policies=POLICIES, replicas=20, seed=9, workers=2, progress=False
    )
    with (
        LocalCluster(
            processes=False, n_workers=1, threads_per_worker=2, dashboard_address=":0"
        ) as cluster,
        Client(cluster) as client,
    ):
        dask = sweep.run_sweep(
            BASE, AXES, policies=POLICIES, replicas=20, seed=9, dask_client=client, progress=False
        )
    pd.testing.assert_frame_equal(_numbers(inline), _numbers(pool))
    pd.testing.assert_frame_equal(_numbers(inline), _numbers(dask))
    assert len(inline) == 4 * len(POLICIES)


def test_sweep_table_is_tidy_and_round_trips_parquet_and_csv(tmp_path):
    df = sweep.run_sweep(
        BASE, AXES, policies=POLICIES, replicas=10, seed=1, workers=1, progress=False
    )
    assert set(df.columns) >= {
        "gpus",
        "checkpoint_s",
        "policy",
        "interval_s",
        "waste",
        "waste_lo",
        "waste_hi",
        "cost_usd",
    }
    # More GPUs at the same per-GPU MTBF fail more often: the waste must grow.
    young = df[(df.policy == "young") & (df.checkpoint_s == 30.0)].set_index("gpus")
    assert young.loc[1024, "waste"] > young.loc[256, "waste"]
    for name in ("t.parquet", "t.csv"):
        path = sweep.save_table(df, tmp_path / name)
        back = pd.read_parquet(path) if name.endswith("parquet") else pd.read_csv(path)
        pd.testing.assert_frame_equal(back, df, check_dtype=False)


def test_points_draw_seeds_by_index_not_by_worker():
    a = sweep.grid_points(AXES, seed=3)
    b = sweep.grid_points(AXES, seed=3)
    assert [p.seed.spawn_key for p in a] == [p.seed.spawn_key for p in b]
    assert len({p.seed.spawn_key for p in a}) == len(a)


@pytest.mark.parametrize(
    "argv",
    [
        ["sweep", "--vary", "gpus=a,b"],
        ["sweep", "--vary", "nonsense=1"],
        ["sweep", "--policies", "sometimes"],
        ["sweep", "--vary", "gpus=log:0:10:3"],
        ["sweep", "--replicas", "0"],
    ],
)
def test_cli_sweep_bad_input_is_one_line_and_exit_2(argv, capsys):
    with pytest.raises(SystemExit) as exc:
        raise SystemExit(main(argv))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "error" in err


def test_cli_sweep_prints_intervals_in_minutes_and_costs_in_dollars(capsys):
    job = "--gpus 1024 --mtbf-h 50000 --checkpoint-s 60 --restart-s 300 --work-h 24"
    argv = ["sweep", *job.split(), "--usd-per-gpu-hour", "2", "--vary", "gpus=1024,4096"]
    argv += ["--policies", "daly,fixed:3600", "--replicas", "5"]
    assert main(argv) == 0
    out = capsys.readouterr().out
    assert "e+0" not in out
    rows = [line.split() for line in out.splitlines()[1:] if "fixed" in line]
    assert rows and all("1.00 h" in " ".join(r) for r in rows)
    assert all(re.fullmatch(r"\$\d{1,3}(,\d{3})*", r[-1]) for r in rows)
