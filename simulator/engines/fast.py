"""Vectorised Monte-Carlo engine for the plain checkpoint/restart model (no SimPy).

The discrete-event simulator (``simulator.engines.des``) is the reference model; this engine covers
its plain case — blocking saves, unlimited spares, no storage contention — fast enough for
optimisation and sweeps of thousands of scenario points.

The trick that makes it vectorisable: failures arrive from a process that does not depend
on what the job is doing, so the wall-clock failure times ``f₀ < f₁ < …`` of a replica are
drawn once (and shared by every candidate policy: common random numbers). After failure k the
job computes again from ``f_k + R``; epoch k+1 therefore lasts ``g = f_{k+1} − f_k − R``
(≤ 0: the failure struck during the restart, which starts over). In an epoch the policy's
save schedule (compute τ₁, save δ, compute τ₂, save δ, …, from the age the epoch starts at)
fixes how many saves complete, so the checkpointed work of every epoch is known at once;
a cumulative sum finds the epoch in which the remaining work fits, and no Python loop over
failures is needed.

Failure processes:
- ``system``: gaps between job failures are i.i.d. draws of ``scenario.system_lifetime()``
  (the whole job renews at a failure). For exponential lifetimes this is the Poisson process
  every closed form assumes.
- ``per_gpu``: each of the ``gpus`` GPUs fails by its own renewal process (``gpu_lifetime()``,
  a failed GPU replaced by a new one); the job fails at every event of the superposition.
  As in the DES, ``scenario.component_age`` says whether parts start at equilibrium age
  (``stationary``: the long-run rate the scenario's MTBF describes) or all new at t = 0.

Replica ``i`` draws its failures from the DES's failure stream of that replica
(``simulator.engines.streams``) with the DES's stationary-start sampler
(``failure_source.stationary_residual``): with a job-level lifetime both engines replay the
same failure history; per GPU, each GPU's first failure is the same and later ones differ
only in draw order (the same distribution).

Policies see ``age_s`` = time since the last failure when an epoch starts (0 at the first
start, R after each restart), and otherwise what ``PolicyContext.from_scenario`` gives (the DES
calls it too), its component model the process above.
As in the DES the final state is saved too, and lost time counts compute only (a save cut
short by a failure counts as checkpoint time).
Their schedule is evaluated until it settles (relative change < 1e-6) or passes the longest
epoch, then continued with its last interval.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from simulator import analytic
from simulator.engines.streams import GPU, replica_seeds, replica_streams
from simulator.errors import InputError
from simulator.model.failure_source import stationary_residual
from simulator.model.failures import Exponential, Lifetime
from simulator.model.scenario import Scenario
from simulator.policies import Policy, PolicyContext

__all__ = [
    "FIELDS",
    "FastResult",
    "draw_failure_times",
    "fast_supported",
    "replica_seeds",
    "resolve_process",
    "simulate_policies",
    "unmodelled_fields",
]

FIELDS = (
    "wall_s",
    "useful_s",
    "checkpoint_s",
    "lost_s",
    "recovery_s",
    "failures",
    "checkpoints",
    "cost_usd",
)

# Scenario fields this engine models; anything else set away from its default (async saves,
# spares, storage caps, trace replay — fields the DES adds) needs the DES.
_MODELLED = {
    "name",
    "gpus",
    "gpus_per_node",
    "failure",
    "gpu_mtbf_h",
    "mtbf_h",
    "checkpoint_s",
    "restart_s",
    "work_h",
    "usd_per_gpu_hour",
    "checkpoint_bytes",
    "usd_per_gb_month",
    "checkpoints_retained",
    "detection_s",
    "warmup_s",
    "write_bytes_per_s_per_node",
    "storage_bytes_per_s",
    "writer_nodes",
    "read_bytes_per_s",
    "component_age",
    # Repairs only matter with a finite spare pool, which is not modelled here.
    "repair",
    "repair_h",
}


def unmodelled_fields(scenario: Scenario) -> list[str]:
    """The scenario's fields set away from their defaults that this engine does not model."""
    out = []
    for f in dataclasses.fields(scenario):
        if f.name in _MODELLED:
            continue
        default = f.default if f.default is not dataclasses.MISSING else None
        if f.default_factory is not dataclasses.MISSING:  # type: ignore[misc]
            default = f.default_factory()  # type: ignore[misc]
        if getattr(scenario, f.name) != default:
            out.append(f.name)
    return out


def fast_supported(scenario: Scenario) -> bool:
    """True when every scenario field outside the plain model is at its default."""
    return not unmodelled_fields(scenario)


