"""Where a save's time goes inside the benchmark's own run, beside the raw write's.

``bench_cost_at_scale.py`` held the 1.2 GB save to ~0.9 of the raw write's speed on the
project's VM, while ``save_overhead.py``, timing the same save apart from the benchmark, found
it at the raw write's speed. This script runs the benchmark itself (``run_benchmark``: the
same state, order of jobs, warm-up and clean-ups) with its write calls wrapped by timers, so each
timed save (``ckptsim``, and ``ckptsim-async``'s background write) and each raw write is split
into its phases, recorded beside what the machine did meanwhile:

- ``ckptsim``: ``serialize`` (the safetensors library's write into the page cache),
  ``tensor_fsync`` (the tensor file's flush, a thread taking its CRC from the file
  meanwhile), ``small`` (the metadata file and the manifest, each fsync'ed), ``dirs`` (the
  directory fsyncs and the rename), and ``other`` (the rest of the clock: flattening, the
  checks, the tensors' descriptions for the library);
- ``raw``: ``os.write loop`` (``os.write`` of the state's bytes into the page cache, reported
  as its ``other``), ``fsync``, ``dirs``;
- for every timed write: the job before it, the CPU time stolen by the host
  (``/proc/stat``'s steal), the process's user and system CPU time, and the changes in
  ``/proc/vmstat``'s counters of page allocation, reclaim and write-back.

Prints, per job, each phase's quartiles, and the counters' medians; then, for the ``ckptsim``
save, its slower half against its faster half phase by phase (which phase carries the
difference), and the save's median by the job before it. ``--report FILE`` writes what it
prints, with the command and date. About 6 minutes at the defaults on 2 shared cores.

    python experiments/save_phases.py [--size 100M] [--repeats 24] [--dir DIR]
        [--no-warm-memory] [--report reports/save-phases.md]
"""

from __future__ import annotations

import os
import statistics
import sys
import threading
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from experiments._bench_args import bench_parser, parse  # noqa: E402
from experiments._report import output_file, printed_report  # noqa: E402
from simulator.bench import (  # noqa: E402
    BenchConfig,
    run_benchmark,
    runner,
)
from simulator.bench import formats as fmt_io  # noqa: E402
from simulator.ckptio import write  # noqa: E402
from simulator.engines.results import median_ci  # noqa: E402

VMSTAT = (
    "pgfault",
    "pgalloc_normal",
    "pgfree",
    "allocstall_normal",
    "compact_stall",
    "pgscan_kswapd",
    "pgscan_direct",
    "pgsteal_kswapd",
    "nr_dirtied",
    "nr_written",
    "thp_fault_alloc",
)
"""The kernel's counters recorded across each timed write (their change)."""


def _vmstat() -> dict[str, int]:
    out = {}
    with open("/proc/vmstat") as f:
        for line in f:
            key, value = line.split()
            out[key] = int(value)
    return {k: out.get(k, 0) for k in VMSTAT}


def _steal_s() -> float:
    with open("/proc/stat") as f:
        fields = f.readline().split()  # cpu user nice system idle iowait irq softirq steal
    return int(fields[8]) / os.sysconf("SC_CLK_TCK")


class Phases:
    """Times of the wrapped calls while a timed write runs (:meth:`run`), summed by phase."""

    def __init__(self):
        self.lock = threading.Lock()  # the async save's write runs in a thread of its own
        self.spans: dict[str, float] | None = None

    def wrap(self, inner, name):
        """``inner`` timed; ``name`` the phase, or a function of the call's first argument
        that gives it."""

        def timed(*args, **kwargs):
            start = time.perf_counter()
            try:
                return inner(*args, **kwargs)
            finally:
                took = time.perf_counter() - start
                phase = name(args[0]) if callable(name) else name
                with self.lock:
                    if self.spans is not None:
                        self.spans[phase] = self.spans.get(phase, 0.0) + took

        return timed

    def run(self, job: str, after: str | None, fn) -> tuple[object, dict]:
        """``fn()`` and its row: the phases, the clock, and the machine's counters."""
        vm, steal, cpu = _vmstat(), _steal_s(), os.times()
        self.spans = {}
        try:
            out = fn()
        finally:
            spans, self.spans = self.spans, None
        vm_after, cpu_after = _vmstat(), os.times()
        clock = out if isinstance(out, float) else out["save_s"]
        row = {"job": job, "after": after, "clock_s": clock, **spans}
        row["other"] = clock - sum(spans.values())
        row["steal_s"] = _steal_s() - steal
        row["user_s"] = cpu_after.user - cpu.user
        row["sys_s"] = cpu_after.system - cpu.system
        row |= {k: vm_after[k] - vm[k] for k in VMSTAT}
        return out, row


