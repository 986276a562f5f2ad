"""A persistent tier slower than this machine's disk, for the tiered closed-loop study.

The study needs a persistent tier that costs what shared storage costs next to host memory
(the ``llama3-tiers`` preset: a 60 s save to Tectonic against 2 s to host memory). This
machine's disk writes the study's 21 MB checkpoint in about 30 ms, barely slower than
``/dev/shm``, so :class:`ThrottledStorage` — the controller's own
:class:`~simulator.controller.storage.LocalStorage` behind the storage protocol — writes each
checkpoint (fsynced) under a hidden staging name, then waits as long as sending its bytes at
``bytes_per_s`` would take, and only then renames it into place: a kill during the wait loses
the save, as a kill during a slow upload would. Reads are not slowed.
"""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

from simulator.controller.storage import LocalStorage

__all__ = ["ThrottledStorage"]

_STAGING = ".sending-"


class ThrottledStorage(LocalStorage):
    """A LocalStorage whose commits take at least size / ``bytes_per_s`` seconds."""

    def __init__(self, root: str | os.PathLike, bytes_per_s: float):
        super().__init__(root)
        if not bytes_per_s > 0:
            raise ValueError(f"bytes_per_s must be positive, got {bytes_per_s!r}")
        self.bytes_per_s = float(bytes_per_s)

    def commit(self, name: str, write: Callable[[Path], None]) -> None:
        staging = _STAGING + name
        self.remove(staging)
        t0 = time.monotonic()
        write(self.path(staging))
        size = sum(f.stat().st_size for f in self.path(staging).iterdir())
        time.sleep(max(0.0, t0 + size / self.bytes_per_s - time.monotonic()))
        self.rename(staging, name)
        self.sync()

    def remove_unfinished(self) -> list:
        gone = [self.path(n) for n in self.list() if n.startswith(_STAGING)]
        for path in gone:
            self.remove(path.name)
        return gone + super().remove_unfinished()
