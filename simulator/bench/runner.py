"""The benchmark loop: interleaved, repeated, fsync'ed saves and cold restores per format.

Within one size, each repeat runs the raw baseline and every format once, in orders balanced so
that each job follows each other one about equally often (:func:`interleaved`): slow drift of
the disk (or of neighbours on a shared machine) spreads over all formats, and what one job
leaves behind for the next does not land on one; each format's bandwidth is reported as a ratio to
the raw sequential write of the same bytes measured in the same run (restores to the raw read
of the same repeat). The restore goal's ratio is a tighter pair still: each repeat of
``ckptsim`` times a raw read of its own tensor file right beside its restore. With a reduced
``optimizer_precision`` or ``weights_precision`` each format that takes it
(:data:`~simulator.bench.formats.REDUCIBLE`) is measured twice per repeat, exact and reduced,
side by side in the same repeat, and each reduced row carries its ratios to the exact one
(bytes, save and restore time). With ``writers`` the largest size is then saved sharded over
that many processes at once (:mod:`simulator.bench.writers`). Only one checkpoint exists on
disk at a time, and everything written is removed on exit, Ctrl-C included."""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import functools
import gc
import itertools
import math
import os
import platform
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simulator import ckptio
from simulator.bench import formats as fmt_io
from simulator.bench.state import DTYPES, FORMATS, build_state, parse_size
from simulator.engines.budget import mem_available_bytes
from simulator.engines.results import ratio_intervals, ratio_verdict
from simulator.errors import InputError
from simulator.model.checkpoint_cost import BYTES_PER_PARAM, CostProfile

GOAL_WRITER_RATIO = 0.90
GOAL_RESTORE_RATIO = 0.90
GOAL_ASYNC_STALL_RATIO = 0.10
_DISK_MARGIN_BYTES = 512 << 20


