"""Reading a checkpoint: what it must hold, CRC verification, loading safetensors bytes.

Nothing in a checkpoint directory is trusted before it is checked, in this order: the
directory itself is no symlink; the manifest is a regular file of bounded size and a JSON
object of the expected keys and types, whose names are relative paths inside the directory;
every file in the directory tree is a regular file (symlinks, FIFOs and devices are refused,
never opened) and listed, but for :func:`~simulator.ckptio.layout.may_be_unlisted` names;
every listed file exists with its listed size, and the files the layout needs are listed.
Only then are bytes read — opened without following links, never past the listed size — and
checked against their CRC-32. Every refusal is a :class:`CorruptCheckpoint` with a one-line
reason, which a caller treats as "fall back to an older checkpoint".
"""

from __future__ import annotations

import errno
import functools
import json
import math
import os
import shutil
import stat
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, BinaryIO

import torch

from simulator.ckptio.layout import (
    DCP_DATA,
    DCP_METADATA,
    DTYPES,
    FORMAT,
    MANIFEST,
    MAX_MANIFEST_BYTES,
    META_FILE,
    TENSOR_FILE,
    VERSION,
    CorruptCheckpoint,
    bytes_of,
    crc32,
    crc32_read,
    header_entries,
    io_groups,
    is_temp_dir,
    may_be_unlisted,
    read_header,
    shown,
    unsafe_name,
)
from simulator.ckptio.prefault import Prefaulter
from simulator.ckptio.readahead import Readahead

# What a manifest's files must include, by who wrote it: ckptio's own checkpoints (recognised
# by the "tensors" count only write_checkpoint records, or by their file names),
# torch.distributed checkpoints sealed by write_manifest (the "ranks" it records, or DCP's file
# names: then DCP's index and every rank's data file are required), or any other set of files
# (Lightning's). Which layout the caller expects is its own to demand (read_checkpoint does).
_CKPTIO, _DCP, _FILES = "ckptio", "dcp", "files"


def is_complete(path: str | os.PathLike) -> bool:
    """Cheap completeness check: every structural rule of :func:`verify_checkpoint` (the
    manifest, the names, regular files only, nothing unlisted, the sizes). Checksums are not
    read."""
    try:
        _inspect(Path(path))
    except CorruptCheckpoint:
        return False
    return True


