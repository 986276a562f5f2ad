"""When a checkpoint counts, and what it may not contain.

A checkpoint directory is complete only when its manifest exists, and intact only when every
file it lists has the listed size and CRC-32: the format of :mod:`simulator.ckptio`, which
writes and verifies the single-process checkpoints itself. :func:`write_manifest` produces the
same manifest over files that another writer (torch.distributed) put into a temporary
directory, so every checkpoint verifies the same way.

Pickles can run arbitrary code when loaded, so a checkpoint that carries one is refused
outright. The refusal reads the pickle's opcodes (``pickletools``) without executing them, to
name what it would have imported.
"""

from __future__ import annotations

import json
import os
import pickletools
from pathlib import Path

from simulator import ckptio
from simulator.ckptio import CheckpointWriteError, CorruptCheckpoint
from simulator.errors import InputError

__all__ = [
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "IncompatibleCheckpoint",
    "UnsafeCheckpoint",
    "pickle_globals",
    "refuse_pickles",
    "write_manifest",
]


class UnsafeCheckpoint(Exception):
    """A checkpoint carries a pickle, whose loading could execute code; it is refused."""


class IncompatibleCheckpoint(InputError):
    """The checkpoint was written by a run with a different configuration or model."""


def write_manifest(root: Path) -> dict:
    """Checksum every file under ``root`` into a ckptio manifest, written last and fsynced.

    For backends whose files the checkpointer did not write through :mod:`simulator.ckptio`
    (torch.distributed checkpoints): the result reads and verifies like any ckptio checkpoint.
    Per-rank marker files (``.rank-*``) are left out.
    """
    files = {}
    for dirpath, _dirs, names in os.walk(root):
        for name in sorted(names):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel == ckptio.MANIFEST or name.startswith((".rank-", f".{ckptio.MANIFEST}.tmp-")):
                continue
            ckptio.fsync_file(path)
            files[rel] = {"bytes": path.stat().st_size, "crc32": ckptio.file_crc32(path)}
        ckptio.fsync_dir(Path(dirpath))
    manifest = {
        "format": ckptio.FORMAT,
        "version": ckptio.VERSION,
        "checksum": "crc32",
        "files": files,
        "bytes": sum(f["bytes"] for f in files.values()),
    }
    # Written aside and renamed: a kill mid-write leaves no manifest rather than a torn one.
    tmp = root / f".{ckptio.MANIFEST}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(manifest, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, root / ckptio.MANIFEST)
    ckptio.fsync_dir(root)
    return manifest


_PICKLE_PROTOCOLS = {bytes([0x80, p]) for p in range(2, 6)}
_ZIP = b"PK\x03\x04"


def pickle_globals(path: str | os.PathLike, limit: int = 5) -> list[str] | None:
    """The callables a pickle file would import, read statically; None when it is no pickle.

    A torch.save archive (a zip holding ``data.pkl``) counts as a pickle too.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(4)
    if head == _ZIP:
        return ["(torch.save archive)"]
    if head[:2] not in _PICKLE_PROTOCOLS:
        return None
    found: list[str] = []
    strings: list[str] = []
    try:
        with open(path, "rb") as f:
            for op, arg, _pos in pickletools.genops(f):
                if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                    strings.append(str(arg))
                elif op.name == "GLOBAL":
                    found.append(str(arg).replace(" ", "."))
                elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                    found.append(f"{strings[-2]}.{strings[-1]}")
                if len(found) >= limit:
                    break
    except Exception:  # a malformed pickle is still a pickle
        pass
    return found


def refuse_pickles(root: Path, *, allowed: frozenset[str] = frozenset()) -> None:
    """Raise UnsafeCheckpoint if any file under ``root`` (but ``allowed`` names) is a pickle."""
    for dirpath, _dirs, files in os.walk(root):
        for name in sorted(files):
            path = Path(dirpath) / name
            rel = path.relative_to(root).as_posix()
            if rel in allowed:
                continue
            found = pickle_globals(path)
            if found is not None:
                what = f"it would import {', '.join(found)}" if found else "it is a pickle"
                raise UnsafeCheckpoint(
                    f"refusing checkpoint {root.name}: {rel} is a pickle ({what}); loading a "
                    "checkpoint never executes code, so only safetensors and JSON are read"
                )
