"""The benchmark against object storage: ``ckptsim bench --dir s3://bucket/prefix``.

The same state, sizes, repeats and interleaving (orders balanced for carry-over) as on a disk
(:mod:`simulator.bench.runner`), with what a save and a restore mean on an object store:

- ``raw``: the state's own bytes put as one object from its memory (a multipart upload where
  the client splits it) and read back whole: the store's own bandwidth, the baseline.
- ``ckptsim``: exactly the controller's path
  (:class:`~simulator.controller.objstore.FsspecStorage`): the checkpoint is written locally
  by :mod:`simulator.ckptio` (fsync'ed) in a staging directory, then uploaded, manifest last;
  the restore downloads it after checking its manifest against the listing, then reads and
  CRC-checks it.
- ``torch`` and ``safetensors``: the file(s) each library writes (fsync'ed) in the staging
  directory, uploaded; the restore downloads them and loads with the library.

Save time therefore includes the local write, and restore time the download: both are what a
training job pays. DCP (``dcp``, ``dcp-async``) writes through its own file-system writer and is
not measured here; nor is ``--writers``. The staging directory is the system's temp
directory; the downloaded files are read back from its page cache.
"""

from __future__ import annotations

import secrets
import shutil
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from simulator.bench import formats as fmt_io
from simulator.bench.state import build_state, flatten, parse_size, unflatten
from simulator.errors import InputError

REMOTE_FORMATS = ("torch", "safetensors", "ckptsim")
"""Formats measured over an object store (see the module docstring)."""


def check_remote(cfg) -> None:
    """Refuse, in one line, what is not measured over an object store."""
    other = [f for f in cfg.formats if f not in REMOTE_FORMATS]
    if other:
        raise InputError(
            f"--formats {','.join(other)} cannot be measured at {cfg.directory}: over object "
            f"storage the formats are {','.join(REMOTE_FORMATS)} (DCP writes to a file system)"
        )
    if cfg.writers:
        raise InputError(
            f"--writers measures parallel writers on a file system, not at {cfg.directory}"
        )
    if cfg.reduced:
        raise InputError(
            f"{cfg.precision_label} is measured on a file system, not at {cfg.directory}"
        )


def open_remote(url: str):
    """The store at ``url``, checked to be writable (InputError in one line otherwise)."""
    from simulator.controller.objstore import FsspecStorage

    storage = FsspecStorage(url)
    why = storage.probe()
    if why is not None:
        raise InputError(f"--dir {url} cannot be written: {why}")
    return storage


def run_remote_benchmark(cfg, *, progress: bool = True):
    """Measure every (size, dtype, format) ``cfg.repeats`` times at the URL ``cfg.directory``."""
    from tqdm import tqdm

    from simulator.bench.runner import (
        check_resources,
        disk_errors_are_the_users,
        interleaved,
        machine_facts,
        summarise,
    )

    check_remote(cfg)
    storage = open_remote(str(cfg.directory))
    staging = Path(tempfile.mkdtemp(prefix="ckptsim-bench-staging-"))
    check_resources(cfg, disk=staging)
    jobs = ["raw", *cfg.formats]
    total = len(cfg.sizes) * len(cfg.dtypes) * cfg.repeats * len(jobs)
    samples: list[dict[str, Any]] = []
    work = f"ckptsim-bench-{secrets.token_hex(4)}"
    bar = tqdm(total=total, desc="bench", unit="save", disable=not progress, file=sys.stderr)
    try:
        for size in sorted(cfg.sizes, key=parse_size):
            for dtype in cfg.dtypes:
                bar.set_postfix_str(f"{size} {dtype}: building state")
                ts = build_state(parse_size(size), dtype=dtype, seed=cfg.seed)
                state = ts.state
                for rep, job in interleaved(jobs, cfg.repeats):
                    bar.set_postfix_str(f"{size} {dtype} {job}")
                    row = {"format": job, "size": size, "dtype": dtype, "repeat": rep}
                    row |= {"params": ts.params, "tensor_bytes": ts.tensor_bytes}
                    name = f"{work}/{job}-{rep}"
                    what = f"the {job} checkpoint ({size} {dtype})"
                    with disk_errors_are_the_users(what, cfg.directory):
                        state = _measure(job, state, storage, name, row)
                    samples.append(row)
                    bar.update()
                del ts, state
    finally:
        bar.close()
        try:
            storage.remove(work)
        except OSError:
            pass
        storage.drop_local_copies()
        shutil.rmtree(staging, ignore_errors=True)
    machine = machine_facts(Path(tempfile.gettempdir()))
    machine |= {"directory": str(cfg.directory), "staging_dir": tempfile.gettempdir()}
    notes = [
        f"object storage at {cfg.directory}: raw is one object put from memory and read back; "
        "formats are written in a local staging directory (fsync'ed) and uploaded, restores "
        "download and then load (from the page cache)"
    ]
    return summarise(samples, notes, machine)


def _measure(job: str, state: Any, storage, name: str, row: dict) -> Any:
    """One save and restore of ``job`` as ``name``; returns the state to carry on with."""
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            if job == "raw":
                row["save_s"] = _raw_put(storage, name, fmt_io.state_bytes(state))
                row["bytes"] = sum(storage.objects(name).values())
                row["load_s"] = _raw_get(storage, name)
                return state
            start = time.perf_counter()
            if job == "ckptsim":
                tensors, tree = flatten(state)
                storage.commit(name, lambda p: _write_ckptsim(p, tensors, tree))
                del tensors
            else:
                tmp = Path(tempfile.mkdtemp(prefix="ckptsim-bench-up-"))
                try:
                    fmt_io.SAVERS[job](state, tmp / "c")
                    for file in sorted((tmp / "c").iterdir()):
                        storage.fs.put_file(str(file), storage.key(f"{name}/{file.name}"))
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            row["save_s"] = time.perf_counter() - start
            row["bytes"] = sum(storage.objects(name).values())
            state = None  # hold one copy: the restored one
            start = time.perf_counter()
            if job == "ckptsim":
                from simulator import ckptio

                tensors, meta = ckptio.read_checkpoint(storage.local_copy(name), verify=True)
                state = unflatten(tensors, meta["tree"])
            else:
                tmp = Path(tempfile.mkdtemp(prefix="ckptsim-bench-down-"))
                try:
                    for rel in storage.objects(name):
                        storage.fs.get_file(storage.key(f"{name}/{rel}"), str(tmp / rel))
                    state = fmt_io.LOADERS[job](tmp)
                finally:
                    shutil.rmtree(tmp, ignore_errors=True)
            row["load_s"] = time.perf_counter() - start
            return state
    finally:
        storage.drop_local_copies()
        storage.remove(name)


def _write_ckptsim(path: Path, tensors, tree) -> None:
    from simulator import ckptio

    ckptio.write_checkpoint(path, tensors, {"tree": tree})


def _raw_put(storage, name: str, data: list[memoryview]) -> float:
    """Seconds to upload ``data`` (the state's own bytes, as the local raw baseline writes)
    as one object, no format."""
    start = time.perf_counter()
    with storage.fs.open(storage.key(f"{name}/raw.bin"), "wb") as f:
        for view in data:
            f.write(view)
    return time.perf_counter() - start


def _raw_get(storage, name: str) -> float:
    # read(), not readinto(): fsspec's readinto is a read() and then a copy into the buffer.
    start = time.perf_counter()
    with storage.fs.open(storage.key(f"{name}/raw.bin"), "rb") as f:
        while f.read(fmt_io._RAW_CHUNK):
            pass
    return time.perf_counter() - start
