"""How a checkpoint becomes the one to resume from: the commit of a save, the choice at restore.

A save commits only complete checkpoints. Through a backend that writes atomically itself
(:class:`~simulator.controller.backend.LocalBackend`, a :mod:`simulator.ckptio` directory)
the step directory appears whole or not at all: the storage's ``commit`` hands it the final
path on a disk, or a local staging path whose files an object store then uploads, manifest
last (:mod:`simulator.controller.objstore`). Through one that does not (torch.distributed),
every rank writes into one hidden temp directory on shared storage (never through a symlink
planted at its name) and leaves a marker saying how it went; rank 0 commits — ckptio manifest
last, rename, fsync — only when every rank succeeded. The markers, not a collective, carry the
outcome, so the same code runs in the background thread of an asynchronous save. Re-saving an
existing step moves the old one aside first and drops it only once the new one is complete.

At restore, rank 0 — holding the directory's lock, so no other writer's files are in flight —
first tidies what crashed processes left (temp directories of unfinished writes, deletions
that retention began: :func:`simulator.controller.storage.finish_deletions`, a re-save cut
short), then walks the checkpoints newest first, verifying each through the storage's
``local_copy`` (the directory itself, or an object store's download checked against its
manifest). A checkpoint is never deleted here: one that is a symbolic link is ignored, and on
an object store a name without a manifest (an upload cut short) is no checkpoint at all; one
without a manifest on a disk, one that fails its checksums and one
whose state holds another step than its name says are each rejected and moved aside as
``step-N.rejected-<why>`` (:func:`reject`), kept for a person to inspect or rescue and never
counted or reused. The first that verifies is the choice — unless it was written under a
different configuration, which is refused in one line naming every differing key (keys declared
ignorable may differ) rather than silently resumed. The
rejections are returned, so the checkpointer can refuse to start afresh over them.
"""

from __future__ import annotations

import json
import time
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.controller.backend import Backend
from simulator.controller.integrity import (
    CheckpointWriteError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    verify_once,
    write_manifest,
)
from simulator.controller.storage import (
    CheckpointStorage,
    Storage,
    checkpoint_name,
    checkpoint_step,
    finish_deletions,
)
from simulator.errors import InputError

__all__ = [
    "check_config",
    "choose_checkpoint",
    "misnamed",
    "normalise_config",
    "reject",
    "rejected_aside",
    "write_and_commit",
]

_OLD = ".old-"
REJECTED = ".rejected-"
"""Infix of a checkpoint moved aside by a restore: ``step-N.rejected-<why>``."""
_MARKER_WAIT_S = 3600.0


def normalise_config(config: Mapping[str, Any] | None) -> dict | None:
    """The configuration as the checkpoint will hold it (a JSON round trip)."""
    if config is None:
        return None
    try:
        return json.loads(json.dumps(dict(config), sort_keys=True))
    except (TypeError, ValueError) as exc:
        raise InputError(f"config must be a JSON-serialisable dict: {exc}") from None


def check_config(
    where: Path | str, saved: Any, current: dict | None, *, ignore: tuple[str, ...] = ()
) -> None:
    """Refuse, in one line naming every differing key, a checkpoint of another configuration.

    Keys in ``ignore`` may differ between launches (``ignore_config_keys``). Nested dicts are
    compared leaf by leaf under dotted names (``data.path``); ignoring a name ignores every
    key under it too. A key that itself contains a dot is matched by the same dotted name.
    """
    if current is None or not isinstance(saved, dict) or saved == current:
        return
    old, new = _leaves(saved), _leaves(current)
    differ = [
        key
        for key in sorted(set(old) | set(new))
        if old.get(key, _ABSENT) != new.get(key, _ABSENT)
        and not any(key == k or key.startswith(k + ".") for k in ignore)
    ]
    if not differ:
        return
    shown = "; ".join(
        f"{k}={_shown(old.get(k, _ABSENT))} in the checkpoint, {_shown(new.get(k, _ABSENT))} "
        "in this run"
        for k in differ
    )
    allow = ", ".join(repr(k) for k in (*ignore, *differ))
    raise IncompatibleCheckpoint(
        f"refusing to resume from {where}: it was written with a different configuration "
        f"({shown}); if these keys may differ between launches, pass "
        f"ignore_config_keys=({allow},), else use the same configuration or a new directory"
    )