@dataclass(frozen=True, kw_only=True)
class BenchConfig:
    """What to measure and where."""

    directory: Path | str
    """Directory to write checkpoints in (on the disk being measured), or an object-store URL
    (``s3://bucket/prefix``: :mod:`simulator.bench.remote`)."""
    sizes: tuple[str, ...] = ("25M", "200M")
    """Model sizes, e.g. 25M, 200M, 1B (parameters)."""
    formats: tuple[str, ...] = FORMATS
    """Formats to measure; ``ckptsim`` also measures its async path as ``ckptsim-async``."""
    dtypes: tuple[str, ...] = ("fp32",)
    """fp32 (12 B/param) and/or bf16 with fp32 master weights (14 B/param)."""
    repeats: int = 3
    """Repeats per (size, format)."""
    writers: tuple[int, ...] = ()
    """Parallel writer counts (``--writers 1,2,4,8``): the largest size's fp32 state is saved
    sharded over that many processes, against as many raw writers (see
    :mod:`simulator.bench.writers`); empty: no parallel-writer pass."""
    writer_repeats: int | None = None
    """Repeats of the parallel-writer pass (None: ``repeats``); a contention curve needs
    fewer than a goal ratio's interval does."""
    optimizer_precision: str = "fp32"
    """AdamW's moments as the controller's ``optimizer_precision`` stores them: fp32 (exact),
    bf16 or int8 (blockwise, :mod:`simulator.controller.precision`)."""
    weights_precision: str = "fp32"
    """The model's weights as the controller's ``weights_precision`` stores them: fp32 (exact)
    or bf16."""
    pause_s: float = 0.0
    """Seconds left idle before each timed save and each timed restore (and before the raw
    jobs' and the paired raw read's clocks), after the previous job's files and pages are let
    go (``--pause``): 0 times them back to back. On a VM that hands freed memory back to its
    host (:func:`free_page_reporting`) a save made after minutes of training allocates page
    cache from reclaimed memory; a pause of a few seconds times that save, which back-to-back
    jobs, reusing memory just freed, do not (``reports/vm-memory.md``)."""
    warm_memory: bool = False
    """Right before each clock :attr:`pause_s` would pause at, touch and let go of
    :data:`WARM_FACTOR` times the state's bytes (``--warm-memory``,
    :func:`~simulator.bench.formats.warm_memory`): on a VM that hands freed memory back to its
    host, every timed job then takes memory the host backs, as on a machine that does not
    (a GPU node's), instead of whichever job follows a lull paying the host's faults. The
    opposite of a pause; the two are not taken together."""
    seed: int = 0

    def __post_init__(self):
        from simulator.controller.precision import WEIGHT_PRECISIONS, check_precision

        check_precision(self.optimizer_precision, name="--optimizer-precision")
        check_precision(
            self.weights_precision, name="--weights-precision", allowed=WEIGHT_PRECISIONS
        )
        unknown = [f for f in self.formats if f not in FORMATS]
        if unknown or not self.formats:
            raise InputError(
                f"unknown format {', '.join(unknown) or '(none)'}: use {', '.join(FORMATS)}"
            )
        bad = [d for d in self.dtypes if d not in DTYPES]
        if bad or not self.dtypes:
            raise InputError(f"unknown dtype {', '.join(bad) or '(none)'}: use fp32, bf16")
        if not self.sizes:
            raise InputError("give at least one model size, e.g. --sizes 25M")
        for s in self.sizes:
            parse_size(s)
        if self.repeats < 1:
            raise InputError(f"repeats must be at least 1, got {self.repeats}")
        if not 0 <= self.pause_s < math.inf:  # NaN fails this too
            raise InputError(f"pause must be a finite number of seconds >= 0, got {self.pause_s}")
        if self.pause_s and self.warm_memory:
            raise InputError(
                "--pause and --warm-memory time opposite cases (memory the host took back, "
                "memory it backs): give one"
            )
        if self.writer_repeats is not None and self.writer_repeats < 1:
            raise InputError(f"writer repeats must be at least 1, got {self.writer_repeats}")
        bad_writers = [w for w in self.writers if isinstance(w, bool) or not isinstance(w, int)]
        if bad_writers or any(w < 1 for w in self.writers):
            raise InputError(
                f"writers must be whole numbers >= 1, got {','.join(map(str, self.writers))}"
            )
        if self.reduced:
            plain = [f for f in self.formats if f not in fmt_io.REDUCIBLE]
            if plain:
                raise InputError(
                    f"--formats {','.join(plain)} cannot be measured with "
                    f"{self.precision_label}: reduced saves are measured in "
                    f"{','.join(f for f in FORMATS if f in fmt_io.REDUCIBLE)} (plain DCP "
                    "restores in place into the exact state's tensors)"
                )

    @property
    def reduced(self) -> bool:
        """Whether a reduced precision was asked for (then exact and reduced are measured)."""
        return (self.optimizer_precision, self.weights_precision) != ("fp32", "fp32")

    @property
    def precision_label(self) -> str:
        return (
            f"--optimizer-precision {self.optimizer_precision} "
            f"--weights-precision {self.weights_precision}"
        )

    @property
    def jobs(self) -> list[str]:
        jobs = ["raw", *self.formats]
        if "ckptsim" in self.formats:
            jobs.insert(jobs.index("ckptsim") + 1, "ckptsim-async")
        if self.reduced:  # each reduced save next to its exact one in each repeat
            jobs = [j for job in jobs for j in (job, job + REDUCED)[: 1 + (job != "raw")]]
        return jobs


REDUCED = "+reduced"
"""A job's suffix for the reduced-precision save of its format (rows carry the format itself
and the precisions)."""


def exact(row: dict[str, Any]) -> bool:
    """Whether a sample or result row is an exact save (stored profiles before reduced
    precision have no precision keys: exact)."""
    return row.get("optimizer_precision", "fp32") == row.get("weights_precision", "fp32") == "fp32"


@dataclass
class BenchResult:
    """Aggregated results, raw samples, goal ratios and the machine they came from."""

    raw_bytes_per_s: float
    raw_read_bytes_per_s: float
    results: list[dict[str, Any]]
    samples: list[dict[str, Any]]
    goals: dict[str, Any]
    machine: dict[str, Any]
    notes: list[str] = field(default_factory=list)
    writers: list[dict[str, Any]] = field(default_factory=list)
    """Per (format, writer count) summaries of the parallel-writer pass."""

    def to_json(self) -> dict[str, Any]:
        from dataclasses import asdict

        return {
            "writers": self.writers,
            "contention": {k: asdict(v) for k, v in self.profile().contention.items()},
            "raw_bytes_per_s": self.raw_bytes_per_s,
            "raw_read_bytes_per_s": self.raw_read_bytes_per_s,
            "results": self.results,
            "samples": self.samples,
            "goals": self.goals,
            "machine": self.machine,
            "notes": self.notes,
        }

    def profile(self) -> CostProfile:
        """The cost profile of the exact saves. Reduced-precision samples are left out: the
        simulator scales a fit to other sizes by bytes per parameter of the exact state
        (:data:`~simulator.model.checkpoint_cost.BYTES_PER_PARAM` x the format's measured
        overhead), so a reduced fit would carry this run's reduction ratio into another dtype
        and mix two byte counts under one format name."""
        return CostProfile.from_samples([s for s in self.samples if exact(s)], self.machine)


