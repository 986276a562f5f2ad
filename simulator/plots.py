"""Plots of checkpoint intervals, waste and cost; each draws on a matplotlib Axes it returns.

Every function takes ``ax=None`` (a new figure when None) and returns the Axes, so plots can
be combined into panels. matplotlib is imported lazily (``import simulator`` stays fast) and
``save`` writes PNG and SVG side by side with the Agg backend (no display needed).

Controller interval log (``controller_intervals``, ``read_interval_log``): a CSV with the
header ``step,time_s,interval_s``, or JSON — a list of records, ``{"records": [...]}``, or
one record per line (JSON lines) — with those keys: the training step, the wall time since
the run started (s), and the interval the controller chose at that moment (s). Other
columns or keys are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from simulator import analytic
from simulator.errors import InputError

__all__ = [
    "DEFAULT_MARKS_S",
    "controller_intervals",
    "cost_distribution",
    "interval_curve",
    "optimum_vs_size",
    "read_interval_log",
    "save",
    "time_breakdown",
    "tornado",
]

DEFAULT_MARKS_S = {"30 min": 1800.0, "1 h": 3600.0, "3 h": 10800.0}
BUCKETS = (
    ("useful_h", "useful"),
    ("checkpoint_h", "checkpointing"),
    ("lost_h", "lost work"),
    ("recovery_h", "recovery"),
)


def _axes(ax):
    import matplotlib

    if ax is not None:
        return ax
    if matplotlib.get_backend().lower() not in (
        "agg",
        "svg",
        "pdf",
        "module://matplotlib_inline.backend_inline",
    ):
        matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    _, ax = plt.subplots(figsize=(7.0, 4.2), layout="constrained")
    return ax


FIGURE_SUFFIXES = ("", ".png", ".svg")
"""What ``save``'s stem may end in: nothing, or one of the formats it writes (then dropped)."""


def save(ax_or_fig, stem: str | Path, formats: Sequence[str] = ("png", "svg")) -> list[Path]:
    """Write the figure as ``stem.png`` and ``stem.svg`` (parents created); the paths.

    Each file is replaced in one step (``simulator.outfile.write_atomic``), never half-written.
    """
    from simulator.outfile import check_output, write_atomic

    fig = getattr(ax_or_fig, "figure", ax_or_fig)
    stem = check_output(stem)
    if stem.suffix.lower() in (".png", ".svg"):
        stem = stem.with_suffix("")
    paths = []
    try:
        for fmt in formats:
            path = stem.with_name(f"{stem.name}.{fmt}")
            write_atomic(path, lambda tmp, fmt=fmt: fig.savefig(tmp, format=fmt, dpi=130))
            paths.append(path)
    finally:
        import matplotlib.pyplot as plt

        plt.close(fig)
    return paths


def _hours_label(seconds: float) -> str:
    return f"{seconds / 60:.0f} min" if seconds < 3600 else f"{seconds / 3600:.3g} h"


