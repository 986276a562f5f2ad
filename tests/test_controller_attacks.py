"""The checkpoint directory attacked as a user and an adversary would: files planted at the names
the controller writes, permissions changed under it, a file system without locks, and SIGKILLs
at random points of real processes. Nothing outside the directory is written, nothing of the
user's is lost, every refusal is one line, and a relaunch resumes from the newest intact
checkpoint."""

import errno
import fcntl
import os
import random
import shutil
import signal
import subprocess
import sys
import time
import warnings
from pathlib import Path

import pytest
import torch

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, CheckpointWriteError
from simulator.controller.lock import LOCK_FILE
from simulator.controller.runlog import RUNLOG
from simulator.controller.storage import DELETING, checkpoint_name, checkpoint_step
from simulator.policies import FixedInterval


def checkpointer(directory, model=None, **kw):
    model = model if model is not None else torch.nn.Linear(4, 4)
    return AdaptiveCheckpointer(directory, model=model, policy=FixedInterval(1e9), **kw)


def save_steps(directory, steps, **kw):
    model = torch.nn.Linear(4, 4)
    with checkpointer(directory, model, **kw) as ck:
        ck.restore()
        for step in steps:
            with torch.no_grad():
                model.weight.fill_(step)
            ck.save(step)


def step_dirs(directory):
    return sorted(p.name for p in Path(directory).iterdir() if checkpoint_step(p.name) is not None)


# -- the lock file is the directory's own ---------------------------------------------------------
@pytest.mark.parametrize(
    "planted", ["symlink", "dangling symlink", "hard link", "fifo", "directory"]
)
def test_a_lock_file_planted_as_a_link_or_fifo_is_refused_and_nothing_outside_is_written(
    tmp_path, planted
):
    run, victim = tmp_path / "run", tmp_path / "victim.txt"
    run.mkdir()
    lock = run / LOCK_FILE
    if planted == "symlink":
        victim.write_text("precious\n")
        lock.symlink_to(victim)
    elif planted == "dangling symlink":
        lock.symlink_to(victim)
    elif planted == "hard link":
        victim.write_text("precious\n")
        os.link(victim, lock)
    elif planted == "fifo":
        os.mkfifo(lock)
    else:
        lock.mkdir()  # would have run unlocked, with only a warning
    before = victim.read_text() if victim.exists() else None
    with pytest.raises(CheckpointWriteError) as info:
        checkpointer(run)
    message = str(info.value)
    assert str(lock) in message and "remove it" in message and "\n" not in message
    assert (victim.read_text() if victim.exists() else None) == before
    assert sorted(p.name for p in run.iterdir()) == [LOCK_FILE]  # no run log, no start
    if planted == "directory":
        lock.rmdir()
    else:
        lock.unlink()
    save_steps(run, [1])  # once removed, the directory works as any other
    assert step_dirs(run) == [checkpoint_name(1)]


def test_a_hard_linked_copy_of_a_run_never_writes_into_the_original_runs_files(tmp_path):
    original, copy = tmp_path / "run", tmp_path / "copy"
    save_steps(original, [1, 2], keep_last=2)
    shutil.copytree(original, copy, copy_function=os.link)  # what `cp -al` makes
    log_before = (original / RUNLOG).read_bytes()
    lock_before = (original / LOCK_FILE).read_bytes()
    with pytest.raises(CheckpointWriteError, match="hard links"):
        checkpointer(copy)
    assert (original / LOCK_FILE).read_bytes() == lock_before
    (copy / LOCK_FILE).unlink()  # as the refusal says
    with pytest.warns(UserWarning, match="hard links"):
        save_steps(copy, [3, 4], keep_last=2)
    assert step_dirs(copy) == [checkpoint_name(3), checkpoint_name(4)]
    assert (original / RUNLOG).read_bytes() == log_before
    assert step_dirs(original) == [checkpoint_name(1), checkpoint_name(2)]
    for step in (1, 2):
        ckptio.verify_checkpoint(original / checkpoint_name(step))