def check_directory(directory: Path) -> None:
    if not directory.is_dir():
        raise InputError(f"--dir {directory} is not an existing directory")
    try:
        probe = tempfile.mkdtemp(prefix=".ckptsim-probe-", dir=directory)
    except OSError as exc:
        raise InputError(f"--dir {directory} is not writable: {exc.strerror}") from None
    os.rmdir(probe)


def estimated_bytes(size: str, dtype: str) -> int:
    return int(parse_size(size) * BYTES_PER_PARAM[dtype] * 1.05)


def check_resources(cfg: BenchConfig, *, disk: Path | None = None) -> None:
    """Refuse up front what cannot fit: one checkpoint on disk (``disk``: where it is written,
    ``cfg.directory`` by default), one state in memory."""
    largest = max(estimated_bytes(s, d) for s in cfg.sizes for d in cfg.dtypes)
    disk = Path(cfg.directory) if disk is None else disk
    free = shutil.disk_usage(disk).free
    need = int(largest * 1.1) + _DISK_MARGIN_BYTES
    if free < need:
        raise InputError(
            f"too little free disk in {disk}: the largest checkpoint needs "
            f"~{need / 1e9:.1f} GB, {free / 1e9:.1f} GB free"
        )
    mem = mem_available_bytes()
    # Building the state briefly holds gradients too; a reduced save holds its encoded copy
    # (at most half the state: bf16 moments and weights) beside the state.
    need = largest * (1.6 if cfg.reduced else 1.3)
    if need > mem:
        raise InputError(
            f"too little memory for the largest size: its state needs ~{need / 1e9:.1f} "
            f"GB of RAM, {mem / 1e9:.1f} GB available"
        )


def machine_facts(directory: Path) -> dict[str, Any]:
    import torch

    facts: dict[str, Any] = {
        "platform": platform.platform(),
        "python": platform.python_version(),
        "torch": torch.__version__,
        "cpu_count": os.cpu_count(),
        "mem_total_bytes": os.sysconf("SC_PHYS_PAGES") * os.sysconf("SC_PAGE_SIZE"),
        "cuda": torch.cuda.is_available(),
        "date_utc": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "directory": str(directory),
        "disk_total_bytes": shutil.disk_usage(directory).total,
    }
    facts.update(_mount_of(directory))
    facts["free_page_reporting"] = free_page_reporting()
    return facts


_BALLOON = "0x0005"
"""virtio device id of a memory balloon."""
_BALLOON_F_REPORTING = 5
"""The balloon's free page reporting feature bit (``VIRTIO_BALLOON_F_REPORTING``)."""


def free_page_reporting(devices: Path = Path("/sys/bus/virtio/devices")) -> bool | None:
    """Whether this machine is a VM that hands free memory back to its host through a virtio
    balloon with free page reporting: True, False (a balloon without it), or None (no virtio
    balloon found: not a VM, another hypervisor's balloon, or not Linux). What it does to
    timings: :data:`FREE_PAGE_NOTE`."""
    found = None
    try:
        entries = list(devices.iterdir())
    except OSError:
        return None
    for dev in entries:
        try:
            if (dev / "device").read_text().strip() != _BALLOON:
                continue
            bits = (dev / "features").read_text().strip()
        except OSError:
            continue  # one unreadable device says nothing of the others
        found = bool(found) or bits[_BALLOON_F_REPORTING : _BALLOON_F_REPORTING + 1] == "1"
    return found


FREE_PAGE_NOTE = (
    "this VM hands memory left free for a second or two back to its host (virtio-balloon "
    "free page reporting), and using it again costs a fault on the host: a job that follows "
    "a pause pays it, whichever job that is, so expect wide intervals. A save after minutes "
    "of training meets such memory too and can take several times a back-to-back save "
    "(ckptsim bench --pause 5 times that save; python experiments/vm_memory.py measures the "
    "effect on this machine)"
)
"""What a run on such a VM notes (see :func:`free_page_reporting`); measured on the project's
VM by ``experiments/vm_memory.py`` (README)."""


def _mount_of(directory: Path) -> dict[str, str]:
    best = ("", "", "")
    try:
        with open("/proc/mounts") as f:
            for line in f:
                dev, mnt, fstype = line.split()[:3]
                if str(directory.resolve()).startswith(mnt) and len(mnt) > len(best[1]):
                    best = (dev, mnt, fstype)
    except OSError:
        return {}
    return {"disk_device": best[0], "mount_point": best[1], "filesystem": best[2]}


