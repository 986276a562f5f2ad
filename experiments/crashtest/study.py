"""The closed-loop study: calibrate, run every policy against the same kills, compare to the model.

1. Pilot: one short job, killed twice, measures this machine — seconds per step, the save
   stall δ, the restart cost R (kill to training again) and the first start-up.
2. Policies: fixed intervals around the closed-form optimum τ* = ExactOptimal(δ, MTBF), τ*
   itself (what ``ckptsim optimize`` would tell a user), a step-count default a user would pick
   (every 500 steps, Hugging Face Trainer's ``save_steps``), and the adaptive controller
   (``policy=None``) which measures δ and the step time live and learns the failure rate.
3. Repeats: each repeat draws one list of per-launch lifetimes and runs every policy against
   it (common random numbers), so policy differences are not differences in luck.
4. Every run is accounted from its logs and predicted by the simulator (replayed kills, and the
   Monte-Carlo expectation over the clock) with the parameters measured over the whole study.
"""

from __future__ import annotations

import json
import math
import os
import random
import shutil
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.crashtest.accounting import RunAccount, account_run, read_jsonl
from experiments.crashtest.injector import KillSchedule, make_lifetime
from experiments.crashtest.predict import MachineParams, expected_wall_s, replay_wall_s
from experiments.crashtest.supervisor import SUPERVISOR_LOG, JobSpec, run_job
from simulator import analytic

__all__ = ["RunResult", "StudyConfig", "full_trace", "pilot", "run_study"]

DEFAULT_EVERY_STEPS = 500
"""The step-count default: Hugging Face Trainer's ``save_steps``."""


@dataclass(frozen=True, kw_only=True)
class StudyConfig:
    """Size of the study."""

    workdir: Path
    """Scratch directory for the runs (checkpoints, logs)."""
    mtbf_s: float = 60.0
    """Mean of the failure clock, seconds."""
    weibull_shape: float | None = None
    """Weibull clock of this shape (None: exponential)."""
    work_s: float = 100.0
    """Failure-free compute of one job, seconds (turned into steps by the pilot)."""
    repeats: int = 4
    """Kill schedules; every policy runs once against each."""
    multipliers: tuple[float, ...] = (0.5, 4.0)
    """Fixed intervals, as multiples of the closed-form optimum τ*."""
    restart_delay_s: float = 1.0
    """Supervisor's wait between a kill and the relaunch, seconds."""
    workers: int = 2
    """Jobs at once (one CPU thread each)."""
    seed: int = 2026
    replicas: int = 2000
    """Monte-Carlo replicas per policy for the expected wall time."""
    model_args: dict = field(default_factory=dict)


@dataclass(frozen=True, kw_only=True)
class RunResult:
    label: str
    spec: dict
    repeat: int
    account: RunAccount
    schedule: KillSchedule


def full_trace(acc: RunAccount, schedule: KillSchedule, delay_s: float, horizon_s: float):
    """The kills the run met, then the ones it would have met had it run longer (s after start).

    The simulated job may take longer than the real one did; past the real job's end it must
    still meet the same clock, not a failure-free future.
    """
    times = list(acc.kill_times_s)
    t = times[-1] + delay_s if times else 0.0
    k = len(times)
    while t < horizon_s and k < len(schedule.lifetimes_s):
        t += schedule.lifetime_s(k)
        times.append(t)
        t += delay_s
        k += 1
    return times


PILOT_STEPS = 300


def _pilot_spec(cfg: StudyConfig) -> JobSpec:
    return JobSpec(
        run_dir=cfg.workdir / "pilot",
        steps=PILOT_STEPS,
        policy={"kind": "fixed", "interval_s": 1.0},
        prior_mtbf_s=cfg.mtbf_s,
        model_args=cfg.model_args,
    )


