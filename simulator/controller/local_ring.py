"""The local tier under torch.distributed: each rank's own snapshot, and a copy at a partner.

With :class:`~simulator.controller.distributed.DistributedBackend` and ``local_dir`` every rank
keeps its part of the state on its own host, and a second copy on another rank's host, so that
one lost host does not send the whole job back to persistent storage.

Layout, under this run's local tier (``<local_dir>/<run id>/``, :mod:`.local_tier`):

* ``rank-<r>/step-N``: rank r's own snapshot. It is written by that rank alone
  (:meth:`~simulator.controller.distributed.DistributedBackend.write_own`: DCP without the
  process group, so no tensor is deduplicated against another rank's file and the rank writes
  its own ``.metadata``): everything rank r needs to load its part is in it. A ``ring.json``
  beside DCP's files names the rank, the world size, the step and the run.
* ``copy-of-rank-<s>/step-N``: the copy this rank holds for rank s, its ring predecessor.

Both are committed by :func:`~simulator.controller.commit.write_and_commit` through a
one-writer backend (:class:`_OneWriter`): temp directory, files fsynced, CRC-32 manifest last,
rename; retention is the local tier's (``local_keep_last``).

The ring. After its own commit, each rank sends the files of that snapshot to its partner,
rank ``(r + k) % world`` (point-to-point ``isend``/``irecv`` over the backend's process group,
in bounded chunks; any backend with point-to-point sends, gloo included). ``k`` is 1, or the
number of ranks per host (torchrun's ``LOCAL_WORLD_SIZE``, the same on every rank: gathered
and compared) when the job spans several hosts of that size, so the copy lands on another
host. The receiver stages what arrives, checks each
file against the sender's manifest (size and CRC-32) and commits it. One rank: no partner, no
copy (said once in the log).

Restore. Every snapshot directory of the run that a host shows (``rank-<o>`` and
``copy-of-rank-<o>`` in the run's local tier, and in every rank's when ``local_dir`` has
``{rank}``) is checked by exactly one rank — the rank using it, else the lowest rank on that
host that sees it (:meth:`Ring._scanned`) — by the same verification as any checkpoint
(:func:`~simulator.controller.commit.choose_checkpoint`: manifest, every CRC; damaged ones
are moved aside), then its ``ring.json`` (this run, the rank its name says, this generation
and world size, the step its name says) and its DCP ``.metadata`` through the no-pickle reader
(:mod:`~simulator.controller.safe_metadata`). Whatever fails is refused, warned about and
treated as missing. The ranks then exchange these inventories (``all_gather_object``) and all
compute the same answer: the newest step of which every rank's snapshot survives somewhere. A
rank whose own directory lacks it takes it from a copy on its own host, else from the lowest
rank that holds one (its partner, unless the ranks moved hosts: c10d rendezvous may put rank 0
where rank 1 was), one move at a time in one order on every rank, and commits it in its own
directory; then every rank loads its own snapshot. When no step survives whole (a rank and its
partner both lost), or the copies were written by a job of another world size or an earlier
branch of the run (:mod:`~simulator.controller.local_tier`, "Branches"), the persistent tier
is used, with a warning that says why. Directories no rank of this job uses (left where ranks
used to be) are removed once this session's first snapshot is complete on every rank.

A rank that stops answering during an exchange (hung, or dead without its process group
noticing) fails the wait after the process group's timeout; the failure names that rank and
its host in the log at once, since the job's next collective then waits on it too.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import socket
import uuid
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.ckptio.layout import crc32, unsafe_name
from simulator.controller.commit import choose_checkpoint, reject, write_and_commit
from simulator.controller.integrity import (
    CheckpointWriteError,
    CorruptCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.local_tier import RANK_FIELD, superseded
from simulator.controller.runlog import open_regular
from simulator.controller.safe_metadata import load_metadata
from simulator.controller.shared_failure import gather_work, heard
from simulator.controller.storage import (
    LocalStorage,
    apply_retention,
    checkpoint_name,
    checkpoint_step,
)

__all__ = ["RING_FILE", "Ring", "ring_stride"]

logger = logging.getLogger("simulator.controller")


RING_FILE = "ring.json"
"""In each local snapshot of a ring: whose part it is (rank, world size, step, run)."""
_RING_FORMAT = "ckptsim-ring"
_MAX_RING_BYTES = 4096
_SNAPSHOT_DIR = re.compile(r"^(rank|copy-of-rank)-(\d+)$")
_HOST = socket.gethostname()
"""This host's name, for messages (a peer that stops answering is named with its host)."""
CHUNK_BYTES = 16 << 20
"""Bytes per point-to-point message: a shard is streamed, never held in memory whole."""


