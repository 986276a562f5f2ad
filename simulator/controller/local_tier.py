"""The fast local tier: complete checkpoints in host memory or on local NVMe, beside the others.

``AdaptiveCheckpointer(directory, ..., local_dir="/dev/shm/ckpt")`` also saves to a host-local
directory, which outlives a crash of the training process (the host and its ``/dev/shm`` stay)
but not the loss of the host. Its checkpoints are made by the very code that makes the
persistent ones — :func:`~simulator.controller.commit.write_and_commit` through a second
:class:`~simulator.controller.storage.LocalStorage`: temp directory, CRC-32 manifest last,
rename, no pickles — kept by the same retention rules (``local_keep_last``: 1, 2 with async
saves) and chosen at restore by the same :func:`~simulator.controller.commit.choose_checkpoint`
(a corrupt one is moved aside, one written under another configuration is refused).

Whose copy it is. Each run has an id, made once and kept in the persistent directory
(``.ckptsim-run``); the local tier of a run is ``<local_dir>/<run id>/``, and each of its
checkpoints carries the id too. So a stale ``/dev/shm`` left by another job or an earlier run
in the same ``local_dir`` is never read (it is named in a warning, never deleted), and a
checkpoint planted in this run's directory with another id is rejected. Whether that directory
was there when a session started is what the run log records as ``local_found``: the next
session's evidence of whether the previous one lost a process or its node
(:func:`simulator.controller.runlog.failures_by_class`).

The choice at restore: the newest intact checkpoint across both tiers — a local one only when
it is at least as new as the newest persistent one (at equal steps the local copy is the same
state and the quicker read, the rule of the simulator's ``tiers.rollback``). A local tier that
is gone (a wiped ``/dev/shm``, a new host) or holds only damaged checkpoints falls back to the
persistent tier with a warning; when neither tier holds an intact checkpoint but one had
checkpoints, the restore refuses (:class:`~simulator.controller.integrity.NoIntactCheckpoint`)
as it does with one tier.

Branches. A session that goes on from anything but the local tier's newest snapshot — from
the persistent tier (the host was lost, or its snapshot was damaged) or from step 0 — starts a
new branch of the run, and any local snapshot of an earlier branch is dead: restoring one
later (its host comes back, or a job of another size could not read it) would drop the work of
every session since, even when its step is the newer one. So the run's record
(:data:`RUN_ID_FILE`) also holds the current branch — a random id, and a *generation* that
counts branches for messages — renewed (by rank 0, holding the directory's lock, before this
session saves anything) whenever a session starts a new branch; every local snapshot records
the branch it was written in, and one of another branch is refused at restore as superseded
(moved aside like any refused one) whatever its step. The id is random, not the count, so a
checkpoint directory restored from a backup never gives a new branch an abandoned one's name.

Under torch.distributed each rank's checkpoints are in ``<local_dir>/<run id>/rank-<r>/`` and
a copy of another rank's beside them (:mod:`simulator.controller.local_ring`); ``{rank}`` in
``local_dir`` is replaced by the rank.

What may go wrong with the local disk never stops training: a local tier that cannot be
created (a read-only mount), is a symbolic link, or whose save fails (a full ``/dev/shm``) is
warned about, and the persistent tier carries on alone.
"""

from __future__ import annotations

import errno
import json
import os
import re
import uuid
import warnings
from pathlib import Path
from typing import NamedTuple

from simulator import ckptio
from simulator.controller.objstore import is_url
from simulator.controller.runlog import open_regular
from simulator.controller.storage import LocalStorage
from simulator.errors import InputError

__all__ = [
    "RANK_FIELD",
    "RUN_ID_FILE",
    "LocalTier",
    "RunRecord",
    "check_local_dir",
    "next_generation",
    "run_id",
    "superseded",
]

RUN_ID_FILE = ".ckptsim-run"
"""In the persistent directory: the run's id, made by its first session, and its generation."""


