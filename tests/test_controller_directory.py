"""The checkpoint directory is the user's data: one writer, no deletion outside it or through a
link, deletions that survive a kill, names that match their content, read-only snapshots, and
no silent fresh start. Real processes, real SIGKILL, real files."""

import multiprocessing
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
import torch

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer
from simulator.controller.integrity import CheckpointLocked, NoIntactCheckpoint
from simulator.controller.runlog import RUNLOG, read_events
from simulator.controller.storage import DELETING, checkpoint_name, checkpoint_step
from simulator.policies import FixedInterval

_FORK = multiprocessing.get_context("fork")


def make_model(seed=0):
    torch.manual_seed(seed)
    return torch.nn.Linear(4, 4)


def checkpointer(directory, model, **kw):
    return AdaptiveCheckpointer(directory, model=model, policy=FixedInterval(1e9), **kw)


def save_steps(directory, steps, **kw):
    """A run that saves at ``steps`` (the weights change before each); returns the weights."""
    model = make_model()
    weights = {}
    with checkpointer(directory, model, **kw) as ck:
        for step in steps:
            with torch.no_grad():
                model.weight.add_(1.0)
            ck.save(step)
            weights[step] = model.weight.detach().clone()
    return weights


def resume(directory, **kw):
    model = make_model(seed=99)
    ck = checkpointer(directory, model, **kw)
    step = ck.restore()
    ck.close()
    return step, model.weight.detach().clone()


def step_dirs(directory):
    return sorted(p.name for p in Path(directory).iterdir() if checkpoint_step(p.name) is not None)


# -- one writer per directory -------------------------------------------------------------------
def _hold_the_directory(directory, ready):
    """A run that saved step 1 and is now writing step 2 (its temp directory exists)."""
    ck = checkpointer(directory, make_model())
    ck.restore()
    ck.save(1)
    (Path(directory) / f".{checkpoint_name(2)}.tmp-{os.getpid()}-0000").mkdir()
    ready.set()
    time.sleep(120)  # until killed (an Event would be left broken by the SIGKILL)


def test_a_second_process_on_the_directory_is_refused_naming_the_holder(tmp_path):
    ready = _FORK.Event()
    holder = _FORK.Process(target=_hold_the_directory, args=(tmp_path, ready))
    holder.start()
    try:
        assert ready.wait(60)
        in_flight = tmp_path / f".{checkpoint_name(2)}.tmp-{holder.pid}-0000"
        with pytest.raises(CheckpointLocked) as info:
            checkpointer(tmp_path, make_model())  # a requeued job, while the old one runs
        message = str(info.value)
        assert f"pid {holder.pid} on {socket.gethostname()}" in message and "\n" not in message
        assert in_flight.is_dir()  # the other writer's temp files are untouched
        # The refused launch wrote nothing into the other run's log either.
        assert len({e["session"] for e in read_events(tmp_path / RUNLOG)}) == 1
        os.kill(holder.pid, signal.SIGKILL)  # the kernel drops a dead process's lock
        holder.join(30)
        assert resume(tmp_path)[0] == 1
        assert not in_flight.exists()  # now a crash's leftover, cleaned by the lock holder
    finally:
        if holder.is_alive():
            holder.kill()
        holder.join(30)


def _hold_the_lock_file_as(directory, note, ready):
    """A lock holder whose note names another host, or a pid that is gone: what a dead NFS
    client, or a forked child that kept its parent's lock, leave behind."""
    import fcntl
    import json

    fd = os.open(Path(directory) / ".ckptsim.lock", os.O_RDWR | os.O_CREAT, 0o644)
    fcntl.flock(fd, fcntl.LOCK_EX)
    os.pwrite(fd, json.dumps(note).encode(), 0)
    ready.set()
    time.sleep(120)


