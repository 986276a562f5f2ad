"""The supervisor: run the training job to completion through the kills the injector deals.

One job = a run directory and a policy. The supervisor launches the training process,
watches the clock, ends the launch when its lifetime (``injector.KillSchedule``) is up, waits
``restart_delay_s`` (the time a real cluster takes to notice and reschedule), and launches it
again; the job resumes from its newest checkpoint. It stops when the process exits 0 after
logging ``done``. How a launch ends is the schedule's class for it: a ``process`` failure is
a SIGKILL; a ``node`` loss a SIGKILL and the job's local tier wiped; a ``hang`` a SIGSTOP,
then a SIGKILL ``hang_timeout_s`` later (when a real job's collective timeout would notice);
a ``preemption`` a SIGTERM, then a SIGKILL if the job has not exited ``grace_s`` later (as a
scheduler's kill after its grace period). Its own events (``launch``, ``fail`` — the moment
the failure struck, with its class —, ``kill``, ``wipe``, ``exit``) go to ``supervisor.jsonl``
with the same ``time.monotonic()`` clock as the job's ``events.jsonl``.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path

from experiments.crashtest.injector import KillSchedule, freeze, kill, terminate
from experiments.crashtest.train_gpt import EVENTS

__all__ = ["SUPERVISOR_LOG", "JobSpec", "run_job"]

SUPERVISOR_LOG = "supervisor.jsonl"
REPO_ROOT = Path(__file__).resolve().parents[2]
_POLL_S = 0.005


@dataclass(frozen=True, kw_only=True)
class JobSpec:
    """One training job: where it runs, how long it is, how it checkpoints."""

    run_dir: Path
    """Empty (or absent) directory for checkpoints and logs."""
    steps: int
    """Useful optimizer steps the job needs."""
    policy: dict
    """Policy spec for ``train_gpt`` (``{"kind": "fixed", "interval_s": 4.0}`` ...)."""
    prior_mtbf_s: float = 60.0
    """MTBF the controller starts from, seconds."""
    prior_restart_s: float = 5.0
    """Restart cost the controller starts from, seconds."""
    seed: int = 0
    """Model init and data order."""
    model_args: dict = field(default_factory=dict)
    """Extra ``train_gpt`` flags (``{"n_layer": 2}``)."""
    local_dir: Path | None = None
    """The job's local checkpoint tier (wiped by a node loss); None: one tier."""

    def command(self, attempt: int) -> list[str]:
        cmd = [
            sys.executable, "-m", "experiments.crashtest.train_gpt",
            "--run-dir", str(self.run_dir), "--steps", str(self.steps),
            "--policy", json.dumps(self.policy), "--attempt", str(attempt),
            "--mtbf-s", repr(self.prior_mtbf_s), "--restart-s", repr(self.prior_restart_s),
            "--seed", str(self.seed),
        ]  # fmt: skip
        if self.local_dir is not None:
            cmd += ["--local-dir", str(self.local_dir)]
        for key, value in self.model_args.items():
            cmd += [f"--{key.replace('_', '-')}", str(value)]
        return cmd


class _Tail:
    """Reads new lines of a growing JSONL file (the job's events) without rereading it."""

    def __init__(self, path: Path):
        self.path, self.offset, self.partial = path, 0, b""

    def new_events(self) -> list[dict]:
        try:
            with open(self.path, "rb") as f:
                f.seek(self.offset)
                chunk = f.read()
        except FileNotFoundError:
            return []
        self.offset += len(chunk)
        lines = (self.partial + chunk).split(b"\n")
        self.partial = lines.pop()
        return [json.loads(line) for line in lines if line.strip()]


