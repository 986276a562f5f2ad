"""GPU-to-host staging, measured: the training stall of an asynchronous checkpoint on a GPU.

An asynchronous save stalls training only while the state is copied out of GPU memory into
host memory; the write to storage runs behind it. This script puts 1B- and 7B-parameter-sized
training state on the GPU and times that copy, in one run, on whatever GPU it finds:

- ``pinned``: ``copy_(non_blocking=True)`` of every shard into page-locked host buffers
  allocated before timing, bracketed by ``torch.cuda.Event``s (the copy engine's speed);
- ``pageable``: the same into ordinary host memory, touched before timing (what a plain
  ``tensor.cpu()`` pays);
- ``ckptio.stage (reused)``: ``simulator.ckptio.stage(tensors, out=previous)``, the project's
  staging call restaging into kept pinned buffers (``AsyncWriter`` users, the bench's
  ``ckptsim-async``), wall clock;
- ``controller stage (first)`` and ``(later)``: ``simulator.controller.state.stage(state,
  reuse=...)``, exactly what ``AdaptiveCheckpointer(async_save=True)`` runs at each save: the
  first call allocates pinned buffers (page-locking costs as much as a copy or more); later
  calls copy into the previous save's buffers once its write is over;
- ``pinned allocation``: allocating the pinned buffers alone (cold), wall clock.

State (``--state bf16``, the default): bf16 weights + fp32 master + two fp32 AdamW moments,
14 bytes a parameter (``simulator.model.checkpoint_cost.BYTES_PER_PARAM``), each part cut into
shards of ``--shard-mib`` like a state dict's tensors. 7B is ~98 GB: where the whole state does
not fit the GPU's free memory and a safe part of the host's available memory, the largest
whole-parameter slice that fits is measured (same parts, same shards) and the full-state time
is extrapolated at the measured bandwidth; the table marks it. Repeats after one warm-up; the
median is reported.

    python -m experiments.gpu_staging [--sizes 1B,7B] [--repeats 3] [--out gpu-staging.json]

On a machine without CUDA it prints one line saying so and exits 0. It needs a CUDA build of
torch (the project pins the CPU build; install the matching CUDA wheel on the GPU machine).
Sized for a few minutes on an H100 (7B copies a ~60 GB slice 4 times per method, most of the
time in pageable copies and in page-locking host memory); it has not yet run on a GPU. With
``--out reports/gpu-staging.json`` the next ``python -m experiments.bench_checkpoint``
includes the table in the bench report.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path

from simulator.model.checkpoint_cost import BYTES_PER_PARAM

DEFAULT_JSON = Path(__file__).resolve().parents[1] / "reports" / "gpu-staging.json"
"""Where the bench report looks for this script's results."""

STATES = {
    # (part, dtype name, bytes a parameter); each adds up to BYTES_PER_PARAM[state].
    "bf16": (
        ("weights", "bfloat16", 2),
        ("master", "float32", 4),
        ("exp_avg", "float32", 4),
        ("exp_avg_sq", "float32", 4),
    ),
    "fp32": (("weights", "float32", 4), ("exp_avg", "float32", 4), ("exp_avg_sq", "float32", 4)),
}
for _name, _parts in STATES.items():  # one rule: the cost model's bytes a parameter
    assert sum(b for _, _, b in _parts) == BYTES_PER_PARAM[_name], _name

METHODS = (
    "pinned",
    "pageable",
    "ckptio.stage (reused)",
    "controller stage (first)",
    "controller stage (later)",
    "pinned allocation",
)


