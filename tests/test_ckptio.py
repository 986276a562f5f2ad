"""The atomic checkpoint writer on a real temporary directory, with injected faults."""

from __future__ import annotations

import errno
import json
import mmap
import os
import subprocess
import sys
import textwrap
import threading
import zlib
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from simulator import ckptio
from simulator.ckptio import (
    AsyncWriter,
    CheckpointWriteError,
    CorruptCheckpoint,
    is_complete,
    read_checkpoint,
    stage,
    verify_checkpoint,
    write_checkpoint,
)


def _state(seed: int = 0) -> dict[str, torch.Tensor]:
    g = torch.Generator().manual_seed(seed)
    bf16 = torch.randn(64, 33, generator=g).to(torch.bfloat16)
    # Bit patterns that value comparison would hide: -0.0 and a NaN payload.
    bf16.view(torch.int16)[0, :2] = torch.tensor([-32768, 0x7FC1], dtype=torch.int16)
    return {
        "model.w": torch.randn(128, 64, generator=g),
        "model.w_bf16": bf16,
        "optim.step": torch.tensor(7.0),
        "optim.exp_avg": torch.randn(128, 64, generator=g),
        "data.index": torch.arange(10, dtype=torch.int64),
        "mask": torch.rand(17, generator=g) > 0.5,
        "empty": torch.empty(0, 3),
    }


def _bits_equal(a: torch.Tensor, b: torch.Tensor) -> bool:
    if a.dtype != b.dtype or a.shape != b.shape:
        return False
    return torch.equal(a.reshape(-1).view(torch.uint8), b.reshape(-1).view(torch.uint8))


META = {"step": 7, "lr": 3e-4, "rng": {"python": [3, [1, 2, 3], None]}, "name": "run-α"}


def test_round_trip_is_bit_exact_including_bf16_nan_and_negative_zero(tmp_path):
    state = _state()
    write_checkpoint(tmp_path / "ck", state, META)
    tensors, meta = read_checkpoint(tmp_path / "ck")
    assert meta == META
    assert set(tensors) == set(state)
    for name, t in state.items():
        assert _bits_equal(tensors[name], t), name


@pytest.mark.parametrize("chunk", [None, 1000], ids=["one-slice", "many-slices"])
def test_manifest_crc_equals_crc_of_the_bytes_on_disk(tmp_path, monkeypatch, chunk):
    """The tensor file's CRC, read back from the file in one slice or many."""
    if chunk:
        monkeypatch.setattr(ckptio.layout, "READ_CHUNK", chunk)
    manifest = write_checkpoint(tmp_path / "ck", _state(), META)
    assert set(manifest["files"]) == {ckptio.TENSOR_FILE, ckptio.META_FILE}
    for name, entry in manifest["files"].items():
        data = (tmp_path / "ck" / name).read_bytes()
        assert entry["bytes"] == len(data)
        assert entry["crc32"] == zlib.crc32(data)
    assert json.loads((tmp_path / "ck" / ckptio.MANIFEST).read_text()) == manifest


