"""Failure logs: a user's CSV or Parquet file turned into right-censored lifetimes or a trace.

A log comes in one of two shapes. *Lifetimes*: one row per unit, a duration and whether it
ended in a failure (event = 1) or observation stopped first (censored, event = 0).
*Event timestamps*: one row per failure, its time (numbers in ``unit``, or dates), optionally
the component that failed, the cause and the repair (down) time. From timestamps with a
component column, a component's lifetimes are the gaps between its consecutive failures and
its last gap is censored at the end of the log (``end``, by default the last failure logged);
without one, the gaps are those of the whole system. The time before a component's first
logged failure is not a lifetime: its age when the log starts is unknown.

A cause column makes competing risks: for cause ``c`` a gap ended by ``c`` is an event and a
gap ended by any other cause (or by the end of the log) is censored, the cause-specific
hazard. A repair/down-time column gives each failure's time to repair (all observed), in
``repair_unit`` (default: ``unit``).

This module is the one reader of failure logs: ``ckptsim fit`` (:func:`read_failure_log`),
``ckptsim simulate --trace`` (:func:`read_failure_times`) and ``--failure empirical:FILE`` all
go through :func:`_events`, so one log means one thing to all three. Its rules:

- Columns are found by *role* (time, duration, event, component, cause, repair, system): a
  column whose whole name is a known name for the role, else one that has a role's word in it
  as a whole word (``Down Time`` is a repair column, never a failure time; ``machine type`` is
  no cause). Two columns equally fit for one role, or a named column that is not in the log,
  is a one-line refusal naming the flag; ``none`` (or an empty name) turns a role off.
- A blank time, duration or event flag is refused (its row named); a blank cause is no cause
  (counted in a note, no class of its own); a blank component is refused (such a failure can
  be put on no component's clock); a blank repair time is a failure without one.
- Numeric times are seconds, minutes, hours or days since the start of observation (0): a
  negative one is refused. Dates (text, or a datetime column in Parquet) are taken relative to
  the first; naive dates are UTC.
- Rows with the same time (and the same component, where there is a component column) are
  one failure logged twice: merged, and counted in a note. A lifetime of length 0 has no
  density under any continuous model: left out, and counted in a note.
- Any time or duration past ``MAX_SPAN_S`` (100 years) is refused: past it the censored tail
  would decide every fit and the fitted means overflow a float.

Every problem with the file is an ``InputError`` naming the column, the row and the value;
every row the rules merge or leave out is said in ``notes``.
"""

from __future__ import annotations

import dataclasses
import math
import re
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from simulator.errors import InputError

__all__ = [
    "MAX_SPAN_S",
    "UNITS",
    "FailureLog",
    "FailureTimes",
    "censoring_column",
    "parse_times",
    "read_failure_log",
    "read_failure_times",
    "read_table",
    "show_value",
]

UNITS = {"s": 1.0, "min": 60.0, "h": 3600.0, "d": 86400.0}

_YEAR_S = 365.25 * 86400.0
MAX_SPAN_S = 100 * _YEAR_S
"""The longest time span a log may cover (and ``--end`` may make), and the longest duration."""

# -- column roles -------------------------------------------------------------------------------
# Each role: names that are the role outright (the whole name, lower case, words joined by _)
# and words that make a column the role when they appear as a whole word of its name.
_EXACT = {
    "duration": {
        "duration", "durations", "lifetime", "lifetimes", "life", "ttf", "tbf", "mtbf",
        "time_to_failure", "time_between_failures", "service_time", "uptime", "up_time",
        "age", "duration_h", "duration_s", "duration_min", "duration_d",
    },
    "event": {
        "event", "events", "failed", "failure", "fail", "observed", "status", "censored",
        "uncensored", "not_censored", "is_censored", "is_failure", "is_failed", "died", "dead",
        "event_observed",
    },
    "time": {
        "time", "times", "timestamp", "timestamps", "failure_time", "failed_at", "datetime",
        "date", "when", "prob_started", "start", "started", "start_time", "event_time",
        "occurred", "occurred_at", "t", "t_h", "t_s", "time_h", "time_s", "time_min", "time_d",
    },
    "component": {
        "component", "node", "nodenum", "node_id", "nodeid", "nodename", "node_name", "host",
        "hostname", "unit", "unit_id", "serial", "serial_number", "sn", "gpu", "gpu_id",
        "device", "device_id", "slot", "location", "server",
    },
    "cause": {
        "cause", "causes", "category", "reason", "type", "root_cause", "failure_type",
        "failure_cause", "failure_class", "class", "kind",
    },
    "repair": {
        "repair", "repair_time", "repair_h", "repair_min", "repair_s", "downtime", "down_time",
        "down", "ttr", "time_to_repair", "outage", "outage_time",
    },
    "system": {"system", "system_id", "cluster", "cluster_id", "machine", "machine_id"},
}  # fmt: skip
_WORDS = {
    "repair": {"repair", "repairs", "downtime", "down", "ttr", "outage"},
    "duration": {"duration", "lifetime", "ttf", "tbf", "uptime"},
    "event": {"event", "failed", "censored", "uncensored", "observed"},
    "cause": {"cause", "category", "reason"},
    "component": {"node", "host", "hostname", "component", "serial", "gpu", "device"},
    "time": {"time", "timestamp", "datetime", "date", "started", "when"},
    "system": {"system"},
}
_PRECEDENCE = ("repair", "duration", "event", "cause", "component", "time", "system")
"""A name whose words fit several roles gets the first of them: ``repair_time`` repairs."""
_NEUTRAL = {
    "install", "installed", "installation", "prod", "production", "decom", "decommission",
    "decommissioned", "fixed", "end", "ended", "stop", "stopped", "count", "total", "num",
    "number", "same", "type", "first", "last", "next", "prev", "previous",
}  # fmt: skip
"""Words that make a name none of the roles by its words (``node install`` is a date of a
node, not a node; ``Prob Fixed`` the end of a repair, not a failure)."""
_FLAG = {
    "time": "--time-column",
    "duration": "--duration-column",
    "event": "--event-column",
    "component": "--component-column",
    "cause": "--cause-column",
    "repair": "--repair-column",
    "system": "--system-column",
}
_WHAT = {
    "time": "the failure time",
    "duration": "the lifetime (duration)",
    "event": "the failed/censored flag",
    "component": "the component",
    "cause": "the cause",
    "repair": "the repair/down time",
    "system": "the system",
}
_OFF = ("", "none")