_ABSENT = object()


def _shown(value: Any) -> str:
    return "<absent>" if value is _ABSENT else repr(value)


def _leaves(config: dict, prefix: str = "") -> dict[str, Any]:
    """``{"a": {"b": 1}}`` as ``{"a.b": 1}``; an empty dict stays a leaf."""
    out: dict[str, Any] = {}
    for key, value in config.items():
        name = f"{prefix}{key}"
        if isinstance(value, dict) and value:
            out.update(_leaves(value, name + "."))
        else:
            out[name] = value
    return out


def write_and_commit(
    root: Path,
    storage: CheckpointStorage,
    backend: Backend,
    step: int,
    state: dict,
    *,
    barriers: bool,
) -> None:
    """Write ``state`` as ``step-N`` under ``root``; it exists complete or not at all."""
    name = checkpoint_name(step)
    rank0 = backend.rank == 0
    if rank0 and storage.exists(name) and not storage.unfinished(name):
        storage.rename(name, _OLD + name)  # (an unfinished upload is replaced, not kept)
    try:
        if backend.writes_manifest():
            _write_through_temp(root, storage, backend, name, state, barriers=barriers)
        else:
            storage.commit(name, lambda path: backend.write(path, state))
    except BaseException:
        if rank0:
            # A backend that failed half-way at the final path leaves no half checkpoint.
            if storage.exists(name) and not storage.is_complete(name):
                storage.remove(name)
            if storage.exists(_OLD + name):
                storage.rename(_OLD + name, name)
        raise
    if rank0:
        storage.remove(_OLD + name)


def _write_through_temp(
    root: Path, storage: Storage, backend: Backend, name: str, state: dict, *, barriers: bool
) -> None:
    tmp_name = f".tmp-{name}"
    tmp = root / tmp_name
    tmp.mkdir(parents=True, exist_ok=True)
    if tmp.is_symlink():
        # mkdir(exist_ok) accepts a link to a directory: every rank would write there, outside
        # the root, and the commit would rename the link into a step-N that no restore uses.
        raise CheckpointWriteError(
            f"{tmp} is a symlink; a checkpoint is never written through one: remove it"
        )
    rank, world = backend.rank, backend.world_size
    try:
        backend.write(tmp, state)
        (tmp / f".rank-{rank}.ok").touch()
    except BaseException:
        (tmp / f".rank-{rank}.failed").touch()
        raise
    finally:
        if barriers:
            backend.barrier()
    if rank != 0:
        return
    try:
        deadline = time.monotonic() + _MARKER_WAIT_S
        while True:
            failed = sorted(p.name for p in tmp.glob(".rank-*.failed"))
            if failed:
                raise CheckpointWriteError(f"{failed[0][1:-7]} failed to write {name}")
            if len(list(tmp.glob(".rank-*.ok"))) >= world:
                break
            if time.monotonic() > deadline:
                raise CheckpointWriteError(f"not every rank finished writing {name} in 1 h")
            time.sleep(0.05)
        write_manifest(tmp)
        storage.rename(tmp_name, name)
        storage.sync()
    except BaseException:
        storage.remove(tmp_name)
        raise


def reject(storage: Storage, name: str, why: str, reason: str, *, move: bool = True) -> str:
    """Move checkpoint ``name`` aside as ``name.rejected-<why>``; returns a one-line report.

    The checkpoint is never deleted: a person may still rescue it (rename it back). With
    ``move=False`` (a read-only directory) it stays where it is, only reported.
    """
    reason = reason.removeprefix(f"{name}: ")  # a reason that names it already
    if not move:
        return f"{name}: {reason}"
    target, n = f"{name}{REJECTED}{why}", 1
    while storage.exists(target) or storage.is_symlink(target):
        target, n = f"{name}{REJECTED}{why}-{n}", n + 1
    try:
        storage.rename(name, target)
        storage.sync()
    except OSError as exc:
        warnings.warn(f"could not move rejected {name} aside: {exc}", stacklevel=3)
        return f"{name}: {reason}"
    return f"{name}: {reason} (moved aside to {target})"


