"""On-disk layout of a ckptsim checkpoint: file names, the manifest, errors, fsync helpers."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import torch

TENSOR_FILE = "tensors.safetensors"
META_FILE = "meta.json"
MANIFEST = "manifest.json"
FORMAT = "ckptsim-checkpoint"
VERSION = 1
_TEMP_MARK = ".tmp-"
_CRC_CHUNK = 64 << 20  # bounded slices keep the GIL released in long, cache-friendly runs


class CorruptCheckpoint(Exception):
    """A checkpoint directory that is incomplete or whose bytes differ from its manifest."""


class CheckpointWriteError(OSError):
    """A checkpoint could not be written (disk full, I/O error); nothing was left at the path."""


def bytes_of(t: torch.Tensor) -> np.ndarray:
    """The bytes of a contiguous CPU tensor as a uint8 array sharing its memory (any dtype,
    bf16 included, which numpy cannot represent)."""
    return t.reshape(-1).view(torch.uint8).numpy()


def fsync_file(file: Path) -> None:
    fd = os.open(file, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def fsync_dir(directory: Path) -> None:
    fd = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def is_temp_dir(path: str | os.PathLike) -> bool:
    """Whether ``path`` is the temporary directory of an unfinished (or crashed) write."""
    name = Path(path).name
    return name.startswith(".") and _TEMP_MARK in name
