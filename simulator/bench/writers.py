"""Parallel writers: N processes saving one sharded state at once, against N raw writers.

``ckptsim bench --writers 1,2,4,8`` starts, for each N, N processes joined by torch.distributed
(gloo on 127.0.0.1), each holding one shard (1/N of the state, keys of its own), and saves the
state the way the controller's DistributedBackend does: ``torch.distributed.checkpoint.save``
with ``FileSystemWriter(sync_files=True, single_file_per_rank=True)``. In the same processes
and the same run, interleaved by repeat, the same N write their shard's bytes with plain
``os.write`` + fsync (the raw disk driven by N parallel writers). All ranks start each job
from one barrier; a job's time is its slowest rank's (the stall everyone waits for), and the
aggregate bandwidth is all bytes over that time. ``commit_s`` is rank 0's ``finish`` (DCP's
``.metadata``, written after every rank's data) plus the directory fsync. Samples carry
``bench="writers"`` and ``writers``; :mod:`simulator.model.checkpoint_cost` fits the contention
curve.
"""

from __future__ import annotations

import json
import logging
import shutil
import socket
import tempfile
import time
from pathlib import Path
from typing import Any

JOBS = ("raw", "dcp")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def disk_error(exc: BaseException, rank: int) -> OSError | None:
    """The disk's error in a writer's failure, or None: ``exc`` itself, or one of the ranks'
    failures that DCP wraps in its ``CheckpointException`` (a BaseException)."""
    from torch.distributed.checkpoint.api import CheckpointException

    from simulator.controller.distributed import dcp_failures

    errors = [exc]
    if isinstance(exc, CheckpointException):
        errors = list(dcp_failures(exc, rank, own=False).values())
    return next((e for e in errors if isinstance(e, OSError)), None)


def _worker(
    rank: int, world: int, port: int, work: str, shard_bytes: int, repeats: int, failed
) -> None:
    import torch
    import torch.distributed as dist
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint import FileSystemWriter

    from simulator import ckptio
    from simulator.bench import formats as fmt_io

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world
    )
    timing: dict[str, float] = {}

    class TimedWriter(FileSystemWriter):
        def write_data(self, plan, planner):
            fut = super().write_data(plan, planner)
            fut.wait()  # FileSystemWriter writes (and fsyncs) synchronously; be sure
            timing["data_done"] = time.perf_counter()
            return fut

        def finish(self, metadata, results) -> None:
            start = time.perf_counter()
            super().finish(metadata, results)
            timing["finish_s"] = time.perf_counter() - start

    g = torch.Generator().manual_seed(rank)
    per = shard_bytes // 4 // 4
    state = {f"shard{rank}/t{i}": torch.randn(per, generator=g) for i in range(4)}
    nbytes = sum(t.numel() * t.element_size() for t in state.values())
    rows: list[dict[str, Any]] = []
    try:
        # The first write and fsync of a fresh process is slow for reasons of its own (page
        # faults, the journal): one untimed write keeps that out of the first repeat.
        fmt_io.raw_write(Path(work, f"warmup-{rank}"), 8 << 20)
        shutil.rmtree(Path(work, f"warmup-{rank}"), ignore_errors=True)
        for rep in range(repeats):
            shift = rep % len(JOBS)
            for job in JOBS[shift:] + JOBS[:shift]:
                where = Path(work, f"{job}-{world}-{rep}")
                if rank == 0:
                    where.mkdir()
                timing.clear()
                dist.barrier()
                start = time.perf_counter()
                if job == "raw":  # the shard's own bytes, as DCP writes them
                    fmt_io.raw_write(where / f"r{rank}", fmt_io.state_bytes(state))
                    timing["data_done"] = time.perf_counter()
                else:
                    writer = TimedWriter(where, sync_files=True, single_file_per_rank=True)
                    dcp.save(state, storage_writer=writer, process_group=dist.group.WORLD)
                if rank == 0:
                    commit = time.perf_counter()
                    ckptio.fsync_dir(where)
                    timing["finish_s"] = timing.get("finish_s", 0.0) + (
                        time.perf_counter() - commit
                    )
                total = time.perf_counter() - start
                mine = (total, timing["data_done"] - start, timing.get("finish_s", 0.0))
                everyone: list[Any] = [None] * world
                dist.all_gather_object(everyone, mine)
                if rank == 0:
                    on_disk = fmt_io.disk_bytes(where)
                    slowest = max(t for t, _, _ in everyone)
                    rows.append(
                        dict(bench="writers", format=job, writers=world, repeat=rep)
                        | dict(shard_bytes=nbytes, bytes=on_disk, tensor_bytes=nbytes * world)
                        | dict(save_s=slowest, aggregate_bytes_per_s=on_disk / slowest)
                        | dict(per_writer_bytes_per_s=[nbytes / d for _, d, _ in everyone])
                        | dict(commit_s=everyone[0][2])
                    )
                dist.barrier()
                if rank == 0:
                    shutil.rmtree(where, ignore_errors=True)
        if rank == 0:
            Path(work, "rows.json").write_text(json.dumps(rows))
    except BaseException as exc:
        # A full or failing disk is the user's to fix: the parent raises it as an OSError (a
        # one-line error), not as this process's traceback.
        disk = disk_error(exc, rank)
        if disk is None:
            raise
        failed.put((disk.errno, disk.strerror or str(disk)))
        raise disk from None  # an Exception: torch's spawn hands the parent its outcome
    finally:
        dist.destroy_process_group()


