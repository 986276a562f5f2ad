"""Closed loop: a real training job killed with SIGKILL resumes exactly, and its time adds up.

The fast tests kill a tiny GPT twice at fixed steps and compare its final weights and AdamW
moments with an uninterrupted run, bit for bit; the accounting is checked against a log built
by hand. The slow test runs the whole study in its quick form and checks the report's claims
against the runs it made.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from experiments.crashtest.accounting import account_run
from experiments.crashtest.injector import KillSchedule, make_lifetime
from experiments.crashtest.predict import MachineParams, expected_wall_s, replay_wall_s
from experiments.crashtest.study import full_trace
from experiments.crashtest.supervisor import SUPERVISOR_LOG, JobSpec, run_job
from experiments.crashtest.train_gpt import EVENTS, FINAL

REPO = Path(__file__).resolve().parents[1]
TINY = {"n_layer": 1, "n_embd": 32, "block": 16}


def _write_jsonl(path: Path, rows: list[dict]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))


def test_accounting_puts_every_second_of_a_hand_built_log_in_its_bucket(tmp_path):
    # Launch 0 trains from t=2, saves step 2 over [4, 5], is killed at t=10 in a save begun at
    # t=8; launch 1 starts at t=11, restores step 2 at t=13, saves step 4 over [15, 16], ends.
    _write_jsonl(
        tmp_path / SUPERVISOR_LOG,
        [
            {"event": "launch", "attempt": 0, "t": 0.0},
            {"event": "kill", "attempt": 0, "t": 10.0},
            {"event": "exit", "attempt": 0, "t": 10.1, "rc": -9},
            {"event": "launch", "attempt": 1, "t": 11.0},
            {"event": "exit", "attempt": 1, "t": 17.5, "rc": 0},
        ],
    )
    ev = [
        (0, "start", 1, None), (0, "ready", 2, 0), (0, "step", 3, 1), (0, "step", 4, 2),
        (0, "save_start", 4, 2), (0, "save_end", 5, 2), (0, "step", 6, 3), (0, "step", 7, 4),
        (0, "save_start", 8, 4), (1, "start", 12, None), (1, "ready", 13, 2),
        (1, "step", 14, 3), (1, "step", 15, 4), (1, "save_start", 15, 4), (1, "save_end", 16, 4),
        (1, "done", 17, 4),
    ]  # fmt: skip
    _write_jsonl(
        tmp_path / EVENTS,
        [{"event": e, "attempt": a, "t": float(t), "step": s} for a, e, t, s in ev],
    )
    acc = account_run(tmp_path, steps=4)
    assert acc.wall_s == 17.0
    assert acc.startup_s == 2.0
    assert acc.recovery_s == 3.0  # kill at 10 -> training again at 13
    assert acc.saving_s == 4.0  # [4,5] + the cut-short [8,10] + [15,16]
    assert acc.lost_s == 3.0  # compute from the save at 5 to the save begun at 8
    assert acc.useful_s == 5.0
    assert acc.lost_steps == 2
    assert acc.failures == 1 and acc.saves == 2
    assert acc.kill_times_s == (8.0,)  # seconds after the first launch began training
    assert acc.balance_s() == 0.0


def test_replayed_trace_continues_with_the_schedule_after_the_real_run_ended():
    schedule = KillSchedule(lifetimes_s=(5.0, 7.0, 11.0, 13.0))

    class Acc:
        kill_times_s = (5.0,)

    # Kill 1 at 5 s; launch 1 at 6 s lives 7 s -> 13 s; launch 2 at 14 s lives 11 s -> 25 s.
    assert full_trace(Acc, schedule, 1.0, horizon_s=20.0) == [5.0, 13.0, 25.0]


def test_kill_schedules_are_reproducible_from_the_seed_and_have_the_clocks_mean():
    life = make_lifetime(60.0)
    a = KillSchedule.draw(life, np.random.default_rng(7), n=4000)
    b = KillSchedule.draw(life, np.random.default_rng(7), n=4000)
    assert a == b
    # 4000 exponential draws: the sample mean's standard error is 60/sqrt(4000) ≈ 0.95 s.
    assert abs(np.mean(a.lifetimes_s) - 60.0) < 4.0
    weibull = KillSchedule.draw(make_lifetime(60.0, 0.7), np.random.default_rng(7), n=4000)
    assert abs(np.mean(weibull.lifetimes_s) - 60.0) < 6.0


def test_simulated_job_without_kills_costs_its_work_plus_its_saves_plus_startup():
    p = MachineParams(step_s=0.05, save_s=0.2, restart_s=5.0, startup_s=3.0, mtbf_s=60.0)
    steps, interval_s = 400, 3.0  # 20 s of work: saves at 3, 6, ..., 18 and at the end
    wall = replay_wall_s(p, steps, {"kind": "fixed", "interval_s": interval_s}, [])
    assert math.isclose(wall, 3.0 + 20.0 + 7 * 0.2, rel_tol=1e-9)
    # Every 100 steps of 0.05 s is a 5 s interval: saves at 5, 10, 15, 20.
    wall = replay_wall_s(p, steps, {"kind": "steps", "every": 100}, [])
    assert math.isclose(wall, 3.0 + 20.0 + 4 * 0.2, rel_tol=1e-9)


def test_expected_wall_time_of_a_fixed_interval_matches_dalys_formula():
    from simulator.analytic import daly_wall_time

    # Work a whole number of intervals, so Daly's "last segment is a full τ" holds exactly.
    p = MachineParams(step_s=0.1, save_s=0.5, restart_s=4.0, startup_s=0.0, mtbf_s=30.0)
    steps, tau = 600, 6.0
    mean, sd = expected_wall_s(
        p, steps, {"kind": "fixed", "interval_s": tau}, replicas=1500, seed=3
    )
    daly = daly_wall_time(tau, p.save_s, p.mtbf_s, p.restart_s, steps * p.step_s)
    assert abs(mean - daly) < 4 * sd / math.sqrt(1500)


def _final_tensors(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / FINAL))


def test_speed_adjustment_replaces_only_the_useful_compute_and_pairs_the_repeats():
    from experiments.crashtest.report import summarise

    specs = {
        "fast": {"kind": "fixed", "interval_s": 1.0},
        "default": {"kind": "steps", "every": 500},
        "adaptive": {"kind": "adaptive"},
    }
    rows = []
    # Repeat 1 ran on a machine 10 % slower (useful 110 s instead of 100 s for the same steps);
    # the overheads (wall - useful) are what the policies cost: fast 10, default 20, adaptive 11.
    for repeat, useful in ((0, 100.0), (1, 110.0)):
        for label, overhead in (("fast", 10.0), ("default", 20.0), ("adaptive", 11.0)):
            rows.append(
                dict(label=label, repeat=repeat, wall_s=useful + overhead, useful_s=useful,
                     replay_s=useful + overhead)
            )  # fmt: skip
    pooled = MachineParams(
        step_s=0.105, save_s=0.1, restart_s=1.0, startup_s=1.0, mtbf_s=60.0
    )  # 1000 steps at the pooled step time: 105 s of useful compute
    expected = {k: dict(mean_s=120.0, sd_s=1.0, daly_s=math.nan) for k in specs}
    study = dict(rows=rows, specs=specs, steps=1000, pooled=pooled, expected=expected)
    s = summarise(study)
    assert s["adj"]["table"]["fast"].tolist() == pytest.approx([115.0, 115.0])
    assert s["adj"]["best"] == "fast" and s["raw"]["best"] == "fast"
    assert s["adj"]["vs_best"].tolist() == pytest.approx([1 / 115, 1 / 115])
    assert s["raw"]["vs_best"].tolist() == pytest.approx([1 / 110, 1 / 120])
    assert (s["adj"]["vs_default"] < 0).all()


def _study_with(overheads_by_repeat):
    specs = {
        "fast": {"kind": "fixed", "interval_s": 1.0},
        "default": {"kind": "steps", "every": 500},
        "adaptive": {"kind": "adaptive"},
    }
    rows = [
        dict(label=k, repeat=r, wall_s=100.0 + o, useful_s=100.0, replay_s=100.0 + o,
             own_s=100.0 + o, own_err=0.0, replay_err=0.0)
        for r, overheads in enumerate(overheads_by_repeat) for k, o in overheads.items()
    ]  # fmt: skip
    pooled = MachineParams(step_s=0.1, save_s=0.1, restart_s=1.0, startup_s=1.0, mtbf_s=60.0)
    expected = {k: dict(mean_s=110.0, sd_s=1.0, daly_s=math.nan) for k in specs}
    return dict(rows=rows, specs=specs, steps=1000, pooled=pooled, expected=expected)


def test_a_win_on_the_mean_only_is_reported_not_shown_never_met():
    from experiments.crashtest.report import summarise, verdict

    # Adaptive is faster than the default on average, but one repeat in three it is slower:
    # the paired interval crosses zero, so the data do not show that it beats the default.
    study = _study_with(
        [dict(fast=10, default=20, adaptive=10), dict(fast=10, default=20, adaptive=9),
         dict(fast=10, default=10, adaptive=13)]
    )  # fmt: skip
    s = summarise(study)
    lines = verdict(s, s["df"])
    beats = [x for x in lines if x.startswith("- Adaptive beats the default (measured")]
    assert beats and "— not shown" in beats[0] and "— met" not in beats[0]
    assert not any("met on the mean" in x for x in lines)


def test_prediction_figure_draws_the_band_under_every_run_with_a_marker_per_policy(
    tmp_path, monkeypatch
):
    import matplotlib.figure

    from experiments.crashtest.report import plot, summarise

    saved = []
    real = matplotlib.figure.Figure.savefig
    monkeypatch.setattr(
        matplotlib.figure.Figure, "savefig", lambda f, *a, **k: (saved.append(f), real(f, *a, **k))
    )
    # Every policy's runs sit exactly on the diagonal, inside the ±5 % band.
    study = _study_with([dict(fast=10, default=10, adaptive=10)] * 2)
    s = summarise(study)
    paths = plot(study, s, tmp_path)
    assert paths[0].exists() and paths[0].name == "closed-loop-prediction.png"
    ax = saved[0].axes[0]
    band = [
        c
        for c in ax.collections
        if type(c).__name__ in ("PolyCollection", "FillBetweenPolyCollection")
    ]
    points = [c for c in ax.collections if type(c).__name__ == "PathCollection"]
    assert band and len(points) == 2 * len(s["labels"])
    assert all(p.get_zorder() > b.get_zorder() for p in points for b in band)
    markers = {tuple(map(tuple, p.get_paths()[0].vertices.round(3))) for p in points}
    assert len(markers) == len(s["labels"])  # filled and hollow of a policy share its marker


def test_job_killed_twice_ends_bit_identical_to_an_uninterrupted_run(tmp_path):
    import torch

    steps, policy = 160, {"kind": "fixed", "interval_s": 0.05}
    reference = tmp_path / "reference"
    # The reference runs in a subprocess too: same interpreter flags, same thread count.
    cmd = JobSpec(run_dir=reference, steps=steps, policy=policy, model_args=TINY).command(0)
    subprocess.run(cmd, cwd=REPO, check=True, env=dict(os.environ, PYTHONPATH=str(REPO)))

    killed = tmp_path / "killed"
    spec = JobSpec(run_dir=killed, steps=steps, policy=policy, model_args=TINY)
    run_job(spec, KillSchedule(lifetimes_s=()), restart_delay_s=0.0, kill_at_steps=(60, 120))
    acc = account_run(killed, steps)
    assert acc.failures == 2
    events = [json.loads(line) for line in (killed / EVENTS).read_text().splitlines()]
    readies = [e for e in events if e["event"] == "ready"]
    saved = [e["step"] for e in events if e["event"] == "save_end"]
    # Each relaunch resumed from the newest save its predecessor completed, not from scratch,
    # and the steps the accounting calls lost are exactly the ones run again. A save whose
    # commit landed just before the SIGKILL and whose save_end did not is completed too: the
    # relaunch may resume from it (a started save), never from anything older than the last
    # logged one.
    for k in (1, 2):
        earlier = [e for e in events if e["attempt"] < k]
        last_saved = max(e["step"] for e in earlier if e["event"] == "save_end")
        started = {e["step"] for e in earlier if e["event"] == "save_start"}
        assert readies[k]["step"] >= last_saved > 0 and readies[k]["step"] in started
    # A launch's work ends at its failure (the supervisor's "fail"): a step it logged in the
    # instant before the SIGKILL landed is no work it kept, for the accounting or here.
    sup = [json.loads(line) for line in (killed / SUPERVISOR_LOG).read_text().splitlines()]
    fail_t = {e["attempt"]: e["t"] for e in sup if e["event"] == "fail"}
    last_step = [
        max(
            e["step"]
            for e in events
            if e["event"] == "step" and e["attempt"] == k and e["t"] <= fail_t[k]
        )
        for k in (0, 1)
    ]
    assert acc.lost_steps == sum(last_step[k] - readies[k + 1]["step"] for k in (0, 1))
    assert len(saved) > 3
    assert math.isclose(acc.balance_s(), 0.0, abs_tol=1e-9)

    ref, got = _final_tensors(reference), _final_tensors(killed)
    assert ref.keys() == got.keys() and len(ref) > 10
    for key in ref:
        assert torch.equal(ref[key], got[key]), key


@pytest.mark.slow
def test_simulator_replay_of_a_killed_run_is_within_ten_percent(tmp_path):
    steps, policy = 300, {"kind": "fixed", "interval_s": 1.0}
    spec = JobSpec(run_dir=tmp_path / "run", steps=steps, policy=policy, model_args=TINY)
    run_job(spec, KillSchedule(lifetimes_s=()), restart_delay_s=0.5, kill_at_steps=(150,))
    acc = account_run(spec.run_dir, steps)
    assert acc.failures == 1
    params = MachineParams(
        step_s=acc.step_s,
        save_s=acc.save_s,
        restart_s=float(np.mean(acc.restart_durations_s)),
        startup_s=acc.startup_s,
        mtbf_s=60.0,
    )
    predicted = replay_wall_s(params, steps, policy, acc.kill_times_s)
    assert abs(predicted / acc.wall_s - 1.0) < 0.10


@pytest.mark.slow
def test_quick_study_writes_a_report_from_its_own_runs(tmp_path):
    out = tmp_path / "closed-loop.md"
    cmd = [sys.executable, str(REPO / "experiments" / "closed_loop.py"), "--quick"]
    cmd += ["--workdir", str(tmp_path / "work"), "--out", str(out), "--work-s", "15"]
    subprocess.run(cmd, cwd=REPO, check=True, timeout=900)
    text = out.read_text()
    assert "| adaptive (policy=None) |" in text and "Replay with each run's own measured" in text
    assert "| speed-adjusted |" in text
    assert (tmp_path / "figures" / "closed-loop-prediction.png").stat().st_size > 1000


def test_render_only_redraws_the_figures_from_the_kept_per_run_data(tmp_path, capsys):
    from experiments import closed_loop
    from experiments.crashtest.report import save_figure_data, summarise

    study = _study_with([dict(fast=10, default=12, adaptive=11)] * 2)
    save_figure_data(study, summarise(study), tmp_path / "data" / "cl-runs.json")
    assert closed_loop.main(["--render-only", "--out", str(tmp_path / "cl.md")]) == 0
    figs = sorted(p.name for p in (tmp_path / "figures").iterdir())
    assert figs == ["cl-policies.png", "cl-prediction.png"]
    assert not (tmp_path / "cl.md").exists()  # the report's text is not rewritten
    with pytest.raises(SystemExit):
        closed_loop.main(["--render-only", "--out", str(tmp_path / "other.md")])
    assert "other-runs.json not found" in capsys.readouterr().err
