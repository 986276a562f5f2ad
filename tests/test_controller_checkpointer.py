"""The checkpointer on a real disk: integrity, fallback, refusal of pickles, failed writes."""

import errno
import os
import pickle
import resource
import signal
import warnings

import pytest
import torch

from simulator import ckptio
from simulator.controller import (
    AdaptiveCheckpointer,
    CheckpointWriteError,
    IncompatibleCheckpoint,
    LocalBackend,
    UnsafeCheckpoint,
)
from simulator.controller.integrity import write_manifest
from simulator.controller.lock import LOCK_FILE
from simulator.controller.storage import checkpoint_name
from simulator.policies import FixedInterval


def make_run(seed=0):
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    sched = torch.optim.lr_scheduler.StepLR(opt, step_size=3, gamma=0.5)
    return model, opt, sched


def train(model, opt, sched, steps=1):
    for _ in range(steps):
        opt.zero_grad()
        model(torch.randn(4, 8)).pow(2).mean().backward()
        opt.step()
        sched.step()


def checkpointer(directory, model, opt, sched, **kw):
    kw.setdefault("policy", FixedInterval(1e9))
    return AdaptiveCheckpointer(directory, model=model, optimizer=opt, scheduler=sched, **kw)


def assert_same_model(a, b):
    sa, sb = a.state_dict(), b.state_dict()
    assert list(sa) == list(sb)
    assert all(torch.equal(sa[k], sb[k]) for k in sa)


@pytest.fixture
def two_saves(tmp_path):
    """A directory with good checkpoints at steps 1 and 2, and the model as it was at each."""
    model, opt, sched = make_run()
    snapshots = {}
    with checkpointer(tmp_path, model, opt, sched, keep_last=3) as ck:
        for step in (1, 2):
            train(model, opt, sched)
            ck.save(step)
            snapshots[step] = {k: v.clone() for k, v in model.state_dict().items()}
    return tmp_path, snapshots


def resume(directory, **kw):
    model, opt, sched = make_run(seed=99)
    ck = checkpointer(directory, model, opt, sched, **kw)
    step = ck.restore()
    ck.close()
    return step, model


def test_restore_takes_the_newest_checkpoint_and_an_empty_directory_gives_step_zero(
    two_saves, tmp_path_factory
):
    directory, snaps = two_saves
    step, model = resume(directory)
    assert step == 2
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snaps[2].items())
    assert resume(tmp_path_factory.mktemp("empty"))[0] == 0


def test_a_truncated_newest_checkpoint_falls_back_to_the_previous_one_with_a_warning(two_saves):
    directory, snaps = two_saves
    tensors = directory / checkpoint_name(2) / ckptio.TENSOR_FILE
    os.truncate(tensors, tensors.stat().st_size // 2)
    with pytest.warns(UserWarning, match="truncated"):
        step, model = resume(directory)
    assert step == 1
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snaps[1].items())
    assert (directory / f"{checkpoint_name(2)}.rejected-corrupt").is_dir()  # aside, not reused


def test_a_corrupted_newest_checkpoint_falls_back_to_the_previous_one(two_saves):
    directory, _ = two_saves
    tensors = directory / checkpoint_name(2) / ckptio.TENSOR_FILE
    data = bytearray(tensors.read_bytes())
    data[-3] ^= 0xFF  # one flipped bit pattern inside a tensor: same size, wrong bytes
    tensors.write_bytes(bytes(data))
    with pytest.warns(UserWarning, match="CRC-32"):
        assert resume(directory)[0] == 1


