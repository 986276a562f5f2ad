"""Retention: which checkpoints stay, on an in-memory fake and on a real disk."""

import pytest
from hypothesis import given
from hypothesis import strategies as st

from simulator import ckptio
from simulator.controller.storage import (
    LocalStorage,
    MemoryStorage,
    apply_retention,
    checkpoint_name,
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


def test_the_manifest_goes_first_so_a_half_deleted_checkpoint_is_not_complete():
    s = MemoryStorage()
    s.add_checkpoint(1)
    s.add_checkpoint(2)
    apply_retention(s, keep_last=1)
    assert s.ops[0] == ("remove", f"{checkpoint_name(1)}/{ckptio.MANIFEST}")


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


def test_a_failing_remove_in_the_fake_leaves_the_checkpoint_listed():
    s = MemoryStorage(fail_on={"remove": OSError("EIO")})
    s.add_checkpoint(1)
    s.add_checkpoint(2)
    with pytest.raises(OSError):
        apply_retention(s, keep_last=1)
    assert complete_steps(s) == [1, 2]
