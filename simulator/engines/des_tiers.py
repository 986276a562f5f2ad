"""The discrete-event model with checkpoint tiers and failure classes (``simulator.model.tiers``).

The same job as ``simulator.engines.des.ClusterJob`` — the same recovery, spare pool, repairs and
time buckets — with two differences. Failures come from one source per class (class i of
replica r draws from stream ``streams.CLASSES + i``; without classes the scenario's own
failures are one class, from the very streams the single-tier model uses) and interrupt the
job with their class. Saves follow a ``TierSchedule``: at each save point every tier due
there is saved, cheapest first (sync tiers stall for their write, async tiers for staging,
their write running behind, one at a time per tier). A failure of class c destroys the copies
of tiers that do not survive c and every write under way, and rolls back to
``tiers.rollback`` — the newest surviving copy — whose tier's restore time the recovery
pays, with c's detection and restart; when a just-in-time tier survives c, the job loses no
work and the recovery pays that tier's save as well as its restore. The job's final state
goes to ``tiers.final_tiers``.
"""

from __future__ import annotations

import simpy

from simulator.engines.des import ClusterJob, failure_source_for
from simulator.engines.streams import class_streams
from simulator.errors import InputError
from simulator.model.failure_source import ComponentFailures, MergedFailures
from simulator.model.failures import parse_failure
from simulator.model.scenario import IMPLICIT_CLASS, Scenario
from simulator.model.tiers import TierSchedule, final_tiers, jit_tier, rollback, scheduled

__all__ = ["TieredClusterJob", "class_sources"]


def class_sources(scenario: Scenario, gpu_rng, node_rng, rng_or_seed) -> MergedFailures:
    """One failure source per class, merged; a failure's source index is its class."""
    if not scenario.failure_classes:
        return MergedFailures(failure_source_for(scenario, gpu_rng, node_rng))
    rngs = class_streams(rng_or_seed, len(scenario.failure_classes))
    stationary = scenario.component_age == "stationary"
    sources = []
    for c, rng in zip(scenario.failure_classes, rngs, strict=True):
        n = c.components(scenario.gpus, scenario.nodes)
        mtbf_h = c.mtbf_h or c.gpu_mtbf_h or c.node_mtbf_h
        life = parse_failure(c.failure, mtbf_h * 3600.0)
        sources.append(ComponentFailures(life, n, rng, stationary=stationary))
    return MergedFailures(*sources)


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
        self.copies: dict[str, float | None] = dict.fromkeys([*self.tier_write, *self.jit_write])
        self.mark = dict.fromkeys(self.tier_write, 0.0)  # progress at the tier's last save
        self.saved = dict.fromkeys(self.tier_write, 0)  # saves of each tier since the start
        self.writers: dict[str, simpy.Process] = {}
        self.counts = {f"failures_{c}": 0 for c in self.classes}
        self.counts.update({f"lost_by_{c}_s": 0.0 for c in self.classes})
        self.counts.update({f"recovery_by_{c}_s": 0.0 for c in self.classes})
        self.counts.update({f"saves_{t}": 0 for t in self.copies})
        self.counts.update({f"restores_{t}": 0 for t in self.copies})
        self.failure_log: list[tuple[float, str]] = []
        self.pending: tuple[int, object] = (0, None)

    # -- what is due --------------------------------------------------------------------
    def _next_segment(self) -> float:
        iv = self.policy.intervals_s
        # Rounding can leave a tier a hair past due (a save cut short keeps its old mark).
        return max(0.0, min(iv[n] - (self.done_s - self.mark[n]) for n in iv))

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
                yield timeout(segment)
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
        index, tier = self.pending
        restore = 0.0 if tier is None else tier.restore_s
        if tier is not None and tier.jit:  # the healthy replicas write the state first
            restore += self.jit_write[tier.name]
        if not s.failure_classes:
            return s.detection_s, s.restart_s + restore + s.warmup_s
        c = s.failure_classes[index]
        restart = s.restart_s if c.restart_s is None else c.restart_s
        return c.detection_s, restart + restore + s.warmup_s

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
        for t in self.scenario.tiers:
            if name not in t.survives:
                self.copies[t.name] = None
        for writer in self.writers.values():
            if writer.is_alive:
                writer.interrupt("failure")
        self.writers = {}
        tier = jit_tier(self.scenario.tiers, name)
        if tier is not None:  # saved just in time: the job resumes where it failed
            at = self.done_s
            self.copies[tier.name] = at
            self.counts[f"saves_{tier.name}"] += 1
        else:
            at, tier = rollback(self.copies, self.scenario.tiers, name)
        self.t["lost"] += self.done_s - at
        self.counts[f"lost_by_{name}_s"] += self.done_s - at
        self.done_s = at
        for t in self.tiers:
            copy = self.copies[t.name]
            self.mark[t.name] = at if copy is None else copy
        self.committed_s = at
        self.pending = (index, tier)
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
        out.update(self.counts)
        return out


def run_tiered(scenario: Scenario, schedule, rng_or_seed, streams, failure_times=None) -> dict:
    """One tiered replica from its streams (``streams.replica_streams``)."""
    gpu_rng, node_rng, other_rng = streams
    if failure_times is not None:
        raise InputError("trace replay with [[tier]] tables is not modelled yet")
    if schedule is None or isinstance(schedule, str):
        schedule = TierSchedule.for_scenario(scenario)  # the tiers' own interval_s
    source = class_sources(scenario, gpu_rng, node_rng, rng_or_seed)
    return TieredClusterJob(scenario, schedule, source, other_rng).run()
