"""Work budgets: what a simulation will cost, estimated before it starts, and the limits on it.

A run that would take hours, or more memory than the machine has, is refused up front with
its estimate and the flag that lets it go ahead, instead of running silently for hours while
``ckptsim optimize`` flags the same job at once.

Events. One replica of a policy saving every τ seconds of compute simulates about
``E[wall] · (1/M + 1/(τ + δ)) + G`` events: the failures and saves of its expected wall time,
plus one first lifetime drawn for each of its G components (GPUs, nodes) when they age on
their own. ``E[wall]`` is Daly's expected wall time (exact for exponential failures; the
long-run failure rate 1/M stands in for other families; an asynchronous save counts its
stall plus its background write, the time until a snapshot is safe, which bounds it), capped
at ``des.MAX_WALL_FACTOR`` times the work, where both simulators give up on a job that makes
no headway.

Memory. The fast engine holds each replica's failure times in one matrix (replicas × failures)
and about ``FAST_ARRAYS`` arrays of that shape at once, plus a few arrays of one float per GPU
for per-GPU failure processes; the discrete-event engine keeps a heap with one entry per GPU
in every worker (~``DES_BYTES_PER_COMPONENT`` bytes each) and a record per replica.

Time. Events turn into core time at the throughput measured for each engine
(``EVENTS_PER_S``: ~2.5e4 events/s in the discrete-event engine, ~2e6 in the fast one), plus a
fixed cost per replica or per call (``OVERHEAD_S``). A tiered run (:func:`tier_estimate`) has
its own measured rates: failures and saves at ``TIER_EVENTS_PER_S`` and each component's first
lifetime at ``COMPONENT_S`` (drawn vectorised, not one event each), checked against measured
runs by ``experiments/bench_tier_budget.py``.

Limits: ``DEFAULT_MAX_CORE_HOURS`` of estimated core time, half of the memory available when
the run starts, and no job whose expected wall time is ``MAX_WALL_FACTOR`` times its work or
more under its best policy (both simulators would give up on it anyway, after the whole cost).
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

import numpy as np

from simulator import analytic
from simulator.errors import InputError
from simulator.model.scenario import Scenario

__all__ = [
    "DEFAULT_MAX_CORE_HOURS",
    "Estimate",
    "check",
    "estimate",
    "mem_available_bytes",
    "replica_events",
    "tier_estimate",
]

DEFAULT_MAX_CORE_HOURS = 0.5
MAX_WALL_FACTOR = 1000.0  # = des.MAX_WALL_FACTOR, without importing SimPy here
EVENTS_PER_S = {"des": 2.5e4, "fast": 2e6}
"""Measured throughput of one core, events per second (2 shared cores, numpy 2, SimPy 4)."""
OVERHEAD_S = {"des": 2e-3, "fast": 2e-2}
"""Fixed cost per replica (DES) or per call of the fast engine, seconds."""
FAST_ARRAYS = 16
DES_BYTES_PER_COMPONENT = 64
RECORD_BYTES = 1500


@dataclass(frozen=True)
class Estimate:
    """The cost of a run: events over all replicas and policies, peak memory, and why."""

    events: float
    core_s: float
    """Estimated time on one core, seconds."""
    memory_bytes: float
    engine: str
    wall_factor: float
    """Expected wall time over work of the best policy (≥ 1); the worst over summed runs."""
    detail: str = ""

    def __add__(self, other: Estimate) -> Estimate:
        worst = self if self.wall_factor >= other.wall_factor else other
        return Estimate(
            events=self.events + other.events,
            core_s=self.core_s + other.core_s,
            memory_bytes=max(self.memory_bytes, other.memory_bytes),
            engine="des" if "des" in (self.engine, other.engine) else self.engine,
            wall_factor=worst.wall_factor,
            detail=worst.detail,
        )


def mem_available_bytes() -> int:
    """Memory the kernel says is available to new work (MemAvailable), bytes."""
    try:
        with open("/proc/meminfo") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")


def _components(scenario: Scenario, engine: str) -> int:
    """Lifetimes drawn at the start of a replica (one per ageing component)."""
    n = 0
    if scenario.gpus is not None:
        exponential = scenario.failure.strip().lower().startswith("exponential")
        if engine == "des" or not exponential:
            n += scenario.gpus
    if scenario.node_mtbf_h is not None and scenario.nodes:
        n += scenario.nodes
    return n


def _job_mtbf_s(scenario: Scenario) -> float:
    """Mean time between failures that stop the job, GPUs and nodes."""
    rate = 1.0 / scenario.system_mtbf_s
    if scenario.node_mtbf_h is not None and scenario.nodes:
        rate += scenario.nodes / (scenario.node_mtbf_h * 3600.0)
    return 1.0 / rate


def _exposed_save_s(scenario: Scenario) -> float:
    """Seconds from a snapshot until it is safe: the stall, plus the write behind it when the
    save is asynchronous. An asynchronous save commits each snapshot no later than a
    synchronous save stalling this long would, so Daly's wall time with it bounds the job's."""
    return scenario.save_stall_s + scenario.background_write_s


def _wall_s(scenario: Scenario, interval_s: float) -> float:
    work = float(scenario.work_s or 0.0)
    with np.errstate(over="ignore", invalid="ignore"):
        wall = float(
            analytic.daly_wall_time(
                interval_s,
                _exposed_save_s(scenario),
                _job_mtbf_s(scenario),
                scenario.recovery_s,
                work,
            )
        )
    cap = MAX_WALL_FACTOR * work
    return cap if not math.isfinite(wall) or wall > cap else max(wall, work)


def replica_events(scenario: Scenario, interval_s: float, engine: str = "des") -> float:
    """Expected events of one replica saving every ``interval_s`` s (see the module docstring)."""
    wall = _wall_s(scenario, interval_s)
    rate = 1.0 / _job_mtbf_s(scenario) + 1.0 / (interval_s + scenario.save_stall_s)
    return wall * rate + _components(scenario, engine) + 1.0


def estimate(
    scenario: Scenario,
    intervals_s: Iterable[float],
    replicas: int,
    *,
    engine: str = "des",
    workers: int = 1,
) -> Estimate:
    """The cost of running each interval (one policy each) on ``replicas`` replicas."""
    intervals = [float(t) for t in intervals_s]
    work = float(scenario.work_s or 0.0)
    walls = [_wall_s(scenario, t) for t in intervals]
    events = replicas * sum(replica_events(scenario, t, engine) for t in intervals)
    failures = max(walls) / _job_mtbf_s(scenario) * 1.3 + 40.0
    per_call = replicas if engine == "des" else 2
    core_s = events / EVENTS_PER_S[engine] + per_call * len(intervals) * OVERHEAD_S[engine]
    if engine == "fast":
        memory = replicas * failures * 8.0 * FAST_ARRAYS
        if _components(scenario, engine):
            memory += 4 * 8.0 * _components(scenario, engine)
    else:
        memory = workers * DES_BYTES_PER_COMPONENT * _components(scenario, engine)
        memory += replicas * RECORD_BYTES
    return Estimate(
        events=events,
        core_s=core_s,
        memory_bytes=memory,
        engine=engine,
        wall_factor=min(walls) / work if work else 1.0,
        detail=(
            f"a save of {scenario.save_stall_s:.3g} s"
            + (
                f" whose write takes {scenario.background_write_s:.3g} s behind it"
                if scenario.background_write_s
                else ""
            )
            + f" and a restart of {scenario.recovery_s:.3g} s "
            f"against a job MTBF of {_job_mtbf_s(scenario):.3g} s"
        ),
    )


def _tier_intervals(scenario: Scenario, schedule) -> dict[str, float]:
    """Each tier's interval under a tier schedule; one saved with every k-th save of another
    is saved every k of that one's intervals."""
    out = dict(schedule.intervals_s)
    for name, (base, k) in schedule.every.items():
        out[name] = out[base] * k
    return out


