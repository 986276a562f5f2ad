"""The local tier: saves at its own interval, restores from the newest intact copy of this run.

Each test runs the real checkpointer on real directories: the persistent tier under pytest's
tmp_path (a disk), the local tier under /dev/shm (RAM) when the machine has one. Damage is
done as it happens (a flipped byte, a wiped directory, a stale directory of another run, a
read-only mount, a full tmpfs), and each case checks what was restored and what was said.
"""

from __future__ import annotations

import json
import math
import shutil
import subprocess
import sys
import tempfile
import warnings
from pathlib import Path

import pytest
import torch
from _damage import flip_a_byte

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, IncompatibleCheckpoint, NoIntactCheckpoint
from simulator.controller.local_tier import RUN_ID_FILE
from simulator.controller.runlog import RUNLOG, failures_by_class, read_events
from simulator.controller.storage import checkpoint_name
from simulator.controller.tier_schedule import tier_scenario
from simulator.errors import InputError
from simulator.model.tiers import TierSchedule, first_order_plan
from simulator.policies import FixedInterval

ROOT = Path(__file__).resolve().parents[1]


class Clock:
    """A clock the test moves: each training step takes ``step_s``, each save ``save_s``."""

    def __init__(self):
        self.t = 0.0

    def __call__(self) -> float:
        return self.t