def run_benchmark(cfg: BenchConfig, *, progress: bool = True) -> BenchResult:
    """Measure every (size, dtype, format) ``cfg.repeats`` times; see the module docstring.
    An object-store URL as ``cfg.directory`` is measured by :mod:`simulator.bench.remote`."""
    from tqdm import tqdm

    from simulator.controller.objstore import is_url, local_path_of

    if is_url(str(cfg.directory)):
        local = local_path_of(str(cfg.directory))
        if local is None:
            from simulator.bench.remote import run_remote_benchmark

            if cfg.pause_s or cfg.warm_memory:
                flag = "--pause" if cfg.pause_s else "--warm-memory"
                raise InputError(
                    f"{flag} times a local disk's page cache: give a local --dir (a path or "
                    "a file:// URL)"
                )

            return run_remote_benchmark(cfg, progress=progress)
        cfg = dataclasses.replace(cfg, directory=local)

    directory = Path(cfg.directory)
    check_directory(directory)
    check_resources(cfg)
    jobs = cfg.jobs
    total = len(cfg.sizes) * len(cfg.dtypes) * cfg.repeats * len(jobs)
    samples: list[dict[str, Any]] = []
    notes: list[str] = []
    if cfg.reduced:
        notes.append(
            f"reduced saves ({cfg.optimizer_precision} moments, {cfg.weights_precision} "
            "weights) measured beside the exact ones; the goal ratios and the cost profile "
            "(--out) are the exact saves'"
        )
    if cfg.pause_s:
        notes.append(
            f"every timed save and restore (the raw jobs' too) began after {cfg.pause_s:g} s "
            "idle (--pause): the cost of a save made after a while of training where a host "
            "reclaims freed memory, paid by both sides of each goal ratio"
        )
    if cfg.warm_memory:
        notes.append(
            f"every timed save and restore (the raw jobs' too) began right after {WARM_FACTOR:g}x "
            "the state's bytes of memory were touched and let go (--warm-memory): each took "
            "memory its host backs, as on a machine that does not reclaim freed memory"
            + ("; not the parallel writers, each in a process of its own" if cfg.writers else "")
        )
    if cfg.weights_precision == "bf16" and "bf16" in cfg.dtypes:
        notes.append(
            "--weights-precision bf16 reduces nothing at --dtypes bf16: the model's weights are "
            "bf16 already and the fp32 masters are saved exactly, as the controller saves them"
        )
    work = Path(tempfile.mkdtemp(prefix="ckptsim-bench-", dir=directory))
    bar = tqdm(total=total, desc="bench", unit="save", disable=not progress, file=sys.stderr)
    try:
        for size in sorted(cfg.sizes, key=parse_size):
            for dtype in cfg.dtypes:
                bar.set_postfix_str(f"{size} {dtype}: building state")
                ts = build_state(parse_size(size), dtype=dtype, seed=cfg.seed)
                params, tensor_bytes = ts.params, ts.tensor_bytes
                held = [ts.state]  # the one reference: a restore lets go of it before its clock
                del ts
                roomy = 2.2 * tensor_bytes < mem_available_bytes()
                # One untimed write of the state's size first: the first large write after the
                # state was built is slow for reasons of its own (fresh page-cache memory), and
                # it would always land on the raw baseline, first in the first repeat.
                with disk_errors_are_the_users(f"the warm-up write ({size} {dtype})", directory):
                    fmt_io.raw_write(work / f"warmup-{size}-{dtype}", fmt_io.state_bytes(held[0]))
                shutil.rmtree(work / f"warmup-{size}-{dtype}", ignore_errors=True)
                for rep, job in interleaved(jobs, cfg.repeats):
                    fmt, reduced = job.removesuffix(REDUCED), job.endswith(REDUCED)
                    bar.set_postfix_str(f"{size} {dtype} {job}")
                    if fmt in fmt_io.COPYING and not roomy:
                        note = f"{fmt} skipped at {size} {dtype}: a second copy won't fit in RAM"
                        if note not in notes:
                            notes.append(note)
                        bar.update()
                        continue
                    row = {"format": fmt, "size": size, "dtype": dtype, "repeat": rep}
                    row |= {"params": params, "tensor_bytes": tensor_bytes}
                    if fmt != "raw":
                        row["optimizer_precision"] = cfg.optimizer_precision if reduced else "fp32"
                        row["weights_precision"] = cfg.weights_precision if reduced else "fp32"
                    row |= {"pause_s": cfg.pause_s, "warm_memory": cfg.warm_memory}
                    with disk_errors_are_the_users(
                        f"the {job} checkpoint ({size} {dtype})", directory
                    ):
                        where = work / f"{job}-{rep}"
                        _measure(job, held, where, row, _before_clock(cfg, tensor_bytes))
                    samples.append(row)
                    bar.update()
                del held
        if cfg.writers:
            from simulator.bench.writers import run_writers

            bar.set_postfix_str(f"writers {','.join(map(str, cfg.writers))}")
            largest = max(parse_size(s) for s in cfg.sizes) * int(BYTES_PER_PARAM["fp32"])
            repeats = cfg.repeats if cfg.writer_repeats is None else cfg.writer_repeats
            with disk_errors_are_the_users("the concurrent-writer files", directory):
                samples.extend(run_writers(work, cfg.writers, largest, repeats))
    finally:
        bar.close()
        shutil.rmtree(work, ignore_errors=True)
    return summarise(samples, notes, machine_facts(directory))


