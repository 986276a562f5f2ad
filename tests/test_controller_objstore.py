"""Checkpoints on object storage: a real S3-compatible server (moto's, on 127.0.0.1) through s3fs,
and fsspec's ``memory://``. The same guarantees as on a disk: a run SIGKILLed inside an upload
resumes bit-exactly, retention keeps its bound and never the newest complete checkpoint away,
a flipped byte makes the restore fall back with a warning, an upload without its manifest is
never taken, and nothing planted in the bucket is unpickled or read from outside the prefix.
"""

from __future__ import annotations

import json
import tempfile
import time
import uuid
import warnings
from pathlib import Path

import pytest
import torch

from simulator import ckptio
from simulator.controller import AdaptiveCheckpointer, UnsafeCheckpoint
from simulator.controller.integrity import CheckpointWriteError
from simulator.controller.objstore import FsspecStorage, open_storage
from simulator.controller.storage import LocalStorage, checkpoint_name
from simulator.errors import InputError
from simulator.policies import FixedInterval

pytest_plugins = ("_s3server",)
pytest.importorskip("s3fs")


def client():
    """A fresh s3fs client: no listing cached from an earlier call."""
    import s3fs

    return s3fs.S3FileSystem(skip_instance_cache=True)


def key(url: str, name: str = "") -> str:
    return url[len("s3://") :] + (f"/{name}" if name else "")


def checkpointer(url, model, **kw) -> AdaptiveCheckpointer:
    kw.setdefault("policy", FixedInterval(1e9))  # saves only when the test says so
    return AdaptiveCheckpointer(url, model=model, preemption_signals=(), **kw)


def save_steps(url, steps, *, keep_last=10, **kw) -> None:
    model = torch.nn.Linear(4, 4)
    with checkpointer(url, model, keep_last=keep_last, **kw) as ck:
        ck.restore()
        for step in steps:
            model.weight.data.fill_(float(step))
            ck.save(step)
        ck.close(finished=False)


def steps_in(url: str, fs=None) -> dict[int, bool]:
    """step -> whether it has its manifest, for every ``step-N`` prefix under ``url``."""
    fs = fs or client()
    out: dict[int, bool] = {}
    for path in fs.find(key(url)):
        rel = path[len(key(url)) + 1 :]
        top = rel.split("/", 1)[0]
        if top.startswith("step-") and top[5:].isdigit():
            out[int(top[5:])] = out.get(int(top[5:]), False) or rel.endswith("/" + ckptio.MANIFEST)
    return out


def restored_weight(url, **kw) -> tuple[int, float]:
    model = torch.nn.Linear(4, 4)
    ck = checkpointer(url, model, **kw)
    step = ck.restore()
    ck.close(finished=False)
    return step, model.weight[0, 0].item()


# -- SIGKILL inside an upload -----------------------------------------------------------------
def kill_inside_an_upload(url: str, out: Path, seen: set[int], *extra: str) -> bool:
    """Start the demo training run and SIGKILL it as soon as an upload of a step not in
    ``seen`` has put some objects but not its manifest; False if it finished first."""
    from test_controller_resume import launch

    proc = launch(url, out, *extra)
    try:
        for line in proc.stdout:
            if line.startswith("SAVE"):
                break
        deadline = time.monotonic() + 60.0
        while proc.poll() is None and time.monotonic() < deadline:
            cut = {s for s, complete in steps_in(url).items() if not complete} - seen
            if cut:
                seen |= cut
                return True
            time.sleep(0.005)
        return False
    finally:
        proc.kill()  # SIGKILL: no cleanup, no atexit, no flush
        proc.communicate()