_DISTRIBUTED_SAVE = """
import sys, tempfile, warnings, torch, torch.distributed as dist
from simulator.controller import AdaptiveCheckpointer
from simulator.controller.distributed import DistributedBackend
from simulator.policies import FixedInterval
warnings.simplefilter("ignore")
dist.init_process_group(
    "gloo", init_method="file://" + sys.argv[2], rank=0, world_size=1
)
ck = AdaptiveCheckpointer(
    sys.argv[1], model=torch.nn.Linear(4, 4), policy=FixedInterval(1e9),
    backend=DistributedBackend(),
)
print("STEP", ck.restore())
for step in map(int, sys.argv[3:]):
    try:
        ck.save(step)
        print("SAVED", step)
    except Exception as exc:
        print("FAILED", step, type(exc).__name__, exc)
ck.close(finished=False)
"""


def test_a_distributed_save_never_writes_through_a_temp_directory_planted_as_a_symlink(tmp_path):
    run_dir, outside = tmp_path / "run", tmp_path / "another-run"
    outside.mkdir()
    (outside / "theirs.txt").write_text("theirs")
    script = tmp_path / "dist_save.py"
    script.write_text(_DISTRIBUTED_SAVE)

    def launch(*steps):
        store = tmp_path / f"store-{len(steps)}"
        run = subprocess.run(
            [sys.executable, str(script), str(run_dir), str(store), *map(str, steps)],
            capture_output=True, text=True, timeout=180,
        )  # fmt: skip
        assert run.returncode == 0, run.stderr[-3000:]
        return run.stdout.splitlines()

    assert launch(1) == ["STEP 0", "SAVED 1"]
    (run_dir / f".tmp-{checkpoint_name(2)}").symlink_to(outside, target_is_directory=True)
    lines = launch(2, 3)
    assert lines[0] == "STEP 1" and lines[2] == "SAVED 3", lines
    assert lines[1].startswith("FAILED 2 CheckpointWriteError") and "is a symlink" in lines[1]
    assert sorted(p.name for p in outside.iterdir()) == ["theirs.txt"]  # nothing written there
    assert step_dirs(run_dir) == [checkpoint_name(1), checkpoint_name(3)]
    assert not (run_dir / checkpoint_name(3)).is_symlink()


# -- permissions changed under the run ---------------------------------------------------------
def _unprivileged() -> list[str] | None:
    """A command prefix under which file permissions apply (root without DAC overrides)."""
    if os.geteuid() != 0:
        return []
    caps = "-dac_override,-dac_read_search,-fowner"
    prefix = ["setpriv", f"--bounding-set={caps}", f"--inh-caps={caps}"]
    probe = Path(os.environ.get("TMPDIR", "/tmp")) / f"ckptsim-perm-probe-{os.getpid()}"
    probe.mkdir(mode=0o000)
    try:
        run = subprocess.run([*prefix, "ls", str(probe)], capture_output=True, timeout=30)
        return prefix if run.returncode != 0 else None
    except (OSError, subprocess.SubprocessError):
        return None
    finally:
        probe.rmdir()


_RESTORE_AND_SAVE = """
import sys, warnings, torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval
warnings.simplefilter("ignore")
model = torch.nn.Linear(4, 4)
ck = AdaptiveCheckpointer(sys.argv[1], model=model, policy=FixedInterval(1e9))
print("STEP", ck.restore(), float(model.weight[0, 0]))
try:
    ck.save(99)
except Exception as exc:
    print("SAVE", type(exc).__name__, exc)
ck.close(finished=False)
"""


