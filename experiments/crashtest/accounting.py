"""Time accounting of one crash-test job from its logs: where every second of wall time went.

The same buckets as the simulator (``simulator.engines.des``), so the two can be compared line
by line:

    wall = startup + recovery + saving + useful + lost

- startup: the first launch, from process start until the checkpointer has restored (the
  simulated job starts at work, so this is added to its prediction rather than modelled);
- recovery: from each kill until training again — the supervisor's restart delay, the new
  process's interpreter and torch import, and the checkpoint load (a kill during a restart
  makes that whole launch recovery);
- saving: training stalls in saves, including a save a kill cut short;
- lost: compute of the steps a later launch did not resume from (it restored an older step, so
  they are done again) and of the step cut short by the failure: with one tier, the compute
  after the last completed save of a launch that was killed; with a local tier that a node
  loss wiped, also the steps of earlier launches back to the persistent checkpoint;
- useful: the rest of the compute, which ends up in the final state.

With failure classes (``supervisor``), a launch's work ends when its failure strikes (the
supervisor's ``fail``: the SIGKILL, the SIGSTOP of a hang, the SIGTERM of a preemption), and
recovery runs from there: a hang's timeout and a preemption's save and exit are recovery, as
in the simulator. A preemption whose save committed (the job logged ``preempted``) loses no
work. Per failure the account keeps its class, the seconds from the failure until the process
was gone (a hang's timeout, a preemption's save and exit) and from then until training again.
"""

from __future__ import annotations

import itertools
import json
import math
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from experiments.crashtest.supervisor import SUPERVISOR_LOG
from experiments.crashtest.train_gpt import EVENTS

__all__ = ["RunAccount", "account_run", "read_jsonl"]


def read_jsonl(path: Path) -> list[dict]:
    """Events of a JSONL log; a line torn by a kill is skipped."""
    out = []
    for line in Path(path).read_text(encoding="utf-8").splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:
            continue
    return out


@dataclass(frozen=True, kw_only=True)
class RunAccount:
    """One job's measured time, seconds, and what it reveals about the machine."""

    steps: int
    """Useful steps of the job."""
    wall_s: float
    """First launch until the job logged ``done``."""
    startup_s: float
    """First launch until training (not part of the simulated job)."""
    recovery_s: float
    useful_s: float
    lost_s: float
    saving_s: float
    lost_steps: int
    """Steps done again after kills."""
    failures: int
    """Kills that struck the job before it was done."""
    saves: int
    """Saves that completed."""
    save_durations_s: tuple[float, ...]
    """Stall of every completed save."""
    restart_durations_s: tuple[float, ...]
    """Kill-to-training time of every restart that no kill interrupted."""
    kill_times_s: tuple[float, ...]
    """When each kill struck, seconds after the first launch started training."""
    import_durations_s: tuple[float, ...] = ()
    """Launch until the job logged ``start`` (interpreter, torch and controller imports), for
    every launch that got that far."""
    restore_durations_s: tuple[float, ...] = ()
    """``start`` until ``ready`` (model built, checkpoint restored), for every such launch."""
    failure_classes: tuple[str, ...] = ()
    """The class of each failure, in the order of ``kill_times_s``."""
    gone_s: tuple[float, ...] = ()
    """Per failure: from the failure until the process was gone (exit), seconds."""
    restarts_after_s: tuple[float | None, ...] = ()
    """Per failure: from the process gone until the next launch trained (None: that launch
    was struck first)."""
    preempt_commit_s: tuple[float, ...] = ()
    """Per preemption whose save committed: from the SIGTERM until the job logged it."""
    tier_saves_s: dict = field(default_factory=dict)
    """Tier -> the stall of each completed save that went to that tier alone; a save to both
    tiers at one step is split in the ratio of the checkpointer's own timings."""
    interval_steps: dict = field(default_factory=dict)
    """Tier -> the interval (steps) the checkpointer had chosen at each save."""
    launch_step_s: tuple[float, ...] = ()
    """The median seconds per step of each launch that trained at least 20 steps: how much
    the machine's speed moved within the run (the simulator runs at one speed)."""

    @property
    def step_s(self) -> float:
        """Measured compute per useful step (model step, logging and the checkpointer's check)."""
        return self.useful_s / self.steps

    @property
    def save_s(self) -> float:
        return float(np.mean(self.save_durations_s)) if self.save_durations_s else math.nan

    def balance_s(self) -> float:
        """wall − (sum of the buckets): zero up to clock rounding when nothing went unaccounted."""
        parts = self.startup_s + self.recovery_s + self.saving_s + self.useful_s + self.lost_s
        return self.wall_s - parts


def _attempts(events: list[dict], sup: list[dict]) -> list[dict]:
    by = {}
    for e in sup:
        a = by.setdefault(e["attempt"], {"events": []})
        a[e["event"]] = e["t"]
        if e["event"] == "fail":
            a["cls"] = e.get("cls", "process")
    for e in events:
        by.setdefault(e["attempt"], {"events": []})["events"].append(e)
    return [by[k] for k in sorted(by)]