@pytest.mark.parametrize("who", ["another host", "a dead pid"])
def test_a_lock_that_may_be_stale_says_why_it_is_held_and_when_to_retry(tmp_path, who):
    gone = _FORK.Process(target=time.sleep, args=(0,))
    gone.start()
    gone.join()  # a pid that no longer runs
    note = (
        {"pid": 4242, "host": "node-17.cluster"}
        if who == "another host"
        else {"pid": gone.pid, "host": socket.gethostname()}
    )
    ready = _FORK.Event()
    holder = _FORK.Process(target=_hold_the_lock_file_as, args=(tmp_path, note, ready))
    holder.start()
    try:
        assert ready.wait(60)
        with pytest.raises(CheckpointLocked) as info:
            checkpointer(tmp_path, make_model())
        message = str(info.value)
        assert "\n" not in message
        if who == "another host":
            assert "pid 4242 on node-17.cluster" in message and "lease expires" in message
        else:
            assert f"pid {gone.pid} is no longer running here" in message
    finally:
        holder.kill()
        holder.join(30)


def test_close_releases_the_lock_and_a_second_checkpointer_in_one_process_is_told_why(tmp_path):
    first = checkpointer(tmp_path, make_model())
    with pytest.raises(CheckpointLocked, match=r"this process: close\(\) the other"):
        checkpointer(tmp_path, make_model())
    first.close()
    checkpointer(tmp_path, make_model()).close()


# -- crash-safe retention -----------------------------------------------------------------------
def _session_killed_inside_retention(directory, kill_at_op):
    """Resume, then save steps, SIGKILLing itself just before the ``kill_at_op``-th file
    operation (unlink, rmdir, rename) that retention makes: a kill inside a deletion."""
    import simulator.controller.checkpointer as module

    count, active = [0], [False]

    def counted(fn):
        def op(*args, **kwargs):
            if active[0]:
                count[0] += 1
                if count[0] == kill_at_op:
                    os.kill(os.getpid(), signal.SIGKILL)
            return fn(*args, **kwargs)

        return op

    for name in ("unlink", "rmdir", "rename"):
        setattr(os, name, counted(getattr(os, name)))
    real_retention = module.apply_retention

    def retention(*args, **kwargs):
        active[0] = True
        try:
            return real_retention(*args, **kwargs)
        finally:
            active[0] = False

    module.apply_retention = retention
    ck = checkpointer(directory, make_model(), keep_last=2)
    start = ck.restore()
    for step in range(start + 1, start + 4):
        ck.save(step)
    ck.close()


def test_a_kill_anywhere_inside_retention_leaves_nothing_half_deleted_and_the_bound_holds(
    tmp_path,
):
    # Every point of the first deletions: before the rename, between it and the removal of
    # each file, before the rmdir, and in the next checkpoint's deletion.
    for kill_at_op in range(1, 9):
        proc = _FORK.Process(target=_session_killed_inside_retention, args=(tmp_path, kill_at_op))
        proc.start()
        proc.join(120)
        assert proc.exitcode == -signal.SIGKILL, (kill_at_op, proc.exitcode)
        for name in step_dirs(tmp_path):  # every step-N left is whole
            ckptio.verify_checkpoint(tmp_path / name)
    leftovers = [p.name for p in tmp_path.iterdir() if p.name.startswith(DELETING)]
    assert leftovers, "no kill landed inside a deletion"
    resume(tmp_path)  # the next run finishes what the kills interrupted
    save_steps(tmp_path, [1000], keep_last=2)
    names = sorted(p.name for p in tmp_path.iterdir() if p.name != RUNLOG and p.name[0] != ".")
    assert len(names) == 2 and names == step_dirs(tmp_path), names
    assert not [p.name for p in tmp_path.iterdir() if p.name.startswith((DELETING, ".step-"))]