def _run_unprivileged(prefix, tmp_path, directory):
    script = tmp_path / "restore_and_save.py"
    script.write_text(_RESTORE_AND_SAVE)
    return subprocess.run(
        [*prefix, sys.executable, str(script), str(directory)],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_checkpoint_directory_nobody_may_read_is_refused_in_one_line(tmp_path):
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("needs setpriv to drop root's permission overrides")
    run_dir = tmp_path / "run"
    save_steps(run_dir, [1])
    run_dir.chmod(0o000)
    try:
        run = _run_unprivileged(prefix, tmp_path, run_dir)
    finally:
        run_dir.chmod(0o755)
    last = run.stderr.strip().splitlines()[-1]
    assert run.returncode == 1
    assert last.startswith("simulator.errors.InputError: cannot read the checkpoint directory")
    assert "Permission denied" in last and "chmod u+rwx" in last
    assert "storage.py" not in run.stderr  # refused up front, not from deep inside
    assert step_dirs(run_dir) == [checkpoint_name(1)]


def test_a_directory_made_read_only_with_a_writable_lock_file_restores_and_changes_nothing(
    tmp_path,
):
    prefix = _unprivileged()
    if prefix is None:
        pytest.skip("needs setpriv to drop root's permission overrides")
    run_dir = tmp_path / "run"
    save_steps(run_dir, [1, 2], keep_last=2)
    (run_dir / f"{DELETING}{checkpoint_name(0)}").mkdir()  # a kill's leftover: not a reader's
    before = sorted((str(p), p.stat().st_mtime_ns) for p in run_dir.rglob("*"))
    run_dir.chmod(0o555)  # chmod a-w: the files in it (the lock file too) stay writable
    try:
        run = _run_unprivileged(prefix, tmp_path, run_dir)
    finally:
        run_dir.chmod(0o755)
    assert run.returncode == 0, run.stderr[-3000:]
    out = dict(line.split(" ", 1) for line in run.stdout.splitlines())
    assert out["STEP"] == "2 2.0"
    assert out["SAVE"].startswith("CheckpointWriteError") and "read-only" in out["SAVE"]
    assert sorted((str(p), p.stat().st_mtime_ns) for p in run_dir.rglob("*")) == before


# -- a person's rescue -----------------------------------------------------------------------------
def test_checkpoints_renamed_back_by_hand_resume_and_retention_deletes_them_by_their_names(
    tmp_path,
):
    save_steps(tmp_path, [10, 20], keep_last=2)
    # A rescue typed by hand: the step is right, the zero padding is not the controller's.
    os.rename(tmp_path / checkpoint_name(10), tmp_path / "step-10")
    os.rename(tmp_path / checkpoint_name(20), tmp_path / "step-0020")
    model = torch.nn.Linear(4, 4)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no "retention failed" at every save
        with checkpointer(tmp_path, model, keep_last=2) as ck:
            assert ck.restore() == 20 and model.weight[0, 0].item() == 20.0
            for step in (21, 22, 23):
                ck.save(step)
    assert step_dirs(tmp_path) == [checkpoint_name(22), checkpoint_name(23)]  # the bound holds


@pytest.mark.parametrize("async_save", [False, True])
def test_a_failed_retention_warns_at_the_users_save_and_the_save_stands(
    tmp_path, monkeypatch, async_save
):
    # Synchronous: the user's save() line. Asynchronous, on the writer thread, no line of the
    # user's is on the stack: the controller's own frame, not the thread pool's.
    from simulator.controller import checkpointer as module

    def refused(*_, **__):
        raise OSError(errno.EACCES, "Permission denied")

    monkeypatch.setattr(module, "apply_retention", refused)
    ck = checkpointer(tmp_path, torch.nn.Linear(4, 4), keep_last=2, async_save=async_save)
    with pytest.warns(UserWarning, match="checkpoint retention failed: .*denied") as caught:
        ck.save(1)
        ck.close(finished=False)  # waits for an asynchronous write
    where = Path(module.__file__ if async_save else __file__).name
    assert [Path(w.filename).name for w in caught] == [where]
    ckptio.verify_checkpoint(tmp_path / checkpoint_name(1))


# -- a file system without flock ----------------------------------------------------------------
def _no_locks(fd, operation):
    """fcntl.flock on Lustre mounted without flock."""
    raise OSError(errno.ENOLCK, "No locks available")


def test_without_flock_retention_deletes_only_the_checkpoints_this_run_wrote(tmp_path, monkeypatch):
    save_steps(tmp_path, [10, 20, 30], keep_last=3)
    shutil.copytree(tmp_path / checkpoint_name(10), tmp_path / checkpoint_name(99))  # misnamed

    monkeypatch.setattr(fcntl, "flock", _no_locks)
    with pytest.warns(UserWarning) as caught:
        model = torch.nn.Linear(4, 4)
        ck = checkpointer(tmp_path, model, keep_last=2)
        assert ck.restore() == 30
        for step in (31, 32, 33):
            ck.save(step)
        ck.close(finished=False)
    messages = " ".join(str(w.message) for w in caught)
    assert "cannot lock" in messages and "its name says 99" in messages
    # The rejected copy (it could not be moved aside) does not count as the newest, and what
    # this run did not write is not its to delete; its own beyond keep_last are.
    assert step_dirs(tmp_path) == [checkpoint_name(s) for s in (10, 20, 30, 32, 33, 99)]


def _step_40_damaged_without_flock(tmp_path, monkeypatch, keep_last: int):
    """Steps 30 and 40 saved, step 40's tensors then damaged, on a file system without flock
    (so the restore leaves the rejected step-40 where it is); its tensor file and bytes."""
    save_steps(tmp_path, [30, 40], keep_last=keep_last)
    tensors = tmp_path / checkpoint_name(40) / ckptio.TENSOR_FILE
    damaged = bytearray(tensors.read_bytes())
    damaged[-3] ^= 0xFF
    tensors.write_bytes(bytes(damaged))
    monkeypatch.setattr(fcntl, "flock", _no_locks)
    return tensors, bytes(damaged)


def test_a_rejected_checkpoint_that_could_not_be_moved_aside_survives_a_save_of_its_step(
    tmp_path, monkeypatch
):
    _, damaged = _step_40_damaged_without_flock(tmp_path, monkeypatch, keep_last=2)
    with pytest.warns(UserWarning) as caught:
        model = torch.nn.Linear(4, 4)
        ck = checkpointer(tmp_path, model, keep_last=2)
        assert ck.restore() == 30  # step-40 rejected, but unlocked it stays where it is
        assert (tmp_path / checkpoint_name(40)).is_dir()
        for step in range(31, 42):
            ck.save(step)  # step 40 again: the rejected one must not be replaced and dropped
        ck.close(finished=False)
    assert "CRC" in " ".join(str(w.message) for w in caught)
    kept = [p for p in tmp_path.iterdir() if p.name.startswith(f"{checkpoint_name(40)}.rejected-")]
    assert len(kept) == 1 and (kept[0] / ckptio.TENSOR_FILE).read_bytes() == damaged
    ckptio.verify_checkpoint(tmp_path / checkpoint_name(40))  # this run's own step 40


def test_a_failed_save_names_a_rescue_renamed_by_hand_by_the_name_it_has(tmp_path, monkeypatch):
    # A person restored a checkpoint by hand as step-10: "the previous checkpoint is intact"
    # must name a directory that exists, not step-00000010.
    save_steps(tmp_path, [10])
    (tmp_path / checkpoint_name(10)).rename(tmp_path / "step-10")

    def full(*_args, **_kwargs):
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    model = torch.nn.Linear(4, 4)
    with checkpointer(tmp_path, model) as ck:
        assert ck.restore() == 10
        monkeypatch.setattr(ckptio, "write_checkpoint", full)
        with pytest.raises(CheckpointWriteError) as refused:
            ck.save(11)
    assert str(refused.value).endswith("the previous checkpoint (step-10) is intact")
    assert step_dirs(tmp_path) == ["step-10"]


def test_a_rejected_checkpoint_that_still_cannot_be_moved_aside_refuses_the_save_of_its_step(
    tmp_path, monkeypatch
):
    # The save of step 40 would replace the step-40 the restore rejected and left in place,
    # and a re-save drops what it replaces: when it cannot be moved aside now either, that
    # save is refused, the rejected one stays byte for byte, and the next step saves.
    tensors, damaged = _step_40_damaged_without_flock(tmp_path, monkeypatch, keep_last=3)
    real_rename = os.rename

    def rename(src, dst, **kw):
        if ".rejected-" in os.fspath(dst):
            raise OSError(errno.EACCES, os.strerror(errno.EACCES))
        return real_rename(src, dst, **kw)

    monkeypatch.setattr(os, "rename", rename)
    with pytest.warns(UserWarning):
        model = torch.nn.Linear(4, 4)
        ck = checkpointer(tmp_path, model, keep_last=3)
        assert ck.restore() == 30
        ck.save(39)
        with pytest.raises(CheckpointWriteError) as refused:
            ck.save(40)
        ck.save(41)
        ck.close(finished=False)
    message = str(refused.value)
    assert "failed verification at restore and cannot be moved aside; it is kept" in message
    # The checkpoint it points to is one a restore can take, not the rejected step-40.
    assert message.endswith(f"the previous checkpoint ({checkpoint_name(39)}) is intact")
    assert tensors.read_bytes() == damaged
    assert not any(".rejected-" in p.name for p in tmp_path.iterdir())
    ckptio.verify_checkpoint(tmp_path / checkpoint_name(41))
    assert checkpoint_name(39) in step_dirs(tmp_path)


# -- SIGKILL at random points -------------------------------------------------------------------
_TRAIN_UNTIL_KILLED = """
import sys, torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval
model = torch.nn.Linear(8, 8)
ck = AdaptiveCheckpointer(sys.argv[1], model=model, policy=FixedInterval(1e9), keep_last=2)
start = ck.restore()
print("RESUMED", start, float(model.weight[0, 0]), flush=True)
for step in range(start + 1, start + 10**6):
    with torch.no_grad():
        model.weight.fill_(step)
    ck.save(step)
"""


def test_random_sigkills_always_resume_from_the_newest_intact_checkpoint_within_the_bound(
    tmp_path,
):
    rng = random.Random(11)
    script = tmp_path / "train.py"
    script.write_text(_TRAIN_UNTIL_KILLED)
    run_dir = tmp_path / "run"
    newest = 0
    for _kill in range(6):
        proc = subprocess.Popen(
            [sys.executable, "-W", "ignore", str(script), str(run_dir)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )  # fmt: skip
        try:
            line = proc.stdout.readline().split()
            assert line and line[0] == "RESUMED", proc.stderr.read()
            assert int(line[1]) == newest  # the newest intact checkpoint, always
            if newest:
                assert float(line[2]) == newest  # and its content, not a neighbour's
            time.sleep(rng.uniform(0.05, 0.6))
        finally:
            proc.send_signal(signal.SIGKILL)
            proc.communicate(timeout=60)
        steps = step_dirs(run_dir)
        assert steps, "no save landed before the kill"
        for name in steps:  # every step-N left is whole: a kill never tears one
            assert not (run_dir / name).is_symlink()
            ckptio.verify_checkpoint(run_dir / name)
        assert len(steps) <= 3, steps  # keep_last, plus one committed before retention ran
        newest = checkpoint_step(steps[-1])
    with checkpointer(run_dir, torch.nn.Linear(8, 8), keep_last=2) as ck:
        assert ck.restore() == newest
        ck.save(newest + 1)
    assert step_dirs(run_dir) == [checkpoint_name(newest), checkpoint_name(newest + 1)]
    hidden = [p.name for p in run_dir.iterdir() if p.name.startswith(".")]
    assert hidden == [LOCK_FILE]  # every kill's leftovers were finished by a later launch
