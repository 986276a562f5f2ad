"""How each checkpoint format saves and restores the same complete state, timed honestly.

Every save ends durable: the library's own fsync where it has one (DCP ``sync_files``,
:mod:`simulator.ckptio`), else an explicit fsync of every file written, and always an fsync of
the directory. Before a restore, the written files' pages are dropped from the page cache
(``posix_fadvise(DONTNEED)`` after the fsync made them clean), so loads read the disk.
The raw baseline writes the state's own bytes with plain ``os.write`` and reads them back.

A reduced-precision save (``ckptsim bench --optimizer-precision``, ``--weights-precision``)
is :func:`save_reduced`: the controller's own encoding
(:func:`simulator.controller.precision.reduce_state`) applied to the state, then the format's
save; its restore, :func:`load_reduced`, is the format's load then the decoding
(:func:`~simulator.controller.precision.expand_state`) back to the original dtypes, both timed
since a save and a restore pay them. Only the formats in :data:`REDUCIBLE` take it.
"""

from __future__ import annotations

import contextlib
import json
import mmap
import os
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import torch

from simulator import ckptio
from simulator.bench.state import flatten, unflatten
from simulator.ckptio.layout import READ_CHUNK, bytes_of
from simulator.ckptio.readahead import Readahead

_RAW_CHUNK = 64 << 20


def fsync_tree(directory: Path) -> None:
    """fsync every file under ``directory``, then each directory (deepest first)."""
    for root, dirs, files in os.walk(directory, topdown=False):
        for name in files:
            ckptio.fsync_file(Path(root, name))
        ckptio.fsync_dir(Path(root))
        del dirs


def drop_cache(directory: Path) -> None:
    """Ask the kernel to drop the (clean, fsync'ed) pages of every file under ``directory``."""
    if not hasattr(os, "posix_fadvise"):
        return
    for root, _dirs, files in os.walk(directory):
        for name in files:
            fd = os.open(Path(root, name), os.O_RDONLY)
            try:
                os.fdatasync(fd)
                os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
            finally:
                os.close(fd)


def disk_bytes(directory: Path) -> int:
    return sum(p.stat().st_size for p in directory.rglob("*") if p.is_file())


# ------------------------------------------------------------------------------ raw baseline

_BUFFER: np.ndarray | None = None


def _raw_buffer() -> memoryview:
    global _BUFFER
    if _BUFFER is None:
        _BUFFER = np.random.default_rng(12345).integers(0, 256, size=_RAW_CHUNK, dtype=np.uint8)
    return memoryview(_BUFFER)


def state_bytes(state: Any) -> list[memoryview]:
    """The bytes of every CPU tensor of ``state`` (nested, as the benchmark holds it; its
    states live on the CPU), in memory, uncopied: what :func:`raw_write` writes for the raw
    baseline of that state."""
    tensors, _tree = flatten(state)
    return [
        memoryview(bytes_of(t.contiguous()))
        for t in tensors.values()
        if t.numel() and t.device.type == "cpu"
    ]


def raw_write(directory: Path, data: int | Sequence[memoryview]) -> float:
    """Seconds to write ``data`` sequentially into ``directory/raw.bin`` with ``os.write``, then
    fsync the file and the directory: no format, no checksum, no rename.

    ``data``: the buffers whose bytes to write (a state's own, :func:`state_bytes`: the bytes
    its checkpoint holds, from the memory its save reads: the benchmark's baseline), or a byte
    count, written from one 64 MB buffer of random bytes. Which bytes matters on the project's
    VM, for reasons below it: ``experiments/write_content.py`` (1.2 GB, 2026-12-06) took
    medians of 2.65 s and 3.01 s for the random bytes against 0.75 s and 0.84 s for the
    state's own in two runs, where the benchmark's raw jobs of the same morning had written
    the random bytes in 0.60 s; a baseline of other bytes than the save's measures that as
    much as the writer.
    """
    if isinstance(data, int):
        buf = _raw_buffer()
        sources = [buf[: min(len(buf), data - at)] for at in range(0, data, len(buf))]
    else:
        sources = list(data)
    directory.mkdir()
    file = directory / "raw.bin"
    start = time.perf_counter()
    fd = os.open(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o644)
    try:
        for view in sources:
            while view:
                view = view[os.write(fd, view) :]
        os.fsync(fd)
    finally:
        os.close(fd)
    ckptio.fsync_dir(directory)
    return time.perf_counter() - start


