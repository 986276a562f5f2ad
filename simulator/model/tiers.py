"""Failure classes and checkpoint tiers: which failures a saved copy survives, and at what cost.

A *failure class* is one kind of interruption with its own lifetime model (per GPU, per node
or for the whole job, any family ``simulator.model.failures`` parses), detection time (fixed,
or drawn from any such family with ``detection_s`` as its mean), restart cost, the number of
nodes it takes down (0 for a crashed process whose host survives), and optionally bursts
(each failure followed by a random number of further ones within a window). The classes
superpose: the job's failure rate is the sum of theirs.

A *tier* is one place a checkpoint goes — host memory, a peer's memory, shared storage — with
its save stall (or bytes and bandwidth), restore time, retention, and the set of classes its
copy survives. A tier is saved every so many seconds of compute (its interval), or just in
time after a failure (``jit``), or after every training step (``every_step``, with a stall per
step). A failure of class c rolls the job back to the newest completed checkpoint in any tier
that survives c; ``served_by`` says which tier that is for the first-order closed form
(``simulator.model.tier_plan``): a just-in-time tier, else an every-step tier, else the
cheapest scheduled tier that survives c ("the tier c needs"). A just-in-time save written
``into`` a scheduled tier is a copy there too (``jit_copies``), which restarts the interval of
every tier it covers (``refreshed_by``): the DES and the closed forms both follow these.

A scenario without tiers or classes is today's single-tier, single-class model, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from functools import lru_cache
from typing import Any

from simulator.errors import InputError
from simulator.model.failures import Lifetime, parse_failure
from simulator.model.limits import check as check_range

__all__ = [
    "FailureClass",
    "Tier",
    "covers",
    "default_process_share",
    "failure_cost_s",
    "final_save_s",
    "final_tiers",
    "interval_origin",
    "jit_copies",
    "jit_tier",
    "parse_classes",
    "parse_tiers",
    "refreshed_by",
    "rollback",
    "save_writers",
    "scheduled",
    "served_by",
    "split_mtbf",
    "step_overhead",
    "step_tier",
    "with_measured_tier",
    "write_time_s",
]

BURST_COUNTS = ("poisson", "geometric")
"""Distributions of a burst's follow-up count (``FailureClass.burst_count``)."""
MAX_FOLLOWUPS = 1000.0
"""Most follow-ups a burst may average: past it a burst is a failure storm, not a burst."""


def _number(owner: str, name: str, value, unit: str, *, allow_zero: bool = False) -> None:
    """A finite number in its unit's range, the scenario's own rule (``limits.check``)."""
    try:
        check_range(name, value, unit, allow_zero=allow_zero)
    except InputError as exc:
        raise InputError(f"{owner}: {exc}") from None


SUMMARY_STATS = ("mean", "std", "ci95", "p50", "p90", "p99")
"""The statistics a run's summary gives each record column (``engines.results.describe``), as
``<column>_<stat>`` keys."""
RESERVED_CLASS_NAMES = frozenset({"in_recovery"})
"""Class names whose per-class column is already a column of every record
(``failures_in_recovery``, ``engines.results.METRICS``)."""


def _name(kind: str, value) -> str:
    """A tier's or class's name: a label the record's columns (``failures_<class>``,
    ``saves_<tier>``), their summary keys (``<column>_mean``) and the flags that take
    ``NAME=VALUE`` (``--tier-interval-s``, ``--cause-class``) can all tell apart."""
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"every [[{kind}]] needs a non-empty name, got {value!r}")
    if "=" in value:
        raise InputError(
            f"[[{kind}]] {value!r}: a name may not hold '=' (flags name it as NAME=VALUE)"
        )
    stat = next((s for s in SUMMARY_STATS if value == s or value.endswith("_" + s)), None)
    if stat is not None:
        raise InputError(
            f"[[{kind}]] {value!r}: a name may not be or end in '_{stat}' (a run's summary adds "
            f"_{stat} to each column, so two keys would clash); rename it"
        )
    if kind == "failure_class" and value in RESERVED_CLASS_NAMES:
        raise InputError(
            f"[[failure_class]] {value!r}: failures_{value} is already a column of every run's "
            "record; rename the class"
        )
    return value


