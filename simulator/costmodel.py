"""Checkpoint cost model: time = latency + bytes / bandwidth, fitted to measured saves.

``ckptsim bench`` measures saves, restores and async stalls of real training state at several
sizes; each (format, operation) gets a line of seconds against bytes whose two parameters are
both constrained non-negative (``scipy.optimize.lsq_linear`` with bounds): the intercept is the
fixed latency, the inverse slope the bandwidth. The fit minimises *relative* residuals (each
sample weighted by 1/seconds): timing noise on a shared disk is multiplicative (tens of per
cent at every size), and an unweighted fit lets the largest size set the line alone, so that
an unconstrained one came out with negative latencies and predicted small restores several
times too slow. The residuals are kept so a reader can see how straight the line was. A profile
JSON holds the machine facts, the raw samples and the fits.

:meth:`CostProfile.predict` extrapolates to a model of P parameters sharded over N nodes that
write in parallel: each node writes P·(bytes per parameter)/N bytes at the measured per-writer
bandwidth, capped by an aggregate storage bandwidth shared by all N. The async stall (staging
copy into host memory) is node-local and not capped by storage. No torch here: the simulator
core uses this.
"""

from __future__ import annotations

import json
import math
import os
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
from scipy import optimize

from simulator.errors import InputError

__all__ = [
    "BYTES_PER_PARAM",
    "CheckpointCost",
    "CostProfile",
    "FormatFit",
    "LinearFit",
    "fit_linear",
]

SCHEMA = "ckptsim-cost-profile/1"

BYTES_PER_PARAM = {"fp32": 12.0, "bf16": 14.0}
"""State bytes per parameter a resume needs: fp32 = weights + two AdamW moments (4+4+4);
bf16 mixed precision = bf16 weights + fp32 master + two fp32 moments (2+4+4+4). Gradients are
not saved (they are recomputed after a restart)."""


@dataclass(frozen=True, kw_only=True)
class LinearFit:
    """seconds = latency_s + bytes / bytes_per_s, fitted by bounded relative least squares."""

    latency_s: float
    """Intercept: fixed cost of one operation, seconds (never negative; profiles written before
    the bounded fit may hold a negative one, which :meth:`seconds` treats as zero)."""
    bytes_per_s: float
    """Inverse slope: sustained bandwidth, bytes per second."""
    r2: float
    """Coefficient of determination on seconds (1 - SS_res / SS_tot); can be low, even negative,
    when one size departs from the line the others follow: read the residuals."""
    residuals_s: tuple[float, ...] = ()
    """Measured minus fitted seconds, one per sample, in sample order."""
    n: int = 0
    """Number of samples fitted."""

    def seconds(self, nbytes: float, *, bytes_per_s: float | None = None) -> float:
        """Predicted time for ``nbytes``, optionally at a lower (capped) bandwidth."""
        bw = self.bytes_per_s if bytes_per_s is None else min(self.bytes_per_s, bytes_per_s)
        return max(0.0, self.latency_s) + nbytes / bw


def fit_linear(nbytes, seconds) -> LinearFit:
    """Fit seconds = latency + bytes/bandwidth, latency >= 0 and bandwidth > 0.

    Bounded least squares on relative residuals (see the module docstring); needs two or more
    distinct sizes and positive times.
    """
    x = np.asarray(nbytes, dtype=float)
    y = np.asarray(seconds, dtype=float)
    if x.shape != y.shape or x.size < 2 or np.unique(x).size < 2:
        raise InputError("a cost fit needs samples at two or more distinct sizes (bytes)")
    if not (np.all(np.isfinite(x)) and np.all(np.isfinite(y)) and np.all(y > 0)):
        raise InputError("cost samples must be finite, positive seconds and bytes")
    scale = float(x.max())  # columns of similar magnitude keep the solver well conditioned
    design = np.column_stack([np.ones_like(x), x / scale])
    w = 1.0 / y
    res = optimize.lsq_linear(
        design * w[:, None], y * w, bounds=([0.0, 0.0], [np.inf, np.inf]), method="bvls"
    )
    latency, per_scale = (float(v) for v in res.x)
    if not per_scale > 0:
        raise InputError(
            f"fitted time does not grow with bytes (slope {per_scale / scale:.3g} s/byte): "
            "measure larger sizes"
        )
    fitted = design @ res.x
    ss_tot = float(np.sum((y - y.mean()) ** 2))
    ss_res = float(np.sum((y - fitted) ** 2))
    return LinearFit(
        latency_s=latency,
        bytes_per_s=scale / per_scale,
        r2=1.0 - ss_res / ss_tot if ss_tot > 0 else 1.0,
        residuals_s=tuple(float(v) for v in y - fitted),
        n=int(x.size),
    )