def test_crc_reads_at_once_in_many_threads_each_get_their_own_buffer(tmp_path, monkeypatch):
    # The read buffers are reused across calls: two threads must never share one.
    from simulator.ckptio.layout import crc32_read

    monkeypatch.setattr(ckptio.layout, "READ_CHUNK", 4096)
    files = []
    for i in range(8):
        files.append(tmp_path / f"f{i}")
        files[-1].write_bytes(os.urandom(300_000 + i))
    got: dict[int, tuple[int, int]] = {}

    def crc(i: int) -> None:
        for _ in range(5):
            with open(files[i], "rb", buffering=0) as f:
                got[i] = crc32_read(f.fileno())

    threads = [threading.Thread(target=crc, args=(i,)) for i in range(len(files))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for i, file in enumerate(files):
        data = file.read_bytes()
        assert got[i] == (zlib.crc32(data), len(data))
    with open(files[0], "rb", buffering=0) as f:  # a size stops the read there
        assert crc32_read(f.fileno(), 5000) == (zlib.crc32(files[0].read_bytes()[:5000]), 5000)


def test_a_listed_file_that_ends_early_while_verified_is_corrupt(tmp_path, monkeypatch):
    # The size is checked when the file is opened; a file cut short after that ends the read
    # early, which the reader reports as corruption (not a wrong CRC, not a hang).
    write_checkpoint(tmp_path / "ck", _state(), META)
    monkeypatch.setattr(ckptio.layout.os, "readv", lambda fd, buffers: 0)
    with pytest.raises(CorruptCheckpoint, match=r"ended [0-9]+ bytes early"):
        verify_checkpoint(tmp_path / "ck")


@pytest.mark.parametrize("fault", ["EIO", "short"])
def test_a_failed_read_back_for_the_crc_is_a_clean_write_error(tmp_path, monkeypatch, fault):
    # The CRC thread reads the file just written; a read error there (a failing disk under a
    # page evicted meanwhile) or a file cut short fails the save like any write error.
    def readv(fd, buffers):
        if fault == "EIO":
            raise OSError(errno.EIO, os.strerror(errno.EIO))
        return 0

    write_checkpoint(tmp_path / "good", _state(), META)
    monkeypatch.setattr(ckptio.write.os, "readv", readv)
    why = "Input/output error" if fault == "EIO" else "the file ended [0-9]+ bytes early"
    with pytest.raises(CheckpointWriteError, match=f"could not write checkpoint .*bad: {why}"):
        write_checkpoint(tmp_path / "bad", _state(), META)
    assert [p.name for p in tmp_path.iterdir()] == ["good"]


def test_a_save_interrupted_while_its_crc_is_read_leaves_no_reader_on_another_file(
    tmp_path, monkeypatch
):
    # Ctrl-C while the save waits for its CRC thread closes the save's descriptor; a thread
    # still reading through that number would read, and move, the next file opened.
    import signal
    import time

    real_readv = os.readv

    def slow_readv(fd, buffers):
        time.sleep(0.02)
        return real_readv(fd, buffers)

    def interrupt(*_):
        raise KeyboardInterrupt

    monkeypatch.setattr(ckptio.layout, "READ_CHUNK", 4096)
    monkeypatch.setattr(ckptio.write.os, "readv", slow_readv)
    previous = signal.signal(signal.SIGALRM, interrupt)
    try:
        signal.setitimer(signal.ITIMER_REAL, 0.2)
        with pytest.raises(KeyboardInterrupt):
            write_checkpoint(tmp_path / "ck", _state(), META, fsync=False)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, previous)
    other = tmp_path / "other"
    other.write_bytes(bytes(1 << 20))
    fd = os.open(other, os.O_RDONLY)
    try:
        time.sleep(0.3)  # the thread goes on reading meanwhile
        assert os.lseek(fd, 0, os.SEEK_CUR) == 0
    finally:
        os.close(fd)
    assert not (tmp_path / "ck").exists()


def test_tensor_file_is_standard_safetensors(tmp_path):
    state = _state()
    write_checkpoint(tmp_path / "ck", state, META)
    loaded = load_file(tmp_path / "ck" / ckptio.TENSOR_FILE)
    assert all(_bits_equal(loaded[k], v) for k, v in state.items())


@pytest.mark.parametrize(("umask", "mode"), [(0o022, 0o644), (0o027, 0o640), (0o077, 0o600)])
def test_every_file_of_a_checkpoint_has_the_mode_the_umask_gives(tmp_path, umask, mode):
    # safetensors 0.8 writes its file as a temporary of mode 0600 and renames it: the tensors
    # were the one file of a checkpoint that the owner's group could not read.
    old = os.umask(umask)
    try:
        write_checkpoint(tmp_path / "ck", _state(), META)
    finally:
        os.umask(old)
    got = {f.name: f.stat().st_mode & 0o777 for f in (tmp_path / "ck").iterdir()}
    assert ckptio.TENSOR_FILE in got and len(got) == 3
    assert got == dict.fromkeys(got, mode)


def test_every_dtype_it_accepts_round_trips_through_the_safetensors_library_exactly(tmp_path):
    # Every dtype ckptio accepts, empty tensors, non-ASCII names, each tensor's data aligned to
    # its dtype size; and the manifest's CRC (computed from memory) is the file's.
    from safetensors import safe_open

    g = torch.Generator().manual_seed(3)
    bits = torch.randint(0, 256, (4096,), dtype=torch.uint8, generator=g)
    state = {
        f"{dtype}-ü": bits[: 24 * dtype.itemsize].view(dtype).reshape(2, 3, 4)
        for dtype in ckptio.layout.TORCH_DTYPES
    }
    state |= {"empty": torch.empty(0, 5), "scalar": torch.tensor(2.5, dtype=torch.float64)}
    write_checkpoint(tmp_path / "ck", state, {})
    file = tmp_path / "ck" / ckptio.TENSOR_FILE
    with safe_open(file, framework="pt") as f:
        assert f.metadata() == {"format": "pt"}
        assert set(f.keys()) == set(state)
        for name, t in state.items():
            assert _bits_equal(f.get_tensor(name), t), name
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    assert n % 8 == 0
    header = json.loads(raw[8 : 8 + n])
    for name, t in state.items():
        assert header[name]["data_offsets"][0] % t.element_size() == 0, name
    manifest = json.loads((tmp_path / "ck" / ckptio.MANIFEST).read_text())
    assert manifest["files"][ckptio.TENSOR_FILE]["crc32"] == zlib.crc32(raw)