@lru_cache(maxsize=1)
def default_process_share() -> float:
    """The share of failures whose host survives, without other information: Llama 3 405B's
    (the ``llama3-mix`` preset, from the paper's Table 5: classes with ``nodes_lost = 0``)."""
    from simulator.model.scenario import load_scenario

    mix = load_scenario("llama3-mix")
    rates = [(c.nodes_lost, c.rate_per_s(mix.gpus, mix.nodes)) for c in mix.failure_classes]
    return sum(r for lost, r in rates if lost == 0) / sum(r for _, r in rates)


def split_mtbf(mtbf_s: float) -> tuple[float, float]:
    """A job's MTBF, seconds, split into the MTBFs of failures its hosts survive (a process
    crash) and of node losses, at ``default_process_share``: (process, node) seconds, whose
    rates add up to the job's."""
    share = default_process_share()
    return mtbf_s / share, mtbf_s / (1.0 - share)


def write_time_s(nbytes: float, per_node: float | None, total: float | None, writers: int) -> float:
    """Seconds to write ``nbytes`` from ``writers`` nodes, each capped at ``per_node`` bytes/s
    and all together at ``total`` bytes/s (a missing cap does not bind)."""
    rate = min(writers * per_node if per_node else math.inf, total or math.inf)
    return float(nbytes / rate)