@pytest.mark.parametrize("mode", ["sync", pytest.param("async", marks=pytest.mark.slow)])
def test_a_run_killed_inside_uploads_to_s3_resumes_bit_exactly(tmp_path, s3_url, mode):
    from test_controller_resume import STEPS, run_in_this_process, run_to_end, same

    asynchronous = ("--async-save",) if mode == "async" else ()
    reference = tmp_path / "reference.pt"
    run_in_this_process(tmp_path / "uninterrupted", reference)  # on a disk: the same training
    resumed = tmp_path / "resumed.pt"
    seen: set[int] = set()
    hits = 0
    for _ in range(2):
        # Each object's upload waits 0.1 s first: the kill lands between two objects.
        hits += kill_inside_an_upload(s3_url, resumed, seen, "--put-delay-s", "0.1", *asynchronous)
    assert hits == 2, "a kill did not land inside an upload"
    staging = set(Path(tempfile.gettempdir()).glob("ckptsim-upload-*"))
    assert staging, "a process killed inside an upload leaves its local staging copy"
    run_to_end(s3_url, resumed, *asynchronous)
    # The killed processes' local staging copies went with the next launch's first upload.
    assert not staging & set(Path(tempfile.gettempdir()).glob("ckptsim-upload-*"))
    want = torch.load(reference, weights_only=True)
    got = torch.load(resumed, weights_only=True)
    for name in want:
        assert same(got[name], want[name]), f"{name} differs after kill-and-resume on S3"
    assert want["data"]["served"] == STEPS
    # Every committed checkpoint verifies; the run log (one object per session) is there.
    assert len(client().find(key(s3_url, "runlog"))) == 3
    storage = FsspecStorage(s3_url)
    for step, complete in steps_in(s3_url).items():
        if complete:
            ckptio.verify_checkpoint(storage.local_copy(checkpoint_name(step)))
    storage.drop_local_copies()


# -- retention --------------------------------------------------------------------------------
def test_retention_on_s3_keeps_the_newest_complete_checkpoints(s3_url):
    save_steps(s3_url, [10, 20, 30, 40, 50], keep_last=2)
    assert steps_in(s3_url) == {40: True, 50: True}
    assert restored_weight(s3_url) == (50, 50.0)


def test_a_failed_upload_on_s3_leaves_the_newest_complete_checkpoint_and_no_partial_one(
    s3_url, monkeypatch
):
    save_steps(s3_url, [10, 20], keep_last=1)
    assert steps_in(s3_url) == {20: True}

    real_put = FsspecStorage._put

    def failing_manifest(self, file, key, *, create):
        if create:
            raise OSError("connection reset by peer")
        real_put(self, file, key, create=create)

    monkeypatch.setattr(FsspecStorage, "_put", failing_manifest)
    model = torch.nn.Linear(4, 4)
    with checkpointer(s3_url, model, keep_last=1) as ck:
        assert ck.restore() == 20
        with pytest.raises(CheckpointWriteError, match="connection reset"):
            ck.save(30)
        ck.close(finished=False)
    assert steps_in(s3_url) == {20: True}  # retention never ran for the failed save
    monkeypatch.undo()
    assert restored_weight(s3_url) == (20, 20.0)


def test_without_exclusive_retention_deletes_only_what_this_process_wrote(s3_url):
    save_steps(s3_url, [10, 20, 30], keep_last=3)
    with pytest.warns(UserWarning, match="holds 1 complete checkpoint.* beyond keep_last=2"):
        save_steps(s3_url, [31, 32, 33], keep_last=2)  # the unlocked-directory rule
    assert sorted(steps_in(s3_url)) == [10, 20, 30, 32, 33]


def test_with_exclusive_the_keep_last_bound_holds_across_relaunches(s3_url):
    def exclusive(url):
        return FsspecStorage(url, exclusive=True)

    save_steps(s3_url, [10, 20, 30], keep_last=3, storage=exclusive(s3_url))
    save_steps(s3_url, [31, 32, 33], keep_last=2, storage=exclusive(s3_url))
    assert sorted(steps_in(s3_url)) == [32, 33]