def test_dtypes_and_names_no_safetensors_file_holds_are_refused_before_touching_disk(tmp_path):
    with pytest.raises(TypeError, match="complex64, which a safetensors file cannot hold"):
        write_checkpoint(tmp_path / "a", {"z": torch.zeros(2, dtype=torch.complex64)}, {})
    with pytest.raises(ValueError, match="not allowed"):
        write_checkpoint(tmp_path / "b", {"bad\udc80": torch.zeros(2)}, {})
    assert list(tmp_path.iterdir()) == []


def test_tied_and_noncontiguous_tensors_are_saved(tmp_path):
    w = torch.randn(8, 4)
    state = {"embed": w, "lm_head": w, "transposed": w.t(), "half": w[:4]}
    state |= {  # what a model's parameters and a step's tensors are, as users pass them
        "param": torch.nn.Parameter(torch.randn(3)),
        "frozen": torch.nn.Parameter(torch.randn(2), requires_grad=False),
        "in_graph": (torch.randn(2, 3, requires_grad=True) * 2).t(),  # converted in a graph
    }
    write_checkpoint(tmp_path / "ck", state, {})
    tensors, _ = read_checkpoint(tmp_path / "ck")
    for name, t in state.items():
        assert torch.equal(tensors[name], t), name


@pytest.mark.parametrize(
    ("damage", "reason"),
    [
        ("truncate", "truncated"),
        ("flip", "CRC-32"),
        ("no_manifest", "missing"),
        ("meta_edit", "CRC-32"),
        ("drop_tensor_file", "missing"),
    ],
)
def test_verify_detects_planted_corruption(tmp_path, damage, reason):
    ck = tmp_path / "ck"
    write_checkpoint(ck, _state(), META)
    tensor_file = ck / ckptio.TENSOR_FILE
    if damage == "truncate":
        os.truncate(tensor_file, tensor_file.stat().st_size - 5)
    elif damage == "flip":
        data = bytearray(tensor_file.read_bytes())
        data[len(data) // 2] ^= 0x01
        tensor_file.write_bytes(bytes(data))
    elif damage == "no_manifest":
        (ck / ckptio.MANIFEST).unlink()
    elif damage == "meta_edit":
        text = (ck / ckptio.META_FILE).read_text().replace('"step": 7', '"step": 8')
        (ck / ckptio.META_FILE).write_text(text)
    else:
        tensor_file.unlink()
    with pytest.raises(CorruptCheckpoint, match=reason) as info:
        verify_checkpoint(ck)
    assert "\n" not in str(info.value)
    with pytest.raises(CorruptCheckpoint):
        read_checkpoint(ck)


def test_is_complete_uses_sizes_only_and_rejects_incomplete_dirs(tmp_path):
    ck = tmp_path / "ck"
    write_checkpoint(ck, _state(), META)
    assert is_complete(ck)
    os.truncate(ck / ckptio.META_FILE, 3)
    assert not is_complete(ck)
    assert not is_complete(tmp_path / "nothing-here")


def test_crash_before_rename_leaves_only_a_temp_dir_never_taken_for_a_checkpoint(tmp_path):
    # A separate process dies hard (no cleanup handlers) exactly where the rename would be.
    script = textwrap.dedent(
        f"""
        import os, torch
        from simulator import ckptio
        os.rename = lambda *a: os._exit(9)
        ckptio.write_checkpoint({str(tmp_path / "ck")!r}, {{"w": torch.ones(4)}}, {{"a": 1}})
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True)
    assert proc.returncode == 9, proc.stderr.decode()
    assert not (tmp_path / "ck").exists()
    (leftover,) = list(tmp_path.iterdir())
    assert (leftover / ckptio.MANIFEST).is_file()  # everything but the rename happened
    assert ckptio.is_temp_dir(leftover)
    assert not is_complete(leftover)
    with pytest.raises(CorruptCheckpoint, match="unfinished"):
        verify_checkpoint(leftover)
    assert ckptio.remove_stale_temps(tmp_path) == [leftover]
    assert list(tmp_path.iterdir()) == []


def _assert_clean_failure(parent: Path, good: Path) -> None:
    assert sorted(p.name for p in parent.iterdir()) == [good.name]
    verify_checkpoint(good)


def test_failed_fsync_never_replaces_last_good(tmp_path, monkeypatch):
    good = tmp_path / "step-1"
    write_checkpoint(good, _state(1), {"step": 1})

    def full(fd):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(os, "fsync", full)
    with pytest.raises(CheckpointWriteError, match="No space left") as info:
        write_checkpoint(tmp_path / "step-2", _state(2), {"step": 2})
    assert info.value.errno == errno.ENOSPC
    monkeypatch.undo()
    _assert_clean_failure(tmp_path, good)


def test_short_then_failing_os_write_leaves_no_partial_checkpoint(tmp_path, monkeypatch):
    good = tmp_path / "step-1"
    write_checkpoint(good, _state(1), {"step": 1})
    real_write = os.write
    calls = []

    def flaky(fd, data):
        calls.append(len(data))
        if len(calls) == 1:
            return real_write(fd, bytes(data)[:3])  # a short write must be continued
        raise OSError(errno.EIO, "Input/output error")

    monkeypatch.setattr(os, "write", flaky)
    with pytest.raises(CheckpointWriteError, match="Input/output error"):
        write_checkpoint(tmp_path / "step-2", _state(2), {"step": 2, "pad": "x" * 50})
    monkeypatch.undo()
    assert len(calls) == 2
    _assert_clean_failure(tmp_path, good)


def test_real_file_size_limit_mid_tensor_write_is_a_clean_error(tmp_path):
    # RLIMIT_FSIZE makes the kernel refuse writes past 64 KiB (EFBIG), inside the safetensors
    # library's own writer: a real write error, not a patched Python function.
    script = textwrap.dedent(
        f"""
        import resource, signal, sys, torch
        from simulator import ckptio
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)
        resource.setrlimit(resource.RLIMIT_FSIZE, (65536, 65536))
        try:
            ckptio.write_checkpoint({str(tmp_path / "ck")!r}, {{"w": torch.ones(1 << 16)}}, {{}})
        except ckptio.CheckpointWriteError as exc:
            print("ERR", exc)
            sys.exit(3)
        """
    )
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "could not write checkpoint" in proc.stdout
    assert list(tmp_path.iterdir()) == []


def test_the_tensor_file_is_byte_for_byte_what_safetensors_save_file_writes(tmp_path):
    # The save hands the library's serializer each tensor's address itself (save_file's
    # checks and numpy wrapping cost 5.9 ms at 353 tensors, reports/save-overhead.md):
    # the file must be exactly the library's own, for every dtype a checkpoint holds, empty
    # and 0-d tensors, tied weights made separate, and views that start inside their storage
    # or are not contiguous (an address that ignored the view's offset would pass otherwise).
    from safetensors.torch import save_file

    from simulator.ckptio.layout import TORCH_DTYPES

    gen = torch.Generator().manual_seed(3)
    bits = torch.randint(0, 256, (6 * 8 * 4,), dtype=torch.uint8, generator=gen)
    tensors = {
        f"t_{str(d).removeprefix('torch.')}": bits[: 6 * d.itemsize].view(d).reshape(3, -1)
        for d in TORCH_DTYPES
        if d != torch.bool
    }
    tensors["t_bool"] = bits[:6].reshape(3, 2) > 127
    emb = torch.randn(5, 4, generator=gen)
    row = torch.randn(6, 7, generator=gen)
    tensors |= {"empty": torch.empty(0, 3), "scalar": torch.tensor(2.5), "emb": emb, "out": emb}
    tensors |= {"tail": torch.arange(10.0)[3:], "row": row[2], "t": row.t(), "col": row[:, 1]}
    write_checkpoint(tmp_path / "ck", tensors, {})
    separate = {k: v.contiguous().clone() for k, v in tensors.items()}  # as save_file needs
    save_file(separate, tmp_path / "library.safetensors", metadata={"format": "pt"})
    ours = (tmp_path / "ck" / ckptio.TENSOR_FILE).read_bytes()
    assert ours == (tmp_path / "library.safetensors").read_bytes()
    loaded = read_checkpoint(tmp_path / "ck")[0]
    assert loaded.keys() == separate.keys() and loaded["scalar"].item() == 2.5
    assert all(
        torch.equal(loaded[k].view(torch.uint8), v.view(torch.uint8))  # bits, fp8 included
        for k, v in separate.items()
        if v.dim()  # a 0-d tensor has no byte view
    )


class _Wrapped(torch.Tensor):
    """A tensor subclass, as a DTensor is one: no plain memory of its own to hand over."""


def _emptied() -> torch.Tensor:
    t = torch.ones(4)
    t.untyped_storage().resize_(0)  # what FSDP does to a freed parameter's storage
    return t


@pytest.mark.parametrize(
    "bad, why",
    [
        (lambda: torch.ones(3).as_subclass(_Wrapped), "not a plain torch.Tensor"),
        (lambda: torch.ones(3, device="meta"), "on the meta device"),
        (_emptied, "0 bytes of storage for 16 bytes"),
    ],
    ids=["subclass", "meta", "storage-resized-to-0"],
)
def test_a_tensor_without_plain_memory_is_refused_before_anything_is_written(tmp_path, bad, why):
    # The serializer reads each tensor at the address it is given: a subclass whose address is
    # 0 (a DTensor) crashed the process with SIGSEGV, and an emptied storage was read past.
    with pytest.raises((TypeError, ValueError), match=why):
        write_checkpoint(tmp_path / "ck", {"w": torch.ones(2), "bad": bad()}, {})
    assert list(tmp_path.iterdir()) == []


def test_a_dtensor_is_refused_with_what_to_save_instead(tmp_path):
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, distribute_tensor

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        mesh = init_device_mesh("cpu", (1,))
        shard = distribute_tensor(torch.ones(4), mesh, [Replicate()])
        with pytest.raises(TypeError, match=r"DTensor.*full_tensor\(\) or t\.to_local\(\)"):
            write_checkpoint(tmp_path / "ck", {"w": shard}, {})
        assert list(tmp_path.iterdir()) == []
        write_checkpoint(tmp_path / "ok", {"w": shard.full_tensor()}, {})
        assert torch.equal(read_checkpoint(tmp_path / "ok")[0]["w"], torch.ones(4))
    finally:
        dist.destroy_process_group()


def test_a_negated_view_is_saved_as_its_values(tmp_path):
    write_checkpoint(tmp_path / "ck", {"w": torch.arange(3.0)._neg_view()}, {})
    assert torch.equal(read_checkpoint(tmp_path / "ck")[0]["w"], -torch.arange(3.0))


def test_interrupt_during_write_removes_the_temp_dir(tmp_path, monkeypatch):
    real_save = ckptio.write.serialize_file

    def interrupted(specs, file, **kw):  # Ctrl-C once the tensor file is on disk
        real_save(specs, file, **kw)
        raise KeyboardInterrupt

    monkeypatch.setattr(ckptio.write, "serialize_file", interrupted)
    with pytest.raises(KeyboardInterrupt):
        write_checkpoint(tmp_path / "ck", _state(), META)
    assert list(tmp_path.iterdir()) == []


def test_bad_inputs_are_refused_before_touching_disk(tmp_path):
    with pytest.raises(TypeError, match="not plain JSON"):
        write_checkpoint(tmp_path / "a", {"w": torch.ones(2)}, {"t": torch.ones(1)})
    with pytest.raises(TypeError, match=r"not a torch\.Tensor"):
        write_checkpoint(tmp_path / "b", {"w": [1.0]}, {})
    write_checkpoint(tmp_path / "c", {"w": torch.ones(2)}, {})
    with pytest.raises(FileExistsError):
        write_checkpoint(tmp_path / "c", {"w": torch.zeros(2)}, {})
    assert sorted(p.name for p in tmp_path.iterdir()) == ["c"]
    assert torch.equal(read_checkpoint(tmp_path / "c")[0]["w"], torch.ones(2))


def test_stage_returns_independent_contiguous_cpu_copies():
    src = {"a": torch.randn(6, 4).t(), "b": torch.arange(5)}
    staged = stage(src)
    expected = {k: v.clone() for k, v in src.items()}
    src["a"].mul_(0)
    src["b"].add_(1)
    for k, v in staged.items():
        assert v.is_contiguous() and v.device.type == "cpu"
        assert torch.equal(v, expected[k])


def test_async_writer_writes_in_order_and_reports_manifest(tmp_path):
    with AsyncWriter() as writer:
        assert writer.wait() is None
        writer.submit(tmp_path / "s1", stage(_state(1)), {"step": 1})
        writer.submit(tmp_path / "s2", stage(_state(2)), {"step": 2})  # waits for s1
        assert is_complete(tmp_path / "s1")
        manifest = writer.wait()
        assert not writer.in_flight
    assert manifest == json.loads((tmp_path / "s2" / ckptio.MANIFEST).read_text())
    assert read_checkpoint(tmp_path / "s2")[1] == {"step": 2}


def test_async_write_error_surfaces_once_on_next_call(tmp_path, monkeypatch):
    writer = AsyncWriter()

    def full(*a, **k):
        raise OSError(errno.ENOSPC, "No space left on device")

    monkeypatch.setattr(ckptio.write, "serialize_file", full)
    writer.submit(tmp_path / "s1", stage(_state()), {})
    with pytest.raises(CheckpointWriteError, match="No space left"):
        writer.submit(tmp_path / "s2", stage(_state()), {})
    monkeypatch.undo()
    writer.submit(tmp_path / "s3", stage(_state()), {"ok": True})
    writer.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["s3"]
    verify_checkpoint(tmp_path / "s3")
    with pytest.raises(RuntimeError, match="closed"):
        writer.submit(tmp_path / "s4", {}, {})


def test_stage_reuses_matching_buffers_and_replaces_mismatched_ones():
    first = stage({"a": torch.ones(3), "b": torch.ones(2)})
    again = stage({"a": torch.full((3,), 2.0), "b": torch.ones(4)}, out=first)
    assert again["a"].data_ptr() == first["a"].data_ptr()
    assert torch.equal(again["a"], torch.full((3,), 2.0))
    assert again["b"].shape == (4,) and again["b"].data_ptr() != first["b"].data_ptr()


def test_read_tensors_live_in_process_memory_not_a_file_mapping(tmp_path):
    write_checkpoint(tmp_path / "ck", {"w": torch.arange(1 << 16, dtype=torch.float32)}, {})
    tensors, _ = read_checkpoint(tmp_path / "ck")
    with open("/proc/self/maps") as maps:
        assert str(tmp_path / "ck") not in maps.read()
    assert torch.equal(tensors["w"], torch.arange(1 << 16, dtype=torch.float32))


def _rchar() -> int:
    with open("/proc/self/io") as io:
        return next(int(line.split()[1]) for line in io if line.startswith("rchar:"))


@pytest.mark.skipif(not os.path.exists("/proc/self/io"), reason="needs Linux /proc/self/io")
def test_a_verified_restore_reads_the_tensor_file_once_in_plain_reads_not_page_faults(tmp_path):
    # A cold mmap'ed file is read by 4 KiB page faults (invisible to rchar) at a fraction of
    # the disk's speed; the restore must read it in large read() calls, once, CRC included.
    big = torch.randn(4 << 20, generator=torch.Generator().manual_seed(1))
    write_checkpoint(tmp_path / "ck", {"w": big, "b": torch.arange(7)}, {})
    size = (tmp_path / "ck" / ckptio.TENSOR_FILE).stat().st_size
    before = _rchar()
    tensors, _ = read_checkpoint(tmp_path / "ck", verify=True)
    read = _rchar() - before
    assert size <= read < 1.1 * size
    assert torch.equal(tensors["w"], big) and torch.equal(tensors["b"], torch.arange(7))
    assert tensors["w"].untyped_storage().data_ptr() != tensors["b"].untyped_storage().data_ptr()


def test_io_groups_cover_every_buffer_in_order_in_read_chunk_scatter_reads():
    from simulator.ckptio.layout import IOV_MAX, READ_CHUNK, io_groups

    sizes = [5, (64 << 20) + 3, 1 << 20, 0, 130 << 20, *([7] * 3000)]
    views = [memoryview(bytearray(n)) for n in sizes if n]
    groups = io_groups(views)
    assert all(0 < sum(map(len, g)) <= READ_CHUNK and 0 < len(g) <= IOV_MAX for g in groups)
    assert all(sum(map(len, g)) == READ_CHUNK or len(g) == IOV_MAX for g in groups[:-1])
    # Concatenated, the pieces are exactly the buffers, each whole and in order.
    pieces = [piece for g in groups for piece in g]
    for view in views:
        at = 0
        while at < len(view):
            piece = pieces.pop(0)
            assert piece.obj is view.obj and len(piece) <= len(view) - at
            at += len(piece)
    assert pieces == []


def test_a_restore_continues_after_short_reads(tmp_path, monkeypatch):
    state = {"w": torch.randn(3 << 18), "b": torch.arange(9), "e": torch.empty(0)}
    write_checkpoint(tmp_path / "ck", state, {"x": 1})
    real = os.readv
    calls = []

    def short(fd, buffers):  # at most 100,000 bytes a call, as a slow pipe might give
        calls.append(len(buffers))
        budget, parts = 100_000, []
        for view in buffers:
            parts.append(view[: min(budget, len(view))])
            budget -= len(parts[-1])
            if not budget:
                break
        return real(fd, parts)

    monkeypatch.setattr(os, "readv", short)
    tensors, meta = read_checkpoint(tmp_path / "ck")
    assert len(calls) > 30 and meta == {"x": 1}
    assert all(_bits_equal(tensors[k], v) for k, v in state.items())


def _minor_faults() -> int:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


@pytest.mark.skipif(not ckptio.syscalls.HAVE_POPULATE, reason="needs Linux madvise")
def test_prefaulter_maps_fresh_pages_ahead_of_the_reader_and_never_changes_a_byte():
    from simulator.ckptio.prefault import Prefaulter

    kept = torch.arange(1 << 20, dtype=torch.float32)  # 4 MiB of values that must survive
    expected = kept.clone()
    # A mapping of its own, no page touched (torch.empty may get pages another test touched).
    fresh = torch.frombuffer(mmap.mmap(-1, 48 << 20), dtype=torch.uint8)
    with Prefaulter([kept, fresh]) as prefault:
        prefault.ready(kept.nbytes + fresh.nbytes)  # the reader's wait: every page mapped
        # The pages of ``kept`` were mapped already (mincore): left out, only fresh's mapped.
        assert fresh.nbytes <= prefault.populated_bytes <= fresh.nbytes + 2 * 4096
    before = _minor_faults()
    fresh.fill_(7)  # 12,288 pages: each would fault here had the thread not mapped it
    assert _minor_faults() - before < 64
    assert torch.equal(kept, expected)


@pytest.mark.skipif(not ckptio.syscalls.HAVE_POPULATE, reason="needs Linux madvise")
def test_a_restore_into_memory_mapped_already_starts_no_prefault_thread(monkeypatch):
    from simulator.ckptio import prefault

    recycled = torch.ones(8 << 20, dtype=torch.uint8)  # every page touched: nothing to map
    started, start = [], prefault.threading.Thread.start

    def counted(thread):
        started.append(thread.name)
        start(thread)

    monkeypatch.setattr(prefault.threading.Thread, "start", counted)
    with prefault.Prefaulter([recycled]) as p:
        p.ready(recycled.nbytes)  # returns at once: no thread to wait for
    assert started == [] and p.populated_bytes == 0


def _await(condition, seconds: float = 10.0) -> bool:
    import time

    deadline = time.monotonic() + seconds
    while not condition() and time.monotonic() < deadline:
        time.sleep(0.001)
    return condition()


@pytest.mark.skipif(not hasattr(os, "posix_fadvise"), reason="needs posix_fadvise")
def test_readahead_asks_for_the_file_in_order_ahead_of_the_reader_and_no_further(
    tmp_path, monkeypatch
):
    from simulator.ckptio.readahead import Readahead

    size, ahead, step = 100 << 20, 24 << 20, 5 << 20
    asked, fds = [], set()  # (offset, bytes, the reader's position when asked)
    reader = os.open(tmp_path / "f", os.O_RDWR | os.O_CREAT)
    ra = Readahead(reader, size, ahead=ahead, step=step)

    def fadvise(fd, offset, nbytes, advice):
        assert advice == os.POSIX_FADV_WILLNEED
        fds.add(fd)
        asked.append((offset, nbytes, ra._pos))

    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    with ra:
        # Before the reader moves, the thread asks for the lead and waits.
        assert _await(lambda: ra.asked_bytes >= ahead)
        assert not _await(lambda: ra.asked_bytes > ahead + step, 0.05)
        for pos in range(0, size + 1, 4 << 20):
            ra.at(pos)
        ra.at(size)
        assert _await(lambda: ra.asked_bytes == size)
    # The whole file, once, in order, in steps; never a byte past the reader's lead.
    assert [a[0] for a in asked] == list(range(0, size, step))
    assert sum(a[1] for a in asked) == size and asked[-1][0] + asked[-1][1] == size
    assert all(offset < pos + ahead for offset, _, pos in asked)
    assert not any(t.name == "ckptio-readahead" for t in threading.enumerate())
    # The thread used a duplicate of the reader's descriptor, closed when it ended: a file
    # that reuses the reader's number after it is closed is never touched.
    (dup,) = fds
    assert dup != reader
    with pytest.raises(OSError):
        os.fstat(dup)
    os.close(reader)


def test_a_restore_goes_on_where_no_helper_thread_can_start(tmp_path, monkeypatch):
    # Neither the readahead nor the prefault thread (the class is threading's own: both) is
    # worth failing a valid checkpoint's read for.
    from simulator.ckptio import readahead

    state = {"w": torch.randn(3 << 18), "b": torch.arange(9)}
    write_checkpoint(tmp_path / "ck", state, {})

    def cannot(thread):
        raise RuntimeError("can't start new thread")

    monkeypatch.setattr(readahead.threading.Thread, "start", cannot)
    fds = len(os.listdir("/proc/self/fd")) if os.path.isdir("/proc/self/fd") else None
    tensors, _ = read_checkpoint(tmp_path / "ck")
    assert all(_bits_equal(tensors[k], v) for k, v in state.items())
    if fds is not None:
        assert len(os.listdir("/proc/self/fd")) == fds  # the duplicate was closed


def test_a_restore_asks_for_its_tensor_file_ahead_and_goes_on_where_the_hint_fails(
    tmp_path, monkeypatch
):
    state = {"w": torch.randn(9 << 20), "b": torch.randn(3 << 18)}  # 36 MB + 3 MB
    write_checkpoint(tmp_path / "ck", state, {"x": 1})
    size = (tmp_path / "ck" / ckptio.TENSOR_FILE).stat().st_size
    real, asked = os.posix_fadvise, []

    def fadvise(fd, offset, nbytes, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((offset, nbytes))
        return real(fd, offset, nbytes, advice)

    def slow_readv(fd, buffers):  # a slow disk: the thread surely runs while the reader reads
        import time

        time.sleep(0.02)
        return real_readv(fd, buffers)

    real_readv = os.readv
    monkeypatch.setattr(os, "readv", slow_readv)
    monkeypatch.setattr(os, "posix_fadvise", fadvise)
    tensors, _ = read_checkpoint(tmp_path / "ck")
    assert all(_bits_equal(tensors[k], v) for k, v in state.items())
    # The file (39 MB) lies within the thread's first lead: all of it is asked for while the
    # slowed reader reads, in order, nothing past its end. (The lead itself is checked by
    # the Readahead test above.)
    assert [a[0] for a in asked] == list(range(0, size, 16 << 20))
    assert asked[-1][0] + asked[-1][1] == size

    def refuses(fd, offset, nbytes, advice):
        if advice == os.POSIX_FADV_WILLNEED:
            asked.append((offset, nbytes))
            raise OSError(errno.EINVAL, "no hints here")
        return real(fd, offset, nbytes, advice)

    asked.clear()
    monkeypatch.setattr(os, "posix_fadvise", refuses)
    tensors, _ = read_checkpoint(tmp_path / "ck")  # the hint is never needed
    assert all(_bits_equal(tensors[k], v) for k, v in state.items())
    assert asked == [(0, 16 << 20)]  # the thread stopped at the first refusal


def test_a_corrupt_large_file_is_refused_and_leaves_no_thread_behind(tmp_path):
    big = {"w": torch.randn(6 << 20), "b": torch.randn(3 << 18)}  # 24 MB + 3 MB
    write_checkpoint(tmp_path / "ck", big, {})
    file = tmp_path / "ck" / ckptio.TENSOR_FILE
    with open(file, "r+b") as f:
        f.seek(20 << 20)
        byte = f.read(1)
        f.seek(20 << 20)
        f.write(bytes([byte[0] ^ 0x10]))
    threads = threading.active_count()
    with pytest.raises(CorruptCheckpoint, match="CRC-32"):
        read_checkpoint(tmp_path / "ck")
    assert threading.active_count() == threads


def test_tensors_that_overlap_in_a_resealed_file_are_refused(tmp_path):
    write_checkpoint(tmp_path / "ck", {"a": torch.ones(4), "b": torch.zeros(4)}, {})
    file = tmp_path / "ck" / ckptio.TENSOR_FILE
    raw = file.read_bytes()
    n = int.from_bytes(raw[:8], "little")
    header = json.loads(raw[8 : 8 + n])
    header["b"]["data_offsets"] = header["a"]["data_offsets"]  # b aliases a's bytes
    text = json.dumps(header, separators=(",", ":")).encode().ljust(n)
    file.write_bytes(raw[:8] + text + raw[8 + n :])
    manifest_file = tmp_path / "ck" / ckptio.MANIFEST
    manifest = json.loads(manifest_file.read_text())
    manifest["files"][ckptio.TENSOR_FILE]["crc32"] = zlib.crc32(file.read_bytes())
    manifest_file.write_text(json.dumps(manifest))
    with pytest.raises(CorruptCheckpoint, match="no gap or overlap"):
        read_checkpoint(tmp_path / "ck")


def test_a_read_into_live_tensors_fills_those_that_fit_in_place_and_no_other(tmp_path):
    state = _state(1)
    write_checkpoint(tmp_path / "ck", state, META)
    live = {k: torch.zeros_like(v) for k, v in state.items()}
    wide = torch.zeros(128, 128)
    into = (
        dict(live)
        | {
            "model.w_bf16": torch.zeros(64, 33),  # another dtype
            "optim.exp_avg": torch.zeros(64, 128),  # another shape, the same bytes
            "data.index": torch.zeros(20, dtype=torch.int64)[::2],  # not contiguous
            "model.w": wide[:, :64].T.contiguous().T,  # a transposed copy: not contiguous either
        }
    )
    kept = {k: v.clone() for k, v in into.items()}
    tensors, meta = read_checkpoint(tmp_path / "ck", verify=True, into=into)
    assert meta == META and set(tensors) == set(state)
    assert all(_bits_equal(tensors[k], state[k]) for k in state)
    filled = {k for k in state if tensors[k] is into[k]}
    assert filled == {"optim.step", "mask"}  # the empty tensor has no bytes to fill
    for name in set(into) - filled:
        assert _bits_equal(into[name].contiguous(), kept[name]), name  # left as it was


def test_a_read_into_views_that_share_bytes_fills_none_of_them(tmp_path):
    # Two views of one buffer, overlapping: filling one would write into the other.
    state = {"a": torch.arange(6.0), "b": torch.arange(6.0) + 10, "c": torch.arange(3.0) + 20}
    write_checkpoint(tmp_path / "ck", state, {})
    buffer, apart = torch.zeros(9), torch.zeros(3)
    into = {"a": buffer[0:6], "b": buffer[3:9], "c": apart}
    tensors, _ = read_checkpoint(tmp_path / "ck", into=into)
    assert torch.equal(buffer, torch.zeros(9))
    assert tensors["c"] is apart and torch.equal(apart, state["c"])
    assert all(torch.equal(tensors[k], state[k]) for k in state)


def test_a_read_into_live_tensors_maps_no_fresh_memory_for_them(tmp_path):
    # The reason for reading in place: memory the process holds needs no page mapped.
    big = {"w": torch.randn(4096, 1024), "m": torch.randn(4096, 1024)}  # 2 x 16 MB
    write_checkpoint(tmp_path / "ck", big, {})
    live = {k: torch.zeros_like(v) for k, v in big.items()}
    before = _minor_faults()
    tensors, _ = read_checkpoint(tmp_path / "ck", verify=True, into=live)
    faults = _minor_faults() - before
    assert all(tensors[k] is live[k] and torch.equal(live[k], big[k]) for k in big)
    assert faults < 1000  # a fresh 32 MB would map 8,192 pages