def ring_stride(world_size: int, ranks_per_host: int | None) -> int:
    """How far along the ranks a rank's partner is: the ranks per host when the job spans
    several hosts of that size (torchrun numbers a host's ranks together), else 1."""
    if ranks_per_host and 1 <= ranks_per_host < world_size and world_size % ranks_per_host == 0:
        return ranks_per_host
    return 1


def _ranks_per_host() -> int | None:
    try:
        return int(os.environ.get("LOCAL_WORLD_SIZE", ""))
    except ValueError:
        return None


class _OneWriter:
    """``write_and_commit``'s backend for a directory one rank writes alone: the commit's
    temp dir, manifest and rename are the checkpointer's, the files come from ``fill``."""

    rank = 0
    world_size = 1

    def __init__(self, fill: Callable[[Path], None]):
        self._fill = fill

    def writes_manifest(self) -> bool:
        return True

    def barrier(self) -> None:
        return None

    def write(self, tmp_dir: Path, state: Any) -> None:
        self._fill(Path(tmp_dir))


def _commit(storage: LocalStorage, step: int, fill: Callable[[Path], None]) -> None:
    write_and_commit(storage.root, storage, _OneWriter(fill), step, None, barriers=False)


def _files(path: Path) -> dict[str, list[int]]:
    """A committed checkpoint's files, ``name -> [bytes, crc32]``, from its manifest."""
    manifest = ckptio.read_manifest(path)
    return {n: [e["bytes"], e["crc32"]] for n, e in sorted(manifest["files"].items())}


def _pieces(files: dict[str, list[int]]) -> list[tuple[str, int, int]]:
    out = []
    for name in sorted(files):
        size = files[name][0]
        out += [(name, off, min(CHUNK_BYTES, size - off)) for off in range(0, size, CHUNK_BYTES)]
    return out


