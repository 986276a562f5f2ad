"""Where checkpoints live, which of them to keep, and how the others go without a trace.

A checkpoint root holds ``step-NNNNNNNN/`` directories, each complete only once its
manifest exists (:mod:`simulator.ckptio` writes it last, before the atomic rename), plus
hidden ``.tmp-`` directories being written, the run log and the lock file
(:mod:`simulator.controller.lock`). The checkpointer touches the root only through the small
:class:`Storage` protocol, so the retention rules below are tested against an in-memory fake
(:class:`MemoryStorage`, which can also be told to fail) as well as on a real disk
(:class:`LocalStorage`, which fsyncs what it renames so a rename survives a power cut).

The root is the user's data, so what retention may touch is narrow:

- Retention keeps the newest ``keep_last`` complete checkpoints, every milestone, and the
  checkpoint the run resumed from until a newer one is complete; it never deletes anything
  while no newer complete checkpoint exists, so a failed write can never leave the root empty.
- Only real directories count: a ``step-N`` that is a symbolic link (or whose manifest is one)
  is neither counted nor deleted, so retention can never reach through a link into another
  run's checkpoints. Deleting a real directory never follows a link inside it either.
- A deletion is crash-safe and resumable: the checkpoint is renamed whole to
  ``.deleting-step-N`` (one atomic rename, then the root is fsynced) and only then removed.
  A crash leaves either the intact checkpoint or a ``.deleting-`` entry that no reader counts
  and that the next retention or restore (:func:`finish_deletions`) removes, so the
  keep-last bound holds across any number of kills.
- In a directory that could not be locked (a file system without ``flock``) retention counts
  and deletes only the checkpoints this process wrote, and tidies nothing else.
- Checkpoints that a restore rejected are moved aside as ``step-N.rejected-<why>``
  (:mod:`simulator.controller.commit`); no name but ``step-N`` is ever counted or deleted.

The checkpointer needs a little more than retention does: a :class:`CheckpointStorage` also
commits a checkpoint (``commit``), hands out a local directory to verify and read one
(``local_copy``) and tidies unfinished writes. :class:`LocalStorage` does all of it in place;
:class:`simulator.controller.objstore.FsspecStorage` does it on an object store
(``s3://...``, ``memory://...``), which has no rename: there ``atomic_rename`` is False, a
checkpoint is uploaded in place with its manifest last, and a deletion removes the manifest
first (see that module for what "rename" and "one writer" mean there).
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from simulator import ckptio

__all__ = [
    "MANIFEST",
    "CheckpointStorage",
    "LocalStorage",
    "MemoryStorage",
    "SimulatedCrash",
    "Storage",
    "apply_retention",
    "checkpoint_name",
    "checkpoint_step",
    "complete_names",
    "complete_steps",
    "delete_checkpoint",
    "finish_deletions",
    "retention_plan",
]

MANIFEST = ckptio.MANIFEST
DELETING = ".deleting-"
"""Prefix of a checkpoint being deleted: renamed aside whole first, never left half-deleted."""
_NAME = re.compile(r"^step-(\d+)$")


def checkpoint_name(step: int) -> str:
    """The directory name of the checkpoint taken after ``step`` steps."""
    return f"step-{int(step):08d}"


def checkpoint_step(name: str) -> int | None:
    """The step of a checkpoint directory name, or None for anything else."""
    m = _NAME.match(name)
    return int(m.group(1)) if m else None


@runtime_checkable
class Storage(Protocol):
    """The few operations on a checkpoint root that atomicity and retention need.

    Names are relative to the root, ``/``-separated (``step-00000010/manifest.json``).
    """

    def list(self) -> list[str]:
        """Entry names directly under the root."""
        ...

    def exists(self, name: str) -> bool: ...

    def is_symlink(self, name: str) -> bool:
        """Whether ``name`` itself is a symbolic link (never followed by retention)."""
        ...

    def remove(self, name: str) -> None:
        """Remove a file or a whole directory, never following a symbolic link (a link is
        removed itself); no error when it does not exist."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename; fails when ``dst`` exists."""
        ...

    def sync(self, name: str = "") -> None:
        """Make ``name`` (a file or directory; the root by default) durable."""
        ...


