"""Which engine runs a simulation, and one entry point that runs either.

Both engines implement one model: the discrete-event simulator (``simulator.engines.des``, run by
``simulator.engines.des_replicas``) is the reference and covers every scenario field; the vectorised
engine (``simulator.engines.fast``) covers the plain case — blocking saves, unlimited spares, no
node failures or storage caps — orders of magnitude faster. ``auto`` picks the fast engine
wherever it applies; asking for it where it does not is a user's mistake, refused with the
reason. Both draw a replica's failures from the same stream (``simulator.engines.streams``) with the
same stationary-start sampler, so their means agree within Monte-Carlo error (the engine
agreement tests check this over every failure family, policy and trace replay).
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np
import pandas as pd

from simulator.engines import fast
from simulator.engines.results import SimulationResult, check_replicas
from simulator.engines.streams import run_seed
from simulator.errors import InputError
from simulator.model.scenario import Scenario
from simulator.policies import Policy, make_policy

__all__ = ["ENGINES", "choose_engine", "fast_refusal", "simulate"]

ENGINES = ("auto", "des", "fast")
HOUR = 3600.0


def fast_refusal(scenario: Scenario) -> str | None:
    """Why the fast engine cannot run ``scenario`` (None when it can)."""
    extra = fast.unmodelled_fields(scenario)
    if extra:
        return "the fast engine does not model " + ", ".join(extra) + "; use the DES (--engine des)"
    if not scenario.has_mtbf:
        return "the fast engine needs a failure rate (mtbf_h, or gpus and gpu_mtbf_h)"
    return None


def choose_engine(scenario: Scenario, engine: str = "auto", policies: Iterable = ()) -> str:
    """``des`` or ``fast``: the fast engine where it applies under ``auto``, else the DES.

    ``policies``: what will run; one that learns from the failures it meets (the controller's)
    needs the DES."""
    if engine not in ENGINES:
        raise InputError(f"engine must be auto, des or fast, got {engine!r}")
    why = fast_refusal(scenario)
    learner = next((p for p in policies if getattr(p, "learns", False)), None)
    if why is None and learner is not None:
        why = (
            f"the {learner.name} policy learns from the failures a replica meets, which the "
            "fast engine (one interval per age, drawn up front) cannot feed it; use the DES "
            "(--engine des)"
        )
    if engine == "fast" and why is not None:
        raise InputError(why)
    if engine == "auto":
        return "des" if why is not None else "fast"
    return engine


def _fast_records(scenario: Scenario, res: fast.FastResult) -> pd.DataFrame:
    a = {k: v[0] for k, v in res.arrays.items()}
    rec = pd.DataFrame(
        {
            "wall_h": a["wall_s"] / HOUR,
            "useful_h": a["useful_s"] / HOUR,
            "lost_h": a["lost_s"] / HOUR,
            "checkpoint_h": a["checkpoint_s"] / HOUR,
            "recovery_h": a["recovery_s"] / HOUR,
            "spare_wait_h": 0.0,  # unlimited spares: nobody waits
            "waste_fraction": 1.0 - a["useful_s"] / a["wall_s"],
            "failures": a["failures"].astype(np.int64),
            "checkpoints": a["checkpoints"].astype(np.int64),
        }
    )
    if scenario.usd_per_gpu_hour is not None and scenario.gpus is not None:
        rec["usd"] = a["cost_usd"]
    return rec


def simulate(
    scenario: Scenario,
    policy: Policy | str,
    *,
    replicas: int,
    seed: int | None,
    engine: str = "auto",
    workers: int | None = None,
    progress: bool = True,
    failure_times=None,
) -> SimulationResult:
    """``replicas`` replicas on the chosen engine; ``meta["engine"]`` says which ran."""
    policy = make_policy(policy) if isinstance(policy, str) else policy
    which = choose_engine(scenario, engine, [policy])
    if which == "des":
        from simulator.engines import des_replicas  # SimPy: imported only when the DES runs

        result = des_replicas.simulate(
            scenario,
            policy,
            replicas=replicas,
            seed=seed,
            workers=workers,
            progress=progress,
            failure_times=failure_times,
        )
        return result
    replicas = check_replicas(replicas)
    seed = run_seed(seed)
    res = fast.simulate_policies(
        scenario, [policy], replicas=replicas, seed=seed, failure_times=failure_times
    )
    return SimulationResult.of_run(
        _fast_records(scenario, res),
        scenario=scenario,
        policy=policy,
        seed=seed,
        trace=failure_times is not None,
        engine="fast",
    )