def measure(cfg: BenchConfig) -> list[dict]:
    """Run the benchmark with its writes timed by phase; one row per timed write."""
    ph = Phases()
    rows: list[dict] = []
    last: dict[str, str | None] = {}  # the job before the one running: none for the first
    patches = [  # (namespace, attribute, replacement): the names the timed code calls
        (write, "serialize_file", ph.wrap(write.serialize_file, "serialize")),
        (write, "_crc_while_flushing", ph.wrap(write._crc_while_flushing, "tensor_fsync")),
        (write, "_write_bytes", ph.wrap(write._write_bytes, "small")),
        (write, "fsync_dir", ph.wrap(write.fsync_dir, "dirs")),
        (write, "os", _Module(os, rename=ph.wrap(os.rename, "dirs"))),
        (fmt_io, "os", _Module(os, fsync=ph.wrap(os.fsync, "fsync"))),
        (
            fmt_io,
            "ckptio",
            _Module(fmt_io.ckptio, fsync_dir=ph.wrap(fmt_io.ckptio.fsync_dir, "dirs")),
        ),
    ]

    def timed(job: str, fn):
        if "job" not in last:  # the benchmark's untimed warm-up write, before the repeats
            return fn()
        out, row = ph.run(job, last["job"], fn)
        rows.append({"repeat": last["repeat"]} | row)
        return out

    raw_write, savers, measure_job = fmt_io.raw_write, dict(fmt_io.SAVERS), runner._measure

    def measured(job, held, where, row, *args, **kwargs):
        last.setdefault("job", None)
        last["repeat"] = row["repeat"]
        try:
            return measure_job(job, held, where, row, *args, **kwargs)
        finally:
            last["job"] = job

    patches += [
        (fmt_io, "raw_write", lambda d, data: timed("raw", lambda: raw_write(d, data))),
        (runner, "_measure", measured),
    ]
    for job in ("ckptsim", "ckptsim-async"):
        fmt_io.SAVERS[job] = lambda s, w, job=job: timed(job, lambda: savers[job](s, w))
    saved = [(ns, attr, getattr(ns, attr)) for ns, attr, _ in patches]
    for ns, attr, new in patches:
        setattr(ns, attr, new)
    try:
        run_benchmark(cfg, progress=True)
    finally:
        for ns, attr, old in saved:
            setattr(ns, attr, old)
        fmt_io.SAVERS.update(savers)
    return rows


class _Module:
    """A module as one other module sees it, with some of its names replaced."""

    def __init__(self, module, **replaced):
        self._module = module
        self.__dict__.update(replaced)

    def __getattr__(self, name):
        return getattr(self._module, name)


PHASES = {
    "ckptsim": ("serialize", "tensor_fsync", "small", "dirs", "other"),
    "ckptsim-async": ("serialize", "tensor_fsync", "small", "dirs", "other"),
    "raw": ("other", "fsync", "dirs"),
}
"""Each job's phases in the order they run (a raw write's ``other`` is its ``os.write`` loop;
an async save's ``other`` is its staging copy and the wait around its background write)."""


def _q(values: list[float]) -> str:
    if len(values) < 2:
        return "-"
    q1, q2, q3 = statistics.quantiles(values, n=4)
    return f"{q1:.3f} / {q2:.3f} / {q3:.3f}"


def summary(rows: list[dict]) -> list[str]:
    lines = []
    for job, names in PHASES.items():
        mine = [r for r in rows if r["job"] == job]
        if not mine:
            continue
        lines.append(f"{job}: {len(mine)} timed writes; quartiles (s) of")
        for name in ("clock_s", *names, "steal_s", "user_s", "sys_s"):
            label = "os.write loop" if (job, name) == ("raw", "other") else name
            lines.append(f"  {label:>14}: {_q([r.get(name, 0.0) for r in mine])}")
        counters = ", ".join(f"{k} {statistics.median(r[k] for r in mine):,.0f}" for k in VMSTAT)
        lines.append(f"  medians of the counters' changes: {counters}")
    saves = sorted((r for r in rows if r["job"] == "ckptsim"), key=lambda r: r["clock_s"])
    if len(saves) >= 4:
        half = len(saves) // 2
        fast, slow = saves[:half], saves[-half:]
        lines.append(
            f"ckptsim, slower half ({half}) less faster half ({half}), difference of medians (s):"
        )
        for name in ("clock_s", *PHASES["ckptsim"], "steal_s", "user_s", "sys_s"):
            d = statistics.median(r.get(name, 0.0) for r in slow) - statistics.median(
                r.get(name, 0.0) for r in fast
            )
            lines.append(f"  {name:>14}: {d:+.3f}")
        for k in VMSTAT:
            d = statistics.median(r[k] for r in slow) - statistics.median(r[k] for r in fast)
            lines.append(f"  {k:>14}: {d:+,.0f}")
        raw = {r["repeat"]: r["clock_s"] for r in rows if r["job"] == "raw"}
        mid, low, high = median_ci([raw[r["repeat"]] / r["clock_s"] for r in saves])
        lines.append(
            f"ckptsim save against the raw write of its repeat (bandwidth ratio, the goal's): "
            f"median {mid:.3f} [{low:.3f}, {high:.3f}] (95 % interval)"
        )
        by = {}
        for r in saves:
            by.setdefault(r["after"], []).append(r["clock_s"])
        lines.append(
            "ckptsim save by the job before it: "
            + "; ".join(
                f"after {a}: median {statistics.median(v):.3f} s ({len(v)})"
                for a, v in sorted(by.items(), key=str)
            )
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    ap = bench_parser(__doc__, "repeats", 24, "repeats of the benchmark's jobs")
    ap.add_argument("--json", type=output_file, help="also write every row to this JSON file")
    args = parse(ap, argv, "repeats")
    started = time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())
    cfg = BenchConfig(
        directory=args.dir,
        sizes=(args.size,),
        formats=("ckptsim",),
        repeats=args.repeats,
        warm_memory=args.warm_memory,
    )
    rows = measure(cfg)
    if args.json is not None:
        import json

        args.json.write_text(json.dumps(rows, indent=1))
    lines = summary(rows)
    print("\n".join(lines))
    if args.report is not None:
        printed_report(
            args.report,
            "Where a save's time goes inside the benchmark's run",
            "experiments/save_phases.py",
            argv,
            started,
            "the benchmark's own run (raw, ckptsim, ckptsim-async once each a repeat), its "
            "write calls wrapped by timers; CPU and /proc/vmstat counters read before and "
            "after each clock",
            lines,
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