@runtime_checkable
class CheckpointStorage(Storage, Protocol):
    """A :class:`Storage` the checkpointer can write checkpoints to and read them from.

    ``atomic_rename``: ``rename`` is one atomic step (a file system). Where it is not (an
    object store), a deletion is :meth:`Storage.remove`, which must drop the manifest first,
    and a name without a manifest is an unfinished write, never a damaged checkpoint.
    """

    atomic_rename: bool
    is_local: bool

    def describe(self, name: str = "") -> str:
        """``name`` (the root by default) as the user would write it, for messages."""
        ...

    def commit(self, name: str, write: Callable[[Path], None]) -> None:
        """Make checkpoint ``name`` from ``write(path)``, which creates a complete
        :mod:`simulator.ckptio` checkpoint directory at a new local ``path``; it appears
        complete (manifest last) or not at all."""
        ...

    def is_complete(self, name: str) -> bool:
        """Whether ``name`` passes the cheap structural checks (no checksums read)."""
        ...

    def unfinished(self, name: str) -> bool:
        """Whether ``name`` is a write cut short (never counted, never reported as damage)."""
        ...

    def remove_unfinished(self) -> list:
        """Remove what crashed writes left; only while no other writer can be at work."""
        ...

    def local_copy(self, name: str) -> Path:
        """A local directory holding checkpoint ``name``, to verify and read."""
        ...

    def drop_local_copies(self) -> None: ...

    def read_bytes(self, name: str, limit: int) -> bytes:
        """A small file's bytes (at most ``limit``; ``OSError`` when larger or unreadable)."""
        ...