def _words(name) -> list[str]:
    text = re.sub(r"([a-z0-9])([A-Z])", r"\1 \2", str(name))
    return re.findall(r"[a-z0-9]+", text.lower())


def _key(name) -> str:
    return "_".join(_words(name))


def _word_role(name) -> str | None:
    """The role a column's words give it (None: none, or a neutral word among them)."""
    words = set(_words(name))
    if words & _NEUTRAL:
        return None
    for role in _PRECEDENCE:
        if words & _WORDS[role]:
            return role
    return None


def show_value(value, limit: int = 40) -> str:
    """A log's cell for an error line: plain numbers, quoted text cut to ``limit`` characters,
    and ``a blank`` for an empty cell (never a numpy repr)."""
    import pandas as pd

    if value is None or (not isinstance(value, str) and pd.isna(value)):
        return "a blank"
    if isinstance(value, np.generic):
        value = value.item()
    if isinstance(value, bool):
        return str(value)
    if isinstance(value, int | float):
        text = repr(value)
        return text if len(text) <= limit else text[:limit] + "..."
    text = str(value)
    if not text.strip():
        return "a blank"
    if len(text) > limit:
        return repr(text[:limit]) + f"... ({len(text):,} characters)"
    return repr(text)


def _columns_text(cols) -> str:
    shown = [show_value(str(c), 30).strip("'\"") for c in list(cols)[:30]]
    more = f", ... ({len(cols)} in all)" if len(cols) > 30 else ""
    return ", ".join(shown) + more


class _Columns:
    """Which column plays each role: given by flag (a name, or none), else detected."""

    def __init__(self, df, given: dict[str, str | None]):
        self.df = df
        self.cols = list(df.columns)
        self.chosen: dict[str, object] = {}
        self.off: set[str] = set()
        self.explicit: set[str] = set()
        for role, name in given.items():
            if name is None:
                continue
            if str(name).strip().lower() in _OFF:
                self.off.add(role)
                self.chosen[role] = None
                continue
            if name not in self.cols:
                raise InputError(
                    f"{_FLAG[role]}: no column {show_value(name)} in the log (columns: "
                    f"{_columns_text(self.cols)})"
                )
            for other, col in self.chosen.items():
                if col == name:
                    raise InputError(
                        f"{_FLAG[role]} and {_FLAG[other]} both name column {name!r}; a column "
                        f"holds one thing ({_WHAT[other]}, or {_WHAT[role]})"
                    )
            self.chosen[role] = name
            self.explicit.add(role)

    def given(self, role: str) -> bool:
        """Whether a flag named the role's column (or said there is none)."""
        return role in self.explicit or role in self.off

    def find(self, role: str):
        """The column of ``role`` (None: none), detecting it if no flag named it."""
        if role in self.chosen:
            return self.chosen[role]
        taken = {c for c in self.chosen.values() if c is not None}
        free = [c for c in self.cols if c not in taken]
        exact = [c for c in free if _key(c) in _EXACT[role]]
        if not exact:
            for other in self.explicit:
                col = self.chosen[other]
                if _key(col) in _EXACT[role] and role in ("time", "duration"):
                    raise InputError(
                        f"{_FLAG[other]} names column {str(col)!r}, {_WHAT[role]} by its "
                        f"name; name another column, or give {_FLAG[role]} too"
                    )
        found = exact or [c for c in free if _word_role(c) == role and _key(c) not in _ANY_EXACT]
        if len(found) > 1:
            names = " and ".join(repr(str(c)) for c in found[:3])
            off = "" if role in ("time", "duration") else " (or none)"
            raise InputError(
                f"columns {names} could each be {_WHAT[role]}: name one with {_FLAG[role]} C{off}"
            )
        col = found[0] if found else None
        self.chosen[role] = col
        return col

    def used(self) -> dict:
        return {k: v for k, v in self.chosen.items() if v is not None}


