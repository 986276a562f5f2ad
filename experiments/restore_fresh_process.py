"""The restore a restart pays: each load in a fresh process, against the raw read in one.

The benchmark loop (``bench_cost_at_scale.py``) restores again and again inside one process,
whose allocator hands a restore memory that earlier repeats freed; a job restarted after a
failure restores once, into a fresh process, where every page of the restored state is fresh
memory the kernel must fault in. This script times that case: one checkpoint (``ckptio``, the
complete training state) is written once; then, in pairs, rotated in order, fresh Python
processes each drop its pages (``posix_fadvise(DONTNEED)``) and time one load: the raw read of
its tensor file (64 MB at a time into one buffer mapped before the clock starts: a plain
sequential read of the same bytes in the same blocks),
``read_checkpoint(verify=True)`` into fresh memory, the same into a model built before the
clock (``restore-into-model``: the controller's restore in a relaunched job, which reads the
weights straight into the model's parameters, ``into=``, and the optimizer's moments, which a
fresh optimizer does not have yet, into fresh memory), and ``read_checkpoint`` with the
prefault thread switched off (what the thread adds), and the raw read done the restore's way
(4 MB slices, the readahead thread: what the restore's I/O pattern gains apart from the rest).
Ratios are formed per pair; the 90 % goal is judged against the raw read done the restore's
way, the faster of the two raw reads here.
Writes ``reports/restore-fresh-process.md`` and its JSON. About 2 minutes on 2 shared cores.

    python experiments/restore_fresh_process.py [--size 100M] [--pairs 10] [--dir DIR]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

from simulator import ckptio  # noqa: E402
from simulator.bench.state import build_state, flatten, parse_size  # noqa: E402
from simulator.engines.results import (  # noqa: E402
    MIN_REPEATS,
    interval_texts,
    ratio_intervals,
    ratio_verdict,
)

JOBS = ("raw", "raw-readahead", "restore", "restore-into-model", "restore-no-prefault")

# One load in this fresh process; prints seconds, minor page faults and bytes prefaulted.
_CHILD = r"""
import json, resource, sys, time
from pathlib import Path
job, where = sys.argv[1], Path(sys.argv[2])
from simulator import ckptio
from simulator.bench import formats as fmt_io
from simulator.ckptio import prefault, syscalls
if job == "restore-no-prefault":
    syscalls.HAVE_POPULATE = False
populated = []
class Counting(prefault.Prefaulter):
    def __exit__(self, *exc):
        super().__exit__(*exc)
        populated.append(self.populated_bytes)
ckptio.read.Prefaulter = Counting
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
if job in ("raw", "raw-readahead"):  # the checkpoint's own tensor file: same bytes, same blocks
    seconds = fmt_io.raw_read(where / "ck", ckptio.TENSOR_FILE, readahead=job != "raw")
else:
    into = None
    if job == "restore-into-model":  # the model a relaunch builds first: weights written once
        import torch
        from safetensors import safe_open
        with safe_open(where / "ck" / ckptio.TENSOR_FILE, framework="pt") as f:
            shapes = {k: f.get_slice(k) for k in f.keys() if k.startswith("model.")}
            into = {k: torch.zeros(s.get_shape(), dtype=torch.float32) for k, s in shapes.items()}
        faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    fmt_io.drop_cache(where / "ck")
    start = time.perf_counter()
    tensors, meta = ckptio.read_checkpoint(where / "ck", verify=True, into=into)
    seconds = time.perf_counter() - start