class RunRecord(NamedTuple):
    """What :data:`RUN_ID_FILE` holds: the run's id and the generation of its local tiers."""

    run_id: str
    generation: int
    """How many times a session went on from anything but the local tier's newest snapshot
    (the persistent tier, or step 0): said in messages."""
    branch: str = ""
    """The current branch's random id: a local snapshot counts only if written in it (module
    docstring, "Branches"). Random, not the count, so that a directory restored from a backup
    never gives a new branch the name of one it abandoned ("" in records written before)."""


_RUN_ID = re.compile(r"^[0-9a-f]{32}$")
_BRANCH = re.compile(r"^[0-9a-f]{0,32}$")
_MAX_BYTES = 4096


RANK_FIELD = "{rank}"
"""In ``local_dir``: replaced by the process's rank (one directory per rank, e.g. to give each
rank of a one-host test a "host" of its own)."""


def check_local_dir(local_dir, directory, *, remote: bool, rank: int = 0) -> Path:
    """``local_dir`` as a path (``{rank}`` replaced by ``rank``), refused in one line where it
    cannot be a tier of its own."""
    if is_url(str(local_dir)):
        raise InputError(
            f"local_dir must be a host-local path (/dev/shm/..., local NVMe), not {local_dir}"
        )
    local = Path(str(local_dir).replace(RANK_FIELD, str(int(rank))))
    if not remote:
        persistent = Path(directory).resolve()
        resolved = local.resolve()
        if resolved == persistent or persistent in resolved.parents:
            raise InputError(
                f"local_dir {local} is inside the checkpoint directory {directory}: a local tier "
                "must be a directory of its own (e.g. /dev/shm/<job>), outside it"
            )
    return local


def run_id(storage, root, *, remote: bool, create: bool) -> tuple[RunRecord | None, str | None]:
    """(the run's record, None) from the persistent directory, made there on first use when
    ``create``; (None, why) when it cannot be read or made."""
    try:
        data = _read(storage, root, remote=remote)
    except OSError as exc:
        return None, f"cannot read {RUN_ID_FILE}: {exc.strerror or exc}"
    if data is not None:
        try:
            body = json.loads(data)
            value, generation = body.get("run_id"), body.get("generation", 0)
            branch = body.get("branch", "")
        except (ValueError, AttributeError, RecursionError):
            value, generation, branch = None, None, None
        if not isinstance(value, str) or not _RUN_ID.match(value):
            return None, f"{RUN_ID_FILE} holds no valid run id (remove it to start a new one)"
        if not isinstance(generation, int) or isinstance(generation, bool) or generation < 0:
            return None, (
                f"{RUN_ID_FILE} holds no valid generation ({generation!r}); remove it to start "
                "a new one"
            )
        if not isinstance(branch, str) or not _BRANCH.match(branch):
            return None, f"{RUN_ID_FILE} holds no valid branch id; remove it to start a new one"
        return RunRecord(value, generation, branch), None
    if not create:
        return None, f"no {RUN_ID_FILE} (the directory cannot be written)"
    record = RunRecord(uuid.uuid4().hex, 0, uuid.uuid4().hex)
    why = _write_record(storage, root, record, remote=remote)
    return (None, why) if why else (record, None)


def next_generation(
    storage, root, record: RunRecord, *, remote: bool
) -> tuple[RunRecord | None, str | None]:
    """Record in the persistent directory that the run goes on from a branch of its own:
    (the new record, None), or (None, why it could not be recorded)."""
    new = RunRecord(record.run_id, record.generation + 1, uuid.uuid4().hex)
    why = _write_record(storage, root, new, remote=remote)
    return (None, why) if why else (new, None)


def superseded(saved: dict, generation: int, branch: str) -> tuple[str, str] | None:
    """Why a local snapshot whose record (``saved``: its ``generation`` and ``branch``) is not
    of the run's current ``branch`` (``("superseded", reason)``), or None. A snapshot from
    before generations were recorded counts as generation 0 of branch ""."""
    if saved.get("branch", "") == branch:
        return None
    was = saved.get("generation", 0)
    return "superseded", (
        f"written in generation {was!r} of this run, which a later session left for another "
        f"checkpoint (generation {generation} now): restoring it would drop that session's work"
    )


