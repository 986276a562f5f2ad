"""Where checkpoints live, and which of them to keep.

A checkpoint root holds ``step-NNNNNNNN/`` directories, each complete only once its
manifest exists (:mod:`simulator.ckptio` writes it last, before the atomic rename), plus
hidden ``.tmp-`` directories being written and the run log. The checkpointer touches the root only
through the small :class:`Storage` protocol, so the retention rules below are tested against an
in-memory fake (:class:`MemoryStorage`, which can also be told to fail) as well as on a real disk
(:class:`LocalStorage`, which fsyncs what it renames so a rename survives a power cut).

Retention keeps the newest ``keep_last`` complete checkpoints, every milestone, and the
checkpoint the run resumed from until a newer one is complete; it never deletes anything while
no newer complete checkpoint exists, so a failed write can never leave the root empty.
"""

from __future__ import annotations

import os
import re
import shutil
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol, runtime_checkable

from simulator import ckptio

__all__ = [
    "MANIFEST",
    "LocalStorage",
    "MemoryStorage",
    "Storage",
    "apply_retention",
    "checkpoint_name",
    "checkpoint_step",
    "complete_steps",
    "retention_plan",
]

MANIFEST = ckptio.MANIFEST
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

    def remove(self, name: str) -> None:
        """Remove a file or a whole directory; no error when it does not exist."""
        ...

    def rename(self, src: str, dst: str) -> None:
        """Atomically rename; fails when ``dst`` exists."""
        ...

    def sync(self, name: str = "") -> None:
        """Make ``name`` (a file or directory; the root by default) durable."""
        ...


class LocalStorage:
    """A checkpoint root on a local or shared POSIX file system."""

    def __init__(self, root: str | os.PathLike):
        self.root = Path(root)

    def path(self, name: str = "") -> Path:
        return self.root / name if name else self.root

    def list(self) -> list[str]:
        try:
            return sorted(os.listdir(self.root))
        except FileNotFoundError:
            return []

    def exists(self, name: str) -> bool:
        return self.path(name).exists()

    def remove(self, name: str) -> None:
        p = self.path(name)
        if p.is_dir() and not p.is_symlink():
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


@dataclass
class MemoryStorage:
    """An in-memory fake of a checkpoint root, for tests of retention and failure handling.

    ``files`` holds every file path; directories exist implicitly. ``fail_on`` maps an
    operation name (``remove``, ``rename``, ``sync``) to an exception to raise once.
    """

    files: set[str] = field(default_factory=set)
    ops: list[tuple[str, ...]] = field(default_factory=list)
    fail_on: dict[str, BaseException] = field(default_factory=dict)

    def _maybe_fail(self, op: str) -> None:
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
    """Steps of the checkpoints that carry a manifest, oldest first (intact or not)."""
    steps = []
    for name in storage.list():
        step = checkpoint_step(name)
        if step is not None and storage.exists(f"{name}/{MANIFEST}"):
            steps.append(step)
    return sorted(steps)


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
) -> list[int]:
    """Delete what :func:`retention_plan` says; returns the deleted steps."""
    doomed = retention_plan(
        complete_steps(storage),
        keep_last=keep_last,
        milestones=milestones,
        resumed_from=resumed_from,
    )
    for step in doomed:
        name = checkpoint_name(step)
        # Drop the manifest first: if the removal is interrupted, what is left no longer
        # looks complete and restore will not pick a half-deleted checkpoint.
        storage.remove(f"{name}/{MANIFEST}")
        storage.remove(name)
    return doomed
