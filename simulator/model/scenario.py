"""Scenarios: one training job on one cluster — the inputs every ckptsim answer starts from.

A scenario is a frozen dataclass, read from a flat TOML file whose keys are the field names
(``gpus = 16384``, ``gpu_mtbf_h = 50677``); command-line flags override file values. Presets
(Llama 3, OPT-175B, BLOOM-176B, Titan) are TOML files shipped in ``simulator/presets/`` with
their sources in comments; ``load_scenario("llama3")`` reads one by name.
Field names carry their units; ``*_s`` properties give SI seconds. The job's failure rate is
derived in one place, ``Scenario.failure_rate_per_s`` (GPU and node-level failures), which
``system_mtbf_s`` inverts; closed forms, engines and the controller's prior all read it.

Every number must be finite and lie in a documented range (``MAX_GPUS``, ``MIN_SECONDS`` to
``MAX_HOURS``, ``MAX_USD``, ``MAX_BYTES``; failure shapes in ``failures.SHAPE_RANGE``): wide
enough for any real job, narrow enough that every answer is a finite number of the right unit.

``[[tier]]`` and ``[[failure_class]]`` tables (``simulator.model.tiers``) add checkpoint tiers and
failure classes; without them a scenario is one tier and one class, as it always was.
"""

from __future__ import annotations

import dataclasses
import tomllib
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

from simulator.errors import InputError
from simulator.model.failures import Lifetime, empirical_path, parse_failure
from simulator.model.limits import (  # noqa: F401 (re-exported: the ranges were defined here)
    MAX_BYTES,
    MAX_GPUS,
    MAX_HOURS,
    MAX_USD,
    MIN_SECONDS,
)
from simulator.model.limits import check as check_range
from simulator.model.tiers import (
    FailureClass,
    Tier,
    parse_classes,
    parse_tiers,
    scheduled,
    write_time_s,
)

__all__ = [
    "DEFAULT_PRESET",
    "DEFAULT_STORAGE_BYTES_PER_S",
    "IMPLICIT_CLASS",
    "Scenario",
    "load_scenario",
    "preset_names",
]

DEFAULT_PRESET = "llama3"
IMPLICIT_CLASS = "failure"
"""The class name a tier's ``survives`` uses for the scenario's own failures (no classes)."""
# TOML table names -> Scenario fields (a table per tier reads better as [[tier]]).
_TABLES = {"tier": "tiers", "failure_class": "failure_classes"}
OWN_SAVE_FIELDS = {
    "checkpoint_s": "checkpoint_s",
    "async_checkpoint": "async = true",
    "staging_s": "staging_s",
    "write_bytes_per_s_per_node": "write_bytes_per_s_per_node",
    "storage_bytes_per_s": "storage_bytes_per_s",
    "read_bytes_per_s": "restore_s",
    "checkpoints_retained": "retention",
}
"""The scenario's own save (field -> what each [[tier]] table sets instead): with [[tier]]
tables each tier has its own, so these are refused beside them, never silently ignored.
``checkpoint_bytes`` is not among them: beside tiers it is the size of one checkpoint, which
prices the storage of the tiers that hold one (``tier_plan.storage_usd_per_day``)."""

DEFAULT_STORAGE_BYTES_PER_S = 2e12
"""Aggregate bandwidth of shared checkpoint storage when none is given, bytes per second.

Source: Llama Team, AI @ Meta, "The Llama 3 Herd of Models", arXiv:2407.21783 (2024), §3.3.1:
Tectonic, the file system behind 16,384-H100 pre-training, "supports a sustainable throughput
of 2 TB/s and a peak throughput of 7 TB/s". The sustained figure is used: without a cap, a
job's nodes would each be assumed to have a disk of their own and 16,384 GPUs would save a
405B model (5.7 TB) in well under a second; at 2 TB/s it takes 2.8 s of pure I/O."""
DEFAULT_STORAGE_SOURCE = "Llama 3 (arXiv:2407.21783, §3.3.1): Tectonic sustains 2 TB/s"


