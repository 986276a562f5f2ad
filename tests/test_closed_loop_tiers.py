"""Closed loop with tiers: the failure mix injected for real, resumed exactly, accounted, predicted.

The real-run test fails a tiny GPT with each class once (a process kill, a node loss that wipes
its local tier, a hang noticed after a timeout, a preemption with a grace period) and compares
its final weights and AdamW moments with an uninterrupted run's, bit for bit. The accounting
is checked against a log built by hand, the tiered simulator's replay against sums done by
hand. The slow test runs the study in its quick form.
"""

from __future__ import annotations

import json
import math
import shutil
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
from test_closed_loop import _write_jsonl

from experiments.crashtest.accounting import account_run
from experiments.crashtest.injector import KillSchedule
from experiments.crashtest.predict_tiers import TierParams, replay_wall_s
from experiments.crashtest.supervisor import SUPERVISOR_LOG, JobSpec, run_job
from experiments.crashtest.train_gpt import EVENTS, FINAL

REPO = Path(__file__).resolve().parents[1]
TINY = {"n_layer": 1, "n_embd": 32, "block": 16}


def test_accounting_of_a_hang_a_committed_preemption_and_a_node_loss(tmp_path):
    # Launch 0 trains from t=2; saves locally over [3, 3.5] (step 2); hangs at t=5 (SIGSTOP),
    # killed at 8. Launch 1 (t=9) trains from 11 (step 2), saves both tiers over [12, 13]
    # (step 4), is preempted at 14 (SIGTERM), logs its committed save at 14.2, exits at 14.3.
    # Launch 2 (t=15.3) trains from 17 (step 5), is lost with its node at 18.
    # Launch 3 (t=19) trains from 21 (step 4) and ends at 23.
    sup = [
        ("launch", 0, 0.0), ("fail", 0, 5.0, "hang"), ("kill", 0, 8.0), ("exit", 0, 8.0),
        ("launch", 1, 9.0), ("fail", 1, 14.0, "preemption"), ("exit", 1, 14.3),
        ("launch", 2, 15.3), ("fail", 2, 18.0, "node"), ("kill", 2, 18.0), ("exit", 2, 18.0),
        ("wipe", 2, 18.0), ("launch", 3, 19.0), ("exit", 3, 23.5),
    ]  # fmt: skip
    rows = []
    for e in sup:
        row = {"event": e[0], "attempt": e[1], "t": e[2]}
        if len(e) > 3:
            row["cls"] = e[3]
        rows.append(row)
    _write_jsonl(tmp_path / SUPERVISOR_LOG, rows)
    both = {"tiers": {"local": 0.1, "persistent": 0.9}, "interval_steps": {"local": 2}}
    ev = [
        (0, "start", 1.0, {}), (0, "ready", 2.0, {"step": 0}), (0, "step", 2.5, {"step": 1}),
        (0, "step", 3.0, {"step": 2}), (0, "save_start", 3.0, {"step": 2}),
        (0, "save_end", 3.5, {"step": 2, "tiers": {"local": 0.5}}), (0, "step", 4.5, {"step": 3}),
        (1, "start", 10.0, {}), (1, "ready", 11.0, {"step": 2}), (1, "step", 12.0, {"step": 4}),
        (1, "save_start", 12.0, {"step": 4}), (1, "save_end", 13.0, {"step": 4, **both}),
        (1, "step", 14.0, {"step": 5}), (1, "preempted", 14.2, {"step": 5}),
        (2, "start", 16.0, {}), (2, "ready", 17.0, {"step": 5}), (2, "step", 17.5, {"step": 6}),
        (3, "start", 20.0, {}), (3, "ready", 21.0, {"step": 4}), (3, "step", 22.0, {"step": 5}),
        (3, "step", 23.0, {"step": 6}), (3, "done", 23.0, {"step": 6}),
    ]  # fmt: skip
    _write_jsonl(tmp_path / EVENTS, [{"event": e, "attempt": a, "t": t, **f} for a, e, t, f in ev])
    acc = account_run(tmp_path, steps=6)
    assert acc.failure_classes == ("hang", "preemption", "node")
    assert acc.kill_times_s == (3.0, 12.0, 16.0)  # after the first launch began training
    assert acc.gone_s == pytest.approx((3.0, 0.3, 0.0))
    assert acc.restarts_after_s == pytest.approx((3.0, 2.7, 3.0))
    assert acc.preempt_commit_s == pytest.approx((0.2,))
    assert acc.recovery_s == pytest.approx(6.0 + 3.0 + 3.0)  # from each failure to training
    # The hang loses step 3 and the half step under way; the preemption nothing; the node
    # loss goes back to the persistent step 4, so step 5 (done before the preemption) and
    # step 6 are done again, with the half step under way.
    assert acc.lost_s == pytest.approx((1.0 + 0.5) + 0.0 + (1.0 + 0.5 + 0.5))
    assert acc.lost_steps == 1 + 0 + 2
    assert acc.tier_saves_s["local"] == pytest.approx((0.5, 0.1))
    assert acc.tier_saves_s["persistent"] == pytest.approx((0.9,))
    assert acc.balance_s() == pytest.approx(0.0)