@dataclass(frozen=True, kw_only=True)
class FailureClass:
    """One kind of failure: how often it strikes, how long it takes to notice and recover."""

    name: str
    """A label (tiers name it in ``survives``)."""
    failure: str = "exponential"
    """Lifetime family: ``exponential``, ``weibull:shape=K`` or ``lognormal:sigma=S``."""
    gpu_mtbf_h: float | None = None
    """Mean time between failures of this class per GPU, hours (scales with the GPU count)."""
    node_mtbf_h: float | None = None
    """Mean time between failures of this class per node, hours (scales with the node count)."""
    mtbf_h: float | None = None
    """Mean time between failures of this class for the whole job, hours."""
    detection_s: float = 0.0
    """Time from the failure until it is noticed, seconds (e.g. a collective's timeout)."""
    restart_s: float | None = None
    """Time to reschedule and restart after detection, seconds (None: the scenario's)."""
    nodes_lost: int = 1
    """Nodes the failure takes down and a spare must replace (0: the host survives)."""
    detection: str | None = None
    """Detection-time family, spelled as ``failure`` (``exponential``, ``weibull:shape=K``,
    ``lognormal:sigma=S`` or ``empirical:FILE``), with mean ``detection_s``: each failure's
    detection time is drawn from it. None: every failure is noticed after exactly
    ``detection_s``. The first-order plan uses the mean."""
    burst_followups: float = 0.0
    """Mean number of further failures of this class that follow each one its lifetime model
    gives (a burst; 0: none). The lifetime fields give when bursts start, so the class fails
    (1 + burst_followups) times as often as they alone say."""
    burst_count: str = "poisson"
    """Distribution of a burst's follow-up count, with mean ``burst_followups``: ``poisson``,
    or ``geometric`` (more bursts with none and more with many)."""
    burst_window_s: float | None = None
    """A burst's follow-ups strike at uniform times within this many seconds after its first
    failure (needed with ``burst_followups``)."""

    def __post_init__(self):
        owner = f"failure_class {_name('failure_class', self.name)!r}"
        given = [k for k in ("gpu_mtbf_h", "node_mtbf_h", "mtbf_h") if getattr(self, k) is not None]
        if len(given) != 1:
            raise InputError(
                f"{owner}: give exactly one of gpu_mtbf_h, node_mtbf_h or mtbf_h (hours), "
                f"got {', '.join(given) or 'none'}"
            )
        for k in given:
            _number(owner, k, getattr(self, k), "hours")
        _number(owner, "detection_s", self.detection_s, "seconds", allow_zero=True)
        _number(owner, "restart_s", self.restart_s, "seconds", allow_zero=True)
        if isinstance(self.nodes_lost, bool) or not isinstance(self.nodes_lost, int):
            raise InputError(f"{owner}: nodes_lost must be a whole number, got {self.nodes_lost!r}")
        _number(owner, "nodes_lost", self.nodes_lost, "nodes", allow_zero=True)
        try:
            parse_failure(self.failure, 3600.0)
        except InputError as exc:
            raise InputError(f"{owner}: {exc}") from None
        self._check_detection(owner)
        self._check_bursts(owner)

    def _check_detection(self, owner: str) -> None:
        if self.detection is None:
            return
        if not isinstance(self.detection, str):
            raise InputError(
                f"{owner}: detection must be a distribution such as 'lognormal:sigma=1', "
                f"got {self.detection!r}"
            )
        if not self.detection_s > 0:
            raise InputError(
                f"{owner}: detection = {self.detection!r} needs detection_s > 0, its mean in "
                "seconds"
            )
        try:
            self.detection_times()
        except InputError as exc:
            raise InputError(f"{owner}: detection: {exc}") from None

    def _check_bursts(self, owner: str) -> None:
        _number(owner, "burst_followups", self.burst_followups, "failures", allow_zero=True)
        _number(owner, "burst_window_s", self.burst_window_s, "seconds")
        if self.burst_followups > MAX_FOLLOWUPS:
            raise InputError(
                f"{owner}: burst_followups must be at most {MAX_FOLLOWUPS:g} failures, got "
                f"{self.burst_followups!r}"
            )
        if self.burst_count not in BURST_COUNTS:
            raise InputError(
                f"{owner}: burst_count must be {' or '.join(BURST_COUNTS)}, got "
                f"{self.burst_count!r}"
            )
        if self.burst_followups > 0 and self.burst_window_s is None:
            raise InputError(
                f"{owner}: burst_followups needs burst_window_s, the seconds after a burst's "
                "first failure within which its follow-ups strike"
            )
        if self.burst_followups == 0 and self.burst_window_s is not None:
            raise InputError(
                f"{owner}: burst_window_s needs burst_followups > 0 (the mean number of "
                "further failures in a burst)"
            )

    def detection_times(self) -> Lifetime | None:
        """The distribution each failure's detection time is drawn from (None: fixed)."""
        if self.detection is None:
            return None
        return parse_failure(self.detection, self.detection_s)

    def followups(self, rng) -> int:
        """A burst's follow-up count, drawn with ``rng`` (mean ``burst_followups``)."""
        m = self.burst_followups
        if self.burst_count == "poisson":
            return int(rng.poisson(m))
        return int(rng.geometric(1.0 / (1.0 + m))) - 1  # failures before the first success

    @property
    def burst_span_s(self) -> float:
        """Expected time from a burst's first failure to its last, seconds: the last of N
        uniform follow-ups lies at window·N/(N+1) on average, so this is window·E[N/(N+1)]
        (Poisson mean m: 1 − (1 − e^−m)/m; geometric: 1 − ln(1 + m)/m). 0 without bursts."""
        m = self.burst_followups
        if not m > 0:
            return 0.0
        if self.burst_count == "poisson":
            share = 1.0 + math.expm1(-m) / m
        else:
            share = 1.0 - math.log1p(m) / m
        return float(self.burst_window_s * share)

    def components(self, gpus: int | None, nodes: int | None) -> int:
        """How many independently failing units this class's MTBF is given for."""
        if self.mtbf_h is not None:
            return 1
        count = gpus if self.gpu_mtbf_h is not None else nodes
        if count is None:
            unit = "gpu_mtbf_h" if self.gpu_mtbf_h is not None else "node_mtbf_h"
            raise InputError(f"failure_class {self.name!r}: {unit} needs gpus to scale")
        return count

    def burst_rate_per_s(self, gpus: int | None, nodes: int | None) -> float:
        """Long-run rate of the failures the lifetime model gives (each starts a burst, when
        the class has bursts), per second (renewal theorem)."""
        mtbf_h = self.mtbf_h or self.gpu_mtbf_h or self.node_mtbf_h
        return self.components(gpus, nodes) / (mtbf_h * 3600.0)

    def rate_per_s(self, gpus: int | None, nodes: int | None) -> float:
        """Long-run rate of this class's failures on the job, follow-ups included, per second."""
        return self.burst_rate_per_s(gpus, nodes) * (1.0 + self.burst_followups)


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One place checkpoints go, and which failure classes a copy there survives."""

    name: str
    """A label (``--tier-interval-s NAME=SECONDS`` names it)."""
    survives: frozenset[str]
    """Names of the failure classes a copy in this tier survives (TOML: a list, required;
    ``[]`` for a tier no failure leaves intact, which then takes only the final save or none)."""
    checkpoint_s: float | None = None
    """Training stall of a synchronous save to this tier, seconds (or give checkpoint_bytes)."""
    checkpoint_bytes: float | None = None
    """Bytes one save writes to this tier (with a bandwidth below, instead of checkpoint_s)."""
    write_bytes_per_s_per_node: float | None = None
    """Write bandwidth of one node into this tier, bytes per second."""
    storage_bytes_per_s: float | None = None
    """Aggregate write bandwidth of this tier, bytes per second."""
    restore_s: float = 0.0
    """Time to load a checkpoint from this tier after a restart, seconds."""
    asynchronous: bool = False
    """The save stalls training only for ``staging_s``; the write runs behind (TOML: async)."""
    staging_s: float | None = None
    """Training stall of an asynchronous save, seconds."""
    retention: int = 1
    """Checkpoints kept in this tier at once."""
    interval_s: float | None = None
    """Compute seconds between saves to this tier (None: set by the schedule or optimiser)."""
    jit: bool = False
    """Just-in-time (Gupta et al., EuroSys 2024): never saved on a schedule; after a failure
    of a class it survives, the healthy data-parallel replicas save the state they hold (its
    ``checkpoint_s``, paid in the recovery) and the job resumes from it, losing no work."""
    into: str | None = None
    """With ``jit``: the scheduled tier the just-in-time save is written to (a preemption's
    save on its notice lands in host memory or on shared storage), so later failures that tier
    survives roll back to it as to a save there. None: the copy serves only the classes this
    tier survives."""
    every_step: bool = False
    """Saved after every training step (Gemini, SOSP 2023: to host memory with a copy on a peer,
    overlapped with training), not on an interval: a failure it survives loses only the step
    under way, and each step stalls training ``step_stall_s``. Takes no checkpoint_s."""
    step_s: float | None = None
    """Seconds of compute per training step (with ``every_step``)."""
    step_stall_s: float | None = None
    """Training stall each step's snapshot adds, seconds (with ``every_step``; 0 when the copy
    hides entirely behind the next step's compute)."""
    implicit: bool = field(default=False, init=False, repr=False, compare=False)
    """Made by the scenario from its own save fields (failure classes without [[tier]] tables):
    rebuilt whenever the scenario is, never written back to a file."""

    def __post_init__(self):
        owner = f"tier {_name('tier', self.name)!r}"
        if not isinstance(self.survives, frozenset) or not all(
            isinstance(c, str) for c in self.survives
        ):
            raise InputError(f"{owner}: survives must be a list of failure class names")
        _number(owner, "checkpoint_s", self.checkpoint_s, "seconds")
        _number(owner, "checkpoint_bytes", self.checkpoint_bytes, "bytes")
        for k in ("write_bytes_per_s_per_node", "storage_bytes_per_s"):
            _number(owner, k, getattr(self, k), "bytes per second")
        _number(owner, "restore_s", self.restore_s, "seconds", allow_zero=True)
        _number(owner, "staging_s", self.staging_s, "seconds")
        _number(owner, "interval_s", self.interval_s, "seconds")
        for flag in ("asynchronous", "jit", "every_step"):
            if not isinstance(getattr(self, flag), bool):
                shown = "async" if flag == "asynchronous" else flag
                raise InputError(
                    f"{owner}: {shown} must be true or false, got {getattr(self, flag)!r}"
                )
        if self.every_step:
            self._check_every_step(owner)
        elif self.step_s is not None or self.step_stall_s is not None:
            raise InputError(f"{owner}: step_s and step_stall_s need every_step = true")
        by_bytes = self.checkpoint_bytes is not None and (
            self.write_bytes_per_s_per_node is not None or self.storage_bytes_per_s is not None
        )
        if not self.every_step and (self.checkpoint_s is None) == (not by_bytes):
            raise InputError(
                f"{owner}: give either checkpoint_s or checkpoint_bytes with a write bandwidth "
                "(write_bytes_per_s_per_node or storage_bytes_per_s), not both or neither"
            )
        if self.jit and (self.asynchronous or self.interval_s is not None):
            raise InputError(
                f"{owner}: a jit tier is saved after a failure, not on a schedule: it takes "
                "neither async nor interval_s"
            )
        if self.into is not None and (not self.jit or not isinstance(self.into, str)):
            raise InputError(
                f"{owner}: into names the tier a just-in-time save is written to: it needs "
                f"jit = true and a tier name, got {self.into!r}"
            )
        if self.asynchronous and self.staging_s is None:
            raise InputError(f"{owner}: async needs staging_s (the training stall of a save)")
        if self.staging_s is not None and not self.asynchronous and not self.every_step:
            raise InputError(
                f"{owner}: staging_s is the stall of an asynchronous save: add async = true, "
                "or drop staging_s (a synchronous save stalls for its whole write)"
            )
        bandwidths = [
            k
            for k in ("write_bytes_per_s_per_node", "storage_bytes_per_s")
            if getattr(self, k) is not None
        ]
        if self.checkpoint_s is not None and bandwidths:
            raise InputError(
                f"{owner}: give the write time either as checkpoint_s or as checkpoint_bytes "
                f"over a bandwidth, not both ({bandwidths[0]} with checkpoint_s)"
            )
        if isinstance(self.retention, bool) or not isinstance(self.retention, int):
            raise InputError(f"{owner}: retention must be a whole number, got {self.retention!r}")
        _number(owner, "retention", self.retention, "checkpoints")

    def _check_every_step(self, owner: str) -> None:
        _number(owner, "step_s", self.step_s, "seconds")
        _number(owner, "step_stall_s", self.step_stall_s, "seconds", allow_zero=True)
        if self.step_s is None or self.step_stall_s is None:
            raise InputError(
                f"{owner}: every_step needs step_s (seconds of compute per training step) and "
                "step_stall_s (the stall each step's snapshot adds, seconds)"
            )
        given = [
            k
            for k in ("checkpoint_s", "checkpoint_bytes", "interval_s", "staging_s")
            if getattr(self, k) is not None
        ]
        given += [k for k in ("asynchronous", "jit") if getattr(self, k)]
        if given:
            name = "async" if given[0] == "asynchronous" else given[0]
            raise InputError(
                f"{owner}: an every_step tier is saved after every step at step_stall_s a "
                f"step: it takes no {name}"
            )

    def write_s(self, writers: int) -> float:
        """Time to write one checkpoint into this tier from ``writers`` nodes, seconds (an
        every-step tier: its stall per step)."""
        if self.every_step:
            return float(self.step_stall_s)
        if self.checkpoint_s is not None:
            return float(self.checkpoint_s)
        return write_time_s(
            self.checkpoint_bytes,
            self.write_bytes_per_s_per_node,
            self.storage_bytes_per_s,
            writers,
        )

    def stall_s(self, writers: int) -> float:
        """Training stall of one save to this tier, seconds (Cℓ in the closed form)."""
        return float(self.staging_s) if self.asynchronous else self.write_s(writers)


