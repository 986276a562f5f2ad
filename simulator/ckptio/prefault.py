"""Faulting a restore's fresh tensor memory in ahead of the reads that fill it.

A restore reads into tensors it has just allocated. The kernel gives each 4 KiB page of fresh
memory its physical page at first touch, inside the ``read()`` that copies into it, so a lone
reader pays for the copy and for every page fault in turn. On the project's 2-core firecracker
VM a fault costs ~2 µs: 0.12-0.2 s per 300 MB, two to three times the copy itself.
:class:`Prefaulter` asks the kernel, from a thread, to populate the tensors' pages ahead of the
reader (:func:`~simulator.ckptio.syscalls.populate_write`), so the faults run on another core
while the reader copies. It never writes a tensor byte, only maps pages that hold them; where
the call is unavailable (not Linux, a kernel before 5.14) it stops, and the reads fault their
pages in as before.

Memory a process has freed and allocates again is already mapped (the common case inside a
long-lived process such as the benchmark loop); then the thread finds the pages present and
costs little. A restart after a failure restores into a fresh process, where none are.
"""

from __future__ import annotations

import mmap
import threading

import torch

from simulator.ckptio import syscalls

MIN_BYTES = 1 << 20
"""Tensors smaller than this are left to the reads (they mostly reuse heap pages anyway)."""
STEP_BYTES = 16 << 20
"""Pages populated per call: small enough to skip what the reader has reached, large enough
that the calls cost nothing."""
_PAGE = mmap.PAGESIZE


class Prefaulter:
    """Populate the pages of ``tensors`` (listed in the order they will be read) in a thread,
    staying ahead of the reader, which reports how far it has got with :meth:`reading`.

    Use as a context manager around the reads: leaving it stops the thread and waits for it,
    so no call is in flight once the tensors may be freed. ``populated_bytes`` counts what the
    thread mapped (0 where the call is unavailable)."""

    def __init__(self, tensors: list[torch.Tensor]):
        # (data position the step starts at, first page, byte count), in reading order
        self._steps: list[tuple[int, int, int]] = []
        pos = 0
        for t in tensors:
            n = t.numel() * t.element_size()
            if n >= MIN_BYTES:
                addr = t.data_ptr()
                # Only pages that hold bytes of this tensor (rounded outward to whole pages).
                lo, hi = addr // _PAGE * _PAGE, -(-(addr + n) // _PAGE) * _PAGE
                for page in range(lo, hi, STEP_BYTES):
                    step = (pos + max(0, page - addr), page, min(STEP_BYTES, hi - page))
                    self._steps.append(step)
            pos += n
        self._reader_at = 0
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None
        self.populated_bytes = 0

    def reading(self, until: int) -> None:
        """The reader is now filling the data up to byte ``until`` (counted in reading
        order): pages before it are the reader's to fault, no longer the thread's."""
        self._reader_at = until

    def __enter__(self) -> Prefaulter:
        if syscalls.HAVE_POPULATE and self._steps:
            self._thread = threading.Thread(target=self._run, name="ckptio-prefault", daemon=True)
            self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        for start, page, nbytes in self._steps:
            if self._stop.is_set():
                return
            if start < self._reader_at:
                continue  # the reader is there already
            if not syscalls.populate_write(page, nbytes):
                return  # a kernel without the call (or ENOMEM): the reads fault pages in
            self.populated_bytes += nbytes
