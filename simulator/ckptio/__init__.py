"""The project's own checkpoint on disk: a directory that counts only once it is complete.

A checkpoint is a directory holding ``tensors.safetensors`` (every tensor, in the safetensors
format, so that loading never executes code), ``meta.json`` (the rest of the state, plain JSON)
and ``manifest.json`` (each file's size and CRC-32). It is written into a hidden temporary
sibling directory on the same filesystem; each file and the directory are fsync'ed, the
manifest is written last, and only then is the directory renamed to its final name and the
parent fsync'ed. A crash at any point leaves either the previous checkpoints untouched plus a
temporary directory that no reader mistakes for a checkpoint, or the complete new one.

The manifest lists every file of the checkpoint: a reader refuses a checkpoint that holds a
file the manifest does not list (but the manifest itself and a distributed commit's
``.rank-<r>.ok`` markers), that lacks a file its layout needs (tensors and meta here; DCP's
``.metadata`` and every rank's ``__<r>_0.distcp`` for the controller's torch.distributed
checkpoints), whose manifest names a path outside the directory, or that holds a symlink, FIFO
or device anywhere (never followed or opened). Lengths a file states about itself are bounded
by the file and by fixed limits before anything is allocated. Each refusal is a
:class:`CorruptCheckpoint` with a one-line reason. The CRC-32s detect torn and bit-rotten files;
they are no defence against a hostile writer, who can recompute them: what protects a restore
from one is that loading never executes code (safetensors and JSON only, never a pickle).

The tensor file is written by the safetensors library straight from the tensors' memory; its
CRC-32 (ISA-L's ``crc32``: the values of ``zlib.crc32`` at ~4x its speed; zlib's where ISA-L
has no wheel) is taken by a thread that reads the file just written back from the page cache
in 4 MB slices while the file is flushed to the device.
A restore fills every tensor with 4 MB
scatter reads (``readv``) straight into its buffer (no file mapping, whose page faults read a
cold file at a fraction of the disk's speed) and checks the CRC-32 of each slice right after
its read, while a thread asks the kernel for the file's next 64 MB ahead of the reader
(:mod:`.readahead`), so the reader seldom waits for the device. The buffers are the caller's
own tensors where they fit (``read_checkpoint``'s ``into``: the live model and optimizer, as
DCP's load fills them), else fresh ones, whose pages a thread maps ahead of the reads
(:mod:`.prefault`), so the reader mostly copies.

Asynchronous saves split in two: :func:`stage` copies the tensors into fresh contiguous CPU
memory (pinned when CUDA is present) — that copy is the training stall — and
:class:`AsyncWriter` writes the staged copy in a background thread, one write at a time.
"""

from simulator.ckptio.layout import (
    DCP_METADATA,
    FORMAT,
    MANIFEST,
    MAX_HEADER_BYTES,
    MAX_MANIFEST_BYTES,
    META_FILE,
    TENSOR_FILE,
    VERSION,
    CheckpointReadError,
    CheckpointWriteError,
    CorruptCheckpoint,
    fsync_dir,
    fsync_file,
    is_temp_dir,
    may_be_unlisted,
)
from simulator.ckptio.read import (
    checkpoint_files,
    file_crc32,
    is_complete,
    read_checkpoint,
    read_manifest,
    read_meta,
    remove_stale_temps,
    verify_checkpoint,
    verify_structure,
)
from simulator.ckptio.staging import AsyncWriter, stage
from simulator.ckptio.write import write_checkpoint

__all__ = [
    "DCP_METADATA",
    "FORMAT",
    "MANIFEST",
    "MAX_HEADER_BYTES",
    "MAX_MANIFEST_BYTES",
    "META_FILE",
    "TENSOR_FILE",
    "VERSION",
    "AsyncWriter",
    "CheckpointReadError",
    "CheckpointWriteError",
    "CorruptCheckpoint",
    "checkpoint_files",
    "file_crc32",
    "fsync_dir",
    "fsync_file",
    "is_complete",
    "is_temp_dir",
    "may_be_unlisted",
    "read_checkpoint",
    "read_manifest",
    "read_meta",
    "remove_stale_temps",
    "stage",
    "verify_checkpoint",
    "verify_structure",
    "write_checkpoint",
]