def scheduled(tiers) -> list[Tier]:
    """The tiers saved on an interval: all but the just-in-time and every-step ones."""
    return [t for t in tiers if not (t.jit or t.every_step)]


def step_tier(tiers) -> Tier | None:
    """The tier saved after every training step (a scenario has at most one), or None."""
    return next((t for t in tiers if t.every_step), None)


def served_by(tiers, class_name: str) -> tuple[str, Any]:
    """How a job comes back from a failure of ``class_name``, the one rule the first-order
    plan and the budget share (the DES follows it: ``des_tiers``):

    - ``("jit", tier)``: a just-in-time tier survives it; no work is lost, the recovery pays
      the tier's save and restore;
    - ``("step", tier)``: else an every-step tier survives it; the step under way is lost;
    - ``("scheduled", tiers)``: else the work since the newest copy among the scheduled tiers
      that survive it (an empty list: since the job's start).
    """
    jit = jit_tier(tiers, class_name)
    if jit is not None:
        return "jit", jit
    step = step_tier(tiers)
    if step is not None and class_name in step.survives:
        return "step", step
    return "scheduled", [t for t in scheduled(tiers) if class_name in t.survives]


def failure_cost_s(kind: str, tier: Tier | None, recovery_s: float, writers: int) -> float:
    """Seconds one failure costs beyond the work lost to a scheduled tier's interval: its
    recovery (``tier_plan.class_terms``), the restore, and for a just-in-time tier its save, for an
    every-step tier half a step of lost work (``served_by`` gives ``kind`` and ``tier``)."""
    if tier is None:
        return recovery_s
    cost = recovery_s + tier.restore_s
    if kind == "jit":
        cost += tier.write_s(writers)
    elif kind == "step":
        cost += tier.step_s / 2.0
    return cost