def resolve_process(scenario: Scenario, process: str = "auto") -> str:
    """``auto`` follows the DES: ``per_gpu`` when ``gpus`` is known, else ``system``."""
    if process not in ("auto", "system", "per_gpu"):
        raise InputError(f"failure process must be auto, system or per_gpu, got {process!r}")
    if process == "auto":
        return "system" if scenario.gpus is None else "per_gpu"
    if process == "per_gpu" and scenario.gpus is None:
        raise InputError("the per_gpu failure process needs gpus")
    return process


def _first_failures(life: Lifetime, rng: np.random.Generator, n: int, stationary: bool):
    """Time to each component's first failure: new parts, or parts of equilibrium age.

    The equilibrium draw is the DES's own (``failure_source.stationary_residual``), so the
    superposition fails at its long-run rate n/mean from t = 0 in both engines.
    """
    return stationary_residual(life, rng, n) if stationary else life.sample(rng, n)


def draw_failure_times(
    scenario: Scenario,
    seeds: Sequence[np.random.SeedSequence],
    horizon_s: float,
    process: str,
    stationary: bool = True,
) -> np.ndarray:
    """Failure times (s) of each replica up to ``horizon_s``: shape (replicas, K), inf-padded."""
    rows = []
    for ss in seeds:
        rng = replica_streams(ss)[GPU]  # the DES's failure stream of this replica
        if process == "system" or isinstance(scenario.gpu_lifetime(), Exponential):
            # One renewal process; n exponential components merge into one at rate n/mean.
            life = scenario.system_lifetime()
            chunk = int(horizon_s / life.mean_s * 1.2) + 16
            first = _first_failures(life, rng, 1, stationary)
            t = first[0] + np.concatenate([[0.0], np.cumsum(life.sample(rng, chunk))])
            while t[-1] < horizon_s:  # sequential draws: a longer horizon keeps the prefix
                t = np.concatenate([t, t[-1] + np.cumsum(life.sample(rng, chunk))])
            rows.append(t[t < horizon_s])
        else:
            life = scenario.gpu_lifetime()
            t = _first_failures(life, rng, scenario.gpus, stationary)
            events = []
            alive = t[t < horizon_s]
            while alive.size:
                events.append(alive)
                alive = alive + life.sample(rng, alive.size)
                alive = alive[alive < horizon_s]
            rows.append(np.sort(np.concatenate(events)) if events else np.empty(0))
    k = max((r.size for r in rows), default=0)
    out = np.full((len(rows), k), np.inf)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


def _trace_matrix(times, seeds) -> np.ndarray:
    rows = []
    for ss in seeds:
        rng = replica_streams(ss)[GPU]  # the stream the DES hands a trace callable
        t = np.sort(np.asarray(times(rng) if callable(times) else times, dtype=float))
        rows.append(t[np.isfinite(t) & (t >= 0)])
    k = max((r.size for r in rows), default=0)
    out = np.full((len(rows), k), np.inf)
    for i, r in enumerate(rows):
        out[i, : r.size] = r
    return out


