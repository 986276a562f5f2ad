"""Launching torch.distributed ranks on this machine for the tests: a free localhost port, and
forked ranks that each leave what they measured in ``out/rank<r>.pt``."""

from __future__ import annotations

import socket
import time
from collections.abc import Callable
from pathlib import Path

import torch
import torch.multiprocessing as mp


def free_port() -> int:
    """A TCP port on 127.0.0.1 that nothing listens on now (for a rendezvous)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def rank_results(out: Path, world: int, *, weights_only: bool = False) -> list[dict]:
    """What each of ``world`` ranks saved in ``out/rank<r>.pt``, in rank order."""
    return [torch.load(out / f"rank{r}.pt", weights_only=weights_only) for r in range(world)]


def fork_ranks(
    worker: Callable, args: tuple, world: int, out: Path, *, killed_ok: bool = False
) -> list[dict]:
    """``worker(rank, *args)`` in ``world`` forked processes (fork: they inherit the imported
    torch, which saves seconds per process), then what each saved (``rank_results``); [] when
    a rank was killed and ``killed_ok`` (a run meant to be stopped)."""
    out.mkdir(parents=True, exist_ok=True)
    try:
        mp.start_processes(worker, args=args, nprocs=world, start_method="fork")
    except mp.ProcessExitedException:
        if not killed_ok:
            raise
        return []
    return rank_results(out, world)


def timed_outcome(rank: int, world: int, out: Path, attempt: Callable[[], str]) -> None:
    """Run ``attempt`` on this rank and write ``"<seconds> <what it returned or raised>"`` to
    ``out/rank<r>.txt``; then stay alive (as a rank whose exception a handler keeps) until
    every rank has written its own, for at most 40 s: a rank left waiting in a collective
    hears no "connection closed" meanwhile, so only a prompt answer is quick."""
    started = time.monotonic()
    try:
        result = attempt()
    except BaseException as exc:
        result = f"{type(exc).__name__}: {exc}"
    took = time.monotonic() - started
    (Path(out) / f"rank{rank}.txt").write_text(f"{took:.1f} {result}")
    while time.monotonic() < started + took + 40 and not all(
        (Path(out) / f"rank{r}.txt").exists() for r in range(world)
    ):
        time.sleep(0.1)