def step_overhead(tiers) -> float:
    """The share of compute time an every-step tier's stalls add (stall per step over the
    step), 0 without one."""
    step = step_tier(tiers)
    return 0.0 if step is None else step.step_stall_s / step.step_s


def jit_copies(tier: Tier) -> list[str]:
    """The tiers a just-in-time save of ``tier`` leaves a copy in: its own and, when it names
    one, its ``into`` tier (later failures that tier survives roll back to the copy there)."""
    return [tier.name] + ([tier.into] if tier.into is not None else [])


def refreshed_by(tiers, name: str) -> list[Tier]:
    """The just-in-time tiers whose save, after a failure, restarts scheduled tier ``name``'s
    interval: those written ``into`` a tier whose copy outlives every failure ``name``'s does
    (``interval_origin``'s rule), so that copy also serves ``name``'s failures. The DES gets
    this from the copies themselves; the closed forms (``tier_plan``) count these saves as
    extra copies of ``name``."""
    mine = next(t for t in tiers if t.name == name)
    by_name = {t.name: t for t in tiers}
    return [t for t in tiers if t.jit and t.into is not None and covers(by_name[t.into], mine)]


def covers(tier: Tier, other: Tier) -> bool:
    """Whether a copy in ``tier`` outlives every failure a copy in ``other`` does (so it
    serves all of ``other``'s failures: after a save there, ``other`` is not due at once)."""
    return tier.survives >= other.survives


