"""Checkpoints on object storage: any fsspec URL (``s3://bucket/run/``, ``memory://run``).

An object store has no directories, no rename and no lock, so the checkpoint root's rules
(:mod:`simulator.controller.storage`) are kept by other means, behind the same
:class:`~simulator.controller.storage.Storage` protocol, so retention, the commit and the
restore's choice run the very code they run on a disk:

- **What counts.** A checkpoint is the objects under ``step-NNNNNNNN/``, exactly the files of
  a :mod:`simulator.ckptio` checkpoint. It is written locally first (by the same
  :func:`~simulator.ckptio.write_checkpoint`, in a private staging directory: ``staging_dir``,
  else the system's temp directory; it needs room for one checkpoint), then uploaded object by
  object, the manifest (sizes and CRC-32s) last. The manifest is the commit: a prefix without
  one is an upload (or a deletion) cut short, never a checkpoint; it is not counted, not
  restored from and not reported as damage. The manifest is put create-only
  (``If-None-Match: *`` on S3): a committed checkpoint's manifest is never replaced, so of two
  writers committing one step only the first counts. A failed upload removes what it put.
- **Rename.** There is none; :meth:`FsspecStorage.rename` copies every object (the manifest
  last) and then deletes the source (the manifest first), so a crash leaves each name either
  complete or without a manifest, never half counted. It serves only rare moves (a re-saved
  step set aside, a rejected checkpoint moved aside). A deletion removes the manifest first,
  one request after which the checkpoint no longer counts, then the rest: ``atomic_rename`` is
  False, and retention deletes that way instead of renaming aside.
- **One writer.** There is no lock that ends with its holder: a lock object (even one created
  with ``If-None-Match``) outlives a SIGKILLed or lost node and would refuse every relaunch
  elsewhere until a person or a lease timer removed it, a wait added to every restart. So
  ckptsim takes no lock on an object store and applies the project's rule for directories that
  cannot be locked: retention counts and deletes only the checkpoints this process wrote, and
  the restore tidies nothing (a corrupt checkpoint is skipped with a warning, left in place;
  an unfinished upload is left too, and replaced when this run saves that step again). Nothing
  is lost that way, but keep_last no longer bounds the store: each relaunch leaves its last
  ``keep_last`` checkpoints behind for good, and a restore that finds more than a lock holder
  would keep says so in a warning. Unless
  ``exclusive=True``: the user's promise that no other process writes under the URL, which
  lets the checkpointer act as the lock holder does (retention over every checkpoint, so the
  keep-last bound holds across relaunches; rejected checkpoints moved aside; unfinished
  uploads removed at restore).
- **Reading.** A restore downloads a checkpoint into a private local directory only after its
  manifest (bounded in size, names checked by :func:`~simulator.ckptio.read_manifest`: no
  ``..``, no absolute or backslashed names, so no key outside the checkpoint's prefix is ever
  read or any file written outside the copy) agrees with the listing: every object listed,
  every listed object present at its listed size. The local copy then goes through the very
  checks of a local checkpoint: CRC-32s, layout, no pickle, safetensors and JSON only.

Credentials and endpoints come from the usual places of the fsspec implementation (for s3fs:
botocore's environment variables, ``~/.aws``, instance roles; ``AWS_ENDPOINT_URL`` for an
S3-compatible server). fsspec is imported on first use. ``file://`` URLs are local paths
(:class:`~simulator.controller.storage.LocalStorage`, with its lock and fsyncs).
"""

from __future__ import annotations

import errno
import json
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.ckptio.layout import shown, unsafe_name
from simulator.errors import InputError

__all__ = ["FsspecStorage", "NoLock", "is_url", "open_storage", "open_store", "refuse_url"]

MANIFEST = ckptio.MANIFEST
_SCHEME = re.compile(r"^[a-zA-Z][a-zA-Z0-9+.-]*://")


