"""Writing a checkpoint: temp sibling dir, safetensors + JSON, CRC-32 manifest, atomic rename."""

from __future__ import annotations

import errno
import json
import os
import re
import secrets
import shutil
import sys
import threading
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, TensorSpec, serialize_file

from simulator.ckptio.layout import (
    _TEMP_MARK,
    FORMAT,
    MANIFEST,
    META_FILE,
    TENSOR_FILE,
    TORCH_DTYPES,
    VERSION,
    CheckpointWriteError,
    crc32,
    crc32_read,
    fsync_dir,
)


def write_checkpoint(
    path: str | os.PathLike,
    tensors: dict[str, torch.Tensor],
    meta: dict[str, Any],
    *,
    fsync: bool = True,
) -> dict[str, Any]:
    """Write a complete checkpoint at ``path`` atomically and return its manifest.

    ``path`` must not exist yet. On any failure (including KeyboardInterrupt) the temporary
    directory is removed and ``path`` is left absent; OS errors surface as
    :class:`CheckpointWriteError` naming the path and the cause.
    """
    path = Path(path)
    tensors = _checked_tensors(tensors)
    meta_bytes = _meta_bytes(meta)
    if path.exists():
        raise FileExistsError(f"checkpoint path {path} already exists")
    parent = path.parent
    if not parent.is_dir():
        raise FileNotFoundError(f"checkpoint parent directory {parent} does not exist")
    tmp = parent / f".{path.name}{_TEMP_MARK}{os.getpid()}-{secrets.token_hex(4)}"
    try:
        os.mkdir(tmp)
        files = {
            TENSOR_FILE: _write_tensor_file(tmp / TENSOR_FILE, tensors, fsync=fsync),
            META_FILE: _write_bytes(tmp / META_FILE, meta_bytes, fsync=fsync),
        }
        manifest = {
            "format": FORMAT,
            "version": VERSION,
            "checksum": "crc32",
            "files": files,
            "tensors": len(tensors),
            "bytes": sum(f["bytes"] for f in files.values()),
        }
        _write_bytes(tmp / MANIFEST, json.dumps(manifest, indent=1).encode(), fsync=fsync)
        if fsync:
            fsync_dir(tmp)
        os.rename(tmp, path)
        if fsync:
            fsync_dir(parent)
    except OSError as exc:
        shutil.rmtree(tmp, ignore_errors=True)
        if isinstance(exc, FileExistsError | CheckpointWriteError):
            raise
        raise CheckpointWriteError(
            exc.errno, f"could not write checkpoint {path}: {exc.strerror or exc}"
        ) from exc
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    return manifest