def jit_tier(tiers, class_name: str) -> Tier | None:
    """The just-in-time tier that serves a failure of ``class_name`` (quickest to save and
    restore), or None when none survives it."""
    jit = [t for t in tiers if t.jit and class_name in t.survives]
    return min(jit, key=lambda t: (t.checkpoint_s or 0.0) + t.restore_s) if jit else None


def _tables(kind: str, items) -> list[dict[str, Any]]:
    if isinstance(items, dict):
        items = [items]
    if not isinstance(items, list | tuple) or not all(isinstance(t, dict) for t in items):
        raise InputError(f"{kind} must be a list of [[{kind}]] tables")
    return list(items)


def _build(cls, kind: str, table: dict[str, Any], renames: dict[str, str]):
    if "name" not in table:
        fields = ", ".join(sorted(table)) or "no fields"
        raise InputError(f"every [[{kind}]] needs a name (a [[{kind}]] with {fields} has none)")
    data = {renames.get(k, k): v for k, v in table.items()}
    known = {name for name, f in cls.__dataclass_fields__.items() if f.init}  # not implicit
    unknown = sorted(set(data) - known)
    if unknown:
        label = f"[[{kind}]] {table.get('name', '?')!r}"
        shown = sorted({next((k for k, v in renames.items() if v == f), f) for f in known})
        raise InputError(f"{label}: unknown field {unknown[0]!r} (known: {', '.join(shown)})")
    return cls(**data)