def warm_memory(nbytes: int) -> None:
    """Map ``nbytes`` of fresh memory, write into each of its pages, and let it go (the
    benchmark's ``--warm-memory``, right before a clock starts).

    On a VM that hands memory left free for a second or two back to its host (free page
    reporting: ``simulator.bench.runner.free_page_reporting``), the next use of such memory
    pays a fault on the host per page. On the project's VM (``reports/vm-memory.md``,
    2026-12-07) a fresh page cost 7.4 µs after a 2 s pause against 0.59 µs with none, and a
    290 MiB write into the page cache took 0.60 s after 2 s and 0.80 s after 4 s instead of
    0.09 s; right after this warm-up it took 0.085-0.091 s whatever the pause. The pages
    touched here are backed again when they are let go, and the kernel hands memory just
    freed out first, so the timed job that follows takes backed pages, as on a machine whose
    memory is never reclaimed. The warm-up pays those faults itself, untimed: 1.4-1.8 s for
    608 MB after a 2-4 s pause there."""
    if nbytes > 0:
        buf = np.empty(nbytes, dtype=np.uint8)
        buf[:: mmap.PAGESIZE] = 1  # one byte a page maps the page; zeros could share one page
        del buf


_READ_BUFFER: bytearray | None = None


def _raw_read_buffer() -> memoryview:
    """The raw read's one 64 MB buffer, every page mapped once, before any clock starts."""
    global _READ_BUFFER
    if _READ_BUFFER is None:
        _READ_BUFFER = bytearray(_RAW_CHUNK)
        _READ_BUFFER[:: mmap.PAGESIZE] = bytes(len(range(0, _RAW_CHUNK, mmap.PAGESIZE)))
    return memoryview(_READ_BUFFER)


def raw_read(
    directory: Path,
    name: str = "raw.bin",
    *,
    readahead: bool = False,
    before_clock: Callable[[], None] | None = None,
) -> float:
    """Seconds to read the file ``name`` in ``directory`` back from disk (the directory's
    pages dropped first), 64 MB at a time into one buffer mapped in advance, with the restore's
    readahead hint (``POSIX_FADV_SEQUENTIAL``, which doubles the window): a plain sequential
    read, whatever the allocator holds (the benchmark's raw job; on the project's VM it was at
    times 3x slower than the same read done the restore's way, below).

    ``readahead``: read it the way a restore does instead, in
    :data:`~simulator.ckptio.layout.READ_CHUNK` slices with a
    :class:`~simulator.ckptio.readahead.Readahead` thread asking for the bytes ahead (the
    restore's own I/O, without its parsing, checksum or tensors: what ``experiments/
    restore_gap.py`` sets a restore beside).

    ``before_clock``: called between dropping the pages and starting the clock (the
    benchmark's ``--pause`` and ``--warm-memory``).

    (``f.read(64 MB)``, a fresh buffer per call, measured the allocator as much as the disk:
    inside the benchmark loop it reused freed heap memory and mapped no page, in a fresh
    process it faulted in every page, ~0.7-2 µs each on the project's VM, as slow as the read.)
    """
    buf = _raw_read_buffer()
    chunk = READ_CHUNK if readahead else len(buf)
    drop_cache(directory)
    if before_clock is not None:
        before_clock()
    start = time.perf_counter()
    with open(directory / name, "rb", buffering=0) as f:
        if hasattr(os, "posix_fadvise"):  # the readahead hint the restore gives its file
            os.posix_fadvise(f.fileno(), 0, 0, os.POSIX_FADV_SEQUENTIAL)
        size = os.fstat(f.fileno()).st_size if readahead else 0
        with Readahead(f.fileno(), size) as ahead:
            pos = 0
            while n := f.readinto(buf[pos % len(buf) :][:chunk]):
                pos += n
                ahead.at(pos)
    return time.perf_counter() - start


