"""A failure of some ranks' own work before a collective, raised on every rank.

Under torch.distributed a rank that leaves with an exception between two collectives leaves
the others waiting in the next one until the process group's timeout (30 minutes by default
with gloo), or until its process exits. So wherever some ranks work alone before a collective
(rank 0 choosing a checkpoint, each rank loading its local snapshot), the failure travels in
the collective instead: the failing rank raises its own exception, and every other rank one of
its kind (:data:`KINDS`) that quotes it. One description (:func:`describe`) and one way of
raising it (:func:`raise_described`) for the broadcasts from rank 0 (the checkpointer's
``_share``) and the all-gathers of the ranks' own work (:func:`gather_work`: the ring's
opening of each rank's held-copy directory, each rank's own snapshot in a ring (taken from its
partner, then loaded), its part of a checkpoint before DCP's collective load, its restore of
its own objects; :func:`failing_together` for work done inline: each rank's check of its
``local_dir``, rank 0's reading of the run log as a session starts, the restore's last steps,
a save's capture of the state, dropping a dead branch's snapshots).
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Any, NoReturn

from simulator import ckptio
from simulator.controller.integrity import IncompatibleCheckpoint, NoIntactCheckpoint
from simulator.errors import InputError

KINDS: tuple[tuple[type[BaseException], type[BaseException]], ...] = (
    (NoIntactCheckpoint, NoIntactCheckpoint),
    (IncompatibleCheckpoint, IncompatibleCheckpoint),
    (InputError, InputError),
    (ckptio.CheckpointWriteError, ckptio.CheckpointWriteError),
    (OSError, ckptio.CheckpointReadError),
    (BaseException, RuntimeError),
)
"""What a failure is (first match), and what the other ranks raise for it: the same refusal, a
user's mistake, a failed save (an asynchronous one's too, heard at a check point), a read failure,
anything else (an interrupt, a warning turned into an error)."""

Described = tuple[int, str]
"""A failure as it travels in a collective: its index in :data:`KINDS` and the message."""


def message(failed: BaseException) -> str:
    """``str(failed)``, or a placeholder where even that raises."""
    try:
        return str(failed)
    except Exception:  # a message that cannot be shown must not keep a rank from the collective
        return "(its message cannot be shown)"


def what(failed: BaseException) -> str:
    """``<Type>: <message>`` (``<Type>`` alone where the message is empty)."""
    text = message(failed)
    return type(failed).__name__ + (f": {text}" if text else "")


def describe(failed: BaseException, doing: str, rank: int) -> Described:
    """``failed`` as the other ranks will raise it: a refusal word for word (naming the rank
    where it is not rank 0); anything else as ``rank <r> failed <doing>: <Type>: <message>``."""
    kind = next(i for i, (seen, _) in enumerate(KINDS) if isinstance(failed, seen))
    if isinstance(failed, IncompatibleCheckpoint | NoIntactCheckpoint):
        text = message(failed)
        return kind, text if rank == 0 else f"{text} (on rank {rank})"
    return kind, f"rank {rank} failed {doing}: {what(failed)}"


def heard(failed: BaseException) -> BaseException:
    """``failed``, marked as one every rank has heard of (it travelled in a collective): a
    caller may hold it (an interrupt too) until the next collective every rank meets, instead
    of leaving at once."""
    failed._ckptsim_heard = True  # type: ignore[attr-defined]
    return failed


def was_heard(failed: BaseException) -> bool:
    """Whether :func:`heard` marked ``failed``."""
    return getattr(failed, "_ckptsim_heard", False)


def raise_described(error: Described) -> NoReturn:
    kind, message = error
    raise KINDS[kind][1](message)


def gather_work(
    gather: Callable[[Any], list], work: Callable[[], Any], doing: str, rank: int
) -> list:
    """Collective: ``work()`` on every rank, then every rank's result in rank order
    (``gather``: an all-gather of one object per rank). When the work raised on some rank, that
    rank raises its own exception after the gather and every other rank one of its kind that
    quotes it, ``doing`` naming the work: no rank leaves the others waiting in a collective."""
    value, failed = None, None
    try:
        value = work()
    except BaseException as exc:  # an interrupt too: the others must not wait
        failed = exc
    return _gathered(gather, value, failed, doing, rank)


@contextmanager
def failing_together(backend: Any, doing: str) -> Iterator[None]:
    """A failure of the body (``doing``) on any rank raised on every rank, as
    :func:`gather_work` does: the failing rank raises its own, the others one of its kind that
    quotes it. Collective where the ``backend`` has several ranks (an all-gather after the
    body); with one, the body's failure passes through. The body runs inline, so the warnings
    it gives name the frames they did without it."""
    failed = None
    try:
        yield
    except BaseException as exc:  # an interrupt too: the others must not wait
        failed = exc
    if backend.world_size > 1:
        _gathered(backend.all_gather, None, failed, doing, backend.rank)
    elif failed is not None:
        raise failed


def _gathered(
    gather: Callable[[Any], list], value: Any, failed: BaseException | None, doing: str, rank: int
) -> list:
    gathered = gather((value, None if failed is None else describe(failed, doing, rank)))
    if failed is not None:
        raise heard(failed)
    for _, error in gathered:
        if error is not None:
            raise_described(error)
    return [value for value, _ in gathered]
