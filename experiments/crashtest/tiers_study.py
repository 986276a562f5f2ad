"""The tiered closed-loop study: a failure mix, two checkpoint tiers, and the model's prediction.

1. Pilot: one short job with both tiers, ended once by a process kill and once by a node loss at
   fixed steps, measures the step time, each tier's save stall, the restarts and the start-up.
2. Policies, from the pilot and the clock's class mix through the model's own functions: the
   best single tier (``tiers.single_tier_plan``: the persistent tier for every class), the
   model's two-tier plan (``tiers.first_order_plan``), a hand-set two-tier schedule of round
   step counts, and the adaptive tiered controller (``policy=None`` with ``local_dir``, its
   prior the clock's mix).
3. Repeats: each draws one list of launch lifetimes with their classes (``KillSchedule.draw_mix``)
   and every policy meets it (common random numbers); one more job runs without failures, the
   reference for bit-exact resumption.
4. Every run is accounted from its logs and predicted by the tiered simulator
   (``predict_tiers``) from its own measurements and the failures it met.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
import tempfile
import threading
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np

from experiments.crashtest.accounting import RunAccount, account_run
from experiments.crashtest.injector import KillSchedule
from experiments.crashtest.predict_tiers import (
    CLASS_ORDER,
    TierParams,
    expected_wall_s,
    replay_wall_s,
    scenario_for,
)
from experiments.crashtest.study import runs_span_s
from experiments.crashtest.supervisor import JobSpec, run_job
from experiments.crashtest.train_gpt import FINAL
from simulator.model.tiers import first_order_plan, single_tier_plan

__all__ = ["TiersConfig", "run_tiers_study"]


@dataclass(frozen=True, kw_only=True)
class TiersConfig:
    """Size and setting of the study."""

    workdir: Path
    """Scratch directory for the runs' persistent tiers and logs."""
    local_root: Path | None = None
    """Where the jobs' local tiers go (default: a fresh directory in /dev/shm)."""
    mtbf_s: float = 40.0
    """Mean of the failure clock, every class together, seconds."""
    shares: dict = field(
        default_factory=lambda: {"process": 0.55, "hang": 0.10, "node": 0.15, "preemption": 0.20}
    )
    """Each class's share of the failures (most are process failures: the host survives)."""
    work_s: float = 100.0
    """Failure-free compute of one job, seconds (turned into steps by the pilot)."""
    repeats: int = 6
    restart_delay_s: float = 1.0
    hang_timeout_s: float = 3.0
    """A hang is noticed this long after it starts (a collective's timeout, scaled)."""
    grace_s: float = 0.4
    """Seconds between a preemption's SIGTERM and its SIGKILL: shorter than a persistent save
    (~0.55 s), as a cloud's spot notice (30 s on GCP) is shorter than a 60 s save."""
    persistent_bytes_per_s: float = 40e6
    """The persistent tier's speed (``slowstore``): ~0.5 s for the study's 21 MB."""
    hand_set_steps: tuple[int, int] = (100, 1000)
    """The hand-set schedule: local every N steps, persistent every M."""
    workers: int = 2
    seed: int = 2026
    replicas: int = 300
    """Monte-Carlo replicas per policy for the expected wall time."""
    model_args: dict = field(default_factory=dict)


PILOT_STEPS = 300


def _spec(cfg: TiersConfig, run_dir: Path, steps: int, policy: dict, local: Path | None, **kw):
    # Every policy runs with the same grace period: a preemption is the cluster's, not theirs.
    args = dict(
        cfg.model_args, persistent_bytes_per_s=cfg.persistent_bytes_per_s, grace_s=cfg.grace_s
    )
    return JobSpec(
        run_dir=run_dir,
        steps=steps,
        policy=policy,
        prior_mtbf_s=cfg.mtbf_s,
        model_args=args,
        local_dir=local,
        **kw,
    )