# ------------------------------------------------------------------------------ formats
# save(state, directory) -> {"save_s": ..., optionally "stall_s": ...}; directory is new.
# load(directory, state) -> the restored state (IN_PLACE formats fill ``state``'s tensors).


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _save_torch(state: Any, directory: Path) -> dict[str, float]:
    def go():
        directory.mkdir()
        torch.save(state, directory / "state.pt")
        fsync_tree(directory)

    return {"save_s": _timed(go)}


def _load_torch(directory: Path, state: Any = None) -> Any:
    return torch.load(directory / "state.pt", map_location="cpu", weights_only=True)


def _save_safetensors(state: Any, directory: Path) -> dict[str, float]:
    from safetensors.torch import save_file

    def go():
        directory.mkdir()
        tensors, tree = flatten(state)
        save_file(tensors, directory / "state.safetensors")
        (directory / "state.json").write_text(json.dumps(tree))
        fsync_tree(directory)

    return {"save_s": _timed(go)}


def _load_safetensors(directory: Path, state: Any = None) -> Any:
    from safetensors.torch import load_file

    # load_file maps the file lazily; clone so the restore reads the bytes now, as the other
    # formats do (a training resume copies them into the model right away anyway).
    tensors = {k: v.clone() for k, v in load_file(directory / "state.safetensors").items()}
    return unflatten(tensors, json.loads((directory / "state.json").read_text()))


@contextlib.contextmanager
def _single_process_dcp():
    """DCP warns that it assumes one process when no process group exists: we mean that. It
    raises a failure wrapped in its ``CheckpointException`` (a BaseException, its message the
    traceback): raised here as itself, so that a full disk is an OSError, the user's to fix."""
    from torch.distributed.checkpoint.api import CheckpointException

    from simulator.controller.distributed import dcp_failures, quiet_single_process

    with quiet_single_process(own=True):
        try:
            yield
        except CheckpointException as exc:
            failures = dcp_failures(exc, 0, own=True)
            if not failures:
                raise
            raise failures[0] from None


def _dcp_writer(directory: Path):
    from torch.distributed.checkpoint import FileSystemWriter

    return FileSystemWriter(directory, sync_files=True)


def _save_dcp(state: Any, directory: Path) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    def go():
        with _single_process_dcp():
            dcp.save(state, storage_writer=_dcp_writer(directory), no_dist=True)
        ckptio.fsync_dir(directory)

    return {"save_s": _timed(go)}


def _save_dcp_async(state: Any, directory: Path) -> dict[str, float]:
    import torch.distributed.checkpoint as dcp

    start = time.perf_counter()
    with _single_process_dcp():
        future = dcp.async_save(state, storage_writer=_dcp_writer(directory), no_dist=True)
    stall = time.perf_counter() - start
    # Newer torch may return a response holding separate staging and upload futures.
    future = getattr(future, "upload_completion", future)
    with _single_process_dcp():
        future.result()
    ckptio.fsync_dir(directory)
    return {"save_s": time.perf_counter() - start, "stall_s": stall}


def _load_dcp(directory: Path, state: Any) -> Any:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemReader

    with _single_process_dcp():
        dcp.load(state, storage_reader=FileSystemReader(directory), no_dist=True)
    return state


def _save_ckptsim(state: Any, directory: Path) -> dict[str, float]:
    def go():
        tensors, tree = flatten(state)
        ckptio.write_checkpoint(directory, tensors, {"tree": tree})

    return {"save_s": _timed(go)}


def _load_ckptsim(directory: Path, state: Any = None) -> Any:
    """Read into ``state``'s own tensors where they fit, as the controller's restore does
    (``LocalBackend.read``); ``state`` None: into fresh memory."""
    into = flatten(state)[0] if state is not None else None
    tensors, meta = ckptio.read_checkpoint(directory, verify=True, into=into)
    return unflatten(tensors, meta["tree"])


