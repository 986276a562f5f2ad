"""Checkpoint cost on this machine: every format against the raw disk, and the fitted model.

Runs ``simulator.bench`` (the code behind ``ckptsim bench``) in three passes — a size sweep
over all formats, a larger size for the two goal ratios (the project's writer vs the raw disk,
the async stall vs a synchronous save), and a bf16-with-fp32-master pass — then fits the cost
model and writes ``reports/bench-<machine>.md``, the profile JSON beside it and a figure under
``reports/figures/``. About 3 minutes on 2 cores and a virtual disk (3.1 and 3.2 in two runs
on 2026-12-06; more on a shared machine); ``--quick`` ~1 minute. ``--from-json PROFILE``
re-renders the report and figure from the samples a profile JSON stores (refitting them),
without touching the disk: a report can follow a change to the fit or the goal rule without a
new measurement, and says so.

Goals are judged per repeat at every measured size (``simulator.engines.results.goal_verdict``): met
only when every size's whole 95 % interval meets the goal.

    python experiments/bench_checkpoint.py [--quick] [--dir DIR] [--machine cpu-2core]
    python experiments/bench_checkpoint.py --from-json reports/bench-cpu-2core.json
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:  # run as a script: make `simulator` importable
    sys.path.insert(0, str(REPO))

from simulator.bench import BenchConfig, run_benchmark  # noqa: E402
from simulator.bench.runner import BenchResult, summarise  # noqa: E402
from simulator.engines.results import MIN_REPEATS, interval_texts  # noqa: E402
from simulator.model.checkpoint_cost import CostProfile  # noqa: E402

PASSES = {
    "full": [
        dict(sizes=("10M", "50M", "100M"), repeats=2),
        dict(sizes=("500M",), formats=("ckptsim",), repeats=1),
        dict(sizes=("10M", "50M"), dtypes=("bf16",), repeats=1),
    ],
    "quick": [
        dict(sizes=("1M", "5M"), repeats=1),
        dict(sizes=("10M",), formats=("ckptsim",), repeats=1),
        dict(sizes=("1M", "5M"), dtypes=("bf16",), formats=("ckptsim", "torch"), repeats=1),
    ],
}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--quick", action="store_true", help="tiny sizes, for a smoke run")
    ap.add_argument("--dir", type=Path, default=REPO, help="where to write (the disk measured)")
    ap.add_argument("--machine", default="cpu-2core", help="short label for file names")
    ap.add_argument("--reports", type=Path, default=REPO / "reports")
    ap.add_argument(
        "--from-json",
        type=Path,
        metavar="PROFILE",
        help="re-render from a stored profile's samples instead of measuring",
    )
    args = ap.parse_args(argv)

    if args.from_json is not None:
        data = json.loads(args.from_json.read_text())
        samples, machine, notes = data["samples"], data["machine"], data.get("notes", [])
    else:
        samples, machine, notes = measure(args)
    result = summarise(samples, notes, machine)
    profile = CostProfile.from_samples(samples, machine)

    args.reports.mkdir(parents=True, exist_ok=True)
    figures = args.reports / "figures"
    figures.mkdir(exist_ok=True)
    name = f"bench-{args.machine}"
    data = profile.to_dict() | {"notes": notes}
    (args.reports / f"{name}.json").write_text(json.dumps(data, indent=1) + "\n")
    fig = figures / f"{name}.png"
    plot(profile, fig)
    md = render(result, profile, fig.relative_to(args.reports), args)
    (args.reports / f"{name}.md").write_text(md)
    print(md)
    return 0


def measure(args) -> tuple[list[dict], dict, list[str]]:
    """Run the passes on ``args.dir``: samples, machine facts (with load and duration), notes."""
    import torch

    # The machine is shared: with other jobs running, torch's intra-op threads spin against
    # them and turn memory copies into tens of milliseconds; one thread measures the I/O.
    torch.set_num_threads(1)
    load_before = os.getloadavg()
    start = time.perf_counter()
    runs: list[BenchResult] = []
    for spec in PASSES["quick" if args.quick else "full"]:
        runs.append(run_benchmark(BenchConfig(directory=args.dir, **spec), progress=True))
    machine = dict(runs[0].machine)
    machine["loadavg_before"], machine["loadavg_after"] = load_before, os.getloadavg()
    machine["torch_threads"] = 1
    machine["elapsed_s"] = time.perf_counter() - start
    machine["command"] = "python experiments/bench_checkpoint.py" + (
        " --quick" if args.quick else ""
    )
    notes = sorted({n for r in runs for n in r.notes})
    return [s for r in runs for s in r.samples], machine, notes


def plot(profile: CostProfile, path: Path) -> None:
    import matplotlib
    import matplotlib.ticker

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    import numpy as np

    fig, axes = plt.subplots(1, 2, figsize=(12, 4.8), sharex=True)
    formats = sorted({s["format"] for s in profile.samples})
    colors = dict(zip(formats, plt.cm.tab10.colors, strict=False))
    for ax, key, title in ((axes[0], "save_s", "save (fsync'ed)"), (axes[1], "load_s", "load")):
        for i, fmt in enumerate(formats):
            rows = [s for s in profile.samples if s["format"] == fmt and s.get(key) is not None]
            x = np.array([r["bytes"] for r in rows]) / 1e9
            y = np.array([r[key] for r in rows])
            style = dict(color="black", marker="s") if fmt == "raw" else dict(marker="o")
            # Formats side by side around their true size (a few per cent on the log axis,
            # in a fixed order, each repeat a little further right) so that no point hides
            # another at the same bytes;
            # the fitted lines below are drawn at the true sizes.
            nudge = 2 ** (
                (i - (len(formats) - 1) / 2) * 0.03
                + np.array([r.get("repeat", 0) for r in rows]) * 0.008
            )
            ax.scatter(x * nudge, y, s=14, label=fmt, alpha=0.75, edgecolors="black",
                       linewidths=0.3, **({"color": colors[fmt]} | style))  # fmt: skip
            fit = profile.fits.get(fmt)
            line = None if fit is None else (fit.save if key == "save_s" else fit.load)
            if line is not None and len(x):
                xs = np.geomspace(x.min(), x.max(), 50)
                ax.plot(
                    xs,
                    [line.seconds(v * 1e9) for v in xs],
                    color="black" if fmt == "raw" else colors[fmt],
                    lw=2.2 if fmt == "raw" else 1,
                    ls="-" if fmt == "raw" else "--",
                )
        ax.set(xscale="log", yscale="log", ylabel="seconds")
        ax.set_xlabel("bytes written (GB; formats spread a little apart)")
        ax.xaxis.set_minor_formatter(matplotlib.ticker.NullFormatter())
        ax.set_title(f"{title}: samples and fitted latency + bytes/bandwidth")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def _gb(x: float) -> str:
    return f"{x / 1e9:.3f}"


def _provenance(m: dict, args) -> str:
    run = "python experiments/bench_checkpoint.py"
    if args.from_json is None:
        took = m.get("elapsed_s", 0) / 60
        return (
            f"Regenerate with `{m.get('command', run)}` (this run took {took:.1f} min). Every "
            f"number below was measured by that script in one run on {m['date_utc']}."
        )
    took = f", which took {m['elapsed_s'] / 60:.1f} min" if "elapsed_s" in m else ""
    return (
        f"Re-rendered by `{run} --from-json {args.from_json.as_posix()}` from the measurements "
        f"stored there, taken on {m['date_utc']} by `{m.get('command', run)}`{took}; the disk was "
        "not measured again. The fits, goal verdicts and figure are recomputed from those "
        "samples; a fresh measurement is `" + run + "` (about 3 minutes of disk writes)."
    )


def _passes(samples: list[dict]) -> str:
    """What was measured, read off the samples (so a re-rendered report cannot misstate it)."""
    cells: dict[tuple, dict[str, int]] = {}
    for x in samples:
        runs = cells.setdefault((x["dtype"] != "fp32", x["params"], x["size"], x["dtype"]), {})
        runs[x["format"]] = runs.get(x["format"], 0) + 1
    out = []
    for (_, _, size, dtype), runs in sorted(cells.items()):
        reps = sorted(set(runs.values()))
        fmts = "all 7 formats" if len(runs) == 7 else ", ".join(sorted(runs))
        out.append(f"{size} {dtype}: {fmts} x {'/'.join(map(str, reps))}")
    return "; ".join(out)


def _goal_lines(result: BenchResult) -> list[str]:
    lines = [
        "A goal is **met** only when at every measured size two 95 % intervals over repeats "
        "meet it (`simulator.engines.results.ratio_verdict`): the median per-repeat ratio's "
        "(distribution-free) and the expected cost's (the mean per-repeat time ratio, "
        "Student's t); each repeat's format is held to the raw job's write or read of the same "
        "repeat (a restore, where the samples hold one, to a raw read of its own file beside "
        "it) or to the synchronous save. **Not met** when some size's median or expected "
        "value misses it; **not shown** otherwise (an interval straddles the goal, or a size "
        f"ran fewer than {MIN_REPEATS} repeats and has no median interval).",
        "",
    ]
    for name, g in result.goals.items():
        bound = f"≥ {g['goal_min']}" if "goal_min" in g else f"≤ {g['goal_max']}"
        lines += [
            f"- `{name}` (goal {bound}): **{g['verdict']}**.",
            "",
            "  | size | dtype | repeats | median | 95 % interval | expected | 95 % interval |",
            "  |---|---|---|---|---|---|---|",
        ]
        for p in g["per_size"]:
            ci, eci = interval_texts(p, ".3f")
            lines.append(
                f"  | {p['size']} | {p['dtype']} | {p['n']} | {p['median']:.3f} | {ci} "
                f"| {p['expected']:.3f} | {eci} |"
            )
        lines.append("")
    return lines


def _residual_lines(profile: CostProfile) -> list[str]:
    """Measured median against the fitted line, per format and size (the fit's residuals)."""
    groups: dict[tuple, list[dict]] = {}
    for s in profile.samples:
        groups.setdefault((s["format"], s["params"], s["dtype"]), []).append(s)
    lines = [
        "Measured (median over repeats) against fitted seconds, and the relative residual:",
        "",
        "| format | size | dtype | save measured | save fitted | Δ | load measured | load fitted "
        "| Δ |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    worst: tuple[float, str] = (0.0, "")
    for (fmt, _, dtype), rows in sorted(groups.items()):
        fit = profile.fits.get(fmt)
        if fit is None:
            continue
        nbytes = statistics.median(r["bytes"] for r in rows)
        cells = []
        for key, line in (("save_s", fit.save), ("load_s", fit.load)):
            measured = statistics.median(r[key] for r in rows)
            if line is None:
                cells += [f"{measured:.3f}", "", ""]
                continue
            fitted = line.seconds(nbytes)
            rel = measured / fitted - 1
            cells += [f"{measured:.3f}", f"{fitted:.3f}", f"{100 * rel:+.0f} %"]
            if abs(rel) > abs(worst[0]):
                op = key.removesuffix("_s")
                worst = (rel, f"{fmt} {op} at {rows[0]['size']} {dtype}: measured "
                         f"{measured:.2f} s against {fitted:.2f} s fitted")  # fmt: skip
        lines.append(f"| {fmt} | {rows[0]['size']} | {dtype} | " + " | ".join(cells) + " |")
    if worst[1]:
        lines += [
            "",
            f"Largest departure from a line: {worst[1]} ({100 * worst[0]:+.0f} %). Where one "
            "size sits far off the line the others follow, the extrapolations below inherit "
            "that uncertainty.",
        ]
    return lines


def _gpu_staging_lines() -> list[str]:
    """The device-to-host staging measured by experiments/gpu_staging.py, once it has run."""
    from experiments import gpu_staging

    lines = [
        "- stage() here copies host to host. The device-to-host staging into pinned memory, the "
        "async stall on a GPU, is measured by `python -m experiments.gpu_staging --out "
        "reports/gpu-staging.json` on a GPU machine"
    ]
    path = gpu_staging.DEFAULT_JSON
    if not path.exists():
        return [lines[0] + " (not run yet; this report includes it once that file exists)."]
    doc = json.loads(path.read_text(encoding="utf-8"))
    table = gpu_staging.markdown_lines(doc)
    return [lines[0] + ":", "", "## GPU staging (device to host)", "", *table]


def render(result: BenchResult, profile: CostProfile, fig: Path, args) -> str:
    m = profile.machine
    head = max(
        (r for r in result.results if r["format"] == "raw"),
        key=lambda r: (r["params"], r["dtype"] == "fp32"),
    )
    lines = [
        f"# Checkpoint cost on `{args.machine}`",
        "",
        _provenance(m, args),
        "",
        "## Machine",
        "",
        f"- {m['cpu_count']} CPUs, {m['mem_total_bytes'] / 2**30:.0f} GiB RAM, no GPU "
        f"(CUDA available: {m['cuda']}); {m['platform']}; torch {m['torch']}.",
        f"- Disk: `{m.get('disk_device', '?')}` mounted at `{m.get('mount_point', '?')}` "
        f"({m.get('filesystem', '?')}), {m['disk_total_bytes'] / 1e9:.0f} GB; written under "
        f"`{m['directory']}`.",
        f"- Shared machine: load average {m['loadavg_before'][0]:.1f} before and "
        f"{m['loadavg_after'][0]:.1f} after the run (other jobs were running); torch used one "
        "intra-op thread. Expect run-to-run spread of tens of percent.",
        f"- Date {m['date_utc']}.",
        "",
        "## Method",
        "",
        "- State: GPT-style transformer (depth ≈ width/64, tied embedding), AdamW after one step "
        "(real forward/backward/step up to 60M parameters; above that the moments are filled "
        "from the weights with elementwise ops, same keys, dtypes and shapes), a cosine LR "
        "scheduler, torch/numpy/python RNG states and the data position. fp32 = 12 B/param; "
        "bf16 = bf16 weights + fp32 master + two fp32 moments = 14 B/param.",
        "- Formats: `torch` (torch.save), `safetensors` (tensors flattened + JSON beside), "
        "`dcp` (torch.distributed.checkpoint, FileSystemWriter, single process), `dcp-async` "
        "(DCP async_save: stall = until it returns), `ckptsim` (this project's "
        "`simulator.ckptio`, CRC-32 manifest, atomic rename), `ckptsim-async` (stage() copy = "
        "stall, then the background write; stall measured restaging into kept buffers, "
        "cold = first stage into fresh memory).",
        "- Each save fsyncs every file and the directory; before each load the files' pages "
        "are dropped (posix_fadvise DONTNEED). Loads materialise every tensor in memory "
        "(ckptsim also verifies every CRC). `raw` = one sequential os.write + fsync of the "
        "same bytes and a read back. In each repeat, raw and the formats run once each, in "
        "orders balanced so each follows each other one about equally often "
        "(`runner.interleaved`); medians over repeats. Ratios are to raw at the same size.",
        f"- Measured (size dtype: formats x repeats): {_passes(profile.samples)}.",
        "- Fit: per format, seconds = latency + bytes/bandwidth by bounded least squares "
        "(`scipy.optimize.lsq_linear`, latency ≥ 0, bandwidth > 0) on relative residuals "
        "(each sample weighted by 1/seconds: the noise here is multiplicative, and an "
        "unweighted fit lets the largest size set the line alone). Profile with raw samples: "
        f"`reports/bench-{args.machine}.json`.",
        "",
        "## Results (median over repeats)",
        "",
        f"Raw disk (the `raw` row at {head['size']} {head['dtype']}, the largest size): write "
        f"{_gb(result.raw_bytes_per_s)} GB/s, read {_gb(result.raw_read_bytes_per_s)} GB/s.",
        "",
        "| size | dtype | format | GB | save s | GB/s | save vs raw | load s | load vs raw "
        "| stall s |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    rows = sorted(result.results, key=lambda r: (r["dtype"] != "fp32", r["params"], r["format"]))
    for r in rows:
        stall = r.get("stall_s_median")
        lines.append(
            f"| {r['size']} | {r['dtype']} | {r['format']} | {_gb(r['bytes'])} | "
            f"{r['save_s_median']:.3f} | {_gb(r['bytes_per_s'])} | {r['ratio_to_raw']:.2f} "
            f"| {r['load_s_median']:.3f} | {r['load_ratio_to_raw']:.2f} | "
            f"{'' if stall is None else f'{stall:.3f}'} |"
        )
    lines += ["", "## Goals", "", *_goal_lines(result)]

    def largest(fmt: str) -> dict | None:
        found = [r for r in result.results if r["format"] == fmt]
        return max(found, key=lambda r: r["params"]) if found else None

    cold, sync = largest("ckptsim-async"), largest("ckptsim")
    if cold and sync and cold["params"] == sync["params"]:
        ratio = cold["stall_cold_s_median"] / sync["save_s_median"]
        copy_bw = cold["bytes"] / cold["stall_s_median"]
        lines += [
            f"- First save of a run at {cold['size']} (staging into freshly allocated memory): "
            f"stall ratio {ratio:.3f}; later saves reuse the buffers "
            "(`stage(..., out=previous)`).",
            f"- The stall is a memory copy: {_gb(copy_bw)} GB/s here at {cold['size']}, against "
            f"{_gb(sync['bytes_per_s'])} GB/s for the synchronous save, so the ratio cannot "
            "fall below their quotient on this machine whatever the size.",
        ]
    one_b = 1e9 * 12
    est_min = 7 * (one_b / result.raw_bytes_per_s + one_b / result.raw_read_bytes_per_s) / 60
    lines += [
        "- 1B parameters (12 GB in fp32) was not run: at the raw bandwidths above one repeat "
        f"of the seven jobs would take at least {est_min:.0f} minutes, and the async formats "
        "need state + staged copy (24 GB) in 23 GiB of RAM. The fits below extrapolate "
        "(async stall and sync save both scale with bytes).",
        *_gpu_staging_lines(),
        "",
        "## Fitted cost model",
        "",
        "| format | save latency s | save GB/s | R² | load latency s | load GB/s | stall GB/s |",
        "|---|---|---|---|---|---|---|",
    ]
    for fmt, f in profile.fits.items():
        load = f.load
        stall = f.stall
        lines.append(
            f"| {fmt} | {f.save.latency_s:.3f} | {_gb(f.save.bytes_per_s)} | {f.save.r2:.3f} | "
            f"{'' if load is None else f'{load.latency_s:.3f}'} | "
            f"{'' if load is None else _gb(load.bytes_per_s)} | "
            f"{'' if stall is None else _gb(stall.bytes_per_s)} |"
        )
    lines += ["", "R² is on seconds, so one far-off size lowers it a lot; the residuals:", ""]
    lines += [*_residual_lines(profile), ""]
    lines += [
        f"![save and load time against size]({fig})",
        "",
        "Extrapolated with `CostProfile.predict` (this disk's per-writer bandwidth; no "
        "aggregate cap unless stated):",
        "",
        "| model | nodes | format | stall s | write s | restore s |",
        "|---|---|---|---|---|---|",
    ]
    for params, nodes, cap in ((1e9, 1, None), (70e9, 1024, None), (70e9, 1024, 100e9)):
        for fmt in ("ckptsim", "ckptsim-async", "torch"):
            if fmt not in profile.fits:
                continue
            c = profile.predict(
                params=params, nodes=nodes, format=fmt, dtype="bf16", aggregate_bytes_per_s=cap
            )
            capped = "" if cap is None else f", cap {cap / 1e9:.0f} GB/s"
            lines.append(
                f"| {params / 1e9:.0f}B bf16 | {nodes}{capped} | {fmt} | {c.stall_s:.2f} | "
                f"{c.write_s:.2f} | {c.restore_s:.2f} |"
            )
    if result.notes:
        lines += ["", "Notes: " + "; ".join(sorted(set(result.notes))) + "."]
    spread = _spread(profile)
    if spread:
        lines += ["", f"Repeat spread (max/min save time, same size and format): {spread}."]
    return "\n".join(lines) + "\n"


def _spread(profile: CostProfile) -> str:
    groups: dict[tuple, list[float]] = {}
    for s in profile.samples:
        groups.setdefault((s["format"], s["dtype"], s["params"]), []).append(s["save_s"])
    ratios = [max(v) / min(v) for v in groups.values() if len(v) > 1]
    if not ratios:
        return ""
    return f"median {statistics.median(ratios):.2f}, worst {max(ratios):.2f}"


if __name__ == "__main__":
    raise SystemExit(main())
