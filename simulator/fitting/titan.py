"""The Titan GPU failure trace: real per-GPU lifetimes and system-level failure times.

Titan (Cray XK7, Oak Ridge, 2012-2019) had 18,688 compute nodes with one NVIDIA K20X GPU each.
Ostrouchov et al. published its GPU life history (SC '20, see ``simulator/data/PROVENANCE.md``):
one row per period that a GPU (serial number) spent in a node slot, with the double-bit ECC
errors (DBE) and off-the-bus events (OTB) that ended or interrupted it. This module reads two
compact tables derived from that file and committed in ``simulator/data/``:

* per GPU — service time and the service time at its *first* DBE/OTB event. A job is interrupted
  by the first event whether or not the GPU is later put back into service, so
  ``gpu_lifetimes()`` measures cumulative service time (summed over all the slots a GPU lived in,
  gaps on the shelf excluded) until the first event, censored at the last removal for GPUs that
  never had one. ``rule="removal"`` gives the paper's own definition instead (a GPU is dead when
  it is removed after an event; its life is its total service time).
* system level — every DBE/OTB event with its time since the trace start and its node slot, so a
  simulated job on a random subset of the slots can replay the failures that would have hit it
  (``failure_times_for_subset``). Events at one slot in quick succession (a GPU that logs a
  burst of DBEs before it is pulled) are merged into the first: one job interruption.

``build_tables`` regenerates the derived files from the shared ``gc_full.csv`` when it exists.
"""

from __future__ import annotations

import functools
from importlib import resources
from pathlib import Path

import numpy as np
import pandas as pd

from simulator.errors import InputError

__all__ = [
    "BURST_MERGE_S",
    "N_SLOTS",
    "TRACE_END",
    "TRACE_START",
    "build_tables",
    "failure_events",
    "failure_times_for_subset",
    "gpu_lifetimes",
    "gpu_table",
    "span_s",
    "write_lifetimes",
]

N_SLOTS = 18_688
"""Titan's compute nodes, one GPU each: the slots a job can be placed on."""
TRACE_START = pd.Timestamp("2014-01-21 10:28:50")
"""The first full inventory: 18,231 of the GPUs first appear then; no event precedes it."""
TRACE_END = pd.Timestamp("2019-08-01 20:07:33")
"""Lights out: the last removal time, where everything still running is censored."""
BURST_MERGE_S = 24 * 3600.0
"""Events at one slot within this many seconds of the last kept one count as one failure."""
NEW_BATCH_AFTER = pd.Timestamp("2016-01-01")
"""GPUs first installed after this belong to the new batch (the 2016-17 rework; the paper's
``batch`` split)."""

GPU_FILE = "titan_gpus.csv.gz"
EVENT_FILE = "titan_events.csv.gz"
SOURCE_CSV = Path(__file__).resolve().parents[3] / "shared" / "data" / "titan-gpu" / "gc_full.csv"


# -- building the derived tables from the published file ---------------------------------------
def _read_source(csv_path: Path) -> pd.DataFrame:
    raw = pd.read_csv(csv_path, dtype={"SN": str, "location": str, "event": str})
    for col in ("insert", "remove"):
        raw[col] = pd.to_datetime(raw[col], format="%Y-%m-%d %H:%M:%S")
    # `out` is TRUE/FALSE, empty on event-only rows; pandas reads it as bool or object.
    raw["out"] = raw["out"].astype(str).eq("True")
    return raw


