"""Benchmark of the discrete-event simulator: does the cost per event stay flat as N grows?

Three measurements, all printed (run: ``.venv/bin/python experiments/bench_des.py``):

1. Llama-3 scale: 16,384 GPUs with per-GPU Weibull(0.7) lifetimes (per-GPU mean 50,677 h, as
   in ``simulator/presets/llama3.toml``), 54 days of work, 100 replicas on all cores, optimal
   interval — the wall-clock time of the whole Monte-Carlo run.
2. Heap-based failure source, 512 vs 16,384 GPUs, in one run. The per-GPU mean is scaled so
   both clusters have the same job MTBF (3.09 h): the same job and the same event mix, so the
   ratio of seconds per event isolates what the cluster size costs.
3. The naive baseline — one SimPy process per component, each sleeping through its lifetime
   and interrupting the job — at growing sizes, to show its per-event cost grows with N.

"Events" are job events (compute segments and saves) plus failures; seconds per event is
process CPU-free wall time (time.perf_counter) of whole replicas, setup included, divided by
their events.
"""

from __future__ import annotations

import argparse
import os
import time

import numpy as np
import simpy

from simulator.des import ClusterJob, failure_source_for
from simulator.failure_source import stationary_residual
from simulator.montecarlo import _streams, replica_seed, simulate
from simulator.policies import ExactOptimal
from simulator.scenario import load_scenario

LLAMA = load_scenario("llama3").with_overrides(failure="weibull:shape=0.7")
JOB_MTBF_H = LLAMA.system_mtbf_s / 3600.0


def at_size(gpus: int):
    """The Llama-3 job on ``gpus`` GPUs with the same job MTBF (per-GPU mean scaled)."""
    return LLAMA.with_overrides(gpus=gpus, gpu_mtbf_h=JOB_MTBF_H * gpus)


class NaiveClusterJob(ClusterJob):
    """The textbook SimPy model: one process per component (O(N) processes per replica)."""

    def __init__(self, scenario, policy, rng):
        super().__init__(scenario, policy, failures=None, rng=rng)
        self.life = scenario.gpu_lifetime()
        self.failure_rng = rng

    def _component(self, job, first_s):
        yield self.env.timeout(first_s)
        while True:
            if not job.is_alive:
                return
            job.interrupt("failure")
            yield self.env.timeout(float(self.life.sample(self.failure_rng)))

    def run(self) -> dict:
        job = self.env.process(self._job())
        first = stationary_residual(self.life, self.failure_rng, self.scenario.gpus)
        for t in first.tolist():
            self.env.process(self._component(job, t))
        self.env.run(until=job)
        return {"wall_s": self.env.now, **self.n}


def time_replicas(make_job, replicas: int) -> tuple[float, int]:
    """Seconds and events for ``replicas`` replicas run one after another in this process."""
    events = 0
    start = time.perf_counter()
    for i in range(replicas):
        r = make_job(i).run()
        events += r["events"] + r["failures"]
    return time.perf_counter() - start, events


def heap_job(scenario):
    def make(i):
        gpu_rng, node_rng, other = _streams(replica_seed(0, i))
        return ClusterJob(
            scenario, ExactOptimal(), failure_source_for(scenario, gpu_rng, node_rng), other
        )

    return make


def naive_job(scenario):
    return lambda i: NaiveClusterJob(scenario, ExactOptimal(), _streams(replica_seed(0, i))[0])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--replicas", type=int, default=100, help="Llama-3-scale replicas")
    parser.add_argument("--per-size", type=int, default=10, help="replicas per size in 2 and 3")
    args = parser.parse_args()

    print(f"cores: {os.cpu_count()}, simpy {simpy.__version__}, numpy {np.__version__}")
    print(
        f"\n1. Llama-3 scale: {LLAMA.gpus:,} GPUs, weibull(0.7), per-GPU mean "
        f"{LLAMA.gpu_mtbf_h:,.0f} h, {LLAMA.work_h / 24:.0f} days of work"
    )
    start = time.perf_counter()
    result = simulate(LLAMA, ExactOptimal(), replicas=args.replicas, seed=0, progress=False)
    elapsed = time.perf_counter() - start
    s = result.summary()
    events = int(result.records["events"].sum() + result.records["failures"].sum())
    print(
        f"   {args.replicas} replicas on all cores: {elapsed:.1f} s wall "
        f"({events:,} events, {events / elapsed:,.0f} events/s overall)"
    )
    print(
        f"   wall time {s['wall_h_mean']:,.1f} h (95% CI {s['wall_h_ci95'][0]:,.1f}-"
        f"{s['wall_h_ci95'][1]:,.1f}), {s['failures_mean']:.0f} failures per run"
    )

    print(
        f"\n2. heap failure source, same job MTBF {JOB_MTBF_H:.2f} h, {args.per_size} "
        "replicas per size, one process"
    )
    per_event = {}
    for gpus in (512, 16_384):
        secs, ev = time_replicas(heap_job(at_size(gpus)), args.per_size)
        per_event[gpus] = secs / ev
        print(
            f"   {gpus:>6,} GPUs: {secs:6.2f} s, {ev:,} events, "
            f"{1e6 * secs / ev:6.2f} us/event, {ev / secs:,.0f} events/s"
        )
    ratio = per_event[16_384] / per_event[512]
    print(f"   per-event cost ratio 16,384 / 512 GPUs: {ratio:.2f} (N grew 32x)")

    print("\n3. naive baseline: one SimPy process per GPU")
    naive = {}
    for gpus in (512, 2048, 8192):
        secs, ev = time_replicas(naive_job(at_size(gpus)), max(2, args.per_size // 2))
        naive[gpus] = secs / ev
        print(
            f"   {gpus:>6,} GPUs: {secs:6.2f} s, {ev:,} events, "
            f"{1e6 * secs / ev:6.2f} us/event, {ev / secs:,.0f} events/s"
        )
    print(f"   per-event cost ratio 8,192 / 512 GPUs: {naive[8192] / naive[512]:.2f} (N grew 16x)")


if __name__ == "__main__":
    main()