def save_ckptsim_async(state: Any, directory: Path) -> dict[str, float]:
    """The controller's async path: stage (the stall), then write in the background.

    ``stall_cold_s`` stages into freshly allocated memory (the first save of a run);
    ``stall_s`` stages again into the same buffers once the write is done, as every later
    save of a run does when the staging buffers are kept (``stage(..., out=previous)``).
    """
    start = time.perf_counter()
    tensors, tree = flatten(state)
    staged = ckptio.stage(tensors)
    cold = time.perf_counter() - start
    with ckptio.AsyncWriter() as writer:
        writer.submit(directory, staged, {"tree": tree})
        writer.wait()
    total = time.perf_counter() - start
    again = time.perf_counter()
    ckptio.stage(flatten(state)[0], out=staged)
    warm = time.perf_counter() - again
    return {"save_s": total, "stall_s": warm, "stall_cold_s": cold}


SAVERS: dict[str, Callable[[Any, Path], dict[str, float]]] = {
    "torch": _save_torch,
    "safetensors": _save_safetensors,
    "dcp": _save_dcp,
    "dcp-async": _save_dcp_async,
    "ckptsim": _save_ckptsim,
    "ckptsim-async": save_ckptsim_async,
}
LOADERS: dict[str, Callable[[Path, Any], Any]] = {
    "torch": _load_torch,
    "safetensors": _load_safetensors,
    "dcp": _load_dcp,
    "dcp-async": _load_dcp,
    "ckptsim": _load_ckptsim,
    "ckptsim-async": _load_ckptsim,
}
REDUCIBLE = ("torch", "safetensors", "ckptsim", "ckptsim-async")
"""Formats a reduced-precision state is measured in: each writes the encoded state (a nested
dict of tensors and plain values) as it writes any state. Plain DCP restores in place into the
tensors of a template with the state's own dtypes and shapes, which has no place for int8
codes and scales (the controller's DistributedBackend reads them with a planner of its own)."""


def save_reduced(
    job: str, state: Any, directory: Path, *, optimizer: str, weights: str
) -> dict[str, float]:
    """Save ``state`` encoded to ``optimizer``/``weights`` precision in format ``job``.

    ``save_s`` includes the encoding (``encode_s``): a synchronous save pays it on the
    training thread. ``ckptsim-async`` encodes its staged copy after the stall, as the
    controller's background writer does, so its ``stall_s`` is the exact save's copy.
    """
    from simulator.controller.precision import reduce_state

    if job not in REDUCIBLE:
        raise ValueError(f"{job} does not take a reduced-precision state")
    if job == "ckptsim-async":
        start = time.perf_counter()
        tensors, tree = flatten(state)
        staged = ckptio.stage(tensors)
        cold = time.perf_counter() - start
        encode = time.perf_counter()
        reduced = reduce_state(unflatten(staged, tree), optimizer, weights=weights)
        tensors_r, tree_r = flatten(reduced)
        encode_s = time.perf_counter() - encode
        with ckptio.AsyncWriter() as writer:
            writer.submit(directory, tensors_r, {"tree": tree_r})
            writer.wait()
        total = time.perf_counter() - start
        del reduced, tensors_r
        again = time.perf_counter()
        ckptio.stage(flatten(state)[0], out=staged)
        warm = time.perf_counter() - again
        return {"save_s": total, "stall_s": warm, "stall_cold_s": cold, "encode_s": encode_s}
    start = time.perf_counter()
    reduced = reduce_state(state, optimizer, weights=weights)
    encode_s = time.perf_counter() - start
    out = SAVERS[job](reduced, directory)
    return out | {"save_s": out["save_s"] + encode_s, "encode_s": encode_s}


def load_reduced(job: str, directory: Path) -> Any:
    """Restore what :func:`save_reduced` wrote, decoded back into the original dtypes."""
    from simulator.controller.precision import expand_state

    state, _lost = expand_state(LOADERS[job](directory, None), where=str(directory))
    return state


IN_PLACE = frozenset({"dcp", "dcp-async", "ckptsim", "ckptsim-async"})
"""Formats that restore into the existing tensors (DCP's load; ckptsim's, as the controller
reads into the live model and optimizer); the others build a new state, so the runner drops
its own reference first to keep one copy of the state in memory."""
COPYING = frozenset({"dcp-async", "ckptsim-async"})
"""Formats whose save holds a second copy of the state in memory (the async staging)."""