class Ring:
    """This rank's place in the ring: its own local tier, the copy it holds, the exchanges."""

    def __init__(self, backend, tier, *, run_id: str | None, local_dir: str | None = None):
        import torch.distributed as dist

        self.backend = backend
        self.tier = tier  # its storage is this rank's own directory
        self.run_id = run_id
        self.strays: list[Path] = []
        """Snapshot directories this rank found at restore that no rank of the job uses."""
        self.clean_pending = False
        """Some rank found strays: removed once a snapshot of this session is complete."""
        self.rank, self.world = backend.rank, backend.world_size
        self.group = backend.group
        # Collective: every rank must pick the same stride, or the sends never meet their
        # receives. Hosts that run different numbers of ranks (torchrun --nproc-per-node 2 on
        # one, 1 on another) each read their own LOCAL_WORLD_SIZE: then the next rank it is.
        everyone = self.gather((_ranks_per_host(), _HOST))
        per_host = [n for n, _ in everyone]
        self.hosts = [h for _, h in everyone]
        """Each rank's host name, for messages."""
        agreed = per_host[0] if len(set(per_host)) == 1 else None
        if len(set(per_host)) > 1 and self.rank == 0:
            logger.warning(
                "local tier: the hosts run different numbers of ranks (LOCAL_WORLD_SIZE %s), "
                "so each rank's copy goes to the next rank, which may share its host",
                per_host,
            )
        self.stride = ring_stride(self.world, agreed)
        self.partner = (self.rank + self.stride) % self.world if self.world > 1 else None
        """The rank that holds this rank's copy (None: one rank, no partner)."""
        self.source = (self.rank - self.stride) % self.world if self.world > 1 else None
        """The rank whose copy this rank holds."""
        self.held: LocalStorage | None = None
        self.held_disabled: str | None = None
        # Collective: each rank's own directory for the copy it holds, its failure raised on
        # every rank (no rank left in a later collective), and every rank's tier.
        self.tiers: list[tuple[bool, str | None]] = self.gather_work(
            self._open_held, "opening the directory of the copy it holds"
        )
        """Each rank's ``(found, disabled)``: whether its local tier was there, why it is off."""
        template = str(local_dir) if local_dir is not None else None
        if template is not None and RANK_FIELD in template:
            bases = [Path(template.replace(RANK_FIELD, str(o))) for o in range(self.world)]
            self.roots = list(dict.fromkeys(b / tier.root.name for b in bases))
        else:
            self.roots = [tier.root]
        """Where this run's snapshots may be on a host: the run's local tier, or every rank's
        when ``local_dir`` has ``{rank}`` (ranks may land on each other's hosts)."""
        backend_name = str(dist.get_backend(self.group)) if self.world > 1 else "gloo"
        self.device = "cuda" if backend_name == "nccl" else "cpu"
        self.excluded: set[int] = set()
        self.retried: set[int] = set()
        """Steps whose own snapshot on some rank failed to load and was moved aside: tried
        once more, from the partners' copies."""
        self.plan: dict | None = None
        self.from_partners: list[int] = []
        self.refused: list[str] = []
        """At the last :meth:`agree`: every rank's copies refused as damaged (moved aside)."""
        self.notes: list[str] = []
        """At the last :meth:`agree`: what else kept a local snapshot from being used."""

    def _open_held(self) -> tuple[bool, str | None]:
        tier = self.tier
        if self.world == 1:
            logger.info("local tier: one rank, so no partner holds a copy of its snapshot")
        elif tier.usable:
            held = tier.root / f"copy-of-rank-{self.source}"
            try:
                if held.is_symlink():
                    self.held_disabled = f"{held} is a symlink"
                else:
                    held.mkdir(parents=True, exist_ok=True)
                    self.held = LocalStorage(held)
            except OSError as exc:
                self.held_disabled = f"cannot create {held}: {exc.strerror or exc}"
        else:
            self.held_disabled = tier.disabled
        return tier.found, tier.disabled

    # -- collectives ------------------------------------------------------------------------
    def gather(self, obj) -> list:
        """Collective: ``obj`` of every rank, in rank order (the backend's all-gather)."""
        return self.backend.all_gather(obj)

    def gather_work(self, work: Callable[[], Any], doing: str) -> list:
        """Collective: ``work()`` on every rank, every rank's result in rank order, a failure
        on any rank raised on every rank
        (:func:`~simulator.controller.shared_failure.gather_work`)."""
        return gather_work(self.gather, work, doing, self.rank)

    def _exchange(
        self,
        send_to: int | None,
        out_dir: Path | None,
        out_files: dict,
        recv_from: int | None,
        in_files: dict,
        into: Path | None,
    ) -> str | None:
        """Stream ``out_files`` of ``out_dir`` to ``send_to`` while receiving ``in_files`` from
        ``recv_from`` into the fresh directory ``into``; returns why what arrived is unusable
        (None: every file arrived with its sender's size and CRC-32).

        Both ends know both file lists (from a gather), so they post the same messages; nothing
        here raises before the last message, which would leave a partner waiting.
        """
        import torch
        import torch.distributed as dist

        out_p = _pieces(out_files) if send_to is not None else []
        in_p = _pieces(in_files) if recv_from is not None else []
        problem = None
        fds: dict[str, int] = {}
        crcs = dict.fromkeys(in_files, 0)
        if recv_from is not None and into is None:
            problem = "no directory to stage it in"
        elif recv_from is not None:
            try:
                fds = _staging(into, in_files)
            except OSError as exc:
                problem = f"cannot stage it in {into}: {exc.strerror or exc}"
        sending: dict[str, int | None] = {}  # name -> open fd (None: unreadable)
        outgoing = torch.empty(max((n for *_, n in out_p), default=0), dtype=torch.uint8)
        try:
            for i in range(max(len(out_p), len(in_p))):
                works, buf = [], None
                if i < len(out_p):
                    name, off, n = out_p[i]
                    if name not in sending:
                        try:
                            sending[name] = os.open(out_dir / name, os.O_RDONLY | os.O_NOFOLLOW)
                        except OSError:
                            sending[name] = None
                    data = outgoing[:n]  # each send is waited for before the next fills it
                    got = 0
                    if sending[name] is not None:
                        try:
                            got = os.preadv(sending[name], [data.numpy()], off)
                        except OSError:
                            got = 0
                    if got < n:
                        data[got:] = 0  # the receiver's CRC check refuses what is missing
                    data = data.to(self.device)
                    works.append(dist.isend(data, group=self.group, group_dst=send_to))
                if i < len(in_p):
                    buf = torch.empty(in_p[i][2], dtype=torch.uint8, device=self.device)
                    works.append(dist.irecv(buf, group=self.group, group_src=recv_from))
                for work in works:
                    try:
                        work.wait()
                    except RuntimeError as exc:  # gloo/NCCL: a timeout, a peer gone
                        raise CheckpointWriteError(
                            self._stalled(send_to if i < len(out_p) else None,
                                          recv_from if i < len(in_p) else None, exc)
                        ) from None  # fmt: skip
                if buf is not None and problem is None:
                    name, off, _n = in_p[i]
                    view = buf.cpu().numpy()
                    crcs[name] = crc32(view, crcs[name])
                    try:
                        os.pwrite(fds[name], view, off)
                    except OSError as exc:
                        problem = f"cannot write it in {into}: {exc.strerror or exc}"
        finally:
            for fd in [*fds.values(), *sending.values()]:
                if fd is not None:
                    os.close(fd)
        if recv_from is None:
            return None
        if problem is None:
            for name, (_size, crc) in sorted(in_files.items()):
                if crcs[name] != crc:
                    problem = (
                        f"{name} arrived with CRC-32 {crcs[name]:#010x}, its sender's manifest "
                        f"says {crc:#010x}"
                    )
                    break
        if problem is not None and into is not None:
            _remove(into)
        return problem

    def _stalled(self, send_to: int | None, recv_from: int | None, exc: BaseException) -> str:
        peers = sorted({p for p in (send_to, recv_from) if p is not None})
        who = ", ".join(f"rank {p} on {self.hosts[p]}" for p in peers)
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        message = (
            f"the local tier's exchange of snapshots with {who} did not complete ({first}); "
            "a rank that stopped answering (hung or dead) holds up the ring, and the job's next "
            "collective will wait on it too"
        )
        logger.error("local tier: rank %d: %s", self.rank, message)  # said before that wait
        return message

    # -- saving -----------------------------------------------------------------------------
    def save(self, step: int, state: dict) -> str | None:
        """Collective: commit this rank's snapshot of ``step``, send it to the partner and
        commit the copy received from the source. Raises this rank's own failure (after the
        exchange, so no partner waits); returns why the copy held for the source failed."""
        name = checkpoint_name(step)
        own_error: BaseException | None = None
        header = None
        if self.tier.usable:
            try:
                _commit(self.tier.storage, step, lambda tmp: self._write_own(tmp, step, state))
                header = {"step": step, "files": _files(self.tier.storage.path(name))}
            except BaseException as exc:  # an interrupt too: raised after the gather below
                own_error = exc
        else:
            own_error = CheckpointWriteError(self.tier.disabled)
        copy_problem = None
        if self.world > 1:
            headers = self.gather(header)
            failed = [r for r, h in enumerate(headers) if h is None or h.get("step") != step]
            if failed:
                # One outcome for all ranks (a snapshot some rank lacks restores nothing), so
                # every rank's schedule stays the same; no copies are sent.
                if own_error is not None:
                    raise heard(own_error)  # every rank knows it from the gather
                raise CheckpointWriteError(
                    f"rank(s) {failed} could not write their local snapshot of step {step}"
                )
            incoming = headers[self.source]
            into = self.held.path(f".tmp-recv-{name}") if self.held is not None else None
            copy_problem = self._exchange(
                self.partner, self.tier.storage.path(name), header["files"],
                self.source, incoming["files"], into,
            )  # fmt: skip
            if into is None:
                copy_problem = f"no directory for it ({self.held_disabled})"
            if copy_problem is None:
                try:
                    _commit(self.held, step, lambda tmp: _move_files(into, tmp))
                    apply_retention(self.held, keep_last=self.tier.keep_last)
                except Exception as exc:
                    copy_problem = str(exc)
                finally:
                    _remove(into)
            if copy_problem is not None:
                copy_problem = (
                    f"the copy of rank {self.source}'s local snapshot of step {step} was not "
                    f"kept: {copy_problem}"
                )
        if own_error is not None:  # one rank (no gather above), or a late interrupt
            raise own_error
        if self.clean_pending:  # every rank reaches this together (a collective)
            if all(self.gather(copy_problem is None)):
                self.clean_strays()
                self.clean_pending = False
        return copy_problem

    def _write_own(self, tmp: Path, step: int, state: dict) -> None:
        self.backend.write_own(tmp, state)
        body = {
            "format": _RING_FORMAT,
            "rank": self.rank,
            "world_size": self.world,
            "step": step,
            "run_id": self.run_id,
            "generation": self.tier.generation,
            "branch": self.tier.branch,
        }
        (tmp / RING_FILE).write_text(json.dumps(body) + "\n", encoding="utf-8")

    # -- restoring --------------------------------------------------------------------------
    def agree(self) -> int | None:
        """Collective: every rank's inventory of the snapshots its host holds, and the newest
        step every rank can load from the local tiers (not excluded); the plan is kept for
        :meth:`fetch`. Every rank gets the notes of every rank (what was refused, what was
        lost)."""
        self.from_partners = []
        scanned = self._scanned()

        def inventory() -> dict:
            refused: list[str] = []
            notes: list[str] = []
            holdings = []
            for path, owner in scanned:
                try:
                    steps = self._intact(LocalStorage(path), owner, refused, notes)
                except Exception as exc:  # an unreadable disk: nothing of it counts
                    notes.append(f"rank {self.rank} cannot read {path} ({exc})")
                    continue
                if steps:
                    own = path == self.tier.dir
                    holdings.append({"owner": owner, "path": str(path), "own": own, "steps": steps})
            return {"holds": holdings, "refused": refused, "notes": notes}

        everyone = self.gather_work(inventory, "reading its local tier")
        self.refused = [line for inv in everyone for line in inv["refused"]]
        self.notes = [line for inv in everyone for line in inv["notes"]]
        found: dict[int, dict[int, list]] = {}  # step -> owner -> [(holder, path, own, files)]
        for holder, inv in enumerate(everyone):
            for h in inv["holds"]:
                for step, files in h["steps"].items():
                    found.setdefault(step, {}).setdefault(h["owner"], []).append(
                        (holder, h["path"], h["own"], files)
                    )
        chosen = None
        for step in sorted(set(found) - self.excluded, reverse=True):
            if len(found[step]) == self.world:
                chosen = step
                break
        newest = max(found, default=None)
        if newest is not None and newest not in self.excluded and chosen != newest:
            lost = [r for r in range(self.world) if r not in found[newest]]
            self.notes.append(
                f"step {newest}: the local snapshot of rank(s) {lost} survives on no host"
            )
        self.plan = None
        if chosen is not None:
            self.plan = {"step": chosen, "moves": self._moves(found[chosen])}
        return chosen

    def _moves(self, holders: dict[int, list]) -> list[tuple[int, int, str, dict]]:
        """``(to, from, path, files)`` for each rank whose own directory lacks the step: taken
        from a copy on its own host when there is one, else from the lowest rank holding it
        (its partner, unless the ranks moved hosts)."""
        moves = []
        for r in range(self.world):
            here = [x for x in holders[r] if x[0] == r]
            if any(own for _h, _p, own, _f in here):
                continue
            h, p, _own, f = here[0] if here else min(holders[r], key=lambda x: (x[0], x[1]))
            moves.append((r, h, p, f))
        return moves

    def fetch(self) -> str | None:
        """Collective: every rank without its own snapshot of the agreed step takes it from
        where it survives (a copy on its host, or a rank that holds one, streamed) and commits
        it in its own directory. The moves run one at a time in one order on every rank, so
        every send meets its receive. Returns why this rank failed (None: it holds its
        snapshot now)."""
        step = self.plan["step"]
        moves = self.plan["moves"]
        self.from_partners = [to for to, *_ in moves]
        name = checkpoint_name(step)
        mine = None
        for to, src, path, files in moves:
            if self.rank not in (to, src):
                continue
            into = self.tier.storage.path(f".tmp-recv-{name}") if to == self.rank else None
            if to == self.rank and not self.tier.usable:
                into = None
            if src == to:
                problem = _copy_checked(Path(path) / name, files, into)
            else:
                problem = self._exchange(
                    to if src == self.rank else None,
                    Path(path) / name if src == self.rank else None,
                    files if src == self.rank else {},
                    src if to == self.rank else None,
                    files if to == self.rank else {},
                    into,
                )
            if to != self.rank:
                continue
            if into is None:
                problem = f"its local tier is unusable ({self.tier.disabled})"
            elif problem is None:
                try:
                    _commit(self.tier.storage, step, lambda tmp, got=into: _move_files(got, tmp))
                except Exception as exc:
                    problem = str(exc)
                finally:
                    _remove(into)
            where = "its host" if src == to else f"rank {src}"
            if problem is not None:
                mine = f"rank {self.rank} could not take its snapshot from {where}: {problem}"
            else:
                logger.info(
                    "local tier: rank %d took its snapshot of step %d from %s (%s)",
                    self.rank, step, where, path,
                )  # fmt: skip
        return mine

    def _scanned(self) -> list[tuple[Path, int]]:
        """Collective: the snapshot directories this rank vets, with whose they are. Every
        directory of this run a rank's host shows it (``rank-<o>``, ``copy-of-rank-<o>`` in
        the run's local tier, and in every rank's when ``local_dir`` has ``{rank}``) is vetted
        by exactly one rank: its own or held directory by the rank using it, any other by the
        lowest rank on the host that sees it. Those others (left by a job whose ranks sat
        elsewhere) are the strays, removed after this session's first complete snapshot."""
        gathered = self.gather_work(self._listing, "listing its local tier")
        listing = gathered[self.rank][0]
        everyone = [entries for entries, _ in gathered]
        scanner: dict[tuple, int] = {}
        for r, entries in enumerate(everyone):
            for key, _path, _owner, used in entries:
                if used:
                    scanner[key] = r
                else:
                    scanner.setdefault(key, r)
        in_use = {key for entries in everyone for key, _p, _o, used in entries if used}
        # A rank that could not name a directory may use one that the others see unused:
        # then nothing is a stray this session.
        self.clean_pending = len(scanner) > len(in_use) and not any(b for _, b in gathered)
        mine = [(Path(p), o) for key, p, o, _u in listing if scanner[key] == self.rank]
        self.strays = [
            Path(p) for key, p, _o, _u in listing if scanner[key] == self.rank and key not in in_use
        ] if self.clean_pending else []  # fmt: skip
        return [(p, o) for p, o in mine if o < self.world]

    def _listing(self) -> tuple[list[tuple[tuple, str, int, bool]], bool]:
        """``(key, path, owner, used)`` of every snapshot directory of this run on this
        host: ``key`` names the directory alike on every rank that sees it (its root's id
        and its name), ``used`` says it is this rank's own or held one; and whether some
        root could not be named (:func:`_root_id`)."""
        if not self.tier.usable:
            return [], False
        used = {self.tier.dir} | ({self.held.root} if self.held is not None else set())
        out, blind = [], False
        for root in self.roots:
            if root.is_symlink() or not root.is_dir():
                continue
            rid = _root_id(root)
            blind = blind or rid is None
            if rid is None:
                # Another rank may see this directory and use what is in it, under a name this
                # rank cannot know: only this rank's own entries are listed, under a key of
                # this rank alone, so none is vetted twice or taken for a stray.
                logger.warning(
                    "local tier: rank %d cannot read or make %s (not a regular file): the "
                    "snapshot directories there that it does not use are neither read nor "
                    "removed; remove it to let the next restore name the directory",
                    self.rank, root / _ROOT_ID,
                )  # fmt: skip
            for entry in sorted(root.iterdir()):
                m = _SNAPSHOT_DIR.match(entry.name)
                if m is None or entry.is_symlink() or not entry.is_dir():
                    continue
                if rid is None and entry not in used:
                    continue
                key = (rid if rid is not None else f"rank {self.rank}: {root}", entry.name)
                out.append((key, str(entry), int(m[2]), entry in used))
        return out, blind

    def clean_strays(self) -> None:
        """Remove the snapshot directories no rank of this job uses (:meth:`_scanned`), once
        this job's own snapshots are complete everywhere (the caller's to know)."""
        for path in self.strays:
            if _remove(path):
                logger.info("local tier: removed %s, which no rank of this job uses", path)
        self.strays = []

    def _intact(self, storage: LocalStorage, owner: int, refused: list, notes: list) -> dict:
        """``{step: files}`` of the checkpoints in ``storage`` that verify and are ``owner``'s
        part of this run at this world size; a line on each of the others in ``refused``
        (damaged or not this rank's: moved aside) or ``notes`` (another world size)."""
        found: dict[int, dict] = {}
        if not self.tier.usable:
            return found
        seen: set[str] = set()
        what = "own snapshot" if owner == self.rank else f"copy of rank {owner}"
        while True:
            name, rejected = choose_checkpoint(
                storage.root, storage, None, tidy=True, skip=frozenset(seen)
            )
            seen |= set(rejected)
            for line in rejected.values():
                refused.append(self._refused(what, line))
            if name is None:
                return found
            seen.add(name)
            path = storage.path(name)
            verdict = self._vet(path, owner, checkpoint_step(name))
            if verdict is None:
                found[checkpoint_step(name)] = _files(path)
            elif verdict[0] == "world":
                notes.append(f"rank {self.rank}'s {what} {name}: {verdict[1]}")
            else:
                refused.append(self._refused(what, reject(storage, name, *verdict)))

    def _refused(self, what: str, line: str) -> str:
        line = f"rank {self.rank}'s {what}: {line}; treated as missing"
        warnings.warn(f"local tier: {line}", stacklevel=11)  # at the call of restore()
        return line

    def _vet(self, path: Path, owner: int, step: int) -> tuple[str, str] | None:
        """Why the verified checkpoint at ``path`` is not ``owner``'s snapshot of ``step`` in
        this run and world (``(why, reason)``), or None."""
        try:
            ring = _read_ring_file(path)
        except CorruptCheckpoint as exc:
            return "corrupt", str(exc)
        if ring.get("run_id") != self.run_id:
            return "foreign", f"it belongs to run {ring.get('run_id')!r}, not to {self.run_id}"
        stale = superseded(ring, self.tier.generation, self.tier.branch)
        if stale is not None:
            return stale
        if ring.get("world_size") != self.world:
            return "world", (
                f"written by a job of {ring.get('world_size')!r} ranks, this one has "
                f"{self.world}: a snapshot loads only into the layout that wrote it"
            )
        if ring.get("rank") != owner:
            return "misplaced", f"it is rank {ring.get('rank')!r}'s, not rank {owner}'s"
        if ring.get("step") != step:
            return "misnamed", f"it holds step {ring.get('step')!r}, its name says {step}"
        try:
            load_metadata(path)
        except UnsafeCheckpoint as exc:
            return "unsafe", str(exc)
        except CorruptCheckpoint as exc:
            return "corrupt", str(exc)
        return None