def pilot(cfg: TiersConfig, local_root: Path, progress=print, *, run=True) -> TierParams:
    """Measure the machine: both tiers saved often, a process kill and a node loss."""
    spec = _spec(
        cfg, cfg.workdir / "pilot", PILOT_STEPS,
        {"kind": "tiers", "local_s": 0.5, "persistent_s": 2.0}, local_root / "pilot",
    )  # fmt: skip
    if run:
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        shutil.rmtree(spec.local_dir, ignore_errors=True)
        progress("pilot: measuring step time, each tier's save stall and the restarts")
        run_job(
            spec, KillSchedule(lifetimes_s=(1e9, 1e9), classes=("process", "node")),
            restart_delay_s=cfg.restart_delay_s,
            kill_at_steps=(PILOT_STEPS * 2 // 5, PILOT_STEPS * 3 // 4),
        )  # fmt: skip
    acc = account_run(spec.run_dir, spec.steps)
    restart = _by_class(acc.failure_classes, acc.restarts_after_s)
    base = float(np.mean([v for v in restart.values()]))
    return TierParams(
        step_s=acc.step_s,
        local_s=float(np.mean(acc.tier_saves_s["local"])),
        persistent_s=float(np.mean(acc.tier_saves_s["persistent"])),
        startup_s=acc.startup_s,
        restart_s={c: restart.get(c, base) for c in CLASS_ORDER},
        gone_s={"hang": cfg.hang_timeout_s, "preemption": 0.0},
        mtbf_s={c: cfg.mtbf_s / s for c, s in cfg.shares.items() if s > 0},
    )


def _by_class(classes, values) -> dict:
    out: dict = {}
    for c, v in zip(classes, values, strict=True):
        if v is not None:
            out.setdefault(c, []).append(v)
    return {c: float(np.mean(v)) for c, v in out.items()}


def policy_set(cfg: TiersConfig, p0: TierParams, steps: int) -> dict[str, dict]:
    """Label -> ``train_gpt`` policy spec (and whether it has a local tier)."""
    single = replace(p0, preempt_commits=p0.persistent_s + p0.step_s <= cfg.grace_s)
    tau1 = single_tier_plan(scenario_for(single, steps, tiers=False))["interval_s"]
    plan = first_order_plan(scenario_for(p0, steps, tiers=True))["tier_intervals_s"]
    local_n, persistent_n = cfg.hand_set_steps
    rates = {c: 1.0 / m for c, m in p0.mtbf_s.items()}
    prior = {
        "process_mtbf_s": 1.0 / (rates.get("process", 0) + rates.get("hang", 0)),
        "node_mtbf_s": 1.0 / rates["node"],
        "local_s": p0.local_s,
        "persistent_s": p0.persistent_s,
    }
    return {
        f"best single tier ({tau1:.1f} s)": {"kind": "fixed", "interval_s": tau1},
        f"model two-tier ({plan['local']:.1f} s / {plan['persistent']:.1f} s)": {
            "kind": "tiers",
            "local_s": plan["local"],
            "persistent_s": plan["persistent"],
        },
        f"hand-set: every {local_n} / {persistent_n} steps": {
            "kind": "steps-tiers",
            "local_every": local_n,
            "persistent_every": persistent_n,
        },
        "adaptive tiered (policy=None)": {"kind": "adaptive-tiers", "prior": prior},
    }


def _has_local(spec: dict) -> bool:
    return spec["kind"] in ("tiers", "steps-tiers", "adaptive-tiers")


def plan_jobs(cfg: TiersConfig, p0: TierParams, local_root: Path):
    """(steps, label -> spec, schedules, jobs), deterministic in the seed."""
    steps = max(100, round(cfg.work_s / p0.step_s))
    specs = policy_set(cfg, p0, steps)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(cfg.repeats)]
    schedules = [KillSchedule.draw_mix(cfg.mtbf_s, cfg.shares, rng) for rng in rngs]
    jobs = []
    order = random.Random(cfg.seed)
    labels = list(specs)
    for r in range(cfg.repeats):
        shuffled = list(labels)
        order.shuffle(shuffled)  # slow drift of the machine's load hits no policy more often
        for label in shuffled:
            i = labels.index(label)
            spec = dict(specs[label])
            prior = spec.pop("prior", None)
            kw = dict(prior_restart_s=p0.restart_s["process"])
            job = _spec(
                cfg, cfg.workdir / f"r{r}-p{i}", steps, spec,
                local_root / f"r{r}-p{i}" if _has_local(spec) else None, **kw,
            )  # fmt: skip
            if prior is not None:
                job = replace(job, model_args=dict(job.model_args, prior_json=json.dumps(prior)))
            jobs.append((label, r, job, schedules[r]))
    reference = _spec(cfg, cfg.workdir / "reference", steps, {"kind": "fixed", "interval_s": 1e9},
                      None)  # fmt: skip
    jobs.append(("reference (no failures)", -1, reference, KillSchedule(lifetimes_s=())))
    return steps, specs, schedules, jobs


