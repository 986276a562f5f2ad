"""What the simulator predicts for a crash-test job, from parameters measured on this machine.

The machine is described to the simulator as a ``Scenario`` — one component whose failures
stop the job (the injector's clock: MTBF, family), the save stall δ, the restart cost R (kill to
training again), and the work (useful steps × measured seconds per step) — and each policy as
the ``simulator.policies`` object the simulator runs (a step-count default becomes a fixed
interval of steps × step time). Two predictions:

- ``replay``: the discrete-event model driven by the very kill times the job met (H3's
  ``run_replica`` with ``failure_times``): a per-run prediction;
- ``expected``: the Monte-Carlo distribution over the failure clock (``simulate``): what a
  user would be told before running anything.

The simulated job starts at work; the measured first start-up (process start, imports) is
added to every prediction, since wall time is measured from the first launch.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from simulator import policies
from simulator.engines.des_replicas import run_replica, simulate
from simulator.model.scenario import Scenario

__all__ = ["MachineParams", "des_policy", "expected_wall_s", "replay_wall_s", "scenario_for"]


@dataclass(frozen=True, kw_only=True)
class MachineParams:
    """What was measured about this machine and the failure clock, seconds."""

    step_s: float
    """Compute per useful step."""
    save_s: float
    """Training stall of one save (δ)."""
    restart_s: float
    """Kill until training again (R): restart delay + process start + checkpoint load."""
    startup_s: float
    """First launch until training (added to the simulated wall time)."""
    mtbf_s: float
    """Mean of the injector's lifetime clock."""
    weibull_shape: float | None = None
    """Shape of a Weibull clock (None: exponential)."""


def scenario_for(p: MachineParams, steps: int) -> Scenario:
    family = "exponential" if p.weibull_shape is None else f"weibull:shape={p.weibull_shape:g}"
    return Scenario(
        name="closed-loop",
        failure=family,
        mtbf_h=p.mtbf_s / 3600.0,
        checkpoint_s=p.save_s,
        restart_s=p.restart_s,
        work_h=steps * p.step_s / 3600.0,
        # The injector gives each launch a fresh lifetime: a renewal process from a new part.
        component_age="new",
    )


def des_policy(spec: dict, step_s: float):
    """The simulator's policy object for a ``train_gpt`` policy spec."""
    kind = spec["kind"]
    if kind == "fixed":
        return policies.FixedInterval(float(spec["interval_s"]))
    if kind == "steps":
        return policies.FixedInterval(int(spec["every"]) * step_s)
    if kind == "optimal":
        return policies.ExactOptimal()
    if kind == "adaptive":
        return policies.Adaptive()
    raise ValueError(f"unknown policy kind {kind!r}")


def replay_wall_s(p: MachineParams, steps: int, spec: dict, kill_times_s) -> float:
    """Simulated wall time of one run that met failures at ``kill_times_s`` (s after start)."""
    scenario = scenario_for(p, steps)
    record = run_replica(
        scenario, des_policy(spec, p.step_s), 0, failure_times=np.asarray(kill_times_s, float)
    )
    return p.startup_s + record["wall_h"] * 3600.0


def expected_wall_s(
    p: MachineParams, steps: int, spec: dict, *, replicas: int = 2000, seed: int = 0
) -> tuple[float, float]:
    """(mean, standard deviation) of the wall time over the failure clock, by Monte Carlo."""
    scenario = scenario_for(p, steps)
    result = simulate(
        scenario, des_policy(spec, p.step_s), replicas=replicas, seed=seed, workers=1,
        progress=False,
    )  # fmt: skip
    wall = result.records["wall_h"].to_numpy() * 3600.0
    return p.startup_s + float(wall.mean()), float(wall.std(ddof=1)) if wall.size > 1 else math.nan