WARM_FACTOR = 2.0
"""How much memory ``--warm-memory`` touches before each clock, in multiples of the state's
bytes: the most a timed job takes (an async save's staging copy and its file's page cache; a
restore's tensors and its page cache)."""


def _before_clock(cfg: BenchConfig, tensor_bytes: int) -> Callable[[], None]:
    """What runs right before each clock of a job: :attr:`BenchConfig.pause_s` idle, or
    :attr:`BenchConfig.warm_memory`'s touch (never more than the memory free then, less
    256 MB), or nothing."""

    def before() -> None:
        if cfg.warm_memory:
            fmt_io.warm_memory(
                int(min(WARM_FACTOR * tensor_bytes, mem_available_bytes() - (256 << 20)))
            )
        if cfg.pause_s:
            time.sleep(cfg.pause_s)

    return before


def interleaved(jobs: list[str], repeats: int) -> Iterator[tuple[int, str]]:
    """(repeat, job) for every job once per repeat, in orders balanced for carry-over: over
    the run every job follows every job (itself too, across two repeats) about equally often,
    so the raw baseline and each format meet the same mixture of jobs before them.

    A job leaves state behind for the next one (the page cache it freed, the disk's write-back,
    the host's view of the memory it let go), and which job runs before a timed one matters on
    the project's VM: the 1.2 GB save right after the raw job took a median of 0.839 s, against
    0.726 s right after the async save (12 each, one-sided Mann-Whitney p 0.027:
    ``experiments/carry_over.py``, ``reports/carry-over-1.2GB.md``; two earlier runs, printed
    only, gave 0.910 s against 0.788 s and 0.872 s against 0.718 s). Rotating one fixed order,
    as this did before, put the save after the raw job in two repeats of three and the raw job
    after the async save in two of three: the save met the slower predecessor more often than
    its baseline did.
    (The designs of crossover trials balance the same way: Williams, "Experimental designs
    balanced for the estimation of residual effects of treatments", 1949.)

    Each repeat's order is chosen, first fit, from the orders of the repeat's units (a job
    and its reduced save, ``job + REDUCED``, stay side by side): all of them up to 7 units,
    else the rotations of the list and of its reverse. The chosen order keeps the largest
    count of any (before, after) pair smallest, then the sum of their squares, counting the
    pair across the boundary from the last repeat."""
    units: list[tuple[str, ...]] = []
    for job in jobs:
        if job.endswith(REDUCED) and units and units[-1][0] == job.removesuffix(REDUCED):
            units[-1] += (job,)
        else:
            units.append((job,))
    if len(units) <= 7:
        orders = list(itertools.permutations(units))
    else:
        turns = [units[i:] + units[:i] for i in range(len(units))]
        orders = [tuple(o) for o in turns + [t[::-1] for t in turns]]
    flat = [[job for unit in order for job in unit] for order in orders]
    count: collections.Counter = collections.Counter()  # (before, after) -> times so far
    last = None
    for rep in range(repeats):
        order = min(flat, key=functools.partial(_carry_over_cost, count, last))
        count.update(_follows(last, order))
        last = order[-1]
        for job in order:
            yield rep, job


def _follows(last: str | None, order: list[str]) -> list[tuple[str, str]]:
    """The (before, after) pairs of running ``order`` right after ``last`` (None: first)."""
    return list(itertools.pairwise([last, *order]))[last is None :]


def _carry_over_cost(count, last: str | None, order: list[str]) -> tuple[int, int]:
    """What running ``order`` after ``last`` does to the pair counts: the largest count,
    then the sum of squares."""
    after = [count[pair] + n for pair, n in collections.Counter(_follows(last, order)).items()]
    return max(after, default=0), sum(c * c for c in after)


