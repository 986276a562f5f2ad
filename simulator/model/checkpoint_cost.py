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

``ckptsim bench --writers 1,2,4,8`` measures N processes saving one sharded state at once; the
aggregate bandwidth against N is fitted with the universal scalability law (Gunther),
X(N) = λN / (1 + σ(N-1) + κN(N-1)) with λ, σ, κ ≥ 0 (``scipy.optimize.least_squares`` with
bounds and a robust loss, on log bandwidth; relative residuals kept): σ is contention for a
shared resource, κ the cost of keeping writers coherent. It bends where a hard ``min()`` would
break, and it can fall past a peak.

:meth:`CostProfile.predict` extrapolates to a model of P parameters sharded over N nodes that
write in parallel: each node writes P·(bytes per parameter)/N bytes at the per-writer bandwidth
the contention curve gives at N (the single-writer line without one), all together capped by
the shared storage's aggregate bandwidth — the one given, else
:data:`~simulator.model.scenario.DEFAULT_STORAGE_BYTES_PER_S` (a published figure, see there). Past
10x the measured writers the curve is not followed further (one machine's disk says nothing of
a cluster's storage): each node keeps the per-writer bandwidth of the most writers measured and
the storage cap decides; such an extrapolation, or a shard 10x past the largest size measured,
comes back as a warning naming the input that would replace it. The async stall (staging copy
into host memory) is node-local and not capped by storage. No torch here: the simulator core
uses this.
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
from simulator.model.scenario import DEFAULT_STORAGE_BYTES_PER_S, DEFAULT_STORAGE_SOURCE

__all__ = [
    "BYTES_PER_PARAM",
    "CheckpointCost",
    "ContentionFit",
    "CostProfile",
    "FormatFit",
    "LinearFit",
    "fit_contention",
    "fit_linear",
]

EXTRAPOLATION_WARN = 10.0
"""How far past the measured writers or sizes a prediction goes before it says so."""

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
class ContentionFit:
    """Aggregate bandwidth of N parallel writers, X(N) = λN / (1 + σ(N-1) + κN(N-1))."""

    single_bytes_per_s: float
    """λ: one writer's bandwidth, bytes per second."""
    contention: float
    """σ >= 0: the serialised share (σ = 1: N writers go no faster than one)."""
    coherency: float
    """κ >= 0: the per-pair cost that makes the aggregate fall past a peak."""
    writers: tuple[int, ...]
    """Writer counts measured (one per sample)."""
    residuals: tuple[float, ...] = ()
    """Measured / fitted aggregate bandwidth - 1, one per sample, in sample order."""
    max_shard_bytes: float = 0.0
    """The largest bytes one writer wrote in these samples."""

    def aggregate_bytes_per_s(self, n: float) -> float:
        return (
            self.single_bytes_per_s
            * n
            / (1.0 + self.contention * (n - 1.0) + self.coherency * n * (n - 1.0))
        )


def fit_contention(writers, aggregate_bytes_per_s, *, max_shard_bytes: float = 0.0):
    """Fit the universal scalability law to aggregate bandwidth against writers, λ, σ, κ >= 0.

    Fitted on log bandwidth (noise is multiplicative here too) with a robust loss (``soft_l1``,
    residuals past ~10 % counted linearly rather than squared): a shared machine now and then
    stalls one repeat for seconds, and with squares five repeats a count, one of them stalled
    to a tenth of the rest, put the raw writers' curve 35-52 % below the median of every count
    (the scale run of 2026-12-07 13:56 UTC; refitted ad hoc, the robust curve came within
    -9 % to +7 % of those medians). Needs two or more writer counts.
    """
    n = np.asarray(writers, dtype=float)
    x = np.asarray(aggregate_bytes_per_s, dtype=float)
    if n.shape != x.shape or np.unique(n).size < 2:
        raise InputError("a contention fit needs samples at two or more writer counts")
    if not (np.all(np.isfinite(x)) and np.all(x > 0) and np.all(n >= 1)):
        raise InputError("contention samples need writers >= 1 and positive bandwidths")
    scale = float(np.median(x[n == n.min()]) / n.min())

    def model(p):
        lam, sigma, kappa = p
        return lam * scale * n / (1.0 + sigma * (n - 1.0) + kappa * n * (n - 1.0))

    # Log residuals: multiplicative noise both ways (1 - fit/x lets a slow outlier pull the
    # curve far below the rest). λ's lower bound keeps the logarithm finite.
    res = optimize.least_squares(
        lambda p: np.log(model(p)) - np.log(x),
        x0=[1.0, 0.1, 0.0],
        bounds=([1e-9, 0, 0], [np.inf] * 3),
        loss="soft_l1",
        f_scale=0.1,
    )
    lam, sigma, kappa = (float(v) for v in res.x)
    return ContentionFit(
        single_bytes_per_s=lam * scale,
        contention=sigma,
        coherency=kappa,
        writers=tuple(int(v) for v in n),
        residuals=tuple(float(v) for v in x / model(res.x) - 1.0),
        max_shard_bytes=float(max_shard_bytes),
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
    aggregate_bytes_per_s: float = math.inf
    """The aggregate write bandwidth the prediction used, all nodes together."""
    warnings: tuple[str, ...] = ()
    """Where the prediction went far past what was measured, and which input fixes it."""


@dataclass(frozen=True, kw_only=True)
class CostProfile:
    """Measured samples, their fits per format, and the machine they came from."""

    machine: dict[str, Any]
    """Facts about where it was measured (CPU, memory, disk, torch version, date)."""
    fits: dict[str, FormatFit]
    """Per format (``raw`` is the plain sequential write/read baseline)."""
    samples: list[dict[str, Any]] = field(default_factory=list)
    """Raw samples: format, dtype, params, bytes, save_s, load_s, stall_s; parallel-writer
    samples (``bench == "writers"``) carry writers, shard_bytes and aggregate_bytes_per_s."""
    contention: dict[str, ContentionFit] = field(default_factory=dict)
    """Per format, the aggregate bandwidth against parallel writers (``ckptsim bench
    --writers``)."""

    @classmethod
    def from_samples(cls, samples: list[dict[str, Any]], machine: dict[str, Any]) -> CostProfile:
        """Fit every format whose save times grow with bytes over two or more sizes."""
        fits: dict[str, FormatFit] = {}
        single = [s for s in samples if s.get("bench") != "writers"]
        for fmt in sorted({s["format"] for s in single}):
            rows = [s for s in single if s["format"] == fmt]
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
        contention: dict[str, ContentionFit] = {}
        parallel = [s for s in samples if s.get("bench") == "writers"]
        for fmt in sorted({s["format"] for s in parallel}):
            rows = [s for s in parallel if s["format"] == fmt]
            if len({r["writers"] for r in rows}) >= 2:
                contention[fmt] = fit_contention(
                    [r["writers"] for r in rows],
                    [r["aggregate_bytes_per_s"] for r in rows],
                    max_shard_bytes=max(r["shard_bytes"] for r in rows),
                )
        return cls(machine=dict(machine), fits=fits, samples=list(samples), contention=contention)

    def unfitted(self, format: str) -> str:
        """Why ``format`` has no fit, in words (see :meth:`from_samples`)."""
        rows = [s for s in self.samples if s.get("bench") != "writers" and s["format"] == format]
        if not rows:
            return "not measured"
        if len({r["bytes"] for r in rows}) < 2:
            return (
                "measured at one size only; a fit of time against bytes needs two or more, "
                "e.g. ckptsim bench --sizes 25M,200M --out FILE"
            )
        return (
            "its save times did not grow with size: the sizes were too small for this disk's noise"
        )

    # ------------------------------------------------------------------ persistence

    def to_dict(self) -> dict[str, Any]:
        return {
            "schema": SCHEMA,
            "machine": self.machine,
            "fits": {k: asdict(v) for k, v in self.fits.items()},
            "contention": {k: asdict(v) for k, v in self.contention.items()},
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
            contention = {
                k: ContentionFit(
                    **v | {"writers": tuple(v["writers"]), "residuals": tuple(v["residuals"])}
                )
                for k, v in data.get("contention", {}).items()
            }
        except (KeyError, TypeError) as exc:
            raise InputError(f"cost profile {path} has a malformed fit: {exc}") from None
        return cls(
            machine=data.get("machine", {}),
            fits=fits,
            samples=data.get("samples", []),
            contention=contention,
        )

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

        Each node writes its shard at the per-writer bandwidth of the contention curve at
        ``nodes`` writers (see the module docstring), all together capped at
        ``aggregate_bytes_per_s`` (default :data:`DEFAULT_STORAGE_BYTES_PER_S`); restores read
        through the same cap. Bytes per parameter come from ``dtype`` (see
        :data:`BYTES_PER_PARAM`) times the format's measured on-disk overhead, unless given.
        """
        if format not in self.fits:
            known = ", ".join(sorted(self.fits)) or "none"
            raise InputError(
                f"format {format!r} has no fit in this profile: {self.unfitted(format)} "
                f"(fitted: {known})"
            )
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
        aggregate, warnings = self._aggregate(format, nodes, shard, aggregate_bytes_per_s)
        cap = aggregate / nodes
        write_s = fit.save.seconds(shard, bytes_per_s=cap)
        load = fit.load or fit.save
        restore_s = load.seconds(shard, bytes_per_s=cap)
        stall_s = fit.stall.seconds(shard) if fit.stall is not None else write_s
        return CheckpointCost(
            stall_s=stall_s,
            write_s=write_s,
            restore_s=restore_s,
            bytes=total,
            aggregate_bytes_per_s=min(aggregate, nodes * fit.save.bytes_per_s),
            warnings=tuple(warnings),
        )

    def _aggregate(
        self, format: str, nodes: int, shard: float, storage: float | None
    ) -> tuple[float, list[str]]:
        """All nodes' write bandwidth together, and the warnings of how far it extrapolates."""
        fix = "give --storage-bytes-per-s (your shared storage's aggregate bandwidth)"
        bigger = f"measure larger ckptsim bench --sizes, or {fix}"
        if storage is not None:  # given: it bounds what the extrapolation can claim
            fix = f"the storage cap given, {storage / 1e9:,.4g} GB/s, bounds it"
            bigger = f"measure larger ckptsim bench --sizes ({fix})"
        warnings: list[str] = []
        # A format measured with parallel writers has its own curve; any other meets the raw
        # disk's (the same N writers with plain writes), which bounds every format on it.
        curve = self.contention.get(format, self.contention.get("raw"))
        measured = max(curve.writers) if curve else 1
        if curve is None:
            aggregate = math.inf  # each node at the single-writer line (applied by the caller)
        elif nodes <= EXTRAPOLATION_WARN * measured:
            aggregate = curve.aggregate_bytes_per_s(nodes)
        else:
            aggregate = curve.aggregate_bytes_per_s(measured) / measured * nodes
        if nodes > EXTRAPOLATION_WARN * measured:
            how = (
                f"past them each writer is assumed to keep the per-writer bandwidth measured at "
                f"{measured}, up to the shared storage's cap"
                if curve
                else "each is assumed to write as this machine's one writer did, up to the "
                "shared storage's cap"
            )
            warnings.append(
                f"{nodes:,} parallel writers is {nodes / measured:,.0f}x the {measured} measured "
                f"({how}); {fix}"
                + ("" if curve else ", and measure writers with ckptsim bench --writers 1,2,4,8")
            )
        largest = max(
            [
                s["bytes"]
                for s in self.samples
                if s.get("format") == format and s.get("bench") != "writers"
            ]
            + ([curve.max_shard_bytes] if curve else [])
            or [0.0]
        )
        if largest and shard > EXTRAPOLATION_WARN * largest:
            warnings.append(
                f"each writer's shard ({shard / 1e9:,.3g} GB) is {shard / largest:,.0f}x the "
                f"largest size measured ({largest / 1e9:.3g} GB); {bigger}"
            )
        if storage is None:
            storage = DEFAULT_STORAGE_BYTES_PER_S
            if nodes > 1:
                warnings.append(
                    f"no storage cap given: {storage / 1e12:g} TB/s aggregate assumed "
                    f"({DEFAULT_STORAGE_SOURCE}); {fix}"
                )
        return min(aggregate, storage), warnings


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
