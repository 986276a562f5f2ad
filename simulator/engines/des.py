"""The discrete-event cluster model: one training job, its saves, its failures, its recoveries.

One SimPy process runs the job — compute a segment, save, compute, save — asking the policy
before every segment how long to compute until the next save. A second process replays the
cluster's failures (``simulator.model.failure_source``: a heap over all components, or a trace) and
interrupts the job at each one. All time accounting happens where the interrupt lands
(``except simpy.Interrupt``) and in the ``finally`` of each timed phase, so every second of
wall time falls in exactly one bucket:

    wall = useful + lost + checkpoint + recovery

- useful: compute kept in the final state (the job's work);
- lost: compute rolled back to the last *completed* checkpoint by a failure;
- checkpoint: stalls for saves — sync writes, async staging copies, waits for the previous
  async write — including saves a failure cut short (those never count as checkpoints);
- recovery: detection + waiting for a spare (or a repair) + restart + checkpoint load +
  warm-up, restarted from scratch when a failure strikes during it.

Between two failures nothing but the failure process can touch the job, so the cycles
(a compute segment and its synchronous save) that end before the next failure is due are
booked in plain Python — the same additions in the same order, the policy asked at the same
times — and only the cycle a failure strikes runs as SimPy events (``ClusterJob._fast_forward``;
``fast_forward=False`` runs every cycle as two timeouts, and the tests check the two agree).
A steady policy (``policies.is_steady``) is asked once per run.

With the scenario's defaults (no detection/warm-up/load terms, unlimited spares, synchronous
saves, exponential failures) this is exactly the model behind Daly's expected wall time, which
the tests check. The job ends when all work is done and saved (the last segment is saved too).
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np
import simpy

from simulator.errors import InputError
from simulator.model.failure_source import ComponentFailures, FailureSource, MergedFailures
from simulator.model.failures import parse_failure
from simulator.model.scenario import Scenario
from simulator.policies import Policy, PolicyContext, is_steady

__all__ = ["MAX_WALL_FACTOR", "ClusterJob", "failure_source_for"]

MAX_WALL_FACTOR = 1000.0
"""A replica that needs more than this many times its work (and final save) in wall time is
declared stuck."""


def failure_source_for(
    scenario: Scenario, gpu_rng: np.random.Generator, node_rng: np.random.Generator
) -> FailureSource:
    """Component failures of the scenario: every GPU (and node, if given) ages on its own."""
    stationary = scenario.component_age == "stationary"
    if scenario.gpus is None:
        # Only a job-level MTBF is known: the job is one component with the system lifetime.
        gpus = ComponentFailures(scenario.system_lifetime(), 1, gpu_rng, stationary=stationary)
    else:
        gpus = ComponentFailures(
            scenario.gpu_lifetime(), scenario.gpus, gpu_rng, stationary=stationary
        )
    node_life = scenario.node_lifetime()
    if node_life is None:
        return gpus
    nodes = ComponentFailures(node_life, scenario.nodes, node_rng, stationary=stationary)
    return MergedFailures(gpus, nodes)


class ClusterJob:
    """One replica: a job on a cluster, run to completion by ``run()``."""

    def __init__(
        self,
        scenario: Scenario,
        policy: Policy,
        failures: FailureSource,
        rng: np.random.Generator,
        *,
        fast_forward: bool = True,
    ):
        if scenario.work_s is None:
            raise InputError("simulating a job needs work_h (failure-free compute, hours)")
        self.scenario, self.policy, self.source, self.rng = scenario, policy, failures, rng
        self.env = simpy.Environment()
        self.work_s = float(scenario.work_s)
        self.write_s = scenario.checkpoint_write_s
        self.stall_s = scenario.save_stall_s
        self.async_save = scenario.async_checkpoint
        self.repair = (
            parse_failure(scenario.repair, scenario.repair_h * 3600.0)
            if scenario.repair_h is not None
            else None
        )
        self.pool = (
            simpy.Container(self.env, capacity=math.inf, init=scenario.spares)
            if scenario.spares is not None
            else None
        )
        # What the policy sees, less its age (set at each decision): built where every
        # engine builds it, so the DES's policies know what the fast engine's know.
        if not scenario.failure_classes:
            ctx = PolicyContext.from_scenario(scenario)
            self._ctx = {f.name: getattr(ctx, f.name) for f in dataclasses.fields(ctx)}
            per = ("age_s", "failures_seen", "exposure_s", "checkpoints_committed")
            for per_decision in (*per, "saves_since_start"):
                del self._ctx[per_decision]
        # Job state: progress, the progress in the last completed checkpoint, buckets.
        self.done_s = 0.0
        self.committed_s = 0.0
        self.last_failure_s = 0.0
        self.recovering = False
        self.saves_since_start = 0
        self.spares_owed = 0
        self.writer: simpy.Process | None = None
        # Where the failure process sleeps until (None before it first runs): the job books
        # the cycles that end before it without a SimPy event each (``_fast_forward``).
        self.fast_forward = fast_forward
        self.next_failure_at: float | None = None
        self.t = dict(compute=0.0, lost=0.0, checkpoint=0.0, recovery=0.0, spare_wait=0.0)
        self.n = dict(failures=0, checkpoints=0, failures_in_recovery=0, events=0)

    # -- the rules every job loop shares (the tiered one in des_tiers too) ---------------
    @staticmethod
    def _segment(left_s: float, interval_s: float) -> float:
        """The next compute segment: the interval, or the rest of the work where that rest is
        within rounding of the interval (work_h · 3600 is rarely exact), so no sliver is left
        to cost one more save."""
        return left_s if left_s <= interval_s * (1.0 + 1e-9) else interval_s

    def _book_cut(self, phase: str | None, start: float) -> None:
        """A failure cut the timed wait ``phase`` short: book the time spent in it."""
        if phase == "compute":
            elapsed = self.env.now - start
            self.t["compute"] += elapsed
            self.done_s += elapsed
        elif phase == "stall":
            self.t["checkpoint"] += self.env.now - start

    # -- the job ------------------------------------------------------------------------
    def _interval(self, now: float) -> float:
        """The policy's next interval, asked at time ``now`` with what it sees then."""
        n = self.n
        # Age = time since the last failure (0 at the start): the hazard-since-renewal view
        # that age-aware policies (and simulator.engines.fast) use. And what a learning
        # policy learns from: the failures met so far, over the running time outside
        # recovery (as the controller's run log counts exposure).
        ctx = PolicyContext(
            **self._ctx,
            age_s=now - self.last_failure_s,
            failures_seen=n["failures"],
            exposure_s=max(now - self.t["recovery"], 0.0),
            checkpoints_committed=n["checkpoints"],
            saves_since_start=self.saves_since_start,
        )
        interval_s = float(self.policy.next_interval_s(ctx))
        if not (math.isfinite(interval_s) and interval_s > 0):
            hint = "" if self.scenario.has_mtbf else " (it needs mtbf_h or gpu_mtbf_h)"
            raise InputError(f"policy {self.policy.name!r} gave interval {interval_s!r} s{hint}")
        return interval_s

    def _fast_forward(self, now: float, segment: float, left: float, steady_s):
        """Book, without a SimPy event each, the whole cycles (a compute segment and its
        synchronous save) that end before the next failure; return (time, segment, left) of
        the first cycle that does not, which the job then runs as SimPy events.

        Nothing but the failure process can touch the job between two failures (spares and
        repairs matter only in recovery), so a cycle that ends before the failure is due
        books exactly what its two timeouts would: the same additions in the same order, the
        policy asked at the same times with the same context. Only the final segment (it
        ends the job) and async saves (their writer is a process) always take the SimPy path.
        ``steady_s``: the interval of a steady policy (``policies.is_steady``), not asked again.
        """
        fail_at, write_s, work_s, t = self.next_failure_at, self.write_s, self.work_s, self.t
        done, cycles = self.done_s, 0
        while segment < left:
            end = now + segment
            after = end + write_s
            if not after < fail_at:
                break
            t["compute"] += segment
            done += segment
            t["checkpoint"] += after - end
            cycles += 1
            # What the save and the next decision see: this cycle's save landed.
            self.done_s = self.committed_s = done
            self.n["checkpoints"] += 1
            self.saves_since_start += 1
            now = after
            left = work_s - done
            segment = self._segment(left, steady_s or self._interval(now))
        self.n["events"] += 2 * cycles  # each booked cycle's save and the next one's segment
        return now, segment, left

    def _job(self):
        # The compute segment and the save are inlined here (not ``yield from`` helpers): one
        # generator frame per job instead of three per cycle. ``phase`` says which timed wait
        # an interrupt cut short, so the time spent in it lands in its bucket exactly as the
        # phase would have booked it.
        env, timeout, t, n = self.env, self.env.timeout, self.t, self.n
        work_s = self.work_s
        forward = self.fast_forward and not self.async_save
        steady_s = None
        start = env.now  # of the timed wait under way (read only while ``phase`` is set)
        while True:
            phase = None
            try:
                if self.recovering:
                    yield from self._recover()
                if self.done_s >= work_s:
                    yield from self._await_writer()
                    return
                if steady_s is None:
                    interval_s = self._interval(env.now)
                    if forward and is_steady(self.policy):
                        steady_s = interval_s
                else:
                    interval_s = steady_s
                # Compute.
                left = work_s - self.done_s
                segment = self._segment(left, interval_s)
                start = env.now
                n["events"] += 1
                if forward and self.next_failure_at is not None:
                    start, segment, left = self._fast_forward(start, segment, left, steady_s)
                phase = "compute"
                # One timeout to the end of the first cycle not booked ahead (from ``start``).
                yield timeout(start - env.now + segment)
                t["compute"] += segment
                # Landing exactly on work_s: now − start can differ from segment in the last bit.
                self.done_s = work_s if segment >= left else self.done_s + segment
                # Save.
                n["events"] += 1
                self.saves_since_start += 1
                if not self.async_save:
                    start = env.now
                    phase = "stall"
                    yield timeout(self.write_s)
                    t["checkpoint"] += env.now - start
                    phase = None
                    self._commit(self.done_s)
                    continue
                # The previous background write must finish before this save starts.
                phase = None
                yield from self._await_writer()
                start = env.now
                phase = "stall"
                yield timeout(self.stall_s)
                t["checkpoint"] += env.now - start
                phase = None
                self.writer = env.process(self._background_write(self.done_s))
            except simpy.Interrupt:
                self._book_cut(phase, start)
                self._on_failure()

    def _stall(self, event):
        start = self.env.now
        try:
            yield event
        finally:
            self.t["checkpoint"] += self.env.now - start

    def _await_writer(self):
        if self.writer is not None and self.writer.is_alive:
            yield from self._stall(self.writer)

    def _background_write(self, snapshot_s: float):
        try:
            yield self.env.timeout(self.write_s)
        except simpy.Interrupt:
            return  # a failure before the write completed: this checkpoint is lost
        self._commit(snapshot_s)

    def _commit(self, snapshot_s: float) -> None:
        self.committed_s = snapshot_s
        self.n["checkpoints"] += 1

    def _recovery_times(self) -> tuple[float, float]:
        """(detection, restart + load + warm-up) of the recovery now under way, seconds."""
        s = self.scenario
        return s.detection_s, s.restart_s + s.load_s + s.warmup_s

    def _recover(self):
        start = self.env.now
        detection_s, rest_s = self._recovery_times()
        try:
            if self.pool is None:  # no wait for a spare: detection and restart in one timeout
                yield self.env.timeout(detection_s + rest_s)
                self.recovering = False
                return
            yield self.env.timeout(detection_s)
            wait_start = self.env.now
            try:
                while self.pool is not None and self.spares_owed > 0:
                    request = self.pool.get(1)
                    try:
                        yield request
                    except simpy.Interrupt:
                        if request.triggered:
                            self.spares_owed -= 1
                        else:
                            request.cancel()
                        raise
                    self.spares_owed -= 1
            finally:
                self.t["spare_wait"] += self.env.now - wait_start
            yield self.env.timeout(rest_s)
        finally:
            self.t["recovery"] += self.env.now - start
        self.recovering = False

    def _on_failure(self) -> None:
        """A failure struck: roll back to the last completed checkpoint and recover."""
        self.n["failures"] += 1
        self.n["failures_in_recovery"] += self.recovering
        self.t["lost"] += self.done_s - self.committed_s
        self.done_s = self.committed_s
        if self.writer is not None and self.writer.is_alive:
            self.writer.interrupt("failure")
        self.writer = None
        self.recovering = True
        self.saves_since_start = 0
        self.last_failure_s = self.env.now
        if self.pool is not None:
            self.spares_owed += 1
            self.env.process(self._repair())

    def _repair(self):
        yield self.env.timeout(float(self.repair.sample(self.rng)))
        yield self.pool.put(1)

    # -- failures -----------------------------------------------------------------------
    def _failures(self, job: simpy.Process):
        while True:
            t, cause = self._next_failure()
            self.next_failure_at = max(t, self.env.now)
            if not math.isfinite(t):
                return
            yield self.env.timeout(max(t - self.env.now, 0.0))
            if not job.is_alive:
                return
            job.interrupt(cause)

    def _next_failure(self) -> tuple[float, object]:
        """The next failure's time and what the job's interrupt carries (its class)."""
        return self.source.next_failure_s(), "failure"

    def run(self) -> dict:
        """Run the job to completion; times in seconds, counts as integers."""
        job = self.env.process(self._job())
        self.env.process(self._failures(job))
        # The final save belongs to the job: a job of a few microseconds is not stuck.
        limit = self.env.timeout(MAX_WALL_FACTOR * (self.work_s + self.write_s))
        self.env.run(until=self.env.any_of([job, limit]))
        if job.is_alive:
            raise InputError(
                f"the job made no headway: not done after {MAX_WALL_FACTOR:g}x its work in wall "
                "time (failures too frequent for the save and restart costs)"
            )
        wall = self.env.now
        return {
            "wall_s": wall,
            "useful_s": self.done_s,
            "lost_s": self.t["lost"],
            "checkpoint_s": self.t["checkpoint"],
            "recovery_s": self.t["recovery"],
            "spare_wait_s": self.t["spare_wait"],
            "compute_s": self.t["compute"],
            **self.n,
        }
