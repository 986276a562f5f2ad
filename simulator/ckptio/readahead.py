"""Asking the kernel for a file's next bytes ahead of its reader, from a thread.

A restore reads its tensor file in one sequential pass of 4 MB slices (small, so that each
slice's CRC-32 is computed while it is still in the CPU's cache). The kernel's own readahead
then keeps only a window of the file in flight (``read_ahead_kb``, doubled by
``POSIX_FADV_SEQUENTIAL``: 16 MB on the project's VM), started from inside the reader's
``read()`` calls, so the reader keeps waiting for the device between slices.
:class:`Readahead` asks for the file's next :data:`AHEAD_BYTES` with
``posix_fadvise(POSIX_FADV_WILLNEED)`` from a thread that stays that far ahead of the reader:
the reads are queued before the reader needs them, and the call's own waits for a free
request slot fall on the thread, not the reader. (The same call made by the reader itself,
between its slices, was slower than none.)

Measured on the project's 2-core VM (``experiments/restore_gap.py``, cold reads of a 1.2 GB
file into memory mapped already, 4 MB slices): the README gives the numbers. It is a hint and
never needed for correctness: the bytes are the reader's own ``read()``'s; where the call is
unavailable or fails, the thread stops and the reads go on as before.
"""

from __future__ import annotations

import os
import threading

AHEAD_BYTES = 64 << 20
"""How far ahead of the reader the thread keeps the file asked for (32-128 MB measured alike)."""
STEP_BYTES = 16 << 20
"""Bytes asked for per call: few calls, each small next to the lead."""


class Readahead:
    """Keep ``[pos, pos + ahead)`` of the open file ``fd`` (``size`` bytes) asked for, ``pos``
    being what the reader reports with :meth:`at`; use as a context manager around the reads
    (leaving it stops the thread and waits for it, so no call is in flight once ``fd`` may be
    closed)."""

    def __init__(
        self, fd: int, size: int, *, ahead: int = AHEAD_BYTES, step: int = STEP_BYTES
    ) -> None:
        if ahead <= 0 or step <= 0:
            raise ValueError(f"ahead and step must be positive, got {ahead} and {step}")
        self._fd, self._size, self._ahead, self._step = fd, size, ahead, step
        self._pos = 0
        self._stop = False
        self._changed = threading.Condition()
        self._thread: threading.Thread | None = None
        self.asked_bytes = 0
        """Bytes the thread has asked the kernel for (0 where the call is unavailable)."""

    def at(self, pos: int) -> None:
        """The reader is about to read from file offset ``pos`` on."""
        if self._thread is None or pos <= self._pos:
            return
        with self._changed:
            self._pos = pos
            self._changed.notify()

    def __enter__(self) -> Readahead:
        if hasattr(os, "posix_fadvise") and self._size > 0:
            self._thread = threading.Thread(target=self._run, name="ckptio-readahead", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is not None:
            with self._changed:
                self._stop = True
                self._changed.notify()
            self._thread.join()

    def _run(self) -> None:
        offset = 0
        while offset < self._size:
            with self._changed:
                while not self._stop and offset >= self._pos + self._ahead:
                    self._changed.wait()
                if self._stop:
                    return
            nbytes = min(self._step, self._size - offset)
            try:
                os.posix_fadvise(self._fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
            except OSError:
                return  # a file system that refuses the hint: the reads go on without it
            self.asked_bytes += nbytes
            offset += nbytes
