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

:class:`ControllerTiers` is the tiered job as the live controller runs it, in two points where
the controller's rule differs from ``des_tiers``': the preemption save lands in a real tier
(the local one when the persistent save does not fit the grace period), which later failures
roll back to (the model's ``jit`` copy alone would be lost to the next failure of another
class); and after a restart a tier with no copy counts its next save from the job's start,
where ``des_tiers`` counts it from the restore point — so there, process failures more
frequent than the persistent interval would put off the first persistent save indefinitely,
while the controller makes it at its due step.

Two predictions, as in ``predict``: ``replay`` drives the model with the very failures (time
and class) a run met; ``expected`` is the Monte-Carlo mean over the clock. Both add the
measured first start-up (the simulated job starts at work).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field

import numpy as np

from simulator.controller.tier_schedule import LOCAL, PERSISTENT
from simulator.engines.des_tiers import TieredClusterJob, class_sources
from simulator.engines.streams import replica_streams
from simulator.model.failure_source import MergedFailures
from simulator.model.scenario import Scenario
from simulator.model.tiers import FailureClass, Tier, TierSchedule

__all__ = [
    "CLASS_ORDER",
    "LOCAL_SURVIVES",
    "ControllerTiers",
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


def scenario_for(p: TierParams, steps: int, tiers: bool) -> Scenario:
    """The run as the tiered model sees it; ``tiers``: a local tier beside the persistent."""
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


class ControllerTiers(TieredClusterJob):
    """The tiered job with the live controller's rules after a failure (module docstring).

    A committed preemption save is a checkpoint in ``target`` (the local tier, or the
    persistent one), which later failures roll back to. After any restart the local tier
    counts from the restore point and every other tier from its newest copy, or from the
    job's start when it has none (``TieredSchedule.restart``).
    """

    def __init__(self, scenario, schedule, failures, rng, *, target: str):
        super().__init__(scenario, schedule, failures, rng)
        self.target = target
        names = [c.name for c in scenario.failure_classes]
        self.preempt_index = names.index("preemption") if "preemption" in names else None

    def _on_failure(self, cause=0) -> None:
        super()._on_failure(cause)
        at = self.done_s
        committed = self.pending[1] is not None and self.pending[1].jit
        if self.preempt_index is not None and int(cause) == self.preempt_index and committed:
            self.copies[self.target] = at
        for t in self.tiers:
            copy = self.copies[t.name]
            self.mark[t.name] = at if t.name == LOCAL else (0.0 if copy is None else copy)


class _Listed:
    """A failure source replaying given times (seconds since the job's start)."""

    def __init__(self, times):
        self.times = sorted(float(t) for t in times)
        self.i = 0

    def next_failure_s(self) -> float:
        if self.i >= len(self.times):
            return math.inf
        self.i += 1
        return self.times[self.i - 1]


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
    scenario = scenario_for(p, steps, tiers)
    order = [c.name for c in scenario.failure_classes]
    sources = [_Listed([t for t, c in failures if c == name]) for name in order]
    job = ControllerTiers(
        scenario,
        TierSchedule(dict(intervals_s)),
        MergedFailures(*sources),
        np.random.default_rng(0),
        target=_target(p, tiers, grace_s),
    )
    return p.startup_s + job.run()["wall_s"]


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
    scenario = scenario_for(p, steps, tiers)
    walls = []
    for ss in np.random.SeedSequence(seed).spawn(replicas):
        gpu_rng, node_rng, other_rng = replica_streams(ss)
        source = class_sources(scenario, gpu_rng, node_rng, ss)
        job = ControllerTiers(
            scenario,
            TierSchedule(dict(intervals_s)),
            source,
            other_rng,
            target=_target(p, tiers, grace_s),
        )
        walls.append(p.startup_s + job.run()["wall_s"])
    w = np.asarray(walls)
    return float(w.mean()), float(w.std(ddof=1)) if w.size > 1 else math.nan
