"""Reading a checkpoint: completeness, CRC verification, loading through safetensors."""

from __future__ import annotations

import json
import os
import shutil
import zlib
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path
from typing import Any

import numpy as np
import torch
from safetensors import SafetensorError, safe_open

from simulator.ckptio.layout import (
    _CRC_CHUNK,
    FORMAT,
    MANIFEST,
    META_FILE,
    TENSOR_FILE,
    CorruptCheckpoint,
    bytes_of,
    is_temp_dir,
)


def is_complete(path: str | os.PathLike) -> bool:
    """Cheap completeness check: a final (non-temporary) directory whose manifest parses and
    whose files all exist with the sizes it lists. Checksums are not read; see
    :func:`verify_checkpoint`."""
    path = Path(path)
    if is_temp_dir(path) or not path.is_dir():
        return False
    try:
        _check_sizes(path, _read_manifest(path))
    except CorruptCheckpoint:
        return False
    return True


def verify_checkpoint(path: str | os.PathLike) -> None:
    """Raise :class:`CorruptCheckpoint` (one-line reason) unless every file matches the
    manifest in size and CRC-32."""
    path = Path(path)
    manifest = _checked_manifest(path)
    for name, entry in manifest["files"].items():
        _check_crc(path / name, file_crc32(path / name), entry["crc32"])


def read_checkpoint(
    path: str | os.PathLike, *, verify: bool = True
) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    """Load a checkpoint's tensors (on CPU) and meta.

    With ``verify`` the CRC-32 is computed over the very bytes loaded, in a thread while the
    next tensor is read, so a verified restore costs one pass over the disk, not two.
    """
    path = Path(path)
    if verify:
        manifest = _checked_manifest(path)
    elif not is_complete(path):
        raise CorruptCheckpoint(f"{path} is not a complete checkpoint")
    try:
        tensors, crc = _load_tensors(path / TENSOR_FILE, checksum=verify)
        meta_bytes = (path / META_FILE).read_bytes()
        meta = json.loads(meta_bytes)
    except (OSError, ValueError, SafetensorError) as exc:
        raise CorruptCheckpoint(f"{path}: cannot be loaded: {exc}") from exc
    if verify:
        files = manifest["files"]
        _check_crc(path / TENSOR_FILE, crc, files[TENSOR_FILE]["crc32"])
        _check_crc(path / META_FILE, zlib.crc32(meta_bytes), files[META_FILE]["crc32"])
        for name, entry in files.items():
            if name not in (TENSOR_FILE, META_FILE):
                _check_crc(path / name, file_crc32(path / name), entry["crc32"])
    return tensors, meta


def _load_tensors(file: Path, *, checksum: bool) -> tuple[dict[str, torch.Tensor], int | None]:
    """Every tensor copied out of the file mapping into process memory (so the restore reads
    the disk now, and later edits of the file cannot reach the caller), in file order, with
    the file's CRC-32 computed from the header and the copies."""
    with open(file, "rb") as f:
        head = f.read(8)
        header = f.read(int.from_bytes(head, "little"))
    entries = json.loads(header)
    entries.pop("__metadata__", None)
    order = sorted(entries, key=lambda n: entries[n]["data_offsets"][0])
    tensors: dict[str, torch.Tensor] = {}
    crc = zlib.crc32(header, zlib.crc32(head))
    pending: Future | None = None
    with ThreadPoolExecutor(max_workers=1) as pool, safe_open(file, "pt", device="cpu") as st:
        for name in order:
            view = st.get_tensor(name)
            copy = torch.empty(view.shape, dtype=view.dtype)
            if view.numel():
                # numpy's memcpy, not torch's copy_: see simulator.ckptio.staging.stage.
                np.copyto(bytes_of(copy), bytes_of(view))
            tensors[name] = copy
            if checksum:
                # Chained: each CRC step waits for the previous one, overlapping the next read.
                prev = pending
                pending = pool.submit(_crc_after, prev, copy, None if prev else crc)
    return tensors, (pending.result() if pending else crc) if checksum else None


def _crc_after(prev: Future | None, t: torch.Tensor, start: int | None) -> int:
    crc = prev.result() if prev is not None else start
    if t.numel():
        data = memoryview(bytes_of(t))
        for i in range(0, len(data), _CRC_CHUNK):
            crc = zlib.crc32(data[i : i + _CRC_CHUNK], crc)
    return crc


def file_crc32(file: str | os.PathLike) -> int:
    """CRC-32 of a file's bytes, read in large chunks (for files ckptio did not write)."""
    crc = 0
    with open(file, "rb", buffering=0) as f:
        while chunk := f.read(_CRC_CHUNK):
            crc = zlib.crc32(chunk, crc)
    return crc


def _check_crc(file: Path, crc: int, expected: int) -> None:
    if crc != expected:
        raise CorruptCheckpoint(
            f"{file}: CRC-32 {crc:#010x} differs from manifest {expected:#010x}"
        )


def _checked_manifest(path: Path) -> dict[str, Any]:
    if is_temp_dir(path):
        raise CorruptCheckpoint(f"{path} is the temporary directory of an unfinished write")
    if not path.is_dir():
        raise CorruptCheckpoint(f"{path} is not a checkpoint directory")
    manifest = _read_manifest(path)
    _check_sizes(path, manifest)
    return manifest


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


def _read_manifest(path: Path) -> dict[str, Any]:
    file = path / MANIFEST
    if not file.is_file():
        raise CorruptCheckpoint(f"{path}: {MANIFEST} is missing (write did not finish)")
    try:
        manifest = json.loads(file.read_bytes())
        files = manifest["files"]
        if manifest.get("format") != FORMAT or not isinstance(files, dict):
            raise ValueError("not a ckptsim manifest")
        for entry in files.values():
            int(entry["bytes"]), int(entry["crc32"])
    except (ValueError, KeyError, TypeError) as exc:
        raise CorruptCheckpoint(f"{path}: {MANIFEST} is unreadable: {exc}") from exc
    return manifest


def _check_sizes(path: Path, manifest: dict[str, Any]) -> None:
    for name, entry in manifest["files"].items():
        file = path / name
        if not file.is_file():
            raise CorruptCheckpoint(f"{path}: {name} listed in the manifest is missing")
        size = file.stat().st_size
        if size != entry["bytes"]:
            raise CorruptCheckpoint(
                f"{file}: {size} bytes on disk, manifest says {entry['bytes']} (truncated?)"
            )