# -- links -------------------------------------------------------------------------------------
def test_a_step_directory_that_links_to_another_run_is_never_used_counted_or_deleted_through(
    tmp_path,
):
    other, mine = tmp_path / "other-run", tmp_path / "mine"
    save_steps(other, [5, 6], keep_last=2)
    mine.mkdir()
    (mine / checkpoint_name(9)).symlink_to(other / checkpoint_name(6), target_is_directory=True)
    with pytest.warns(UserWarning, match="symbolic link"):
        ck = checkpointer(mine, make_model(), keep_last=1, allow_fresh_start=True)
        with pytest.warns(UserWarning, match="allow_fresh_start permits"):
            assert ck.restore() == 0  # the other run's state is not this run's
    for step in (1, 2, 3):
        ck.save(step)
    ck.close()
    assert step_dirs(mine) == [checkpoint_name(3), checkpoint_name(9)]
    assert (mine / checkpoint_name(9)).is_symlink()
    for step in (5, 6):
        ckptio.verify_checkpoint(other / checkpoint_name(step))
    with pytest.warns(UserWarning, match="symbolic link"):
        assert resume(mine)[0] == 3
    assert resume(other)[0] == 6


# -- the name and the content agree -------------------------------------------------------------
def test_a_copy_whose_name_disagrees_with_its_step_is_rejected_and_the_newest_real_one_wins(
    tmp_path,
):
    weights = save_steps(tmp_path, [30, 40, 50], keep_last=3)
    shutil.copytree(tmp_path / checkpoint_name(30), tmp_path / checkpoint_name(90))
    with pytest.warns(UserWarning, match="holds step 30, its name says 90"):
        step, weight = resume(tmp_path)
    assert step == 50 and torch.equal(weight, weights[50])
    assert (tmp_path / f"{checkpoint_name(90)}.rejected-misnamed").is_dir()
    save_steps(tmp_path, [60], keep_last=2)
    assert step_dirs(tmp_path) == [checkpoint_name(50), checkpoint_name(60)]


