"""Faulting a restore's fresh tensor memory in ahead of the reads that fill it.

A restore reads into tensors it has just allocated. The kernel gives each 4 KiB page of fresh
memory its physical page at first touch, inside the ``read()`` that copies into it, so a lone
reader pays for the copy and for every page fault in turn. On the project's 2-core firecracker
VM a fault costs ~0.7-2 µs: 0.05-0.2 s per 300 MB, as much as the read itself.
:class:`Prefaulter` asks the kernel, from a thread, to populate the tensors' pages ahead of the
reader (:func:`~simulator.ckptio.syscalls.populate_write`), so the faults run on another core
while the reader waits for the disk and copies. It never writes a tensor byte, only maps pages
that hold them; where the call is unavailable (not Linux, a kernel before 5.14) it stops, and
the reads fault their pages in as before.

The reader waits (:meth:`Prefaulter.ready`) until the pages of the slice it is about to read
are mapped, rather than racing the thread over them: two threads faulting the same pages
contend for the same page-table locks, and a reader that overtook the thread used to fault
most pages itself (a 300 MB restore then took twice as long).

Memory a process has freed and allocates again is often mapped already (the allocator keeps
heap memory; inside a long-lived process such as the benchmark loop most of a restore's is
such): those pages are left out (``mincore``), and where no page is left to map no thread is
started at all, which spares a restore the thread's start and the reader's waits (~10 ms per
300 MB on the project's loaded 2-core VM). A restart after a failure restores into a fresh
process, where every page is fresh.
"""

from __future__ import annotations

import math
import mmap
import threading

import torch

from simulator.ckptio import syscalls
from simulator.ckptio.layout import READ_CHUNK

MIN_BYTES = 1 << 20
"""Tensors smaller than this are left to the reads (they mostly reuse heap pages anyway)."""
STEP_BYTES = READ_CHUNK
"""Pages populated per call: the reader's slice, so that it waits for little more than that
slice's pages (the first slice's above all), and few enough calls that they cost nothing."""
_PAGE = mmap.PAGESIZE


class Prefaulter:
    """Populate the pages of ``tensors`` (listed in the order they will be read) that are not
    mapped yet in a thread, in reading order; the reader calls :meth:`ready` before it reads a
    slice.

    Use as a context manager around the reads: leaving it stops the thread and waits for it,
    so no call is in flight once the tensors may be freed. ``populated_bytes`` counts what the
    thread mapped (0 where the call is unavailable)."""

    def __init__(self, tensors: list[torch.Tensor]):
        # (data position the step's pages start at, first page, byte count), in reading order
        self._steps: list[tuple[int, int, int]] = []
        pos = 0
        for t in tensors if syscalls.HAVE_POPULATE else ():
            n = t.numel() * t.element_size()
            if n >= MIN_BYTES:
                addr = t.data_ptr()
                # Only pages that hold bytes of this tensor (rounded outward to whole pages).
                lo, hi = addr // _PAGE * _PAGE, -(-(addr + n) // _PAGE) * _PAGE
                for page in range(lo, hi, STEP_BYTES):
                    nbytes = min(STEP_BYTES, hi - page)
                    if not syscalls.resident(page, nbytes):
                        self._steps.append((pos + max(0, page - addr), page, nbytes))
            pos += n
        # Data position below which every page the thread will map is mapped (inf: all done,
        # or the thread gave up and the reads fault their own pages).
        self._mapped_to: float = self._steps[0][0] if self._steps else math.inf
        self._changed = threading.Condition()
        self._stop = False
        self._thread: threading.Thread | None = None
        self.populated_bytes = 0

    def ready(self, until: int) -> None:
        """Return once the pages of the data before byte ``until`` (counted in reading
        order) are mapped, or the thread has stopped mapping."""
        if self._thread is None or self._mapped_to >= until:
            return
        with self._changed:
            self._changed.wait_for(lambda: self._mapped_to >= until)

    def __enter__(self) -> Prefaulter:
        if self._steps:
            thread = threading.Thread(target=self._run, name="ckptio-prefault", daemon=True)
            try:
                thread.start()
            except RuntimeError:  # "can't start new thread": the reads fault their own pages
                self._mapped_to = math.inf
                return self
            self._thread = thread
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        if self._thread is not None:
            self._thread.join()

    def _run(self) -> None:
        try:
            for i, (_start, page, nbytes) in enumerate(self._steps):
                if self._stop or not syscalls.populate_write(page, nbytes):
                    return  # done with, or a kernel without the call (or ENOMEM)
                self.populated_bytes += nbytes
                if i + 1 < len(self._steps):
                    self._advance(self._steps[i + 1][0])
        finally:
            self._advance(math.inf)

    def _advance(self, to: float) -> None:
        with self._changed:
            self._mapped_to = to
            self._changed.notify_all()
