"""The discrete-event model with checkpoint tiers and failure classes (``simulator.model.tiers``).

The same job as ``simulator.engines.des.ClusterJob`` — the same recovery, spare pool, repairs and
time buckets — with these differences. Failures come from one source per class (class i of
replica r draws from stream ``streams.CLASSES + i``; without classes the scenario's own
failures are one class, from the very streams the single-tier model uses), or from a trace
whose every failure names its class, and interrupt the job with their class. A class in
bursts (``model.failure_source.BurstFailures``) adds its follow-ups from a stream of its own;
a class with a detection-time family draws each failure's detection time from another
(``streams.class_parts``), so schedules compared on one seed meet the same failures, bursts
and detection times. Saves follow a ``TierSchedule``: at each save point every tier due
there is saved, cheapest first (sync tiers stall for their write, async tiers for staging,
their write running behind, one at a time per tier). A failure of class c destroys the copies
of tiers that do not survive c and every write under way, and rolls back to
``tiers.rollback`` — the newest surviving copy — whose tier's restore time the recovery
pays, with c's detection and restart; when a just-in-time tier survives c, the job loses no
work and the recovery pays that tier's save as well as its restore (``tiers.served_by``).
An every-step tier holds the state at the last step completed since the job last resumed
(steps of ``step_s`` compute seconds counted from there), and its per-step stall is booked
with the compute as it runs: each compute second takes 1 + step_stall_s/step_s seconds of
wall time, the excess in the checkpoint bucket (a fluid model of one stall per step: no
event per step). The job's final state goes to ``tiers.final_tiers``.
"""

from __future__ import annotations

import math

import simpy

from simulator.engines.des import ClusterJob, failure_source_for
from simulator.engines.streams import class_parts, class_streams
from simulator.errors import InputError
from simulator.model.failure_source import BurstFailures, ComponentFailures, Draws, MergedFailures
from simulator.model.failures import parse_failure
from simulator.model.scenario import IMPLICIT_CLASS, Scenario
from simulator.model.tiers import (
    TierSchedule,
    final_tiers,
    interval_origin,
    jit_copies,
    rollback,
    scheduled,
    served_by,
    step_tier,
)
from simulator.model.trace import ClassTrace, TraceFailures

__all__ = ["ClassFailures", "TieredClusterJob", "class_sources", "trace_sources"]


class ClassFailures:
    """A tiered job's failures: (time, class index) in time order from ``source``, and each
    failure's detection time — the class's fixed one, or the next of its ``detections``
    (``failure_source.Draws``; None for a class whose detection is fixed)."""

    def __init__(self, source, detections):
        self.source, self.detections = source, list(detections)

    def next_failure(self) -> tuple[float, int]:
        return self.source.next_failure()

    def next_failure_s(self) -> float:
        return self.next_failure()[0]

    def detection_s(self, index: int, fixed_s: float) -> float:
        """The detection time of the failure of class ``index`` now under way, seconds."""
        draws = self.detections[index] if index < len(self.detections) else None
        return fixed_s if draws is None else draws.next()


def _detections(scenario: Scenario, class_rngs) -> list:
    """Each class's detection draws (None where detection is fixed), from its own stream."""
    out = []
    for c, rng in zip(scenario.failure_classes, class_rngs, strict=True):
        life = c.detection_times()
        out.append(None if life is None else Draws(life, class_parts(rng)[0]))
    return out


def class_sources(scenario: Scenario, gpu_rng, node_rng, rng_or_seed) -> ClassFailures:
    """One failure source per class (with its bursts), merged; a failure's source index is its
    class."""
    if not scenario.failure_classes:
        return ClassFailures(MergedFailures(failure_source_for(scenario, gpu_rng, node_rng)), [])
    rngs = class_streams(rng_or_seed, len(scenario.failure_classes))
    detections = _detections(scenario, rngs)
    stationary = scenario.component_age == "stationary"
    sources = []
    for c, rng in zip(scenario.failure_classes, rngs, strict=True):
        n = c.components(scenario.gpus, scenario.nodes)
        mtbf_h = c.mtbf_h or c.gpu_mtbf_h or c.node_mtbf_h
        life = parse_failure(c.failure, mtbf_h * 3600.0)
        source = ComponentFailures(life, n, rng, stationary=stationary)
        if c.burst_followups:
            source = BurstFailures(source, c.followups, c.burst_window_s, class_parts(rng)[1])
        sources.append(source)
    return ClassFailures(MergedFailures(*sources), detections)


