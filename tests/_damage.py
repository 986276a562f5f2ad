"""Damage a checkpoint's file the way bit rot does: one byte changed, the size kept."""

from __future__ import annotations

import os
from pathlib import Path


def flip_a_byte(path: Path, from_end: int = 20) -> None:
    """Invert the byte ``from_end`` bytes before the end of ``path`` (what a size check, and a
    framework's own loader of a tensor's payload, cannot see)."""
    with open(path, "r+b") as f:
        f.seek(-from_end, os.SEEK_END)
        byte = f.read(1)
        f.seek(-from_end, os.SEEK_END)
        f.write(bytes([byte[0] ^ 0xFF]))