# The ranges every number lies in, one rule for the scenario, its tiers and its classes.
_check_positive = check_range


@dataclass(frozen=True, kw_only=True)
class Scenario:
    """One training job on one cluster."""

    name: str = "custom"
    """A label for reports."""
    gpus: int | None = None
    """GPUs the job runs on."""
    gpus_per_node: int = 8
    """GPUs per node (a node is the unit that is rescheduled onto a spare)."""
    failure: str = "exponential"
    """Per-GPU lifetime family: ``exponential``, ``weibull:shape=K`` or ``lognormal:sigma=S``."""
    gpu_mtbf_h: float | None = None
    """Mean time between failures of one GPU, hours (system MTBF = this / gpus)."""
    mtbf_h: float | None = None
    """Mean time between failures of the whole job, hours, every cause included; exclusive with
    ``gpu_mtbf_h`` and ``node_mtbf_h`` (which build the job's rate from its parts)."""
    checkpoint_s: float = 60.0
    """Training stall of one checkpoint save, seconds (δ)."""
    restart_s: float = 600.0
    """Time from a failure until training runs again, seconds (R)."""
    work_h: float | None = None
    """Failure-free compute time the job needs, hours (Ts)."""
    usd_per_gpu_hour: float | None = None
    """Price of one GPU-hour, US dollars."""
    checkpoint_bytes: float | None = None
    """Size of one complete checkpoint, bytes (for storage cost and load time)."""
    usd_per_gb_month: float | None = None
    """Storage price, US dollars per GB (1e9 bytes) per month."""
    checkpoints_retained: int = 2
    """Checkpoints kept on storage at once (storage cost)."""

    # -- discrete-event model (``ckptsim simulate``); defaults reproduce Daly's model --------
    detection_s: float = 0.0
    """Time from a failure until it is noticed, seconds (added to ``restart_s``)."""
    warmup_s: float = 0.0
    """Time after loading a checkpoint until training is at full speed again, seconds."""
    spares: int | None = None
    """Spare nodes on hand to replace a failed one (None: a spare is always free at once)."""
    repair_h: float | None = None
    """Mean time to repair a failed node and return it to the spare pool, hours."""
    repair: str = "exponential"
    """Repair-time family: ``exponential``, ``weibull:shape=K`` or ``lognormal:sigma=S``."""
    async_checkpoint: bool = False
    """Save asynchronously: training stalls only for the staging copy, the write runs behind."""
    staging_s: float | None = None
    """Training stall of an asynchronous save (copy to host memory), seconds."""
    write_bytes_per_s_per_node: float | None = None
    """Checkpoint write bandwidth of one node to shared storage, bytes per second."""
    storage_bytes_per_s: float | None = None
    """Aggregate write bandwidth of the shared storage, bytes per second (None: a per-node
    bandwidth is capped at :data:`DEFAULT_STORAGE_BYTES_PER_S`)."""
    writer_nodes: int | None = None
    """Nodes that write shards of a checkpoint at once (None: every node of the job)."""
    read_bytes_per_s: float | None = None
    """Aggregate bandwidth at which a restarted job loads its checkpoint, bytes per second."""
    node_mtbf_h: float | None = None
    """Mean time between node-level failures (host, NIC, power) of one node, hours; these come
    on top of the GPUs' failures (a node of ``gpus_per_node`` GPUs fails as a whole)."""
    component_age: str = "stationary"
    """Component ages at job start: ``stationary`` (a cluster long in service) or ``new``."""
    tiers: tuple[Tier, ...] = ()
    """Checkpoint tiers (TOML ``[[tier]]``); empty: one tier with the fields above."""
    failure_classes: tuple[FailureClass, ...] = ()
    """Failure classes (TOML ``[[failure_class]]``); empty: one class from the fields above."""

    def __post_init__(self):
        if not isinstance(self.name, str) or not self.name:
            raise InputError(f"name must be a non-empty string, got {self.name!r}")
        for name in ("gpus", "gpus_per_node", "checkpoints_retained"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{name} must be a whole number, got {value!r}")
            _check_positive(name, value, "checkpoints" if name[0] == "c" else "GPUs")
        _check_positive("gpu_mtbf_h", self.gpu_mtbf_h, "hours")
        _check_positive("mtbf_h", self.mtbf_h, "hours")
        _check_positive("checkpoint_s", self.checkpoint_s, "seconds")
        _check_positive("restart_s", self.restart_s, "seconds", allow_zero=True)
        _check_positive("work_h", self.work_h, "hours")
        _check_positive("usd_per_gpu_hour", self.usd_per_gpu_hour, "US dollars", allow_zero=True)
        _check_positive("checkpoint_bytes", self.checkpoint_bytes, "bytes")
        _check_positive("usd_per_gb_month", self.usd_per_gb_month, "US dollars", allow_zero=True)
        if self.gpu_mtbf_h is not None and self.mtbf_h is not None:
            raise InputError("give either mtbf_h (system) or gpu_mtbf_h (per GPU), not both")
        if self.gpu_mtbf_h is not None and self.gpus is None:
            raise InputError("gpu_mtbf_h (per-GPU MTBF) needs gpus to scale to the cluster")
        if self.gpus is not None and self.gpus_per_node > self.gpus:
            raise InputError(f"gpus_per_node ({self.gpus_per_node}) exceeds gpus ({self.gpus})")
        parse_failure(self.failure, 3600.0)  # validates the family spec early
        self._validate_des_fields()  # node_mtbf_h's own rules first: the job's rate uses it
        self._validate_tiers()
        if self.has_mtbf and self.system_mtbf_s < MIN_SECONDS:
            raise InputError(
                f"the job's MTBF (gpu_mtbf_h / gpus) is {self.system_mtbf_s:.3g} s, under "
                f"{MIN_SECONDS:g} s"
            )

    def _validate_tiers(self) -> None:
        # Lists from TOML become tuples, so the scenario stays hashable and frozen.
        object.__setattr__(self, "tiers", parse_tiers(self.tiers))
        if self.tiers and not self.tiers[0].implicit:
            given = [  # those without a default value to tell apart (from_mapping: all)
                k
                for k in ("staging_s", "write_bytes_per_s_per_node", "storage_bytes_per_s",
                          "read_bytes_per_s")
                if getattr(self, k) is not None
            ] + (["async_checkpoint"] if self.async_checkpoint else [])  # fmt: skip
            if given:
                raise InputError(own_save_beside_tiers(given[0]))
        object.__setattr__(self, "failure_classes", parse_classes(self.failure_classes))
        if self.failure_classes and (
            self.gpu_mtbf_h is not None or self.mtbf_h is not None or self.node_mtbf_h is not None
        ):
            raise InputError(
                "with [[failure_class]] tables the classes are the failure model: drop the "
                "scenario's gpu_mtbf_h, node_mtbf_h and mtbf_h"
            )
        for c in self.failure_classes:
            c.components(self.gpus, self.nodes)  # a per-GPU/node class needs the counts
            if self.nodes is not None and c.nodes_lost > self.nodes:
                raise InputError(
                    f"failure_class {c.name!r}: nodes_lost = {c.nodes_lost} is more than the "
                    f"job's {self.nodes:,} nodes ({self.gpus:,} GPUs, {self.gpus_per_node} per "
                    "node)"
                )
        if self.async_checkpoint and self.staging_s is not None and not self.tiers:
            write = self.checkpoint_write_s
            if self.staging_s > write:
                raise InputError(
                    f"staging_s = {self.staging_s:g} s is longer than the whole write, "
                    f"{write:g} s (checkpoint_s, or checkpoint_bytes over the bandwidths): an "
                    "async save cannot stall training longer than a synchronous one (lower "
                    "staging_s, or leave it out for a synchronous save)"
                )
        for t in self.tiers:
            if t.asynchronous and t.checkpoint_s is not None and t.staging_s > t.checkpoint_s:
                raise InputError(
                    f"tier {t.name!r}: staging_s = {t.staging_s:g} s is longer than the whole "
                    f"write, checkpoint_s = {t.checkpoint_s:g} s: an async save cannot stall "
                    "training longer than a synchronous one (drop async or fix staging_s)"
                )
        if self.failure_classes and (not self.tiers or self.tiers[0].implicit):
            # Classes without tiers: the scenario's own save is the one tier, and every class
            # rolls back to it (each with its own detection and restart). Without this the
            # classes' recoveries were ignored by optimize and simulate found no failure rate.
            # Built again at every validation, so flags laid over the file reach it.
            object.__setattr__(self, "tiers", (self._own_save_as_a_tier(),))
        elif self.tiers and self.tiers[0].implicit:
            object.__setattr__(self, "tiers", ())  # the classes that made it are gone
        names = {c.name for c in self.failure_classes} or {IMPLICIT_CLASS}
        saved = {t.name for t in scheduled(self.tiers)}
        for t in self.tiers:
            if t.into is not None and t.into not in saved:
                raise InputError(
                    f"tier {t.name!r}: into = {t.into!r} names no tier saved on a schedule "
                    f"({', '.join(sorted(saved)) or 'none'})"
                )
        for t in self.tiers:
            unknown = sorted(t.survives - names)
            if unknown:
                raise InputError(
                    f"tier {t.name!r} survives unknown failure class {unknown[0]!r} "
                    f"(classes: {', '.join(sorted(names))})"
                )

    def _own_save_as_a_tier(self) -> Tier:
        """The scenario's save as one persistent tier surviving every class: its write time is
        the scenario's own (``checkpoint_write_s``: bytes, bandwidths, writer nodes and the
        default storage cap, one rule), its restore the scenario's load time."""
        tier = Tier(
            name="persistent",
            survives=frozenset(c.name for c in self.failure_classes),
            checkpoint_s=self.checkpoint_write_s,
            restore_s=self.load_s,
            asynchronous=self.async_checkpoint,
            staging_s=self.staging_s,
            retention=self.checkpoints_retained or 1,
        )
        object.__setattr__(tier, "implicit", True)
        return tier

    def _validate_des_fields(self) -> None:
        for name in ("spares", "writer_nodes"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int)):
                raise InputError(f"{name} must be a whole number, got {value!r}")
        _check_positive("spares", self.spares, "nodes", allow_zero=True)
        _check_positive("writer_nodes", self.writer_nodes, "nodes")
        _check_positive("detection_s", self.detection_s, "seconds", allow_zero=True)
        _check_positive("warmup_s", self.warmup_s, "seconds", allow_zero=True)
        _check_positive("repair_h", self.repair_h, "hours")
        _check_positive("staging_s", self.staging_s, "seconds")
        for name in ("write_bytes_per_s_per_node", "storage_bytes_per_s", "read_bytes_per_s"):
            _check_positive(name, getattr(self, name), "bytes per second")
        _check_positive("node_mtbf_h", self.node_mtbf_h, "hours")
        if not isinstance(self.async_checkpoint, bool):
            raise InputError(
                f"async_checkpoint must be true or false, got {self.async_checkpoint!r}"
            )
        if self.async_checkpoint and self.staging_s is None:
            raise InputError("async_checkpoint needs staging_s (the training stall of a save)")
        if self.spares is not None and self.repair_h is None:
            raise InputError(
                "spares (a finite spare pool) needs repair_h (mean repair time, hours)"
            )
        parse_failure(self.repair, 3600.0)
        if self.component_age not in ("stationary", "new"):
            raise InputError(
                f"component_age must be 'stationary' or 'new', got {self.component_age!r}"
            )
        if self.node_mtbf_h is not None and self.gpus is None:
            raise InputError("node_mtbf_h (per-node MTBF) needs gpus to count the nodes")
        if self.node_mtbf_h is not None and self.mtbf_h is not None:
            raise InputError(
                "mtbf_h is the whole job's MTBF, node failures included; to add node_mtbf_h "
                "give the GPUs' rate as gpu_mtbf_h instead"
            )
        nodes = self.nodes
        if self.writer_nodes is not None and nodes is not None and self.writer_nodes > nodes:
            raise InputError(f"writer_nodes ({self.writer_nodes}) exceeds the job's {nodes} nodes")
        derived = (("write", self.checkpoint_write_s), ("load", self.load_s))
        for name, value in derived:
            if value > MAX_HOURS * 3600.0:
                raise InputError(
                    f"a checkpoint {name} of {value:.3g} s (checkpoint_bytes over the bandwidth) "
                    f"exceeds {MAX_HOURS:g} hours"
                )

    # -- derived values (seconds) -------------------------------------------------------
    @property
    def has_mtbf(self) -> bool:
        return self.mtbf_h is not None or self.gpu_mtbf_h is not None or bool(self.failure_classes)

    @property
    def failure_rate_per_s(self) -> float:
        """Long-run rate of the failures that stop the job, per second.

        The one place the job's rate is derived: the GPUs' rate (``gpus / gpu_mtbf_h``, or the
        job-level ``mtbf_h``) plus the nodes' (``nodes / node_mtbf_h``). Each part is a
        superposition of renewal processes, whose long-run rate is count / mean whatever the
        lifetime family (renewal theorem, ``failures.long_run_rate``), so the sum holds for
        every family. The
        closed forms, both engines, the policies' context and the controller's prior read it.
        With failure classes it is the sum of the classes' rates (they superpose).
        """
        if self.failure_classes:
            return sum(c.rate_per_s(self.gpus, self.nodes) for c in self.failure_classes)
        return self.gpu_failure_rate_per_s + self.node_failure_rate_per_s

    @property
    def gpu_failure_rate_per_s(self) -> float:
        """Long-run rate of GPU failures (or of all failures, given ``mtbf_h``), per second."""
        if self.mtbf_h is not None:
            return 1.0 / (self.mtbf_h * 3600.0)
        if self.gpu_mtbf_h is not None:
            return self.gpus / (self.gpu_mtbf_h * 3600.0)
        raise InputError("no failure rate: give mtbf_h, or gpus and gpu_mtbf_h")

    @property
    def node_failure_rate_per_s(self) -> float:
        """Long-run rate of node-level failures, per second (0 without ``node_mtbf_h``)."""
        return 0.0 if self.node_mtbf_h is None else self.nodes / (self.node_mtbf_h * 3600.0)

    @property
    def system_mtbf_s(self) -> float:
        """Long-run mean time between failures of the job (GPU and node failures), seconds."""
        return 1.0 / self.failure_rate_per_s

    @property
    def gpu_mtbf_s(self) -> float:
        """Mean lifetime of one GPU, seconds (from the job's MTBF when only that is given)."""
        if self.gpu_mtbf_h is not None:
            return self.gpu_mtbf_h * 3600.0
        if self.gpus is None:
            raise InputError("a per-GPU failure model needs gpus")
        return self.gpus / self.gpu_failure_rate_per_s

    @property
    def nodes(self) -> int | None:
        """Nodes the job occupies (a partly filled node counts as one)."""
        return None if self.gpus is None else -(-self.gpus // self.gpus_per_node)

    @property
    def checkpoint_write_s(self) -> float:
        """Time to write one checkpoint, seconds.

        With ``checkpoint_bytes`` and a bandwidth, the shards go out from ``writer_nodes``
        nodes at once, each capped at ``write_bytes_per_s_per_node`` and all together at
        ``storage_bytes_per_s`` (:data:`DEFAULT_STORAGE_BYTES_PER_S` when not given); otherwise
        it is ``checkpoint_s``.
        """
        per_node, total = self.write_bytes_per_s_per_node, self.storage_bytes_per_s
        if self.checkpoint_bytes is None or (per_node is None and total is None):
            return float(self.checkpoint_s)
        writers = self.writer_nodes or self.nodes or 1
        if total is None:  # many nodes still share one storage system (see the default's source)
            total = DEFAULT_STORAGE_BYTES_PER_S
        return write_time_s(self.checkpoint_bytes, per_node, total, writers)

    @property
    def save_stall_s(self) -> float:
        """Training stall of one save, seconds (δ): the staging copy if asynchronous."""
        return float(self.staging_s) if self.async_checkpoint else self.checkpoint_write_s

    @property
    def background_write_s(self) -> float:
        """The write an asynchronous save runs behind its stall, seconds (0 when saves block:
        the write is the stall)."""
        return self.checkpoint_write_s if self.async_checkpoint else 0.0

    @property
    def load_s(self) -> float:
        """Time to load a checkpoint on restart, seconds (0 when no read bandwidth is given)."""
        if self.checkpoint_bytes is None or self.read_bytes_per_s is None:
            return 0.0
        return float(self.checkpoint_bytes / self.read_bytes_per_s)

    @property
    def recovery_s(self) -> float:
        """Failure-free time from a failure until training again, seconds, spares permitting."""
        return float(self.detection_s + self.restart_s + self.load_s + self.warmup_s)

    @property
    def work_s(self) -> float | None:
        return None if self.work_h is None else self.work_h * 3600.0

    def gpu_lifetime(self) -> Lifetime:
        """The per-GPU lifetime distribution."""
        return parse_failure(self.failure, self.gpu_mtbf_s)

    def system_lifetime(self) -> Lifetime:
        """The job's time-between-failures model when the cluster is treated as one unit."""
        return parse_failure(self.failure, self.system_mtbf_s)

    def node_lifetime(self) -> Lifetime | None:
        """The lifetime of one node against node-level failures (None without node_mtbf_h)."""
        if self.node_mtbf_h is None:
            return None
        return parse_failure(self.failure, self.node_mtbf_h * 3600.0)

    # -- construction -------------------------------------------------------------------
    def with_overrides(self, **overrides: Any) -> Scenario:
        """A copy with the given non-None fields replaced (command-line flags over a file).

        Setting one of ``mtbf_h``/``gpu_mtbf_h`` clears the other, so a flag can switch
        a file's per-GPU rate to a system rate; ``mtbf_h`` (every cause) clears the file's
        ``node_mtbf_h`` too.
        """
        given = {k: v for k, v in overrides.items() if v is not None}
        if "mtbf_h" in given and "gpu_mtbf_h" not in given:
            given["gpu_mtbf_h"] = None
        if "mtbf_h" in given and "node_mtbf_h" not in given:
            given["node_mtbf_h"] = None
        if "gpu_mtbf_h" in given and "mtbf_h" not in given:
            given["mtbf_h"] = None
        return dataclasses.replace(self, **given)

    @classmethod
    def from_mapping(cls, data: dict[str, Any], source: str = "scenario") -> Scenario:
        known = {f.name for f in dataclasses.fields(cls)} - set(_TABLES.values()) | set(_TABLES)
        unknown = sorted(set(data) - known)
        if unknown:
            raise InputError(
                f"{source}: unknown field {unknown[0]!r} (known: {', '.join(sorted(known))})"
            )
        explicit = [k for k in OWN_SAVE_FIELDS if k in data]
        if data.get("tier") and explicit:
            raise InputError(f"{source}: {own_save_beside_tiers(explicit[0])}")
        data = {_TABLES.get(k, k): v for k, v in data.items()}
        try:
            return cls(**data)
        except InputError as exc:
            raise InputError(f"{source}: {exc}") from None

    @classmethod
    def from_toml(cls, path: str | Path) -> Scenario:
        path = Path(path)
        try:
            text = path.read_text(encoding="utf-8-sig")  # a byte-order mark, as some editors write
        except OSError as exc:
            raise InputError(f"cannot read scenario file {path}: {exc.strerror}") from None
        except UnicodeDecodeError:
            raise InputError(f"{path}: not a UTF-8 text file (a TOML scenario is)") from None
        try:
            data = tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise InputError(f"{path}: malformed TOML ({exc})") from None
        data.setdefault("name", path.stem)
        _paths_from(data, path.parent)
        return cls.from_mapping(data, source=str(path))

    def to_dict(self) -> dict[str, Any]:
        """The fields given, as a TOML file would hold them (tiers as ``tier`` tables)."""
        out = {
            k: v
            for k, v in dataclasses.asdict(self).items()
            if v is not None and k not in _TABLES.values()
        }
        if self.tiers and not self.tiers[0].implicit:  # as the user wrote it: no made-up tier
            out["tier"] = [_table(t, {"asynchronous": "async"}) for t in self.tiers]
            for k in OWN_SAVE_FIELDS:  # the tiers have their own: only defaults are left here
                out.pop(k, None)
        if self.failure_classes:
            out["failure_class"] = [_table(c, {}) for c in self.failure_classes]
        return out


def own_save_beside_tiers(field: str) -> str:
    """Why a scenario-level save field is refused beside [[tier]] tables, in one line."""
    return (
        f"{field} describes the scenario's own save, which its [[tier]] tables replace: each "
        f"tier sets its own ({OWN_SAVE_FIELDS[field]} in its [[tier]] table); drop {field}"
    )


def _paths_from(data: dict[str, Any], folder: Path) -> None:
    """A file's ``empirical:PATH`` specs name PATH relative to the file's folder, as a person
    writing it next to the log expects, not to wherever ckptsim runs (absolute paths as given).
    """
    classes = data.get("failure_class", [])
    if isinstance(classes, dict):
        classes = [classes]
    listed = classes if isinstance(classes, list) else []  # anything else: refused as a value
    tables = [data, *(t for t in listed if isinstance(t, dict))]
    for table in tables:
        for key in ("failure", "repair", "detection"):
            spec = table.get(key)
            path = empirical_path(spec) if isinstance(spec, str) else None
            if path:
                target = Path(path).expanduser()
                if not target.is_absolute():
                    table[key] = f"empirical:{folder / target}"


def _table(obj, renames: dict[str, str]) -> dict[str, Any]:
    out = {}
    internal = {f.name for f in dataclasses.fields(obj) if not f.init}
    for k, v in dataclasses.asdict(obj).items():
        if v is not None and k not in internal:
            out[renames.get(k, k)] = sorted(v) if isinstance(v, frozenset) else v
    return out


def preset_names() -> list[str]:
    """Names of the shipped presets."""
    folder = resources.files("simulator") / "presets"
    return sorted(p.name[: -len(".toml")] for p in folder.iterdir() if p.name.endswith(".toml"))


def load_scenario(name_or_path: str | Path | None = None) -> Scenario:
    """A preset by name (``llama3``), or a TOML file by path; None gives the default preset."""
    if name_or_path is None:
        name_or_path = DEFAULT_PRESET
    text = str(name_or_path)
    if text in preset_names():
        with resources.as_file(resources.files("simulator") / "presets" / f"{text}.toml") as p:
            return Scenario.from_toml(p)
    path = Path(text)
    if not path.exists():
        raise InputError(
            f"scenario {text!r} is neither a file nor a preset ({', '.join(preset_names())})"
        )
    return Scenario.from_toml(path)