def run_job(
    spec: JobSpec,
    schedule: KillSchedule,
    *,
    restart_delay_s: float = 1.0,
    max_attempts: int = 100,
    timeout_s: float = 3600.0,
    clock_from_ready: bool = False,
    kill_at_steps: tuple[int, ...] = (),
    hang_timeout_s: float = 3.0,
    grace_s: float = 1.0,
) -> Path:
    """Run ``spec`` to completion under ``schedule``; returns the run directory.

    ``clock_from_ready``: start every launch's clock when it is training, not only the first
    one's (tests use it so each kill lands in training whatever the machine's load).

    ``kill_at_steps``: instead of the clock, end launch k as soon as it logs step
    ``kill_at_steps[k]`` — deterministic crash points whatever the machine's speed (tests);
    it ends as the schedule's class for that launch says.

    ``hang_timeout_s``: how long a frozen launch goes unnoticed; ``grace_s``: how long a
    preempted one may take to exit before it is killed.

    Raises RuntimeError when the job exits with an error, needs more than ``max_attempts``
    launches, or is not done after ``timeout_s`` of wall time.
    """
    spec.run_dir.mkdir(parents=True, exist_ok=True)
    sup = open(spec.run_dir / SUPERVISOR_LOG, "a", buffering=1)
    tail = _Tail(spec.run_dir / EVENTS)
    path = os.pathsep.join(p for p in (str(REPO_ROOT), os.environ.get("PYTHONPATH")) if p)
    env = dict(os.environ, PYTHONPATH=path)
    env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")

    def note(event: str, **fields) -> float:
        t = time.monotonic()
        sup.write(json.dumps({"event": event, "t": t, **fields}) + "\n")
        return t

    t_begin = time.monotonic()
    try:
        for attempt in range(max_attempts):
            lifetime = schedule.lifetime_s(attempt)
            kill_step = kill_at_steps[attempt] if attempt < len(kill_at_steps) else None
            t_launch = note("launch", attempt=attempt, lifetime_s=lifetime)
            proc = subprocess.Popen(spec.command(attempt), cwd=REPO_ROOT, env=env)
            # The first launch's clock starts when the job is training; later ones' at launch.
            clock_origin = t_launch if attempt > 0 and not clock_from_ready else None
            while True:
                rc = proc.poll()
                if rc is not None:
                    note("exit", attempt=attempt, rc=rc)
                    if rc != 0:
                        raise RuntimeError(f"{spec.run_dir}: attempt {attempt} exited with {rc}")
                    return spec.run_dir
                now = time.monotonic()
                hit = False
                if clock_origin is None or kill_step is not None:
                    for e in tail.new_events():
                        if e["attempt"] != attempt:
                            continue
                        if e["event"] == "ready" and clock_origin is None:
                            clock_origin = e["t"]
                        if e["event"] == "step" and kill_step is not None:
                            hit |= e["step"] >= kill_step
                if hit or (clock_origin is not None and now >= clock_origin + lifetime):
                    cls = schedule.class_of(attempt)
                    t_gone = _end_launch(
                        proc, cls, note, attempt, hit, spec.local_dir, hang_timeout_s, grace_s
                    )
                    # Sleep to an absolute deadline so the delay does not drift with wait().
                    time.sleep(max(0.0, t_gone + restart_delay_s - time.monotonic()))
                    break
                if now - t_begin > timeout_s:
                    kill(proc.pid)
                    proc.wait()
                    raise RuntimeError(f"{spec.run_dir}: not done after {timeout_s:.0f} s")
                time.sleep(_POLL_S)
        raise RuntimeError(f"{spec.run_dir}: not done after {max_attempts} launches")
    finally:
        sup.close()


_PREEMPTED_EXIT_CODES = (75, -15, -9)
"""A preempted launch exits 75 after its save (PREEMPTED_EXIT_CODE), dies of the SIGTERM
itself when it came before the checkpointer's handler was installed, or is killed at the end
of the grace period."""


def _end_launch(proc, cls, note, attempt, hit, local_dir, hang_timeout_s, grace_s) -> float:
    """End the launch as a failure of class ``cls`` does; returns when the process was gone."""
    t_fail = note("fail", attempt=attempt, cls=cls, by_step=hit)
    if cls == "hang":
        freeze(proc.pid)
        time.sleep(max(0.0, t_fail + hang_timeout_s - time.monotonic()))
    if cls == "preemption":
        terminate(proc.pid)
        try:
            proc.wait(timeout=max(0.0, t_fail + grace_s - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass
    if proc.poll() is None:
        kill(proc.pid)
        note("kill", attempt=attempt, by_step=hit)
    proc.wait()
    t_gone = note("exit", attempt=attempt, rc=proc.returncode)
    if cls == "preemption" and proc.returncode not in _PREEMPTED_EXIT_CODES:
        raise RuntimeError(f"attempt {attempt}: exited with {proc.returncode} when preempted")
    if cls == "node" and local_dir is not None:
        shutil.rmtree(local_dir, ignore_errors=True)  # the host, and its /dev/shm, are gone
        note("wipe", attempt=attempt)
    return t_gone