@dataclass(frozen=True, kw_only=True)
class Plan:
    """What one size measures: the whole state or the largest slice that fits."""

    params: int
    """Parameters of the model this size stands for."""
    measured_params: int
    """Parameters whose state is put on the GPU and copied (``<= params``)."""
    state: str
    """``bf16`` or ``fp32``: which parts a parameter carries (:data:`STATES`)."""
    shard_bytes: int
    """Largest shard, bytes."""
    limit: str
    """What capped the slice: ``"none"``, ``"gpu"`` or ``"host"``."""

    @property
    def bytes_per_param(self) -> int:
        return sum(b for _, _, b in STATES[self.state])

    @property
    def bytes(self) -> int:
        """The whole state's bytes."""
        return self.params * self.bytes_per_param

    @property
    def measured_bytes(self) -> int:
        return self.measured_params * self.bytes_per_param

    @property
    def fraction(self) -> float:
        return self.measured_params / self.params

    def shards(self) -> list[tuple[str, str, int]]:
        """(name, dtype name, elements) of every tensor, each at most ``shard_bytes``."""
        out = []
        for part, dtype, width in STATES[self.state]:
            per = max(1, self.shard_bytes // width)
            for i, start in enumerate(range(0, self.measured_params, per)):
                out.append((f"{part}.{i}", dtype, min(per, self.measured_params - start)))
        return out


def plan(
    params: int,
    *,
    state: str = "bf16",
    gpu_free_bytes: int,
    host_free_bytes: int,
    gpu_fraction: float = 0.9,
    host_fraction: float = 0.5,
    shard_bytes: int = 256 << 20,
) -> Plan:
    """The slice of ``params``' state to measure within the memory this machine has.

    GPU: the state itself within ``gpu_fraction`` of the free memory. Host: one copy of it
    (the buffers of one method at a time; the others are freed in between) within
    ``host_fraction`` of the available memory, less one shard per part for the caching
    allocator's rounding of a last, smaller shard up to a power of two.
    """
    if params < 1:
        raise ValueError(f"a size must be at least 1 parameter, got {params}")
    per = sum(b for _, _, b in STATES[state])
    gpu_cap = int(gpu_fraction * gpu_free_bytes) // per
    host_cap = max(0, int(host_fraction * host_free_bytes) - len(STATES[state]) * shard_bytes)
    host_cap //= per
    measured = min(params, gpu_cap, host_cap)
    limit = "none" if measured == params else ("gpu" if gpu_cap <= host_cap else "host")
    if measured < 1:
        raise ValueError(
            f"no memory for even one parameter of state (GPU {gpu_free_bytes / 1e9:.1f} GB free, "
            f"host {host_free_bytes / 1e9:.1f} GB available)"
        )
    return Plan(
        params=params, measured_params=measured, state=state, shard_bytes=shard_bytes, limit=limit
    )


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kKmMbBtT]?)\s*$")
_UNIT = {"": 1, "k": 1e3, "m": 1e6, "b": 1e9, "t": 1e12}


def parse_size(text: str) -> int:
    """``"7B"`` -> 7_000_000_000, ``"350M"``, ``"1.3B"``, ``"7e9"`` or a plain count."""
    m = _SIZE.match(text)
    try:
        value = float(m[1]) * _UNIT[m[2].lower()] if m else float(text)
    except ValueError:
        value = math.nan
    if not math.isfinite(value):
        raise ValueError(f"size {text!r} is not a parameter count like 1B, 350M or 7e9")
    if value < 1:
        raise ValueError(f"size {text!r} is less than one parameter")
    return round(value)


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    p = argparse.ArgumentParser(
        prog="python -m experiments.gpu_staging",
        description=__doc__.splitlines()[0],
        epilog="Example: python -m experiments.gpu_staging --sizes 1B,7B "
        "--out reports/gpu-staging.json (then rerun experiments.bench_checkpoint to add it to "
        "the bench report).",
    )
    p.add_argument(
        "--sizes", default="1B,7B", help="parameter counts, comma-separated (default 1B,7B)"
    )
    p.add_argument(
        "--state",
        choices=sorted(STATES),
        default="bf16",
        help="bf16: bf16 weights + fp32 master + 2 fp32 moments, 14 B/param (default); "
        "fp32: weights + 2 moments, 12 B/param",
    )
    p.add_argument("--repeats", type=int, default=3, help="timed copies per method (default 3)")
    p.add_argument("--shard-mib", type=int, default=256, help="largest tensor, MiB (default 256)")
    p.add_argument(
        "--gpu-fraction", type=float, default=0.9, help="of free GPU memory (default 0.9)"
    )
    p.add_argument(
        "--host-fraction",
        type=float,
        default=0.5,
        help="of available host memory for one set of buffers (default 0.5; pinned memory "
        "cannot be swapped out)",
    )
    p.add_argument("--out", type=Path, help=f"write the results as JSON here (e.g. {DEFAULT_JSON})")
    args = p.parse_args(argv)
    try:
        args.size_list = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
        if not args.size_list:
            raise ValueError("--sizes names no size")
        if args.repeats < 1:
            raise ValueError(f"--repeats must be at least 1, got {args.repeats}")
        if not 1 <= args.shard_mib <= 1 << 16:
            raise ValueError(f"--shard-mib must be 1 to 65536 MiB, got {args.shard_mib}")
        for name in ("gpu_fraction", "host_fraction"):
            v = getattr(args, name)
            if not 0 < v <= 1:
                raise ValueError(f"--{name.replace('_', '-')} must be in (0, 1], got {v}")
    except ValueError as exc:
        p.error(str(exc))
    return args