def rejected_aside(storage: Storage, step_of=checkpoint_step) -> list[str]:
    """Checkpoints an earlier restore moved aside (``step-N.rejected-*``; ``step_of`` reads a
    checkpoint's step from its name, None for any other name: the HF adapter's
    ``checkpoint-N``)."""
    return [
        n for n in storage.list() if REJECTED in n and step_of(n.split(REJECTED, 1)[0]) is not None
    ]


def _recover_resaves(storage: Storage) -> None:
    for entry in storage.list():
        if entry.startswith(_OLD + "step-"):
            # A crash while re-saving an existing step: the old one is still the good one.
            original = entry[len(_OLD) :]
            if storage.exists(original) and storage.exists(f"{original}/{ckptio.MANIFEST}"):
                storage.remove(entry)
            else:
                if storage.exists(original) or storage.is_symlink(original):
                    reject(storage, original, "incomplete", "a re-save cut short")
                if not (storage.exists(original) or storage.is_symlink(original)):
                    storage.rename(entry, original)


def choose_checkpoint(
    root: Path | str,
    storage: CheckpointStorage,
    config: dict | None,
    *,
    tidy: bool = True,
    skip: frozenset[str] = frozenset(),
    ignore: tuple[str, ...] = (),
    checksums_at_load: bool = False,
) -> tuple[str | None, dict[str, str]]:
    """Rank 0: the newest checkpoint that verifies and fits ``config`` (None when none does),
    and the checkpoints rejected on the way (name: a one-line report).

    ``tidy``: this process holds the directory's lock, so it may clean up and move rejected
    checkpoints aside; without it (a read-only directory) nothing is written. ``skip``: names
    rejected earlier in this restore that could not be moved. ``ignore``: configuration keys that
    may differ. ``checksums_at_load``: the caller loads the choice with
    ``ckptio.read_checkpoint(verify=True)``, which checks every CRC-32 in the one pass that
    loads it (a mismatch then rejects it there), so only the structure and ``meta.json``'s
    CRC (read here) are checked now: a restore reads the checkpoint once, not twice.
    """
    if tidy:
        storage.remove_unfinished()
        finish_deletions(storage)
        _recover_resaves(storage)
    names = sorted(
        (n for n in storage.list() if checkpoint_step(n) is not None and n not in skip),
        key=checkpoint_step,
        reverse=True,
    )
    rejected: dict[str, str] = {}
    for name in names:
        if storage.is_symlink(name):
            rejected[name] = (
                f"{name} is a symlink (a symbolic link), ignored: a checkpoint must be a directory "
                f"in {storage.describe()}"
            )
            continue
        if storage.unfinished(name):
            continue  # an object store's upload (or deletion) cut short: never a checkpoint
        if not storage.exists(f"{name}/{ckptio.MANIFEST}"):
            # A backend that writes in place was killed mid-write (retention's deletions no
            # longer leave such directories): kept, since what is in it is the user's.
            rejected[name] = reject(
                storage, name, "incomplete", "no manifest (never completed)", move=tidy
            )
            continue
        try:
            local = storage.local_copy(name)
            if checksums_at_load:
                ckptio.verify_structure(local)
            else:
                verify_once(local)
            # Read once, checked on the bytes parsed (never re-opened by name after a check,
            # which a file swapped in between, a FIFO or a symlink, would have defeated).
            # None: a distributed checkpoint, whose step and config are checked once read.
            meta = ckptio.read_meta(local)
        except CorruptCheckpoint as exc:
            rejected[name] = reject(storage, name, "corrupt", str(exc), move=tidy)
            continue
        if isinstance(meta, dict):
            mismatch = misnamed(name, meta.get("step"))
            if mismatch is not None:
                rejected[name] = reject(storage, name, "misnamed", mismatch, move=tidy)
                continue
        saved = meta.get("config") if isinstance(meta, dict) else None
        check_config(storage.describe(name), saved, config, ignore=ignore)
        return name, rejected
    return None, rejected


def misnamed(name: str, step: Any) -> str | None:
    """Why checkpoint ``name`` cannot be trusted to hold ``step`` (the state's own), or None.

    A copy named ``step-00000090`` that holds step 30 would win every restore, and retention
    would then delete the newer checkpoints: name and content must agree.
    """
    expected = checkpoint_step(name)
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return None  # not a step at all: check_state rejects the malformed state, saying so
    if step == expected:
        return None
    return f"its state holds step {step!r}, its name says {expected}"
