"""Exact resume through a data loader: the epoch, the position in it, and the RNG around it.

A torch ``DataLoader`` draws from random generators when an epoch's iterator is created:
``_base_seed`` (the workers' seeds) from the loader's generator or the global torch RNG, and a
``RandomSampler`` without a generator its permutation seed from the global torch RNG. So
``step = ckpt.restore()`` followed by ``for batch in loader`` is not exact even when the data
position is right: the restored RNG state is consumed by the new iterator, and every later
dropout mask is shifted. A plain ``DataLoader`` also has no position to save at all.

:class:`ResumableLoader` (``loader = ckpt.wrap(loader)``) is iterated like the loader, one
epoch per ``iter()``, and keeps what an exact resume needs:

* **the epoch** (``loader.epoch``, also handed to a sampler's ``set_epoch``, as
  ``DistributedSampler`` needs) and **the batches served in it**;
* **the RNG states at the epoch's iterator creation** (global torch RNG and the loader's and
  sampler's own generators), so the resumed epoch is created with the same permutation and
  worker seeds as the uninterrupted run's;
* on resume, the epoch's iterator is recreated and moved to the saved position — a
  ``StatefulDataLoader`` (torchdata) through its own ``load_state_dict``; a plain ``DataLoader``
  over its batch sampler's indices only, loading no data (``fast_forward="indices"``), or by
  loading and dropping the batches (``"load"``: needed when the dataset draws random numbers
  inside worker processes, whose streams then advance as in the uninterrupted run) — and only
  then are the global RNG states put back to what ``restore()`` set, so the draws of creating
  the iterator are not taken from the training's stream. (An ``IterableDataset`` has no
  indices to skip: its served batches are always loaded and dropped.)

A save after the last batch of an epoch resumes into the next epoch: the resumed ``iter()``
serves nothing and the one after starts epoch ``epoch + 1``. ``persistent_workers=True`` with a
plain ``DataLoader`` is refused: its iterator (and the workers' seeds) lives across epochs, so
a resume cannot recreate it; a ``StatefulDataLoader`` handles that case itself.
"""

from __future__ import annotations

import itertools
import warnings
from collections.abc import Iterable, Iterator
from typing import Any

import torch

from simulator.controller.state import rng_state, set_rng_state
from simulator.errors import InputError

__all__ = ["FAST_FORWARD", "ResumableLoader", "refuse_unwrapped_loader"]

FAST_FORWARD = ("indices", "load")


def _is_stateful(loader: Any) -> bool:
    return callable(getattr(loader, "state_dict", None)) and callable(
        getattr(loader, "load_state_dict", None)
    )


def refuse_unwrapped_loader(dataloader: Any) -> None:
    """A torch DataLoader given as ``dataloader=`` cannot resume exactly: say what to do."""
    if isinstance(dataloader, torch.utils.data.DataLoader):
        raise InputError(
            f"dataloader={type(dataloader).__name__}(...) does not resume exactly (creating its "
            "iterator draws from the restored RNG); leave dataloader= out and iterate "
            "`loader = ckpt.wrap(loader)` instead"
        )


class _SkipIndices:
    """A (batch) sampler whose iterators drop their first ``skip`` items: indices, no data.

    The skip runs at an iterator's first ``next`` (or :meth:`_Skipping.prime`), not at
    ``iter()``: a ``DataLoader`` draws ``_base_seed`` between the two, and the sampler's own
    seed must be drawn after it, as in the uninterrupted run.
    """

    def __init__(self, sampler: Iterable, skip: int):
        self.sampler, self.skip = sampler, skip
        self.last: _Skipping | None = None

    def __iter__(self) -> Iterator:
        self.last = _Skipping(self.sampler, self.skip)
        return self.last

    def __len__(self) -> int:
        return max(0, len(self.sampler) - self.skip)