def _bytes_read() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux's /proc/self/io")
def test_a_restore_reads_its_checkpoint_once_checking_every_crc_as_it_loads(tmp_path):
    # The choice checked every CRC by reading the checkpoint, then the load read it again:
    # twice the disk a failure's restart pays. Now the load checks the CRCs in its one pass.
    torch.manual_seed(0)
    model = torch.nn.Linear(1024, 1024)
    opt = torch.optim.AdamW(model.parameters())
    model(torch.randn(2, 1024)).sum().backward()
    opt.step()
    with AdaptiveCheckpointer(
        tmp_path, model=model, optimizer=opt, policy=FixedInterval(1e9)
    ) as ck:
        ck.save(1)
    size = sum(f.stat().st_size for f in (tmp_path / checkpoint_name(1)).iterdir())
    assert size > 12e6  # weights and both moments: 3 x 4 MB
    again = torch.nn.Linear(1024, 1024)
    opt2 = torch.optim.AdamW(again.parameters())
    before = _bytes_read()
    with AdaptiveCheckpointer(
        tmp_path, model=again, optimizer=opt2, policy=FixedInterval(1e9)
    ) as ck:
        assert ck.restore() == 1
    read = _bytes_read() - before
    assert size <= read < 1.3 * size
    assert torch.equal(again.weight, model.weight)


def test_a_checkpoint_whose_manifest_never_got_written_is_moved_aside_not_deleted(two_saves):
    directory, _ = two_saves
    (directory / checkpoint_name(2) / ckptio.MANIFEST).unlink()
    with pytest.warns(UserWarning, match="no manifest"):
        assert resume(directory)[0] == 1
    assert not (directory / checkpoint_name(2)).exists()
    aside = directory / f"{checkpoint_name(2)}.rejected-incomplete"
    assert (aside / ckptio.TENSOR_FILE).is_file()  # what was in it is still there


