"""torch.distributed backend: many ranks, one checkpoint, written through Distributed Checkpoint.

Under torch.distributed every rank holds part of the state (a shard of an FSDP model, its own RNG
stream, its own position in the data), and a checkpoint is complete only when every rank's part
is on storage. :class:`DistributedBackend` fills the controller's ``Backend`` seam for that case:

* decisions are made on rank 0 and sent to the others with ``broadcast_object_list``; the
  checkpointer broadcasts the next due step only when it saves, so ranks agree on the save step
  without a collective on every training step;
* state is written with torch.distributed.checkpoint (DCP): every rank writes its own file into
  the same directory and rank 0 writes DCP's ``.metadata`` after all ranks finished (files are
  fsynced). Tensors that are not sharded are deduplicated (one rank writes them);
* values that differ per rank (RNG states, data position, ``extra`` values such as a prefetched
  batch: ``per_rank_keys``) would be lost to that deduplication, so they are stored under a
  per-rank namespace and each rank reads back its own;
* loading never executes code: DCP would pickle non-tensor values and unpickle them with
  ``weights_only=False``, so they are stored as JSON strings instead (read back with
  ``weights_only=True``), and ``.metadata`` (a pickle by design) is read by
  :mod:`simulator.controller.safe_metadata`: exact DCP metadata classes only, every opcode
  checked, and the result's shape too;
* a raw ``optimizer.state_dict()`` keyed by int comes back with its int keys (DCP turns keys
  into strings); ``model_state_dict``/``load_model_state_dict`` offer torch's
  ``get_state_dict``/``set_state_dict`` (FQN keys, DDP/FSDP wrappers) for sharded models.

* for the local tier, :meth:`DistributedBackend.write_own` writes one rank's part alone
  (DCP with ``no_dist``: nothing deduplicated, its own ``.metadata``) and
  :meth:`DistributedBackend.read_own` reads it back, with the same refusals
  (:mod:`simulator.controller.local_ring` keeps these snapshots and their partners' copies).

The checkpointer owns atomicity around this (temp dir, per-rank markers, manifest, rename).
"""

from __future__ import annotations

import json
import warnings
from collections.abc import Mapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import torch

from simulator import ckptio
from simulator.controller.safe_metadata import load_metadata
from simulator.controller.shared_failure import gather_work, heard, what
from simulator.errors import InputError

__all__ = ["PER_RANK_KEY", "DistributedBackend"]

PER_RANK_KEY = "__per_rank__"
"""Top-level key under which each rank's own values are stored, as ``{"rank<r>": {...}}``."""


# -- no pickles: leaves as JSON, metadata through an allow-list ---------------------------------
# DCP stores every non-tensor leaf with torch.save and reads it back with
# torch.load(weights_only=False), and its .metadata is a plain pickle: loading would execute
# whatever a tampered checkpoint holds. The controller's rule is that loading never executes
# code, so leaves are stored as JSON strings (the controller's own tagged encoding, which
# keeps tuples, bytes and NumPy arrays), read back with weights_only=True, and .metadata is
# read by simulator.controller.safe_metadata.
_JSON_MARK = "\x00ckptsim-json:"


def _is_leaf(obj) -> bool:
    if isinstance(obj, Mapping):
        return False
    if isinstance(obj, list):
        return not any(isinstance(v, torch.Tensor | Mapping | list) for v in obj)
    return not isinstance(obj, torch.Tensor)


def _encode(obj):
    from simulator.controller.state import flatten

    if isinstance(obj, torch.Tensor):
        return obj
    if isinstance(obj, Mapping):
        return {k: _encode(v) for k, v in obj.items()}
    if not _is_leaf(obj):
        return [_encode(v) for v in obj]
    tensors, tree = flatten(obj)
    if tensors:  # a tuple holding tensors: DCP stores it, weights_only reads it back
        return obj
    return _JSON_MARK + json.dumps(tree, allow_nan=True)


def _decode(obj):
    from simulator.controller.state import unflatten

    if isinstance(obj, str) and obj.startswith(_JSON_MARK):
        return unflatten({}, json.loads(obj[len(_JSON_MARK) :]))
    if isinstance(obj, Mapping):
        return {k: _decode(v) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_decode(v) for v in obj]
    return obj


def _optimizer_int_keys(obj):
    """Give a raw ``optimizer.state_dict()`` back its int keys, which DCP turned into strings.

    torch optimizers key ``state`` by the int indices listed in ``param_groups[*]["params"]``;
    a string ``"0"`` would be silently ignored by ``Optimizer.load_state_dict``.
    """
    if not isinstance(obj, dict):
        return obj
    groups = obj.get("param_groups")
    if isinstance(obj.get("state"), dict) and isinstance(groups, list):
        ids = {
            p
            for g in groups
            if isinstance(g, dict)
            for p in g.get("params", ())
            if isinstance(p, int) and not isinstance(p, bool)
        }
        obj["state"] = {
            (int(k) if isinstance(k, str) and k.isdigit() and int(k) in ids else k): v
            for k, v in obj["state"].items()
        }
    for k, v in obj.items():
        obj[k] = _optimizer_int_keys(v)
    return obj


