"""One writer per checkpoint directory: an exclusive lock held for the checkpointer's lifetime.

A requeued job can start while the old one still runs; two writers in one directory would
delete each other's temporary directories and checkpoints. So the process that writes (rank 0
under torch.distributed: every rank shares the directory) holds ``flock(LOCK_EX)`` on
``.ckptsim.lock`` in it from construction to ``close()``, and writes its pid, host and start
time into the file so that a second process is refused with :class:`CheckpointLocked` naming
the holder. The kernel drops the lock when the holder dies, SIGKILL included, so a stale lock
never outlives its process (the file stays, holding the last holder's name; it is never
deleted, since unlinking a lock file races with a process that has just opened it).

``flock`` belongs to the open file, which ``fork`` shares: a forked child (a DataLoader
worker) would keep the lock alive after its parent died, so children close their copy at fork,
which leaves the parent's lock in place. On NFS, Linux implements ``flock`` with the server's
byte-range locks, so the lock holds across nodes; a file system without lock support (Lustre
mounted without ``flock``) gets a warning and no lock.
"""

from __future__ import annotations

import errno
import fcntl
import json
import os
import socket
import time
import warnings
import weakref
from pathlib import Path

from simulator.controller.integrity import CheckpointLocked, CheckpointWriteError

__all__ = ["LOCK_FILE", "READ_ONLY", "DirectoryLock", "open_directory"]

LOCK_FILE = ".ckptsim.lock"
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""An ``open`` failing with one of these means the directory cannot be written at all."""

READ_ONLY = "read-only"
"""What :func:`open_directory` returns for a directory that cannot be written."""

_held: weakref.WeakSet[DirectoryLock] = weakref.WeakSet()


class DirectoryLock:
    """An exclusive, non-blocking ``flock`` on ``<root>/.ckptsim.lock``."""

    def __init__(self, root: str | os.PathLike):
        self.path = Path(root) / LOCK_FILE
        self._fd: int | None = None

    @property
    def held(self) -> bool:
        return self._fd is not None

    def acquire(self) -> None:
        """Take the lock or raise :class:`CheckpointLocked` naming its holder.

        Other ``OSError``: the file cannot be created (``errno`` in :data:`READ_ONLY_ERRNOS`
        for a read-only directory) or the file system does not lock; the caller decides.
        """
        if self._fd is not None:
            return
        fd = os.open(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o644)
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _read_holder(fd)
            os.close(fd)
            raise CheckpointLocked(_locked_message(self.path.parent, holder)) from None
        except BaseException:
            os.close(fd)
            raise
        record = {
            "pid": os.getpid(),
            "host": socket.gethostname(),
            "since": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        }
        try:
            os.ftruncate(fd, 0)
            os.pwrite(fd, (json.dumps(record) + "\n").encode(), 0)
        except OSError:
            pass  # the lock holds without the note; a contender is told "unknown holder"
        self._fd = fd
        _held.add(self)

    def release(self) -> None:
        fd, self._fd = self._fd, None
        if fd is None:
            return
        _held.discard(self)
        try:
            fcntl.flock(fd, fcntl.LOCK_UN)
        finally:
            os.close(fd)

    def __del__(self) -> None:
        self.release()

    def _forget_in_child(self) -> None:
        # The child's copy of the descriptor goes without LOCK_UN, which would drop the
        # parent's lock too (one open file, one lock).
        fd, self._fd = self._fd, None
        if fd is not None:
            os.close(fd)


def open_directory(root: Path, lock: DirectoryLock) -> str | None:
    """Create ``root`` and take its lock: None when held, :data:`READ_ONLY`, or the message of
    the :class:`CheckpointLocked` refusal when another run holds it.

    A file system that cannot lock is warned about and used unlocked (``lock.held`` is False:
    nothing may then be cleaned up in it).
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointWriteError(
            f"cannot create the checkpoint directory {root}: {exc.strerror or exc}"
        ) from None
    try:
        lock.acquire()
    except CheckpointLocked as exc:
        return str(exc)
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS and not os.access(root, os.W_OK):
            warnings.warn(
                f"checkpoint directory {root} is read-only: restoring only (no lock, no run "
                "log, no clean-up); a save will fail",
                stacklevel=3,
            )
            return READ_ONLY
        warnings.warn(
            f"cannot lock checkpoint directory {root} ({exc.strerror or exc}): nothing stops "
            "a second run from writing into it, so nothing is cleaned up in it",
            stacklevel=3,
        )
    return None


def _read_holder(fd: int) -> dict:
    try:
        holder = json.loads(os.pread(fd, 4096, 0) or b"{}")
    except (OSError, ValueError):
        return {}
    return holder if isinstance(holder, dict) else {}


def _locked_message(root: Path, holder: dict) -> str:
    pid, host = holder.get("pid", "unknown"), holder.get("host", "unknown host")
    who = f"pid {pid} on {host}"
    if pid == os.getpid() and host == socket.gethostname():
        who += " (this process: close() the other AdaptiveCheckpointer on it first)"
    since = f", since {holder['since']}" if "since" in holder else ""
    return (
        f"checkpoint directory {root} is in use by another run ({who}{since}); two writers "
        "would destroy each other's checkpoints: wait for it to end or stop it, or use "
        "another directory"
    )


def _after_fork_in_child() -> None:
    for lock in list(_held):
        lock._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
