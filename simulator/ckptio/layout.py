"""On-disk layout of a ckptsim checkpoint: file names, the manifest, errors, fsync helpers.

Also the rules a reader applies before it opens anything (see :mod:`simulator.ckptio`): which
names a manifest may list, which files may sit unlisted in a checkpoint, and how far a reader
trusts the lengths a file states about itself.
"""

from __future__ import annotations

import json
import os
import queue
import re
from pathlib import Path

import numpy as np
import torch

TENSOR_FILE = "tensors.safetensors"
META_FILE = "meta.json"
MANIFEST = "manifest.json"
FORMAT = "ckptsim-checkpoint"
VERSION = 1
_TEMP_MARK = ".tmp-"

try:  # ISA-L's CRC-32: the same polynomial and values as zlib's, ~4x faster (carry-less mul)
    from isal.isal_zlib import crc32
except ImportError:  # no wheel for this platform: zlib's, slower but identical
    from zlib import crc32

MAX_MANIFEST_BYTES = 64 << 20
"""A manifest is ~60 bytes per file: this allows a million files and refuses a planted giant."""
MAX_HEADER_BYTES = 100_000_000
"""The safetensors library's own limit on a header; a longer stated length is a corrupt file."""

DTYPES: dict[str, torch.dtype] = {
    name: dtype
    for name, dtype in (
        ("BOOL", torch.bool),
        ("U8", torch.uint8),
        ("I8", torch.int8),
        ("I16", torch.int16),
        ("U16", getattr(torch, "uint16", None)),
        ("I32", torch.int32),
        ("U32", getattr(torch, "uint32", None)),
        ("I64", torch.int64),
        ("U64", getattr(torch, "uint64", None)),
        ("F16", torch.float16),
        ("BF16", torch.bfloat16),
        ("F32", torch.float32),
        ("F64", torch.float64),
        ("F8_E4M3", getattr(torch, "float8_e4m3fn", None)),
        ("F8_E5M2", getattr(torch, "float8_e5m2", None)),
    )
    if dtype is not None
}
"""The safetensors dtype names ckptio reads and writes, as torch dtypes (the library's own
table; a tensor of any other dtype is refused before anything is written)."""
TORCH_DTYPES: tuple[torch.dtype, ...] = tuple(DTYPES.values())
"""The torch dtypes a checkpoint may hold, in ``DTYPES``' order (what a refusal lists)."""

DCP_METADATA = ".metadata"
"""torch.distributed.checkpoint's index of a checkpoint (rank 0 writes it last)."""
DCP_DATA = re.compile(r"__(\d{1,9})_(\d{1,9})\.distcp")
"""A rank's data file as DCP names it; with one file per rank every rank writes ``__<r>_0``."""
_MARKER = re.compile(r"\.rank-\d+\.(ok|failed)")


class CorruptCheckpoint(Exception):
    """A checkpoint directory that is incomplete or whose bytes differ from its manifest."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, I/O error); nothing was left at the path."""


class CheckpointReadError(OSError):
    """A checkpoint could not be fetched for a reason on the reader's side (a full or failing
    local disk, the network, permissions), not because its bytes are wrong: it was not judged,
    so a restore stops here rather than reject it, move it aside, or fall back past it."""


def may_be_unlisted(name: str) -> bool:
    """Whether a file may sit in a checkpoint without a manifest entry: the manifest itself
    and the per-rank outcome markers (``.rank-<r>.ok``/``.failed``) of a distributed commit,
    which say how the write went and are never read back as state."""
    return name == MANIFEST or _MARKER.fullmatch(name) is not None


def unsafe_name(name: object) -> str | None:
    """Why ``name`` cannot be a manifest entry (None when it can): entries are relative POSIX
    paths that stay inside the checkpoint, so the check is on the text, before any open."""
    if not isinstance(name, str) or not name:
        return "an empty name"
    if len(name) > 4096:
        return "longer than a path can be"
    if "\x00" in name:
        return "it contains NUL"
    if "\\" in name:
        return "it contains a backslash"
    if name.startswith("/"):
        return "an absolute path"
    if any(part in ("", ".", "..") for part in name.split("/")):
        return "an empty, '.' or '..' path component"
    if name == MANIFEST:
        return "the manifest cannot list itself"
    return None


def shown(value: object, limit: int = 80) -> str:
    """``repr(value)`` cut to ``limit`` characters: checkpoint text in a one-line reason."""
    text = repr(value)
    return text if len(text) <= limit else text[: limit - 3] + "..."