faults = resource.getrusage(resource.RUSAGE_SELF).ru_minflt - faults
print(json.dumps({"seconds": seconds, "minor_faults": faults, "prefaulted": sum(populated)}))
"""


def _load_in_fresh_process(job: str, where: Path) -> dict:
    env = dict(os.environ, PYTHONPATH=str(REPO))
    out = subprocess.run(
        [sys.executable, "-c", _CHILD, job, str(where)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    )
    return json.loads(out.stdout.strip().splitlines()[-1])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--size", default="100M", help="model size, e.g. 25M, 100M (parameters)")
    ap.add_argument("--pairs", type=int, default=10)
    ap.add_argument("--dir", type=Path, default=REPO, help="where the files are written")
    ap.add_argument("--reports", type=Path, default=REPO / "reports")
    args = ap.parse_args(argv)
    if args.pairs < 2:
        ap.error(f"--pairs must be at least 2 ({MIN_REPEATS} for a 95 % interval): {args.pairs}")
    load_before = os.getloadavg()[0]
    started = time.time()
    ts = build_state(parse_size(args.size))
    work = Path(tempfile.mkdtemp(prefix="ckptsim-fresh-", dir=args.dir))
    try:
        tensors, tree = flatten(ts.state)
        ckptio.write_checkpoint(work / "ck", tensors, {"tree": tree})
        nbytes = ts.tensor_bytes
        del ts, tensors, tree
        rows = []
        for pair in range(args.pairs):
            shift = pair % len(JOBS)
            for job in JOBS[shift:] + JOBS[:shift]:
                rows.append({"pair": pair, "job": job} | _load_in_fresh_process(job, work))
    finally:
        shutil.rmtree(work, ignore_errors=True)
    took = time.time() - started
    by = {(r["pair"], r["job"]): r for r in rows}

    def faster(job: str, than: str) -> list[float]:
        """Per pair, ``than``'s time over ``job``'s (bandwidth ratio, higher is better)."""
        return [by[p, than]["seconds"] / by[p, job]["seconds"] for p in range(args.pairs)]

    ratios = {
        "restore/raw-read": faster("restore", "raw"),
        "restore into the built model/raw-read": faster("restore-into-model", "raw"),
        "restore without prefault/raw-read": faster("restore-no-prefault", "raw"),
        "restore/raw-read the restore's way": faster("restore", "raw-readahead"),
        "restore into the built model/raw-read the restore's way": faster(
            "restore-into-model", "raw-readahead"
        ),
        "raw-read the restore's way/raw-read": faster("raw-readahead", "raw"),
        "restore/restore without prefault": faster("restore", "restore-no-prefault"),
    }
    summary = {k: ratio_intervals(v, rate=True) for k, v in ratios.items()}
    # Judged against the raw read done the restore's way (its 4 MB slices and readahead
    # thread): the plain 64 MB read was up to 3x slower here, a baseline the restore's I/O
    # pattern alone would beat. The plain read's ratios stay in the table.
    verdict = ratio_verdict([summary["restore/raw-read the restore's way"]], at_least=0.9)
    verdict_model = ratio_verdict(
        [summary["restore into the built model/raw-read the restore's way"]], at_least=0.9
    )
    name = "restore-fresh-process"
    args.reports.mkdir(parents=True, exist_ok=True)
    (args.reports / f"{name}.json").write_text(
        json.dumps({"size": args.size, "bytes": nbytes, "rows": rows, "ratios": ratios}, indent=1)
    )

    def med(job: str, key: str) -> float:
        values = sorted(r[key] for r in rows if r["job"] == job)
        return values[len(values) // 2]

    lines = [
        "# The restore a restart pays: each load in a fresh process",
        "",
        f"Generated by `python experiments/restore_fresh_process.py --size {args.size} --pairs "
        f"{args.pairs}` in {took / 60:.1f} min; every number below is from that one run "
        f"(per-load rows: `reports/{name}.json`). Shared 2-core machine: load average "
        f"{load_before:.1f} before, {os.getloadavg()[0]:.1f} after.",
        "",
        "## Method",
        "",
        f"One `ckptio` checkpoint of the complete {args.size} training state (fp32 weights, "
        f"AdamW moments, scheduler, RNG, data position: {nbytes / 1e9:.2f} GB of tensors), "
        "written and fsync'ed once. Each load runs in a "
        "fresh Python process (what a job restarted after a failure does), which first drops "
        "the files' pages with `posix_fadvise(POSIX_FADV_DONTNEED)`: the raw read of the "
        "checkpoint's own tensor file (a plain sequential read: 64 MB at a time into one "
        "buffer mapped before the clock starts), the same read done the restore's way "
        "(`raw-readahead`: 4 MB slices with the restore's thread asking the kernel for the "
        "next 64 MB ahead, `posix_fadvise(POSIX_FADV_WILLNEED)`; nothing else of the restore), "
        "`read_checkpoint(verify=True)` into fresh memory, the same into a model built "
        "before the clock (`restore-into-model`: what the controller's restore does in a "
        "relaunched job: the fp32 weights read straight into the model's parameters, "
        "`into=`, and the AdamW moments, which a fresh optimizer does not have yet, into fresh "
        "memory; the model's tensors are allocated and zero-filled before the clock, as its "
        "constructor would), "
        "and the same with the prefault thread off (`restore-no-prefault`: what the thread "
        "adds). Jobs rotate in order by pair; ratios (bandwidth, higher is better) are "
        "formed per pair and judged as the benchmark's goals are "
        "(`simulator.engines.results.ratio_verdict`): met only when both the median's "
        "distribution-free 95 % interval and the expected cost's (mean time ratio, Student's "
        "t) clear the goal. The goal is judged against the raw read done the restore's way, "
        "the stricter baseline here; the plain read's ratios are in the table too.",
        "",
        "## Results",
        "",
        "| ratio | median | its 95 % interval | expected (mean time) | its 95 % interval "
        "| per pair |",
        "|---|---|---|---|---|---|",
    ]
    for key, values in ratios.items():
        p = summary[key]
        each = " ".join(f"{v:.2f}" for v in values)
        ci, eci = interval_texts(p)
        lines.append(f"| {key} | {p['median']:.2f} | {ci} | {p['expected']:.2f} | {eci} | {each} |")
    lines += [
        "",
        "| load | median s | median GB/s | median minor page faults | median bytes prefaulted |",
        "|---|---|---|---|---|",
    ]
    for job in JOBS:
        s = med(job, "seconds")
        lines.append(
            f"| {job} | {s:.3f} | {nbytes / s / 1e9:.2f} | {med(job, 'minor_faults'):,.0f} "
            f"| {med(job, 'prefaulted') / 1e6:,.0f} MB |"
        )
    lines += [
        "",
        "Restore ≥ 90 % of the raw read done the restore's way (4 MB slices, the readahead "
        "thread; a stricter baseline than the plain 64 MB read, which it outran here) in a "
        "fresh process, by the project's rule (both whole intervals): into fresh memory "
        f"**{verdict}**; into the built model, as the controller "
        f"restores a relaunched job, **{verdict_model}**. The benchmark's goal ratio "
        "(`bench-scale-cpu-2core.md`) is a restore into the state's own tensors inside one "
        "process; this is the relaunch's view of the same reader.",
        "",
    ]
    (args.reports / f"{name}.md").write_text("\n".join(lines))
    print(f"wrote {args.reports / f'{name}.md'} ({took:.0f} s)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