def is_url(directory: object) -> bool:
    """Whether ``directory`` is a URL (``s3://...``) rather than a local path."""
    return isinstance(directory, str) and _SCHEME.match(directory) is not None


def local_path_of(url: str) -> Path | None:
    """The local path of a ``file://`` URL, None for any other URL."""
    if url.startswith("file://"):
        return Path(url[len("file://") :] or "/")
    return None


def open_storage(directory: str | os.PathLike, **options: Any):
    """The storage a checkpoint root names: a local path or ``file://`` URL gives a
    :class:`~simulator.controller.storage.LocalStorage`, any other URL an
    :class:`FsspecStorage` (``options``: its keyword arguments)."""
    from simulator.controller.storage import LocalStorage

    if is_url(directory):
        local = local_path_of(str(directory))
        if local is None:
            return FsspecStorage(str(directory), **options)
        directory = local
    return LocalStorage(directory)


def refuse_url(who: str, directory: object) -> None:
    """The framework adapters write through their framework's own file-system code: an
    object-store URL is refused in one line (``file://`` too: give the path)."""
    if is_url(str(directory)):
        raise InputError(
            f"{who} checkpoints to a local or shared file system, not {directory}: give a "
            "directory, or use AdaptiveCheckpointer in a plain training loop for object storage"
        )


