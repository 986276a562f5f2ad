"""Two Linux system calls that Python's ``os`` module lacks, for ckptio's I/O paths.

``madvise(MADV_POPULATE_WRITE)`` (Linux >= 5.14) maps fresh memory's pages without writing
them (:mod:`simulator.ckptio.prefault`); ``sync_file_range(SYNC_FILE_RANGE_WRITE)`` starts the
write-back of a file range without waiting for it (the writer's write-behind). Both are called
through ``ctypes`` (which releases the GIL for the call); each function returns False where the
call is unavailable or fails, and the caller then simply goes on without it: neither is ever
needed for correctness, only for speed.
"""

from __future__ import annotations

import ctypes
import sys

_MADV_POPULATE_WRITE = 23  # <linux/mman.h>
_SYNC_FILE_RANGE_WRITE = 2  # <linux/fs.h>


def _libc() -> ctypes.CDLL | None:
    if not sys.platform.startswith("linux"):  # the constants above are Linux's own
        return None
    try:
        return ctypes.CDLL(None, use_errno=True)
    except OSError:
        return None


_LIBC = _libc()
_madvise = getattr(_LIBC, "madvise", None)
_sync_file_range = getattr(_LIBC, "sync_file_range", None)
if _madvise is not None:
    _madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
    _madvise.restype = ctypes.c_int
if _sync_file_range is not None:
    _sync_file_range.argtypes = [ctypes.c_int, ctypes.c_int64, ctypes.c_int64, ctypes.c_uint]
    _sync_file_range.restype = ctypes.c_int

HAVE_POPULATE = _madvise is not None
HAVE_SYNC_FILE_RANGE = _sync_file_range is not None


def populate_write(address: int, nbytes: int) -> bool:
    """Map the pages of ``[address, address + nbytes)`` (``address`` page-aligned) writable,
    as a first write would, without writing any byte. False: not done (an older kernel's
    EINVAL, ENOMEM, or no such call here)."""
    if _madvise is None:
        return False
    return _madvise(address, nbytes, _MADV_POPULATE_WRITE) == 0


def start_writeback(fd: int, offset: int, nbytes: int) -> bool:
    """Start writing the dirty pages of ``fd``'s ``[offset, offset + nbytes)`` to the device
    without waiting for them (durability still needs the fsync). False: not done."""
    if _sync_file_range is None:
        return False
    return _sync_file_range(fd, offset, nbytes, _SYNC_FILE_RANGE_WRITE) == 0