def verify_structure(path: str | os.PathLike, *members: str) -> None:
    """Raise :class:`CorruptCheckpoint` (one-line reason) unless the checkpoint passes every
    structural rule of :func:`verify_checkpoint` and the small ``members`` named (those a
    caller reads before the load, e.g. ``meta.json``) match their CRC-32; the other files'
    checksums are left to :func:`read_checkpoint` with ``verify``, in the same single pass
    that loads them."""
    _verify(Path(path), members)


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise :class:`CorruptCheckpoint` (one-line reason) unless the checkpoint passes every
    structural rule and every file matches the manifest in size and CRC-32.

    Contents are not parsed here (a file that is a pickle is for the caller to refuse as
    such); :func:`read_checkpoint` checks the tensor header and ``meta.json`` as it loads."""
    _verify(Path(path), None)


def _verify(path: Path, members: tuple[str, ...] | None) -> None:
    """The structural rules, then the CRC-32 of ``members`` (None: every file)."""
    files = _inspect(path)["files"]
    for name in files if members is None else [m for m in members if m in files]:
        entry = files[name]
        _check_crc(path / name, _member_crc(path / name, entry["bytes"]), entry["crc32"])


def read_checkpoint(
    path: str | os.PathLike,
    *,
    verify: bool = True,
    into: Mapping[str, torch.Tensor] | None = None,
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a checkpoint's tensors (on CPU) and meta (a JSON object).

    With ``verify`` the CRC-32 is computed over the very bytes loaded, each slice as it
    arrives, so a verified restore costs one pass over the disk, not two.
    Without it the structural checks of :func:`is_complete` still apply.

    ``into``: tensors to read into in place, by the checkpoint's tensor names (the live state a
    restore will load, as ``torch.distributed.checkpoint.load`` does): each one that is a
    contiguous CPU tensor of the stored dtype and shape, unshared, overlapping no other, is
    filled and returned itself; every other tensor is read into fresh memory. Reading into
    memory the process holds already spares the restore the mapping of fresh pages (on a VM as
    slow as the disk read) and the copy a ``load_state_dict`` would make. Should the read fail
    (a :class:`CorruptCheckpoint`, a CRC mismatch), those tensors hold part of the checkpoint's
    bytes: pass ``into`` only where a failed restore ends the run or is followed by one that
    loads every one of them again.
    """
    path = Path(path)
    manifest = _inspect(path, layout=_CKPTIO)
    files = manifest["files"]
    tensor_file, meta_file = path / TENSOR_FILE, path / META_FILE
    load = functools.partial(
        _load_tensors,
        tensor_file,
        files[TENSOR_FILE]["bytes"],
        manifest.get("tensors"),
        checksum=verify,
    )
    try:
        try:
            tensors, crc = load(into=into or {})
        except OSError as exc:
            if exc.errno != errno.EFAULT or not into:
                raise
            # A destination the kernel cannot write (a read-only mapping): the live tensor's
            # fault, not the checkpoint's, which must not be rejected for it. Read it fresh.
            tensors, crc = load(into={})
    except (OSError, ValueError, TypeError, RuntimeError) as exc:
        raise CorruptCheckpoint(f"{tensor_file}: cannot be loaded: {shown(str(exc), 200)}") from exc
    meta_bytes = _read_member(meta_file, files[META_FILE]["bytes"])
    if verify:
        _check_crc(tensor_file, crc, files[TENSOR_FILE]["crc32"])
        _check_crc(meta_file, crc32(meta_bytes), files[META_FILE]["crc32"])
        for name, entry in files.items():
            if name not in (TENSOR_FILE, META_FILE):
                _check_crc(path / name, _member_crc(path / name, entry["bytes"]), entry["crc32"])
    return tensors, _parse_meta(meta_file, meta_bytes)


def _load_tensors(
    file: Path,
    size: int,
    count: int | None,
    *,
    checksum: bool,
    into: Mapping[str, torch.Tensor],
) -> tuple[dict[str, torch.Tensor], int | None]:
    """Every tensor read straight from the file into its own CPU tensor (``into``'s where it
    fits, see :func:`_fillable`, else fresh), in file order, with the file's CRC-32 computed
    from the header and each slice just read.

    One sequential pass of scatter reads (``readv``) of
    :data:`~simulator.ckptio.layout.READ_CHUNK` bytes each, straight into the tensors
    (:func:`~simulator.ckptio.layout.io_groups`): no file mapping (whose 4 KiB page faults read a
    cold file at a fraction of the disk's speed), no intermediate copy. The checksum of each
    slice is computed right after its read, from the CPU's cache (a CRC thread trailing 64 MB
    slices read them back from memory at a third of the speed, and on a busy 2-core machine
    competed with the reader for a core), while the kernel fetches the next slices, asked for
    ahead of the reader by a :class:`~simulator.ckptio.readahead.Readahead` thread;
    a :class:`~simulator.ckptio.prefault.Prefaulter` maps the fresh tensors' pages in a thread
    ahead of the reads, so the reader mostly copies. The bytes become tensors only through a
    dtype table and shapes checked against the offsets, never through code in the file.
    """
    with _open_member(file, size) as f:
        if hasattr(os, "posix_fadvise"):  # a larger readahead window for the one pass
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        head, header = read_header(f, size, file)
        data_len = size - 8 - len(header)
        entries = header_entries(header, data_len, file)
        if count is not None and len(entries) != count:
            raise CorruptCheckpoint(
                f"{file}: holds {len(entries)} tensors, the manifest says {count}"
            )
        specs = _tensor_specs(entries, data_len, file)
        # Every tensor is allocated before the first read (the specs tile the file's data, so
        # this is never more memory than the file holds), so that the prefault thread can map
        # their pages ahead of the reads that fill them.
        fill = _fillable(specs, into)
        tensors = {
            name: fill[name] if name in fill else torch.empty(shape, dtype=dtype)
            for name, dtype, shape in specs
        }
        crc = crc32(header, crc32(head)) if checksum else None
        pos, start = 0, size - data_len
        with (
            Prefaulter(list(tensors.values())) as prefault,
            Readahead(f.fileno(), size) as readahead,
        ):
            views = [memoryview(bytes_of(t)) for t in tensors.values() if t.numel()]
            for group in io_groups(views):
                readahead.at(start + pos)
                pos += sum(len(view) for view in group)
                prefault.ready(pos)
                _readv_exactly(f.fileno(), group, file)
                if crc is not None:  # while the slice is still in the CPU's cache
                    for view in group:
                        crc = crc32(view, crc)
    return tensors, crc