def interval_curve(result: Mapping, scenario, *, metric: str = "waste", ax=None):
    """Waste (or cost) against the interval: simulated mean with its band, the closed form,
    the simulated optimum with its CI, and the usual defaults.

    ``result`` is what ``optimize.optimize_by_simulation`` returns.
    """
    if metric not in ("waste", "cost"):
        raise InputError(f"metric must be waste or cost, got {metric!r}")
    ax = _axes(ax)
    grid = result["grid"]
    tau = np.asarray(grid["interval_s"], dtype=float)
    work = scenario.work_s
    per_wall = 1.0  # objective units per second of wall time
    if result["objective"] == "cost_usd":
        per_wall = (scenario.gpus or 1) * scenario.usd_per_gpu_hour / 3600.0

    def convert(y):
        wall = np.asarray(y, dtype=float) / per_wall
        return 1.0 - work / wall if metric == "waste" else wall * per_wall

    mean, lo, hi = (convert(grid[k]) for k in ("mean", "lo", "hi"))
    if metric == "waste":
        lo, hi = np.minimum(lo, hi), np.maximum(lo, hi)
    x = tau / 3600.0
    ax.fill_between(x, lo, hi, alpha=0.25, color="C0", label=f"{result['level']:.0%} CI")
    ax.plot(x, mean, "o-", color="C0", ms=3, label=f"simulated ({result['replicas']} replicas)")
    dense = np.geomspace(tau.min(), tau.max(), 200)
    w = analytic.waste_fraction(
        dense, scenario.save_stall_s, scenario.system_mtbf_s, scenario.recovery_s
    )
    y = w if metric == "waste" else work / (1.0 - w) * per_wall
    ax.plot(dense / 3600.0, y, "--", color="C1", label="closed form (Daly 2006)")
    opt = result["interval_s"]
    ci = result["interval_ci_s"]
    ax.axvspan(ci[0] / 3600.0, ci[1] / 3600.0, color="C2", alpha=0.2)
    ax.axvline(opt / 3600.0, color="C2", label=f"optimum {_hours_label(opt)}")
    # The defaults as measured (fresh seeds, see optimize_by_simulation), even off the grid.
    measured = result.get("policies", {})
    for name, s in DEFAULT_MARKS_S.items():
        ax.axvline(s / 3600.0, color="0.4", ls=":", lw=1)
        entry = measured.get("fixed-" + name.replace(" ", ""))
        if entry is not None:
            yv = float(convert(entry["mean"]))
            ax.plot([s / 3600.0], [yv], "D", color="0.3", ms=5)
            ax.annotate(
                f"every {name}",
                (s / 3600.0, yv),
                textcoords="offset points",
                xytext=(-4, 6),
                ha="right",
                fontsize=8,
                color="0.3",
            )
    ax.set_xscale("log")
    ax.set_xlabel("checkpoint interval (hours of compute)")
    ax.set_ylabel("waste fraction" if metric == "waste" else "expected cost (USD)")
    ax.set_title(f"{scenario.name}: {metric} against interval")
    ax.legend(fontsize=8)
    return ax