def read_header(f, size: int, file: Path) -> tuple[bytes, bytes]:
    """The 8-byte length and the JSON header of a safetensors file of ``size`` bytes, reading
    no more than the file holds and never more than :data:`MAX_HEADER_BYTES`."""
    head = f.read(8)
    if len(head) < 8:
        raise CorruptCheckpoint(f"{file}: {size} bytes, too short for a safetensors header")
    length = int.from_bytes(head, "little")
    if length > min(size - 8, MAX_HEADER_BYTES):
        raise CorruptCheckpoint(
            f"{file}: safetensors header length {length} exceeds the file ({size} bytes) or "
            f"the {MAX_HEADER_BYTES}-byte limit"
        )
    header = f.read(length)
    if len(header) < length:
        raise CorruptCheckpoint(f"{file}: file ended inside its safetensors header")
    return head, header


def header_entries(header: bytes, data_len: int, file: Path) -> dict[str, dict]:
    """The tensor entries of a safetensors header, each checked for what a reader relies on
    (an object whose ``data_offsets`` lie inside the ``data_len`` bytes after the header)."""
    try:
        entries = json.loads(header)
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{file}: safetensors header is not JSON ({exc})") from None
    if not isinstance(entries, dict):
        raise CorruptCheckpoint(
            f"{file}: safetensors header is a {type(entries).__name__}, not a JSON object"
        )
    entries.pop("__metadata__", None)
    for name, entry in entries.items():
        offsets = entry.get("data_offsets") if isinstance(entry, dict) else None
        if not (
            isinstance(offsets, list)
            and len(offsets) == 2
            and all(type(o) is int for o in offsets)
            and 0 <= offsets[0] <= offsets[1] <= data_len
        ):
            raise CorruptCheckpoint(
                f"{file}: tensor {shown(name)} has no valid data_offsets inside the file's "
                f"{data_len} data bytes (got {shown(entry)})"
            )
    return entries


def bytes_of(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 array sharing its memory (any dtype,
    bf16 included, which numpy cannot represent)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def fsync_file(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temp_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the temporary directory of an unfinished (or crashed) write."""
    name = Path(path).name
    return name.startswith(".") and _TEMP_MARK in name


READ_CHUNK = 4 << 20
"""Bytes per scatter read of a restore. Small enough that the slice just read is still in the
CPU's last-level cache when its CRC-32 is computed right after (~36 GB/s there, against
~10 GB/s once a 64 MB slice has gone out to memory: 8 ms instead of 20-37 ms per 300 MB on the
project's VM), large enough that the calls cost nothing. The kernel's own readahead alone did
not keep the device busy at this size (a 1.2 GB file read plainly in 4 MB calls was slower than
in 64 MB calls, ad hoc); a thread asking for the bytes ahead does
(:mod:`simulator.ckptio.readahead`)."""
IOV_MAX = 1024
"""Buffers per readv call: POSIX's minimum, Linux's limit."""

_CRC_BUFFERS: queue.SimpleQueue[bytearray] = queue.SimpleQueue()
"""Idle :data:`READ_CHUNK` buffers of :func:`crc32_read`, kept between calls: fresh pages cost
up to ~2 µs each on the project's VM, ~2 ms per 4 MB buffer, paid on every save otherwise."""


def crc32_read(fd: int, size: int | None = None) -> tuple[int, int]:
    """The CRC-32 of the bytes read from ``fd`` at its position: ``size`` of them (None: to
    the end of the file), and how many were read (fewer than ``size`` when the file ended
    early; the caller says what that means).

    Read in :data:`READ_CHUNK` slices into a buffer reused across calls and threads, each
    slice's CRC taken while it is still in the CPU's cache; the reads release the GIL."""
    try:
        buffer = _CRC_BUFFERS.get_nowait()
    except queue.Empty:
        buffer = bytearray(READ_CHUNK)
    try:
        view = memoryview(buffer)[:READ_CHUNK]
        value, done = 0, 0
        while size is None or done < size:
            n = os.readv(fd, [view if size is None else view[: size - done]])
            if n == 0:
                break
            value = crc32(view[:n], value)
            done += n
        return value, done
    finally:
        _CRC_BUFFERS.put(buffer)


def io_groups(views: list[memoryview], chunk: int = READ_CHUNK) -> list[list[memoryview]]:
    """Buffers, in order, as groups of ``chunk`` bytes (a buffer larger than that split across
    groups; at most :data:`IOV_MAX` buffers a group), each for one scatter read (``readv``) of
    a restore: few calls that release the GIL, whatever the tensor sizes (a torch call or a
    read per tensor would cost a GIL hand-off each on a busy machine)."""
    groups: list[list[memoryview]] = [[]]
    filled = 0
    for view in views:
        done = 0
        while done < len(view):
            if filled == chunk or len(groups[-1]) == IOV_MAX:
                groups.append([])
                filled = 0
            take = min(chunk - filled, len(view) - done)
            groups[-1].append(view[done : done + take])
            filled += take
            done += take
    return [group for group in groups if group]