class Planted:
    """Unpickling this would create a marker file: code running at load time."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (open, (self.marker, "w"))


def test_a_planted_pickle_is_refused_and_its_code_never_runs(two_saves, tmp_path_factory):
    directory, _ = two_saves
    marker = tmp_path_factory.mktemp("m") / "pwned"
    newest = directory / checkpoint_name(2)
    (newest / "extra_state.pkl").write_bytes(pickle.dumps(Planted(marker)))
    (newest / ckptio.MANIFEST).unlink()
    write_manifest(newest)  # listed and checksummed: an unlisted file alone is just corrupt
    with pytest.raises(UnsafeCheckpoint, match=r"extra_state\.pkl is a pickle .*open"):
        resume(directory)
    assert not marker.exists()


def test_a_tensor_file_swapped_for_a_torch_save_pickle_with_a_matching_manifest_is_refused(
    two_saves, tmp_path_factory
):
    directory, _ = two_saves
    marker = tmp_path_factory.mktemp("m") / "pwned"
    newest = directory / checkpoint_name(2)
    torch.save({"w": Planted(marker)}, newest / ckptio.TENSOR_FILE)
    (newest / ckptio.MANIFEST).unlink()
    write_manifest(newest)  # the attacker also rewrote the checksums
    with pytest.raises(UnsafeCheckpoint, match=r"torch\.save archive"):
        resume(directory)
    assert not marker.exists()


def test_resuming_with_a_different_configuration_is_refused_in_one_line(tmp_path):
    model, opt, sched = make_run()
    with checkpointer(tmp_path, model, opt, sched, config={"lr": 0.01, "batch": 4}) as ck:
        ck.save(1)
    with pytest.raises(IncompatibleCheckpoint) as info:
        resume(tmp_path, config={"lr": 0.02, "batch": 4})
    message = str(info.value)
    assert "\n" not in message and "lr=0.01 in the checkpoint, 0.02 in this run" in message
    assert resume(tmp_path, config={"lr": 0.01, "batch": 4})[0] == 1


def test_a_checkpoint_of_another_model_shape_is_refused_clearly(tmp_path):
    model, opt, sched = make_run()
    with checkpointer(tmp_path, model, opt, sched) as ck:
        ck.save(1)
    other = torch.nn.Linear(8, 1)
    ck = AdaptiveCheckpointer(tmp_path, model=other, policy=FixedInterval(1e9))
    with pytest.raises(IncompatibleCheckpoint, match="does not fit this run"):
        ck.restore()
    ck.close()


class FailingBackend(LocalBackend):
    """Writes half a checkpoint, then fails the way a full disk does."""

    def __init__(self):
        self.fail = False

    def write(self, path, state):
        if not self.fail:
            return super().write(path, state)
        path.mkdir()
        (path / ckptio.TENSOR_FILE).write_bytes(b"partial")
        raise OSError(errno.ENOSPC, "No space left on device")


def test_failed_write_never_replaces_last_good(tmp_path):
    model, opt, sched = make_run()
    backend = FailingBackend()
    ck = checkpointer(tmp_path, model, opt, sched, keep_last=1, backend=backend)
    train(model, opt, sched)
    ck.save(1)
    good = {k: v.clone() for k, v in model.state_dict().items()}
    backend.fail = True
    train(model, opt, sched)
    with pytest.raises(CheckpointWriteError, match=r"No space left.*step-00000001.*intact"):
        ck.save(2)
    ck.close()
    assert sorted(p.name for p in tmp_path.iterdir() if p.name.startswith("step-")) == [
        checkpoint_name(1)
    ]
    step, restored = resume(tmp_path)
    assert step == 1
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in good.items())


def test_a_real_write_error_from_the_os_keeps_the_last_good_checkpoint(tmp_path):
    # RLIMIT_FSIZE makes the kernel fail writes past a size (EFBIG): a genuine I/O error.
    model = torch.nn.Linear(256, 256)  # 257 KiB of weights, over the limit below
    ck = AdaptiveCheckpointer(tmp_path, model=model, policy=FixedInterval(1e9), keep_last=1)
    ck.save(1)
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    old_handler = signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
    resource.setrlimit(resource.RLIMIT_FSIZE, (64 * 1024, hard))
    try:
        with pytest.raises(CheckpointWriteError, match="too large"):
            ck.save(2)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
        signal.signal(signal.SIGXFSZ, old_handler)
    ck.close()
    names = sorted(p.name for p in tmp_path.iterdir() if p.name not in ("runlog.jsonl", LOCK_FILE))
    assert names == [checkpoint_name(1)]  # no temp dir left behind either
    ckptio.verify_checkpoint(tmp_path / checkpoint_name(1))


def test_an_async_write_error_surfaces_on_the_next_step_and_keeps_the_last_good(tmp_path):
    model, opt, sched = make_run()
    backend = FailingBackend()
    ck = checkpointer(tmp_path, model, opt, sched, backend=backend, async_save=True)
    ck.save(1)
    if ck._inflight is not None:  # step 1 is written before the disk fills (a loaded CI
        ck._inflight.result()  # machine started its background write after the next line)
    backend.fail = True
    ck.save(2)  # returns once staged; the write fails in the background
    ck._inflight.exception()  # wait for the background thread, as time passing would
    with pytest.raises(CheckpointWriteError, match="background write of step 2"):
        ck.step(3)  # far from due: only the failed write sends it down the slow path
    assert ck.step(4) is False  # reported once, then training goes on
    ck.close(finished=False)  # finished would make a final save, into the same full disk
    assert resume(tmp_path)[0] == 1


def test_an_async_save_is_complete_after_close_and_restores_exactly(tmp_path):
    model, opt, sched = make_run()
    ck = checkpointer(tmp_path, model, opt, sched, async_save=True)
    train(model, opt, sched, 3)
    ck.save(3)
    saved = {k: v.clone() for k, v in model.state_dict().items()}
    train(model, opt, sched, 2)  # training goes on while the write runs
    ck.close()
    step, restored = resume(tmp_path)
    assert step == 3
    assert all(torch.equal(restored.state_dict()[k], v) for k, v in saved.items())
    assert ck.stats["write_s"] > 0 and ck.stats["save_stall_s"] > 0


def _weight_buffer(ck):
    buffers, _ = ck._staging
    return next(t for k, t in buffers.items() if k.endswith("0.weight") and "model" in k)


def test_async_saves_copy_into_the_last_saves_buffers_once_its_write_is_over(tmp_path):
    model, opt, sched = make_run()
    ck = checkpointer(tmp_path, model, opt, sched, async_save=True, keep_last=5)
    saved = {}
    for step in (1, 2, 3):
        train(model, opt, sched)
        ck.save(step)  # waits for the previous write first, then stages into its buffers
        saved[step] = {k: v.clone() for k, v in model.state_dict().items()}
        if step == 1:
            first = _weight_buffer(ck)  # held: its memory cannot come back as a fresh buffer
    assert _weight_buffer(ck) is first  # one set of buffers, copied into again
    ck.close(finished=False)
    # Reusing them changed no committed checkpoint: each holds its own step's weights.
    for step, weights in saved.items():
        tensors, _ = ckptio.read_checkpoint(tmp_path / checkpoint_name(step))
        held = {k.removeprefix("model/"): v for k, v in tensors.items() if k.startswith("model/")}
        assert held and all(torch.equal(held[k], v) for k, v in weights.items())
    assert ck._staging is None  # closed: the buffers' memory is given back


def test_a_write_still_running_keeps_its_buffers_and_the_next_save_stages_into_fresh_ones(
    tmp_path,
):
    from concurrent.futures import Future

    model, opt, sched = make_run()
    ck = checkpointer(tmp_path, model, opt, sched, async_save=True)
    ck.save(1)
    ck._finish_inflight()
    buffers, _ = ck._staging
    # As after a wait that was interrupted (Ctrl-C inside future.result()): the write that
    # reads these buffers has not finished, and nothing waits for it any more.
    ck._staging = (buffers, Future())
    train(model, opt, sched)
    ck.save(2)
    assert (
        _weight_buffer(ck).data_ptr()
        != next(t for k, t in buffers.items() if k.endswith("0.weight") and "model" in k).data_ptr()
    )
    ck.close(finished=False)


def test_saving_a_step_that_exists_replaces_it_only_once_the_new_one_is_complete(tmp_path):
    model, opt, sched = make_run()
    with checkpointer(tmp_path, model, opt, sched) as ck:
        ck.save(1)
        train(model, opt, sched)
        ck.save(1)
    step, restored = resume(tmp_path)
    assert step == 1
    assert_same_model(restored, model)


def test_stale_temp_directories_from_a_crash_are_cleaned_at_restore(two_saves):
    directory, _ = two_saves
    stale = directory / f".{checkpoint_name(3)}.tmp-123-abcd"
    stale.mkdir()
    (stale / ckptio.TENSOR_FILE).write_bytes(b"half")
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert resume(directory)[0] == 2
    assert not stale.exists()


_SCRIPT_WITHOUT_CLOSE = """
import sys, torch
from simulator.controller import AdaptiveCheckpointer
from simulator.policies import FixedInterval
model = torch.nn.Linear(4, 4)
ck = AdaptiveCheckpointer(sys.argv[1], model=model, policy=FixedInterval(1e9), async_save=True)
ck.save(1)  # asynchronous: still in flight when the script ends
if sys.argv[2] == "raise":
    raise RuntimeError("the training loop crashed")
