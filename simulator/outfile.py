"""Output files the user names (``--out``): checked before the work, written whole or not at all.

A run that takes minutes must not fail at its last step because the file cannot be written, and
a file must never be left half-written (a full disk, a kill, Ctrl-C) over the user's previous
one. So ``check_output`` runs before any work: the extension must be one the command writes, the
target must not be a directory, and the nearest existing folder on its path must take a new file
(probed by creating and removing one). ``write_atomic`` then writes into a temporary file in the
same folder, fsyncs it, renames it over the target (atomic on POSIX file systems) and fsyncs the
folder; on any failure the temporary file is removed and the old file is untouched.

A target that exists and is not a regular file (``/dev/stdout``, a FIFO) is written in place:
renaming over a device node would replace it.
"""

from __future__ import annotations

import os
import stat
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path

from simulator.errors import InputError

__all__ = ["check_output", "write_atomic"]


def _special(path: Path) -> bool:
    try:
        mode = path.stat().st_mode
    except OSError:
        return False
    return not stat.S_ISREG(mode) and not stat.S_ISDIR(mode)


def check_output(
    path: str | os.PathLike, flag: str = "--out", suffixes: Sequence[str] | None = None
) -> Path:
    """Refuse, before any work, an output path that could not be written; the path.

    ``suffixes`` are the extensions the command writes (lower case, with the dot); ``""`` in
    it admits a name without one.
    """
    text = os.fspath(path)
    if not text.strip():
        raise InputError(f"{flag} needs a file name, got an empty one")
    path = Path(text)
    if suffixes is not None and path.suffix.lower() not in suffixes:
        shown = ", ".join(s if s else "no extension" for s in suffixes)
        raise InputError(f"{flag} {path}: unsupported extension; use {shown}")
    if path.is_dir():
        raise InputError(f"{flag} {path} is a directory; give a file name")
    if _special(path):
        return path
    folder = path.parent
    while not folder.exists() and folder != folder.parent:
        folder = folder.parent
    if not folder.is_dir():
        raise InputError(f"{flag} {path}: {folder} is not a directory")
    try:
        fd, probe = tempfile.mkstemp(prefix=".ckptsim-probe-", dir=folder)
    except OSError as exc:
        raise InputError(f"{flag} {path}: cannot write in {folder}: {exc.strerror}") from None
    os.close(fd)
    os.unlink(probe)
    return path


def write_atomic(path: str | os.PathLike, write: Callable[[Path], None], flag: str = "--out"):
    """Call ``write(tmp)`` to fill a temporary file, then move it onto ``path`` in one step.

    Missing parent folders are created. Errors (disk full, permissions) become one-line
    ``InputError``s naming ``flag``; the previous file at ``path``, if any, is left as it was.
    """
    path = Path(path)
    try:
        if _special(path):
            write(path)
            return path
        path.parent.mkdir(parents=True, exist_ok=True)
        fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except OSError as exc:
        raise InputError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
    os.close(fd)
    tmp = Path(tmp_name)
    try:
        # mkstemp makes the file private (0600); the result gets the mode any new file gets.
        umask = os.umask(0)
        os.umask(umask)
        os.chmod(tmp, 0o666 & ~umask)
        write(tmp)
        with open(tmp, "rb+") as f:
            os.fsync(f.fileno())
        os.replace(tmp, path)
        dir_fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
        try:
            os.fsync(dir_fd)
        finally:
            os.close(dir_fd)
    except OSError as exc:
        raise InputError(f"cannot write {flag} {path}: {exc.strerror or exc}") from None
    finally:
        # Whatever happened (a full disk, Ctrl-C), no temporary file stays behind.
        if tmp.exists():
            tmp.unlink()
    return path
