"""What the tiered simulator predicts for a crash-test job with failure classes and tiers.

The machine is described to ``simulator.engines.des_tiers`` as a ``Scenario`` with
``[[failure_class]]`` and ``[[tier]]`` tables, from what the runs measured:

- classes ``process`` and ``node`` (a SIGKILL; the node loss also wipes the local tier),
  ``hang`` (its detection is the measured time from the SIGSTOP to the process gone: the
  supervisor's timeout) and ``preemption``; each with its measured restart (process gone to
  training again, the restore included) and its rate on the injector's clock;
- tiers ``local`` (surviving process failures, hangs and preemptions: the host stays) and
  ``persistent`` (surviving every class), each with its measured save stall. A single-tier
  policy has the persistent tier only.

A preemption whose save commits within the grace period loses no work: it is the model's
just-in-time save (a ``jit`` tier surviving preemptions, its write the measured time from the
SIGTERM to the process gone, paid in the recovery). A preemption whose save cannot commit in
time is killed at the end of the grace period: an ordinary failure whose detection is the
grace period.

A committed preemption save is written to a real tier (``into`` of the model's ``jit``
tier: the local one when the persistent save does not fit the grace period, as the
controller chooses), so later failures that tier survives roll back to it. After a restart
each tier counts from ``tiers.interval_origin``, the rule the live controller follows too.
The simulator runs the job as it is; nothing of the controller is copied here.

Two predictions, as in ``predict``: ``replay`` drives the model with the very failures (time
and class) a run met; ``expected`` is the Monte-Carlo mean over the clock. Both add the
measured first start-up (the simulated job starts at work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator.controller.tier_schedule import LOCAL, PERSISTENT
from simulator.engines.des_tiers import TieredClusterJob, class_sources, run_tiered
from simulator.engines.streams import replica_streams
from simulator.model.scenario import Scenario
from simulator.model.tiers import FailureClass, Tier, TierSchedule
from simulator.model.trace import ClassTrace

__all__ = [
    "CLASS_ORDER",
    "LOCAL_SURVIVES",
    "TierParams",
    "expected_wall_s",
    "replay_wall_s",
    "scenario_for",
]

CLASS_ORDER = ("process", "node", "hang", "preemption")
LOCAL_SURVIVES = ("process", "hang", "preemption")
"""What the local tier (host memory) outlives: every class but the loss of the node."""
_JIT = "preemption-save"


@dataclass(frozen=True, kw_only=True)
class TierParams:
    """What was measured about the machine, the tiers and the failure clock, seconds."""

    step_s: float
    local_s: float
    """Training stall of a save to the local tier."""
    persistent_s: float
    """Training stall of a save to the persistent tier."""
    startup_s: float
    restart_s: dict = field(default_factory=dict)
    """Class -> process gone until training again (restart, imports, restore)."""
    gone_s: dict = field(default_factory=dict)
    """Class -> failure until the process is gone (a hang's timeout; a preemption's save and
    exit, or its grace period when it was killed)."""
    mtbf_s: dict = field(default_factory=dict)
    """Class -> mean time between its failures on the injector's clock."""
    preempt_commits: bool = True
    """Whether this policy's preemption saves commit (False: killed at the grace period)."""


def scenario_for(p: TierParams, steps: int, tiers: bool, into: str = PERSISTENT) -> Scenario:
    """The run as the tiered model sees it; ``tiers``: a local tier beside the persistent;
    ``into``: the tier a committed preemption save is written to (later failures that tier
    survives roll back to it)."""
    classes = []
    for name in CLASS_ORDER:
        if name not in p.mtbf_s:
            continue
        gone = p.gone_s.get(name, 0.0)
        jit = name == "preemption" and p.preempt_commits
        classes.append(
            FailureClass(
                name=name,
                mtbf_h=p.mtbf_s[name] / 3600.0,
                detection_s=0.0 if jit else gone,
                restart_s=p.restart_s[name],
                nodes_lost=1 if name == "node" else 0,
            )
        )
    names = {c.name for c in classes}
    made = [Tier(name=PERSISTENT, survives=frozenset(names), checkpoint_s=p.persistent_s)]
    if tiers:
        survive = frozenset(LOCAL_SURVIVES) & names
        made.insert(0, Tier(name=LOCAL, survives=survive, checkpoint_s=p.local_s))
    if "preemption" in names and p.preempt_commits:
        made.append(
            Tier(
                name=_JIT,
                survives=frozenset({"preemption"}),
                checkpoint_s=max(p.gone_s.get("preemption", 0.0), 1e-6),
                jit=True,
                into=into,
            )
        )
    return Scenario(
        name="closed-loop tiers",
        restart_s=p.restart_s.get("process", 0.0),
        work_h=steps * p.step_s / 3600.0,
        component_age="new",  # the injector gives each launch a fresh lifetime
        tiers=tuple(made),
        failure_classes=tuple(classes),
    )


def _target(p: TierParams, tiers: bool, grace_s: float | None) -> str:
    """Where the controller puts a preemption save: the local tier when the persistent save
    does not fit the grace period (``tiered._preemption_tier``'s rule)."""
    if tiers and grace_s is not None and p.persistent_s > grace_s:
        return LOCAL
    return PERSISTENT


def replay_wall_s(
    p: TierParams,
    steps: int,
    intervals_s: dict,
    failures: list[tuple[float, str]],
    *,
    grace_s: float | None,
) -> float:
    """Simulated wall time of one run that met ``failures`` (time after start, class)."""
    tiers = LOCAL in intervals_s
    scenario = scenario_for(p, steps, tiers, _target(p, tiers, grace_s))
    trace = ClassTrace(
        times_s=np.asarray([t for t, _ in failures], dtype=float),
        classes=np.asarray([c for _, c in failures], dtype=object),
    )
    schedule = TierSchedule(dict(intervals_s))
    return p.startup_s + run_tiered(scenario, schedule, 0, replica_streams(0), trace)["wall_s"]


def expected_wall_s(
    p: TierParams,
    steps: int,
    intervals_s: dict,
    *,
    grace_s: float | None,
    replicas: int = 500,
    seed: int = 0,
) -> tuple[float, float]:
    """(mean, standard deviation) of the wall time over the failure clock, by Monte Carlo."""
    tiers = LOCAL in intervals_s
    scenario = scenario_for(p, steps, tiers, _target(p, tiers, grace_s))
    walls = []
    for ss in np.random.SeedSequence(seed).spawn(replicas):
        gpu_rng, node_rng, other_rng = replica_streams(ss)
        source = class_sources(scenario, gpu_rng, node_rng, ss)
        job = TieredClusterJob(scenario, TierSchedule(dict(intervals_s)), source, other_rng)
        walls.append(p.startup_s + job.run()["wall_s"])
    w = np.asarray(walls)
    return float(w.mean()), float(w.std(ddof=1)) if w.size > 1 else math.nan