def run_writers(
    directory: Path, writers: tuple[int, ...], total_bytes: int, repeats: int
) -> list[dict[str, Any]]:
    """Samples for each writer count (see the module docstring); ``total_bytes`` is the whole
    state, split evenly over the writers."""
    import torch.multiprocessing as mp

    samples: list[dict[str, Any]] = []
    failed = mp.get_context("spawn").SimpleQueue()  # (errno, message) of a rank's disk error
    for n in writers:
        work = tempfile.mkdtemp(prefix="ckptsim-writers-", dir=directory)
        try:
            # Its warning that it stops the other ranks after one failed is no news to a user.
            spawn_log = logging.getLogger("torch.multiprocessing.spawn")
            level = spawn_log.level
            spawn_log.setLevel(logging.ERROR)
            try:
                mp.start_processes(
                    _worker,
                    args=(n, _free_port(), work, total_bytes // n, repeats, failed),
                    nprocs=n,
                    start_method="spawn",
                    join=True,
                )
            except (mp.ProcessRaisedException, mp.ProcessExitedException):  # a rank failed
                if failed.empty():
                    raise
                raise OSError(*failed.get()) from None
            finally:
                spawn_log.setLevel(level)
            samples.extend(json.loads(Path(work, "rows.json").read_text()))
        finally:
            shutil.rmtree(work, ignore_errors=True)
    return samples


def summarise_writers(samples: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Per (format, writers): medians over repeats of the aggregate bandwidth, the slowest
    rank's time, the commit cost and the per-writer bandwidths, and the ratio to the raw disk
    driven by the same number of writers (per repeat, then the median)."""
    import statistics

    rows = [s for s in samples if s.get("bench") == "writers"]
    raw = {(r["writers"], r["repeat"]): r for r in rows if r["format"] == "raw"}
    out = []
    for fmt, n in sorted({(r["format"], r["writers"]) for r in rows}, key=lambda k: (k[1], k[0])):
        group = [r for r in rows if r["format"] == fmt and r["writers"] == n]
        ratios = [
            r["aggregate_bytes_per_s"] / raw[n, r["repeat"]]["aggregate_bytes_per_s"]
            for r in group
            if (n, r["repeat"]) in raw
        ]
        per_writer = [bw for r in group for bw in r["per_writer_bytes_per_s"]]
        out.append(
            dict(format=fmt, writers=n, repeats=len(group), shard_bytes=group[0]["shard_bytes"])
            | dict(
                aggregate_bytes_per_s=statistics.median(r["aggregate_bytes_per_s"] for r in group),
                slowest_s=statistics.median(r["save_s"] for r in group),
                commit_s=statistics.median(r["commit_s"] for r in group),
                per_writer_bytes_per_s_min=min(per_writer),
                per_writer_bytes_per_s_median=statistics.median(per_writer),
                ratio_to_raw=statistics.median(ratios) if ratios else None,
            )
        )
    return out
