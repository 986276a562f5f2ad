"""The project's own checkpoint on disk: a directory that counts only once it is complete.

A checkpoint is a directory holding ``tensors.safetensors`` (every tensor, in the safetensors
format, so that loading never executes code), ``meta.json`` (the rest of the state, plain JSON)
and ``manifest.json`` (each file's size and CRC-32). It is written into a hidden temporary
sibling directory on the same filesystem; each file and the directory are fsync'ed, the
manifest is written last, and only then is the directory renamed to its final name and the
parent fsync'ed. A crash at any point leaves either the previous checkpoints untouched plus a
temporary directory that no reader mistakes for a checkpoint, or the complete new one.

The CRC-32 (``zlib.crc32``, ~3 GB/s on one core) is computed from the tensors' memory in a
thread while the file is being fsync'ed, so it hides behind the disk instead of adding to it.

Asynchronous saves split in two: :func:`stage` copies the tensors into fresh contiguous CPU
memory (pinned when CUDA is present) — that copy is the training stall — and
:class:`AsyncWriter` writes the staged copy in a background thread, one write at a time.
"""

from simulator.ckptio.layout import (
    FORMAT,
    MANIFEST,
    META_FILE,
    TENSOR_FILE,
    VERSION,
    CheckpointWriteError,
    CorruptCheckpoint,
    fsync_dir,
    fsync_file,
    is_temp_dir,
)
from simulator.ckptio.read import (
    file_crc32,
    is_complete,
    read_checkpoint,
    remove_stale_temps,
    verify_checkpoint,
)
from simulator.ckptio.staging import AsyncWriter, stage
from simulator.ckptio.write import write_checkpoint

__all__ = [
    "FORMAT",
    "MANIFEST",
    "META_FILE",
    "TENSOR_FILE",
    "VERSION",
    "AsyncWriter",
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "file_crc32",
    "fsync_dir",
    "fsync_file",
    "is_complete",
    "is_temp_dir",
    "read_checkpoint",
    "remove_stale_temps",
    "stage",
    "verify_checkpoint",
    "write_checkpoint",
]