# -- damage -----------------------------------------------------------------------------------
def _flip_a_byte(url: str, name: str, from_end: int = 20) -> None:
    fs = client()
    path = key(url, name)
    data = bytearray(fs.cat_file(path))
    data[-from_end] ^= 0xFF
    fs.pipe_file(path, bytes(data))


def test_a_flipped_byte_in_a_tensor_object_makes_the_restore_fall_back_with_a_warning(s3_url):
    save_steps(s3_url, [10, 20], keep_last=2)
    _flip_a_byte(s3_url, f"{checkpoint_name(20)}/{ckptio.TENSOR_FILE}")
    with pytest.warns(UserWarning, match="CRC-32.*falling back"):
        assert restored_weight(s3_url) == (10, 10.0)
    assert steps_in(s3_url) == {10: True, 20: True}  # without a lock: skipped, left in place


def test_with_exclusive_a_corrupt_checkpoint_is_moved_aside(s3_url):
    save_steps(s3_url, [10, 20], keep_last=2)
    _flip_a_byte(s3_url, f"{checkpoint_name(20)}/{ckptio.TENSOR_FILE}")
    with pytest.warns(UserWarning, match="moved aside"):
        assert restored_weight(s3_url, storage=FsspecStorage(s3_url, exclusive=True)) == (
            10,
            10.0,
        )
    assert steps_in(s3_url) == {10: True}
    assert client().find(key(s3_url, f"{checkpoint_name(20)}.rejected-corrupt"))


def test_an_upload_without_its_manifest_is_never_taken_for_a_checkpoint(s3_url):
    save_steps(s3_url, [10, 20], keep_last=2)
    fs = client()
    fs.rm(key(s3_url, f"{checkpoint_name(20)}/{ckptio.MANIFEST}"))  # the upload cut short
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # an unfinished upload is no damage to warn about
        assert restored_weight(s3_url) == (10, 10.0)
    # The next save of that step replaces it, complete.
    save_steps(s3_url, [20], keep_last=5)
    assert steps_in(s3_url) == {10: True, 20: True}
    assert restored_weight(s3_url) == (20, 20.0)


def test_a_bucket_holding_only_an_unfinished_first_upload_starts_afresh(s3_url):
    save_steps(s3_url, [10])
    client().rm(key(s3_url, f"{checkpoint_name(10)}/{ckptio.MANIFEST}"))
    assert restored_weight(s3_url)[0] == 0  # no NoIntactCheckpoint: nothing ever committed


def test_with_exclusive_an_unfinished_upload_is_removed_at_restore(s3_url):
    save_steps(s3_url, [10, 20])
    client().rm(key(s3_url, f"{checkpoint_name(20)}/{ckptio.MANIFEST}"))
    assert restored_weight(s3_url, storage=FsspecStorage(s3_url, exclusive=True))[0] == 10
    assert steps_in(s3_url) == {10: True}


def test_an_upload_onto_a_committed_checkpoint_is_refused_and_changes_nothing(s3_url, tmp_path):
    save_steps(s3_url, [10])
    other = tmp_path / "other"
    ckptio.write_checkpoint(other, {"w": torch.ones(3)}, {"step": 10})
    with pytest.raises(CheckpointWriteError, match="already committed"):
        FsspecStorage(s3_url).upload(other, checkpoint_name(10))
    assert restored_weight(s3_url) == (10, 10.0)


