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
mounted without ``flock``) gets a warning and no lock, and the run then deletes nothing in the
directory but the checkpoints it wrote itself.

The holder's note is written into the lock file, so the file must be the directory's own: a
symlink, a FIFO, a directory or a hard link planted at its name (``cp -al`` copies make hard
links) is refused with :class:`CheckpointWriteError`, never written through. A directory that is not
readable is refused in one line; one that is readable but not writable (``chmod a-w``, a
read-only mount) is opened for restoring only (:data:`READ_ONLY`).
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
from simulator.controller.runlog import open_regular
from simulator.errors import InputError

__all__ = ["LOCK_FILE", "READ_ONLY", "DirectoryLock", "open_directory"]

LOCK_FILE = ".ckptsim.lock"
READ_ONLY_ERRNOS = frozenset({errno.EROFS, errno.EACCES, errno.EPERM})
"""An ``open`` failing with one of these means the directory cannot be written at all."""

_NOT_OURS = frozenset({errno.ELOOP, errno.EINVAL, errno.EMLINK, errno.EISDIR})
"""How :func:`~simulator.controller.runlog.open_regular` refuses a symlink, a FIFO or device,
and a hard link at the lock file's name (and ``open`` a directory): never a reason to run
unlocked."""

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
        try:
            fd = open_regular(self.path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC)
        except OSError as exc:
            if exc.errno == errno.EISDIR:
                exc = OSError(exc.errno, f"{self.path} is a directory")
            if exc.errno in _NOT_OURS:
                # The holder's note is written into the file: through a planted link it would
                # overwrite a file outside the directory.
                raise CheckpointWriteError(
                    f"cannot lock the checkpoint directory: {exc.strerror}; remove it (it holds "
                    "only a note of the lock's last holder) and launch again"
                ) from None
            raise
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
    nothing but the checkpoints this process wrote may then be deleted in it).
    """
    try:
        root.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise CheckpointWriteError(
            f"cannot create the checkpoint directory {root}: {exc.strerror or exc}"
        ) from None
    try:
        os.listdir(root)
    except OSError as exc:
        raise InputError(
            f"cannot read the checkpoint directory {root} ({exc.strerror or exc}): give this "
            "user read, write and search permission on it (chmod u+rwx) or use another directory"
        ) from None
    if not os.access(root, os.W_OK | os.X_OK):
        # Made read-only (chmod a-w) while its files, the lock file too, stay writable: the lock
        # could be taken and its note written, but nothing else could be cleaned up or saved.
        return _read_only(root)
    try:
        lock.acquire()
    except CheckpointLocked as exc:
        return str(exc)
    except CheckpointWriteError:
        raise  # an OSError, but a refusal: the lock file is not the directory's own
    except OSError as exc:
        if exc.errno in READ_ONLY_ERRNOS and not os.access(root, os.W_OK):
            return _read_only(root)
        warnings.warn(
            f"cannot lock checkpoint directory {root} ({exc.strerror or exc}): nothing stops "
            "a second run from writing into it, so nothing but this run's own checkpoints is "
            "cleaned up in it",
            stacklevel=3,
        )
        return None
    return None


def _read_only(root: Path) -> str:
    warnings.warn(
        f"checkpoint directory {root} is read-only: restoring only (no lock, no run log, no "
        "clean-up); a save will fail",
        stacklevel=4,
    )
    return READ_ONLY


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
    stale = ""
    if host != socket.gethostname() and host != "unknown host":
        # A lock can outlive its holder only on a network file system: NFS keeps a dead
        # client's locks until the server's lease for it expires.
        stale = (
            f"; if {host} is gone, its lock ends when the file server's lease expires "
            "(about 90 s on NFSv4): retry then"
        )
    elif isinstance(pid, int) and pid != os.getpid() and not _alive(pid):
        stale = (
            f"; pid {pid} is no longer running here, so a process that shares its open lock "
            "file holds it (a child it forked that did not close it, or a process of the same "
            "host name elsewhere)"
        )
    return (
        f"checkpoint directory {root} is in use by another run ({who}{since}); two writers "
        f"would destroy each other's checkpoints: wait for it to end or stop it, or use "
        f"another directory{stale}"
    )


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    return True


def _after_fork_in_child() -> None:
    for lock in list(_held):
        lock._forget_in_child()


os.register_at_fork(after_in_child=_after_fork_in_child)