TIER_EVENTS_PER_S = 1e5
"""Throughput of the tiered DES on one core, in the events :func:`tier_estimate` counts (a
replica's failures and saves): 2e5 to 4e5/s measured when it was set, 1.1e5/s on 2026-12-07
(``experiments/bench_tier_budget.py``, 2 shared cores: the 1.5e5 taken then put four of seven
cases' estimates under what they took, down to 0.76 of it), taken lower to stay on the safe
side."""
COMPONENT_S = 1e-7
"""Seconds to draw one component's first lifetime and heap it at a replica's start (6e-8 to
2e-7 s measured, vectorised: ``experiments/bench_tier_budget.py``), on the safe side."""


def tier_estimate(scenario: Scenario, schedules: Sequence, replicas: int, *, workers: int = 1):
    """The cost of running each tier schedule (``model.tiers.TierSchedule``) on ``replicas``
    replicas of a tiered scenario: a replica's failures and saves over its expected wall time
    at ``TIER_EVENTS_PER_S``, plus its components' first lifetimes at ``COMPONENT_S`` each
    and ``OVERHEAD_S`` a replica. The wall time is the work times
    ``model.tier_plan.wall_per_work`` at the schedule's own intervals (each tier's stalls,
    waiting for a write that outlasts its interval, per compute second; each failure class's
    lost work, recovery and restore per wall second), capped at ``MAX_WALL_FACTOR`` times the
    work. Failures count every one (a burst's follow-ups too); an every-step tier's snapshots
    are no events (its stall is booked with the compute)."""
    from simulator.model.tier_plan import wall_per_work

    writers = scenario.writer_nodes or scenario.nodes or 1
    work = float(scenario.work_s or 0.0)
    rate = scenario.failure_rate_per_s
    if scenario.failure_classes:
        components = sum(
            c.components(scenario.gpus, scenario.nodes) for c in scenario.failure_classes
        )
    else:
        components = _components(scenario, "des")
    walls, events = [], 0.0
    cap = MAX_WALL_FACTOR * work
    for schedule in schedules:
        iv = _tier_intervals(scenario, schedule)
        wall = work * wall_per_work(scenario, iv)
        wall = cap if not math.isfinite(wall) or wall > cap else max(wall, work)
        saves = sum(wall / tau for tau in iv.values() if math.isfinite(tau))
        events += replicas * (wall * rate + saves + 1.0)
        walls.append(wall)
    stalls = ", ".join(f"{t.name} {t.stall_s(writers):.3g} s" for t in scenario.tiers)
    runs = replicas * len(walls)
    return Estimate(
        events=events,
        core_s=events / TIER_EVENTS_PER_S + runs * (OVERHEAD_S["des"] + components * COMPONENT_S),
        memory_bytes=workers * DES_BYTES_PER_COMPONENT * components + replicas * RECORD_BYTES,
        engine="des",
        wall_factor=min(walls) / work if work and walls else 1.0,
        detail=f"saves of {stalls} against a job MTBF of {1.0 / rate:.3g} s" if rate else "",
    )