class LocalStorage:
    """A checkpoint root on a local or shared POSIX file system."""

    atomic_rename = True
    is_local = True

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def describe(self, name: str = "") -> str:
        return str(self.path(name))

    def commit(self, name: str, write: Callable[[Path], None]) -> None:
        write(self.path(name))  # ckptio writes a temp sibling and renames it: atomic here

    def is_complete(self, name: str) -> bool:
        return ckptio.is_complete(self.path(name))

    def unfinished(self, name: str) -> bool:
        return False  # unfinished writes are hidden temp directories, never named step-N

    def remove_unfinished(self) -> list:
        return ckptio.remove_stale_temps(self.root)

    def local_copy(self, name: str) -> Path:
        return self.path(name)

    def drop_local_copies(self) -> None:
        pass

    def read_bytes(self, name: str, limit: int) -> bytes:
        with open(self.path(name), "rb") as f:
            data = f.read(limit + 1)
        if len(data) > limit:
            raise OSError(f"{self.path(name)} is larger than {limit} bytes")
        return data

    def path(self, name: str = "") -> Path:
        return self.root / name if name else self.root

    def list(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []

    def exists(self, name: str) -> bool:
        return self.path(name).exists()

    def is_symlink(self, name: str) -> bool:
        return self.path(name).is_symlink()

    def remove(self, name: str) -> None:
        p = self.path(name)
        if p.is_dir() and not p.is_symlink():
            # rmtree unlinks the links it meets inside (its fd-based walk never follows one).
            shutil.rmtree(p, ignore_errors=False)
        else:
            p.unlink(missing_ok=True)

    def rename(self, src: str, dst: str) -> None:
        d = self.path(dst)
        if d.exists():
            raise FileExistsError(f"cannot rename {src} to {dst}: {d} exists")
        os.rename(self.path(src), d)

    def sync(self, name: str = "") -> None:
        ckptio.fsync_file(self.path(name))  # O_RDONLY: works on directories too

    def __repr__(self) -> str:
        return f"LocalStorage({str(self.root)!r})"


class SimulatedCrash(BaseException):
    """Raised by :class:`MemoryStorage` in place of a process dying between two operations."""


@dataclass
class MemoryStorage:
    """An in-memory fake of a checkpoint root, for tests of retention and failure handling.

    ``files`` holds every file path; directories exist implicitly; ``links`` names the
    entries that are symbolic links. ``fail_on`` maps an operation name (``remove``,
    ``rename``, ``sync``) to an exception to raise once. ``crash_after``: how many of those
    operations succeed before :class:`SimulatedCrash` stops the caller, as a kill would.
    """

    atomic_rename = True

    files: set[str] = field(default_factory=set)
    links: set[str] = field(default_factory=set)
    ops: list[tuple[str, ...]] = field(default_factory=list)
    fail_on: dict[str, BaseException] = field(default_factory=dict)
    crash_after: int | None = None

    def _maybe_fail(self, op: str) -> None:
        if self.crash_after is not None:
            if self.crash_after <= 0:
                raise SimulatedCrash(op)
            self.crash_after -= 1
        exc = self.fail_on.pop(op, None)
        if exc is not None:
            raise exc

    def add_checkpoint(self, step: int, *, complete: bool = True) -> str:
        name = checkpoint_name(step)
        self.files.add(f"{name}/tensors.safetensors")
        if complete:
            self.files.add(f"{name}/{MANIFEST}")
        return name

    def list(self) -> list[str]:
        return sorted({f.split("/", 1)[0] for f in self.files})

    def exists(self, name: str) -> bool:
        return any(f == name or f.startswith(name + "/") for f in self.files)

    def is_symlink(self, name: str) -> bool:
        return name in self.links

    def remove(self, name: str) -> None:
        self._maybe_fail("remove")
        self.ops.append(("remove", name))
        self.files = {f for f in self.files if not (f == name or f.startswith(name + "/"))}

    def rename(self, src: str, dst: str) -> None:
        self._maybe_fail("rename")
        if self.exists(dst):
            raise FileExistsError(dst)
        self.ops.append(("rename", src, dst))
        moved = {f for f in self.files if f == src or f.startswith(src + "/")}
        self.files = (self.files - moved) | {dst + f[len(src) :] for f in moved}

    def sync(self, name: str = "") -> None:
        self._maybe_fail("sync")
        self.ops.append(("sync", name))


def complete_steps(storage: Storage) -> list[int]:
    """Steps of the checkpoints that carry a manifest, oldest first (intact or not).

    Symbolic links are no checkpoints of this root: neither a linked ``step-N`` nor a linked
    manifest counts, so nothing is ever kept or deleted on their account.
    """
    return sorted(complete_names(storage))


def complete_names(storage: Storage) -> dict[int, list[str]]:
    """Step -> the names of its complete checkpoints: usually one ``step-NNNNNNNN``, but a
    person's rescue may have named it by hand (``step-10``), and retention must delete it by
    the name it has."""
    names: dict[int, list[str]] = {}
    for name in storage.list():
        step = checkpoint_step(name)
        manifest = f"{name}/{MANIFEST}"
        if (
            step is not None
            and not storage.is_symlink(name)
            and storage.exists(manifest)
            and not storage.is_symlink(manifest)
        ):
            names.setdefault(step, []).append(name)
    return names


def retention_plan(
    complete: Iterable[int],
    *,
    keep_last: int,
    milestones: Iterable[int] = (),
    resumed_from: int | None = None,
) -> list[int]:
    """Steps of the complete checkpoints to delete, oldest first.

    Keeps the newest ``keep_last``, every milestone step, and ``resumed_from`` unless a newer
    complete checkpoint exists (it was the only good state the run knew of).
    """
    if keep_last < 1:
        raise ValueError(f"keep_last must be at least 1, got {keep_last!r}")
    steps = sorted(set(complete))
    keep = set(steps[-keep_last:]) | set(milestones)
    if resumed_from is not None and not any(s > resumed_from for s in steps):
        keep.add(resumed_from)
    return [s for s in steps if s not in keep]


def apply_retention(
    storage: Storage,
    *,
    keep_last: int,
    milestones: Iterable[int] = (),
    resumed_from: int | None = None,
    among: Iterable[int] | None = None,
) -> list[int]:
    """Delete what :func:`retention_plan` says; returns the deleted steps.

    Deletions an earlier process left half-done are finished first. Call only while holding
    the directory's lock (:mod:`simulator.controller.lock`), or pass ``among``: the steps this
    process wrote itself into a directory it could not lock. Only those are then counted and
    deleted, and nothing else is tidied: the rest may be another writer's, or ones a restore
    rejected but could not move aside, which would otherwise count as the newest.
    """
    if among is None:
        finish_deletions(storage)
    names = complete_names(storage)
    complete = sorted(names) if among is None else sorted(set(names) & set(among))
    doomed = retention_plan(
        complete,
        keep_last=keep_last,
        milestones=milestones,
        resumed_from=resumed_from,
    )
    for step in doomed:
        for name in names[step]:
            delete_checkpoint(storage, name)
    return doomed


def delete_checkpoint(storage: Storage, name: str) -> None:
    """Delete checkpoint ``name`` so that a crash at any point leaves it whole or marked.

    The rename is atomic and made durable before anything inside is removed: after a crash
    (or a power cut) the root holds either the intact checkpoint or ``.deleting-<name>``,
    which nothing counts and :func:`finish_deletions` removes. A store without an atomic
    rename (an object store) removes the manifest first instead: from that one request on the
    checkpoint no longer counts, and what a crash leaves is an unfinished write.
    """
    if not getattr(storage, "atomic_rename", True):
        storage.remove(name)
        return
    aside = DELETING + name
    if storage.exists(aside) or storage.is_symlink(aside):
        storage.remove(aside)  # an earlier deletion of a checkpoint of the same name
    storage.rename(name, aside)
    storage.sync()
    storage.remove(aside)


def finish_deletions(storage: Storage) -> list[str]:
    """Remove what interrupted deletions left (``.deleting-*``); returns those entries."""
    done = [entry for entry in storage.list() if entry.startswith(DELETING)]
    for entry in done:
        storage.remove(entry)
    return done
