"""Monte-Carlo replicas of the discrete-event model, reproducible from one seed.

Replica ``i`` draws from the streams ``simulator.engines.streams`` derives from the seed (the rule
the fast engine follows too), so the answer is the same on one core or many, and
with any chunking of replicas across worker processes. Inside a replica, GPU failures, node
failures and everything else (repair times) draw from separate child streams: the failure
times of replica ``i`` do not depend on the policy, so two policies compared with the same
seed face exactly the same failures (common random numbers), and their difference has far
less noise than either estimate.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np
import pandas as pd

from simulator.engines.des import ClusterJob, failure_source_for
from simulator.engines.results import SimulationResult, check_replicas, is_part
from simulator.engines.streams import replica_seed, replica_streams, run_seed
from simulator.engines.workers import run_tasks, worker_count
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.model.trace import TraceFailures
from simulator.policies import Policy, make_policy

__all__ = ["replica_seed", "run_replica", "simulate"]

HOUR = 3600.0

FailureTimes = Sequence[float] | np.ndarray | Callable[[np.random.Generator], np.ndarray]
"""A trace for every replica: sorted timestamps (s), or a function of the replica's rng."""


def _as_policy(policy: Policy | str) -> Policy:
    return make_policy(policy) if isinstance(policy, str) else policy


def run_replica(
    scenario: Scenario,
    policy: Policy | str,
    rng_or_seed,
    *,
    failure_times: FailureTimes | None = None,
) -> dict:
    """Simulate one job to completion; the record (hours, counts, US dollars) as a dict."""
    gpu_rng, node_rng, other_rng = replica_streams(rng_or_seed)
    if scenario.tiers or scenario.failure_classes:
        from simulator.engines.des_tiers import run_tiered

        streams = (gpu_rng, node_rng, other_rng)
        raw = run_tiered(scenario, policy, rng_or_seed, streams, failure_times)
    elif failure_times is None:
        source = failure_source_for(scenario, gpu_rng, node_rng)
    else:
        times = failure_times(gpu_rng) if callable(failure_times) else failure_times
        source = TraceFailures(times)
    if not (scenario.tiers or scenario.failure_classes):
        raw = ClusterJob(scenario, _as_policy(policy), source, other_rng).run()
    record = {
        "wall_h": raw["wall_s"] / HOUR,
        "useful_h": raw["useful_s"] / HOUR,
        "lost_h": raw["lost_s"] / HOUR,
        "checkpoint_h": raw["checkpoint_s"] / HOUR,
        "recovery_h": raw["recovery_s"] / HOUR,
        "spare_wait_h": raw["spare_wait_s"] / HOUR,
        "waste_fraction": 1.0 - raw["useful_s"] / raw["wall_s"],
        "failures": raw["failures"],
        "checkpoints": raw["checkpoints"],
        "failures_in_recovery": raw["failures_in_recovery"],
        "events": raw["events"],
    }
    # Per-class failures, lost work and recovery, per-tier saves and restores of a tiered
    # scenario (the raw times in seconds, the record's in hours as everywhere).
    for key, value in raw.items():
        if is_part(key):
            if key.endswith("_s"):
                record[key[:-2] + "_h"] = value / HOUR
            else:
                record[key] = value
    if scenario.usd_per_gpu_hour is not None and scenario.gpus is not None:
        record["usd"] = record["wall_h"] * scenario.gpus * scenario.usd_per_gpu_hour
    return record


def _run_chunk(task) -> list[tuple[int, dict]]:
    scenario, policy, seed, indices, failure_times = task
    return [
        (i, run_replica(scenario, policy, replica_seed(seed, i), failure_times=failure_times))
        for i in indices
    ]


def _progress(total: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, unit="replica", desc="simulate", disable=not enabled, leave=False)


def simulate(
    scenario: Scenario,
    policy: Policy | str,
    *,
    replicas: int,
    seed: int | None,
    workers: int | None = None,
    progress: bool = True,
    failure_times: FailureTimes | None = None,
) -> SimulationResult:
    """Run ``replicas`` independent replicas (in ``workers`` processes; None: all cores).

    ``workers`` is capped at the cores available (``simulator.engines.workers.worker_count``).
    ``failure_times`` replays a trace instead of the scenario's failure model; a callable
    gets each replica's failure stream (e.g. to pick a random subset of a real cluster) and
    must be picklable when ``workers`` > 1.
    """
    replicas = check_replicas(replicas)
    seed = run_seed(seed)
    policy = _as_policy(policy)
    if workers is not None and int(workers) < 1:
        raise InputError(f"workers must be a positive whole number, got {workers!r}")
    workers = worker_count(workers, replicas)
    rows: dict[int, dict] = {}
    with _progress(replicas, progress and replicas > 1) as bar:
        if workers == 1 or replicas == 1:
            for i in range(replicas):
                rows[i] = run_replica(
                    scenario, policy, replica_seed(seed, i), failure_times=failure_times
                )
                bar.update(1)
        else:
            # Several chunks per worker keep both cores busy and the bar moving.
            chunks = np.array_split(np.arange(replicas), min(replicas, workers * 8))
            tasks = [(scenario, policy, seed, c.tolist(), failure_times) for c in chunks if c.size]
            # Ctrl-C or a failing replica kills the workers at once (simulator.engines.workers).
            for done in run_tasks(_run_chunk, tasks, workers, ordered=False):
                rows.update(done)
                bar.update(len(done))
    records = pd.DataFrame([rows[i] for i in range(replicas)])
    return SimulationResult.of_run(
        records,
        scenario=scenario,
        policy=policy,
        seed=seed,
        trace=failure_times is not None,
        engine="des",
    )
