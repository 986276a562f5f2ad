"""Live training: save complete state when the policy says so, and resume bit-exactly.

``AdaptiveCheckpointer`` is the entry point; the modules below it are the pieces it composes:
``state`` (what a complete state is), ``schedule`` (when the next save is due), ``storage``
(where checkpoints live, retention), ``integrity`` (when a checkpoint counts, no pickles),
``objstore`` (the same on an fsspec URL: ``s3://``, ``memory://``),
``runlog`` (the run's record of its own restarts), ``lock`` (one writer per directory),
``local_tier``, ``tier_schedule`` and ``tiered`` (a second, host-local tier: ``local_dir``),
``backend`` (single process or torch.distributed), ``safe_metadata`` (DCP's metadata pickle,
read as data, never run) and ``loader`` (a data loader that resumes exactly:
``ckpt.wrap(loader)``).
Its entry points import torch, on first use (``from simulator.controller import
AdaptiveCheckpointer``): the torch-free parts (``runlog``, which ``ckptsim plot controller``
reads) import without it, as does the simulation core.
"""

import importlib

# Each public name and the module that defines it, imported on first access (PEP 562).
_EXPORTS = {
    "PREEMPTED_EXIT_CODE": "checkpointer",
    "AdaptiveCheckpointer": "checkpointer",
    "Backend": "backend",
    "LocalBackend": "backend",
    "CheckpointLocked": "integrity",
    "CheckpointReadError": "integrity",
    "CheckpointWriteError": "integrity",
    "CorruptCheckpoint": "integrity",
    "IncompatibleCheckpoint": "integrity",
    "NoIntactCheckpoint": "integrity",
    "UnsafeCheckpoint": "integrity",
    "ResumableLoader": "loader",
    "FsspecStorage": "objstore",
    "LocalStorage": "storage",
    "MemoryStorage": "storage",
    "Storage": "storage",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