class FsspecStorage:
    """A checkpoint root at an fsspec URL (see the module docstring for the rules).

    ``staging_dir``: the local directory where a checkpoint is written before its upload and
    downloaded before its restore (default: the system's temp directory); each process's
    directories there are its own while it lives (a ``flock``), so jobs in other containers or
    on other hosts may share it. ``exclusive``: the
    user promises that no other process writes under the URL (no lock exists to check it).
    ``storage_options`` go to fsspec (for s3fs: ``endpoint_url``, ``key``, ``secret``...).
    """

    atomic_rename = False
    """No rename: a checkpoint is uploaded in place, manifest last; deletion is manifest first."""
    is_local = False

    def __init__(
        self,
        url: str,
        *,
        staging_dir: str | os.PathLike | None = None,
        exclusive: bool = False,
        **storage_options: Any,
    ):
        if not is_url(url):
            raise InputError(f"{url!r} is no URL: give s3://bucket/prefix, memory://name, ...")
        try:
            import fsspec
        except ImportError:
            raise InputError(
                f"checkpoints at {url} need fsspec (and s3fs for s3://): pip install 'ckptsim[s3]'"
            ) from None
        try:
            self.fs, root = fsspec.core.url_to_fs(url, **storage_options)
        except (ImportError, ValueError) as exc:
            raise InputError(f"cannot open {url}: {exc}") from None
        self.url = url.rstrip("/")
        self._root = root.rstrip("/")
        self.staging_dir = None if staging_dir is None else Path(staging_dir)
        self.exclusive = bool(exclusive)
        self._copies: dict[str, str] = {}  # checkpoint name -> its local download's temp dir
        self._owned: dict[str, Any] = {}  # staging dir -> the DirectoryLock that owns it

    # -- the Storage protocol -------------------------------------------------------------
    def key(self, name: str = "") -> str:
        """The store's path of ``name`` (relative to the root; checked to stay inside it)."""
        if not name:
            return self._root
        if (
            name.startswith("/")
            or "\\" in name
            or "\x00" in name
            or any(part in ("", ".", "..") for part in name.split("/"))
        ):
            raise ValueError(f"{shown(name)} is no name inside the checkpoint root {self.url}")
        return f"{self._root}/{name}"

    def describe(self, name: str = "") -> str:
        """``name`` as a URL, for messages."""
        return f"{self.url}/{name}" if name else self.url

    def list(self) -> list[str]:
        self.fs.invalidate_cache()
        try:
            entries = self.fs.ls(self._root, detail=False)
        except FileNotFoundError:
            return []
        return sorted({e.rstrip("/").rsplit("/", 1)[-1] for e in entries} - {""})

    def objects(self, name: str) -> dict[str, int]:
        """Every object under ``name``, as relative name -> size (``""``: ``name`` itself)."""
        self.fs.invalidate_cache()
        top = self.key(name)
        try:
            found = self.fs.find(top, withdirs=False, detail=True)
        except FileNotFoundError:
            return {}
        out = {}
        for path, info in found.items():
            if path.endswith("/"):
                continue  # a "folder" placeholder some tools create: no file of a checkpoint
            if path == top:
                out[""] = int(info.get("size") or 0)
            elif path.startswith(top + "/"):
                out[path[len(top) + 1 :]] = int(info.get("size") or 0)
        return out

    def exists(self, name: str) -> bool:
        return bool(self.objects(name))

    def is_symlink(self, name: str) -> bool:
        return False  # an object store has no links

    def remove(self, name: str) -> None:
        """Remove ``name`` and everything under it, its manifest first: from the first request
        on it no longer counts as a checkpoint, whatever interrupts the rest."""
        found = self.objects(name)
        if MANIFEST in found:
            self.fs.rm_file(self.key(f"{name}/{MANIFEST}"))
        rest = [self.key(name) if rel == "" else self.key(f"{name}/{rel}") for rel in found]
        rest = [k for k in rest if k != self.key(f"{name}/{MANIFEST}")]
        if rest:
            self.fs.rm(rest)
        self.fs.invalidate_cache()

    def rename(self, src: str, dst: str) -> None:
        """Copy ``src`` to ``dst`` (manifest last), then remove ``src`` (manifest first); fails
        when ``dst`` exists. Not atomic: a crash leaves each name complete or manifest-less."""
        if self.exists(dst):
            raise FileExistsError(f"cannot rename {src} to {dst}: {self.describe(dst)} exists")
        found = self.objects(src)
        if not found:
            raise FileNotFoundError(f"cannot rename {src}: {self.describe(src)} does not exist")
        for rel in sorted(found, key=lambda r: (r == MANIFEST, r)):
            if rel == "":
                self.fs.cp_file(self.key(src), self.key(dst))
            else:
                self.fs.cp_file(self.key(f"{src}/{rel}"), self.key(f"{dst}/{rel}"))
        self.remove(src)

    def sync(self, name: str = "") -> None:
        """Nothing to do: an object store has made a write durable when the request returns."""

    # -- checkpoints ----------------------------------------------------------------------
    def is_complete(self, name: str) -> bool:
        """Whether ``name`` has its manifest (the commit); its bytes are checked at restore."""
        return MANIFEST in self.objects(name)

    def unfinished(self, name: str) -> bool:
        """Whether ``name`` holds objects but no manifest: an upload or deletion cut short."""
        found = self.objects(name)
        return bool(found) and MANIFEST not in found

    def remove_unfinished(self) -> list[str]:
        """Remove every ``step-N`` prefix without a manifest; only with ``exclusive`` (no other
        process may be uploading). Returns the names removed."""
        from simulator.controller.storage import checkpoint_step

        if not self.exclusive:
            return []
        gone = [n for n in self.list() if checkpoint_step(n) is not None and self.unfinished(n)]
        for name in gone:
            self.remove(name)
        return gone

    def _staging(self, prefix: str) -> str:
        """A new local directory ``<prefix><pid>-<random>`` in the staging directory, owned
        through the checkpoint directories' own lock (:class:`~simulator.controller.lock.
        DirectoryLock`, a ``flock``) until :meth:`_unstage`; first, those whose owner is gone
        (a SIGKILL mid-upload) are removed (:func:`_remove_if_abandoned`)."""
        from simulator.controller.lock import DirectoryLock

        if self.staging_dir is not None:
            self.staging_dir.mkdir(parents=True, exist_ok=True)
        where = Path(self.staging_dir or tempfile.gettempdir())
        for old in where.glob(f"{prefix}*"):
            if not old.is_symlink() and old.is_dir():
                _remove_if_abandoned(old, prefix)
        tmp = tempfile.mkdtemp(prefix=f"{prefix}{os.getpid()}-", dir=where)
        lock = DirectoryLock(tmp)
        lock.acquire()  # a new directory: nobody else holds it
        self._owned[tmp] = lock
        return tmp

    def _unstage(self, tmp: str) -> None:
        """Remove staging directory ``tmp``, then let go of its ownership."""
        shutil.rmtree(tmp, ignore_errors=True)
        lock = self._owned.pop(tmp, None)
        if lock is not None:
            lock.release()

    def commit(self, name: str, write: Callable[[Path], None]) -> None:
        """Write checkpoint ``name``: ``write(path)`` makes a complete ckptio checkpoint at a
        new local ``path``, whose files are then uploaded, the manifest last and create-only.
        An unfinished upload already at ``name`` (a killed process's) is removed first; a
        complete checkpoint there is a :class:`FileExistsError`. A failure removes what this
        upload put and raises :class:`~simulator.ckptio.CheckpointWriteError`."""
        found = self.objects(name)
        if MANIFEST in found:
            raise FileExistsError(f"checkpoint {self.describe(name)} already exists")
        if found:
            self.remove(name)  # an upload cut short: never a checkpoint, and in the way
        tmp = self._staging("ckptsim-upload-")
        try:
            local = Path(tmp) / name
            local.parent.mkdir(parents=True, exist_ok=True)
            write(local)
            self.upload(local, name)
        finally:
            self._unstage(tmp)

    def upload(self, local: Path, name: str) -> None:
        """Upload the files of local checkpoint directory ``local`` as ``name``, the manifest
        last (create-only where it exists); on failure remove what was put and raise
        :class:`~simulator.ckptio.CheckpointWriteError`."""
        if self.is_complete(name):
            raise ckptio.CheckpointWriteError(
                f"checkpoint {self.describe(name)} is already committed; it is never replaced"
            )
        files = ckptio.checkpoint_files(local)
        put: list[str] = []
        try:
            for rel in sorted(files, key=lambda r: (r == MANIFEST, r)):
                key = self.key(f"{name}/{rel}")
                put.append(key)
                self._put(local / rel, key, create=rel == MANIFEST)
        except BaseException as exc:
            raced = isinstance(exc, FileExistsError)
            ours = [k for k in put if k != self.key(f"{name}/{MANIFEST}")]
            try:
                if not raced:  # after a lost race these keys hold the winner's files too
                    self.fs.rm(ours)
            except Exception:  # what is left has no manifest: never counted
                pass
            self.fs.invalidate_cache()
            if raced:
                raise ckptio.CheckpointWriteError(
                    f"could not commit {self.describe(name)}: another writer committed it first "
                    "(two runs write this URL; give each run its own)"
                ) from None
            if isinstance(exc, OSError | ValueError | RuntimeError):
                raise ckptio.CheckpointWriteError(
                    f"could not upload checkpoint {self.describe(name)}: {exc}"
                ) from exc
            raise
        self.fs.invalidate_cache()

    def _put(self, file: Path, key: str, *, create: bool) -> None:
        """One upload; ``create``: only if no object is at ``key`` (``If-None-Match: *``)."""
        self.fs.put_file(str(file), key, mode="create" if create else "overwrite")

    def local_copy(self, name: str) -> Path:
        """A local directory holding checkpoint ``name`` (downloaded once, until
        :meth:`drop_local_copies`). Refuses with :class:`~simulator.ckptio.CorruptCheckpoint`,
        before any byte but the manifest is fetched, a manifest that is missing, oversized or
        malformed, names an unsafe path, or disagrees with the objects under ``name``."""
        if name in self._copies:
            return Path(self._copies[name]) / name
        where = self.describe(name)
        found = self.objects(name)
        if MANIFEST not in found:
            raise ckptio.CorruptCheckpoint(
                f"{where}: {MANIFEST} is missing (the upload did not finish)"
            )
        if found[MANIFEST] > ckptio.MAX_MANIFEST_BYTES:
            raise ckptio.CorruptCheckpoint(
                f"{where}/{MANIFEST}: {found[MANIFEST]} bytes, larger than any manifest"
            )
        for rel in found:
            reason = unsafe_name(rel) if rel != MANIFEST else None
            if rel == "" or reason is not None:
                raise ckptio.CorruptCheckpoint(
                    f"{where}: holds an object named {shown(rel)}"
                    f"{'' if rel == '' else ', ' + reason}; no checkpoint file has such a name"
                )
        tmp = self._staging("ckptsim-restore-")
        try:
            local = Path(tmp) / name
            local.mkdir(parents=True)
            self.fs.get_file(self.key(f"{name}/{MANIFEST}"), str(local / MANIFEST))
            manifest = ckptio.read_manifest(local)
            files = manifest["files"]
            for rel in sorted(found):
                if rel not in files and not ckptio.may_be_unlisted(rel):
                    raise ckptio.CorruptCheckpoint(
                        f"{where}: {shown(rel)} is not listed in the manifest (every file of a "
                        "checkpoint is, so none can escape its checksum)"
                    )
            for rel, entry in files.items():
                if rel not in found:
                    raise ckptio.CorruptCheckpoint(
                        f"{where}: {shown(rel)} listed in the manifest is missing"
                    )
                if found[rel] != entry["bytes"]:
                    raise ckptio.CorruptCheckpoint(
                        f"{where}/{rel}: {found[rel]} bytes stored, manifest says "
                        f"{entry['bytes']} (truncated?)"
                    )
            for rel in sorted(files):
                target = local / rel  # rel passed unsafe_name: it stays inside ``local``
                target.parent.mkdir(parents=True, exist_ok=True)
                self.fs.get_file(self.key(f"{name}/{rel}"), str(target))
        except ckptio.CorruptCheckpoint:
            self._unstage(tmp)
            raise
        except (OSError, ValueError) as exc:
            # Our side of the download failed (the staging disk full, the network, access):
            # that says nothing about the checkpoint, which stays where it is, unjudged.
            # (What the store holds was judged above: its listing and the manifest.)
            self._unstage(tmp)
            raise ckptio.CheckpointReadError(
                getattr(exc, "errno", None) or errno.EIO,
                f"{where}: could not be downloaded into {tmp} "
                f"({getattr(exc, 'strerror', None) or exc}); it was not judged and nothing was "
                "moved aside or skipped: fix the cause (the staging_dir's free space, the "
                "network, credentials) and restore again",
            ) from exc
        except BaseException:
            self._unstage(tmp)
            raise
        self._copies[name] = tmp
        return local

    def drop_local_copies(self) -> None:
        """Delete every local copy :meth:`local_copy` made."""
        for tmp in self._copies.values():
            self._unstage(tmp)
        self._copies.clear()

    # -- small files (the run log) --------------------------------------------------------
    def read_bytes(self, name: str, limit: int) -> bytes:
        """The object ``name`` if it holds at most ``limit`` bytes (``OSError`` otherwise;
        ``FileNotFoundError`` when absent)."""
        size = self.objects(name).get("")
        if size is None:
            raise FileNotFoundError(self.describe(name))
        if size > limit:
            raise OSError(f"{self.describe(name)} is {size} bytes, more than {limit}")
        return self.fs.cat_file(self.key(name))

    def write_bytes(self, name: str, data: bytes) -> None:
        """Put ``data`` as object ``name`` (one request: all of it or nothing)."""
        self.fs.pipe_file(self.key(name), data)

    def names_under(self, prefix: str) -> list[str]:
        """Names of the objects under ``prefix``, relative to the root, sorted."""
        return sorted(f"{prefix}/{rel}" for rel in self.objects(prefix) if rel)

    def probe(self) -> str | None:
        """Check the root can be written (a probe object put and removed): None, or why not
        when it is readable but not writable. Raises InputError when it cannot be reached."""
        probe = f".ckptsim-probe-{os.getpid()}"
        try:
            self.write_bytes(probe, b"")
            self.fs.rm_file(self.key(probe))
        except PermissionError as exc:
            try:
                self.list()
            except Exception as inner:  # any client error: one line
                raise InputError(f"cannot reach {self.url}: {_reason(inner)}") from None
            return _reason(exc)
        except Exception as exc:  # no bucket, no credentials, no server
            raise InputError(f"cannot reach {self.url}: {_reason(exc)}") from None
        return None

    def __repr__(self) -> str:
        return f"FsspecStorage({self.url!r})"

    def __del__(self) -> None:
        self.drop_local_copies()