def _gpu_rows(raw: pd.DataFrame) -> pd.DataFrame:
    life = raw[raw["insert"].notna()].sort_values(["SN", "insert"])
    # Service time before each period: the GPU's age when the period starts.
    life = life.assign(before_s=life.groupby("SN")["duration"].cumsum() - life["duration"])
    events = raw.loc[raw["event"].notna(), ["SN", "remove"]].rename(columns={"remove": "t"})
    # Each event belongs to the last period that started before it (events without their own
    # period row are repeats logged inside one); age at the event = service before that period
    # + time into it, clipped to the period (timestamps and durations differ by DST hours).
    # An event before the GPU's first recorded period has no service age and is left out: in
    # the published file, two DBEs of one GPU (0323712028008, at another slot six days before
    # its only period), counted by build_tables as events_before_any_period.
    hit = pd.merge_asof(
        events.sort_values("t"),
        life[["SN", "insert", "duration", "before_s"]].sort_values("insert"),
        left_on="t",
        right_on="insert",
        by="SN",
        direction="backward",
    ).dropna(subset=["insert"])
    into_s = (hit["t"] - hit["insert"]).dt.total_seconds().clip(lower=0.0)
    hit["age_s"] = hit["before_s"] + np.minimum(into_s, hit["duration"])
    grouped = life.groupby("SN")
    gpus = pd.DataFrame(
        {
            "service_s": grouped["duration"].sum(),
            "first_insert": grouped["insert"].min(),
            "removed": grouped["out"].any(),
        }
    )
    gpus["first_event_s"] = hit.groupby("SN")["age_s"].min()
    had_event = raw.loc[raw["event"].notna(), "SN"].unique()
    gpus["removed_after_event"] = gpus["removed"] & gpus.index.isin(had_event)
    gpus["batch"] = np.where(gpus["first_insert"] > NEW_BATCH_AFTER, "new", "old")
    out = gpus.reset_index().rename(columns={"SN": "sn"})
    out["service_s"] = out["service_s"].round().astype("int64")
    out["first_event_s"] = out["first_event_s"].round().astype("Int64")
    out["removed_after_event"] = out["removed_after_event"].astype(int)
    return out[["sn", "batch", "service_s", "first_event_s", "removed_after_event"]]


def _event_rows(raw: pd.DataFrame) -> pd.DataFrame:
    slots = {loc: i for i, loc in enumerate(sorted(raw["location"].unique()))}
    ev = raw.loc[raw["event"].notna(), ["remove", "location", "event", "SN"]]
    ev = ev[(ev["remove"] >= TRACE_START) & (ev["remove"] <= TRACE_END)]
    out = pd.DataFrame(
        {
            "time_s": (ev["remove"] - TRACE_START).dt.total_seconds().astype("int64"),
            "slot": ev["location"].map(slots).astype("int64"),
            "location": ev["location"],
            "event": ev["event"],
            "sn": ev["SN"],
        }
    )
    return out.sort_values(["time_s", "slot"], kind="stable").reset_index(drop=True)


def build_tables(csv_path: str | Path = SOURCE_CSV, out_dir: str | Path | None = None) -> dict:
    """Regenerate the derived tables from the published ``gc_full.csv``; returns counts."""
    csv_path = Path(csv_path)
    if not csv_path.exists():
        raise InputError(f"Titan source table not found: {csv_path}")
    out_dir = Path(out_dir) if out_dir is not None else Path(__file__).parents[1] / "data"
    out_dir.mkdir(parents=True, exist_ok=True)
    raw = _read_source(csv_path)
    gpus, events = _gpu_rows(raw), _event_rows(raw)
    # mtime=0 keeps the gzip bytes identical between runs, so regenerating is a no-op in git.
    opts = {"method": "gzip", "mtime": 0}
    gpus.to_csv(out_dir / GPU_FILE, index=False, compression=opts)
    events.to_csv(out_dir / EVENT_FILE, index=False, compression=opts)
    return {
        "source_rows": len(raw),
        "gpus": len(gpus),
        "gpus_with_event": int(gpus["first_event_s"].notna().sum()),
        "events": len(events),
        "events_before_any_period": _events_before_any_period(raw),
        "locations": int(raw["location"].nunique()),
    }


def _events_before_any_period(raw: pd.DataFrame) -> int:
    """Events logged before their GPU's first recorded period (left out of the lifetimes)."""
    first = raw[raw["insert"].notna()].groupby("SN")["insert"].min()
    events = raw[raw["event"].notna()]
    starts = events["SN"].map(first)
    return int((starts.isna() | (events["remove"] < starts)).sum())


# -- reading the committed tables ---------------------------------------------------------------
def _data_path(name: str):
    return resources.files("simulator") / "data" / name


@functools.cache
def gpu_table() -> pd.DataFrame:
    """One row per GPU serial number: batch, service_s, first_event_s, removed_after_event.

    Cached and shared between callers: treat it as read-only.
    """
    with resources.as_file(_data_path(GPU_FILE)) as path:
        table = pd.read_csv(path, dtype={"sn": str, "batch": str, "first_event_s": "Int64"})
    table["removed_after_event"] = table["removed_after_event"].astype(bool)
    return table


@functools.cache
def _raw_events() -> pd.DataFrame:
    with resources.as_file(_data_path(EVENT_FILE)) as path:
        return pd.read_csv(path, dtype={"location": str, "event": str, "sn": str})