def _fillable(
    specs: list[tuple[str, torch.dtype, list[int]]], into: Mapping[str, torch.Tensor]
) -> dict[str, torch.Tensor]:
    """The tensors of ``into`` a restore may read into: a contiguous strided CPU tensor of the
    stored name, dtype and shape, not in shared memory, with no byte shared with another such
    tensor (two views of one buffer, which a save stores apart, would each take the other's
    bytes)."""
    fits = {}
    for name, dtype, shape in specs:
        t = into.get(name)
        if (
            isinstance(t, torch.Tensor)
            and t.device.type == "cpu"
            and t.layout == torch.strided
            and t.dtype == dtype
            and list(t.shape) == shape
            and t.numel() > 0
            and t.is_contiguous()
            and not (t.is_conj() or t.is_neg())
            # Shared memory (share_memory_(), a file mapped shared) is seen by other processes
            # or outlives this one: it must not hold a checkpoint's bytes before their CRC-32.
            and not t.is_shared()
        ):
            fits[name] = t
    spans = sorted((t.data_ptr(), t.data_ptr() + t.nbytes, name) for name, t in fits.items())
    shared, reach, widest = set(), 0, None  # the furthest end so far, and whose
    for start, end, name in spans:
        if start < reach:
            shared |= {name, widest}
        if end > reach:
            reach, widest = end, name
    return {name: t for name, t in fits.items() if name not in shared}


def _tensor_specs(
    entries: dict[str, dict], data_len: int, file: Path
) -> list[tuple[str, torch.dtype, list[int]]]:
    """(name, dtype, shape) in file order, refused unless every dtype is known, every shape's
    byte count equals its offsets' span, and the spans tile the data exactly, with no gap or
    overlap (the rules safetensors itself applies before it hands out a tensor)."""
    specs, pos = [], 0
    for name in sorted(entries, key=lambda n: entries[n]["data_offsets"][0]):
        entry = entries[name]
        dtype = DTYPES.get(entry.get("dtype")) if isinstance(entry.get("dtype"), str) else None
        if dtype is None:
            raise CorruptCheckpoint(
                f"{file}: tensor {shown(name)} has dtype {shown(entry.get('dtype'))}, not one of "
                f"{', '.join(DTYPES)}"
            )
        shape = entry.get("shape")
        if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
            raise CorruptCheckpoint(
                f"{file}: tensor {shown(name)} has shape {shown(shape)}, not a list of sizes"
            )
        start, stop = entry["data_offsets"]
        nbytes = math.prod(shape) * dtype.itemsize
        if nbytes != stop - start:
            raise CorruptCheckpoint(
                f"{file}: tensor {shown(name)} of shape {shape} and dtype {entry['dtype']} needs "
                f"{nbytes} bytes, its data_offsets span {stop - start}"
            )
        if start != pos:
            raise CorruptCheckpoint(
                f"{file}: tensor {shown(name)} starts at data byte {start}, the previous one "
                f"ends at {pos} (tensors must tile the data, no gap or overlap)"
            )
        pos = stop
        specs.append((name, dtype, shape))
    if pos != data_len:
        raise CorruptCheckpoint(
            f"{file}: tensors end at data byte {pos}, the file holds {data_len} data bytes"
        )
    return specs