def _read_ring_file(path: Path) -> dict:
    try:
        body = json.loads(LocalStorage(path).read_bytes(RING_FILE, _MAX_RING_BYTES))
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: no {RING_FILE} (not a ring snapshot)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{path.name}: unreadable {RING_FILE} ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != _RING_FORMAT:
        raise CorruptCheckpoint(f"{path.name}: {RING_FILE} is not a ckptsim ring record")
    return body


_ROOT_ID = ".ckptsim-root"
"""In each run directory of a local tier: a random id, so that ranks that see one directory
(on one host, or through a file system shared by mistake) name it alike, and ranks that see
two directories of one path (one per host) do not. Where it cannot be read, a rank lists only
the directories it uses there: what else is in it is neither vetted nor removed."""


def _root_id(root: Path) -> str | None:
    """The id of the run directory ``root``, made (atomically: a link, never overwritten) by
    the first rank to ask; None where it can be neither read nor made (``.ckptsim-root`` is no
    regular file, empty, or the directory takes no link): then ranks that see the directory
    cannot know that they see the same one."""
    path = root / _ROOT_ID
    for _ in range(2):
        try:  # a regular file only: never through a symlink, never waiting on a FIFO
            fd = open_regular(path, os.O_RDONLY | os.O_CLOEXEC)
        except FileNotFoundError:
            fd = None
        except OSError:
            return None
        if fd is not None:
            try:
                value = os.read(fd, 64).decode("ascii", "replace").strip()
            except OSError:
                return None
            finally:
                os.close(fd)
            if value:
                return value
        tmp = root / f"{_ROOT_ID}.tmp-{os.getpid()}-{uuid.uuid4().hex[:8]}"
        try:
            tmp.write_text(uuid.uuid4().hex + "\n", encoding="ascii")
            os.link(tmp, path)  # fails if another rank made it first: read that one
        except FileExistsError:
            pass
        except OSError:
            return None
        finally:
            tmp.unlink(missing_ok=True)
    return None