_ANY_EXACT = set().union(*_EXACT.values())


# -- reading the table ---------------------------------------------------------------------------
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
        if _headerless(df.columns):
            # The first row is data, not names: read it as the first failure.
            df = pd.read_csv(path, header=None, skipinitialspace=True)
            df.columns = ["time"] if df.shape[1] == 1 else [f"column{i + 1}" for i in df.columns]
            df.attrs["headerless"] = True
        return df
    except ImportError:
        raise InputError(
            f"{path}: reading Parquet needs pyarrow (pip install 'ckptsim[parquet]'), or give a CSV"
        ) from None
    except pd.errors.EmptyDataError:
        raise InputError(f"{path}: the failure log is empty (no header, no rows)") from None
    except (ValueError, OSError, pd.errors.ParserError) as exc:
        first = str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__
        raise InputError(f"{path}: not a readable CSV or Parquet table ({first})") from None


def _headerless(columns) -> bool:
    """Whether every name in a CSV's first row reads as a number or a date (so it is data)."""
    import pandas as pd

    names = [str(c).strip() for c in columns]
    if not names:
        return False
    for name in names:
        name = re.sub(r"\.\d+$", "", name) if name.count(".") > 1 else name  # pandas' x.1, x.2
        try:
            float(name)
            continue
        except ValueError:
            pass
        if not re.match(r"^\d{1,4}[-/.]\d{1,2}[-/.]\d{1,4}", name):
            return False
        try:
            pd.Timestamp(name)
        except (ValueError, TypeError):
            return False
    return True


def _blank(series) -> np.ndarray:
    """Empty cells: NaN/None, or text of only spaces."""
    import pandas as pd

    missing = series.isna().to_numpy()
    if pd.api.types.is_numeric_dtype(series.dtype) or pd.api.types.is_datetime64_any_dtype(
        series.dtype
    ):
        return missing
    text = series.astype(str).str.strip()
    return missing | (text == "").to_numpy()


def _number_seconds(series, column, unit_s: float, noun: str, *, allow_blank=False):
    """Numbers of ``unit`` as seconds (blank cells NaN when ``allow_blank``); one-line errors
    for text, blanks, negatives and values past ``MAX_SPAN_S``. ``noun``: what a cell is."""
    import pandas as pd

    column = str(column)
    values = pd.to_numeric(series, errors="coerce").to_numpy(dtype=float)
    blank = _blank(series)
    bad = ~np.isfinite(values) & ~(blank if allow_blank else np.zeros(len(values), bool))
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: {show_value(series.iloc[i])} is not a number "
            f"(a {noun} in --unit)"
        )
    with np.errstate(over="ignore", invalid="ignore"):
        seconds = values * unit_s
        neg = seconds < 0
        big = ~(np.abs(seconds) <= MAX_SPAN_S) & np.isfinite(values)
    if neg.any():
        i = int(np.flatnonzero(neg)[0])
        why = " (numbers count from the start of the log, 0, in --unit)" if noun == "time" else ""
        raise InputError(
            f"column {column!r} row {i + 1}: {show_value(series.iloc[i])} is a negative {noun}; "
            f"a {noun} is not negative{why}"
        )
    if big.any():
        i = int(np.flatnonzero(big)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: {show_value(series.iloc[i])} is more than 100 "
            "years; a failure log covers less (is --unit right?)"
        )
    return seconds