@contextlib.contextmanager
def disk_errors_are_the_users(what: str, directory: Path) -> Iterator[None]:
    """Every write in --dir (a path or an object-store URL): a disk that fills up under the
    benchmark (another job writing) or goes away is the user's to fix, a one-line error, never
    a traceback."""
    try:
        yield
    except OSError as exc:
        raise InputError(
            f"writing {what} in --dir {directory} failed: {exc.strerror or exc}"
        ) from None


PAIRED = "ckptsim"
"""The format the goals judge: each of its exact repeats also times a raw read of its own
checkpoint right beside its restore (see :func:`_measure`)."""


def _measure(
    job: str,
    held: list[Any],
    where: Path,
    row: dict[str, Any],
    before_clock: Callable[[], None] = lambda: None,
) -> None:
    """One save + cold restore of the state ``held[0]``, which the restored one replaces (the
    list is the state's only reference, so a restore can free it before its clock starts).
    ``before_clock`` runs right before each clock starts (:func:`_before_clock`: a pause or a
    memory warm-up), after the pages the timed part will not use are let go.

    The :data:`PAIRED` format's restore is timed back to back with a raw read of the
    checkpoint's own tensor file (the same bytes in the same blocks, read with the restore's
    own I/O pattern: :func:`~simulator.bench.formats.raw_read` with ``readahead``), the order
    swapped every other repeat (``raw_pair_load_s``): the restore goal's ratio, free of
    whatever ran between two jobs and of where on the disk two files happened to land. (Its
    save is held to the raw job's write of the same repeat: a raw write beside the save was
    tried, and at 1.2 GB it took twice the raw job's time in either order, for reasons not
    found, which would have flattered the save.)"""
    paired = job == PAIRED
    raw_first = row["repeat"] % 2 == 1

    def raw_pair_load() -> None:
        if paired:
            # Read the restore's way (its 4 MB slices and readahead thread, nothing else of
            # it): a plain 64 MB read was up to 3x slower on the project's VM, a baseline the
            # restore's own I/O pattern alone would beat.
            row["raw_pair_load_s"] = fmt_io.raw_read(
                where, ckptio.TENSOR_FILE, readahead=True, before_clock=before_clock
            )
            row["raw_pair_load_bytes"] = (where / ckptio.TENSOR_FILE).stat().st_size

    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # DCP: "assuming ... a single process"
            if job == "raw":  # the state's own bytes, from its own memory, as a save writes
                before_clock()
                row["save_s"] = fmt_io.raw_write(where, fmt_io.state_bytes(held[0]))
                row["bytes"] = fmt_io.disk_bytes(where)
                faults = []

                def then_count() -> None:  # the read's faults, not a warm-up's
                    before_clock()
                    faults.append(_minor_faults())

                row["load_s"] = fmt_io.raw_read(where, before_clock=then_count)
                row["load_minor_faults"] = _minor_faults() - faults[0]
                return
            fmt = job.removesuffix(REDUCED)
            before_clock()
            if job.endswith(REDUCED):
                row.update(
                    fmt_io.save_reduced(
                        fmt,
                        held[0],
                        where,
                        optimizer=row["optimizer_precision"],
                        weights=row["weights_precision"],
                    )
                )
                loader = functools.partial(fmt_io.load_reduced, fmt)
            else:
                row.update(fmt_io.SAVERS[fmt](held[0], where))
                loader = fmt_io.LOADERS[fmt]
            row["bytes"] = fmt_io.disk_bytes(where)
            if raw_first:
                raw_pair_load()
            if job not in fmt_io.IN_PLACE:
                # Drop our reference so only the restored copy is held (1x memory at 1B), and
                # before the clock starts: freeing the previous restore is no part of this one.
                held.clear()
                gc.collect()  # a saver's closure may hold it in a cycle a moment longer
            fmt_io.drop_cache(where)
            before_clock()
            faults = _minor_faults()  # the restore's own, not a warm-up's
            start = time.perf_counter()
            if job in fmt_io.IN_PLACE:
                held[0] = loader(where, held[0])
            else:
                held.append(loader(where))
            row["load_s"] = time.perf_counter() - start
            row["load_minor_faults"] = _minor_faults() - faults
            if not raw_first:
                raw_pair_load()
    finally:
        shutil.rmtree(where, ignore_errors=True)


def _minor_faults() -> int:
    """Minor page faults of this process so far, all threads (0 where not counted): a load's
    count says how much fresh memory it mapped, the raw read's included."""
    try:
        import resource
    except ImportError:
        return 0
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def _median(rows: list[dict[str, Any]], key: str) -> float | None:
    values = [r[key] for r in rows if r.get(key) is not None]
    return statistics.median(values) if values else None


