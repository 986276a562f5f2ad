"""The LANL failure record (1996-2005): per-node times between failures and repair times.

Los Alamos released 23,739 node interrupts of 23 of its systems with each one's start, end,
down time and root-cause category (Schroeder and Gibson, DSN 2006, is the standard analysis).
``simulator/data/lanl_failures.csv.gz`` is a compact derived table of it, one row per failure
(``build_table`` makes it from the released file; provenance in ``data/PROVENANCE.md``).

A node's lifetimes run from its production date to its first failure, then between
consecutive failures, and the last one is censored at its decommission date (or at the end of
the record for nodes still in service). The record lists only nodes that failed, so a
system's nodes that never failed are added as censored lifetimes from the system's production
to its decommission date (their count is ``nodes`` minus the nodes seen). Dates are local
times as released; production and decommission dates are months (taken as the 1st).
Inconsistent rows are counted, not silently used: a failure before its node's production
date starts that node's clock at the failure; a non-positive down time is left out of the
repair fits; failures at the same minute on one node are one failure.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from importlib import resources

import numpy as np

from simulator.errors import InputError

__all__ = ["CAUSES", "NodeLifetimes", "build_table", "load_table", "node_lifetimes"]

CAUSES = ("Facilities", "Hardware", "Human Error", "Network", "Undetermined", "Software")
END_OF_RECORD = "2005-11-30"
_TABLE = "lanl_failures.csv.gz"
_MONTHS = {m: i for i, m in enumerate(
    ("jan", "feb", "mar", "apr", "may", "jun", "jul", "aug", "sep", "oct", "nov", "dec"), 1
)}  # fmt: skip


def _month(text) -> str | None:
    """``Jan-97`` or ``2-May`` (a spreadsheet's rendering of May-02) as ``YYYY-MM``."""
    text = str(text).strip()
    m = re.fullmatch(r"([A-Za-z]{3})-(\d{2})", text) or re.fullmatch(
        r"(\d{1,2})-([A-Za-z]{3})", text
    )
    if not m:
        return None  # "current", "before tracking", blank
    a, b = m.groups()
    mon, yy = (a, b) if a.isalpha() else (b, a)
    year = int(yy) + (1900 if int(yy) > 50 else 2000)
    return f"{year:04d}-{_MONTHS[mon.lower()]:02d}"


def build_table(source):
    """The compact table (a pandas DataFrame) from the released CSV (path, ``.xz`` allowed)."""
    import pandas as pd

    raw = pd.read_csv(source)
    cause = raw[list(CAUSES)].notna()
    out = pd.DataFrame(
        {
            "system": raw["System"].astype(int),
            "nodes": raw["nodes"],
            "node": raw["nodenumz"],
            "prod": raw["node prod"].map(_month),
            "decom": raw["node decom"].map(_month),
            "start": pd.to_datetime(raw["Prob Started"], format="%m/%d/%Y %H:%M"),
            "down_min": raw["Down Time"],
            "cause": cause.idxmax(axis=1).where(cause.any(axis=1), "Unknown"),
            "same_event": raw["Same Event"].astype(str).str.lower().eq("yes"),
        }
    )
    out["start"] = out["start"].dt.strftime("%Y-%m-%d %H:%M")
    return out.sort_values(["system", "node", "start"], kind="stable").reset_index(drop=True)


def load_table():
    """The committed derived table as a DataFrame."""
    import pandas as pd

    with resources.as_file(resources.files("simulator") / "data" / _TABLE) as path:
        return pd.read_csv(path)


@dataclass(frozen=True)
class NodeLifetimes:
    durations_s: np.ndarray
    observed: np.ndarray
    nodes_seen: int
    nodes_never_failed: int
    before_production: int
    """Failures logged before their node's production date (the clock starts there)."""


def node_lifetimes(table, system: int) -> NodeLifetimes:
    """Per-node times between failures of one system, censored as the module docstring says."""
    import pandas as pd

    rows = table[table["system"] == system]
    if rows.empty:
        raise InputError(f"no LANL system {system}")
    end = pd.Timestamp(END_OF_RECORD)
    starts = pd.to_datetime(rows["start"])
    first_seen = starts.min()
    durs, obs, early = [], [], 0
    for _, g in rows.assign(t=starts).groupby("node"):
        t = np.unique(g["t"].to_numpy(dtype="datetime64[s]").astype(np.int64)).astype(float)
        prod = _ts(g["prod"].iloc[0], first_seen)
        decom = _ts(g["decom"].iloc[0], end)
        if t[0] < prod:
            early += 1
            prod = t[0]
        else:
            durs.append(t[0] - prod)
            obs.append(True)
        durs.extend(np.diff(t))
        obs.extend([True] * (t.size - 1))
        if decom > t[-1]:
            durs.append(decom - t[-1])
            obs.append(False)
    seen = rows["node"].nunique()
    never = max(int(rows["nodes"].iloc[0]) - seen, 0)
    if never:
        prod = _ts(rows["prod"].mode().iloc[0], first_seen)
        decom = _ts(rows["decom"].mode().iloc[0] if rows["decom"].notna().any() else None, end)
        durs.extend([decom - prod] * never)
        obs.extend([False] * never)
    d, o = np.asarray(durs, float), np.asarray(obs, bool)
    keep = d > 0
    return NodeLifetimes(d[keep], o[keep], seen, never, early)


def _ts(month, default) -> float:
    import pandas as pd

    if month is None or (isinstance(month, float) and np.isnan(month)):
        return pd.Timestamp(default).value / 1e9
    return pd.Timestamp(f"{month}-01").value / 1e9
