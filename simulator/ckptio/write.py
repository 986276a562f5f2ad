"""Writing a checkpoint: temp sibling dir, safetensors + JSON, CRC-32 manifest, atomic rename."""

from __future__ import annotations

import json
import os
import secrets
import shutil
from pathlib import Path
from typing import Any

import torch

from simulator.ckptio import syscalls
from simulator.ckptio.layout import (
    _TEMP_MARK,
    DTYPE_NAMES,
    FORMAT,
    MANIFEST,
    MAX_HEADER_BYTES,
    META_FILE,
    TENSOR_FILE,
    VERSION,
    CheckpointWriteError,
    CrcTrail,
    bytes_of,
    crc32,
    fsync_dir,
    io_groups,
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
    """Dense contiguous CPU tensors, aliases of the same bytes made separate (safetensors
    refuses tensors that overlap in memory, e.g. tied embedding and output weights)."""
    if not isinstance(tensors, dict):
        raise TypeError(f"tensors must be a dict of name -> torch.Tensor, got {type(tensors)}")
    out: dict[str, torch.Tensor] = {}
    for name, t in tensors.items():
        if not isinstance(name, str) or name == "__metadata__" or not _utf8(name):
            raise ValueError(
                f"tensor name {name!r} is not allowed (a str in UTF-8, not '__metadata__')"
            )
        if not isinstance(t, torch.Tensor):
            raise TypeError(f"tensor {name!r} is a {type(t).__name__}, not a torch.Tensor")
        if t.dtype not in DTYPE_NAMES:
            raise TypeError(
                f"tensor {name!r} has dtype {t.dtype}, which a safetensors file cannot hold "
                f"(it holds {', '.join(str(d) for d in DTYPE_NAMES)})"
            )
        t = t.detach()
        if t.layout != torch.strided:
            t = t.to_dense()
        if t.device.type != "cpu":
            t = t.cpu()
        out[name] = t.contiguous()
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


def _safetensors_header(tensors: dict[str, torch.Tensor]) -> tuple[list[str], bytes]:
    """The order the tensors' bytes go in, and the file's first bytes: the 8-byte header
    length and the JSON header (UTF-8), padded with spaces to a multiple of 8, as the
    safetensors library writes them. Larger dtypes go first, then by name, so that every
    tensor's data starts aligned to its dtype's size (the library's rule; within one size it
    orders dtypes its own way, which no reader depends on)."""
    order = sorted(tensors, key=lambda name: (-tensors[name].element_size(), name))
    header: dict[str, Any] = {"__metadata__": {"format": "pt"}}
    pos = 0
    for name in order:
        t = tensors[name]
        nbytes = t.numel() * t.element_size()
        header[name] = {
            "dtype": DTYPE_NAMES[t.dtype],
            "shape": list(t.shape),
            "data_offsets": [pos, pos + nbytes],
        }
        pos += nbytes
    text = json.dumps(header, separators=(",", ":"), ensure_ascii=False).encode()
    text += b" " * (-len(text) % 8)
    if len(text) > MAX_HEADER_BYTES:
        raise ValueError(
            f"{len(tensors)} tensors need a {len(text)}-byte safetensors header, more than "
            f"the format's {MAX_HEADER_BYTES} bytes: save fewer, larger tensors"
        )
    return order, len(text).to_bytes(8, "little") + text


def _write_tensor_file(file: Path, tensors: dict[str, torch.Tensor], *, fsync: bool) -> dict:
    """Write the tensors as a safetensors file and return its size and CRC-32.

    The bytes go straight from each tensor's memory to the file in gather writes (``writev``)
    of :data:`~simulator.ckptio.layout.IO_CHUNK` bytes (:func:`~simulator.ckptio.layout.io_groups`);
    the CRC-32 of each slice is computed in a thread as it is written (from the very memory
    written), and with ``fsync`` the device write-back of each group is started as soon as it is
    in the page cache (write-behind, :func:`~simulator.ckptio.syscalls.start_writeback`), so
    the disk works while the next group is copied and the closing fsync waits for little.
    """
    order, head = _safetensors_header(tensors)
    views = [memoryview(bytes_of(tensors[name])) for name in order if tensors[name].numel()]
    groups = io_groups([memoryview(head), *views])
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        written = 0
        with CrcTrail() as crc:
            for i, group in enumerate(groups):
                _writev_all(fd, group)
                for view in group:
                    crc.add(view)
                start, written = written, written + sum(len(view) for view in group)
                if fsync and i + 1 < len(groups):
                    syscalls.start_writeback(fd, start, written - start)
            if fsync:
                os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": written, "crc32": crc.value}


def _writev_all(fd: int, views: list[memoryview]) -> None:
    """Write every buffer of ``views`` in order, continuing after short writes."""
    while views:
        n = os.writev(fd, views)
        while n:  # drop the buffers this write took, trim the one it took in part
            if n >= len(views[0]):
                n -= len(views[0])
                views = views[1:]
            else:
                views = [views[0][n:], *views[1:]]
                n = 0


def _write_all(fd: int, view: memoryview) -> None:
    while view:
        view = view[os.write(fd, view) :]


def _write_bytes(file: Path, data: bytes, *, fsync: bool) -> dict:
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
    try:
        _write_all(fd, memoryview(data))
        if fsync:
            os.fsync(fd)
    finally:
        os.close(fd)
    return {"bytes": len(data), "crc32": crc32(data)}