def test_of_two_writers_racing_on_one_step_only_the_first_manifest_counts(
    s3_url, tmp_path, monkeypatch
):
    """The manifest is put create-only (If-None-Match: *): a writer that passed the check
    before another committed cannot replace the other's manifest (its own objects may have
    replaced the other's data, which that manifest's CRC-32s then refuse)."""
    name = checkpoint_name(10)
    first, second = tmp_path / "first", tmp_path / "second"
    ckptio.write_checkpoint(first, {"w": torch.zeros(3)}, {"step": 10})
    ckptio.write_checkpoint(second, {"w": torch.ones(3)}, {"step": 10})
    storage = FsspecStorage(s3_url)
    real_put = FsspecStorage._put

    def first_commits_meanwhile(self, file, key, *, create):
        if create and Path(file).parent == second:
            monkeypatch.setattr(FsspecStorage, "_put", real_put)
            client().pipe_file(key, (first / ckptio.MANIFEST).read_bytes())  # the other writer
        real_put(self, file, key, create=create)

    monkeypatch.setattr(FsspecStorage, "_put", first_commits_meanwhile)
    with pytest.raises(CheckpointWriteError, match="another writer committed it first"):
        storage.upload(second, name)
    stored = client().cat_file(key(s3_url, f"{name}/{ckptio.MANIFEST}"))
    assert stored == (first / ckptio.MANIFEST).read_bytes()


# -- an attacker's bucket ---------------------------------------------------------------------
def _reseal(url: str, name: str, files: dict[str, bytes], tmp_path: Path) -> None:
    """Replace checkpoint ``name`` by ``files`` under a manifest with correct CRC-32s, as a
    hostile writer can (checksums are no defence against one)."""
    fs = client()
    fs.rm(key(url, name), recursive=True)
    entries = {}
    for rel, data in files.items():
        fs.pipe_file(key(url, f"{name}/{rel}"), data)
        entries[rel] = {"bytes": len(data), "crc32": ckptio.file_crc32(_tmp(tmp_path, data))}
    manifest = {
        "format": ckptio.FORMAT,
        "version": ckptio.VERSION,
        "checksum": "crc32",
        "files": entries,
        "bytes": sum(e["bytes"] for e in entries.values()),
    }
    fs.pipe_file(key(url, f"{name}/{ckptio.MANIFEST}"), json.dumps(manifest).encode())


def _tmp(tmp_path: Path, data: bytes) -> Path:
    p = tmp_path / uuid.uuid4().hex
    p.write_bytes(data)
    return p


def _objects_of(url: str, name: str) -> dict[str, bytes]:
    fs = client()
    top = key(url, name)
    return {p[len(top) + 1 :]: fs.cat_file(p) for p in fs.find(top)}


def test_a_planted_pickle_listed_in_the_manifest_is_refused_not_loaded(s3_url, tmp_path):
    import pickle

    save_steps(s3_url, [10, 20])
    name = checkpoint_name(20)
    files = {k: v for k, v in _objects_of(s3_url, name).items() if k != ckptio.MANIFEST}
    files["extra.bin"] = pickle.dumps({"a": 1})  # would run code when unpickled
    _reseal(s3_url, name, files, tmp_path)
    model = torch.nn.Linear(4, 4)
    ck = checkpointer(s3_url, model)
    with pytest.raises(UnsafeCheckpoint, match=r"extra\.bin is a pickle"):
        ck.restore()


def test_an_unlisted_object_in_a_checkpoint_makes_it_fall_back(s3_url):
    save_steps(s3_url, [10, 20])
    client().pipe_file(key(s3_url, f"{checkpoint_name(20)}/state.pt"), b"\x80\x04N.")
    with pytest.warns(UserWarning, match="not listed in the manifest"):
        assert restored_weight(s3_url) == (10, 10.0)


@pytest.mark.parametrize(
    "evil",
    [
        f"../{checkpoint_name(10)}/{ckptio.TENSOR_FILE}",
        "/etc/passwd",
        f"a/../../{checkpoint_name(10)}/{ckptio.META_FILE}",
    ],
)
def test_a_manifest_naming_keys_outside_its_prefix_is_refused(s3_url, tmp_path, evil):
    save_steps(s3_url, [10, 20])
    name = checkpoint_name(20)
    files = {k: v for k, v in _objects_of(s3_url, name).items() if k != ckptio.MANIFEST}
    _reseal(s3_url, name, files, tmp_path)
    fs = client()
    manifest = json.loads(fs.cat_file(key(s3_url, f"{name}/{ckptio.MANIFEST}")))
    manifest["files"][evil] = manifest["files"].pop(ckptio.TENSOR_FILE)
    fs.pipe_file(key(s3_url, f"{name}/{ckptio.MANIFEST}"), json.dumps(manifest).encode())
    with pytest.warns(UserWarning, match="relative paths inside it"):
        assert restored_weight(s3_url) == (10, 10.0)


