"""Failure logs: a user's CSV or Parquet file turned into right-censored lifetimes.

A log comes in one of two shapes. *Lifetimes*: one row per unit, a duration and whether it
ended in a failure (event = 1) or observation stopped first (censored, event = 0).
*Event timestamps*: one row per failure, its time (numbers in ``unit``, or dates pandas
parses), optionally the component that failed and the cause. From timestamps with a
component column, a component's lifetimes are the gaps between its consecutive failures and
its last gap is censored at the end of the log (``end``, by default the last failure logged);
without one, the gaps are those of the whole system. The time before a component's first
logged failure is not a lifetime: its age when the log starts is unknown.

A cause column makes competing risks: for cause ``c`` a gap ended by ``c`` is an event and a
gap ended by any other cause (or by the end of the log) is censored, the cause-specific
hazard. A repair/down-time column gives each failure's time to repair (all observed).
Every problem with the file is an ``InputError`` naming the column and the bad value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from simulator.errors import InputError

__all__ = ["UNITS", "FailureLog", "parse_times", "pick_column", "read_failure_log", "read_table"]

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

# Auto-detection: the first exact (case-insensitive) name, then the first name containing one.
_GUESS = {
    "duration": ("duration", "lifetime", "ttf", "tbf", "time_to_failure", "service_time"),
    "event": ("event", "failed", "failure", "observed", "status", "censored"),
    "time": ("time", "timestamp", "failure_time", "datetime", "date", "prob_started", "start"),
    "component": ("component", "node", "nodenum", "unit", "host", "serial", "gpu", "id"),
    "cause": ("cause", "category", "reason", "type"),
    "repair": ("repair", "downtime", "down_time", "ttr", "repair_time"),
}


@dataclass(frozen=True, kw_only=True)
class FailureLog:
    """Right-censored lifetimes read from a log (seconds), with their causes and repairs."""

    durations_s: np.ndarray
    observed: np.ndarray
    """True where the lifetime ended in a failure, False where it is censored."""
    causes: np.ndarray | None = None
    """Cause of the failure that ended each lifetime (None for censored ones)."""
    repair_s: np.ndarray | None = None
    """Repair/down time of each logged failure that has one, seconds (None: no such column)."""
    repair_causes: np.ndarray | None = None
    """Cause of each failure in ``repair_s`` (None without a cause column)."""
    failure_times_s: np.ndarray | None = None
    """Failure timestamps relative to the first, sorted (timestamp logs only): for replay."""
    shape: str = "lifetimes"
    """``lifetimes`` or ``timestamps``."""
    components: int | None = None
    """Distinct components in a timestamp log with a component column."""
    columns: dict | None = None
    """The columns used, by role (for the report)."""

    @property
    def events(self) -> int:
        return int(self.observed.sum())

    @property
    def censored(self) -> int:
        return int((~self.observed).sum())


def read_table(path: str | Path):
    """A CSV or Parquet file as a pandas DataFrame (Parquet by suffix or magic bytes)."""
    import pandas as pd

    path = Path(path)
    try:
        if path.exists() and not path.is_file():  # a FIFO or device would block the read
            kind = "a directory" if path.is_dir() else "not a regular file"
            raise InputError(f"{path}: {kind}; give a CSV or Parquet file")
        with path.open("rb") as fh:
            magic = fh.read(4)
    except OSError as exc:
        raise InputError(f"cannot read failure log {path}: {exc.strerror}") from None
    try:
        if magic == b"PAR1" or path.suffix.lower() in (".parquet", ".pq"):
            return pd.read_parquet(path)
        df = pd.read_csv(path, skipinitialspace=True)
        if df.shape[1] == 1 and any(ch in str(df.columns[0]) for ch in ";\t|"):
            # Not comma-separated after all: let the sniffer find the delimiter.
            df = pd.read_csv(path, sep=None, engine="python", skipinitialspace=True)
        return df
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow (pip install 'ckptsim[parquet]'), or give a CSV"
        ) from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the failure log is empty (no header, no rows)") from None
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        first = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable CSV or Parquet table ({first})") from None


def pick_column(df, role: str, given: str | None, *, required: bool = False) -> str | None:
    cols = list(df.columns)
    if given is not None:
        if given not in cols:
            raise InputError(
                f"no column {given!r} in the log (columns: {', '.join(map(str, cols))})"
            )
        return given
    lower = {str(c).lower(): c for c in cols}
    for name in _GUESS[role]:
        if name in lower:
            return lower[name]
    for name in _GUESS[role]:
        for low, c in lower.items():
            if name in low:
                return c
    if role == "time" and len(cols) == 1:
        return cols[0]  # a log of one column can only be the failure times
    if required:
        raise InputError(
            f"cannot tell which column holds the {role}: name it with --{role}-column "
            f"(columns: {', '.join(map(str, cols))})"
        )
    return None


def _numbers(series, column: str, unit_s: float, what: str) -> np.ndarray:
    import pandas as pd

    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: {series.iloc[i]!r} is not a number of {what}"
        )
    return values * unit_s


def _event_flags(series, column: str) -> np.ndarray:
    words = {
        "1": True,
        "true": True,
        "yes": True,
        "failed": True,
        "failure": True,
        "event": True,
        "0": False,
        "false": False,
        "no": False,
        "censored": False,
        "alive": False,
    }
    text = series.astype(str).str.strip().str.lower()
    text = text.str.replace(r"\.0$", "", regex=True)
    flags = text.map(words)
    if flags.isna().any():
        i = int(np.flatnonzero(flags.isna().to_numpy())[0])
        raise InputError(
            f"column {column!r} row {i + 1}: {series.iloc[i]!r} is not an event flag "
            "(1/true/failed for a failure, 0/false/censored for censored)"
        )
    flags = flags.to_numpy(dtype=bool)
    # A column named "censored" says the opposite of an event flag.
    return ~flags if "censor" in str(column).lower() else flags


def parse_times(series, column: str, unit_s: float) -> tuple[np.ndarray, bool]:
    """Seconds (numbers in the unit, or dates relative to the first) and whether they were dates."""
    import pandas as pd

    numeric = pd.to_numeric(series, errors="coerce")
    if numeric.notna().all():
        return numeric.to_numpy(dtype=float) * unit_s, False
    # utc=True: offsets may differ row to row (a DST change, two sites); naive times are UTC.
    parsed = pd.to_datetime(series, errors="coerce", format="mixed", utc=True)
    if parsed.isna().any():
        i = int(np.flatnonzero(parsed.isna().to_numpy())[0])
        value = series.iloc[i]
        what = "is blank" if pd.isna(value) else f"cannot parse {value!r} as a time"
        raise InputError(
            f"column {column!r} row {i + 1}: {what} (give numbers in --unit, or dates such "
            "as 2024-05-01 13:20)"
        )
    if getattr(parsed.dt, "tz", None) is not None:
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    ns = parsed.to_numpy(dtype="datetime64[ns]").astype(np.int64)
    return ns / 1e9, True


_YEAR_S = 365.25 * 86400.0
MAX_WINDOW_S = 100 * _YEAR_S
"""The longest observation window ``--end`` may make: past it, the censored tail would decide
every fit (and the fitted means overflow a float)."""


def _end_s(end: str | None, unit_s: float, dates: bool) -> float | None:
    if end is None:
        return None
    import pandas as pd

    try:
        value = float(end)
    except ValueError:
        pass
    else:
        if not math.isfinite(value):
            raise InputError(f"--end {end!r}: the end of the log must be a finite time")
        return value * unit_s
    if not dates:
        raise InputError(f"--end {end!r}: the log's times are numbers, so give a number in --unit")
    try:
        ts = pd.Timestamp(end)
    except (ValueError, TypeError):
        raise InputError(f"--end {end!r} is neither a number nor a date pandas can parse") from None
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts.value / 1e9


def read_failure_log(
    path: str | Path,
    *,
    unit: str = "h",
    duration_column: str | None = None,
    event_column: str | None = None,
    time_column: str | None = None,
    component_column: str | None = None,
    cause_column: str | None = None,
    repair_column: str | None = None,
    end: str | None = None,
) -> FailureLog:
    """Read a failure log in either shape (see the module docstring) into censored lifetimes."""
    if unit not in UNITS:
        raise InputError(f"unknown unit {unit!r}; use one of {', '.join(UNITS)}")
    unit_s = UNITS[unit]
    df = read_table(path)
    if len(df) == 0:
        raise InputError(f"{path}: the failure log has a header but no rows")
    lifetimes = duration_column is not None or (
        time_column is None and pick_column(df, "duration", None) is not None
    )
    cause_col = pick_column(df, "cause", cause_column)
    repair_col = pick_column(df, "repair", repair_column)
    if lifetimes:
        return _read_lifetimes(df, unit_s, duration_column, event_column, cause_col, repair_col)
    return _read_timestamps(df, unit_s, time_column, component_column, cause_col, repair_col, end)


def _repairs(df, column, unit_s, cause_col, failed=None):
    """Repair times of the failures that log one (seconds), and their causes."""
    if column is None:
        return None, None
    import pandas as pd

    values = pd.to_numeric(df[column], errors="coerce").to_numpy(dtype=float) * unit_s
    given = df[column].notna().to_numpy()
    bad = given & ~np.isfinite(values) | (values < 0)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: {df[column].iloc[i]!r} is not a non-negative "
            "repair/down time"
        )
    take = given if failed is None else given & failed
    causes = None if cause_col is None else df[cause_col].astype(str).to_numpy()[take]
    return values[take], causes


def _read_lifetimes(df, unit_s, duration_column, event_column, cause_col, repair_col):
    dcol = pick_column(df, "duration", duration_column, required=True)
    durations = _numbers(df[dcol], dcol, unit_s, "time")
    if np.any(durations < 0):
        i = int(np.flatnonzero(durations < 0)[0])
        raise InputError(f"column {dcol!r} row {i + 1}: negative duration {df[dcol].iloc[i]!r}")
    ecol = pick_column(df, "event", event_column)
    observed = np.ones(len(df), bool) if ecol is None else _event_flags(df[ecol], ecol)
    causes = None
    if cause_col is not None:
        causes = np.where(observed, df[cause_col].astype(str).to_numpy(), None)
    repair_s, repair_causes = _repairs(df, repair_col, unit_s, cause_col, observed)
    return FailureLog(
        durations_s=durations,
        observed=observed,
        causes=causes,
        repair_s=repair_s,
        repair_causes=repair_causes,
        shape="lifetimes",
        columns={"duration": dcol, "event": ecol, "cause": cause_col, "repair": repair_col},
    )


def _read_timestamps(df, unit_s, time_column, component_column, cause_col, repair_col, end):
    tcol = pick_column(df, "time", time_column, required=True)
    times, dates = parse_times(df[tcol], tcol, unit_s)
    ccol = pick_column(df, "component", component_column)
    if ccol in (tcol, cause_col, repair_col):
        ccol = None
    if component_column is None and ccol is not None and df[ccol].nunique() == len(df):
        # Every row its own component: a row id, not a component column.
        ccol = None
    end_s = _end_s(end, unit_s, dates)
    last = float(times.max())
    if end_s is None:
        end_s = last
    elif end_s < last:
        raise InputError(f"--end {end} is before the last failure in the log")
    elif end_s - float(times.min()) > MAX_WINDOW_S:
        raise InputError(
            f"--end {end} is {(end_s - float(times.min())) / _YEAR_S:.3g} years after the log's "
            f"first failure; an observation window is at most {MAX_WINDOW_S / _YEAR_S:g} years "
            "(is --unit right?)"
        )
    causes_all = None if cause_col is None else df[cause_col].astype(str).to_numpy()
    repair_s, repair_causes = _repairs(df, repair_col, unit_s, cause_col)
    groups = [np.arange(len(df))] if ccol is None else list(df.groupby(ccol).indices.values())
    durs, obs, causes = [], [], []
    for idx in groups:
        idx = np.asarray(idx)[np.argsort(times[idx], kind="stable")]
        t = times[idx]
        gaps = np.diff(t)
        durs.append(gaps)
        obs.append(np.ones(gaps.size, bool))
        causes.append(causes_all[idx[1:]] if causes_all is not None else [None] * gaps.size)
        if end_s > t[-1]:
            durs.append([end_s - t[-1]])
            obs.append([False])
            causes.append([None])
    durations = np.concatenate([np.asarray(d, float) for d in durs])
    observed = np.concatenate([np.asarray(o, bool) for o in obs])
    # Two failures logged at the same instant are one event seen twice, not a zero lifetime.
    keep = durations > 0
    order = np.sort(times) - times.min()
    return FailureLog(
        durations_s=durations[keep],
        observed=observed[keep],
        causes=None
        if cause_col is None
        else np.concatenate([np.asarray(c, object) for c in causes])[keep],
        repair_s=repair_s,
        repair_causes=repair_causes,
        failure_times_s=order,
        shape="timestamps",
        components=None if ccol is None else int(df[ccol].nunique()),
        columns={"time": tcol, "component": ccol, "cause": cause_col, "repair": repair_col},
    )