def run_tiers_study(cfg: TiersConfig, progress=print, *, reuse: bool = False) -> dict:
    """Pilot, every run, accounting and predictions; returns what the report needs."""
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    local_root = cfg.local_root or Path(tempfile.mkdtemp(prefix="ckptsim-tiers-", dir=base))
    load = [os.getloadavg()[0]]
    samples: list[float] = []
    stop = threading.Event()

    def sample() -> None:  # the shared machine's load while the runs run, every 30 s
        while not stop.wait(30.0):
            samples.append(os.getloadavg()[0])

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    try:
        p0 = pilot(cfg, local_root, progress, run=not reuse)
        steps, specs, _, jobs = plan_jobs(cfg, p0, local_root)
        progress(
            f"pilot: {p0.step_s * 1e3:.1f} ms/step, local save {p0.local_s:.3f} s, persistent "
            f"save {p0.persistent_s:.3f} s, restart {p0.restart_s['process']:.2f} s; "
            f"{len(specs)} policies x {cfg.repeats} repeats of {steps} steps + a reference"
        )

        def one(job):
            label, r, spec, schedule = job
            if not reuse:
                shutil.rmtree(spec.run_dir, ignore_errors=True)
                if spec.local_dir is not None:
                    shutil.rmtree(spec.local_dir, ignore_errors=True)
                run_job(
                    spec, schedule, restart_delay_s=cfg.restart_delay_s,
                    hang_timeout_s=cfg.hang_timeout_s, grace_s=cfg.grace_s,
                )  # fmt: skip
            acc = account_run(spec.run_dir, spec.steps)
            progress(
                f"  repeat {r} {label}: wall {acc.wall_s:.1f} s, {acc.failures} failures "
                f"({', '.join(acc.failure_classes) or 'none'}), lost {acc.lost_steps} steps"
            )
            return label, r, spec, schedule, acc

        with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
            results = list(pool.map(one, jobs))
    finally:
        stop.set()
        if cfg.local_root is None:
            shutil.rmtree(local_root, ignore_errors=True)
    load.append(os.getloadavg()[0])
    meta = cfg.workdir / "load.json"
    if not reuse:
        record = dict(start=load[0], end=load[1], cpus=os.cpu_count(), samples=samples)
        meta.write_text(json.dumps(record))
    study = analyse(cfg, p0, steps, specs, results)
    study["load"] = json.loads(meta.read_text()) if meta.exists() else None
    study["runs_span_s"] = runs_span_s([cfg.workdir / "pilot"] + [j[2].run_dir for j in jobs])
    return study


# -- analysis --------------------------------------------------------------------------------
def full_failures(acc: RunAccount, schedule: KillSchedule, cfg: TiersConfig, horizon_s: float):
    """The failures the run met (time after start, class), then those it would have met had
    it run longer: the simulated job may take longer than the real one did."""
    out = list(zip(acc.kill_times_s, acc.failure_classes, strict=True))
    k = len(out)
    t = out[-1][0] if out else 0.0
    if out:
        last = out[-1][1]
        t += cfg.restart_delay_s + (cfg.hang_timeout_s if last == "hang" else 0.0)
    while t < horizon_s and k < len(schedule.lifetimes_s):
        t += schedule.lifetime_s(k)
        cls = schedule.class_of(k)
        out.append((t, cls))
        t += cfg.restart_delay_s + (cfg.hang_timeout_s if cls == "hang" else 0.0)
        k += 1
    return out


def _mean(values, default):
    values = [v for v in values if v is not None]
    return float(np.mean(values)) if values else default


def pooled_params(
    cfg, accs: list[RunAccount], p0: TierParams, *, commits: bool, mine: list[RunAccount]
) -> TierParams:
    """The machine as every run of the study measured it (the pilot where they measured
    nothing); a preemption's cost, which depends on the policy (a save that fits the grace
    period or a kill at its end), as the policy's own runs (``mine``) measured it."""
    classes = [c for a in accs for c in a.failure_classes]
    restart = _by_class(classes, [v for a in accs for v in a.restarts_after_s])
    gone = _by_class(classes, [v for a in accs for v in a.gone_s])
    own_classes = [c for a in mine for c in a.failure_classes]
    for name, values in (("restart", restart), ("gone", gone)):
        field_ = "restarts_after_s" if name == "restart" else "gone_s"
        own = _by_class(own_classes, [v for a in mine for v in getattr(a, field_)])
        if "preemption" in own:
            values["preemption"] = own["preemption"]
    return replace(
        p0,
        step_s=sum(a.useful_s for a in accs) / sum(a.steps for a in accs),
        local_s=_mean([s for a in accs for s in a.tier_saves_s.get("local", ())], p0.local_s),
        persistent_s=_mean(
            [s for a in accs for s in a.tier_saves_s.get("persistent", ())], p0.persistent_s
        ),
        startup_s=float(np.mean([a.startup_s for a in accs])),
        restart_s={c: restart.get(c, p0.restart_s[c]) for c in CLASS_ORDER},
        gone_s={c: gone.get(c, p0.gone_s.get(c, 0.0)) for c in CLASS_ORDER},
        preempt_commits=commits,
    )


