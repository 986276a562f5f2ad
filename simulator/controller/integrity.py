"""When a checkpoint counts, and what it may not contain.

A checkpoint directory is complete only when its manifest exists, and intact only when every
file it holds is listed with its size and CRC-32 (and is a regular file inside it): the format
of :mod:`simulator.ckptio`, which writes and verifies the single-process checkpoints itself.
:func:`write_manifest` produces the same manifest over files that another writer
(torch.distributed) put into a temporary directory, so every checkpoint verifies the same way.

Pickles can run arbitrary code when loaded, so a checkpoint that carries one is refused
outright: any file that is a pickle by content (every protocol, a torch.save archive), whatever
its name. The refusal reads opcodes (``pickletools``) without executing them. It is defence in
depth: what keeps loading safe is that nothing in a checkpoint is ever unpickled except DCP's
``.metadata``, and that only through :mod:`simulator.controller.safe_metadata`; the CRC-32
checksums catch torn and bit-rotten files, not a hostile writer, who can recompute them.
"""

from __future__ import annotations

import json
import os
import pickletools
from pathlib import Path

from simulator import ckptio
from simulator.ckptio import CheckpointReadError, CheckpointWriteError, CorruptCheckpoint
from simulator.errors import InputError

__all__ = [
    "CheckpointLocked",
    "CheckpointReadError",
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "IncompatibleCheckpoint",
    "NoIntactCheckpoint",
    "UnsafeCheckpoint",
    "pickle_globals",
    "refuse_pickles",
    "write_manifest",
]


class UnsafeCheckpoint(Exception):
    """A checkpoint carries a pickle, whose loading could execute code; it is refused."""


class IncompatibleCheckpoint(InputError):
    """The checkpoint was written by a run with a different configuration or model."""


class NoIntactCheckpoint(InputError):
    """The directory holds checkpoints, but none can be resumed from; each was moved aside."""


class CheckpointLocked(InputError):
    """Another live process (named by pid and host) has the checkpoint directory open."""


_VERIFIED: set[tuple] = set()
"""Checkpoints whose checksums this process verified, by :func:`_fingerprint`."""


def _fingerprint(folder: Path) -> tuple:
    """The folder and every file under it, by name, size, modification and change times and
    inode: an edit in place changes the file's times, not the folder's (a byte flipped after a
    check is caught), and resetting the modification time changes the change time. What it
    cannot see is what the checksums exist for: a byte that rots in place changes no time, so
    only a checkpoint verified in this very process is trusted, never one from an earlier one.
    """
    files = []
    for top, dirs, names in os.walk(folder):
        dirs.sort()
        for name in sorted(names):
            st = os.lstat(os.path.join(top, name))
            files.append((os.path.relpath(os.path.join(top, name), folder), st.st_size,
                          st.st_mtime_ns, st.st_ctime_ns, st.st_ino))  # fmt: skip
    return (str(Path(folder).resolve()), tuple(files))


def verify_once(folder: Path) -> None:
    """``ckptio.verify_checkpoint``, skipped for a checkpoint this process verified before
    and that no file has changed since: a resume's choice (``latest_checkpoint``, a restore)
    and the check that follows it in the same launch read a checkpoint of hundreds of GB
    once, not twice. Raises what ``verify_checkpoint`` raises."""
    key = _fingerprint(folder)
    if key in _VERIFIED:
        return
    ckptio.verify_checkpoint(folder)
    _VERIFIED.add(key)


def write_manifest(root: Path) -> dict:
    """Checksum every file under ``root`` into a ckptio manifest, written last and fsynced.

    For backends whose files the checkpointer did not write through :mod:`simulator.ckptio`
    (torch.distributed checkpoints): the result reads and verifies like any ckptio checkpoint.
    Per-rank marker files (``.rank-<r>.ok``) are left out, as readers allow. A DCP checkpoint
    (one with ``.metadata``) also records how many ranks wrote it, so a reader requires each
    rank's data file. A symlink or a non-regular file under ``root`` is a
    :class:`CheckpointWriteError`: no reader would accept the checkpoint.
    """
    for stale in root.glob(f".{ckptio.MANIFEST}.tmp-*"):  # a seal a kill cut short
        if stale.is_file() and not stale.is_symlink():
            stale.unlink()
    try:
        found = ckptio.checkpoint_files(root)
    except CorruptCheckpoint as exc:
        raise CheckpointWriteError(f"cannot seal checkpoint: {exc}") from None
    files = {}
    for rel in sorted(found):
        if ckptio.may_be_unlisted(rel):
            continue
        path = root / rel
        ckptio.fsync_file(path)
        files[rel] = {"bytes": path.stat().st_size, "crc32": ckptio.file_crc32(path)}
    for directory in sorted({(root / rel).parent for rel in files}, reverse=True):
        ckptio.fsync_dir(directory)
    manifest = {
        "format": ckptio.FORMAT,
        "version": ckptio.VERSION,
        "checksum": "crc32",
        "files": files,
        "bytes": sum(f["bytes"] for f in files.values()),
    }
    if ckptio.DCP_METADATA in files:
        done = sum(1 for rel in found if rel.startswith(".rank-") and rel.endswith(".ok"))
        manifest["ranks"] = max(done, 1)
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
# How much of a file is read to tell whether it is a pickle: a real one is refused long before
# its end, and a 10 GB file with no newline is never read whole (protocol 0 reads lines).
_SCAN_BYTES = 1 << 20


def pickle_globals(path: str | os.PathLike, limit: int = 5) -> list[str] | None:
    """The names a pickle file mentions, read statically; None when it is no pickle.

    Judged by content, whatever the file is called: a zip (a torch.save archive), a protocol 2-5
    header, or any file whose first MiB reads as pickle opcodes (protocols 0 and 1 have no
    header) up to STOP or up to the cut. The names are for the message; a crafted pickle can
    hide what it calls from a static read. What keeps loading safe is that the controller
    never unpickles a checkpoint file except DCP's ``.metadata``, and that one only through
    :mod:`simulator.controller.safe_metadata`; this check refuses the obvious cases loudly.
    """
    path = Path(path)
    with open(path, "rb") as f:
        head = f.read(_SCAN_BYTES)
        cut = bool(f.read(1))
    if head.startswith(_ZIP):
        return ["(torch.save archive)"]
    found: list[str] = []
    strings: list[str] = []
    try:
        for op, arg, _pos in pickletools.genops(head):
            if op.name in ("SHORT_BINUNICODE", "BINUNICODE", "UNICODE"):
                strings.append(str(arg))
            elif op.name in ("GLOBAL", "INST"):
                found.append(str(arg).replace(" ", "."))
            elif op.name == "STACK_GLOBAL" and len(strings) >= 2:
                found.append(f"{strings[-2]}.{strings[-1]}")
            if len(found) >= limit:
                break
    except ValueError as exc:  # pickletools' word for "not (all) pickle opcodes"
        if head[:2] in _PICKLE_PROTOCOLS:
            return found  # a malformed pickle is still a pickle
        if not (cut and "unknown" not in str(exc)):
            return None  # not a pickle, unless the stream only ran into the cut
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
                what = f"it names {', '.join(found)}" if found else "by its content"
                raise UnsafeCheckpoint(
                    f"refusing checkpoint {root.name}: {rel} is a pickle ({what}); loading a "
                    "checkpoint never executes code, so only safetensors and JSON are read"
                )