def _duration(seconds: float) -> str:
    if seconds < 120:
        return f"{seconds:.0f} s"
    if seconds < 7200:
        return f"{seconds / 60:.0f} min"
    if seconds < 2 * 86400:
        return f"{seconds / 3600:.1f} h"
    return f"{seconds / 86400:.3g} days"


def check(
    est: Estimate,
    *,
    max_core_hours: float = DEFAULT_MAX_CORE_HOURS,
    max_memory_bytes: float | None = None,
    workers: int = 1,
    time_flag: str = "--max-core-hours",
    memory_flag: str = "--max-memory-gb",
) -> None:
    """Refuse a run over a limit (module docstring), saying what it would cost and why."""
    if max_memory_bytes is None:
        max_memory_bytes = 0.5 * mem_available_bytes()
    if est.wall_factor >= MAX_WALL_FACTOR:
        raise InputError(
            f"this job would make no headway: even its best interval gives an expected wall "
            f"time over {MAX_WALL_FACTOR:g}x its work ({est.detail}); make saves or restarts "
            "cheaper, or see `ckptsim optimize`"
        )
    why = ""
    if est.wall_factor >= 10:
        why = (
            f"; the job barely progresses (expected wall time ~{est.wall_factor:.0f}x its work: "
            f"{est.detail})"
        )
    if est.core_s > max_core_hours * 3600.0:
        wall = est.core_s / max(1, workers)
        raise InputError(
            f"this run would take ~{_duration(est.core_s)} of one core (~{est.events:.2g} "
            f"simulated events, {est.engine} engine; ~{_duration(wall)} on {workers} "
            f"worker{'s' if workers > 1 else ''}), over {time_flag} {max_core_hours:g}{why}; "
            f"raise {time_flag} to run it anyway"
        )
    if est.memory_bytes > max_memory_bytes:
        raise InputError(
            f"this run would need ~{est.memory_bytes / 1e9:.3g} GB of memory "
            f"({est.engine} engine), over {memory_flag} {max_memory_bytes / 1e9:.3g}{why}; "
            f"raise {memory_flag} to run it anyway"
        )


def policy_intervals(scenario: Scenario, policies: Sequence) -> list[float]:
    """Each policy's interval after a restart, as the estimate assumes it keeps it: for a
    policy that learns (the simulated controller), the interval once it has learned, from a
    context of a long run at the true rates (a million failures seen, a checkpoint committed),
    not its first guess, which a wrong prior or a long probe can make arbitrarily far off."""
    from simulator.policies import PolicyContext

    ctx = PolicyContext.from_scenario(scenario, age_s=scenario.recovery_s)
    settled = dataclasses.replace(
        ctx, failures_seen=10**6, exposure_s=1e6 * ctx.mtbf_s, checkpoints_committed=1,
        saves_since_start=1,
    )  # fmt: skip
    return [
        float(p.next_interval_s(settled if getattr(p, "learns", False) else ctx)) for p in policies
    ]


def search_intervals(scenario: Scenario, *, baselines: int = 8) -> list[float]:
    """The intervals ``optimize.optimize_parameter`` tries (13 coarse, 9 fine) and the
    baselines ``optimize_by_simulation`` then checks, for its estimate."""
    from simulator.optimize import search_bounds
    from simulator.policies import USUAL_INTERVALS

    lo, hi = search_bounds(scenario)
    anchor = float(analytic.optimal_interval(scenario.save_stall_s, scenario.system_mtbf_s))
    coarse = list(np.geomspace(lo, hi, 13))
    fine = [min(max(anchor, lo), hi)] * 9
    checks = [anchor] * max(0, baselines - 3) + [u.interval_s for u in USUAL_INTERVALS][
        : max(0, baselines)
    ]
    return coarse + fine + checks
