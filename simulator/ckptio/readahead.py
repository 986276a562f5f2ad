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
between its slices, was slower than none in an ad-hoc trial.)

Measured on the project's 2-core VM by ``experiments/restore_gap.py`` and
``experiments/restore_fresh_process.py``, which time a raw read with and without it: the README
gives the numbers. It is a hint and never needed for correctness: the bytes are the reader's
own ``read()``'s; where the call is unavailable or fails, or no thread can be started, the
reads go on without it. The thread works on its own duplicate of the file descriptor, so that
even a thread left behind (an interrupt inside the join) never touches another file that
reuses the reader's descriptor number.
"""

from __future__ import annotations

import os
import threading

AHEAD_BYTES = 64 << 20
"""How far ahead of the reader the thread keeps the file asked for (32-128 MB did alike in an
ad-hoc trial at 1.2 GB)."""
STEP_BYTES = 16 << 20
"""Bytes asked for per call: few calls, each small next to the lead."""


class Readahead:
    """Ask for the open file ``fd`` (``size`` bytes) in ``step``-byte calls, in order, each
    starting less than ``ahead`` bytes past ``pos``, what the reader reports with :meth:`at`
    (so the file is asked for up to ``ahead + step`` bytes ahead of it); use as a context
    manager around the reads (leaving it stops the thread and waits for it)."""

    def __init__(
        self, fd: int, size: int, *, ahead: int = AHEAD_BYTES, step: int = STEP_BYTES
    ) -> None:
        if ahead <= 0 or step <= 0 or size < 0:
            raise ValueError(f"need ahead, step > 0 and size >= 0, got {ahead}, {step}, {size}")
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
        if not (hasattr(os, "posix_fadvise") and self._size > 0):
            return self
        try:
            fd = os.dup(self._fd)
        except OSError:
            return self  # no descriptor to spare: read without the hint
        thread = threading.Thread(target=self._run, args=(fd,), name="ckptio-readahead")
        thread.daemon = True
        try:
            thread.start()
        except RuntimeError:  # "can't start new thread": a hint is not worth failing a read
            os.close(fd)
            return self
        self._thread = thread
        return self

    def __exit__(self, *exc: object) -> None:
        if self._thread is None:
            return
        with self._changed:
            self._stop = True
            self._changed.notify()
        self._thread.join()

    def _run(self, fd: int) -> None:
        try:
            offset = 0
            while offset < self._size:
                with self._changed:
                    while not self._stop and offset >= self._pos + self._ahead:
                        self._changed.wait()
                    if self._stop:
                        return
                nbytes = min(self._step, self._size - offset)
                try:
                    os.posix_fadvise(fd, offset, nbytes, os.POSIX_FADV_WILLNEED)
                except OSError:
                    return  # a file system that refuses the hint: the reads go on without it
                self.asked_bytes += nbytes
                offset += nbytes
        finally:
            os.close(fd)