def run_params(a: RunAccount, pooled: TierParams, *, commits: bool) -> TierParams:
    """One run's own measurements, the pooled value where the run measured none."""
    restart = _by_class(a.failure_classes, a.restarts_after_s)
    gone = _by_class(a.failure_classes, a.gone_s)
    return replace(
        pooled,
        step_s=a.step_s,
        local_s=_mean(a.tier_saves_s.get("local", ()), pooled.local_s),
        persistent_s=_mean(a.tier_saves_s.get("persistent", ()), pooled.persistent_s),
        startup_s=a.startup_s,
        restart_s={c: restart.get(c, pooled.restart_s[c]) for c in CLASS_ORDER},
        gone_s={c: gone.get(c, pooled.gone_s[c]) for c in CLASS_ORDER},
        preempt_commits=commits,
    )


def intervals_of(spec: dict, a: RunAccount, step_s: float) -> dict:
    """Each tier's interval as the run kept it, in seconds of compute at ``step_s``."""
    if spec["kind"] == "steps-tiers":
        return {t: spec[f"{t}_every"] * step_s for t in ("local", "persistent")}
    tiers = ("local", "persistent") if _has_local(spec) else ("persistent",)
    out = {}
    for t in tiers:
        steps = a.interval_steps.get(t, ())
        fallback = spec.get(f"{t}_s", spec.get("interval_s", math.inf))
        out[t] = float(np.mean(steps)) * step_s if steps else fallback
    return out


def _same_final(run_dir: Path, reference: Path) -> bool:
    import torch
    from safetensors.torch import load_file

    a, b = load_file(str(run_dir / FINAL)), load_file(str(reference / FINAL))
    return a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def analyse(cfg, p0, steps, specs, results) -> dict:
    ref = next(r for r in results if r[1] == -1)
    runs = [r for r in results if r[1] >= 0]
    commits = {}
    for label in specs:
        accs = [r[4] for r in runs if r[0] == label]
        preempts = sum(c == "preemption" for a in accs for c in a.failure_classes)
        commits[label] = preempts == 0 or sum(len(a.preempt_commit_s) for a in accs) > preempts / 2
    every = [r[4] for r in runs]
    pooled = {}
    for label in specs:
        mine = [r[4] for r in runs if r[0] == label]
        pooled[label] = pooled_params(cfg, every, p0, commits=commits[label], mine=mine)
    rows = []
    for label, r, spec, schedule, a in runs:
        policy = specs[label]
        own = run_params(a, pooled[label], commits=commits[label])
        failures = full_failures(a, schedule, cfg, horizon_s=20 * a.wall_s)
        own_s = replay_wall_s(
            own, steps, intervals_of(policy, a, own.step_s), failures, grace_s=cfg.grace_s
        )
        pool_s = replay_wall_s(
            pooled[label], steps, intervals_of(policy, a, pooled[label].step_s), failures,
            grace_s=cfg.grace_s,
        )  # fmt: skip
        rows.append(
            dict(
                label=label, repeat=r, wall_s=a.wall_s, own_s=own_s, own_err=own_s / a.wall_s - 1,
                replay_s=pool_s, replay_err=pool_s / a.wall_s - 1, step_s=a.step_s,
                failures=a.failures, classes=list(a.failure_classes), lost_steps=a.lost_steps,
                lost_s=a.lost_s, saving_s=a.saving_s, recovery_s=a.recovery_s,
                startup_s=a.startup_s, useful_s=a.useful_s, saves=a.saves,
                balance_s=a.balance_s(), bit_exact=_same_final(spec.run_dir, ref[2].run_dir),
                preemptions=sum(c == "preemption" for c in a.failure_classes),
                preempt_commit_s=list(a.preempt_commit_s),
                local_saves=len(a.tier_saves_s.get("local", ())),
                persistent_saves=len(a.tier_saves_s.get("persistent", ())),
                intervals_s=intervals_of(policy, a, a.step_s),
                speed_spread=(
                    max(a.launch_step_s) / min(a.launch_step_s) if a.launch_step_s else 1.0
                ),
            )
        )  # fmt: skip
    expected = {}
    for i, (label, policy) in enumerate(specs.items()):
        accs = [r[4] for r in runs if r[0] == label]
        p = pooled[label]
        iv = {t: float(np.mean([intervals_of(policy, a, p.step_s)[t] for a in accs]))
              for t in intervals_of(policy, accs[0], p.step_s)}  # fmt: skip
        mean, sd = expected_wall_s(
            p, steps, iv, grace_s=cfg.grace_s, replicas=cfg.replicas, seed=cfg.seed + i
        )
        expected[label] = dict(mean_s=mean, sd_s=sd, intervals_s=iv)
    return dict(
        cfg=cfg, pilot=p0, pooled=pooled, steps=steps, specs=specs, rows=rows,
        expected=expected, reference=dict(wall_s=ref[4].wall_s, step_s=ref[4].step_s),
    )  # fmt: skip