def pilot(cfg: StudyConfig, progress=print, *, run: bool = True) -> MachineParams:
    """Measure the machine: a short job saving every second, killed twice at fixed steps
    (``run=False``: read the pilot already in the work directory)."""
    spec = _pilot_spec(cfg)
    if run:
        shutil.rmtree(spec.run_dir, ignore_errors=True)
        progress("pilot: measuring step time, save stall and restart cost")
        # Kill at fixed steps, not on a clock: on a quiet machine a 4 s clock could strike a
        # relaunch before it trains (or the job could finish first), leaving no restart to time.
        run_job(
            spec, KillSchedule(lifetimes_s=()), restart_delay_s=cfg.restart_delay_s,
            kill_at_steps=(PILOT_STEPS * 2 // 5, PILOT_STEPS * 3 // 4),
        )  # fmt: skip
    acc = account_run(spec.run_dir, spec.steps)
    return MachineParams(
        step_s=acc.step_s,
        save_s=acc.save_s,
        restart_s=float(np.mean(acc.restart_durations_s)),
        startup_s=acc.startup_s,
        mtbf_s=cfg.mtbf_s,
        weibull_shape=cfg.weibull_shape,
    )


def policy_set(cfg: StudyConfig, p: MachineParams) -> dict[str, dict]:
    """Label -> ``train_gpt`` policy spec."""
    tau = float(analytic.optimal_interval(p.save_s, cfg.mtbf_s))
    out = {}
    for m in sorted(cfg.multipliers):
        out[f"fixed {m:g}τ* ({m * tau:.1f} s)"] = {"kind": "fixed", "interval_s": m * tau}
    out[f"closed-form τ* ({tau:.1f} s)"] = {"kind": "fixed", "interval_s": tau}
    out[f"default: every {DEFAULT_EVERY_STEPS} steps"] = {
        "kind": "steps",
        "every": DEFAULT_EVERY_STEPS,
    }
    out["adaptive (policy=None)"] = {"kind": "adaptive"}
    return out


def plan(cfg: StudyConfig, p0: MachineParams):
    """(steps, label -> spec, jobs): every (policy, repeat) run, deterministic in the seed."""
    steps = max(100, round(cfg.work_s / p0.step_s))
    specs = policy_set(cfg, p0)
    lifetime = make_lifetime(cfg.mtbf_s, cfg.weibull_shape)
    rngs = [np.random.default_rng(s) for s in np.random.SeedSequence(cfg.seed).spawn(cfg.repeats)]
    schedules = [KillSchedule.draw(lifetime, rng) for rng in rngs]
    jobs = []
    order = random.Random(cfg.seed)
    for r in range(cfg.repeats):
        labels = list(specs)
        order.shuffle(labels)  # so slow drift of the machine's load hits no policy more often
        for label in labels:
            spec = JobSpec(
                run_dir=cfg.workdir / f"r{r}-p{list(specs).index(label)}",
                steps=steps,
                policy=specs[label],
                prior_mtbf_s=cfg.mtbf_s,
                prior_restart_s=p0.restart_s,
                model_args=cfg.model_args,
            )
            jobs.append((label, r, spec, schedules[r]))
    return steps, specs, jobs


def run_study(cfg: StudyConfig, progress=print, *, reuse: bool = False) -> dict:
    """Pilot, all runs, accounting and predictions; returns everything the report needs.

    ``reuse``: run nothing, account the runs already in ``cfg.workdir`` (same config).
    """
    cfg.workdir.mkdir(parents=True, exist_ok=True)
    load = [os.getloadavg()[0]]
    p0 = pilot(cfg, progress, run=not reuse)
    steps, specs, jobs = plan(cfg, p0)
    progress(
        f"pilot: {p0.step_s * 1e3:.1f} ms/step, save {p0.save_s:.3f} s, restart "
        f"{p0.restart_s:.2f} s; {len(specs)} policies x {cfg.repeats} repeats of {steps} steps"
    )

    def one(job):
        label, r, spec, schedule = job
        if not reuse:
            shutil.rmtree(spec.run_dir, ignore_errors=True)
            run_job(spec, schedule, restart_delay_s=cfg.restart_delay_s)
        acc = account_run(spec.run_dir, spec.steps)
        progress(
            f"  repeat {r} {label}: wall {acc.wall_s:.1f} s, {acc.failures} kills, "
            f"lost {acc.lost_steps} steps"
        )
        return RunResult(label=label, spec=spec.policy, repeat=r, account=acc, schedule=schedule)

    with ThreadPoolExecutor(max_workers=cfg.workers) as pool:
        results = list(pool.map(one, jobs))
    load.append(os.getloadavg()[0])
    study = analyse(cfg, p0, steps, specs, results)
    # The machine's load while the runs ran, kept beside them for a later --reuse.
    meta = cfg.workdir / "load.json"
    if not reuse:
        meta.write_text(json.dumps(dict(start=load[0], end=load[1], cpus=os.cpu_count())))
    study["load"] = json.loads(meta.read_text()) if meta.exists() else None
    study["runs_span_s"] = runs_span_s([_pilot_spec(cfg).run_dir] + [j[2].run_dir for j in jobs])
    return study


def runs_span_s(run_dirs) -> float:
    """Seconds from the first launch to the last exit over these runs (supervisor logs)."""
    times = [e["t"] for d in run_dirs for e in read_jsonl(Path(d) / SUPERVISOR_LOG)]
    return max(times) - min(times) if times else math.nan


def pooled_params(
    cfg: StudyConfig, results: list[RunResult], pilot: MachineParams
) -> MachineParams:
    """The machine as the whole study measured it (every run's steps, saves and restarts).

    A short study on a quiet machine may see no kill (or no save) at all; the pilot's
    measurement stands in for what the runs did not measure.
    """
    accs = [r.account for r in results]
    saves = [s for a in accs for s in a.save_durations_s]
    restarts = [r for a in accs for r in a.restart_durations_s]
    return MachineParams(
        step_s=sum(a.useful_s for a in accs) / sum(a.steps for a in accs),
        save_s=float(np.mean(saves)) if saves else pilot.save_s,
        restart_s=float(np.mean(restarts)) if restarts else pilot.restart_s,
        startup_s=float(np.mean([a.startup_s for a in accs])),
        mtbf_s=cfg.mtbf_s,
        weibull_shape=cfg.weibull_shape,
    )


def run_params(a: RunAccount, pooled: MachineParams) -> MachineParams:
    """One run's own measurements (the pooled value where the run measured none)."""
    return MachineParams(
        step_s=a.step_s,
        save_s=a.save_s if a.save_durations_s else pooled.save_s,
        restart_s=float(np.mean(a.restart_durations_s)) if a.restart_durations_s
        else pooled.restart_s,
        startup_s=a.startup_s,
        mtbf_s=pooled.mtbf_s,
        weibull_shape=pooled.weibull_shape,
    )  # fmt: skip


def analyse(cfg, p0, steps, specs, results: list[RunResult]) -> dict:
    p = pooled_params(cfg, results, p0)
    rows = []
    for res in results:
        a = res.account
        horizon = 20 * a.wall_s
        trace = full_trace(a, res.schedule, cfg.restart_delay_s, horizon)
        pred = replay_wall_s(p, steps, res.spec, trace)
        own = replay_wall_s(run_params(a, p), steps, res.spec, trace)
        rows.append(
            dict(
                label=res.label, repeat=res.repeat, wall_s=a.wall_s, replay_s=pred,
                replay_err=pred / a.wall_s - 1.0, own_s=own, own_err=own / a.wall_s - 1.0,
                step_s=a.step_s, failures=a.failures, lost_steps=a.lost_steps,
                import_s=a.import_durations_s, restore_s=a.restore_durations_s,
                lost_s=a.lost_s, saving_s=a.saving_s, recovery_s=a.recovery_s,
                startup_s=a.startup_s, useful_s=a.useful_s, saves=a.saves,
                balance_s=a.balance_s(),
            )
        )  # fmt: skip
    expected = {}
    for i, (label, spec) in enumerate(specs.items()):
        mean, sd = expected_wall_s(p, steps, spec, replicas=cfg.replicas, seed=cfg.seed + i)
        analytic_s = math.nan
        if spec["kind"] in ("fixed", "steps") and cfg.weibull_shape is None:
            tau = spec["interval_s"] if spec["kind"] == "fixed" else spec["every"] * p.step_s
            analytic_s = p.startup_s + float(
                analytic.daly_wall_time(tau, p.save_s, cfg.mtbf_s, p.restart_s, steps * p.step_s)
            )
        expected[label] = dict(mean_s=mean, sd_s=sd, daly_s=analytic_s)
    return dict(cfg=cfg, pilot=p0, pooled=p, steps=steps, specs=specs, rows=rows, expected=expected)