@dataclass(frozen=True, kw_only=True)
class FormatFit:
    """The fitted costs of one checkpoint format."""

    save: LinearFit
    """Time until the checkpoint is durable (for async formats: until the write completes)."""
    load: LinearFit | None = None
    """Restore time with a cold page cache."""
    stall: LinearFit | None = None
    """Async formats: time until training may continue (the staging copy)."""
    overhead: float = 1.0
    """Bytes on disk per byte of tensor data (headers, metadata, padding)."""


@dataclass(frozen=True, kw_only=True)
class CheckpointCost:
    """What one checkpoint costs the simulated job."""

    stall_s: float
    """Training stall per save, seconds (δ in the closed forms)."""
    write_s: float
    """Time until the save is durable, seconds (async: bounds how often saves can start)."""
    restore_s: float
    """Time to load the checkpoint after a failure, seconds."""
    bytes: float
    """Bytes written per checkpoint, all nodes together."""


@dataclass(frozen=True, kw_only=True)
class CostProfile:
    """Measured samples, their fits per format, and the machine they came from."""

    machine: dict[str, Any]
    """Facts about where it was measured (CPU, memory, disk, torch version, date)."""
    fits: dict[str, FormatFit]
    """Per format (``raw`` is the plain sequential write/read baseline)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Raw samples: format, dtype, params, bytes, save_s, load_s, stall_s."""

    @classmethod
    def from_samples(cls, samples: list[dict[str, Any]], machine: dict[str, Any]) -> CostProfile:
        """Fit every format whose save times grow with bytes over two or more sizes."""
        fits: dict[str, FormatFit] = {}
        for fmt in sorted({s["format"] for s in samples}):
            rows = [s for s in samples if s["format"] == fmt]
            if len({r["bytes"] for r in rows}) < 2:
                continue
            save = _fit_column(rows, "save_s")
            if save is None:
                continue  # times did not grow with size (noise at tiny sizes): nothing to fit
            fits[fmt] = FormatFit(
                save=save,
                load=_fit_column(rows, "load_s"),
                stall=_fit_column(rows, "stall_s"),
                overhead=float(
                    np.median([r["bytes"] / r["tensor_bytes"] for r in rows if r["tensor_bytes"]])
                ),
            )
        return cls(machine=dict(machine), fits=fits, samples=list(samples))

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "machine": self.machine,
            "fits": {k: asdict(v) for k, v in self.fits.items()},
            "samples": self.samples,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Write the profile JSON, replacing any old file in one step (never half-written)."""
        from simulator.outfile import write_atomic

        text = json.dumps(self.to_dict(), indent=1) + "\n"
        write_atomic(path, lambda tmp: tmp.write_text(text))

    @classmethod
    def load(cls, path: str | os.PathLike) -> CostProfile:
        """Read a profile JSON written by ``ckptsim bench --out``."""
        try:
            data = json.loads(Path(path).read_text())
        except OSError as exc:
            raise InputError(f"cannot read cost profile {path}: {exc.strerror}") from None
        except ValueError as exc:
            raise InputError(f"cost profile {path} is not JSON: {exc}") from None
        if not isinstance(data, dict) or data.get("schema") != SCHEMA:
            raise InputError(f"{path} is not a ckptsim cost profile (schema {SCHEMA})")
        try:
            fits = {k: _format_fit(v) for k, v in data["fits"].items()}
        except (KeyError, TypeError) as exc:
            raise InputError(f"cost profile {path} has a malformed fit: {exc}") from None
        return cls(machine=data.get("machine", {}), fits=fits, samples=data.get("samples", []))

    # ------------------------------------------------------------------ prediction

    def predict(
        self,
        *,
        params: float,
        nodes: int = 1,
        format: str = "ckptsim",
        aggregate_bytes_per_s: float | None = None,
        dtype: str = "bf16",
        bytes_per_param: float | None = None,
    ) -> CheckpointCost:
        """Cost of checkpointing a ``params``-parameter model sharded evenly over ``nodes``.

        Each node writes its shard at the measured per-writer bandwidth, capped at
        ``aggregate_bytes_per_s / nodes`` when the shared storage has an aggregate limit;
        restores read through the same cap. Bytes per parameter come from ``dtype`` (see
        :data:`BYTES_PER_PARAM`) times the format's measured on-disk overhead, unless given.
        """
        if format not in self.fits:
            known = ", ".join(sorted(self.fits)) or "none"
            raise InputError(f"format {format!r} is not in this profile (fitted: {known})")
        if not (math.isfinite(params) and params > 0):
            raise InputError(f"params must be a positive number of parameters, got {params!r}")
        if int(nodes) != nodes or nodes < 1:
            raise InputError(f"nodes must be a whole number >= 1, got {nodes!r}")
        if aggregate_bytes_per_s is not None and not aggregate_bytes_per_s > 0:
            raise InputError(
                f"aggregate storage bandwidth must be positive bytes/s, got {aggregate_bytes_per_s}"
            )
        fit = self.fits[format]
        if bytes_per_param is None:
            if dtype not in BYTES_PER_PARAM:
                raise InputError(
                    f"dtype must be one of {', '.join(BYTES_PER_PARAM)}, got {dtype!r}"
                )
            bytes_per_param = BYTES_PER_PARAM[dtype] * fit.overhead
        elif not bytes_per_param > 0:
            raise InputError(f"bytes_per_param must be positive, got {bytes_per_param!r}")
        total = float(params) * bytes_per_param
        shard = total / nodes
        cap = None if aggregate_bytes_per_s is None else aggregate_bytes_per_s / nodes
        write_s = fit.save.seconds(shard, bytes_per_s=cap)
        load = fit.load or fit.save
        restore_s = load.seconds(shard, bytes_per_s=cap)
        stall_s = fit.stall.seconds(shard) if fit.stall is not None else write_s
        return CheckpointCost(stall_s=stall_s, write_s=write_s, restore_s=restore_s, bytes=total)


def _fit_column(rows: list[dict[str, Any]], key: str) -> LinearFit | None:
    pts = [(r["bytes"], r[key]) for r in rows if r.get(key) is not None]
    if len({b for b, _ in pts}) < 2:
        return None
    try:
        return fit_linear([b for b, _ in pts], [s for _, s in pts])
    except InputError:
        return None  # e.g. a flat stall at small sizes: no usable line, so no extrapolation


def _linear(d: dict[str, Any] | None) -> LinearFit | None:
    if d is None:
        return None
    return LinearFit(
        latency_s=float(d["latency_s"]),
        bytes_per_s=float(d["bytes_per_s"]),
        r2=float(d["r2"]),
        residuals_s=tuple(d.get("residuals_s", ())),
        n=int(d.get("n", 0)),
    )


def _format_fit(d: dict[str, Any]) -> FormatFit:
    return FormatFit(
        save=_linear(d["save"]),
        load=_linear(d.get("load")),
        stall=_linear(d.get("stall")),
        overhead=float(d.get("overhead", 1.0)),
    )