def _checked_tensors(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Dense contiguous CPU tensors whose memory holds their bytes, aliases of the same bytes
    made separate (safetensors refuses tensors that overlap in memory, e.g. tied embedding and
    output weights).

    The serializer is handed each tensor's address (:func:`_spec`), so whatever has no plain
    memory of its own is refused here with a one-line error before anything is written: a
    tensor subclass (a ``DTensor``, whose address is 0: save it with ``.full_tensor()`` or
    ``.to_local()``, or with a distributed backend), a tensor on the meta device, one whose
    storage is smaller than the tensor (``resize_(0)``'d). Lazy negated or conjugated views
    are resolved into their values."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> torch.Tensor, got {type(tensors)}")
    if sys.byteorder != "little":  # the format is little-endian; the specs pass memory as is
        raise ValueError("ckptio writes safetensors files on little-endian machines only")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__" or not _utf8(name):
            raise ValueError(
                f"tensor name {name!r} is not allowed (a str in UTF-8, not '__metadata__')"
            )
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in TORCH_DTYPES:
            raise TypeError(
                f"tensor {name!r} has dtype {t.dtype}, which a safetensors file cannot hold "
                f"(it holds {', '.join(str(d) for d in TORCH_DTYPES)})"
            )
        # Each conversion only where it is needed: a state's hundreds of tensors are almost
        # all plain, dense, contiguous CPU tensors already, and each call costs ~0.2-0.5 us.
        if type(t) is not torch.Tensor:  # a Parameter (or another subclass): its plain data
            t = t.detach()
        if type(t) is not torch.Tensor:
            raise TypeError(
                f"tensor {name!r} is a {type(t).__name__}, not a plain torch.Tensor (a "
                "DTensor: save t.full_tensor() or t.to_local(), or use a distributed backend)"
            )
        if t.is_meta:
            raise ValueError(f"tensor {name!r} is on the meta device: it holds no data to save")
        if t.layout != torch.strided:
            t = t.to_dense()
        if not t.is_cpu:
            t = t.cpu()
        if t.is_neg():
            t = t.resolve_neg()
        if t.is_conj():
            t = t.resolve_conj()
        if not t.is_contiguous():
            t = t.contiguous()
        needed = (t.storage_offset() + t.numel()) * t.element_size()
        if t.numel() and (t.data_ptr() == 0 or t.untyped_storage().nbytes() < needed):
            raise ValueError(
                f"tensor {name!r} has {t.untyped_storage().nbytes()} bytes of storage for "
                f"{needed} bytes of data (was its storage resized?)"
            )
        out[name] = t
    return _separate_overlaps(out)


def _utf8(name: str) -> bool:
    try:
        name.encode()
    except UnicodeEncodeError:  # a lone surrogate: no safetensors header can hold it
        return False
    return True


def _separate_overlaps(tensors: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    spans = sorted(
        (t.data_ptr(), t.data_ptr() + t.numel() * t.element_size(), name)
        for name, t in tensors.items()
        if t.numel() > 0
    )
    last_stop = -1
    for start, stop, name in spans:
        if start < last_stop:
            tensors[name] = tensors[name].clone()
        else:
            last_stop = stop
    return tensors


def _meta_bytes(meta: dict[str, Any]) -> bytes:
    if not isinstance(meta, dict):
        raise TypeError(f"meta must be a JSON-serialisable dict, got {type(meta)}")
    try:
        return json.dumps(meta).encode()
    except (TypeError, ValueError) as exc:
        raise TypeError(f"meta is not plain JSON: {exc}") from exc


def _write_tensor_file(file: Path, tensors: dict[str, torch.Tensor], *, fsync: bool) -> dict:
    """Write the tensors with the safetensors library (straight from their memory, no copy)
    and return the file's size and CRC-32.

    The library's serializer is handed each tensor's address and length
    (``safetensors.serialize_file`` with a ``TensorSpec`` per tensor): the tensors are dense,
    contiguous, CPU-resident and non-overlapping already (:func:`_checked_tensors`), and
    ``safetensors.torch.save_file``, which checks the same and then wraps every tensor in a
    numpy array to learn its address, took 5.9 ms checking and wrapping a 290 MB GPT state's
    353 tensors, against 0.7 ms for the specs, of a ~200 ms save
    (``reports/save-overhead.md``). The tensors stay referenced by ``tensors`` until the call
    returns.

    The CRC-32 is computed in a thread from the file just written, read back from the page
    cache (:func:`_crc_while_flushing`), while the file is flushed to the device: the value a
    read of the file gives, without a second pass over the disk and without per-tensor work
    in Python. (It was computed from the tensors' memory in the order of the file's header,
    read back for that: the same bytes, with ~3 ms more of Python for a 290 MB state's 353
    tensors, timed ad hoc. Taken from the tensors' memory by a thread during the write instead,
    put together in the file's order with ``crc32_combine``, it gained nothing out of the
    noise: ``reports/save-crc.md``, commit 0039c9d, where neither way cost a 290 MB save a
    time that stood out against no CRC.) The checksum vouches for the file's bytes as
    written: a tensor changed by another thread while the file was written (a misuse: the
    save reads the live tensors; an async save reads its own staged copies) leaves a torn
    checkpoint whose CRC matches, where a CRC taken from memory after the write caught it at
    restore when the change fell between the two reads. A hand-written writer, gather writes
    with the write-back started behind each 64 MB, was tried and dropped: on this project's
    machines it was no faster once the write-back was left out, and with it a save now and
    then stalled for 3-5x as long.
    """
    specs = {name: _spec(t) for name, t in tensors.items()}
    try:
        serialize_file(specs, file, metadata={"format": "pt"})
    except SafetensorError as exc:
        # The library's Rust writer reports I/O failures as text ("... (os error 28)").
        found = re.search(r"os error (\d+)", str(exc))
        code = int(found.group(1)) if found else errno.EIO
        raise OSError(code, os.strerror(code) if found else str(exc)) from exc
    # The library writes a temporary file of mode 0600 and renames it (safetensors 0.8): the
    # tensors would be the one file of a checkpoint that the owner's group, an evaluation job
    # under another account, cannot read. It gets the mode of the checkpoint's other files.
    os.chmod(file, FILE_MODE & ~_umask())
    with open(file, "rb", buffering=0) as f:
        size = os.fstat(f.fileno()).st_size
        value = _crc_while_flushing(file, f.fileno(), size, fsync=fsync)
    return {"bytes": size, "crc32": value}


def _crc_while_flushing(file: Path, fd: int, size: int, *, fsync: bool) -> int:
    """The CRC-32 of ``file`` (``size`` bytes), read back by a thread while this one fsyncs it
    through ``fd`` (when ``fsync``).

    The thread reads the file (its pages still in the page cache) through a descriptor of its
    own, with :func:`~simulator.ckptio.layout.crc32_read` (slices that stay in the CPU's cache,
    into a reused buffer). Its own descriptor: a save interrupted while it waits for the thread
    closes ``fd``, and a thread still reading through that number would read, and move the
    position of, whatever file the process opens next. Reads, not a mapping of the file: an
    I/O error while a mapped page is read in (one evicted under memory pressure and read back
    from a failing disk, or a file cut short meanwhile) is a SIGBUS that kills the training
    process, where a read raises an OSError the save reports. A plain thread, not an executor:
    an async save still in flight at interpreter exit must finish, and executors refuse new
    work once shutdown has begun."""
    outcome: list[Any] = []

    def crc_of_file() -> None:
        try:
            own = os.open(file, os.O_RDONLY | os.O_CLOEXEC)
            try:
                value, got = crc32_read(own, size)
            finally:
                os.close(own)
            if got < size:
                raise OSError(errno.EIO, f"the file ended {size - got} bytes early")
            outcome.append(value)
        except BaseException as exc:  # handed to the saving thread below
            outcome.append(exc)

    thread = threading.Thread(target=crc_of_file, name="ckptio-crc", daemon=True)
    thread.start()
    try:
        if fsync:
            os.fsync(fd)
    finally:
        thread.join()  # bounded: the file's bytes, from the page cache
    (result,) = outcome
    if isinstance(result, BaseException):
        raise result
    return result


_NO_BYTES = np.zeros(1, dtype=np.uint8)
"""A valid address for a tensor of no bytes (the serializer reads none of it)."""


def _spec(t: torch.Tensor) -> TensorSpec:
    """The serializer's description of a dense contiguous CPU tensor: dtype, shape, address
    and length of its bytes."""
    nbytes = t.numel() * t.element_size()
    return TensorSpec(
        dtype=str(t.dtype).removeprefix("torch."),
        shape=list(t.shape),
        data_ptr=t.data_ptr() if nbytes else _NO_BYTES.ctypes.data,
        data_len=nbytes,
    )


FILE_MODE = 0o644
"""The mode of a checkpoint's files, less the process's umask, as ``open`` creates them."""


def _umask() -> int:
    """The process's umask, read without changing it (``/proc/self/status``, Linux 4.7 and
    later); elsewhere set and restored at once."""
    try:
        with open("/proc/self/status", encoding="ascii") as f:
            for line in f:
                if line.startswith("Umask:"):
                    return int(line.split()[1], 8)
    except (OSError, ValueError):
        pass
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def _write_bytes(file: Path, data: bytes, *, fsync: bool) -> dict:
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    try:
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": len(data), "crc32": crc32(data)}