def summarise(samples: list[dict], notes: list[str], machine: dict[str, Any]) -> BenchResult:
    """Medians, ratios to raw and goals from raw samples (a run's, or a stored profile's);
    ``notes``, and :data:`FREE_PAGE_NOTE` where ``machine`` records free page reporting and
    the saves and restores were not warmed up (``--warm-memory``: then no timed job paid for
    reclaimed memory, and the run's own note says so)."""
    from simulator.bench.writers import summarise_writers

    single = [s for s in samples if s.get("bench") != "writers"]
    warmed = bool(single) and all(s.get("warm_memory") for s in single)
    if machine.get("free_page_reporting") and not warmed and FREE_PAGE_NOTE not in notes:
        notes = [*notes, FREE_PAGE_NOTE]

    parallel = summarise_writers(samples)
    groups: dict[tuple, list[dict]] = {}
    for s in samples:
        if s.get("bench") == "writers":
            continue
        groups.setdefault((s["format"], s["dtype"], s["params"], _precision(s)), []).append(s)
    # The raw disk's bandwidth is its own row's (median bytes / median seconds), so the one
    # raw figure a reader sees is the same in the header, the table and every ratio.
    raw_bw: dict[tuple, float] = {}
    raw_read: dict[tuple, float] = {}
    for (fmt, dtype, params, _), rows in groups.items():
        if fmt == "raw":
            nbytes = statistics.median(r["bytes"] for r in rows)
            raw_bw[dtype, params] = nbytes / _median(rows, "save_s")
            raw_read[dtype, params] = nbytes / _median(rows, "load_s")
    results = []
    for (fmt, dtype, params, precision), rows in sorted(
        groups.items(), key=lambda kv: (kv[0][2], kv[0])
    ):
        save = _median(rows, "save_s")
        nbytes = statistics.median(r["bytes"] for r in rows)
        res = {
            "format": fmt,
            "dtype": dtype,
            "size": rows[0]["size"],
            "params": params,
            "bytes": int(nbytes),
            "repeats": len(rows),
            "save_s_median": save,
            "bytes_per_s": nbytes / save,
            "ratio_to_raw": nbytes / save / raw_bw[dtype, params],
            "load_s_median": _median(rows, "load_s"),
            "load_ratio_to_raw": (nbytes / _median(rows, "load_s")) / raw_read[dtype, params],
            "load_minor_faults_median": _median(rows, "load_minor_faults"),
        }
        if fmt != "raw":
            res["optimizer_precision"], res["weights_precision"] = precision
        if precision != ("fp32", "fp32"):
            res["encode_s_median"] = _median(rows, "encode_s")
        if fmt in fmt_io.COPYING:
            res["stall_s_median"] = _median(rows, "stall_s")
            if fmt == "ckptsim-async":
                res["stall_cold_s_median"] = _median(rows, "stall_cold_s")
        results.append(res)
    _against_exact(results)
    # The headline raw figure: the raw row at the largest size (fp32 where both were run).
    head = max(raw_bw, key=lambda k: (k[1], k[0] == "fp32"))
    return BenchResult(
        raw_bytes_per_s=raw_bw[head],
        raw_read_bytes_per_s=raw_read[head],
        results=results,
        samples=samples,
        goals=_goals(results, samples),
        machine=machine,
        notes=notes,
        writers=parallel,
    )


def _precision(row: dict[str, Any]) -> tuple[str, str]:
    return row.get("optimizer_precision", "fp32"), row.get("weights_precision", "fp32")


def _against_exact(results: list[dict[str, Any]]) -> None:
    """Give each reduced row its exact twin's bytes and times, measured in the same run, and
    the ratios: ``bytes_ratio_to_exact`` is how many times smaller (exact / reduced bytes),
    ``save_ratio_to_exact`` and ``load_ratio_to_exact`` the reduced time over the exact one
    (medians over the repeats; restores include the decoding)."""
    twins = {(r["format"], r["dtype"], r["params"]): r for r in results if exact(r)}
    for r in results:
        twin = None if exact(r) else twins.get((r["format"], r["dtype"], r["params"]))
        if twin is None:
            continue
        r["exact_bytes"] = twin["bytes"]
        r["bytes_ratio_to_exact"] = twin["bytes"] / r["bytes"]
        r["save_ratio_to_exact"] = r["save_s_median"] / twin["save_s_median"]
        r["load_ratio_to_exact"] = r["load_s_median"] / twin["load_s_median"]
        if "stall_s_median" in r:
            r["stall_ratio_to_exact"] = r["stall_s_median"] / twin["stall_s_median"]