def _readv_exactly(fd: int, into: list[memoryview], file: Path) -> None:
    """Fill every buffer of ``into`` in order from ``fd``, continuing after short reads."""
    while into:
        n = os.readv(fd, into)
        if not n:
            left = sum(len(view) for view in into)
            raise CorruptCheckpoint(f"{file}: ended {left} bytes early")
        while n:  # drop the buffers this read filled, trim the one it filled in part
            if n >= len(into[0]):
                n -= len(into[0])
                into = into[1:]
            else:
                into = [into[0][n:], *into[1:]]
                n = 0


def file_crc32(file: str | os.PathLike) -> int:
    """CRC-32 of a file's bytes (for files ckptio did not write)."""
    with open(file, "rb", buffering=0) as f:
        return crc32_read(f.fileno())[0]


def checkpoint_files(path: str | os.PathLike) -> dict[str, int]:
    """Every file under a checkpoint directory, as relative POSIX name -> size, found without
    following a symlink; a symlink or anything but a regular file or directory is a
    :class:`CorruptCheckpoint` (a checkpoint holds nothing else, and such an entry is never
    opened)."""
    root = Path(path)
    found: dict[str, int] = {}
    pending = [("", root)]
    while pending:
        prefix, directory = pending.pop()
        try:
            with os.scandir(directory) as listing:
                entries = list(listing)
        except OSError as exc:
            raise CorruptCheckpoint(f"{directory}: cannot be listed ({exc.strerror})") from None
        for entry in entries:
            rel = prefix + entry.name
            try:
                mode = entry.stat(follow_symlinks=False)
            except OSError as exc:
                raise CorruptCheckpoint(f"{root}: {shown(rel)} vanished ({exc.strerror})") from None
            if stat.S_ISLNK(mode.st_mode):
                raise CorruptCheckpoint(
                    f"{root}: {shown(rel)} is a symlink; a checkpoint's files are never followed "
                    "out of it"
                )
            if stat.S_ISDIR(mode.st_mode):
                pending.append((rel + "/", Path(entry.path)))
            elif stat.S_ISREG(mode.st_mode):
                found[rel] = mode.st_size
            else:
                raise CorruptCheckpoint(
                    f"{root}: {shown(rel)} is not a regular file (a FIFO, socket or device)"
                )
    return found


def _check_crc(file: Path, crc: int, expected: int) -> None:
    if crc != expected:
        raise CorruptCheckpoint(
            f"{file}: CRC-32 {crc:#010x} differs from manifest {expected:#010x}"
        )


def _inspect(path: Path, *, layout: str | None = None) -> dict[str, Any]:
    """The validated manifest of a checkpoint that passes every structural rule (see the
    module docstring); ``layout`` demands that layout's files whatever the manifest says."""
    if is_temp_dir(path):
        raise CorruptCheckpoint(f"{path} is the temporary directory of an unfinished write")
    try:
        mode = os.lstat(path).st_mode
    except OSError as exc:
        raise CorruptCheckpoint(f"{path} is not a checkpoint directory ({exc.strerror})") from None
    if stat.S_ISLNK(mode):
        raise CorruptCheckpoint(
            f"{path} is a symlink; a checkpoint is read only where it was written"
        )
    if not stat.S_ISDIR(mode):
        raise CorruptCheckpoint(f"{path} is not a checkpoint directory")
    manifest = _read_manifest(path)
    files = manifest["files"]
    on_disk = checkpoint_files(path)
    for name, entry in files.items():
        if name not in on_disk:
            raise CorruptCheckpoint(f"{path}: {shown(name)} listed in the manifest is missing")
        if on_disk[name] != entry["bytes"]:
            raise CorruptCheckpoint(
                f"{path / name}: {on_disk[name]} bytes on disk, manifest says {entry['bytes']} "
                "(truncated?)"
            )
    for name in sorted(on_disk):
        if name not in files and not may_be_unlisted(name):
            raise CorruptCheckpoint(
                f"{path}: {shown(name)} is not listed in the manifest (every file of a "
                "checkpoint is, so none can escape its checksum)"
            )
    _check_layout(path, manifest, layout or _layout(manifest))
    return manifest