def _write_record(storage, root, record: RunRecord, *, remote: bool) -> str | None:
    body = json.dumps(
        {"run_id": record.run_id, "generation": record.generation, "branch": record.branch}
    )
    body = (body + "\n").encode()
    try:
        if remote:
            storage.write_bytes(RUN_ID_FILE, body)
        else:
            _write_atomically(Path(root) / RUN_ID_FILE, body)
    except OSError as exc:
        return f"cannot write {RUN_ID_FILE}: {exc.strerror or exc}"
    return None


def _read(storage, root, *, remote: bool) -> bytes | None:
    if remote:
        try:
            return storage.read_bytes(RUN_ID_FILE, _MAX_BYTES)
        except FileNotFoundError:
            return None
    try:
        fd = open_regular(Path(root) / RUN_ID_FILE, os.O_RDONLY)  # never through a symlink
    except FileNotFoundError:
        return None
    with os.fdopen(fd, "rb") as f:
        data = f.read(_MAX_BYTES + 1)
    if len(data) > _MAX_BYTES:
        raise OSError(errno.EFBIG, f"{RUN_ID_FILE} is larger than a run id")
    return data


def _write_atomically(path: Path, body: bytes) -> None:
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_NOFOLLOW, 0o644)
    try:
        os.write(fd, body)
        os.fsync(fd)
    finally:
        os.close(fd)
    os.rename(tmp, path)
    ckptio.fsync_dir(path.parent)


class LocalTier:
    """This run's local tier: ``<local_dir>/<run id>/step-NNNNNNNN``.

    Under torch.distributed (``sub="rank-<r>"``) each rank's own checkpoints are in
    ``<local_dir>/<run id>/rank-<r>/`` instead, so ranks sharing a host never collide
    (:mod:`simulator.controller.local_ring` keeps the partners' copies beside them).

    ``found``: the run's directory (the rank's, with ``sub``) was there before this session
    made it (the host kept it). ``disabled``: why this session cannot use it (None: usable).
    """

    def __init__(
        self,
        local_dir: Path,
        run: str | None,
        *,
        keep_last: int,
        why: str | None,
        sub: str | None = None,
        generation: int = 0,
        branch: str = "",
    ):
        self.base = Path(local_dir)
        self.run_id = run
        self.generation = generation
        self.branch = branch
        """The run's generation and branch (:class:`RunRecord`): what this session's
        snapshots record."""
        self.keep_last = keep_last
        self.root = self.base / (run or "no-run-id")
        self.dir = self.root / sub if sub else self.root
        self.storage = LocalStorage(self.dir)
        self.disabled = why
        self.found = False
        if why is None:
            self._open()
        if self.disabled is not None:
            warnings.warn(
                f"local tier disabled for this session: {self.disabled}; checkpoints go to the "
                "persistent tier only",
                stacklevel=4,
            )

    def _open(self) -> None:
        for path in dict.fromkeys((self.root, self.dir)):
            if path.is_symlink():
                self.disabled = f"{path} is a symlink; checkpoints are never written through one"
                return
        self.found = self.dir.is_dir()
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
        except OSError as exc:
            self.disabled = f"cannot create {self.dir}: {exc.strerror or exc}"
            return
        others = sorted(
            p.name for p in self.base.iterdir() if _RUN_ID.match(p.name) and p.name != self.run_id
        )
        if others:
            warnings.warn(
                f"local_dir {self.base} also holds the local tiers of {len(others)} other run(s) "
                f"({', '.join(others[:3])}{'...' if len(others) > 3 else ''}): never read by "
                "this run; remove them to free the space",
                stacklevel=5,
            )

    @property
    def usable(self) -> bool:
        return self.disabled is None
