"""Live training: save complete state when the policy says so, and resume bit-exactly.

``AdaptiveCheckpointer`` is the entry point; the modules below it are the pieces it composes:
``state`` (what a complete state is), ``schedule`` (when the next save is due), ``storage``
(where checkpoints live, retention), ``integrity`` (when a checkpoint counts, no pickles),
``runlog`` (the run's record of its own restarts), ``lock`` (one writer per directory) and
``backend`` (single process or torch.distributed). This package imports torch; the simulation
core does not.
"""

from simulator.controller.backend import Backend, LocalBackend
from simulator.controller.checkpointer import AdaptiveCheckpointer
from simulator.controller.integrity import (
    CheckpointLocked,
    CheckpointWriteError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    NoIntactCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.storage import LocalStorage, MemoryStorage, Storage

__all__ = [
    "AdaptiveCheckpointer",
    "Backend",
    "CheckpointLocked",
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "IncompatibleCheckpoint",
    "LocalBackend",
    "LocalStorage",
    "MemoryStorage",
    "NoIntactCheckpoint",
    "Storage",
    "UnsafeCheckpoint",
]
