"""Worker processes for replicas and sweep points: as many as there are cores, stopped at once.

``ProcessPoolExecutor`` has no way to stop running work: on Ctrl-C its ``with`` block waits
for every submitted task, so a 200,000-replica run finishes all of them (ignoring a second
Ctrl-C) before it exits. ``run_tasks`` uses ``multiprocessing.Pool`` instead, whose
``terminate()`` kills the workers: Ctrl-C (or an error in any task) stops the whole run within
a fraction of a second and re-raises in the caller. Workers ignore SIGINT themselves — a
terminal's Ctrl-C reaches the whole process group — so only the parent decides, and no worker
prints a traceback.

``Pool.terminate()`` itself can hang (CPython issues 73945, 78178, 96995: it first takes the
task queue's read lock, which an idle worker holds while it waits for a task that will never
come). So the stop is bounded: terminate runs in a helper thread, and if it has not finished
within ``STOP_WAIT_S`` the workers are killed outright (SIGKILL) and the caller goes on.

``worker_count`` caps a request at the machine's cores: more processes than cores only add
start-up time and memory (1000 requested workers used to start ~955 processes).
"""

from __future__ import annotations

import multiprocessing
import multiprocessing.pool
import os
import signal
import threading
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

__all__ = ["available_cores", "run_tasks", "worker_count"]


def available_cores() -> int:
    """Cores this process may run on (the affinity mask, where the OS has one)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except (AttributeError, OSError):
        return os.cpu_count() or 1


def worker_count(requested: int | None, tasks: int) -> int:
    """Processes to start: ``requested`` (None: all cores), at most the cores and the tasks."""
    cap = available_cores()
    want = cap if requested is None else int(requested)
    return max(1, min(want, cap, tasks))


def _ignore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_IGN)


def run_tasks(
    fn: Callable[[Any], Any],
    tasks: Sequence[Any] | Iterable[Any],
    workers: int,
    *,
    ordered: bool = True,
    chunksize: int = 1,
) -> Iterator[Any]:
    """``fn(task)`` for every task in ``workers`` processes, yielding results as they come.

    ``ordered`` yields in task order, otherwise in completion order. ``fn`` and the tasks must
    be picklable. If the caller stops early — Ctrl-C, an exception from a task, or closing the
    generator — the workers are killed before the exception goes on.
    """
    # A Ctrl-C while the pool starts (forking workers, starting its threads: seconds on a busy
    # machine) would escape before there is a pool to terminate, and the run hung at exit. It
    # is held until the pool exists, then lands inside the try below.
    held = signal.pthread_sigmask(signal.SIG_BLOCK, {signal.SIGINT})
    pool = None
    stopped = True
    try:
        before = set(multiprocessing.active_children())
        pool = multiprocessing.Pool(workers, initializer=_ignore_sigint)
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        imap = pool.imap if ordered else pool.imap_unordered
        yield from imap(fn, tasks, chunksize)
        pool.close()
    except BaseException:
        # Killing the workers takes milliseconds; a second Ctrl-C must not cut it short and
        # leave them running.
        try:
            previous = signal.signal(signal.SIGINT, signal.SIG_IGN)
        except ValueError:  # not the main thread: signals are not ours to handle
            previous = None
        try:
            if pool is not None:
                stopped = _stop(pool, before)
        finally:
            if previous is not None:
                signal.signal(signal.SIGINT, previous)
        raise
    finally:
        signal.pthread_sigmask(signal.SIG_SETMASK, held)
        if pool is not None and stopped:
            pool.join()


STOP_WAIT_S = 2.0
"""How long ``Pool.terminate()`` may take before the workers are killed without it."""


def _stop(pool: multiprocessing.pool.Pool, before: set) -> bool:
    """Terminate ``pool``; True if it finished, False if its workers had to be killed (every
    child process not in ``before``, the ones alive before the pool: the pool's own thread may
    have started a replacement for a worker that ended, which a list taken at the start would
    miss)."""
    stopper = threading.Thread(target=pool.terminate, name="ckptsim-pool-stop", daemon=True)
    stopper.start()
    stopper.join(STOP_WAIT_S)
    if not stopper.is_alive():
        return True
    deadline = time.monotonic() + STOP_WAIT_S
    while (procs := [p for p in multiprocessing.active_children() if p not in before]) and (
        time.monotonic() < deadline
    ):  # terminate() is stuck on a lock: end the workers without it
        for proc in procs:
            if proc.exitcode is None:
                proc.kill()
        for proc in procs:
            proc.join(max(0.0, deadline - time.monotonic()))
    return False