def test_an_object_whose_key_climbs_out_of_its_checkpoint_is_refused(s3_url):
    save_steps(s3_url, [10, 20])
    # S3 keys are plain strings: "step-N/../x" is one object, listed under step-N.
    client().pipe_file(key(s3_url, f"{checkpoint_name(20)}/sub/../../evil"), b"x")
    storage = FsspecStorage(s3_url)
    if not any(".." in rel for rel in storage.objects(checkpoint_name(20))):
        pytest.skip("this client normalises '..' out of keys")
    with pytest.warns(UserWarning, match="an empty, '.' or '..' path component"):
        assert restored_weight(s3_url) == (10, 10.0)


def test_storage_names_never_leave_the_root():
    storage = FsspecStorage("memory://names-root")
    for bad in ("../x", "a/../../x", "/abs", "a\\b", "a//b", "."):
        with pytest.raises(ValueError, match="no name inside"):
            storage.key(bad)


# -- memory://, file://, bad input ------------------------------------------------------------
def test_memory_urls_save_restore_and_keep_their_bound():
    url = f"memory://ckptsim-{uuid.uuid4().hex[:8]}/run"
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 8)
    opt = torch.optim.AdamW(model.parameters(), lr=0.1)
    with checkpointer(url, model, optimizer=opt, keep_last=2) as ck:
        ck.restore()
        for step in range(1, 6):
            model(torch.randn(2, 8)).sum().backward()
            opt.step()
            ck.save(step)
        want = {k: v.clone() for k, v in model.state_dict().items()}
        ck.close(finished=False)
    import fsspec

    fs = fsspec.filesystem("memory")
    root = url[len("memory://") :]
    assert sorted({p.split("/")[-2] for p in fs.find("/" + root) if "/step-" in p}) == [
        checkpoint_name(4),
        checkpoint_name(5),
    ]
    model2 = torch.nn.Linear(8, 8)
    opt2 = torch.optim.AdamW(model2.parameters(), lr=0.1)
    with checkpointer(url, model2, optimizer=opt2) as ck:
        assert ck.restore() == 5
        ck.close(finished=False)
    for k, v in want.items():
        assert torch.equal(model2.state_dict()[k], v)
    assert opt2.state_dict()["state"][0]["step"] == 5


def test_a_file_url_is_a_local_directory_with_its_lock(tmp_path):
    storage = open_storage(f"file://{tmp_path}")
    assert isinstance(storage, LocalStorage) and storage.root == tmp_path
    model = torch.nn.Linear(4, 4)
    with checkpointer(f"file://{tmp_path}", model) as ck:
        ck.restore()
        ck.save(1)
        assert ck._lock.held
        ck.close(finished=False)
    assert (tmp_path / checkpoint_name(1) / ckptio.MANIFEST).is_file()


def test_a_missing_bucket_is_refused_in_one_line(s3_server):
    with pytest.raises(InputError, match=r"cannot reach s3://no-such-bucket-ckptsim/run: ") as e:
        checkpointer("s3://no-such-bucket-ckptsim/run", torch.nn.Linear(2, 2))
    assert "\n" not in str(e.value)


def test_a_distributed_backend_with_a_url_is_refused_in_one_line():
    class Distributed:
        rank, world_size = 0, 2

        def writes_manifest(self):
            return True

    with pytest.raises(InputError, match="shared file system path"):
        checkpointer("memory://x/run", torch.nn.Linear(2, 2), backend=Distributed())