def gpu_lifetimes(
    rule: str = "first_event", batch: str | None = None, *, source: str | Path | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """Per-GPU service times (seconds) and whether each ended in a failure (else censored).

    ``rule="first_event"``: service time until the first DBE/OTB, censored at the last removal.
    ``rule="removal"``: the paper's definition — total service time, failed when the GPU was
    removed after an event. ``batch`` restricts to ``"old"`` or ``"new"`` GPUs. ``source``: the
    published ``gc_full.csv`` to build them from (None: the committed table made from it).
    """
    if source is None:
        table = gpu_table()
    else:
        if not Path(source).exists():
            raise InputError(f"Titan source table not found: {source}")
        table = _gpu_rows(_read_source(Path(source)))
    if batch is not None:
        if batch not in ("old", "new"):
            raise InputError(f"batch must be 'old' or 'new', got {batch!r}")
        table = table[table["batch"] == batch]
    if rule == "first_event":
        observed = table["first_event_s"].notna().to_numpy()
        durations = np.where(
            observed, table["first_event_s"].fillna(0).to_numpy(float), table["service_s"]
        )
    elif rule == "removal":
        observed = table["removed_after_event"].to_numpy(bool)
        durations = table["service_s"].to_numpy(float)
    else:
        raise InputError(f"lifetime rule must be 'first_event' or 'removal', got {rule!r}")
    # The trace is written at inventory times to the second; an event logged in the second a
    # period started has age 0, which no continuous lifetime density allows. One second is
    # below the data's resolution.
    return np.maximum(np.asarray(durations, dtype=float), 1.0), observed


def write_lifetimes(path: str | Path, *, source: str | Path | None = None) -> int:
    """The study's per-GPU lifetimes (``gpu_lifetimes()``) as a lifetimes log ``ckptsim fit``
    reads: ``duration_s`` and ``event`` (1 failed, 0 censored), one row per GPU. ``gc_full.csv``
    is not one: its rows are a GPU's periods in a slot and events logged on rows of their own,
    which the study sums and matches per serial number first. Returns the rows written."""
    durations, observed = gpu_lifetimes(source=source)
    frame = pd.DataFrame({"duration_s": durations, "event": observed.astype(int)})
    frame.to_csv(path, index=False, float_format="%.17g")
    return len(frame)


@functools.cache
def failure_events(merge_within_s: float = BURST_MERGE_S) -> pd.DataFrame:
    """System-level failures: time_s since TRACE_START (sorted), slot, location, event, sn.

    Events at a slot within ``merge_within_s`` of the last event kept there are dropped (one
    interruption per burst); ``merge_within_s=0`` keeps every logged event. Cached and shared
    between callers: treat it as read-only.
    """
    if not np.isfinite(merge_within_s) or merge_within_s < 0:
        raise InputError(
            f"merge_within_s must be a non-negative number of seconds, got {merge_within_s!r}"
        )
    ev = _raw_events()
    keep = np.ones(len(ev), dtype=bool)
    if merge_within_s > 0:
        last_kept: dict[int, float] = {}
        for i, (t, slot) in enumerate(
            zip(ev["time_s"].to_numpy(), ev["slot"].to_numpy(), strict=True)
        ):
            prev = last_kept.get(slot)
            if prev is not None and t - prev <= merge_within_s:
                keep[i] = False
            else:
                last_kept[slot] = t
    out = ev[keep].reset_index(drop=True)
    out["time_s"] = out["time_s"].astype(float)
    return out


def span_s() -> float:
    """Length of the trace, seconds (TRACE_START to TRACE_END)."""
    return (TRACE_END - TRACE_START).total_seconds()


def failure_times_for_subset(
    n_gpus: int, rng: np.random.Generator, *, merge_within_s: float = BURST_MERGE_S
) -> np.ndarray:
    """Times (s since TRACE_START, sorted) of the failures that hit ``n_gpus`` random slots."""
    if isinstance(n_gpus, bool) or not isinstance(n_gpus, int | np.integer):
        raise InputError(f"n_gpus must be a whole number of GPUs, got {n_gpus!r}")
    if not 1 <= n_gpus <= N_SLOTS:
        raise InputError(f"n_gpus must be between 1 and {N_SLOTS} GPUs, got {n_gpus}")
    events = failure_events(merge_within_s)
    chosen = np.zeros(N_SLOTS, dtype=bool)
    chosen[rng.choice(N_SLOTS, size=int(n_gpus), replace=False)] = True
    return events["time_s"].to_numpy()[chosen[events["slot"].to_numpy()]]