"""


@pytest.mark.parametrize("ending", ["exit", "raise"])
def test_a_script_that_never_calls_close_is_a_clean_stop_only_if_it_exits_normally(
    tmp_path, ending
):
    import subprocess
    import sys

    from simulator.controller.runlog import RUNLOG, failure_evidence, read_events

    script = tmp_path / "train.py"
    script.write_text(_SCRIPT_WITHOUT_CLOSE)
    run = subprocess.run(
        [sys.executable, str(script), str(tmp_path / "ck"), ending],
        capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert (run.returncode == 0) == (ending == "exit"), run.stderr
    events = [e["event"] for e in read_events(tmp_path / "ck" / RUNLOG)]
    # The save in flight at the end is finished either way: no work is lost.
    assert checkpoint_name(1) in os.listdir(tmp_path / "ck")
    assert events[-1] == ("stop" if ending == "exit" else "save")
    # The next session (here: one not in the log yet) counts a failure only after the crash.
    evidence = failure_evidence(read_events(tmp_path / "ck" / RUNLOG), exclude_session="next")
    assert evidence.failures == (0 if ending == "exit" else 1)


def _damage_weights(directory, step):
    """Flip bytes in the middle of a checkpoint's tensor data (same size): the in-place read
    has filled tensors with them before the CRC-32 says no."""
    tensors = directory / checkpoint_name(step) / ckptio.TENSOR_FILE
    data = bytearray(tensors.read_bytes())
    for i in range(len(data) // 2, len(data) - 8, 97):
        data[i] ^= 0x5A
    tensors.write_bytes(bytes(data))


def test_a_restore_reads_into_the_live_model_and_optimizer_in_place(two_saves):
    directory, snaps = two_saves
    model, opt, sched = make_run(seed=99)
    train(model, opt, sched)  # the optimizer holds moments: a rollback within a live process
    moments = {id(v): v.data_ptr() for s in opt.state.values() for v in s.values() if v.dim()}
    with checkpointer(directory, model, opt, sched) as ck:
        assert ck.restore() == 2
    # (The parameters' own addresses never move, in place or not: load_state_dict copies into
    # them. The moments show it: a fresh read would have replaced them.)
    after = [v.data_ptr() for s in opt.state.values() for v in s.values() if v.dim()]
    assert sorted(after) == sorted(moments.values())  # filled, not replaced
    assert all(torch.equal(model.state_dict()[k], v) for k, v in snaps[2].items())


def test_a_corrupt_newest_read_in_place_then_falls_back_to_an_exact_previous_one(two_saves):
    directory, _ = two_saves
    model, opt, sched = make_run()
    train(model, opt, sched)  # what the fixture's step 1 holds, the same draws
    expected_model = {k: v.clone() for k, v in model.state_dict().items()}
    expected_moments = [v.clone() for s in opt.state.values() for v in s.values()]
    _damage_weights(directory, 2)
    model2, opt2, sched2 = make_run(seed=5)
    train(model2, opt2, sched2, steps=3)  # other values everywhere, moments included
    with pytest.warns(UserWarning, match="CRC-32"):
        with checkpointer(directory, model2, opt2, sched2) as ck:
            assert ck.restore() == 1
    assert all(torch.equal(model2.state_dict()[k], v) for k, v in expected_model.items())
    got = [v for s in opt2.state.values() for v in s.values()]
    assert len(got) == len(expected_moments)
    assert all(torch.equal(a, b) for a, b in zip(got, expected_moments, strict=True))


def test_with_allow_fresh_start_a_restore_that_finds_nothing_intact_leaves_the_model_as_it_was(
    two_saves,
):
    directory, _ = two_saves
    for step in (1, 2):
        _damage_weights(directory, step)
    model, opt, sched = make_run(seed=7)
    before = {k: v.clone() for k, v in model.state_dict().items()}
    with pytest.warns(UserWarning):
        with checkpointer(directory, model, opt, sched, allow_fresh_start=True) as ck:
            assert ck.restore() == 0
    assert all(torch.equal(model.state_dict()[k], v) for k, v in before.items())


def test_a_failure_moving_a_corrupt_checkpoint_aside_stops_the_restore(tmp_path, monkeypatch):
    # Rank 0 moves a rejected checkpoint aside between two choices; a failure there is carried
    # to the next choice (so that on several ranks every rank hears of it) and raised: never
    # swallowed into a fallback to an older checkpoint.
    from simulator.controller import checkpointer

    model = torch.nn.Linear(64, 64)
    ckpt = AdaptiveCheckpointer(tmp_path, model=model)
    ckpt.save(1)
    ckpt.save(2)
    ckpt.close()
    data = tmp_path / "step-00000002" / ckptio.TENSOR_FILE
    flipped = bytearray(data.read_bytes())
    flipped[-10] ^= 0xFF
    data.write_bytes(bytes(flipped))
    tried = []

    def failing_disk(storage, name, *_args, **_kwargs):
        tried.append(name)
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(checkpointer, "reject", failing_disk)
    with pytest.raises(OSError, match=r"\[Errno 5\] Input/output error"):
        AdaptiveCheckpointer(tmp_path, model=model).restore()
    assert tried == ["step-00000002"]
    assert (tmp_path / "step-00000002").is_dir() and (tmp_path / "step-00000001").is_dir()