def make_run(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    return model, opt


def train(model, opt, step):
    g = torch.Generator().manual_seed(step)
    opt.zero_grad()
    model(torch.randn(4, 8, generator=g)).pow(2).mean().backward()
    opt.step()


def tiered(directory, local_dir, model, opt, **kw):
    kw.setdefault("policy", TierSchedule({"local": 2.0, "persistent": 6.0}))
    kw.setdefault("probe_steps", 5)
    return AdaptiveCheckpointer(directory, model=model, optimizer=opt, local_dir=local_dir, **kw)


def run_steps(ck, model, opt, start, stop, clock=None, step_s=0.1):
    for step in range(start + 1, stop + 1):
        train(model, opt, step)
        if clock is not None:
            clock.t += step_s
        ck.step(step)


def steps_in(directory: Path) -> list[int]:
    if not directory.is_dir():
        return []
    return sorted(int(p.name[5:]) for p in directory.iterdir() if p.name.startswith("step-"))


def run_dir(local_root: Path) -> Path:
    (run,) = [p for p in local_root.iterdir() if p.is_dir()]
    return run


def weights_at(n: int) -> dict:
    """The weights an uninterrupted run holds after ``n`` steps."""
    model, opt = make_run()
    for step in range(1, n + 1):
        train(model, opt, step)
    return model.state_dict()


def same_weights(model, expected: dict) -> bool:
    got = model.state_dict()
    return all(torch.equal(got[k], expected[k]) for k in expected)


# -- saving ---------------------------------------------------------------------------------------
def test_each_tier_is_saved_at_its_own_interval_and_keeps_its_own_retention(tmp_path, local_root):
    clock = Clock()
    model, opt = make_run()
    ck = tiered(tmp_path, local_root, model, opt, clock=clock, keep_last=2)
    assert ck.restore() == 0
    run_steps(ck, model, opt, 0, 200, clock)  # 0.1 s a step: local every 20, persistent every 60
    local = run_dir(local_root)
    assert local.name == (tmp_path / RUN_ID_FILE).read_text().split('"')[3]
    assert steps_in(local) == [185]  # keep 1
    assert steps_in(tmp_path) == [125, 185]  # keep_last=2; the probe ended at step 5
    ckptio.verify_checkpoint(local / checkpoint_name(185))
    saves = [
        (e.get("tier"), e["step"]) for e in read_events(tmp_path / RUNLOG) if e["event"] == "save"
    ]
    assert [s for t, s in saves if t == "local"] == list(range(25, 201, 20))
    assert [s for t, s in saves if t == "persistent"] == [65, 125, 185]
    assert ck.stats["tier_interval_steps"] == {"local": 20, "persistent": 60}
    ck.close()  # the final state goes to the persistent tier
    assert steps_in(tmp_path)[-1] == 200
    # `ckptsim plot controller` draws each tier's intervals apart.
    from simulator import plots

    df = plots.read_run_log(tmp_path)
    assert set(df[df.tier == "local"].interval_s) == {2.0}
    assert set(df[df.tier == "persistent"].interval_s) == {6.0}
    labels = [line.get_label() for line in plots.controller_intervals(tmp_path).get_lines()]
    assert "controller's interval (local tier)" in labels


def test_the_adaptive_plan_is_the_models_first_order_plan_at_the_measured_costs(
    tmp_path, local_root
):
    clock = Clock()
    model, opt = make_run()
    ck = tiered(tmp_path, local_root, model, opt, clock=clock, policy=None, mtbf_h=1.0)
    ck.restore()
    run_steps(ck, model, opt, 0, 5, clock)  # the probe's end: both tiers saved and timed
    s = ck.schedule
    assert s.local_stall.value is not None and s.stall.value is not None
    expected = first_order_plan(
        tier_scenario(
            local_s=s.local_stall.value,
            persistent_s=s.stall.value,
            rates_per_s={k: p.rate_per_s for k, p in s.class_posteriors.items()},
            restart_s=s.restart_s,
        )
    )["tier_intervals_s"]
    got = ck.stats["tier_interval_s"]
    assert got == pytest.approx(expected)
    # Benoit et al.: τℓ = √(2 Cℓ / λℓ); the default split gives the process class 15 %.
    lam = {k: p.rate_per_s for k, p in s.class_posteriors.items()}
    assert lam["process"] / (lam["process"] + lam["node"]) == pytest.approx(0.15, abs=0.01)
    assert got["local"] == pytest.approx(math.sqrt(2 * s.local_s / lam["process"]))
    assert got["persistent"] == pytest.approx(math.sqrt(2 * s.checkpoint_s / lam["node"]))
    ck.close()


# -- restoring ------------------------------------------------------------------------------------
def _crash_after(tmp_path, local_root, steps, **kw):
    """Train ``steps`` steps and leave without close() (what a crash leaves), return weights."""
    clock = Clock()
    model, opt = make_run()
    ck = tiered(tmp_path, local_root, model, opt, clock=clock, **kw)
    ck.restore()
    run_steps(ck, model, opt, 0, steps, clock)
    ck._closed = True  # a crash: no final save, no clean stop
    ck._lock.release()
    return {k: v.clone() for k, v in model.state_dict().items()}


def _relaunch(tmp_path, local_root, **kw):
    model, opt = make_run(seed=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck = tiered(tmp_path, local_root, model, opt, **kw)
        step = ck.restore()
    return ck, step, model, [str(w.message) for w in caught]


def test_a_process_crash_resumes_from_the_newer_local_copy_and_says_so(tmp_path, local_root):
    _crash_after(tmp_path, local_root, 140)  # local at 125 (persistent 65, 125): equal steps
    ck, step, model, _ = _relaunch(tmp_path, local_root)
    assert step == 125 and ck.stats["restored_tier"] == "local"  # the quicker read of the two
    assert same_weights(model, weights_at(125))
    restore = [e for e in read_events(tmp_path / RUNLOG) if e["event"] == "restore"][-1]
    assert restore["tier"] == "local"
    assert ck.stats["local_found"] is True
    ck.close()
    _crash_after(tmp_path / "b", local_root / "b", 150)  # local at 145, persistent at 125
    ck, step, model, _ = _relaunch(tmp_path / "b", local_root / "b")
    assert step == 145 and ck.stats["restored_tier"] == "local"
    assert same_weights(model, weights_at(145))
    ck.close()


def test_the_local_copy_is_taken_only_when_newer_and_a_wiped_one_falls_back_with_a_warning(
    tmp_path, local_root
):
    _crash_after(tmp_path, local_root, 150)  # local at 145, persistent at 125
    shutil.rmtree(run_dir(local_root))  # the node is lost: /dev/shm went with it
    ck, step, model, said = _relaunch(tmp_path, local_root)
    assert step == 125 and ck.stats["restored_tier"] == "persistent"
    assert same_weights(model, weights_at(125))
    assert any("held nothing of this run" in m and "persistent tier" in m for m in said)
    events = read_events(tmp_path / RUNLOG)
    assert events[-2]["event"] == "start" and events[-2]["local_found"] is False
    assert failures_by_class(events, exclude_session="now", local_found=True) == {
        "process": 0,
        "node": 1,
    }
    assert ck.stats["failures_by_class"] == {"process": 0, "node": 1}
    ck.close()


def test_a_corrupt_local_copy_is_moved_aside_and_the_persistent_one_restored(tmp_path, local_root):
    _crash_after(tmp_path, local_root, 150)
    local = run_dir(local_root)
    flip_a_byte(local / checkpoint_name(145) / ckptio.TENSOR_FILE)
    ck, step, model, said = _relaunch(tmp_path, local_root)
    assert step == 125 and ck.stats["restored_tier"] == "persistent"
    assert same_weights(model, weights_at(125))
    assert any("local tier" in m and "step-00000145" in m for m in said)
    assert any("held no intact checkpoint" in m for m in said)
    assert (local / f"{checkpoint_name(145)}.rejected-corrupt").is_dir()  # kept, not deleted
    ck.close()


def test_a_stale_local_directory_of_another_run_is_never_taken(tmp_path, local_root):
    _crash_after(tmp_path / "old", local_root, 150)  # another run, same local_dir
    stale = run_dir(local_root)
    with pytest.warns(UserWarning, match="1 other run"):
        _crash_after(tmp_path / "new", local_root, 70)  # this run: persistent, local at 65
    ck, step, model, said = _relaunch(tmp_path / "new", local_root)
    assert step == 65 and same_weights(model, weights_at(65))  # not the other run's 145
    assert any("other run" in m and stale.name in m for m in said)
    assert steps_in(stale) == [145]  # never deleted
    ck.close()


def test_a_later_sessions_branch_wins_over_a_newer_local_snapshot_of_a_dead_branch(
    tmp_path, local_root
):
    """A fork: session A leaves local 145 on host A (persistent 125). Its host is away, so
    session B restores the persistent 125 on host B, trains other data to 140 and stops
    (persistent 140). Back on host A, session C must go on from B's 140: A's 145 is newer but
    of a dead branch, and taking it would silently drop B's work."""
    host_a, host_b = local_root / "a", local_root / "b"
    _crash_after(tmp_path, host_a, 150)  # local 145 on host A; persistent 125
    clock = Clock()
    model, opt = make_run(seed=1)
    ck = tiered(tmp_path, host_b, model, opt, clock=clock)
    assert ck.restore() == 125 and ck.stats["restored_tier"] == "persistent"
    for step in range(126, 141):
        train(model, opt, step + 1000)  # B's branch: other data than A had
        clock.t += 0.1
        ck.step(step)
    ck.close()  # the final save: persistent 140
    b_weights = {k: v.clone() for k, v in model.state_dict().items()}
    assert steps_in(tmp_path)[-1] == 140

    ck, step, model, said = _relaunch(tmp_path, host_a)
    assert step == 140 and ck.stats["restored_tier"] == "persistent"
    assert same_weights(model, b_weights)
    assert any("superseded" in m and "generation 1 " in m and "step-00000145" in m for m in said)
    assert any("held only snapshots of an earlier branch" in m for m in said)
    ck.close()


def test_a_session_that_never_restores_starts_a_branch_and_drops_the_old_snapshots(
    tmp_path, local_root
):
    _crash_after(tmp_path, local_root, 150)  # local 145, generation 0
    clock = Clock()
    model, opt = make_run()
    ck = tiered(tmp_path, local_root, model, opt, clock=clock)  # no restore(): from step 0
    run_steps(ck, model, opt, 0, 30, clock)
    # Its local save at 25 is kept: the dead 145 is gone, not ranked above it by retention.
    assert steps_in(run_dir(local_root)) == [25]
    meta = json.loads((run_dir(local_root) / checkpoint_name(25) / ckptio.META_FILE).read_text())
    record = json.loads((tmp_path / RUN_ID_FILE).read_text())
    assert meta["tiered"]["generation"] == record["generation"] == 2
    ck.close()


def test_a_checkpoint_directory_restored_from_a_backup_takes_no_snapshot_of_an_abandoned_branch(
    tmp_path, local_root
):
    """Generations are counted, so the count is reused when the checkpoint directory goes back
    to an older copy (a backup restored by hand): session B branches on host B (generation 2);
    the directory is restored from a backup taken before B, and session C on host C branches
    again (generation 2 once more). When host B is back, its abandoned snapshot must not pass
    for this run's newest state: a branch is named by a random id, not by the count."""
    host_a, host_b, host_c = local_root / "a", local_root / "b", local_root / "c"
    directory, backup = tmp_path / "ckpt", tmp_path / "backup"
    _crash_after(directory, host_a, 150)  # local 145 on A; persistent 125; generation 1
    shutil.copytree(directory, backup)
    for host, offset, stop in ((host_b, 1000, 170), (host_c, 2000, 140)):
        clock = Clock()
        model, opt = make_run(seed=1)
        ck = tiered(directory, host, model, opt, clock=clock)
        assert ck.restore() == 125 and ck.stats["restored_tier"] == "persistent"
        for step in range(126, stop + 1):
            train(model, opt, step + offset)  # each branch its own data
            clock.t += 0.1
            ck.step(step)
        ck.close()
        if host == host_b:  # B's work is abandoned: the directory goes back to the backup
            assert steps_in(host_b / ck.local.run_id)  # B left local snapshots on its host
            shutil.rmtree(directory)
            shutil.copytree(backup, directory)
    c_weights = {k: v.clone() for k, v in model.state_dict().items()}
    ck, step, model, _ = _relaunch(directory, host_b)
    assert step == 140 and ck.stats["restored_tier"] == "persistent"
    assert same_weights(model, c_weights)
    ck.close()


def test_a_checkpoint_planted_with_another_run_id_is_rejected(tmp_path, local_root):
    _crash_after(tmp_path / "a", local_root / "a", 150)
    _crash_after(tmp_path / "b", local_root / "b", 70)
    planted = run_dir(local_root / "a") / checkpoint_name(145)
    shutil.copytree(planted, run_dir(local_root / "b") / checkpoint_name(145))
    ck, step, model, said = _relaunch(tmp_path / "b", local_root / "b")
    assert step == 65 and same_weights(model, weights_at(65))
    assert any("belongs to run" in m for m in said)
    ck.close()


def test_a_local_copy_from_another_configuration_is_refused_as_a_persistent_one_is(
    tmp_path, local_root
):
    _crash_after(tmp_path, local_root, 150, config={"lr": 1e-2})
    with pytest.raises(IncompatibleCheckpoint, match="lr"):
        _relaunch(tmp_path, local_root, config={"lr": 3e-2})


def test_no_intact_copy_in_either_tier_refuses_instead_of_starting_afresh(tmp_path, local_root):
    _crash_after(tmp_path, local_root, 70)  # both tiers at 65
    flip_a_byte(run_dir(local_root) / checkpoint_name(65) / ckptio.TENSOR_FILE)
    flip_a_byte(tmp_path / checkpoint_name(65) / ckptio.TENSOR_FILE)
    with pytest.raises(NoIntactCheckpoint, match="local tier"):
        _relaunch(tmp_path, local_root)


# -- refusals and a local disk that fails ------------------------------------------------------
@pytest.mark.parametrize("inside", ["same", "inside", "url"])
def test_a_local_dir_that_is_no_tier_of_its_own_is_refused_in_one_line(tmp_path, inside):
    model, opt = make_run()
    local = {"same": tmp_path, "inside": tmp_path / "shm", "url": "s3://bucket/x"}[inside]
    with pytest.raises(InputError) as exc:
        tiered(tmp_path, local, model, opt)
    assert "\n" not in str(exc.value) and "local_dir" in str(exc.value)


def test_a_local_dir_linked_into_the_checkpoint_directory_is_refused(tmp_path, local_root):
    link = local_root / "link"
    link.symlink_to(tmp_path / "sub", target_is_directory=True)
    model, opt = make_run()
    with pytest.raises(InputError, match="inside the checkpoint directory"):
        tiered(tmp_path, link, model, opt)


def test_policies_and_backends_the_local_tier_does_not_take_are_refused(tmp_path, local_root):
    model, opt = make_run()
    with pytest.raises(InputError, match="TierSchedule"):
        tiered(tmp_path, local_root, model, opt, policy=FixedInterval(5.0))
    with pytest.raises(InputError, match="give local_dir"):
        AdaptiveCheckpointer(
            tmp_path, model=model, policy=TierSchedule({"local": 1.0, "persistent": 2.0})
        )
    with pytest.raises(InputError, match="exactly"):
        tiered(tmp_path, local_root, model, opt, policy=TierSchedule({"local": 1.0}))
    with pytest.raises(InputError, match="local_keep_last"):
        tiered(tmp_path, local_root, model, opt, local_keep_last=0)
    with pytest.raises(InputError, match="preemption_grace_s"):
        tiered(tmp_path, local_root, model, opt, preemption_grace_s=-1)


def test_a_symlinked_run_directory_disables_the_local_tier_and_the_run_goes_on(
    tmp_path, local_root
):
    _crash_after(tmp_path, local_root, 10)
    run = run_dir(local_root)
    victim = tmp_path / "victim"
    victim.mkdir()
    (victim / "keep.txt").write_text("mine")
    shutil.rmtree(run)
    run.symlink_to(victim, target_is_directory=True)
    clock = Clock()
    model, opt = make_run()
    with pytest.warns(UserWarning, match="local tier disabled.*symlink"):
        ck = tiered(tmp_path, local_root, model, opt, clock=clock)
    ck.restore()
    run_steps(ck, model, opt, 5, 100, clock)
    ck.close()
    assert sorted(p.name for p in victim.iterdir()) == ["keep.txt"]
    assert steps_in(tmp_path)[-1] == 100


_UNSHARE_TMPFS = 'mount -t tmpfs -o size=64k tmpfs "$1" && shift && exec "$@"'
_UNSHARE_RO = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1" && shift && exec "$@"'


def _can_unshare(script: str) -> bool:
    with tempfile.TemporaryDirectory() as probe:
        try:
            run = subprocess.run(
                ["unshare", "-rm", "sh", "-c", script, "sh", probe, "true"],
                capture_output=True,
                timeout=60,
            )
        except (OSError, subprocess.SubprocessError):
            return False
        return run.returncode == 0


_TRAIN_WITH_LOCAL = r"""
import sys, warnings, torch
from simulator.controller import AdaptiveCheckpointer
from simulator.model.tiers import TierSchedule
directory, local = sys.argv[1], sys.argv[2]
torch.manual_seed(0)
model = torch.nn.Linear(64, 64)
opt = torch.optim.AdamW(model.parameters())
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ck = AdaptiveCheckpointer(directory, model=model, optimizer=opt, local_dir=local,
        policy=TierSchedule({"local": 1e-9, "persistent": 1e-9}), probe_steps=1)
    ck.restore()
    for step in range(1, 4):
        opt.zero_grad(); model(torch.ones(1, 64)).sum().backward(); opt.step()
        ck.step(step)
    ck.close()
for w in caught:
    print("WARNED", str(w.message).replace("\n", " "))
print("LOCAL_SAVES", ck.stats["local_saves"], "DISABLED", ck.stats["local_disabled"])
"""


@pytest.mark.parametrize("how", ["full", "read-only"])
def test_a_local_tier_on_a_full_or_read_only_disk_warns_and_the_persistent_tier_goes_on(
    tmp_path, how
):
    script = {"full": _UNSHARE_TMPFS, "read-only": _UNSHARE_RO}[how]
    if not _can_unshare(script):
        pytest.skip("needs unshare to mount a small tmpfs or a read-only bind mount")
    local = tmp_path / "local"
    local.mkdir()
    (tmp_path / "train.py").write_text(_TRAIN_WITH_LOCAL)
    persistent = tmp_path / "ckpt"
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", script, "sh", str(local), sys.executable,
         str(tmp_path / "train.py"), str(persistent), str(local)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={"PYTHONPATH": str(ROOT), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert steps_in(persistent) == [2, 3]  # every persistent save landed (keep_last=2)
    ckptio.verify_checkpoint(persistent / checkpoint_name(3))
    if how == "full":  # 64 KiB: the run's directory fits, a checkpoint (33 KB of weights x3) not
        assert "local tier: saving step 2" in run.stdout and "training goes on" in run.stdout
        assert "LOCAL_SAVES 0 DISABLED None" in run.stdout
    else:
        assert "local tier disabled for this session: cannot create" in run.stdout
        assert "DISABLED cannot create" in run.stdout


_BRANCH_READ_ONLY = r"""
import sys, warnings
from test_controller_tiers import Clock, make_run, tiered, train
warnings.simplefilter("ignore")
clock = Clock()
model, opt = make_run(seed=1)
ck = tiered(sys.argv[1], sys.argv[2], model, opt, clock=clock)
print("READ_ONLY", ck.read_only, "RESTORED", ck.restore(), ck.stats["restored_tier"])
for step in range(126, 181):  # local saves at 145 and 165; the persistent one at 185
    train(model, opt, step + 1000)  # other data: a branch of its own
    clock.t += 0.1
    ck.step(step)
print("LOCAL_SAVES", ck.local_saves, "DISABLED", ck.stats["local_disabled"])
ck._closed = True  # its final save would fail: the directory is read-only
"""


def test_a_read_only_session_from_the_persistent_tier_leaves_no_local_snapshot_to_restore(
    tmp_path, local_root
):
    """Audit: a session whose checkpoint directory is read-only (a read-only mount) cannot
    record a new generation, yet went on saving local snapshots under the old one after it
    restored the persistent tier. The next writable session then took them as this run's newest
    state: another branch (here: other data) restored silently."""
    if not _can_unshare(_UNSHARE_RO):
        pytest.skip("needs unshare to make a read-only bind mount")
    persistent = tmp_path / "ckpt"
    _crash_after(persistent, local_root, 150)  # local 145, persistent 125
    shutil.rmtree(run_dir(local_root))  # that host is lost: the next session has no local copy
    script = tmp_path / "branch.py"
    script.write_text(_BRANCH_READ_ONLY)
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", _UNSHARE_RO, "sh", str(persistent), sys.executable,
         str(script), str(persistent), str(local_root)],
        capture_output=True, text=True, timeout=180, cwd=ROOT,
        env={"PYTHONPATH": f"{ROOT}:{ROOT / 'tests'}", "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    assert "READ_ONLY True RESTORED 125 persistent" in run.stdout
    assert "LOCAL_SAVES 0 DISABLED the run's new branch cannot be recorded" in run.stdout
    ck, step, model, _ = _relaunch(persistent, local_root)
    assert step == 125 and ck.stats["restored_tier"] == "persistent"
    assert same_weights(model, weights_at(125))
    ck.close()


# -- real crashes ---------------------------------------------------------------------------------
_TRAIN = r"""
import hashlib, os, sys, time
import torch
from simulator.controller import AdaptiveCheckpointer
from simulator.model.tiers import TierSchedule

directory, local, steps = sys.argv[1], sys.argv[2], int(sys.argv[3])
torch.set_num_threads(1)
torch.manual_seed(0)
model = torch.nn.Sequential(
    torch.nn.Linear(8, 16), torch.nn.Dropout(0.2), torch.nn.Tanh(), torch.nn.Linear(16, 1)
)
opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
ckpt = AdaptiveCheckpointer(
    directory, model=model, optimizer=opt, local_dir=local if local != "-" else None,
    policy=TierSchedule({"local": 0.05, "persistent": 0.2}) if local != "-" else None,
    probe_steps=5, total_steps=steps, config={"lr": 1e-2},
)
step = ckpt.restore()
print("START", step, ckpt.stats.get("restored_tier"), flush=True)
while step < steps:
    g = torch.Generator().manual_seed(step)
    x = torch.randn(16, 8, generator=g)
    opt.zero_grad()
    torch.nn.functional.mse_loss(model(x), x.sum(1, keepdim=True)).backward()
    opt.step()
    step += 1
    ckpt.step(step)
    print("STEP", step, getattr(ckpt, "local_saves", 0), ckpt.saves, flush=True)
    time.sleep(0.005)
ckpt.close()
h = hashlib.sha256(torch.get_rng_state().numpy().tobytes())
for p in model.parameters():
    h.update(p.detach().numpy().tobytes())
for s in opt.state_dict()["state"].values():
    h.update(s["exp_avg"].numpy().tobytes() + s["exp_avg_sq"].numpy().tobytes())
print("DIGEST", h.hexdigest(), flush=True)
"""


def _env() -> dict:
    import os

    return {**os.environ, "PYTHONPATH": str(ROOT), "PYTHONWARNINGS": "ignore"}


def _kill_at(script, directory, local, steps, at, *, after_a_local_save=False) -> None:
    """SIGKILL the run at step ``at`` or, with ``after_a_local_save``, at the first step from
    there whose save went to the local tier alone (so the local copy is the newest)."""
    import signal

    proc = subprocess.Popen(
        [sys.executable, str(script), str(directory), str(local), str(steps)],
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=_env(),
    )  # fmt: skip
    try:
        counts = (0, 0)
        for line in proc.stdout:
            if not line.startswith("STEP "):
                continue
            step, *now = map(int, line.split()[1:])
            local_only = now[0] > counts[0] and now[1] == counts[1]
            counts = tuple(now)
            if step >= at and (local_only or not after_a_local_save):
                proc.send_signal(signal.SIGKILL)
                break
        proc.communicate(timeout=120)
    finally:
        proc.kill()


def _finish(script, directory, local, steps):
    run = subprocess.run(
        [sys.executable, str(script), str(directory), str(local), str(steps)],
        capture_output=True, text=True, timeout=300, env=_env(),
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    lines = dict(line.split(" ", 1) for line in run.stdout.splitlines() if line[:5] != "STEP ")
    return lines["START"].split(), lines["DIGEST"]


def test_sigkilled_runs_resume_bit_exactly_from_the_local_tier_and_after_a_node_loss(
    tmp_path, local_root
):
    script = tmp_path / "train.py"
    script.write_text(_TRAIN)
    _, straight = _finish(script, tmp_path / "straight", "-", 200)
    # A process crash just after a local save: the relaunch takes that local copy, newer than
    # the persistent one. (Killed anywhere, the newest copy may be a persistent one: the
    # intervals are in seconds of a loaded machine's time.)
    _kill_at(script, tmp_path / "a", local_root / "a", 200, at=80, after_a_local_save=True)
    persisted = max(steps_in(tmp_path / "a"), default=0)
    started, digest = _finish(script, tmp_path / "a", local_root / "a", 200)
    assert started[1] == "local" and int(started[0]) > persisted
    assert digest == straight
    starts = [e for e in read_events(tmp_path / "a" / RUNLOG) if e["event"] == "start"]
    assert [e["local_found"] for e in starts] == [False, True]  # the host had survived
    # A node loss: the local tier is wiped before the relaunch, the persistent copy serves.
    _kill_at(script, tmp_path / "b", local_root / "b", 200, at=80)
    shutil.rmtree(local_root / "b")
    with_persistent = steps_in(tmp_path / "b")
    started, digest = _finish(script, tmp_path / "b", local_root / "b", 200)
    assert started == [str(with_persistent[-1]), "persistent"]
    assert digest == straight
    starts = [e for e in read_events(tmp_path / "b" / RUNLOG) if e["event"] == "start"]
    assert [e["local_found"] for e in starts] == [False, False]  # the node was lost


def test_an_object_store_persistent_tier_with_a_local_tier_in_memory(local_root):
    import uuid

    url = f"memory://ckptsim-{uuid.uuid4().hex[:8]}/run"
    _crash_after(url, local_root, 150)  # local at 145, persistent (uploaded) at 125
    ck, step, model, _ = _relaunch(url, local_root)
    assert step == 145 and ck.stats["restored_tier"] == "local"
    assert same_weights(model, weights_at(145))
    ck.close()
    shutil.rmtree(run_dir(local_root))  # the node is lost
    ck, step, model, said = _relaunch(url, local_root)
    # close() after the restore put the restored local step in the persistent tier too.
    assert step == 145 and ck.stats["restored_tier"] == "persistent"
    assert any("held nothing of this run" in m for m in said)
    ck.close()


def test_a_branch_that_cannot_be_recorded_turns_the_local_tier_off_even_if_its_warning_raises(
    tmp_path, monkeypatch
):
    # The warning ran before the tier was turned off (ca694b5): a filter that makes it an error
    # left the tier on, and the next local save wrote a snapshot under the old branch.
    from simulator.controller import tiered

    ck = AdaptiveCheckpointer(
        tmp_path / "ckpt",
        model=torch.nn.Linear(4, 2),
        local_dir=str(tmp_path / "local"),
        policy=TierSchedule({"local": 1e6, "persistent": 1e6}),
    )
    monkeypatch.setattr(tiered, "next_generation", lambda *a, **k: (None, "a read-only disk"))
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message="local tier disabled")
        with pytest.raises(UserWarning, match="a read-only disk"):
            ck.save(1, tier="local")
    assert ck.local.disabled == "the run's new branch cannot be recorded (a read-only disk)"
    assert not ck.schedule.local_enabled
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        ck.save(2, tier="local")  # no snapshot under a branch the run could not record
    (warning,) = [w for w in caught if "local tier: saving step 2" in str(w.message)]
    assert warning.filename == __file__  # the user's save() line
    assert not list((tmp_path / "local").rglob("step-*"))
    ck.close(finished=False)


@pytest.mark.parametrize("via", ["save", "restore", "close"])
@pytest.mark.parametrize(
    ("fails", "said"),
    [("recording", "local tier disabled"), ("dropping", "cannot remove the snapshots")],
)
def test_a_new_branchs_warnings_name_the_users_call(tmp_path, monkeypatch, via, fails, said):
    # A session's first save (its own, or close()'s final one), or a restore from the
    # persistent tier, starts a new branch of the run; what goes wrong there is warned about at
    # the user's line, whichever call it was.
    import errno

    from simulator.controller import tiered

    def checkpointer():
        return AdaptiveCheckpointer(
            tmp_path / "ckpt",
            model=torch.nn.Linear(4, 2),
            local_dir=str(tmp_path / "local"),
            policy=TierSchedule({"local": 1e6, "persistent": 1e6}),
        )

    first = checkpointer()
    first.save(1, tier="local")  # a snapshot of the first branch, then a newer persistent one
    first.save(2)
    first.close(finished=False)
    ck = checkpointer()
    if fails == "recording":
        monkeypatch.setattr(tiered, "next_generation", lambda *a, **k: (None, "a read-only disk"))
    else:

        def unreadable(*_args, **_kwargs):
            raise OSError(errno.EIO, "Input/output error")

        monkeypatch.setattr(tiered, "delete_checkpoint", unreadable)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        if via == "save":
            ck.save(3)
        elif via == "restore":
            assert ck.restore() == 2
        else:  # the session's first save is close()'s final one
            ck.step(3)
            ck.close()
    (warning,) = [w for w in caught if said in str(w.message)]
    assert warning.filename == __file__, (warning.filename, warning.lineno)
    ck.close(finished=False)