def trace_sources(scenario: Scenario, trace, rng_or_seed) -> ClassFailures:
    """A replayed failure log as the job's failures: each with the class the log gives it
    (``model.trace.ClassTrace``), or the one class when the scenario has only one; detection
    times drawn as for simulated failures. A trace is what happened: no bursts are added."""
    names = [c.name for c in scenario.failure_classes] or [IMPLICIT_CLASS]
    if isinstance(trace, ClassTrace):
        times, classes = trace.times_s, list(trace.classes)
    elif len(names) == 1:
        times = trace
        classes = [names[0]] * len(times)
    else:
        raise InputError(
            f"a trace replayed against {len(names)} failure classes needs each failure's class: "
            "name the log's cause column (--cause-column) and map its causes to the classes "
            "(--cause-class CAUSE=CLASS)"
        )
    index = {n: i for i, n in enumerate(names)}
    unknown = sorted({c for c in classes if c not in index})
    if unknown:
        raise InputError(
            f"the trace names failure class {unknown[0]!r}, which the scenario does not have "
            f"(classes: {', '.join(names)})"
        )
    detections = []
    if scenario.failure_classes:
        detections = _detections(scenario, class_streams(rng_or_seed, len(names)))
    source = TraceFailures(times, classes=[index[c] for c in classes])
    return ClassFailures(source, detections)