def account_run(run_dir: Path, steps: int) -> RunAccount:
    """The account of the job in ``run_dir`` (its ``events.jsonl`` and ``supervisor.jsonl``)."""
    run_dir = Path(run_dir)
    attempts = _attempts(read_jsonl(run_dir / EVENTS), read_jsonl(run_dir / SUPERVISOR_LOG))
    t0 = attempts[0]["launch"]
    ready0 = None
    startup = recovery = saving = compute = lost = 0.0
    lost_steps = failures = 0
    save_durations, restarts, kills, imports, restores = [], [], [], [], []
    classes, gone, after, commits = [], [], [], []
    tier_saves: dict[str, list] = {}
    intervals: dict[str, list] = {}
    launch_steps = []
    kept: list[tuple[int, float]] = []  # (step, its compute) of the steps not yet undone
    done_t = None
    prev_kill = None
    prev_exit = None
    for k, a in enumerate(attempts):
        evs = a["events"]
        ready = next((e for e in evs if e["event"] == "ready"), None)
        done = next((e for e in evs if e["event"] == "done"), None)
        preempted = next((e for e in evs if e["event"] == "preempted"), None)
        end = done["t"] if done else a.get("fail", a.get("kill"))
        launch_steps.extend(_median_step_s(evs))
        if prev_exit is not None:
            trained = ready is not None and (done is not None or ready["t"] < end)
            after.append(ready["t"] - prev_exit if trained else None)
            prev_exit = None
        if done is None:
            classes.append(a.get("cls", "process"))
            prev_exit = a.get("exit", end)
            gone.append(prev_exit - end)
            if preempted is not None:
                commits.append(preempted["t"] - end)
        if end is None:
            raise ValueError(f"{run_dir}: attempt {k} neither finished nor was killed")
        begin = a["launch"] if k == 0 else prev_kill
        start = next((e for e in evs if e["event"] == "start"), None)
        if start is not None and ready is not None and ready["t"] < end:
            imports.append(start["t"] - a["launch"])
            restores.append(ready["t"] - start["t"])
        if ready is None or ready["t"] >= end:  # killed while restarting
            recovery += end - begin
            failures += 1
            prev_kill = end
            kills.append(end)
            continue
        if k == 0:
            startup = ready["t"] - begin
            ready0 = ready["t"]
        else:
            recovery += ready["t"] - begin
            restarts.append(ready["t"] - begin)
        # The steps the restore went back past are done again: lost.
        while kept and kept[-1][0] > ready["step"]:
            lost += kept.pop()[1]
            lost_steps += 1
        # Saves in this launch; a save_start with no save_end was cut short at `end`.
        stall = 0.0
        open_save = None
        t_prev = ready["t"]  # where the compute of the next step began
        for e in evs:
            if e["t"] > end:
                break
            if e["event"] == "step":
                kept.append((e["step"], e["t"] - t_prev))
                t_prev = e["t"]
            elif e["event"] == "save_start":
                open_save = e
            elif e["event"] in ("save_end", "save_skipped") and open_save is not None:
                d = e["t"] - open_save["t"]
                open_save = None
                if e["event"] == "save_skipped":
                    continue  # the check said due but no save happened: compute, not a stall
                stall += d
                save_durations.append(d)
                _split_by_tier(e, d, tier_saves, intervals)
                t_prev = e["t"]
        cut = 0.0
        if open_save is not None:  # cut short by the kill
            cut = end - open_save["t"]
            stall += cut
        saving += stall
        compute += (end - ready["t"]) - stall
        if done is None:
            failures += 1
            kills.append(end)
            prev_kill = end
            if preempted is None:  # the step under way is lost (a preemption saves it)
                lost += max(0.0, end - t_prev - cut)
        else:
            done_t = done["t"]
            break
    if done_t is None:
        raise ValueError(f"{run_dir}: the job never logged done")
    return RunAccount(
        steps=steps,
        wall_s=done_t - t0,
        startup_s=startup,
        recovery_s=recovery,
        useful_s=compute - lost,
        lost_s=lost,
        saving_s=saving,
        lost_steps=lost_steps,
        failures=failures,
        saves=len(save_durations),
        save_durations_s=tuple(save_durations),
        restart_durations_s=tuple(restarts),
        kill_times_s=tuple(t - ready0 for t in kills),
        import_durations_s=tuple(imports),
        restore_durations_s=tuple(restores),
        failure_classes=tuple(classes),
        gone_s=tuple(gone),
        restarts_after_s=tuple(after),
        preempt_commit_s=tuple(commits),
        tier_saves_s={t: tuple(v) for t, v in tier_saves.items()},
        interval_steps={t: tuple(v) for t, v in intervals.items()},
        launch_step_s=tuple(launch_steps),
    )


def _median_step_s(events: list[dict]) -> list[float]:
    """[the median time between consecutive steps of one launch] (none under 20 steps)."""
    steps = [e for e in events if e["event"] == "step"]
    gaps = [b["t"] - a["t"] for a, b in itertools.pairwise(steps) if b["step"] == a["step"] + 1]
    return [float(np.median(gaps))] if len(gaps) >= 20 else []


def _split_by_tier(event: dict, seconds: float, tier_saves: dict, intervals: dict) -> None:
    """Book a save's stall to its tiers (a save_end without ``tiers``: the persistent one)."""
    stalls = event.get("tiers") or {"persistent": None}
    if len(stalls) == 1:
        tier_saves.setdefault(next(iter(stalls)), []).append(seconds)
    else:
        known = {t: v for t, v in stalls.items() if v}
        total = sum(known.values())
        for t, v in known.items():
            tier_saves.setdefault(t, []).append(seconds * v / total)
    for t, n in (event.get("interval_steps") or {}).items():
        if n:
            intervals.setdefault(t, []).append(n)