class NoLock:
    """The checkpointer's lock on an object store, where none exists: ``held`` is the user's
    promise (``exclusive``), and there is nothing to release."""

    def __init__(self, *, held: bool):
        self.held = held

    def release(self) -> None:
        pass


def open_store(storage: FsspecStorage) -> str | None:
    """What :func:`simulator.controller.lock.open_directory` is for a directory: None when
    the store can be written, :data:`~simulator.controller.lock.READ_ONLY` (with a warning)
    when it can only be read; InputError in one line when it cannot be reached at all."""
    import warnings

    from simulator.controller.lock import READ_ONLY

    why = storage.probe()
    if why is None:
        return None
    warnings.warn(
        f"checkpoint root {storage.url} cannot be written ({why}): restoring only; a save "
        "will fail",
        stacklevel=3,
    )
    return READ_ONLY


STALE_UNOWNED_S = 600.0
"""Age past which a staging directory without a lock file (one an older ckptsim made) whose pid
is not running here is taken as abandoned."""


def _remove_if_abandoned(old: Path, prefix: str) -> None:
    """Remove staging directory ``old`` if no live process owns it.

    Its owner holds its :class:`~simulator.controller.lock.DirectoryLock`: if this process can
    take that lock, nobody holds it, and the directory goes (with the lock held, so no one
    claims it meanwhile). The pid in its name alone does not decide: a process in another PID
    namespace (a container sharing the directory) or on another host (a shared file system) is
    not visible here, and its upload in flight must not be deleted. A directory without the
    lock file (an older ckptsim's, or one made this instant) goes only when its pid is not
    running here and it is older than :data:`STALE_UNOWNED_S`."""
    from simulator.controller.lock import LOCK_FILE, DirectoryLock

    if not (old / LOCK_FILE).exists():
        pid = old.name[len(prefix) :].split("-", 1)[0]
        try:
            age = time.time() - old.stat().st_mtime
        except OSError:
            return
        if pid.isdigit() and not _alive(int(pid)) and age > STALE_UNOWNED_S:
            shutil.rmtree(old, ignore_errors=True)
        return
    lock = DirectoryLock(old)
    try:
        lock.acquire()
    except (InputError, OSError):
        return  # owned by a live process (CheckpointLocked), or not ours to judge
    try:
        shutil.rmtree(old, ignore_errors=True)
    finally:
        lock.release()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True  # exists, not ours to signal
    return True


def _reason(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return f"{type(exc).__name__}: {text[0]}" if text else type(exc).__name__


def manifest_bytes(storage: FsspecStorage, name: str) -> int | None:
    """The size a committed checkpoint's manifest records, or None if unreadable."""
    try:
        manifest = json.loads(storage.read_bytes(f"{name}/{MANIFEST}", ckptio.MAX_MANIFEST_BYTES))
        return int(sum(entry["bytes"] for entry in manifest["files"].values()))
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return None