def _layout(manifest: dict[str, Any]) -> str:
    files = manifest["files"]
    if "tensors" in manifest or TENSOR_FILE in files or META_FILE in files:
        return _CKPTIO
    if "ranks" in manifest or any(n == DCP_METADATA or DCP_DATA.fullmatch(n) for n in files):
        return _DCP
    return _FILES


def _check_layout(path: Path, manifest: dict[str, Any], layout: str) -> None:
    files = manifest["files"]
    if layout == _CKPTIO:
        for name in (TENSOR_FILE, META_FILE):
            if name not in files:
                raise CorruptCheckpoint(f"{path}: {name} is not listed in the manifest")
    elif layout == _DCP:
        if DCP_METADATA not in files:
            raise CorruptCheckpoint(f"{path}: {DCP_METADATA} is not listed in the manifest")
        ranks = {int(m[1]) for m in map(DCP_DATA.fullmatch, files) if m}
        world = max(manifest.get("ranks", 1), max(ranks, default=0) + 1)
        if world > len(files):
            raise CorruptCheckpoint(
                f"{path}: {MANIFEST} implies {world} ranks but lists {len(files)} files"
            )
        for rank in range(world):
            if f"__{rank}_0.distcp" not in files:
                raise CorruptCheckpoint(
                    f"{path}: rank {rank}'s data file __{rank}_0.distcp is not listed in the "
                    "manifest"
                )


def remove_stale_temps(parent: str | os.PathLike) -> list[Path]:
    """Delete temporary directories that crashed writes left in ``parent``; return them.

    Call only when no write into ``parent`` is in flight (e.g. at start-up, holding the
    directory's lock). A symbolic link is no temp directory of ours: it is left alone, and
    nothing is deleted through it."""
    removed = []
    for child in Path(parent).iterdir():
        if is_temp_dir(child) and not child.is_symlink() and child.is_dir():
            shutil.rmtree(child, ignore_errors=True)
            removed.append(child)
    return removed


def read_meta(path: str | os.PathLike) -> dict[str, Any] | None:
    """Checkpoint ``path``'s ``meta.json`` as a JSON object, or None where its manifest lists
    none (a distributed checkpoint's state is in its tensor files).

    The file is read once, never through a symlink or from a FIFO, bounded by the size the
    manifest lists, and its CRC-32 is checked on the very bytes parsed: a file swapped after a
    check cannot be read in its place. Raises :class:`CorruptCheckpoint`."""
    path = Path(path)
    entry = _read_manifest(path)["files"].get(META_FILE)
    if entry is None:
        return None
    file = path / META_FILE
    data = _read_member(file, entry["bytes"])
    _check_crc(file, crc32(data), entry["crc32"])
    return _parse_meta(file, data)


def read_manifest(path: str | os.PathLike) -> dict[str, Any]:
    """The manifest of checkpoint directory ``path``, refused (:class:`CorruptCheckpoint`)
    unless it is a bounded regular file whose every key the readers use has the expected type
    and whose names are relative paths inside the checkpoint. Nothing else is checked: the
    files themselves are :func:`verify_checkpoint`'s. (An object store's restore checks a
    downloaded manifest with it before fetching anything it names.)"""
    return _read_manifest(Path(path))


