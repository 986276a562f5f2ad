"""Two Linux system calls that Python's ``os`` module lacks, for ckptio's restore.

``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) maps fresh memory's pages without writing
them, and ``mincore`` says whether memory's pages are mapped already (memory the allocator
recycled), so that only fresh pages are worth mapping ahead
(:mod:`simulator.ckptio.prefault`). They are called through ``ctypes`` (which releases the
GIL for the call) and answer False where the call is unavailable or fails; the caller then
simply goes on without them: they are never needed for correctness, only for speed.
"""

from __future__ import annotations

import ctypes
import mmap
import sys

_MADV_POPULATE_WRITE = 23  # <linux/mman.h>


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):  # the constants above are Linux's own
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_madvise = getattr(_LIBC, "madvise", None)
if _madvise is not None:
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int

_mincore = getattr(_LIBC, "mincore", None)
if _mincore is not None:
    _mincore.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_char_p]
    _mincore.restype = ctypes.c_int

HAVE_POPULATE = _madvise is not None
_PAGE = mmap.PAGESIZE


def populate_write(address: int, nbytes: int) -> bool:
    """Map the pages of ``[address, address + nbytes)`` (``address`` page-aligned) writable,
    as a first write would, without writing any byte. False: not done (an older kernel's
    EINVAL, ENOMEM, or no such call here)."""
    if _madvise is None:
        return False
    return _madvise(address, nbytes, _MADV_POPULATE_WRITE) == 0


def resident(address: int, nbytes: int) -> bool:
    """Whether every page of ``[address, address + nbytes)`` (``address`` page-aligned) is
    mapped already. False where unknown (no such call, an error)."""
    if _mincore is None or nbytes <= 0:
        return False
    pages = -(-nbytes // _PAGE)
    vector = ctypes.create_string_buffer(pages)
    if _mincore(address, nbytes, vector) != 0:
        return False
    return b"\x00" not in vector.raw[:pages]  # bit 0 of each byte: that page is resident