@dataclass(frozen=True)
class _Schedule:
    """Save schedule from one starting age: explicit prefix, then a constant tail interval."""

    tau: np.ndarray  # compute intervals of the prefix, s
    tail_s: float
    delta_s: float

    @property
    def done(self):  # cumulative checkpointed work after save j (1-based → index j-1)
        return np.cumsum(self.tau)

    @property
    def at(self):  # wall offset at which save j completes
        return np.cumsum(self.tau + self.delta_s)

    def saves_within(self, g: np.ndarray) -> np.ndarray:
        """Saves completed within ``g`` seconds from the epoch start (g finite, ≥ 0)."""
        at, p = self.at, self.tau.size
        end = at[-1] if p else 0.0
        head = np.searchsorted(at, g, side="right")
        tail = p + np.floor((g - end) / (self.tail_s + self.delta_s))
        return np.where(g < end, head, tail).astype(np.int64)

    def work(self, n: np.ndarray) -> np.ndarray:
        """Checkpointed compute after ``n`` saves."""
        done, p = self.done, self.tau.size
        head = np.concatenate([[0.0], done])[np.minimum(n, p)]
        return head + np.maximum(n - p, 0) * self.tail_s

    def offset(self, n: np.ndarray) -> np.ndarray:
        """Wall offset at which save ``n`` completes."""
        at, p = self.at, self.tau.size
        head = np.concatenate([[0.0], at])[np.minimum(n, p)]
        return head + np.maximum(n - p, 0) * (self.tail_s + self.delta_s)

    def interval(self, n: np.ndarray) -> np.ndarray:
        """Compute interval that follows save ``n``."""
        p = self.tau.size
        return np.where(n < p, self.tau[np.minimum(n, p - 1)], self.tail_s)

    def finish(self, rem: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(wall offset, saves) to compute ``rem`` more seconds and save the final state."""
        done, p = self.done, self.tau.size
        total = done[-1] if p else 0.0
        head = np.searchsorted(done, rem, side="left") + 1
        tail = p + np.ceil((rem - total) / self.tail_s)
        j = np.where(rem <= total, head, tail).astype(np.int64)  # interval in which work ends
        j = np.maximum(j, 1)
        before = j - 1
        return self.offset(before) + (rem - self.work(before)) + self.delta_s, j


def _schedule(policy: Policy, ctx: PolicyContext, age_s: float, max_age_s: float) -> _Schedule:
    taus: list[float] = []
    age, prev = age_s, None
    for _ in range(5000):
        tau = float(policy.next_interval_s(dataclasses.replace(ctx, age_s=age)))
        if not (np.isfinite(tau) and tau > 0):
            raise InputError(f"policy {policy.name!r} gave a non-positive interval {tau!r} s")
        if prev is not None and abs(tau - prev) <= 1e-6 * prev:
            break
        taus.append(tau)
        prev = tau
        age += tau + ctx.checkpoint_s
        if age - age_s > max_age_s:
            break
    return _Schedule(tau=np.asarray(taus), tail_s=tau, delta_s=ctx.checkpoint_s)


@dataclass(frozen=True)
class FastResult:
    """Per-replica outcomes: each field an array of shape (policies, replicas)."""

    labels: tuple[str, ...]
    arrays: dict[str, np.ndarray]
    process: str

    def records(self, i: int = 0):
        """A tidy DataFrame of policy ``i``'s replicas (one row each)."""
        import pandas as pd

        df = pd.DataFrame({k: v[i] for k, v in self.arrays.items()})
        df.insert(0, "replica", np.arange(len(df)))
        return df


def _run_one(sched0: _Schedule, sched: _Schedule, f: np.ndarray, work_s: float, restart_s: float):
    """Outcomes of one policy on failure times ``f`` (replicas, K); epoch 0 uses ``sched0``."""
    reps, k = f.shape
    start = np.concatenate([np.zeros((reps, 1)), f + restart_s], axis=1)
    end = np.concatenate([f, np.full((reps, 1), np.inf)], axis=1)
    with np.errstate(invalid="ignore"):
        g = end - start
    g = np.where(np.isnan(g), np.inf, g)  # epochs after the last drawn failure never start
    gf = np.where(np.isfinite(g), np.maximum(g, 0.0), 0.0)

    def both(fn, x):
        out = np.empty(x.shape, dtype=np.result_type(fn(sched0, x[:, :1])))
        out[:, 0] = fn(sched0, x[:, 0])
        out[:, 1:] = fn(sched, x[:, 1:])
        return out

    saves = both(_Schedule.saves_within, gf)
    work = both(_Schedule.work, saves)
    used = both(_Schedule.offset, saves)
    nxt = both(_Schedule.interval, saves)
    before = np.cumsum(work, axis=1) - work
    rem = np.maximum(work_s - before, 0.0)
    need0, fin0 = sched0.finish(rem[:, 0])
    need1, fin1 = sched.finish(rem[:, 1:])
    need = np.concatenate([need0[:, None], need1], axis=1)
    fin = np.concatenate([fin0[:, None], fin1], axis=1)
    kf = np.argmax(need <= g, axis=1)  # the inf-length last epoch guarantees a hit
    rows = np.arange(reps)
    past = (np.arange(k + 1)[None, :] < kf[:, None]) & (g > 0)
    # An interrupted epoch loses the compute since its last save; time past that compute
    # was spent in a save the failure cut short (checkpoint time, as in the DES).
    # The last segment computes only the work left, then the final save.
    nxt = np.clip(rem - work, 0.0, nxt)
    tail = np.where(past, gf - used, 0.0)
    lost = np.minimum(tail, nxt).sum(axis=1)
    cut_saves = np.maximum(tail - nxt, 0.0).sum(axis=1)
    wall = start[rows, kf] + need[rows, kf]
    checkpoints = (saves * past).sum(axis=1) + fin[rows, kf]
    return wall, kf, checkpoints, lost, cut_saves


_MAX_WALL_FACTOR = 1000.0  # = des.MAX_WALL_FACTOR (SimPy is not imported here)


def labels_of(policies: Sequence[Policy]) -> tuple[str, ...]:
    return tuple(getattr(p, "name", type(p).__name__) for p in policies)


def simulate_policies(
    scenario: Scenario,
    policies: Sequence[Policy],
    *,
    replicas: int,
    seed=0,
    process: str = "auto",
    work_s: float | None = None,
    failure_times=None,
) -> FastResult:
    """Run every policy on the same ``replicas`` failure histories (common random numbers).

    ``failure_times`` replays a trace instead of the failure model, as in
    ``des_replicas.simulate``: sorted times (s), or a function of each replica's generator
    (e.g. ``titan.failure_times_for_subset``); no failures after the trace ends.
    """
    failure_times_arg = failure_times
    if not fast_supported(scenario):
        raise InputError("this scenario needs the discrete-event simulator (engine='des')")
    if replicas < 1:
        raise InputError(f"replicas must be >= 1, got {replicas!r}")
    work = float(work_s if work_s is not None else (scenario.work_s or 0.0))
    if work <= 0:
        raise InputError("the scenario needs work_h (failure-free compute, hours) to simulate")
    process = resolve_process(scenario, process)
    if not scenario.has_mtbf:  # the horizon and the policies need the job's rate
        raise InputError("no failure rate: give mtbf_h, or gpus and gpu_mtbf_h")
    # The ``system`` process renews the whole job at each failure: its policies see the job's
    # own lifetime, as the DES's do when the GPU count is unknown.
    ctx = PolicyContext.from_scenario(scenario, whole_job=process == "system")
    delta, restart, mtbf = ctx.checkpoint_s, ctx.restart_s, ctx.mtbf_s
    seeds = replica_seeds(seed, replicas)
    # Draw failures far enough ahead for the slowest policy: Daly's expected wall time at
    # each policy's first interval, with margin (a replica that still outruns it is redrawn).
    first = [float(p.next_interval_s(dataclasses.replace(ctx, age_s=restart))) for p in policies]
    with np.errstate(over="ignore"):
        expects = [float(analytic.daly_wall_time(t, delta, mtbf, restart, work)) for t in first]
    horizon = min(1.3 * max(expects), 1e3 * work) + 20.0 * mtbf + 10.0 * restart
    while True:
        if failure_times_arg is None:
            stationary = scenario.component_age == "stationary"
            f = draw_failure_times(scenario, seeds, horizon, process, stationary)
        else:
            f = _trace_matrix(failure_times_arg, seeds)
        with np.errstate(invalid="ignore"):
            gaps = np.diff(f, axis=1, prepend=0.0)
        max_gap = float(np.max(gaps[np.isfinite(gaps)], initial=0.0))
        span = max(max_gap, work) * 1.01 + delta
        out = {k: np.empty((len(policies), replicas)) for k in FIELDS}
        ok = True
        for i, pol in enumerate(policies):
            s0 = _schedule(pol, ctx, 0.0, span)
            s1 = _schedule(pol, ctx, restart, span)
            # A policy far faster than the slowest needs only the first columns of f; if a
            # replica outruns that cut it is rerun on all of them.
            cut_s = min(1.3 * expects[i] + 20.0 * mtbf + 10.0 * restart, horizon)
            cols = int(np.max(np.sum(f < cut_s, axis=1), initial=0))
            if cols < f.shape[1]:
                res = _run_one(s0, s1, f[:, :cols], work, restart)
                if np.any(res[0] > cut_s):
                    res = _run_one(s0, s1, f, work, restart)
            else:
                res = _run_one(s0, s1, f, work, restart)
            wall, fails, saves, lost, cut = res
            if failure_times_arg is None and np.any(wall > horizon):  # failures were missed
                ok = False
                break
            ck = saves * delta + cut
            out["wall_s"][i] = wall
            out["useful_s"][i] = work
            out["checkpoint_s"][i] = ck
            out["lost_s"][i] = lost
            out["recovery_s"][i] = wall - work - ck - lost
            out["failures"][i] = fails
            out["checkpoints"][i] = saves
            price = scenario.usd_per_gpu_hour
            out["cost_usd"][i] = (
                wall / 3600.0 * (scenario.gpus or 1) * price if price is not None else np.nan
            )
        if ok:
            labels = tuple(getattr(p, "name", type(p).__name__) for p in policies)
            return FastResult(labels=labels, arrays=out, process=process)
        if horizon > _MAX_WALL_FACTOR * (work + delta) + 20.0 * mtbf + 10.0 * restart:
            # As in the DES: a job this far from done is stuck, and drawing ever more
            # failures would only exhaust memory.
            raise InputError(
                f"policy {labels_of(policies)[i]!r} made no headway: not done after "
                f"{_MAX_WALL_FACTOR:g}x its work in wall time (failures too frequent for the "
                "save and restart costs)"
            )
        horizon *= 2.0
