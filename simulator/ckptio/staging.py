"""Asynchronous saves: stage a copy (the training stall), write it in a background thread."""

from __future__ import annotations

import os
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Any

import numpy as np
import torch

from simulator.ckptio.layout import bytes_of
from simulator.ckptio.write import _meta_bytes, write_checkpoint


def stage(
    tensors: dict[str, torch.Tensor], *, out: dict[str, torch.Tensor] | None = None
) -> dict[str, torch.Tensor]:
    """Contiguous CPU copies of ``tensors`` that training may not touch: the async stall.

    CUDA tensors are copied into pinned host memory (non-blocking, then one synchronise) so
    the device-to-host copy runs at full PCIe speed; CPU tensors are copied too. ``out``, a
    previous result of ``stage`` whose write has finished (``AsyncWriter.wait()``), is reused
    where names, shapes and dtypes match: copying into memory already mapped avoids the page
    faults of a fresh allocation, which on a CPU cost several times the copy itself.
    """
    staged: dict[str, torch.Tensor] = {}
    used_cuda = False
    out = out or {}
    for name, t in tensors.items():
        t = t.detach()
        dst = out.get(name)
        reusable = (
            dst is not None
            and dst.shape == t.shape
            and dst.dtype == t.dtype
            and dst.device.type == "cpu"
            and dst.is_contiguous()
        )
        if not reusable:
            pin = t.device.type == "cuda"
            dst = torch.empty(t.shape, dtype=t.dtype, device="cpu", pin_memory=pin)
        if t.device.type == "cpu" and t.is_contiguous() and t.numel() > 0:
            # A plain memcpy via numpy: torch's copy_ fans small copies out to its intra-op
            # threads, which on a busy CPU cost far more than the copy (25x measured here).
            np.copyto(bytes_of(dst), bytes_of(t))
        else:
            used_cuda = used_cuda or t.device.type == "cuda"
            dst.copy_(t, non_blocking=t.device.type == "cuda")
        staged[name] = dst
    if used_cuda:
        torch.cuda.synchronize()
    return staged


class AsyncWriter:
    """Writes staged checkpoints in a background thread, at most one in flight.

    A failed write re-raises (once) on the next :meth:`submit`, :meth:`wait` or :meth:`close`,
    so a training loop learns about a full disk at its next save rather than never.
    """

    def __init__(self, *, fsync: bool = True):
        self._fsync = fsync
        self._pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="ckptio-writer")
        self._future: Future | None = None
        self._manifest: dict[str, Any] | None = None
        self._closed = False

    @property
    def in_flight(self) -> bool:
        return self._future is not None and not self._future.done()

    def submit(
        self,
        path: str | os.PathLike,
        staged_tensors: dict[str, torch.Tensor],
        meta: dict[str, Any],
    ) -> None:
        """Start writing ``staged_tensors`` (from :func:`stage`) to ``path``; waits for the
        previous write first, raising its error if it failed."""
        if self._closed:
            raise RuntimeError("AsyncWriter is closed")
        self.wait()
        _meta_bytes(meta)  # a bad meta is the caller's error, raised here and not later
        self._future = self._pool.submit(
            write_checkpoint, path, staged_tensors, meta, fsync=self._fsync
        )

    def wait(self) -> dict[str, Any] | None:
        """Block until the write in flight finishes; return the last finished manifest
        (None before any write)."""
        future, self._future = self._future, None
        if future is not None:
            self._manifest = future.result()  # re-raises the write's exception, once
        return self._manifest

    def close(self) -> None:
        """Finish the write in flight (raising its error, if any) and stop the thread."""
        if self._closed:
            return
        try:
            self.wait()
        finally:
            self._closed = True
            self._pool.shutdown(wait=True)

    def __enter__(self) -> AsyncWriter:
        return self

    def __exit__(self, *exc_info) -> None:
        self.close()
