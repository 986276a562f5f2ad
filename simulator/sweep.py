"""Sweeps: the same question asked over a grid of scenarios, answered as one tidy table.

A sweep takes a base scenario and, for some of its fields (cluster size, MTBF, checkpoint
cost, restart cost, price …), a list of values; every combination is a *point*. At each
point every policy runs on the same replicas (common random numbers), and the answer is one
row per (point, policy) in a pandas DataFrame, saved as Parquet or CSV.

Reproducibility does not depend on where a point runs: point i draws its failures from the
i-th child of one ``numpy.random.SeedSequence(seed)``, so a sweep gives the same numbers in
one process, in a local process pool, or on a Dask cluster (``dask.distributed``), whatever
the number or order of workers.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.engines import fast
from simulator.engines.results import check_replicas, mean_ci
from simulator.engines.streams import run_seed
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.optimize import _first_interval, evaluate
from simulator.policies import FixedInterval, Policy, make_policy

__all__ = [
    "DEFAULT_POLICIES",
    "SweepPoint",
    "grid_points",
    "parse_policy",
    "run_point",
    "run_sweep",
    "save_table",
]

DEFAULT_POLICIES = ("young", "daly", "optimal", "fixed:3600")


def parse_policy(spec: str) -> Policy:
    """``young`` | ``daly`` | ``optimal`` | ``adaptive`` | ``fixed:SECONDS``."""
    name, _, arg = spec.partition(":")
    if name == "fixed":
        try:
            return FixedInterval(float(arg))
        except ValueError:
            raise InputError(f"policy {spec!r}: fixed needs seconds, e.g. fixed:3600") from None
    if arg:
        raise InputError(f"policy {spec!r} takes no parameter")
    return make_policy(name)


@dataclass(frozen=True)
class SweepPoint:
    """One scenario of the grid: its index (which fixes its seed) and its field values."""

    index: int
    overrides: dict
    seed: np.random.SeedSequence


def grid_points(axes: Mapping[str, Sequence], seed: int = 0) -> list[SweepPoint]:
    """The Cartesian product of ``axes`` (field -> values), each with its own child seed."""
    if not axes:
        combos: list[tuple] = [()]
    else:
        for k, v in axes.items():
            if len(v) == 0:
                raise InputError(f"sweep axis {k} has no values")
        combos = list(itertools.product(*axes.values()))
    seeds = np.random.SeedSequence(seed).spawn(len(combos))
    keys = list(axes)
    return [
        SweepPoint(index=i, overrides=dict(zip(keys, c, strict=True)), seed=s)
        for i, (c, s) in enumerate(zip(combos, seeds, strict=True))
    ]


def run_point(
    base: Scenario,
    point: SweepPoint,
    policies: Sequence[str],
    replicas: int,
    engine: str = "auto",
    level: float = 0.95,
) -> list[dict]:
    """Rows (one per policy) for one grid point; pure, so any worker can run it."""
    scenario = base.with_overrides(**point.overrides)
    pols = [parse_policy(p) for p in policies]
    out = evaluate(scenario, pols, replicas=replicas, seed=point.seed, engine=engine)
    rows = []
    for i, (spec, pol) in enumerate(zip(policies, pols, strict=True)):
        wall = out["wall_s"][i]
        waste = 1.0 - out["useful_s"][i] / wall
        w_m, w_lo, w_hi = mean_ci(waste, level)
        c_m, c_lo, c_hi = mean_ci(out["cost_usd"][i], level)
        row = dict(point=point.index, **point.overrides)
        row.update(
            policy=spec,
            interval_s=_first_interval(pol, scenario),
            system_mtbf_h=scenario.system_mtbf_s / 3600.0,
            replicas=replicas,
            wall_h=float(wall.mean() / 3600.0),
            waste=w_m,
            waste_lo=w_lo,
            waste_hi=w_hi,
            cost_usd=c_m,
            cost_usd_lo=c_lo,
            cost_usd_hi=c_hi,
            lost_h=float(out["lost_s"][i].mean() / 3600.0),
            checkpoint_h=float(out["checkpoint_s"][i].mean() / 3600.0),
            recovery_h=float(out["recovery_s"][i].mean() / 3600.0),
            failures=float(out["failures"][i].mean()),
        )
        rows.append(row)
    return rows


def _run_task(args):
    return run_point(*args)


def _run_chunk(chunk):
    return [run_point(*args) for args in chunk]


def run_sweep(
    base: Scenario,
    axes: Mapping[str, Sequence],
    *,
    policies: Sequence[str] = DEFAULT_POLICIES,
    replicas: int = 100,
    seed: int = 0,
    workers: int | None = None,
    dask_scheduler: str | None = None,
    dask_client=None,
    engine: str = "auto",
    progress: bool = True,
):
    """Run every point of the grid; a DataFrame with one row per (point, policy).

    Points run in a local process pool (``workers``, default all cores; 1 runs inline), or on
    a Dask cluster given by ``dask_scheduler`` (an address) or an existing ``dask_client``.
    """
    import pandas as pd

    replicas = check_replicas(replicas)
    if seed is None:
        raise InputError("a sweep needs a seed (its points' streams derive from it)")
    seed = run_seed(seed)
    for p in policies:
        parse_policy(p)  # fail fast on a bad spec, before any worker starts
    points = grid_points(axes, seed)
    for pt in points:  # validate every combination up front: one line, not a worker traceback
        base.with_overrides(**pt.overrides)
    tasks = [(base, pt, tuple(policies), replicas, engine) for pt in points]
    if dask_scheduler is not None or dask_client is not None:
        results = _run_dask(tasks, dask_scheduler, dask_client, progress)
    else:
        results = _run_local(tasks, workers, progress)
    rows = [row for rs in results for row in rs]
    return pd.DataFrame(rows)


def _bar(total: int, progress: bool, desc: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=desc, unit="point", disable=not progress, leave=False)


def _run_local(tasks, workers, progress):
    from simulator.engines.workers import run_tasks, worker_count

    workers = worker_count(workers, len(tasks))
    results = []
    with _bar(len(tasks), progress, "sweep") as bar:
        if workers == 1:
            for t in tasks:
                results.append(_run_task(t))
                bar.update()
            return results
        chunk = max(1, len(tasks) // (workers * 8))
        # Ctrl-C or a failing point kills the workers at once (simulator.engines.workers).
        for r in run_tasks(_run_task, tasks, workers, chunksize=chunk):
            results.append(r)
            bar.update()
    return results


def _run_dask(tasks, address, client, progress):
    try:
        from dask.distributed import Client, as_completed
    except ImportError:  # pragma: no cover - depends on the environment
        raise InputError(
            "--dask-scheduler needs dask[distributed] (pip install ckptsim[dask])"
        ) from None
    own = client is None
    if own:
        try:
            client = Client(address, timeout="10s")
        except (OSError, ValueError, TypeError) as exc:
            raise InputError(f"cannot reach the Dask scheduler at {address}: {exc}") from None
    try:
        # A few chunks per worker thread: per-task scheduling overhead would otherwise
        # rival the work of a fast-engine point.
        threads = max(1, sum(client.nthreads().values()))
        size = max(1, len(tasks) // (threads * 8))
        chunks = [tasks[i : i + size] for i in range(0, len(tasks), size)]
        futures = client.map(_run_chunk, chunks, pure=False)
        index = {f.key: i for i, f in enumerate(futures)}
        results = [None] * len(chunks)
        try:
            with _bar(len(tasks), progress, "sweep (dask)") as bar:
                for fut in as_completed(futures):
                    i = index[fut.key]
                    results[i] = fut.result()
                    bar.update(len(chunks[i]))
        except BaseException:
            client.cancel(futures)  # Ctrl-C: the cluster stops working on this sweep too
            raise
        return [r for chunk in results for r in chunk]
    finally:
        if own:
            client.close()


TABLE_SUFFIXES = (".parquet", ".csv")
"""Extensions ``save_table`` writes."""


def save_table(df, path: str | Path) -> Path:
    """Write ``df`` as Parquet (``.parquet``) or CSV (``.csv``), replacing any old file in one
    step (``simulator.outfile.write_atomic``)."""
    from simulator.outfile import check_output, write_atomic

    path = check_output(path, suffixes=TABLE_SUFFIXES)
    if path.suffix.lower() == ".parquet":
        try:
            import pyarrow  # noqa: F401
        except ImportError:
            raise InputError(
                "Parquet output needs pyarrow (pip install ckptsim[parquet])"
            ) from None
        return write_atomic(path, lambda tmp: df.to_parquet(tmp, index=False))
    return write_atomic(path, lambda tmp: df.to_csv(tmp, index=False))


def engine_for(base: Scenario) -> str:
    """The engine a sweep over ``base`` uses by default (for reports)."""
    return "fast" if fast.fast_supported(base) else "des"


# -- the optimum across scenarios ---------------------------------------------------------
def _search(scenario: Scenario, replicas: int, seed, bootstrap: int):
    from simulator import analytic
    from simulator.optimize import optimize_parameter, search_bounds

    anchor = float(analytic.optimal_interval(scenario.save_stall_s, scenario.system_mtbf_s))
    bounds = search_bounds(scenario)
    return anchor, optimize_parameter(
        scenario, FixedInterval, bounds, replicas=replicas, seed=seed, bootstrap=bootstrap
    )


def optimum_table(
    base: Scenario,
    field: str,
    values: Sequence,
    *,
    replicas: int = 100,
    seed: int = 0,
    bootstrap: int = 100,
    progress: bool = False,
):
    """The simulated optimum interval (with its CI) at each value of one scenario field."""
    import pandas as pd

    rows = []
    seeds = fast.replica_seeds(seed, len(values))
    with _bar(len(values), progress, f"optimum over {field}") as bar:
        for v, ss in zip(values, seeds, strict=True):
            sc = base.with_overrides(**{field: v})
            anchor, opt = _search(sc, replicas, ss, bootstrap)
            rows.append(
                {
                    field: v,
                    "system_mtbf_h": sc.system_mtbf_s / 3600.0,
                    "interval_s": opt.value,
                    "interval_s_lo": opt.ci[0],
                    "interval_s_hi": opt.ci[1],
                    "exact_exponential_s": anchor,
                    "replicas": replicas,
                }
            )
            bar.update()
    return pd.DataFrame(rows)


SENSITIVITY_INPUTS = ("gpus", "mtbf", "checkpoint_s", "restart_s", "usd_per_gpu_hour")


def sensitivity(
    base: Scenario,
    *,
    factor: float = 2.0,
    inputs: Sequence[str] = SENSITIVITY_INPUTS,
    replicas: int = 100,
    seed: int = 0,
    bootstrap: int = 50,
    progress: bool = False,
):
    """The optimum with each input divided and multiplied by ``factor`` (others at base).

    ``mtbf`` scales whichever MTBF the scenario gives (per GPU or per job). Returns the
    base optimum and a DataFrame (input, low_value, high_value, low_s, high_s) for
    ``plots.tornado``. Every run reuses the same seeds, so the bars differ by the input only.
    """
    import pandas as pd

    if not (factor > 1.0 and math.isfinite(factor)):
        raise InputError(f"sensitivity factor must be a ratio > 1, got {factor!r}")
    _, base_opt = _search(base, replicas, seed, bootstrap)
    rows = []
    with _bar(len(inputs), progress, "sensitivity") as bar:
        for name in inputs:
            field = name
            if name == "mtbf":
                field = "gpu_mtbf_h" if base.gpu_mtbf_h is not None else "mtbf_h"
            value = getattr(base, field)
            if value is None:
                raise InputError(f"sensitivity to {field} needs the scenario to set it")
            out = {"input": field}
            for side, v in (("low", value / factor), ("high", value * factor)):
                if field == "gpus":
                    v = max(round(float(v)), base.gpus_per_node)
                _, opt = _search(base.with_overrides(**{field: v}), replicas, seed, bootstrap)
                out[f"{side}_value"] = v
                out[f"{side}_s"] = opt.value
            rows.append(out)
            bar.update()
    return base_opt.value, pd.DataFrame(rows)