class _Skipping:
    def __init__(self, sampler: Iterable, skip: int):
        self.sampler, self.skip = sampler, skip
        self.it: Iterator | None = None

    def __iter__(self) -> Iterator:
        return self

    def prime(self) -> None:
        if self.it is None:
            self.it = iter(self.sampler)
            for _ in itertools.islice(self.it, self.skip):
                pass

    def __next__(self):
        self.prime()
        return next(self.it)


def _skipping_loader(loader: torch.utils.data.DataLoader, skip: int) -> tuple[Any, _SkipIndices]:
    """A DataLoader like ``loader`` whose (batch) sampler skips the first ``skip`` batches.

    It is built from the loader's own constructor arguments, so it draws the same random
    numbers in the same order when its iterator is created (``_base_seed`` from the same
    generator, then the sampler's seed).
    """
    common = dict(
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        in_order=getattr(loader, "in_order", True),
    )
    if loader.batch_sampler is not None:
        skipper = _SkipIndices(loader.batch_sampler, skip)
        return torch.utils.data.DataLoader(loader.dataset, batch_sampler=skipper, **common), skipper
    skipper = _SkipIndices(loader.sampler, skip)
    return (
        torch.utils.data.DataLoader(loader.dataset, batch_size=None, sampler=skipper, **common),
        skipper,
    )


def _iterable_style(loader: Any) -> bool:
    """An IterableDataset has no indices to skip over: its batches are loaded and dropped."""
    return isinstance(getattr(loader, "dataset", None), torch.utils.data.IterableDataset)


def _length(loader: Any) -> float:
    try:
        return len(loader)
    except TypeError:  # an IterableDataset without __len__
        return float("inf")