def _goals(results: list[dict[str, Any]], samples: list[dict[str, Any]]) -> dict[str, Any]:
    """The goal ratios (writer and restore against the raw disk, async stalls), judged at
    every measured size (see :func:`results.goal_verdict`).

    Each ratio is formed per repeat from samples of the same repeat (the writer against the raw
    write, the restore against the raw read of its own file beside it, the async stall against
    the synchronous save), so the interval over repeats carries the run-to-run spread; ``value``
    is the median at the largest size, as before, and ``per_size`` holds every size's per-repeat
    ratios (``values``, in repeat order) with their median and expected cost, each with its 95 %
    interval (:func:`results.ratio_intervals`). ``met`` is true only when the verdict is "met":
    at every size both whole intervals meet the goal (:func:`results.ratio_verdict`).
    """

    # The goals are the exact saves' (a reduced save writes fewer bytes than the raw baseline).
    results = [r for r in results if exact(r)]
    samples = [s for s in samples if exact(s)]

    def at_largest(fmt: str) -> dict | None:
        rows = [r for r in results if r["format"] == fmt]
        return max(rows, key=lambda r: r["params"]) if rows else None

    def paired(fmt: str, base: str, ratio, *, rate: bool) -> list[dict[str, Any]]:
        by_key: dict[tuple, dict[str, dict]] = {}
        for s in samples:
            if s.get("bench") == "writers":
                continue
            by_key.setdefault((s["dtype"], s["params"], s["repeat"]), {})[s["format"]] = s
        groups: dict[tuple, list[float]] = {}
        for (dtype, params, _), jobs in by_key.items():
            if fmt in jobs and base in jobs:
                groups.setdefault((dtype, params), []).append(ratio(jobs[fmt], jobs[base]))
        sizes = {(s["dtype"], s["params"]): s["size"] for s in samples if "dtype" in s}
        out = []
        for (dtype, params), values in sorted(groups.items(), key=lambda kv: kv[0][::-1]):
            out.append(
                dict(size=sizes[dtype, params], dtype=dtype, params=params)
                | ratio_intervals(values, rate=rate)
            )
        return out

    def judged(points: list[dict], **bound: float) -> dict[str, Any]:
        verdict = ratio_verdict(points, **bound)
        return {"verdict": verdict, "met": verdict == "met", "per_size": points}

    goals: dict[str, Any] = {}
    writer = at_largest("ckptsim")

    # Saves against the raw job's write of the same repeat, restores against the raw read of
    # their own file timed right beside them (see _measure; a profile from before that pair:
    # the raw job's read). A raw write timed beside the save, which some profiles of
    # 2026-12-06 hold (raw_pair_save_s), was found biased and is not used.
    def against_raw(key: str):
        def ratio(f: dict[str, Any], r: dict[str, Any]) -> float:
            if key == "load_s" and "raw_pair_load_s" in f:
                r = {key: f["raw_pair_load_s"], "bytes": f["raw_pair_load_bytes"]}
            return (f["bytes"] / f[key]) / (r["bytes"] / r[key])

        return ratio

    for goal, key, ratio, at_least in (
        ("writer_ratio_to_raw", "save_s", "ratio_to_raw", GOAL_WRITER_RATIO),
        ("restore_ratio_to_raw", "load_s", "load_ratio_to_raw", GOAL_RESTORE_RATIO),
    ):
        if not writer:
            break
        points = paired(PAIRED, "raw", against_raw(key), rate=True)
        goals[goal] = {
            "value": writer[ratio],
            "goal_min": at_least,
            "size": writer["size"],
            "dtype": writer["dtype"],
        } | judged(points, at_least=at_least)
    for fmt, sync in (("ckptsim-async", "ckptsim"), ("dcp-async", "dcp")):
        a = at_largest(fmt)
        if not a:
            continue
        s = next((r for r in results if r["format"] == sync and r["params"] == a["params"]), None)
        base = s["save_s_median"] if s else a["save_s_median"]
        ratio = a["stall_s_median"] / base
        points = paired(fmt, sync, lambda f, b: f["stall_s"] / b["save_s"], rate=False)
        goals[f"{fmt}_stall_ratio"] = {
            "value": ratio,
            "goal_max": GOAL_ASYNC_STALL_RATIO,
            "size": a["size"],
            "dtype": a["dtype"],
            "sync_format": sync if s else fmt,
        } | judged(points, at_most=GOAL_ASYNC_STALL_RATIO)
    return goals