def parse_classes(items) -> tuple[FailureClass, ...]:
    """``[[failure_class]]`` tables (or FailureClass objects) as validated classes."""
    if items is None:
        return ()
    out = tuple(
        c if isinstance(c, FailureClass) else _build(FailureClass, "failure_class", c, {})
        for c in ([*items] if isinstance(items, tuple) else _tables("failure_class", items))
    )
    _unique("failure_class", [c.name for c in out])
    return out


def parse_tiers(items) -> tuple[Tier, ...]:
    """``[[tier]]`` tables (or Tier objects) as validated tiers."""
    if items is None:
        return ()
    out = []
    for t in [*items] if isinstance(items, tuple) else _tables("tier", items):
        if not isinstance(t, Tier):
            t = dict(t)
            if "survives" not in t:
                raise InputError(
                    f"tier {t.get('name', '?')!r}: give survives, the failure classes its copy "
                    "outlives (a list, [] for none); without it no failure could restore from it"
                )
            survives = t["survives"]
            if isinstance(survives, str):
                survives = [survives]
            if not isinstance(survives, list | tuple | set | frozenset):
                raise InputError(
                    f"tier {t.get('name', '?')!r}: survives must be a list of class names, "
                    f"got {survives!r}"
                )
            t["survives"] = frozenset(survives)
            t = _build(Tier, "tier", t, {"async": "asynchronous"})
        out.append(t)
    _unique("tier", [t.name for t in out])
    steps = [t.name for t in out if t.every_step]
    if len(steps) > 1:
        raise InputError(
            f"tiers {steps[0]!r} and {steps[1]!r} are both saved every step; a job has one "
            "training step: give one every_step tier"
        )
    return tuple(out)