def test_replay_without_failures_costs_the_work_each_tiers_saves_and_the_start_up():
    p = TierParams(
        step_s=0.01, local_s=0.02, persistent_s=0.5, startup_s=3.0,
        restart_s=dict.fromkeys(("process", "node", "hang", "preemption"), 4.0),
        gone_s={"hang": 2.0, "preemption": 0.1}, mtbf_s={"process": 60.0, "node": 300.0},
    )  # fmt: skip
    # 10 s of work: local at 1, 2, ..., 10 s; persistent at 4, 8 and the final save at 10.
    wall = replay_wall_s(p, 1000, {"local": 1.0, "persistent": 4.0}, [], grace_s=None)
    assert wall == pytest.approx(3.0 + 10.0 + 10 * 0.02 + 3 * 0.5)
    # One process failure 0.25 s after the local copy of progress 5 committed (at 5 s of
    # compute plus 5 local saves and the persistent one at 4 s): those 0.25 s are done again,
    # and the restart is paid; the saves that follow fall where they would have.
    at = 5.0 + 5 * 0.02 + 0.5  # wall time of the copy at progress 5
    one = replay_wall_s(
        p, 1000, {"local": 1.0, "persistent": 4.0}, [(at + 0.25, "process")], grace_s=None
    )
    assert one == pytest.approx(wall + 0.25 + 4.0)  # the 0.25 s since the copy, the restart
    node = replay_wall_s(
        p, 1000, {"local": 1.0, "persistent": 4.0}, [(at + 0.25, "node")], grace_s=None
    )
    assert node > one + 0.9  # back to the persistent copy of progress 4


def _final(run_dir: Path) -> dict:
    from safetensors.torch import load_file

    return load_file(str(run_dir / FINAL))


@pytest.mark.slow
def test_a_tiny_gpt_failed_by_each_class_resumes_bit_exactly(tmp_path):
    base = "/dev/shm" if Path("/dev/shm").is_dir() else None
    local = Path(tempfile.mkdtemp(prefix="ckptsim-tiers-test-", dir=base))
    try:
        args = dict(TINY, grace_s=5.0)
        # Saves at fixed steps, so which tier holds what at each failure is known.
        policy = {"kind": "steps-tiers", "local_every": 10, "persistent_every": 50}
        spec = JobSpec(
            run_dir=tmp_path / "failed", steps=200, policy=policy, model_args=args,
            local_dir=local / "job",
        )  # fmt: skip
        classes = ("process", "node", "hang", "preemption")
        run_job(
            spec, KillSchedule(lifetimes_s=(1e9,) * 4, classes=classes),
            restart_delay_s=0.2, kill_at_steps=(35, 75, 115, 155), hang_timeout_s=0.5,
            grace_s=5.0,
        )  # fmt: skip
        reference = JobSpec(
            run_dir=tmp_path / "reference", steps=200, policy=policy, model_args=args,
            local_dir=local / "reference",
        )  # fmt: skip
        run_job(reference, KillSchedule(lifetimes_s=()))
    finally:
        shutil.rmtree(local, ignore_errors=True)
    a, b = _final(tmp_path / "failed"), _final(tmp_path / "reference")
    assert a.keys() == b.keys() and all(np.array_equal(a[k], b[k]) for k in a)
    acc = account_run(tmp_path / "failed", 200)
    assert acc.failure_classes == classes
    assert len(acc.preempt_commit_s) == 1 and acc.preempt_commit_s[0] < 5.0
    sup = [json.loads(line) for line in (tmp_path / "failed" / SUPERVISOR_LOG).open()]
    exits = [e["rc"] for e in sup if e["event"] == "exit"]
    assert exits == [-9, -9, -9, 75, 0]  # kill, kill, kill after the hang, preempted, done
    assert [e["event"] for e in sup].count("wipe") == 1
    readies = [
        json.loads(line) for line in (tmp_path / "failed" / EVENTS).open() if '"ready"' in line
    ]
    # Restored: after the process kill, local step 30 (persistent: none); after the node loss,
    # persistent 50 (the local tier wiped); after the hang, local 110 (persistent 100); after
    # the preemption, its own save (persistent: an unslowed save fits the 5 s grace period).
    got = [(e.get("tier"), e["step"]) for e in readies[1:]]
    assert got[:3] == [("local", 30), ("persistent", 50), ("local", 110)]
    assert got[3][0] == "persistent" and got[3][1] >= 155


@pytest.mark.slow
def test_the_quick_study_writes_its_report_with_every_run_bit_exact(tmp_path):
    import subprocess

    out = tmp_path / "report" / "closed-loop-tiers.md"
    run = subprocess.run(
        [sys.executable, str(REPO / "experiments" / "closed_loop_tiers.py"), "--quick",
         "--workdir", str(tmp_path / "work"), "--out", str(out)],
        capture_output=True, text=True, timeout=1800,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    text = out.read_text()
    data = json.loads((out.parent / "data" / "closed-loop-tiers-runs.json").read_text())
    assert len(data["runs"]) == 4
    assert "4 of 4 runs — met" in text  # bit-exact
    for row in data["runs"]:
        assert math.isfinite(row["own_s"]) and row["own_s"] > 0
    assert (out.parent / "figures" / "closed-loop-tiers-prediction.png").exists()