def _safe_reader(ckpt_dir: Path, metadata):
    """DCP's file reader, handed the metadata this rank already read through the allow-list."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import StorageMeta

    class SafeFileSystemReader(FileSystemReader):
        def read_metadata(self, *args, **kwargs):
            if metadata.storage_meta is None:
                metadata.storage_meta = StorageMeta()
            metadata.storage_meta.load_id = self.load_id
            return metadata

    return SafeFileSystemReader(ckpt_dir)


def _completing_planner(rank: int):
    """A DCP load planner that also loads entries the template lacks, from the checkpoint.

    Tensors in the template load in place (so DTensor/FSDP shards keep their layout); entries
    only the checkpoint has (a value added since, another rank's layout) are allocated from the
    checkpoint's metadata, as DCP's own ``_EmptyStateDictLoadPlanner`` does. Other ranks'
    per-rank entries are skipped. Non-tensor leaves load with ``weights_only=True``.
    """
    from torch.distributed.checkpoint import DefaultLoadPlanner
    from torch.distributed.checkpoint._nested_dict import flatten_state_dict
    from torch.distributed.checkpoint._traverse import set_element
    from torch.distributed.checkpoint.metadata import TensorStorageMetadata

    mine = f"rank{rank}"

    class CompletingLoadPlanner(DefaultLoadPlanner):
        def set_up_planner(self, state_dict, metadata=None, is_coordinator=False):
            have, _ = flatten_state_dict(state_dict)
            paths = metadata.planner_data or {}
            for fqn, md in metadata.state_dict_metadata.items():
                if fqn in have:
                    continue
                path = tuple(paths.get(fqn, (fqn,)))
                if path[0] == PER_RANK_KEY and (len(path) < 2 or path[1] != mine):
                    continue
                if isinstance(md, TensorStorageMetadata):
                    value = torch.empty(md.size, dtype=md.properties.dtype)
                else:
                    value = None  # a placeholder for the stored leaf
                set_element(state_dict, path, value)
            super().set_up_planner(state_dict, metadata, is_coordinator)

        def load_bytes(self, read_item, value) -> None:
            set_element(
                self.original_state_dict,
                self.mappings[read_item.dest_index.fqn],
                torch.load(value, weights_only=True),
            )

    return CompletingLoadPlanner()


def dcp_failures(exc, rank: int, own: bool) -> dict[int, BaseException]:
    """Each failing rank's exception in DCP's ``CheckpointException`` (which pairs each with
    its traceback, and numbers a rank's own ``no_dist`` work rank 0: ``rank`` then)."""
    failures = {r: w[0] if isinstance(w, tuple) else w for r, w in exc.failures.items()}
    if own and failures:  # one process: its one failure
        return {rank: next(iter(failures.values()))}
    return failures


def _raise_own_interrupt(failures: dict[int, BaseException], rank: int, own: bool) -> None:
    """This rank's own interrupt (Ctrl-C, SystemExit) among DCP's failures, raised as itself:
    marked heard where DCP's collectives told every rank (not ``own``, a ``no_dist`` call)."""
    mine = failures.get(rank)
    if mine is not None and not isinstance(mine, Exception):
        raise (mine if own else heard(mine)) from None


def _one_line(failures: dict[int, BaseException]) -> str:
    """DCP's failures without their tracebacks: ``rank <r>: <Type>: <message>; ...``."""
    return "; ".join(f"rank {r}: {what(e)}" for r, e in sorted(failures.items()))


@contextmanager
def quiet_single_process(own: bool):
    """Without DCP's warning that it assumes one process: for a rank's own snapshot
    (``no_dist``) that is the intent."""
    with warnings.catch_warnings():
        if own:
            warnings.filterwarnings("ignore", message="torch.distributed is disabled")
        yield


class DistributedBackend:
    """The controller's Backend for a job under torch.distributed (any process group backend).

    Create it after ``torch.distributed.init_process_group``; every rank makes the same calls in
    the same order (save, restore), as DCP's collectives require. All ranks must see the same
    checkpoint directory (a shared file system).
    """

    def __init__(
        self,
        *,
        group: Any = None,
        per_rank_keys: tuple[str, ...] = ("rng", "dataloader", "extra"),
        thread_count: int = 1,
    ):
        import torch.distributed as dist

        if not (dist.is_available() and dist.is_initialized()):
            raise InputError(
                "DistributedBackend needs torch.distributed initialised "
                "(call torch.distributed.init_process_group first)"
            )
        if thread_count < 1:
            raise InputError(f"thread_count must be a positive count, got {thread_count!r}")
        self.group = group
        self.rank = dist.get_rank(group)
        self.world_size = dist.get_world_size(group)
        self.per_rank_keys = tuple(per_rank_keys)
        self.thread_count = int(thread_count)
        # DCP's save runs its collectives on a group of its own: an asynchronous save writes
        # in a background thread while the training thread broadcasts the next due step on
        # ``group``, and two threads' collectives on one group meet in a different order on
        # each rank (a deadlock). Made here, where every rank is (new_group is collective).
        ranks = None if group is None else dist.get_process_group_ranks(group)
        self.write_group = (
            group
            if self.world_size == 1
            else dist.new_group(ranks, backend=dist.get_backend(group))
        )

    # -- coordination -----------------------------------------------------------------------
    def broadcast(self, obj):
        """``obj`` as rank 0 has it, on every rank."""
        import torch.distributed as dist

        if self.world_size == 1:
            return obj
        box = [obj]
        dist.broadcast_object_list(box, group=self.group, group_src=0)
        return box[0]

    def all_gather(self, obj) -> list:
        """``obj`` of every rank, in rank order (collective)."""
        import torch.distributed as dist

        if self.world_size == 1:
            return [obj]
        out: list = [None] * self.world_size
        dist.all_gather_object(out, obj, group=self.group)
        return out

    def barrier(self) -> None:
        import torch.distributed as dist

        dist.barrier(group=self.group)

    def writes_manifest(self) -> bool:
        """Yes: rank 0 writes the manifest, after DCP has gathered every rank's write results."""
        return True

    # -- model and optimizer state ----------------------------------------------------------
    def model_state_dict(self, model, optimizer=None) -> tuple[dict, dict]:
        """(model, optimizer) state dicts with FQN keys, via ``get_state_dict``.

        The optimizer's state is initialised first when it has none (torch does a zero-lr
        step), so a fresh optimizer's state dict is a complete template for loading.
        """
        from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict

        if optimizer is None:
            return get_model_state_dict(model), {}
        return get_state_dict(model, optimizer)

    def load_model_state_dict(self, model, optimizer, model_sd: dict, optim_sd: dict) -> None:
        """Apply what ``model_state_dict`` returned (after a ``read``)."""
        from torch.distributed.checkpoint.state_dict import set_model_state_dict, set_state_dict

        if optimizer is None:
            set_model_state_dict(model, model_sd)
        else:
            set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=optim_sd)

    # -- storage ----------------------------------------------------------------------------
    def _split(self, state: dict) -> dict:
        shared = {k: v for k, v in state.items() if k not in self.per_rank_keys}
        own = {k: state[k] for k in self.per_rank_keys if k in state}
        if own:
            shared[PER_RANK_KEY] = {f"rank{self.rank}": own}
        return shared

    def write(self, tmp_dir: Path, state: dict) -> None:
        """Every rank writes its part of ``state`` into ``tmp_dir`` with DCP; files fsynced.

        Collective: all ranks call it with the same ``tmp_dir``. Returns once DCP's metadata
        (the record that all ranks' writes completed) is on storage.
        """
        self._save(Path(tmp_dir), state, own=False)

    def write_own(self, tmp_dir: Path, state: dict) -> None:
        """This rank alone writes everything it needs to load its part into ``tmp_dir`` (a
        directory of its own, on its host: the local tier, :mod:`~.local_ring`).

        Not collective: DCP runs without the process group (``no_dist``), so nothing is
        deduplicated against other ranks (a replicated tensor is in every rank's copy) and this
        rank writes its own ``.metadata``. A DTensor shard is written as this rank's chunk of
        the global tensor, so the copy loads back into the same layout (the same world size).
        """
        self._save(Path(tmp_dir), state, own=True)

    def _save(self, tmp_dir: Path, state: dict, *, own: bool) -> None:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        writer = dcp.FileSystemWriter(
            tmp_dir, sync_files=True, single_file_per_rank=True, thread_count=self.thread_count
        )
        try:
            with quiet_single_process(own):
                dcp.save(
                    _encode(self._split(state)),
                    storage_writer=writer,
                    process_group=self.write_group,
                    no_dist=own,
                )
        except CheckpointException as exc:
            # A BaseException with every failing rank's traceback in its message: what
            # catches a failed save (Exception) would let it through, one rank alone.
            failures = dcp_failures(exc, self.rank, own)
            _raise_own_interrupt(failures, self.rank, own)
            raise ckptio.CheckpointWriteError(
                f"DCP's save failed ({_one_line(failures)})"
            ) from None
        if own or self.rank == 0:
            ckptio.fsync_dir(tmp_dir)

    def read(self, ckpt_dir: Path, template: dict, *, in_place: bool = True) -> dict:
        """The state saved in ``ckpt_dir``, loaded into ``template`` where it has the entries.

        Always in place, DCP's load (``in_place`` is the protocol's and changes nothing: rank
        0 has checked every CRC-32 before a distributed load starts). Collective. Returns the
        nested state dict (this rank's per-rank values back at the top level), including
        entries the template lacks.
        """
        return self._load(Path(ckpt_dir), template, own=False)

    def read_own(self, ckpt_dir: Path, template: dict) -> dict:
        """What :meth:`write_own` wrote, read by this rank alone (not collective); as
        :meth:`read` otherwise (the same refusals)."""
        return self._load(Path(ckpt_dir), template, own=True)

    def _check_saved_ranks(self, ckpt_dir: Path, metadata) -> None:
        """Refuse a checkpoint saved by fewer ranks than this job has, on every rank alike
        (the same metadata gives the same answer, so no rank enters DCP's collectives alone):
        the extra ranks have no saved RNG state or data position to resume."""
        from simulator.controller.integrity import IncompatibleCheckpoint

        saved = {
            path[1]
            for path in (metadata.planner_data or {}).values()
            if isinstance(path, (tuple, list)) and len(path) > 1 and path[0] == PER_RANK_KEY
        }
        if saved and self.world_size > len(saved):
            raise IncompatibleCheckpoint(
                f"{ckpt_dir.name} was saved by a job of {len(saved)} ranks and this one has "
                f"{self.world_size}: ranks {len(saved)} and up have no saved RNG state or data "
                f"position to resume; relaunch with {len(saved)} ranks"
            )

    def _load(self, ckpt_dir: Path, template: dict, *, own: bool) -> dict:
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.api import CheckpointException

        from simulator.controller.integrity import CorruptCheckpoint, UnsafeCheckpoint

        prepared: list = []  # this rank's own, never gathered: it holds the live tensors

        def prepare() -> None:
            if not (ckpt_dir / ".metadata").is_file():
                raise CorruptCheckpoint(f"{ckpt_dir.name}: no DCP .metadata (incomplete write)")
            # Read (and vet) here: inside dcp.load a refusal would be swallowed into a fallback.
            metadata = load_metadata(ckpt_dir)
            if not own:
                self._check_saved_ranks(ckpt_dir, metadata)
            prepared.append((metadata, _encode(self._split(template))))

        if own:
            prepare()
        else:  # every rank ready, or every rank told why not, before DCP's collective load
            gather_work(self.all_gather, prepare, f"reading {ckpt_dir.name}", self.rank)
        metadata, state = prepared[0]
        planner = _completing_planner(self.rank)
        try:
            with quiet_single_process(own):
                dcp.load(
                    state,
                    storage_reader=_safe_reader(ckpt_dir, metadata),
                    planner=planner,
                    process_group=self.group,
                    no_dist=own,
                )
        except CheckpointException as exc:
            # DCP gathers every rank's exception; an unsafe pickle is a refusal, not damage.
            failures = dcp_failures(exc, self.rank, own)
            # An interrupt is no verdict on the checkpoint (a corrupt one is moved aside).
            _raise_own_interrupt(failures, self.rank, own)
            for error in failures.values():
                if isinstance(error, UnsafeCheckpoint):
                    raise UnsafeCheckpoint(str(error)) from None
            if any(not isinstance(e, Exception) for e in failures.values()):
                raise RuntimeError(
                    f"{ckpt_dir.name}: DCP's load was interrupted ({_one_line(failures)})"
                ) from None
            raise CorruptCheckpoint(
                f"{ckpt_dir.name}: DCP cannot read it ({_one_line(failures)})"
            ) from None
        except (UnsafeCheckpoint, CorruptCheckpoint):
            raise
        except (OSError, ValueError, RuntimeError, EOFError) as exc:
            raise CorruptCheckpoint(f"{ckpt_dir.name}: DCP cannot read it ({exc})") from None
        # dcp.load copies the top level of the dict it is given, so the entries the planner
        # added there (``controller``, ``tiered``: saved, absent from the template) are only in
        # the planner's own copy, which also holds everything loaded in place.
        state = planner.original_state_dict
        try:
            state = _optimizer_int_keys(_decode(state))
        except (ValueError, RecursionError) as exc:  # a JSON leaf that does not parse
            raise CorruptCheckpoint(f"{ckpt_dir.name}: unreadable value ({exc})") from None
        except CorruptCheckpoint as exc:
            raise CorruptCheckpoint(f"{ckpt_dir.name}: {exc}") from None
        own = state.pop(PER_RANK_KEY, {}).get(f"rank{self.rank}", {})
        state.update(own)
        return state
