"""Plots of checkpoint intervals, waste and cost; each draws on a matplotlib Axes it returns.

Every function takes ``ax=None`` (a new figure when None) and returns the Axes, so plots can
be combined into panels. matplotlib is imported lazily (``import simulator`` stays fast) and
``save`` writes PNG and SVG side by side with the Agg backend (no display needed).

Controller intervals (``controller_intervals``): from the controller's own run log
(``read_run_log``: a checkpoint directory or its ``runlog.jsonl``; each ``save`` record
carries the step, the session's running time and the interval chosen then; time runs on
across restarts, which are marked), or from an interval table (``read_interval_log``): a CSV
with the header ``step,time_s,interval_s``, or JSON — a list of records, ``{"records":
[...]}``, or one record per line (JSON lines) — with those keys: the training step, the time
since the run started (s), and the interval the controller chose at that moment (s). Other
columns or keys are ignored.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from pathlib import Path

import numpy as np

from simulator import analytic
from simulator.display import format_duration, format_usd
from simulator.errors import InputError
from simulator.policies import USUAL_INTERVALS

__all__ = [
    "DEFAULT_MARKS_S",
    "controller_intervals",
    "cost_distribution",
    "interval_curve",
    "optimum_vs_size",
    "read_interval_log",
    "read_run_log",
    "save",
    "time_breakdown",
    "tornado",
]

DEFAULT_MARKS_S = {u.short: u.interval_s for u in USUAL_INTERVALS}
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
    return format_duration(seconds)


def _dollar_axis(axis) -> None:
    """Ticks in $ with thousands separators (matplotlib would write 4.98e+07 and an offset)."""
    from matplotlib.ticker import FuncFormatter, MaxNLocator

    axis.set_major_locator(MaxNLocator(5))  # a label is ~11 characters wide: fewer ticks
    axis.set_major_formatter(FuncFormatter(lambda v, _pos: format_usd(v)))


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
    ax.set_ylabel("waste fraction" if metric == "waste" else "expected cost of the run")
    if metric == "cost":
        _dollar_axis(ax.yaxis)
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
        name = str(label) if label is not None else "simulated optimum (95 % CI)"
        kw = dict(color=f"C{i}", marker="o", ms=4, label=name)
        if f"{y}_lo" in d and f"{y}_hi" in d:
            err = np.vstack([yv - d[f"{y}_lo"] / 60.0, d[f"{y}_hi"] / 60.0 - yv])
            ax.errorbar(d[x], yv, yerr=np.abs(err), capsize=2, **kw)
        else:
            ax.plot(d[x], yv, **kw)
    ax.set_xscale("log")
    ax.set_yscale("log")
    ax.set_xlabel("GPUs in the job")
    ax.set_ylabel("optimal interval (minutes)")
    from matplotlib.ticker import FuncFormatter

    # Plain minutes on the log axis (matplotlib writes 6×10¹ there by default).
    for which in ("major", "minor"):
        getattr(ax.yaxis, f"set_{which}_formatter")(FuncFormatter(lambda v, _p: f"{v:g}"))
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
    """Every replica's run cost, one row per policy (a dot each, jittered within its row so
    none hides another), with the policy's mean marked by a bar across its row.

    One row per policy, not overlaid histograms: bins shared by a near-optimal policy and an
    hourly one squash the near-optimal spread into one or two bars, and overlap hides it.
    """
    ax = _axes(ax)
    values = [np.asarray(v, dtype=float) for v in costs.values()]
    money = format_usd if unit == "USD" else (lambda x: f"{x:,.4g} {unit}")
    jitter = np.random.default_rng(0)  # the same picture on every run
    for i, (name, v) in enumerate(zip(costs, values, strict=True)):
        y = i + jitter.uniform(-0.3, 0.3, len(v))
        ax.scatter(v, y, s=6, alpha=0.5, color=f"C{i}", label=f"{name} (mean {money(v.mean())})")
        ax.plot([v.mean()] * 2, [i - 0.4, i + 0.4], color=f"C{i}", lw=2)
    ax.set_yticks(range(len(values)), list(costs))
    ax.set_ylim(len(values) - 0.5, -0.5)  # the first policy on top, as the legend reads
    ax.set_xlabel(f"cost of the run ({unit}); one dot per replica, bar: mean")
    if unit == "USD":
        _dollar_axis(ax.xaxis)
    ax.set_ylabel("policy")
    ax.legend(fontsize=8, loc="best")
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
        raise InputError(f"cannot read interval log {path}: {_reason(exc)}") from None
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

        try:
            df = pd.read_csv(StringIO(text))
        except ValueError as exc:  # pandas' ParserError and EmptyDataError
            first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
            raise InputError(f"{path}: not a CSV interval log ({first})") from None
    missing = [c for c in ("step", "time_s", "interval_s") if c not in df]
    if missing:
        raise InputError(
            f"{path}: interval log needs columns step, time_s, interval_s (missing {missing[0]})"
        )
    df = df[["step", "time_s", "interval_s"]].apply(pd.to_numeric, errors="coerce").dropna()
    if df.empty:
        raise InputError(f"{path}: no numeric rows in the interval log")
    return df.sort_values("time_s").reset_index(drop=True)


def _reason(exc: BaseException) -> str:
    return getattr(exc, "strerror", None) or str(exc) or type(exc).__name__


def _is_run_log(path: Path) -> bool:
    from simulator.controller.runlog import RUNLOG

    return path.is_dir() or path.name == RUNLOG


def read_run_log(path: str | Path):
    """The controller's ``runlog.jsonl`` (or the checkpoint directory holding it) as a
    DataFrame of step, time_s, interval_s, session: one row per successful save.

    ``time_s`` is training time since the run began: each session's running time, added to
    the sessions before it (downtime between sessions is not in the log). A save without a
    recorded interval (a log written before intervals were logged) uses the time since the
    session's previous save.
    """
    import pandas as pd

    # The run log's own reader (torn lines skipped); it never imports torch.
    from simulator.controller.runlog import RUNLOG, read_events

    path = Path(path)
    file = path / RUNLOG if path.is_dir() else path
    if not file.is_file():
        where = f"no {RUNLOG} in {path}" if path.is_dir() else f"{path} does not exist"
        raise InputError(f"cannot read the controller's run log: {where}")
    try:
        events = read_events(file, follow=True)  # a path the user gave, read only
    except OSError as exc:
        raise InputError(f"cannot read run log {file}: {_reason(exc)}") from None
    rows, offset, session, session_end = [], 0.0, None, 0.0
    last_save: dict[str, float] = {}  # per tier (a run with a local tier logs both)
    for e in events:
        t = e.get("session_s")
        if not isinstance(t, int | float) or not np.isfinite(t):
            continue
        if e["session"] != session:
            offset += session_end
            session, session_end, last_save = e["session"], 0.0, {}
        session_end = max(session_end, float(t))
        if e["event"] != "save" or e.get("ok") is False or not isinstance(e.get("step"), int):
            continue
        tier = e.get("tier") if isinstance(e.get("tier"), str) else "persistent"
        interval = e.get("interval_s")
        if not isinstance(interval, int | float) or not np.isfinite(interval):
            interval = float(t) - last_save[tier] if tier in last_save else None
        last_save[tier] = float(t)
        if interval is not None and interval > 0:
            rows.append((e["step"], offset + float(t), float(interval), e["session"], tier))
    if not rows:
        raise InputError(
            f"{file}: no saves with an interval in the run log ({len(events)} records)"
            if events
            else f"{file}: the run log is empty or unreadable (no run-log records)"
        )
    return pd.DataFrame(rows, columns=["step", "time_s", "interval_s", "session", "tier"])


def controller_intervals(log, *, reference_s: Mapping[str, float] | None = None, ax=None):
    """The interval the live controller chose over a run (a step line), with references.

    ``log``: a checkpoint directory or its ``runlog.jsonl`` (restarts drawn as dotted
    lines), an interval table file, or a DataFrame with step, time_s, interval_s.
    """
    if isinstance(log, str | Path):
        df = read_run_log(log) if _is_run_log(Path(log)) else read_interval_log(log)
    else:
        df = log
    ax = _axes(ax)
    if "session" in df:
        starts = df.groupby("session", sort=False)["time_s"].min().to_numpy(float)[1:]
        for i, t in enumerate(starts):
            ax.axvline(t / 3600.0, color="0.5", ls=":", lw=1, label="restart" if i == 0 else None)
    several = "tier" in df and df["tier"].nunique() > 1
    tiers = df.groupby("tier", sort=False) if "tier" in df else [(None, df)]
    for i, (tier, rows) in enumerate(tiers):
        ax.step(
            rows["time_s"] / 3600.0,
            rows["interval_s"] / 60.0,
            where="post",
            color="C0",
            ls=("-", "-.")[i % 2],
            label=f"controller's interval ({tier} tier)" if several else "controller's interval",
        )
    for i, (name, s) in enumerate((reference_s or {}).items()):
        ax.axhline(s / 60.0, color=f"C{i + 1}", ls="--", lw=1, label=name)
    ax.set_xlabel("time since the run started (hours)")
    ax.set_ylabel("checkpoint interval (minutes)")
    ax.legend(fontsize=8)
    return ax