class TieredClusterJob(ClusterJob):
    """One replica of a tiered job; ``run()`` adds per-class and per-tier counts."""

    def __init__(self, scenario, schedule: TierSchedule, failures: MergedFailures, rng):
        if not isinstance(schedule, TierSchedule):
            raise InputError(
                "a scenario with [[tier]] tables needs a tier schedule (interval_s per tier, "
                "or --tier-interval-s NAME=SECONDS), not a single-tier policy"
            )
        schedule.check(scenario)
        super().__init__(scenario, schedule, failures, rng)
        writers = scenario.writer_nodes or scenario.nodes or 1
        # Cheapest first: at a shared save point the quick copies are safe soonest.
        self.tiers = sorted(scheduled(scenario.tiers), key=lambda t: t.stall_s(writers))
        self.jit_write = {t.name: t.write_s(writers) for t in scenario.tiers if t.jit}
        self.tier_write = {t.name: t.write_s(writers) for t in self.tiers}
        self.tier_stall = {t.name: t.stall_s(writers) for t in self.tiers}
        self.final = {t.name for t in final_tiers(self.tiers)}
        self.classes = [c.name for c in scenario.failure_classes] or [IMPLICIT_CLASS]
        # An every-step tier: wall seconds per compute second, and where its steps count from.
        self.step = step_tier(scenario.tiers)
        self.slow = 1.0 + self.step.step_stall_s / self.step.step_s if self.step else 1.0
        self.step_base = 0.0
        stepped = [self.step.name] if self.step else []
        self.copies: dict[str, float | None] = dict.fromkeys(
            [*self.tier_write, *self.jit_write, *stepped]
        )
        self.mark = dict.fromkeys(self.tier_write, 0.0)  # progress at the tier's last save
        self.saved = dict.fromkeys(self.tier_write, 0)  # saves of each tier since the start
        self.writers: dict[str, simpy.Process] = {}
        self.counts = {f"failures_{c}": 0 for c in self.classes}
        self.counts.update({f"lost_by_{c}_s": 0.0 for c in self.classes})
        self.counts.update({f"recovery_by_{c}_s": 0.0 for c in self.classes})
        self.counts.update({f"saves_{t}": 0 for t in self.copies})
        self.counts.update({f"restores_{t}": 0 for t in self.copies})
        self.failure_log: list[tuple[float, str]] = []
        self.detection_log: list[float] = []  # each failure's detection time, in order
        self.pending: tuple[int, object, float] = (0, None, 0.0)  # class, tier, detection

    # -- what is due --------------------------------------------------------------------
    def _next_segment(self) -> float:
        iv = self.policy.intervals_s
        # Rounding can leave a tier a hair past due (a save cut short keeps its old mark).
        left = (iv[n] - (self.done_s - self.mark[n]) for n in iv)
        return max(0.0, min(left, default=math.inf))  # no scheduled tier: run to the end

    def _book_cut(self, phase: str | None, start: float) -> None:
        if phase == "compute" and self.step is not None:  # the step stalls ran along
            elapsed = self.env.now - start
            computed = elapsed / self.slow
            self.t["compute"] += computed
            self.done_s += computed
            self.t["checkpoint"] += elapsed - computed
            return
        super()._book_cut(phase, start)

    def _due(self, final: bool) -> list:
        iv, every = self.policy.intervals_s, self.policy.every
        due = set()
        for n, tau in iv.items():
            if self.done_s - self.mark[n] >= tau * (1.0 - 1e-9):
                due.add(n)
        for n, (base, k) in every.items():
            if base in due and (self.saved[base] + 1) % k == 0:
                due.add(n)
        if final:
            due |= self.final
        return [t for t in self.tiers if t.name in due]

    def _job(self):
        env, timeout, t = self.env, self.env.timeout, self.t
        work_s = self.work_s
        start = env.now  # of the timed wait under way (read only while ``phase`` is set)
        while True:
            phase = None
            try:
                if self.recovering:
                    yield from self._recover()
                if self.done_s >= work_s:
                    for name in list(self.writers):
                        yield from self._await(name)
                    return
                interval_s = self._next_segment()
                left = work_s - self.done_s
                segment = self._segment(left, interval_s)
                start = env.now
                self.n["events"] += 1
                phase = "compute"
                if self.step is None:
                    yield timeout(segment)
                else:  # each step's snapshot stalls training as it goes
                    yield timeout(segment * self.slow)
                    t["checkpoint"] += segment * self.slow - segment
                t["compute"] += segment
                self.done_s = work_s if segment >= left else self.done_s + segment
                for tier in self._due(final=self.done_s >= work_s):
                    name = tier.name
                    self.n["events"] += 1
                    phase = None
                    yield from self._await(name)
                    start = env.now
                    phase = "stall"
                    yield timeout(self.tier_stall[name])
                    t["checkpoint"] += env.now - start
                    phase = None
                    self.mark[name] = self.done_s
                    self.saved[name] += 1
                    if tier.asynchronous:
                        self.writers[name] = env.process(self._write(name, self.done_s))
                    else:
                        self._commit_tier(name, self.done_s)
            except simpy.Interrupt as exc:
                self._book_cut(phase, start)
                self._on_failure(exc.cause)

    def _await(self, name: str):
        writer = self.writers.get(name)
        if writer is not None and writer.is_alive:
            yield from self._stall(writer)

    def _write(self, name: str, snapshot_s: float):
        try:
            yield self.env.timeout(self.tier_write[name])
        except simpy.Interrupt:
            return  # a failure before the write completed: this copy is lost
        self._commit_tier(name, snapshot_s)

    def _commit_tier(self, name: str, snapshot_s: float) -> None:
        self.copies[name] = snapshot_s
        self.n["checkpoints"] += 1
        self.counts[f"saves_{name}"] += 1

    # -- failures -------------------------------------------------------------------------
    def _next_failure(self):
        return self.source.next_failure()

    def _recovery_times(self):
        s = self.scenario
        index, tier, detection_s = self.pending
        restore = 0.0 if tier is None else tier.restore_s
        if tier is not None and tier.jit:  # the healthy replicas write the state first
            restore += self.jit_write[tier.name]
        if not s.failure_classes:
            return detection_s, s.restart_s + restore + s.warmup_s
        c = s.failure_classes[index]
        restart = s.restart_s if c.restart_s is None else c.restart_s
        return detection_s, restart + restore + s.warmup_s

    def _recover(self):
        # Charged to the class being recovered from, cut short or not, so the classes' shares
        # add up to the whole recovery time.
        start, name = self.env.now, self.classes[self.pending[0]]
        try:
            yield from super()._recover()
        finally:
            self.counts[f"recovery_by_{name}_s"] += self.env.now - start
        tier = self.pending[1]
        if tier is not None:
            self.counts[f"restores_{tier.name}"] += 1

    def _on_failure(self, cause=0) -> None:
        index = int(cause)
        name = self.classes[index]
        self.n["failures"] += 1
        self.n["failures_in_recovery"] += self.recovering
        self.counts[f"failures_{name}"] += 1
        self.failure_log.append((self.env.now, name))
        kind, by = served_by(self.scenario.tiers, name)  # the rule the closed forms follow
        if kind == "step":  # its copy holds the last step completed since the job resumed
            steps = math.floor((self.done_s - self.step_base) / by.step_s)
            self.copies[by.name] = min(self.done_s, self.step_base + steps * by.step_s)
        for t in self.scenario.tiers:
            if name not in t.survives:
                self.copies[t.name] = None
        for writer in self.writers.values():
            if writer.is_alive:
                writer.interrupt("failure")
        self.writers = {}
        if kind == "jit":  # saved just in time: the job resumes where it failed
            at, tier = self.done_s, by
            for copy in jit_copies(tier):  # its own, and one in its into tier
                self.copies[copy] = at
            self.counts[f"saves_{tier.name}"] += 1
        else:  # the newest surviving copy: the step's, or a scheduled tier's if newer
            at, tier = rollback(self.copies, self.scenario.tiers, name)
        self.t["lost"] += self.done_s - at
        self.counts[f"lost_by_{name}_s"] += self.done_s - at
        self.done_s = at
        for t in self.tiers:
            self.mark[t.name] = interval_origin(self.copies, self.tiers, t.name)
        self.committed_s = at
        self.step_base = at
        classes = self.scenario.failure_classes
        fixed_s = classes[index].detection_s if classes else self.scenario.detection_s
        detection = getattr(self.source, "detection_s", None)
        detection_s = fixed_s if detection is None else detection(index, fixed_s)
        self.detection_log.append(detection_s)
        self.pending = (index, tier, detection_s)
        self.recovering = True
        self.last_failure_s = self.env.now
        if self.pool is not None:
            nodes = (
                1
                if not self.scenario.failure_classes
                else (self.scenario.failure_classes[index].nodes_lost)
            )
            self.spares_owed += nodes
            for _ in range(nodes):
                self.env.process(self._repair())

    def run(self) -> dict:
        out = super().run()
        if self.step is not None:  # its snapshots: one per step computed, rolled back or not
            self.counts[f"saves_{self.step.name}"] = int(self.t["compute"] // self.step.step_s)
        out.update(self.counts)
        return out


def run_tiered(scenario: Scenario, schedule, rng_or_seed, streams, failure_times=None) -> dict:
    """One tiered replica from its streams (``streams.replica_streams``); ``failure_times``
    replays a trace (an array, a ``ClassTrace``, or a function of the replica's GPU stream
    giving one, as ``des_replicas.run_replica`` takes)."""
    gpu_rng, node_rng, other_rng = streams
    if schedule is None or isinstance(schedule, str):
        schedule = TierSchedule.for_scenario(scenario)  # the tiers' own interval_s
    if failure_times is None:
        source = class_sources(scenario, gpu_rng, node_rng, rng_or_seed)
    else:
        trace = failure_times(gpu_rng) if callable(failure_times) else failure_times
        source = trace_sources(scenario, trace, rng_or_seed)
    return TieredClusterJob(scenario, schedule, source, other_rng).run()