def parse_times(
    series, column: str, unit_s: float, notes: list[str] | None = None
) -> tuple[np.ndarray, bool]:
    """Seconds (numbers in the unit, or dates as seconds since 1970) and whether they were dates.

    A datetime column (Parquet's timestamps, tz-aware or not) is dates, never numbers; text is
    numbers if every cell is one, else dates in one format for the whole column
    (:func:`_parse_dates`; mixed offsets are one clock: UTC; naive is UTC, with a note in
    ``notes`` where a column mixes the two). A blank cell is refused with its row; numeric
    times must not be negative.
    """
    import pandas as pd

    column = str(column)
    blank = _blank(series)
    if blank.any():
        i = int(np.flatnonzero(blank)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: the failure time is blank ({int(blank.sum())} "
            "blank in all); give every failure its time, or leave its row out"
        )
    if pd.api.types.is_datetime64_any_dtype(series.dtype):
        parsed = series
        if getattr(parsed.dt, "tz", None) is not None:
            parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    elif pd.api.types.is_timedelta64_dtype(series.dtype):  # durations since the start
        seconds = pd.Series(series.dt.total_seconds().to_numpy(dtype=float))
        return _number_seconds(seconds, column, 1.0, "time"), False
    else:
        numeric = pd.to_numeric(series, errors="coerce")
        if numeric.notna().all():
            return _number_seconds(series, column, unit_s, "time"), False
        if numeric.notna().mean() > 0.5:  # mostly numbers: the others are the odd ones out
            i = int(np.flatnonzero(numeric.isna().to_numpy())[0])
            raise InputError(
                f"column {column!r} row {i + 1}: {show_value(series.iloc[i])} is not a number, "
                "though most of the column's times are (numbers in --unit, or all dates)"
            )
        parsed = _parse_dates(series, column, notes)
        parsed = parsed.dt.tz_convert("UTC").dt.tz_localize(None)
    micros = np.asarray(parsed.to_numpy(dtype="datetime64[us]")).astype(np.int64)
    return micros / 1e6, True


_ZONED = r"(?:Z|[+-]\d{2}:?\d{2})\s*$"
"""A time written with its UTC offset (``...Z``, ``...+05:00``)."""


def _parse_dates(series, column: str, notes: list[str] | None):
    """The column's text as UTC datetimes, every row read in one format.

    ISO 8601 first (offsets may differ row to row: a DST change, two sites). Otherwise the
    formats the first cell fits, month first and day first (``01/02/2024``): a format is used
    only if it reads every row, and where two read every row differently (every day of the
    month at most 12) the column is refused as ambiguous; a row by row reading, which took
    ``01/02/2024`` month first and ``13/03/2024`` day first in one column, is the last resort
    only where it, too, reads every row the same either way."""
    import pandas as pd
    from pandas.tseries.api import guess_datetime_format

    def read(**how):
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # pandas' "could not infer format" and the like
            return pd.to_datetime(series, errors="coerce", utc=True, **how)

    text = series.astype(str).str.strip()
    zoned = text.str.contains(_ZONED, regex=True)
    if zoned.any() and not zoned.all() and notes is not None:
        notes.append(
            f"column {column!r}: {int(zoned.sum())} of {len(text)} times carry a UTC offset and "
            "the others none; those without were read as UTC"
        )
    parsed = read(format="ISO8601")
    if not parsed.isna().any():
        return parsed
    first = text.iloc[0]
    tries = []
    for dayfirst in (False, True):
        fmt = guess_datetime_format(first, dayfirst=dayfirst)
        if fmt is not None and fmt not in [f for f, _ in tries]:
            tries.append((fmt, read(format=fmt)))
    full = [(fmt, p) for fmt, p in tries if not p.isna().any()]
    if not full:  # the first cell's format does not fit every row: read row by row
        full = [
            (f"row by row, {order} first", p)
            for order, p in (
                ("month", read(format="mixed")),
                ("day", read(format="mixed", dayfirst=True)),
            )
            if not p.isna().any()
        ]
    if not full:
        fmt, p = tries[0] if tries else ("row by row", read(format="mixed"))
        i = int(np.flatnonzero(p.isna().to_numpy())[0])
        raise InputError(
            f"column {column!r} row {i + 1}: cannot parse {show_value(series.iloc[i])} as a "
            f"time in the format of row 1 ({show_value(series.iloc[0])}); give numbers in "
            "--unit, or dates in one format, such as ISO 8601 (2024-05-01 13:20)"
        )
    if len(full) > 1 and not full[0][1].equals(full[1][1]):
        raise InputError(
            f"column {column!r}: dates such as {show_value(series.iloc[0])} read day first or "
            "month first, and every date in the column fits both; write them in ISO 8601 "
            "(2024-05-01 13:20), which has one reading"
        )
    if notes is not None:
        notes.append(f"column {column!r}: dates read as {full[0][0]}, the reading every row fits")
    return full[0][1]


def _end_s(end: str | None, unit_s: float, dates: bool) -> float | None:
    if end is None:
        return None
    import pandas as pd

    text = str(end).strip()
    try:
        value = float(text)
    except ValueError:
        value = None
    if value is not None:
        if not math.isfinite(value):
            raise InputError(f"--end {end!r}: the end of the log must be a finite time")
        if dates:
            raise InputError(
                f"--end {text[:40]} is a number, but the log's times are dates: give the end as "
                "a date (e.g. 2024-12-31 or 2024-12-31T18:00)"
            )
        with np.errstate(over="ignore"):
            return value * unit_s
    if not dates:
        raise InputError(
            f"--end {show_value(text)}: the log's times are numbers, so give a number in --unit"
        )
    try:
        ts = pd.Timestamp(text)
    except (ValueError, TypeError, OverflowError):
        raise InputError(
            f"--end {show_value(text)} is neither a number nor a date pandas can parse"
        ) from None
    if ts.tzinfo is not None:
        ts = ts.tz_convert("UTC").tz_localize(None)
    return ts.value / 1e9


# -- the one reading of a log's rows ------------------------------------------------------------
@dataclass
class _Events:
    """A timestamp log's failures, in file order, after the rules of the module docstring."""

    times_s: np.ndarray
    dates: bool
    components: np.ndarray | None
    causes: np.ndarray | None  # object: text, None where blank
    repair_s: np.ndarray | None  # NaN where blank
    columns: dict
    rows: np.ndarray  # each failure's row in the file (0-based)
    notes: list[str] = field(default_factory=list)


def _count(n: int, one: str, many: str | None = None) -> str:
    return f"{n:,} {one if n == 1 else (many or one + 's')}"


def _rows_text(rows) -> str:
    rows = [int(r) + 1 for r in rows]
    shown = ", ".join(map(str, rows[:3]))
    return f"row {shown}" if len(rows) == 1 else f"rows {shown}{', ...' if len(rows) > 3 else ''}"


def _causes(df, col, notes: list[str], failed=None):
    """The cause of each row as text (None where blank); a note counts the blank ones."""
    if col is None:
        return None
    series = df[col]
    blank = _blank(series)
    text = series.astype(str).str.strip().to_numpy(dtype=object)
    text[blank] = None
    hit = blank if failed is None else blank & failed
    if hit.any():
        notes.append(
            f"{_count(int(hit.sum()), 'failure')} with a blank cause in column {str(col)!r} "
            f"({_rows_text(np.flatnonzero(hit))}) count in the overall fit but in no cause's"
        )
    return text


def _repairs(df, col, repair_unit_s):
    if col is None:
        return None
    return _number_seconds(df[col], col, repair_unit_s, "repair time", allow_blank=True)


def _logged_repairs(repair, causes, take, column, notes: list[str]):
    """The repair times of the failures in ``take`` that log one, and their causes; a repair
    of 0 (no time to fit) is left out and counted in a note."""
    if repair is None:
        return None, None
    has = take & np.isfinite(repair)
    zero = has & (repair <= 0)
    if zero.any():
        notes.append(
            f"{_count(int(zero.sum()), 'repair time')} of 0 in column {str(column)!r} "
            f"({_rows_text(np.flatnonzero(zero))}) left out of the repair fit"
        )
    has &= ~zero
    return repair[has], None if causes is None else causes[has]


def _check_system(df, cols: _Columns, component, path) -> None:
    """A log of several systems: components are told apart by system, and without a component
    column (one system's gaps, or a replay) it is refused."""
    system = cols.find("system")
    if system is None:
        return
    n = int(df[system].nunique(dropna=True))
    if n <= 1:
        return
    if component is None:
        raise InputError(
            f"{path}: column {str(system)!r} holds {n} different systems, and a log without a "
            "component column is one system's failures: fit one system's rows at a time, name "
            "--component-column, or --system-column none to pool them anyway"
        )


def _events(
    path, df, cols: _Columns, unit_s: float, repair_unit_s: float, *, components: bool
) -> _Events:
    notes: list[str] = _headerless_note(path, df)
    tcol = cols.find("time")
    if tcol is None:
        raise _no_shape(df)
    times, dates = parse_times(df[tcol], tcol, unit_s, notes)
    ccol = cols.find("component") if components else None
    if ccol is not None and not cols.given("component") and df[ccol].nunique() == len(df) > 1:
        notes.append(
            f"column {str(ccol)!r} has a different value on every row (a row id, not a "
            f"component), so the gaps are the whole system's; name --component-column "
            f"{ccol!s} to use it anyway"
        )
        ccol = None
        cols.chosen["component"] = None
    _check_system(df, cols, ccol if components else None, path)
    comp = None
    if ccol is not None:
        blank = _blank(df[ccol])
        if blank.all():
            raise InputError(
                f"column {str(ccol)!r} (the component) is blank on every row; name "
                "--component-column none to fit the system's gaps"
            )
        if blank.any():
            raise InputError(
                f"column {str(ccol)!r} {_rows_text(np.flatnonzero(blank))}: "
                f"{_count(int(blank.sum()), 'failure')} with a blank component "
                f"({int(blank.sum()):,} of {len(df):,}); fill them in, leave those rows out, or "
                "name --component-column none to fit the system's gaps"
            )
        comp = df[ccol].astype(str).str.strip().to_numpy(dtype=object)
        system = cols.chosen.get("system")
        if system is not None and df[system].nunique(dropna=True) > 1:
            comp = (df[system].astype(str).str.strip() + "/" + comp).to_numpy(dtype=object)
            notes.append(
                f"components are told apart by column {str(system)!r} and "
                f"{str(ccol)!r} ({df[system].nunique()} systems)"
            )
    causes = _causes(df, cols.find("cause"), notes)
    repair = _repairs(df, cols.find("repair"), repair_unit_s)
    rows = np.arange(len(times))
    # Rows at the same time (on the same component) are one failure logged twice.
    key = times if comp is None else list(zip(comp.tolist(), times.tolist(), strict=True))
    if comp is None:
        _, first = np.unique(times, return_index=True)
    else:
        import pandas as pd

        first = np.flatnonzero(~pd.Series(key).duplicated().to_numpy())
    if first.size < len(times):
        keep = np.sort(first)
        dup = np.setdiff1d(np.arange(len(times)), keep)
        where = " on the same component" if comp is not None else ""
        notes.append(
            f"{_count(dup.size, 'row')} ({_rows_text(dup)}) repeat a failure at the same time"
            f"{where}: counted once"
        )
        times = times[keep]
        rows = rows[keep]
        comp = None if comp is None else comp[keep]
        causes = None if causes is None else causes[keep]
        repair = None if repair is None else repair[keep]
    if times.size and float(times.max() - times.min()) > MAX_SPAN_S:
        raise InputError(
            f"column {str(tcol)!r}: the failures span "
            f"{(times.max() - times.min()) / _YEAR_S:,.3g} years; a failure log covers at most "
            "100 (is --unit right?)"
        )
    return _Events(times, dates, comp, causes, repair, cols.used(), rows, notes)


def _headerless_note(path, df) -> list[str]:
    if not df.attrs.get("headerless"):
        return []
    return [f"{path}: its first row holds no column names (it reads as data), so it is data too"]


def _no_shape(df) -> InputError:
    return InputError(
        f"cannot tell the log's shape from its columns ({_columns_text(df.columns)}): name "
        "--time-column C (one row per failure, with its time) or --duration-column C with "
        "--event-column C (one row per unit: its lifetime, and whether it failed)"
    )


# -- lifetimes (for fit and empirical:) ----------------------------------------------------------
@dataclass(frozen=True, kw_only=True)
class FailureLog:
    """Right-censored lifetimes read from a log (seconds), with their causes and repairs."""

    durations_s: np.ndarray
    observed: np.ndarray
    """True where the lifetime ended in a failure, False where it is censored."""
    causes: np.ndarray | None = None
    """Cause of the failure that ended each lifetime (None for censored ones and blanks)."""
    repair_s: np.ndarray | None = None
    """Repair/down time of each logged failure that has one, seconds (None: no such column)."""
    repair_causes: np.ndarray | None = None
    """Cause of each failure in ``repair_s`` (None without a cause column)."""
    failure_times_s: np.ndarray | None = None
    """Failure timestamps relative to the first, sorted (timestamp logs only)."""
    shape: str = "lifetimes"
    """``lifetimes`` or ``timestamps``."""
    components: int | None = None
    """Distinct components in a timestamp log with a component column."""
    columns: dict | None = None
    """The columns used, by role (for the report)."""
    notes: tuple[str, ...] = ()
    """What the reading rules merged, left out or assumed, one line each."""
    span_s: float | None = None
    """The observation window: the first failure to the end (timestamps), else the longest
    lifetime."""

    @property
    def events(self) -> int:
        return int(self.observed.sum())

    @property
    def censored(self) -> int:
        return int((~self.observed).sum())

    @property
    def system_gaps(self) -> bool:
        """Whether the lifetimes are the whole system's times between failures (a timestamp
        log without a component column), so a fit of them is the job's own MTBF, not one
        unit's."""
        return self.shape == "timestamps" and self.components is None


_UNIT_WORDS = {
    "s": "s", "sec": "s", "secs": "s", "second": "s", "seconds": "s",
    "min": "min", "mins": "min", "minute": "min", "minutes": "min",
    "h": "h", "hr": "h", "hrs": "h", "hour": "h", "hours": "h",
    "d": "d", "day": "d", "days": "d",
}  # fmt: skip


def _unit_notes(df, columns: dict, unit: str, repair_unit: str) -> list[str]:
    """A note for each numeric column whose name ends in another unit than it is read in."""
    notes = []
    for role, flag, used in (
        ("time", "--unit", unit), ("duration", "--unit", unit),
        ("repair", "--repair-unit", repair_unit),
    ):  # fmt: skip
        col = columns.get(role)
        if col is None or not _numeric(df[col]):
            continue
        words = _words(col)
        named = _UNIT_WORDS.get(words[-1]) if len(words) > 1 else None
        if named is not None and named != used:
            notes.append(
                f"column {str(col)!r} is read in {used}, but its name says {named}: "
                f"give {flag} {named} if it is"
            )
    return notes


def _numeric(series) -> bool:
    import pandas as pd

    return bool(pd.api.types.is_numeric_dtype(series.dtype)) and not bool(
        pd.api.types.is_bool_dtype(series.dtype)
    )


def _unit_seconds(unit: str, flag: str = "unit") -> float:
    if unit not in UNITS:
        raise InputError(f"{flag} must be one of {', '.join(UNITS)}, got {unit!r}")
    return UNITS[unit]


def read_failure_log(
    path: str | Path,
    *,
    unit: str = "h",
    repair_unit: str | None = None,
    duration_column: str | None = None,
    event_column: str | None = None,
    time_column: str | None = None,
    component_column: str | None = None,
    cause_column: str | None = None,
    repair_column: str | None = None,
    system_column: str | None = None,
    end: str | None = None,
) -> FailureLog:
    """Read a failure log in either shape (see the module docstring) into censored lifetimes.

    A column argument names the column, ``"none"`` (or ``""``) says there is none, and None
    leaves it to detection by name.
    """
    unit_s = _unit_seconds(unit)
    repair_unit_s = _unit_seconds(repair_unit or unit, "repair unit")
    df = read_table(path)
    if len(df) == 0:
        raise InputError(f"{path}: the failure log has a header but no rows")
    given = {
        "duration": duration_column,
        "event": event_column,
        "time": time_column,
        "component": component_column,
        "cause": cause_column,
        "repair": repair_column,
        "system": system_column,
    }
    cols = _Columns(df, given)
    if cols.explicit >= {"duration", "time"}:
        raise InputError(
            "--duration-column and --time-column are two shapes of log (a lifetime per unit, "
            "or a time per failure); give one"
        )
    if "duration" in cols.explicit:
        lifetimes = True
    elif "time" in cols.explicit:
        lifetimes = False
    else:
        dcol, tcol = cols.find("duration"), cols.find("time")
        if dcol is not None and tcol is not None:
            raise InputError(
                f"the log has a duration column ({str(dcol)!r}) and a time column "
                f"({str(tcol)!r}): name --duration-column (one lifetime per unit) or "
                "--time-column (one failure per row)"
            )
        if dcol is None and tcol is None:
            if df.shape[1] == 1:  # a log of one column can only be the failure times
                cols.chosen["time"] = df.columns[0]
            else:
                raise _no_shape(df)
        lifetimes = dcol is not None
    if lifetimes:
        for role in ("time", "component", "system"):
            if role in cols.explicit:
                raise InputError(
                    f"{_FLAG[role]} is for a log of failure times; this log is read as "
                    "lifetimes (one per unit)"
                )
        if end is not None:
            raise InputError(
                "--end closes a log of failure times; in a lifetimes log each unit's duration "
                "already ends its observation"
            )
        log = _read_lifetimes(path, df, cols, unit_s, repair_unit_s)
    else:
        if "event" in cols.explicit:
            raise InputError(
                "--event-column is for a lifetimes log (one row per unit); in a log of failure "
                "times every row is a failure"
            )
        log = _read_timestamps(path, df, cols, unit_s, repair_unit_s, end)
    hints = _unit_notes(df, log.columns or {}, unit, repair_unit or unit)
    return dataclasses.replace(log, notes=(*log.notes, *hints)) if hints else log


_TRUE = {"1", "true", "yes", "y", "t"}
_FALSE = {"0", "false", "no", "n", "f"}
_SAYS_FAILED = {"failed", "failure", "fail", "event", "died", "dead"}
_SAYS_CENSORED = {"censored", "alive", "survived", "running", "ok"}


def censoring_column(name) -> bool:
    """Whether a column's name says its true values mean *censored* (``censored``,
    ``is_censored``), not failed; ``uncensored``, ``not_censored`` and ``non-censored`` say
    the opposite, as an event column does."""
    words = _words(name)
    for i, w in enumerate(words):
        if w in ("uncensored", "noncensored"):
            return False
        if w.startswith("censor"):
            return not (i and words[i - 1] in ("not", "non", "un", "no"))
    return False


def _event_flags(series, column) -> np.ndarray:
    column = str(column)
    text = series.astype(str).str.strip().str.lower().str.replace(r"\.0$", "", regex=True)
    blank = _blank(series)
    if blank.any():
        i = int(np.flatnonzero(blank)[0])
        raise InputError(
            f"column {column!r} row {i + 1}: the failed/censored flag is blank; give 1 (failed) "
            "or 0 (censored)"
        )
    flip = censoring_column(column)
    out = np.empty(len(text), bool)
    for i, value in enumerate(text.tolist()):
        if value in _SAYS_FAILED:  # words say what they mean, whatever the column's name
            out[i] = True
        elif value in _SAYS_CENSORED:
            out[i] = False
        elif value in _TRUE or value in _FALSE:
            out[i] = (value in _TRUE) != flip
        else:
            raise InputError(
                f"column {column!r} row {i + 1}: {show_value(series.iloc[i])} is not an event "
                "flag (1/true/failed for a failure, 0/false/censored for censored)"
            )
    return out


def _zero_note(zero: np.ndarray, rows) -> str:
    return (
        f"{_count(int(zero.sum()), 'lifetime of length 0', 'lifetimes of length 0')} "
        f"({_rows_text(rows)}) left out: no "
        "continuous lifetime model gives them a density"
    )


def _read_lifetimes(path, df, cols: _Columns, unit_s, repair_unit_s) -> FailureLog:
    notes: list[str] = _headerless_note(path, df)
    dcol = cols.find("duration")
    durations = _number_seconds(df[dcol], dcol, unit_s, "duration")
    ecol = cols.find("event")
    observed = np.ones(len(df), bool) if ecol is None else _event_flags(df[ecol], ecol)
    if ecol is None:
        notes.append(
            f"no failed/censored column, so every lifetime in {str(dcol)!r} is read as ending in "
            "a failure (name --event-column if some are censored)"
        )
    causes = _causes(df, cols.find("cause"), notes, observed)
    if causes is not None:
        causes = np.where(observed, causes, None)
    rcol = cols.find("repair")
    repair = _repairs(df, rcol, repair_unit_s)
    repair_s, repair_causes = _logged_repairs(repair, causes, observed, rcol, notes)
    keep = durations > 0
    if not keep.all():
        notes.append(_zero_note(~keep, np.flatnonzero(~keep)))
    return FailureLog(
        durations_s=durations[keep],
        observed=observed[keep],
        causes=None if causes is None else causes[keep],
        repair_s=repair_s,
        repair_causes=repair_causes,
        shape="lifetimes",
        columns=cols.used(),
        notes=tuple(notes),
        span_s=float(durations.max()) if durations.size else None,
    )


def _read_timestamps(path, df, cols: _Columns, unit_s, repair_unit_s, end) -> FailureLog:
    ev = _events(path, df, cols, unit_s, repair_unit_s, components=True)
    times = ev.times_s
    end_s = _end_s(end, unit_s, ev.dates)
    last = float(times.max())
    if end_s is None:
        end_s = last
    elif end_s < last:
        raise InputError(f"--end {end} is before the last failure in the log")
    elif end_s - float(times.min()) > MAX_SPAN_S:
        raise InputError(
            f"--end {end} is {(end_s - float(times.min())) / _YEAR_S:.3g} years after the log's "
            f"first failure; an observation window is at most {MAX_SPAN_S / _YEAR_S:g} years "
            "(is --unit right?)"
        )
    groups = [np.arange(times.size)]
    if ev.components is not None:
        import pandas as pd

        groups = list(pd.Series(ev.components).groupby(ev.components).indices.values())
    durs, obs, causes = [], [], []
    for idx in groups:
        idx = np.asarray(idx)[np.argsort(times[idx], kind="stable")]
        t = times[idx]
        durs.append(np.diff(t))
        obs.append(np.ones(t.size - 1, bool))
        causes.append(ev.causes[idx[1:]] if ev.causes is not None else [None] * (t.size - 1))
        if end_s > t[-1]:
            durs.append([end_s - t[-1]])
            obs.append([False])
            causes.append([None])
    durations = np.concatenate([np.asarray(d, float) for d in durs])
    observed = np.concatenate([np.asarray(o, bool) for o in obs])
    cause_arr = None
    if ev.causes is not None:
        cause_arr = np.concatenate([np.asarray(c, object) for c in causes])
    notes = list(ev.notes)
    every = np.ones(times.size, bool)
    repair_s, repair_causes = _logged_repairs(
        ev.repair_s, ev.causes, every, ev.columns.get("repair"), notes
    )
    order = np.sort(times) - times.min()
    return FailureLog(
        durations_s=durations,
        observed=observed,
        causes=cause_arr,
        repair_s=repair_s,
        repair_causes=repair_causes,
        failure_times_s=order,
        shape="timestamps",
        components=None if ev.components is None else len(set(ev.components.tolist())),
        columns=ev.columns,
        notes=tuple(notes),
        span_s=float(end_s - times.min()),
    )


# -- failure times (for simulate --trace) --------------------------------------------------------
@dataclass(frozen=True)
class FailureTimes:
    """A log's failures as a trace: times since the job's start (s, sorted), their causes."""

    times_s: np.ndarray
    causes: np.ndarray | None
    """Each failure's cause (text; None where the log's cell is blank); None: no cause column."""
    columns: dict
    notes: tuple[str, ...]
    dates: bool
    rows: np.ndarray
    """Each failure's row in the file (0-based)."""


def read_failure_times(
    path,
    *,
    unit: str = "h",
    time_column: str | None = None,
    cause_column: str | None = None,
    causes: bool = False,
    system_column: str | None = None,
) -> FailureTimes:
    """The failures of a log for replay, read by the rules ``ckptsim fit`` reads it with.

    Numbers are times since the job's start in ``unit``; with dates the job starts at the first
    (that row marks the start: it is not a failure that hits the job). ``causes``: read the
    cause column too (``cause_column``, or the one detected by name). Failures at one instant
    are one interruption (the rule that merges a log's duplicate rows).
    """
    unit_s = _unit_seconds(unit)
    df = read_table(path)
    if df.empty:
        raise InputError(f"{path}: the failure log has no rows")
    given = {"time": time_column, "system": system_column}
    if causes:
        given["cause"] = cause_column
    else:
        given["cause"] = "none"
    given["repair"] = "none"
    cols = _Columns(df, given)
    if cols.find("time") is None:
        if df.shape[1] == 1:
            cols.chosen["time"] = df.columns[0]
        elif (dcol := _Columns(df, {}).find("duration")) is not None:
            raise InputError(
                f"{path} holds lifetimes (column {str(dcol)!r}), not failure times: a trace "
                "replays the times failures happened; draw from lifetimes with --failure "
                "empirical:FILE, or name the time column with --time-column"
            )
        else:
            raise InputError(
                f"cannot tell which column holds the failure times: name it with --time-column "
                f"(columns: {_columns_text(df.columns)})"
            )
    if causes and cols.find("cause") is None:
        raise InputError(
            "cannot tell which column holds the cause of each failure: name it with --cause-column "
            f"(columns: {_columns_text(df.columns)})"
        )
    ev = _events(path, df, cols, unit_s, unit_s, components=False)
    order = np.argsort(ev.times_s, kind="stable")
    seconds = ev.times_s[order]
    cause = None if ev.causes is None else ev.causes[order]
    rows = ev.rows[order]
    if ev.dates:
        seconds = (seconds - seconds[0])[1:]
        cause = None if cause is None else cause[1:]
        rows = rows[1:]
    if seconds.size < 1 or seconds[-1] <= 0:
        raise InputError(f"{path}: the log holds no failure after the job's start")
    return FailureTimes(seconds, cause, ev.columns, tuple(ev.notes), ev.dates, rows)
