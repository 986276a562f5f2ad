"""Live training: save complete state when the policy says so, and resume bit-exactly.

``AdaptiveCheckpointer`` is the entry point; the modules below it are the pieces it composes:
``state`` (what a complete state is), ``schedule`` (when the next save is due), ``storage``
(where checkpoints live, retention), ``integrity`` (when a checkpoint counts, no pickles),
``runlog`` (the run's record of its own restarts), ``backend`` (single process or
torch.distributed), ``safe_metadata`` (DCP's metadata pickle, read as data, never run) and
``loader`` (a data loader that resumes exactly: ``ckpt.wrap(loader)``).
This package imports torch; the simulation core does not.
"""

from simulator.controller.backend import Backend, LocalBackend
from simulator.controller.checkpointer import PREEMPTED_EXIT_CODE, AdaptiveCheckpointer
from simulator.controller.integrity import (
    CheckpointWriteError,
    CorruptCheckpoint,
    IncompatibleCheckpoint,
    UnsafeCheckpoint,
)
from simulator.controller.loader import ResumableLoader
from simulator.controller.storage import LocalStorage, MemoryStorage, Storage

__all__ = [
    "PREEMPTED_EXIT_CODE",
    "AdaptiveCheckpointer",
    "Backend",
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "IncompatibleCheckpoint",
    "LocalBackend",
    "LocalStorage",
    "MemoryStorage",
    "ResumableLoader",
    "Storage",
    "UnsafeCheckpoint",
]
