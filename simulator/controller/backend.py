"""The seam between the checkpointer and how a process group writes its state.

The checkpointer owns the schedule, the retention and the order of a commit; a
:class:`Backend` writes a nested state dict, reads it back, and offers the two collectives the
checkpointer needs at save time (``broadcast`` the next due step, ``barrier`` around the
commit). Two kinds of write exist:

- ``writes_manifest() is False`` (:class:`LocalBackend`): ``write(path, state)`` is itself
  atomic and complete — the step directory IS a :mod:`simulator.ckptio` checkpoint (tensors
  in safetensors, the rest as JSON, manifest last, rename) — so the checkpointer passes the
  final path and adds nothing.
- ``writes_manifest() is True`` (torch.distributed, ``simulator.controller.distributed``):
  every rank writes its files into a temporary directory; after a barrier rank 0 writes a
  ckptio manifest over them (:func:`simulator.controller.integrity.write_manifest`), fsyncs
  and renames. Either way the result verifies with :func:`simulator.ckptio.verify_checkpoint`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol, runtime_checkable

from simulator import ckptio
from simulator.controller.integrity import CorruptCheckpoint, refuse_pickles
from simulator.controller.state import flatten, tensor_places, unflatten

__all__ = ["Backend", "LocalBackend"]


@runtime_checkable
class Backend(Protocol):
    """How the processes of one job save and load together."""

    rank: int
    world_size: int

    def broadcast(self, obj: Any) -> Any:
        """``obj`` as rank 0 has it, on every rank."""
        ...

    def all_gather(self, obj: Any) -> list:
        """``obj`` of every rank, in rank order (needed with more than one rank)."""
        ...

    def barrier(self) -> None: ...

    def write(self, tmp_dir: Path, state: dict) -> None:
        """Write this rank's part of ``state`` at ``tmp_dir``, every file fsynced."""
        ...

    def read(self, ckpt_dir: Path, template: dict, *, in_place: bool = True) -> dict:
        """Read the state back (``template``: the current state, for in-place loading).

        With ``in_place`` the backend may read into ``template``'s tensors (whose values are
        then unspecified should the read fail); without it, where it can, it leaves them as
        they are.

        Raises CorruptCheckpoint when the files do not parse, UnsafeCheckpoint when one is a
        pickle the backend did not expect.
        """
        ...

    def model_state_dict(self, model: Any, optimizer: Any = None) -> tuple[dict, dict]:
        """(model, optimizer) state as this backend saves it (optimizer: ``{}`` when None)."""
        ...

    def load_model_state_dict(
        self, model: Any, optimizer: Any, model_sd: dict, optim_sd: dict
    ) -> None:
        """Load what :meth:`model_state_dict` returned, after a :meth:`read`."""
        ...

    def writes_manifest(self) -> bool:
        """True: the checkpointer wraps ``write`` in temp dir + manifest (rank 0) + rename."""
        ...


class LocalBackend:
    """One process; the checkpoint is a :mod:`simulator.ckptio` directory."""

    verifies_on_read = True
    """:meth:`read` checks every CRC-32 as it loads, so a restore's choice need not read the
    checkpoint first (``choose_checkpoint(checksums_at_load=True)``)."""
    rank = 0
    world_size = 1

    def broadcast(self, obj: Any) -> Any:
        return obj

    def all_gather(self, obj: Any) -> list:
        return [obj]

    def barrier(self) -> None:
        return None

    def writes_manifest(self) -> bool:
        return False

    def model_state_dict(self, model: Any, optimizer: Any = None) -> tuple[dict, dict]:
        return model.state_dict(), optimizer.state_dict() if optimizer is not None else {}

    def load_model_state_dict(
        self, model: Any, optimizer: Any, model_sd: dict, optim_sd: dict
    ) -> None:
        model.load_state_dict(model_sd)
        if optimizer is not None:
            optimizer.load_state_dict(optim_sd)

    def write(self, tmp_dir: Path, state: dict) -> None:
        tensors, tree = flatten(state)
        ckptio.write_checkpoint(tmp_dir, tensors, tree)

    def read(self, ckpt_dir: Path, template: dict, *, in_place: bool = True) -> dict:
        """The state in ``ckpt_dir``; with ``in_place``, read straight into the template's
        tensors where they fit (:func:`simulator.ckptio.read_checkpoint`'s ``into``: the
        model's parameters and buffers, an optimizer's existing moments), which spares the
        fresh memory and the copy ``load_state_dict`` would make. Every CRC-32 is checked in
        the pass that loads (the restore's choice checked only the structure)."""
        ckpt_dir = Path(ckpt_dir)
        refuse_pickles(ckpt_dir)
        into, places = _loaded_into(template) if in_place else ({}, {})
        tensors, tree = ckptio.read_checkpoint(ckpt_dir, verify=True, into=into)
        if into:
            # The tree, not a tensor's name, says where it goes: one the checkpoint places
            # elsewhere than the template would be a load's source after another load has
            # written into it (two names swapped: both layers end with one's values).
            stored = tensor_places(tree)
            for key, t in tensors.items():
                if t is into.get(key) and stored.get(key) != places[key]:
                    tensors[key] = t.clone()
        try:
            return unflatten(tensors, tree)
        except CorruptCheckpoint as exc:
            raise CorruptCheckpoint(f"{ckpt_dir.name}: {exc}") from None


_LOADED_INTO = frozenset({"model", "optimizer"})
"""The template's sections a restore loads into (``load_state_dict`` copies into the model's
tensors, the optimizer's replace its own): the others' tensors are replaced (``extra`` values:
a prefetched batch may be a view of the data set) or go to an object's own ``load_state_dict``,
so a read must not write into them."""


def _loaded_into(template: dict) -> tuple[dict, dict]:
    """The template's tensors an in-place read may fill (those of :data:`_LOADED_INTO` only),
    and where each sits in the template's tree."""
    tensors, tree = flatten(template)
    places = tensor_places(tree)
    into = {
        key: t
        for key, t in tensors.items()
        if places.get(key) and all(path[0] in _LOADED_INTO for path in places[key])
    }
    return into, places
