"""Retention: which checkpoints stay, on an in-memory fake and on a real disk."""

import pytest
import torch
from hypothesis import given
from hypothesis import strategies as st

from simulator import ckptio
from simulator.controller.storage import (
    DELETING,
    MANIFEST,
    LocalStorage,
    MemoryStorage,
    SimulatedCrash,
    apply_retention,
    checkpoint_name,
    checkpoint_step,
    complete_steps,
    retention_plan,
)


def test_keep_last_keeps_the_newest_complete_checkpoints_and_ignores_incomplete_ones():
    s = MemoryStorage()
    for step in (10, 20, 30, 40):
        s.add_checkpoint(step)
    s.add_checkpoint(50, complete=False)  # being written: neither counted nor deleted
    assert apply_retention(s, keep_last=2) == [10, 20]
    assert complete_steps(s) == [30, 40]
    assert s.exists(checkpoint_name(50))


def test_milestones_are_never_deleted():
    s = MemoryStorage()
    for step in range(10, 110, 10):
        s.add_checkpoint(step)
    apply_retention(s, keep_last=1, milestones=(30, 60, 90))
    assert complete_steps(s) == [30, 60, 90, 100]


def test_the_checkpoint_resumed_from_stays_until_a_newer_one_is_complete():
    s = MemoryStorage()
    s.add_checkpoint(40)
    s.add_checkpoint(50, complete=False)
    assert apply_retention(s, keep_last=1, resumed_from=40) == []
    assert complete_steps(s) == [40]
    s.add_checkpoint(50)
    assert apply_retention(s, keep_last=1, resumed_from=40) == [40]


def test_a_deletion_renames_the_checkpoint_aside_durably_before_removing_anything():
    s = MemoryStorage()
    s.add_checkpoint(1)
    s.add_checkpoint(2)
    apply_retention(s, keep_last=1)
    aside = DELETING + checkpoint_name(1)
    assert s.ops == [("rename", checkpoint_name(1), aside), ("sync", ""), ("remove", aside)]


def test_a_crash_at_any_point_of_retention_never_leaves_a_half_deleted_checkpoint():
    """Crash after every possible number of storage operations; the next retention then
    restores the keep-last bound exactly."""
    for ops_before_crash in range(12):
        s = MemoryStorage(crash_after=ops_before_crash)
        for step in (1, 2, 3, 4):
            s.add_checkpoint(step)
        s.crash_after = ops_before_crash
        try:
            apply_retention(s, keep_last=1)
        except SimulatedCrash:
            pass
        # What a crash leaves: whole checkpoints, and entries nothing counts.
        for entry in s.list():
            if checkpoint_step(entry) is not None:
                assert s.exists(f"{entry}/{MANIFEST}"), (ops_before_crash, entry)
                assert s.exists(f"{entry}/{ckptio.TENSOR_FILE}"), (ops_before_crash, entry)
            else:
                assert entry.startswith(DELETING), (ops_before_crash, entry)
        s.crash_after = None
        s.add_checkpoint(5)
        apply_retention(s, keep_last=1)
        assert s.list() == [checkpoint_name(5)], ops_before_crash


@given(
    st.sets(st.integers(1, 200), max_size=30),
    st.integers(1, 5),
    st.sets(st.integers(1, 200), max_size=4),
)
def test_retention_keeps_exactly_the_newest_k_and_the_milestones(steps, k, milestones):
    doomed = retention_plan(steps, keep_last=k, milestones=milestones)
    assert doomed == sorted(doomed)
    kept = steps - set(doomed)
    assert set(doomed) <= steps
    assert kept == set(sorted(steps)[-k:]) | (milestones & steps)


def test_retention_on_a_real_disk_removes_whole_directories(tmp_path):
    for step in (1, 2, 3):
        d = tmp_path / checkpoint_name(step)
        d.mkdir()
        (d / "tensors.safetensors").write_bytes(b"x" * 10)
        (d / ckptio.MANIFEST).write_text("{}")
    (tmp_path / checkpoint_name(4)).mkdir()  # no manifest: a write in progress
    (tmp_path / "runlog.jsonl").write_text("")
    storage = LocalStorage(tmp_path)
    assert apply_retention(storage, keep_last=2) == [1]
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        [checkpoint_name(2), checkpoint_name(3), checkpoint_name(4), "runlog.jsonl"]
    )


def test_local_rename_refuses_to_overwrite(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    with pytest.raises(FileExistsError):
        LocalStorage(tmp_path).rename("a", "b")


def test_a_failing_remove_leaves_the_checkpoint_aside_and_the_next_retention_finishes_it():
    s = MemoryStorage(fail_on={"remove": OSError("EIO")})
    s.add_checkpoint(1)
    s.add_checkpoint(2)
    with pytest.raises(OSError):
        apply_retention(s, keep_last=1)
    assert complete_steps(s) == [2]  # no longer a checkpoint: not counted, not restored
    assert s.list() == [DELETING + checkpoint_name(1), checkpoint_name(2)]
    s.add_checkpoint(3)
    assert apply_retention(s, keep_last=1) == [2]
    assert s.list() == [checkpoint_name(3)]


def _real_checkpoint(path, step):
    ckptio.write_checkpoint(path, {"w": torch.full((4,), float(step))}, {"step": step})


def test_retention_never_follows_a_symlink_into_another_runs_checkpoints(tmp_path):
    other, mine = tmp_path / "other-run", tmp_path / "mine"
    other.mkdir()
    mine.mkdir()
    for step in (5, 6):
        _real_checkpoint(other / checkpoint_name(step), step)
    for step in (2, 3):
        _real_checkpoint(mine / checkpoint_name(step), step)
    # A step directory that is a link to the other run's checkpoint, and a real one whose
    # manifest is a link to the other run's manifest.
    (mine / checkpoint_name(1)).symlink_to(other / checkpoint_name(5), target_is_directory=True)
    (mine / checkpoint_name(0)).mkdir()
    (mine / checkpoint_name(0) / MANIFEST).symlink_to(other / checkpoint_name(6) / MANIFEST)
    storage = LocalStorage(mine)
    assert complete_steps(storage) == [2, 3]  # links are never counted
    assert apply_retention(storage, keep_last=1) == [2]
    for step in (5, 6):
        ckptio.verify_checkpoint(other / checkpoint_name(step))  # untouched
    # The other run's own retention still sees both as complete and keeps both.
    assert apply_retention(LocalStorage(other), keep_last=2) == []
    assert complete_steps(LocalStorage(other)) == [5, 6]
    assert (mine / checkpoint_name(1)).is_symlink()  # the link itself is left to its maker
    assert complete_steps(storage) == [3]
