"""Goal check — 1,000 scenario points × 100 replicas: how long, and Dask gives the same table.

The grid varies cluster size, per-GPU MTBF, checkpoint cost, restart cost and price
(5 × 5 × 5 × 4 × 2 = 1,000 points) around the Llama-3 preset, with 30 days of work, and runs
Young, Daly, the exact optimum and hourly at every point (4,000 rows). It runs once in a
local process pool and once on a ``dask.distributed.LocalCluster`` with the same number of
worker processes; the two tables must be identical.
"""

from __future__ import annotations

import os
import time

import pandas as pd

from experiments._report import REPORTS, Report
from simulator.model.scenario import load_scenario
from simulator.sweep import run_sweep, save_table

AXES = {
    "gpus": [1024, 2048, 4096, 8192, 16384],
    "gpu_mtbf_h": [12500.0, 25000.0, 50000.0, 100000.0, 200000.0],
    "checkpoint_s": [15.0, 30.0, 60.0, 120.0, 300.0],
    "restart_s": [300.0, 600.0, 1200.0, 2400.0],
    "usd_per_gpu_hour": [2.0, 4.0],
}
REPLICAS = 100
SEED = 1000


def main() -> None:
    from dask.distributed import Client, LocalCluster

    rep = Report("sweep_benchmark", "Sweep benchmark: 1,000 points × 100 replicas, local and Dask")
    base = load_scenario("llama3").with_overrides(work_h=720.0)
    workers = os.cpu_count() or 1
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    local = run_sweep(base, AXES, replicas=REPLICAS, seed=SEED, workers=workers, progress=False)
    t_local = time.perf_counter() - t0
    with (
        LocalCluster(
            n_workers=workers, threads_per_worker=1, processes=True, dashboard_address=None
        ) as cluster,
        Client(cluster) as client,
    ):
        t0 = time.perf_counter()
        dask = run_sweep(
            base, AXES, replicas=REPLICAS, seed=SEED, dask_client=client, progress=False
        )
        t_dask = time.perf_counter() - t0
    load_after = os.getloadavg()[0]
    key = ["point", "policy"]
    a = local.sort_values(key).reset_index(drop=True)
    b = dask.sort_values(key).reset_index(drop=True)
    identical = a.equals(b)
    points = local["point"].nunique()
    path = save_table(local, REPORTS / "data" / "sweep-benchmark.parquet")
    best = (local.groupby("policy")["waste"].mean()).to_dict()
    rep.add(f"""
Grid: {" × ".join(f"{k} ({len(v)})" for k, v in AXES.items())} = {points:,} points, each
running {local["policy"].nunique()} policies on the same {REPLICAS} replicas (fast engine,
per-point seeds from one SeedSequence({SEED})): {len(local):,} rows, saved to
``{path.relative_to(REPORTS.parent)}``.

| run | workers | wall time (s) | points per second |
|---|---|---|---|
| local process pool | {workers} | {t_local:.1f} | {points / t_local:.2f} |
| Dask LocalCluster | {workers} | {t_dask:.1f} | {points / t_dask:.2f} |

The machine is shared: its 1-minute load average was {load_before:.1f} before and
{load_after:.1f} after the runs (on {workers} cores), so these times are upper bounds.

**Identical tables locally and on Dask: {identical}** (``DataFrame.equals`` after sorting by
point and policy).

Mean waste over the grid by policy: {", ".join(f"{k} {v:.4f}" for k, v in best.items())}.
""")
    rep.write()
    if not identical:
        raise SystemExit("local and Dask sweeps differ")


if __name__ == "__main__":
    pd.set_option("display.width", 120)
    main()
