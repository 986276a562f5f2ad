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

Restore. Every rank checks what it holds — its own snapshots and the copies it keeps — by the
same verification as any checkpoint (:func:`~simulator.controller.commit.choose_checkpoint`:
manifest, every CRC; damaged ones are moved aside), then its ``ring.json`` (this run, the rank
it should be, this world size, the step its name says) and its DCP ``.metadata`` through the
no-pickle reader (:mod:`~simulator.controller.safe_metadata`). Whatever fails is refused,
warned about and treated as missing. The ranks then exchange these inventories
(``all_gather_object``) and all compute the same answer: the newest step of which every rank's
snapshot survives somewhere (its own, or its partner's copy). A rank whose own copy is missing
receives it from the partner (committed into its own directory again), then every rank loads
its own snapshot. When no step survives whole (a rank and its partner both lost), or the
copies were written by a job of another world size, the persistent tier is used, with a
warning that says why.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
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
from simulator.controller.safe_metadata import load_metadata
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

    def __init__(self, backend, tier, *, run_id: str | None):
        import torch.distributed as dist

        self.backend = backend
        self.tier = tier  # its storage is this rank's own directory
        self.run_id = run_id
        self.rank, self.world = backend.rank, backend.world_size
        self.group = backend.group
        # Collective: every rank must pick the same stride, or the sends never meet their
        # receives. Hosts that run different numbers of ranks (torchrun --nproc-per-node 2 on
        # one, 1 on another) each read their own LOCAL_WORLD_SIZE: then the next rank it is.
        per_host = self.gather(_ranks_per_host())
        agreed = per_host[0] if len(set(per_host)) == 1 else None
        if agreed is None:
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
        if self.world == 1:
            logger.info("local tier: one rank, so no partner holds a copy of its snapshot")
        elif tier.usable:
            held = tier.root / f"copy-of-rank-{self.source}"
            if held.is_symlink():
                self.held_disabled = f"{held} is a symlink"
            else:
                try:
                    held.mkdir(parents=True, exist_ok=True)
                    self.held = LocalStorage(held)
                except OSError as exc:
                    self.held_disabled = f"cannot create {held}: {exc.strerror or exc}"
        else:
            self.held_disabled = tier.disabled
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

    # -- collectives ------------------------------------------------------------------------
    def gather(self, obj) -> list:
        """Collective: ``obj`` of every rank, in rank order."""
        import torch.distributed as dist

        if self.world == 1:
            return [obj]
        out: list = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

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
                for name in in_files:
                    if "/" in name or unsafe_name(name) is not None:
                        raise OSError(f"{name!r} is no file name of a checkpoint")
                if into.exists() or into.is_symlink():
                    _remove(into)
                into.mkdir(parents=True)
                for name in in_files:
                    flags = os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW
                    fds[name] = os.open(into / name, flags, 0o644)
            except OSError as exc:
                problem = f"cannot stage it in {into}: {exc.strerror or exc}"
        try:
            for i in range(max(len(out_p), len(in_p))):
                works, buf = [], None
                if i < len(out_p):
                    name, off, n = out_p[i]
                    data = torch.zeros(n, dtype=torch.uint8)
                    try:
                        with open(out_dir / name, "rb") as f:
                            f.seek(off)
                            f.readinto(data.numpy())
                    except OSError:
                        pass  # zeros go out; the receiver's CRC check refuses them
                    data = data.to(self.device)
                    works.append(dist.isend(data, group=self.group, group_dst=send_to))
                if i < len(in_p):
                    buf = torch.empty(in_p[i][2], dtype=torch.uint8, device=self.device)
                    works.append(dist.irecv(buf, group=self.group, group_src=recv_from))
                for work in works:
                    work.wait()
                if buf is not None and problem is None:
                    name, off, _n = in_p[i]
                    view = buf.cpu().numpy()
                    crcs[name] = crc32(view, crcs[name])
                    try:
                        os.pwrite(fds[name], view, off)
                    except OSError as exc:
                        problem = f"cannot write it in {into}: {exc.strerror or exc}"
        finally:
            for fd in fds.values():
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
            except Exception as exc:
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
                raise own_error or CheckpointWriteError(
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
        if own_error is not None:
            raise own_error
        return copy_problem

    def _write_own(self, tmp: Path, step: int, state: dict) -> None:
        self.backend.write_own(tmp, state)
        body = {
            "format": _RING_FORMAT,
            "rank": self.rank,
            "world_size": self.world,
            "step": step,
            "run_id": self.run_id,
        }
        (tmp / RING_FILE).write_text(json.dumps(body) + "\n", encoding="utf-8")

    # -- restoring --------------------------------------------------------------------------
    def agree(self) -> int | None:
        """Collective: every rank's inventory, and the newest step every rank can load from
        the local tiers (not excluded); the plan is kept for :meth:`fetch`. Rank 0 gets the
        notes of every rank (what was refused, what was lost)."""
        self.from_partners = []
        refused: list[str] = []
        notes: list[str] = []
        own, held = {}, {}
        try:
            own = self._intact(self.tier.storage, self.rank, refused, notes)
            if self.held is not None:
                held = self._intact(self.held, self.source, refused, notes)
        except Exception as exc:  # an unreadable disk: nothing of it counts, and no rank waits
            notes.append(f"rank {self.rank}'s local tier cannot be read ({exc})")
        everyone = self.gather({"own": own, "held": held, "refused": refused, "notes": notes})
        holder = {r: (r + self.stride) % self.world for r in range(self.world)}

        def survives(step: int, r: int) -> bool:
            return step in everyone[r]["own"] or (
                self.world > 1 and step in everyone[holder[r]]["held"]
            )

        steps = set()
        for inv in everyone:
            steps |= set(inv["own"]) | set(inv["held"])
        self.refused = [line for inv in everyone for line in inv["refused"]]
        self.notes = [line for inv in everyone for line in inv["notes"]]
        chosen = None
        for step in sorted(steps - self.excluded, reverse=True):
            if all(survives(step, r) for r in range(self.world)):
                chosen = step
                break
        newest = max(steps, default=None)
        if newest is not None and newest not in self.excluded and chosen != newest:
            lost = [r for r in range(self.world) if not survives(newest, r)]
            self.notes.append(
                f"step {newest}: the local snapshot of rank(s) {lost} survives neither on its "
                "host nor at its partner"
            )
        self.plan = None
        if chosen is not None:
            self.plan = {
                "step": chosen,
                "needs": [r for r in range(self.world) if chosen not in everyone[r]["own"]],
                "files": {
                    r: everyone[holder[r]]["held"][chosen]
                    for r in range(self.world)
                    if chosen not in everyone[r]["own"]
                },
            }
        return chosen

    def fetch(self) -> str | None:
        """Collective: every rank without its own snapshot of the agreed step receives it from
        its partner and commits it in its own directory. Returns why this rank failed (None:
        it holds its snapshot now)."""
        plan = self.plan
        step, needs = plan["step"], plan["needs"]
        self.from_partners = list(needs)
        if not needs:
            return None
        name = checkpoint_name(step)
        target = self.source if self.world > 1 else None  # the rank this one holds a copy for
        send_to = target if target in needs else None
        recv_from = self.partner if self.rank in needs else None
        into = self.tier.storage.path(f".tmp-recv-{name}") if self.tier.usable else None
        problem = self._exchange(
            send_to,
            self.held.path(name) if send_to is not None else None,
            plan["files"][send_to] if send_to is not None else {},
            recv_from,
            plan["files"][self.rank] if recv_from is not None else {},
            into,
        )
        if recv_from is None:
            return None
        if into is None:
            return f"its local tier is unusable ({self.tier.disabled})"
        if problem is None:
            try:
                _commit(self.tier.storage, step, lambda tmp: _move_files(into, tmp))
            except Exception as exc:
                problem = str(exc)
            finally:
                _remove(into)
        if problem is not None:
            return f"rank {self.rank} could not take its snapshot from rank {recv_from}: {problem}"
        logger.info(
            "local tier: rank %d took its snapshot of step %d from rank %d's copy",
            self.rank,
            step,
            recv_from,
        )
        return None

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
        warnings.warn(f"local tier: {line}", stacklevel=5)
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
    file = path / RING_FILE
    try:
        if os.lstat(file).st_size > _MAX_RING_BYTES:
            raise CorruptCheckpoint(f"{path.name}: {RING_FILE} is larger than it can be")
        body = json.loads(file.read_bytes())
    except FileNotFoundError:
        raise CorruptCheckpoint(f"{path.name}: no {RING_FILE} (not a ring snapshot)") from None
    except (OSError, ValueError, RecursionError) as exc:
        raise CorruptCheckpoint(f"{path.name}: unreadable {RING_FILE} ({exc})") from None
    if not isinstance(body, dict) or body.get("format") != _RING_FORMAT:
        raise CorruptCheckpoint(f"{path.name}: {RING_FILE} is not a ckptsim ring record")
    return body


def _move_files(src: Path, dst: Path) -> None:
    for entry in sorted(os.listdir(src)):
        os.rename(src / entry, dst / entry)


def _remove(path: Path | None) -> None:
    if path is None:
        return
    if path.is_dir() and not path.is_symlink():
        shutil.rmtree(path, ignore_errors=True)
    else:
        try:
            path.unlink()
        except FileNotFoundError:
            pass