def _copy_checked(src: Path, files: dict, into: Path | None) -> str | None:
    """Copy the snapshot ``files`` of ``src`` into the fresh directory ``into``, each checked
    against its manifest's size and CRC-32 as it is read; returns why it failed (None: it did).
    """
    if into is None:
        return "no directory to stage it in"
    fds: dict[str, int] = {}
    try:
        fds = _staging(into, files)
        for name, (size, crc) in sorted(files.items()):
            got, n = 0, 0
            src_fd = os.open(src / name, os.O_RDONLY | os.O_NOFOLLOW)
            try:
                while chunk := os.read(src_fd, min(CHUNK_BYTES, size + 1 - n)):
                    got, n = crc32(chunk, got), n + len(chunk)
                    if n > size:
                        break
                    os.write(fds[name], chunk)
            finally:
                os.close(src_fd)
            if (n, got) != (size, crc):
                raise OSError(f"{name} does not match its manifest (size or CRC-32)")
    except OSError as exc:
        for fd in fds.values():
            os.close(fd)
        _remove(into)
        return f"cannot copy it from {src}: {exc.strerror or exc}"
    for fd in fds.values():
        os.close(fd)
    return None


def _staging(into: Path, files) -> dict[str, int]:
    """A fresh directory ``into`` with an empty file opened for writing for each of ``files``
    (names checked to be plain checkpoint file names), as ``name -> fd``."""
    for name in files:
        if "/" in name or unsafe_name(name) is not None:
            raise OSError(f"{name!r} is no file name of a checkpoint")
    if into.exists() or into.is_symlink():
        _remove(into)
    into.mkdir(parents=True)
    fds = {}
    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
    try:
        for name in files:
            fds[name] = os.open(into / name, flags, 0o644)
    except OSError:
        for fd in fds.values():
            os.close(fd)
        raise
    return fds


def _move_files(src: Path, dst: Path) -> None:
    for entry in sorted(os.listdir(src)):
        os.rename(src / entry, dst / entry)


def _remove(path: Path | None) -> bool:
    """Best effort, never raising: a leftover is only space (a staging directory is made afresh
    each time), and a rank raising here alone would leave its partners in a collective.
    Returns whether ``path`` is gone."""
    if path is None:
        return True
    try:
        if path.is_dir() and not path.is_symlink():
            shutil.rmtree(path, ignore_errors=True)
        else:
            path.unlink(missing_ok=True)
        return not (path.exists() or path.is_symlink())
    except OSError as exc:
        logger.warning("local tier: cannot remove %s (%s)", path, exc.strerror or exc)
        return False