def _read_manifest(path: Path) -> dict[str, Any]:
    """The manifest, refused unless every key the readers use has the expected type."""
    file = path / MANIFEST
    try:
        size = os.lstat(file).st_size
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path}: {MANIFEST} is missing (write did not finish)") from None
    except OSError as exc:
        raise CorruptCheckpoint(f"{file}: cannot be read ({exc.strerror})") from None
    if size > MAX_MANIFEST_BYTES:
        raise CorruptCheckpoint(
            f"{file}: {size} bytes, larger than any manifest ({MAX_MANIFEST_BYTES})"
        )
    try:
        manifest = json.loads(_read_member(file, size))
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{file}: not JSON ({exc})") from None

    def bad(what: str) -> CorruptCheckpoint:
        return CorruptCheckpoint(f"{file}: {what}")

    if not isinstance(manifest, dict):
        raise bad(f"is a JSON {type(manifest).__name__}, not an object")
    if manifest.get("format") != FORMAT:
        raise bad(f"format is {shown(manifest.get('format'))}, not {FORMAT!r}")
    version = manifest.get("version")
    if type(version) is not int or version < 1:
        raise bad(f"version is {shown(version)}, not a positive integer")
    if version > VERSION:
        raise bad(f"version {version} was written by a newer ckptsim (this one reads {VERSION})")
    if manifest.get("checksum") != "crc32":
        raise bad(f"checksum is {shown(manifest.get('checksum'))}, not 'crc32'")
    files = manifest.get("files")
    if not isinstance(files, dict) or not files:
        raise bad(f"files is {shown(files, 40)}, not a non-empty object of name -> entry")
    for name, entry in files.items():
        reason = unsafe_name(name)
        if reason is not None:
            raise bad(f"lists {shown(name)}, {reason}; entries are relative paths inside it")
        if not isinstance(entry, dict):
            raise bad(f"the entry of {shown(name)} is a {type(entry).__name__}, not an object")
        for key, limit in (("bytes", None), ("crc32", 1 << 32)):
            value = entry.get(key)
            if type(value) is not int or value < 0 or (limit is not None and value >= limit):
                span = f"in [0, {limit:#x})" if limit else ">= 0"
                raise bad(f"{shown(name)} has {key} {shown(value, 40)}, not an integer {span}")
    total = sum(entry["bytes"] for entry in files.values())
    if manifest.get("bytes") != total or type(manifest.get("bytes")) is not int:
        raise bad(f"bytes is {shown(manifest.get('bytes'), 40)}, the files sum to {total}")
    for key, least in (("tensors", 0), ("ranks", 1)):
        value = manifest.get(key, least)
        if type(value) is not int or value < least:
            raise bad(f"{key} is {shown(value, 40)}, not an integer >= {least}")
    return manifest


@contextmanager
def _open_member(file: Path, size: int) -> Iterator[BinaryIO]:
    """A checkpoint file opened for reading without following a symlink or blocking on a
    FIFO, refused unless it is a regular file of the ``size`` bytes expected."""
    try:
        fd = os.open(file, os.O_RDONLY | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_CLOEXEC)
    except OSError as exc:
        if exc.errno == errno.ELOOP:
            raise CorruptCheckpoint(f"{file}: is a symlink, never followed") from None
        raise CorruptCheckpoint(f"{file}: cannot be opened ({exc.strerror})") from None
    with os.fdopen(fd, "rb", buffering=0) as f:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise CorruptCheckpoint(f"{file}: not a regular file")
        if st.st_size != size:
            raise CorruptCheckpoint(f"{file}: {st.st_size} bytes, expected {size} (changed?)")
        yield f


def _read_member(file: Path, size: int) -> bytes:
    with _open_member(file, size) as f:
        data = f.read(size)
    if len(data) != size:
        raise CorruptCheckpoint(f"{file}: ended after {len(data)} of {size} bytes")
    return data


def _member_crc(file: Path, size: int) -> int:
    """CRC-32 of exactly the ``size`` bytes a checkpoint file is listed with."""
    with _open_member(file, size) as f:
        crc, got = crc32_read(f.fileno(), size)
    if got < size:
        raise CorruptCheckpoint(f"{file}: ended {size - got} bytes early")
    return crc


def _parse_meta(file: Path, data: bytes) -> dict[str, Any]:
    try:
        meta = json.loads(data)
    except (ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{file}: not JSON ({shown(str(exc))})") from None
    if not isinstance(meta, dict):
        raise CorruptCheckpoint(f"{file}: a JSON {type(meta).__name__}, not an object")
    return meta