# -- no silent fresh start ----------------------------------------------------------------------
def _damage(directory, step, how):
    tensors = directory / checkpoint_name(step) / ckptio.TENSOR_FILE
    if how == "truncate":
        os.truncate(tensors, tensors.stat().st_size // 2)
    else:
        data = bytearray(tensors.read_bytes())
        data[-3] ^= 0xFF
        tensors.write_bytes(bytes(data))


def test_when_no_checkpoint_is_intact_restore_refuses_to_start_over_and_deletes_nothing(tmp_path):
    save_steps(tmp_path, [1, 2], keep_last=2)
    _damage(tmp_path, 1, "flip")
    _damage(tmp_path, 2, "truncate")
    with pytest.warns(UserWarning), pytest.raises(NoIntactCheckpoint) as info:
        resume(tmp_path)
    message = str(info.value)
    assert "\n" not in message
    assert f"{checkpoint_name(1)}: " in message and "CRC-32" in message
    assert f"{checkpoint_name(2)}: " in message and "truncated" in message
    assert "allow_fresh_start=True" in message
    aside = [tmp_path / f"{checkpoint_name(s)}.rejected-corrupt" for s in (1, 2)]
    assert all((a / ckptio.TENSOR_FILE).is_file() for a in aside)  # kept for a rescue
    # The scheduler relaunches the job: still refused, though the directory now has no step-N.
    with pytest.raises(NoIntactCheckpoint, match="moved aside by an earlier launch"):
        resume(tmp_path)
    with pytest.warns(UserWarning, match="allow_fresh_start permits"):
        assert resume(tmp_path, allow_fresh_start=True)[0] == 0
    save_steps(tmp_path, [1, 2, 3], keep_last=1)  # retention never deletes a rejected one
    assert all((a / ckptio.TENSOR_FILE).is_file() for a in aside)
    assert step_dirs(tmp_path) == [checkpoint_name(3)]


def test_a_refused_launch_is_logged_as_refused_and_is_no_hardware_failure(tmp_path):
    save_steps(tmp_path, [1, 2], keep_last=2)
    for step in (1, 2):
        _damage(tmp_path, step, "truncate")
    # A real launch that dies of the refusal (no close, no clean stop), then the next one.
    script = (
        "import sys, torch\n"
        "from simulator.controller import AdaptiveCheckpointer\n"
        "ck = AdaptiveCheckpointer(sys.argv[1], model=torch.nn.Linear(4, 4))\n"
        "ck.restore()\n"
    )
    run = subprocess.run(
        [sys.executable, "-W", "ignore", "-c", script, str(tmp_path)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 1 and "NoIntactCheckpoint" in run.stderr
    assert [e["event"] for e in read_events(tmp_path / RUNLOG)][-2:] == ["start", "refused"]
    ck = checkpointer(tmp_path, make_model(), allow_fresh_start=True)
    assert ck.stats["failures_seen"] == 0
    ck.close()


# -- a read-only snapshot -----------------------------------------------------------------------
_READ_ONLY_MOUNT = 'mount --bind "$1" "$1" && mount -o remount,ro,bind "$1"'


def _can_mount_read_only() -> bool:
    """A user namespace may bind-mount a directory read-only: a real EROFS, no root needed."""
    with tempfile.TemporaryDirectory() as probe:
        command = ["unshare", "-rm", "sh", "-c", _READ_ONLY_MOUNT, "sh", probe]
        try:
            return subprocess.run(command, capture_output=True, timeout=60).returncode == 0
        except (OSError, subprocess.SubprocessError):
            return False


_RESTORE_FROM_SNAPSHOT = """
import sys, warnings, torch
from simulator.controller import AdaptiveCheckpointer, CheckpointWriteError
from simulator.policies import FixedInterval
model = torch.nn.Linear(4, 4)
with warnings.catch_warnings(record=True) as caught:
    warnings.simplefilter("always")
    ck = AdaptiveCheckpointer(sys.argv[1], model=model, policy=FixedInterval(1e9))
    print("STEP", ck.restore())
print("WARNED", any("is read-only: restoring only" in str(w.message) for w in caught))
try:
    ck.save(99)
except CheckpointWriteError as exc:
    print("SAVE", type(exc).__name__, exc)
ck.close()
print("WEIGHT", repr(model.weight.sum().item()))
"""


@pytest.mark.skipif(not _can_mount_read_only(), reason="needs unshare to mount read-only")
def test_a_read_only_snapshot_restores_and_writes_nothing_and_a_save_fails_clearly(tmp_path):
    snapshot = tmp_path / "snapshot"
    weights = save_steps(snapshot, [1, 2, 3], keep_last=3)
    _damage(snapshot, 3, "truncate")  # a reader falls back past it but cannot move it aside
    (snapshot / f".{checkpoint_name(4)}.tmp-1-0000").mkdir()  # not a reader's to clean
    before = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in snapshot.rglob("*"))
    script = tmp_path / "restore.py"
    script.write_text(_RESTORE_FROM_SNAPSHOT)
    mount = _READ_ONLY_MOUNT + ' && exec "$2" "$3" "$1"'
    run = subprocess.run(
        ["unshare", "-rm", "sh", "-c", mount, "sh", str(snapshot), sys.executable, str(script)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert run.returncode == 0, run.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert out["STEP"] == "2" and out["WARNED"] == "True"
    assert float(out["WEIGHT"]) == weights[2].sum().item()
    assert out["SAVE"].startswith("CheckpointWriteError") and "read-only" in out["SAVE"]
    after = sorted((str(p), p.stat().st_size, p.stat().st_mtime_ns) for p in snapshot.rglob("*"))
    assert after == before


def test_a_run_log_that_cannot_be_written_never_fails_a_save(tmp_path):
    ck = checkpointer(tmp_path, make_model())
    (tmp_path / RUNLOG).unlink()
    (tmp_path / RUNLOG).mkdir()  # EISDIR on every append from now on
    with pytest.warns(UserWarning, match="cannot write the run log"):
        ck.save(1)
    ck.close()
    # The next launch reads the log first: it is told once, on reading, and still resumes.
    with pytest.warns(UserWarning, match="cannot read the run log .* not a regular file"):
        assert resume(tmp_path)[0] == 1