def optimum_vs_size(df, *, x: str = "gpus", y: str = "interval_s", by: str | None = None, ax=None):
    """The optimum interval against cluster size, log-log; ``y_lo``/``y_hi`` columns as bars."""
    ax = _axes(ax)
    groups = [(None, df)] if by is None else list(df.groupby(by, sort=False))
    for i, (label, d) in enumerate(groups):
        d = d.sort_values(x)
        yv = d[y].to_numpy(float) / 60.0
        kw = dict(color=f"C{i}", marker="o", ms=4, label=str(label) if label is not None else y)
        if f"{y}_lo" in d and f"{y}_hi" in d:
            err = np.vstack([yv - d[f"{y}_lo"] / 60.0, d[f"{y}_hi"] / 60.0 - yv])
            ax.errorbar(d[x], yv, yerr=np.abs(err), capsize=2, **kw)
        else:
            ax.plot(d[x], yv, **kw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("optimal interval (minutes)")
    ax.legend(fontsize=8)
    return ax


def time_breakdown(df, *, label: str = "policy", ax=None):
    """Where the time goes: stacked useful / checkpointing / lost work / recovery hours."""
    ax = _axes(ax)
    labels = df[label].astype(str).to_list()
    bottom = np.zeros(len(df))
    for i, (col, name) in enumerate(BUCKETS):
        if col not in df:
            raise InputError(f"time breakdown needs a {col} column")
        h = df[col].to_numpy(float)
        ax.bar(labels, h, bottom=bottom, color=f"C{i}", label=name)
        bottom += h
    ax.set_ylabel("hours of wall time (mean over replicas)")
    ax.legend(fontsize=8)
    ax.tick_params(axis="x", labelrotation=20)
    return ax


def cost_distribution(costs: Mapping[str, np.ndarray], *, unit: str = "USD", ax=None):
    """Histogram of the per-replica run cost of each policy, with its mean marked."""
    ax = _axes(ax)
    values = [np.asarray(v, dtype=float) for v in costs.values()]
    bins = np.histogram_bin_edges(np.concatenate(values), bins=30)
    for i, (name, v) in enumerate(zip(costs, values, strict=True)):
        ax.hist(v, bins=bins, alpha=0.45, color=f"C{i}", label=f"{name} (mean {v.mean():,.4g})")
        ax.axvline(v.mean(), color=f"C{i}", lw=1.5)
    ax.set_xlabel(f"cost of the run ({unit})")
    ax.set_ylabel("replicas")
    ax.legend(fontsize=8)
    return ax


def tornado(df, base_s: float, *, ax=None):
    """Sensitivity of the optimum to each input: bars from the low to the high setting.

    ``df`` has columns ``input``, ``low_s``, ``high_s`` (the optimum with that input at its
    low/high value) and optionally ``low_label``/``high_label``.
    """
    ax = _axes(ax)
    d = df.assign(span=(df["high_s"] - df["low_s"]).abs()).sort_values("span")
    ypos = np.arange(len(d))
    lo = d["low_s"].to_numpy(float) / 60.0
    hi = d["high_s"].to_numpy(float) / 60.0
    base = base_s / 60.0
    ax.barh(ypos, lo - base, left=base, color="C0", label="input at low value")
    ax.barh(ypos, hi - base, left=base, color="C3", label="input at high value")
    ax.axvline(base, color="k", lw=1)
    ax.set_yticks(ypos, d["input"].to_list())
    ax.set_xlabel("optimal interval (minutes)")
    ax.legend(fontsize=8)
    return ax


def read_interval_log(path: str | Path):
    """A controller interval log (CSV or JSON, see the module docstring) as a DataFrame."""
    import pandas as pd

    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except OSError as exc:
        raise InputError(f"cannot read interval log {path}: {exc.strerror}") from None
    except UnicodeDecodeError:
        raise InputError(f"{path}: not a UTF-8 text file (CSV or JSON)") from None
    if not text.strip():
        raise InputError(f"{path}: the interval log is empty (no records yet?)")
    if path.suffix.lower() in (".json", ".jsonl") or text.lstrip()[:1] in ("[", "{"):
        try:
            data = json.loads(text)
            records = data["records"] if isinstance(data, dict) else data
        except (json.JSONDecodeError, KeyError, TypeError):
            try:
                records = [json.loads(line) for line in text.splitlines() if line.strip()]
            except json.JSONDecodeError as exc:
                raise InputError(f"{path}: not JSON or JSON lines ({exc.msg})") from None
        df = pd.DataFrame(records)
    else:
        from io import StringIO

        df = pd.read_csv(StringIO(text))
    missing = [c for c in ("step", "time_s", "interval_s") if c not in df]
    if missing:
        raise InputError(
            f"{path}: interval log needs columns step, time_s, interval_s (missing {missing[0]})"
        )
    df = df[["step", "time_s", "interval_s"]].apply(pd.to_numeric, errors="coerce").dropna()
    if df.empty:
        raise InputError(f"{path}: no numeric rows in the interval log")
    return df.sort_values("time_s").reset_index(drop=True)


def controller_intervals(log, *, reference_s: Mapping[str, float] | None = None, ax=None):
    """The interval the live controller chose over a run (a step line), with references."""
    ax = _axes(ax)
    df = read_interval_log(log) if isinstance(log, str | Path) else log
    ax.step(
        df["time_s"] / 3600.0,
        df["interval_s"] / 60.0,
        where="post",
        color="C0",
        label="controller's interval",
    )
    for i, (name, s) in enumerate((reference_s or {}).items()):
        ax.axhline(s / 60.0, color=f"C{i + 1}", ls="--", lw=1, label=name)
    ax.set_xlabel("time since the run started (hours)")
    ax.set_ylabel("checkpoint interval (minutes)")
    ax.legend(fontsize=8)
    return ax