# -- measuring (CUDA only) --------------------------------------------------------------------
def host_available_bytes() -> int:
    """MemAvailable, or the cgroup's remaining limit when that is smaller."""
    avail = math.inf
    try:
        for line in Path("/proc/meminfo").read_text().splitlines():
            if line.startswith("MemAvailable:"):
                avail = int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        limit = Path("/sys/fs/cgroup/memory.max").read_text().strip()
        used = int(Path("/sys/fs/cgroup/memory.current").read_text())
        if limit != "max":
            avail = min(avail, int(limit) - used)
    except (OSError, ValueError):
        pass
    return int(avail) if math.isfinite(avail) else 0


def _free_host_cache(torch) -> None:
    """Give torch's cached pinned blocks back, so the next allocation is a cold one."""
    import gc

    gc.collect()
    empty = getattr(torch._C, "_host_emptyCache", None)
    if empty is not None:
        empty()


def measure(plan_: Plan, repeats: int) -> dict[str, list[float]]:
    """Seconds per repeat of every method (:data:`METHODS`) for one size."""
    import torch

    from simulator import ckptio
    from simulator.controller import state as controller_state

    dtypes = {"bfloat16": torch.bfloat16, "float32": torch.float32}
    gpu = {name: torch.empty(n, dtype=dtypes[d], device="cuda") for name, d, n in plan_.shards()}
    torch.cuda.synchronize()
    times: dict[str, list[float]] = {m: [] for m in METHODS}

    def host(pin: bool) -> dict:
        return {k: torch.empty(t.shape, dtype=t.dtype, pin_memory=pin) for k, t in gpu.items()}

    def timed_copies(dst: dict, method: str) -> None:
        for r in range(repeats + 1):  # the first is the warm-up
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for k, t in gpu.items():
                dst[k].copy_(t, non_blocking=True)
            end.record()
            end.synchronize()
            if r:
                times[method].append(start.elapsed_time(end) / 1e3)

    _free_host_cache(torch)
    t0 = time.perf_counter()
    pinned = host(True)
    times["pinned allocation"].append(time.perf_counter() - t0)
    timed_copies(pinned, "pinned")
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        ckptio.stage(gpu, out=pinned)
        if r:
            times["ckptio.stage (reused)"].append(time.perf_counter() - t0)
    del pinned
    _free_host_cache(torch)
    # The controller flattens its nested state and stages every tensor (after the first save,
    # into the previous save's buffers).
    state = {"model": {k: v for k, v in gpu.items() if k.startswith("weights")}}
    state["optimizer"] = {k: v for k, v in gpu.items() if not k.startswith("weights")}
    buffers = None
    for r in range(repeats + 1):
        t0 = time.perf_counter()
        staged, buffers = controller_state.stage(state, reuse=buffers)
        took = time.perf_counter() - t0
        times["controller stage (first)" if r == 0 else "controller stage (later)"].append(took)
        del staged  # the background write is done: its buffers are the next save's
    del buffers
    _free_host_cache(torch)
    pageable = host(False)
    for t in pageable.values():
        t.zero_()  # page faults before timing, not during
    timed_copies(pageable, "pageable")
    del pageable, state
    gpu.clear()  # the device tensors go before the next size is planned
    torch.cuda.empty_cache()
    return times


def rows_for(plan_: Plan, times: dict[str, list[float]]) -> list[dict]:
    rows = []
    for method in METHODS:
        seconds = times.get(method) or []
        if not seconds:
            continue
        median = statistics.median(seconds)
        rate = plan_.measured_bytes / median if median > 0 else math.inf
        rows.append(
            {
                "params": plan_.params,
                "state": plan_.state,
                "bytes": plan_.bytes,
                "measured_params": plan_.measured_params,
                "measured_bytes": plan_.measured_bytes,
                "limit": plan_.limit,
                "method": method,
                "seconds": seconds,
                "median_s": median,
                "bytes_per_s": rate,
                "full_state_s": plan_.bytes / rate,
                "extrapolated": plan_.measured_params < plan_.params,
            }
        )
    return rows