def _unique(kind: str, names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise InputError(f"two [[{kind}]] tables are named {n!r}; names must be unique")
        seen.add(n)


def final_save_s(tiers, writers: int) -> float:
    """The job's final save, seconds: the final tiers (``final_tiers``) each stall for their
    save and, when asynchronous, the job waits for the write behind it too. Paid once per job,
    so the first-order waste, a rate, leaves it out."""
    return float(
        sum(
            t.stall_s(writers) + (t.write_s(writers) if t.asynchronous else 0.0)
            for t in final_tiers(tiers)
        )
    )


@dataclass(frozen=True)
class TierSchedule:
    """When each tier is saved: every ``intervals_s[tier]`` seconds of compute since that
    tier's last save (``inf``: only the job's final save), or, for a tier in ``every``
    (tier -> (base tier, k)), with every k-th save of the base tier."""

    intervals_s: dict[str, float]
    every: dict[str, tuple[str, int]] = field(default_factory=dict)
    name: str = "tiers"

    def __post_init__(self):
        for tier, value in self.intervals_s.items():
            if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
                raise InputError(
                    f"tier {tier!r}: interval must be a positive number of seconds, got {value!r}"
                )
        for tier, (base, k) in self.every.items():
            if isinstance(k, bool) or not isinstance(k, int) or k < 1:
                raise InputError(f"tier {tier!r}: every k-th save needs k >= 1, got {k!r}")
            if base not in self.intervals_s:
                raise InputError(f"tier {tier!r}: base tier {base!r} has no interval")

    @classmethod
    def for_scenario(cls, scenario, overrides: dict[str, float] | None = None) -> TierSchedule:
        """Each tier's ``interval_s`` from the scenario, replaced by ``overrides`` (name -> s)."""
        names = [t.name for t in scheduled(scenario.tiers)]
        overrides = dict(overrides or {})
        jit = sorted(set(overrides) & {t.name for t in scenario.tiers if t.jit})
        if jit:
            raise InputError(
                f"tier {jit[0]!r} is saved just in time, after a failure, not on a schedule: "
                "it takes no interval"
            )
        step = sorted(set(overrides) & {t.name for t in scenario.tiers if t.every_step})
        if step:
            raise InputError(
                f"tier {step[0]!r} is saved after every training step (every_step): it takes "
                "no interval"
            )
        unknown = sorted(set(overrides) - set(names))
        if unknown:
            raise InputError(f"no tier named {unknown[0]!r} (tiers: {', '.join(names)})")
        intervals = {}
        for t in scheduled(scenario.tiers):
            value = overrides.get(t.name, t.interval_s)
            if value is None:
                raise InputError(
                    f"tier {t.name!r} has no interval: give interval_s in its [[tier]] table "
                    f"or --tier-interval-s {t.name}=SECONDS"
                )
            intervals[t.name] = float(value)
        return cls(intervals)

    def check(self, scenario) -> None:
        names = {t.name for t in scheduled(scenario.tiers)}
        missing = sorted(names - set(self.intervals_s) - set(self.every))
        extra = sorted((set(self.intervals_s) | set(self.every)) - names)
        if missing or extra:
            raise InputError(
                f"the tier schedule must cover every tier exactly: missing {missing}, "
                f"unknown {extra}"
            )


def rollback(copies: dict[str, float | None], tiers, class_name: str):
    """Where a failure of ``class_name`` resumes: (progress s, tier or None for the start).

    The newest completed copy in any tier that survives the class; between copies of the same
    progress, the one quickest to restore.
    """
    best = None
    for t in tiers:
        at = copies.get(t.name)
        if at is None or class_name not in t.survives:
            continue
        if best is None or (at, -t.restore_s) > (best[0], -best[1].restore_s):
            best = (at, t)
    return (0.0, None) if best is None else best


def final_tiers(tiers) -> list:
    """Tiers the job's final state goes to: those no other tier's copy outlives."""
    saved = scheduled(tiers)  # a just-in-time tier is saved only after a failure
    return [t for t in saved if not any(t.survives < u.survives for u in saved)]


def save_writers(scenario) -> int:
    """Nodes that write a save in parallel (the scenario's writer_nodes, else all)."""
    return scenario.writer_nodes or scenario.nodes or 1


def with_measured_tier(scenario, name: str, cost):
    """``scenario`` with tier ``name``'s save and restore replaced by a measured cost (a
    ``checkpoint_cost.CheckpointCost``: a ``ckptsim bench`` profile extrapolated to the job).

    The tier writes for ``cost.write_s`` and restores in ``cost.restore_s``; it is
    asynchronous, staging for ``cost.stall_s``, when the measured format stalls for less than
    its write (an async format), else synchronous. The tier's own bytes and bandwidths give way
    to the measurement, which has the storage cap in it already. A scenario's own save made
    into a tier (failure classes without [[tier]] tables) becomes a tier of its own.
    """
    asynchronous = cost.stall_s < cost.write_s
    tiers = tuple(
        replace(
            t,
            checkpoint_s=float(cost.write_s),
            checkpoint_bytes=None,
            write_bytes_per_s_per_node=None,
            storage_bytes_per_s=None,
            restore_s=float(cost.restore_s),
            asynchronous=asynchronous,
            staging_s=float(cost.stall_s) if asynchronous else None,
        )
        if t.name == name
        else t
        for t in scenario.tiers
    )
    return replace(scenario, tiers=tiers)


def interval_origin(copies: dict[str, float | None], tiers, name: str) -> float:
    """Where tier ``name``'s interval counts from after a restart: the newest copy in it or in
    a tier whose copy outlives every failure its copy does (that copy serves the same
    failures, so after a restore from it the tier is not due at once), else the job's start.

    The one rule for the tiered simulator's marks and the live controller's due steps: a
    memory tier counts from a restore out of persistent storage; a persistent tier with no
    copy yet counts from the start, so failures the memory tier serves cannot put its first
    save off for ever.
    """
    mine = next(t for t in tiers if t.name == name)
    held = [copies.get(t.name) for t in tiers if covers(t, mine)]
    return max((x for x in held if x is not None), default=0.0)


_PLANS = frozenset(
    {"class_terms", "first_order_plan", "recommend_tiers", "single_tier_plan", "waste_at",
     "what_it_assumes", "job_waste_fraction"}
)  # fmt: skip


def __getattr__(name: str):
    # The closed forms live in simulator.model.tier_plan (which imports this module); their
    # old home still gives them, loaded on first use.
    if name in _PLANS:
        from simulator.model import tier_plan

        return getattr(tier_plan, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