class ResumableLoader:
    """A data loader that a checkpoint resumes exactly: epoch, position and RNG (see module).

    Iterate it as the loader (one epoch per ``iter()``); ``epoch`` is the epoch being (or
    next to be) served, ``position`` the batches served in it. Give it to one checkpointer
    (``ckpt.wrap(loader)`` does), before ``restore()``.
    """

    def __init__(self, loader: Iterable, *, fast_forward: str = "indices"):
        if fast_forward not in FAST_FORWARD:
            raise InputError(
                f"fast_forward must be one of {', '.join(FAST_FORWARD)}, got {fast_forward!r}"
            )
        if not isinstance(loader, Iterable):
            raise InputError(f"wrap() needs an iterable data loader, got {type(loader).__name__}")
        self.stateful = _is_stateful(loader)
        is_torch = isinstance(loader, torch.utils.data.DataLoader)
        if not self.stateful and not is_torch:
            raise InputError(
                f"wrap() takes a torch DataLoader or a loader with state_dict/load_state_dict "
                f"(e.g. torchdata's StatefulDataLoader), got {type(loader).__name__}"
            )
        if not self.stateful and loader.persistent_workers and loader.num_workers > 0:
            raise InputError(
                "a plain DataLoader with persistent_workers=True cannot resume exactly (its "
                "iterator and worker seeds live across epochs); use persistent_workers=False "
                "or torchdata's StatefulDataLoader"
            )
        self.loader = loader
        self.fast_forward = fast_forward
        self.epoch = 0
        self.position = 0
        self._started = False
        self._ended = True  # the last iterator ran to its end (or none was made yet)
        self._warned = False
        self._epoch_rng: dict[str, Any] | None = None
        self._pending: dict[str, Any] | None = None

    def __len__(self) -> int:
        return len(self.loader)

    # -- iteration --------------------------------------------------------------------------
    def _generators(self) -> list[torch.Generator]:
        """The loader's and its samplers' own generators (each once), in a fixed order.

        With ``batch_sampler=BatchSampler(RandomSampler(..., generator=g))`` the permutation
        comes from the batch sampler's sampler; ``loader.sampler`` is then an unused default.
        """
        found: list[torch.Generator] = []
        samplers = (
            getattr(self.loader, "sampler", None),
            getattr(getattr(self.loader, "batch_sampler", None), "sampler", None),
        )
        candidates = [getattr(self.loader, "generator", None)]
        candidates += [getattr(s, "generator", None) for s in samplers]
        for g in candidates:
            if isinstance(g, torch.Generator) and all(g is not h for h in found):
                found.append(g)
        return found

    def _set_epoch(self) -> None:
        for sampler in (
            getattr(self.loader, "sampler", None),
            getattr(getattr(self.loader, "batch_sampler", None), "sampler", None),
        ):
            if callable(getattr(sampler, "set_epoch", None)):
                sampler.set_epoch(self.epoch)
                return

    def __iter__(self) -> Iterator:
        if self._pending is not None:
            state, self._pending = self._pending, None
            if "epoch_rng" in state:
                return self._serve(self._resumed(state))
            self.epoch, self._started = state["epoch"], False  # saved before its first iter()
        if self._started:
            self._warn_if_left(self.position)
            self.epoch += 1
        self._started, self.position = True, 0
        self._set_epoch()
        self._epoch_rng = {
            "torch": torch.get_rng_state(),
            "generators": [g.get_state() for g in self._generators()],
        }
        return self._serve(iter(self.loader))

    def _serve(self, it: Iterator) -> Iterator:
        self._ended = False
        for batch in it:
            self.position += 1
            yield batch
        self._ended = True

    def _warn_if_left(self, served: int) -> None:
        """Each ``iter()`` is a new epoch: say so once when one is left part-way.

        ``next(iter(loader))`` to peek at a batch, or a second ``for`` over the wrapped loader in
        one epoch, counts an epoch each time; the README's ``range(loader.epoch, epochs)`` then
        ends a resumed run early. (A ``break`` followed by a new ``for`` is the same to us.)
        """
        if self._ended or self._warned:
            return
        self._warned = True
        warnings.warn(
            f"a new iter() of the wrapped loader starts epoch {self.epoch + 1} while epoch "
            f"{self.epoch} was left after {served} of {_length(self.loader)} batches: each "
            "iter() is a new epoch, so iterate the wrapped loader once per epoch (peek at a "
            "batch through the loader you built, not the wrapped one)",
            stacklevel=3,
        )

    def _resumed(self, state: dict) -> Iterator:
        """The saved epoch's iterator at the saved position; the RNG as restore() left it."""
        self.epoch, self.position, self._started = state["epoch"], state["position"], True
        self._epoch_rng = state.get("epoch_rng")
        if not self.stateful and self.position >= _length(self.loader):
            return iter(())  # saved after the epoch's last batch: the next iter() moves on
        restored = rng_state()
        try:
            self._set_epoch()
            if self.stateful:
                self.loader.load_state_dict(state["loader"])
                return iter(self.loader)
            if self._epoch_rng is not None:
                torch.set_rng_state(self._epoch_rng["torch"])
                for g, s in zip(self._generators(), self._epoch_rng["generators"], strict=True):
                    g.set_state(s)
            if self.fast_forward == "load" or _iterable_style(self.loader):
                it = iter(self.loader)
                for _ in itertools.islice(it, self.position):
                    pass
                return it
            skipping, skipper = _skipping_loader(self.loader, self.position)
            it = iter(skipping)
            if self.position and skipper.last is not None:
                # Draws the epoch's permutation now, inside the window, as the uninterrupted
                # run did before this position (with workers, iter() has done so already).
                skipper.last.prime()
            return it
        finally:
            set_rng_state(restored)

    # -- checkpoint state -------------------------------------------------------------------
    def state_dict(self) -> dict[str, Any]:
        if self._pending is not None:  # restored, not iterated yet: still the restored state
            return dict(self._pending)
        state: dict[str, Any] = {"epoch": self.epoch, "position": self.position}
        if self._epoch_rng is not None:
            state["epoch_rng"] = self._epoch_rng
        if self.stateful and self._started:
            state["loader"] = self.loader.state_dict()
        return state

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not isinstance(state.get("epoch"), int) or not isinstance(state.get("position"), int):
            raise ValueError("the data loader state has no epoch and position")
        self.epoch, self.position = state["epoch"], state["position"]
        self._pending = dict(state)