def test_the_framework_adapters_say_in_one_line_that_they_write_to_file_systems():
    pytest.importorskip("lightning")
    from simulator.controller.lightning import AdaptiveCheckpoint

    with pytest.raises(InputError, match="the Lightning adapter checkpoints to a local or shared"):
        AdaptiveCheckpoint("s3://bucket/run")


def test_without_exclusive_a_relaunch_says_what_retention_will_never_delete():
    """Each relaunch keeps its last keep_last checkpoints for good (retention deletes only this
    process's saves): the store grows, and the relaunch that finds more says so, once."""
    url = f"memory://ckptsim-{uuid.uuid4().hex[:8]}/run"
    save_steps(url, [1, 2, 3], keep_last=2)  # keeps 2, 3
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # two complete checkpoints, keep_last 2: nothing to say
        save_steps(url, [4, 5, 6], keep_last=2)  # keeps 2, 3 and its own 5, 6
    with pytest.warns(UserWarning) as caught:
        save_steps(url, [7], keep_last=2)
    said = [str(w.message) for w in caught if "beyond keep_last" in str(w.message)]
    assert said == [
        f"{url} holds 2 complete checkpoint(s) beyond keep_last=2 (oldest {checkpoint_name(2)}) "
        "that earlier processes wrote; without a lock retention deletes only this process's "
        "saves, so they stay and each relaunch adds more: pass exclusive=True if no other "
        "process writes here, or delete them"
    ]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the user's promise: retention keeps the bound itself
        save_steps(url, [8], keep_last=2, storage=FsspecStorage(url, exclusive=True))
    assert restored_weight(url) == (8, 8.0)


# -- a download that fails on our side ---------------------------------------------------------
_RESTORE_WITH_A_FILE_SIZE_LIMIT = """
import json, resource, signal, sys, warnings
import torch
from simulator.controller import AdaptiveCheckpointer, CheckpointReadError
from simulator.controller.objstore import FsspecStorage
from simulator.policies import FixedInterval

url, staging, exclusive = sys.argv[1], sys.argv[2], sys.argv[3] == "1"
# The kernel refuses every write past 4 KiB from here on (EFBIG): the staging disk is full
# for this process, the manifests download, the tensors do not.
signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
resource.setrlimit(resource.RLIMIT_FSIZE, (4096, 4096))
storage = FsspecStorage(url, exclusive=exclusive, staging_dir=staging)
ck = AdaptiveCheckpointer(url, model=torch.nn.Linear(64, 64), storage=storage,
                          policy=FixedInterval(1e9), preemption_signals=(),
                          allow_fresh_start=True)
with warnings.catch_warnings(record=True) as seen:
    warnings.simplefilter("always")
    try:
        out = {"step": ck.restore()}
    except CheckpointReadError as exc:
        out = {"error": str(exc), "errno": exc.errno}
print(json.dumps(out | {"warnings": [str(w.message) for w in seen]}))
"""