def machine() -> dict:
    import torch

    props = torch.cuda.get_device_properties(0)
    return {
        "gpu": props.name,
        "gpu_memory_bytes": props.total_memory,
        "torch": torch.__version__,
        "cuda": torch.version.cuda,
        "host": platform.node(),
        "cpu_count": os.cpu_count(),
        "host_available_bytes": host_available_bytes(),
        "date_utc": time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()),
    }


def _size(params: int) -> str:
    return f"{params / 1e9:g}B" if params >= 1e9 else f"{params / 1e6:g}M"


def markdown_lines(doc: dict) -> list[str]:
    """The results as a Markdown table (the bench report includes these lines)."""
    m = doc["machine"]
    lines = [
        f"Measured by `python -m experiments.gpu_staging` on {m['gpu']} "
        f"({m['gpu_memory_bytes'] / 2**30:.0f} GiB), torch {m['torch']} / CUDA {m['cuda']}, "
        f"{m['date_utc']} UTC; median of {doc['repeats']} repeats after a warm-up. State "
        f"{doc['state']} ({doc['bytes_per_param']} B/param). GB = 1e9 bytes.",
        "",
        "| size | measured GB (of) | method | median s | GB/s | full state s |",
        "|---|---|---|---|---|---|",
    ]
    for r in doc["rows"]:
        full = f"{r['full_state_s']:.2f}" + (" (extrapolated)" if r["extrapolated"] else "")
        of = f"{r['measured_bytes'] / 1e9:.1f} ({r['bytes'] / 1e9:.1f})"
        lines.append(
            f"| {_size(r['params'])} | {of} | {r['method']} | {r['median_s']:.3f} | "
            f"{r['bytes_per_s'] / 1e9:.1f} | {full} |"
        )
    if not doc.get("host_cache_emptied", True):
        lines.append(
            "\nThis torch could not empty its pinned-memory cache, so `controller stage (first)` "
            "may have reused cached blocks: it is not a cold allocation here."
        )
    capped = sorted({(r["params"], r["limit"]) for r in doc["rows"] if r["extrapolated"]})
    for params, limit in capped:
        lines.append(
            f"\n{_size(params)}: the whole state does not fit this machine's {limit} memory "
            "alongside the copy; the slice measured has the same parts and shards, and the full "
            "state's time is that slice's bandwidth applied to all its bytes."
        )
    return lines


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        import torch
    except ImportError:
        print("gpu_staging: torch is not installed; nothing measured.")
        return 0
    if not torch.cuda.is_available():
        print(
            "gpu_staging: no CUDA device here (torch.cuda.is_available() is False, torch "
            f"{torch.__version__}); nothing measured."
        )
        return 0
    rows = []
    for params in args.size_list:
        free, _ = torch.cuda.mem_get_info()
        p = plan(
            params,
            state=args.state,
            gpu_free_bytes=free,
            host_free_bytes=host_available_bytes(),
            gpu_fraction=args.gpu_fraction,
            host_fraction=args.host_fraction,
            shard_bytes=args.shard_mib << 20,
        )
        t0 = time.perf_counter()
        rows += rows_for(p, measure(p, args.repeats))
        print(
            f"{_size(params)}: measured {p.measured_bytes / 1e9:.1f} of {p.bytes / 1e9:.1f} GB "
            f"(limit: {p.limit}) in {time.perf_counter() - t0:.0f} s",
            flush=True,
        )
    doc = {
        "schema": "ckptsim-gpu-staging/1",
        "machine": machine(),
        "state": args.state,
        "bytes_per_param": sum(b for _, _, b in STATES[args.state]),
        "repeats": args.repeats,
        "shard_bytes": args.shard_mib << 20,
        # Without it the "first" controller stage may reuse cached pinned blocks (not cold).
        "host_cache_emptied": hasattr(torch._C, "_host_emptyCache"),
        "rows": rows,
    }
    print("\n".join(markdown_lines(doc)))
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(doc, indent=1) + "\n", encoding="utf-8")
        print(f"wrote {args.out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1:]))