@pytest.mark.parametrize("exclusive", [False, True])
def test_a_download_that_fails_on_our_side_stops_the_restore_and_judges_nothing(
    s3_url, tmp_path, exclusive
):
    # From review: a full staging disk (or a network error) while downloading was taken for
    # damage: every checkpoint was rejected, with exclusive=True moved aside, and with
    # allow_fresh_start the run went on from step 0. The restore must stop, move nothing, and
    # restore the newest checkpoint once the cause is gone.
    import subprocess
    import sys

    model = torch.nn.Linear(64, 64)  # 16 KiB of weights: past the limit below
    with checkpointer(s3_url, model, keep_last=5) as ck:
        ck.restore()
        for step in (10, 20, 30):
            model.weight.data.fill_(float(step))
            ck.save(step)
        ck.close(finished=False)
    staging, flag = tmp_path / "staging", str(int(exclusive))
    run = subprocess.run(
        [sys.executable, "-c", _RESTORE_WITH_A_FILE_SIZE_LIMIT, s3_url, str(staging), flag],
        capture_output=True,
        text=True,
        timeout=120,
        cwd=Path(__file__).resolve().parents[1],
    )
    assert run.returncode == 0, run.stderr[-2000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert "step" not in out, out  # neither an older step nor a fresh start
    assert out["errno"] == 27 and "step-00000030: could not be downloaded" in out["error"]
    assert "nothing was moved aside or skipped" in out["error"]
    assert not [w for w in out["warnings"] if "falling back" in w or "moved aside" in w]
    assert steps_in(s3_url) == {10: True, 20: True, 30: True}
    assert not [p for p in client().ls(key(s3_url)) if "rejected" in p]
    assert not list(staging.iterdir())  # the partial download is gone
    # With the cause gone the same relaunch restores the newest checkpoint.
    restored = torch.nn.Linear(64, 64)
    ck = checkpointer(
        s3_url, restored, storage=FsspecStorage(s3_url, exclusive=exclusive), keep_last=5
    )
    assert ck.restore() == 30 and torch.equal(restored.weight, torch.full((64, 64), 30.0))
    ck.close(finished=False)


# -- staging directories of other processes ----------------------------------------------------
_HOLD_OWNER = """
import fcntl, os, sys
fd = os.open(sys.argv[1], os.O_RDWR)
fcntl.flock(fd, fcntl.LOCK_EX)
print("held", flush=True)
sys.stdin.read()  # until the test closes our stdin
"""


def _dead_pid() -> int:
    import subprocess
    import sys

    done = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], text=True,
                          capture_output=True, check=True)  # fmt: skip
    return int(done.stdout)


def test_another_jobs_staging_directory_survives_while_its_owner_lives(tmp_path):
    # From the attacker review: a job in another PID namespace (a container sharing /tmp) or
    # on another host (a shared staging_dir) has a pid this process cannot see, and its
    # staging directory, upload in flight, was deleted as a dead process's. Its owner's
    # lock decides now; the directory goes once that process is gone.
    import os
    import subprocess
    import sys

    from simulator.controller.lock import LOCK_FILE as OWNER
    from simulator.controller.objstore import STALE_UNOWNED_S

    staging = tmp_path / "staging"
    staging.mkdir()
    theirs = staging / f"ckptsim-upload-{_dead_pid()}-abc123"
    (theirs / checkpoint_name(7)).mkdir(parents=True)
    (theirs / checkpoint_name(7) / "model.safetensors").write_bytes(b"in flight")
    (theirs / OWNER).touch()
    owner = subprocess.Popen(
        [sys.executable, "-c", _HOLD_OWNER, str(theirs / OWNER)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    # An older ckptsim's directory (no owner file), its pid not running: kept while recent,
    # removed once older than STALE_UNOWNED_S.
    recent = staging / f"ckptsim-upload-{_dead_pid()}-recent"
    old = staging / f"ckptsim-upload-{_dead_pid()}-old"
    for d in (recent, old):
        d.mkdir()
    past = time.time() - STALE_UNOWNED_S - 60
    os.utime(old, (past, past))
    url = f"memory://ckptsim-{uuid.uuid4().hex[:8]}/run"
    try:
        assert owner.stdout.readline().strip() == "held"
        save_steps(url, [1], storage=FsspecStorage(url, staging_dir=staging))
        assert (theirs / checkpoint_name(7) / "model.safetensors").read_bytes() == b"in flight"
        assert recent.is_dir() and not old.exists()
        # Our own staging directories are gone after the save; nothing else was touched.
        assert sorted(p.name for p in staging.iterdir()) == sorted([theirs.name, recent.name])
    finally:
        owner.stdin.close()
        owner.wait(timeout=30)
    # Its owner gone (however it ended), the next save removes it.
    save_steps(url, [2], storage=FsspecStorage(url, staging_dir=staging))
    assert not theirs.exists() and recent.is_dir()
