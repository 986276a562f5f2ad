"""Failure classes and checkpoint tiers: which failures a saved copy survives, and at what cost.

A *failure class* is one kind of interruption with its own lifetime model (per GPU, per node
or for the whole job, any family ``simulator.model.failures`` parses), detection time, restart cost
and the number of nodes it takes down (0 for a crashed process whose host survives). The
classes superpose: the job's failure rate is the sum of theirs.

A *tier* is one place a checkpoint goes — host memory, a peer's memory, shared storage — with
its save stall (or bytes and bandwidth), restore time, retention, and the set of classes its
copy survives. A failure of class c rolls the job back to the newest completed checkpoint in
any tier that survives c; the tier that is cheapest to save among those that survive c is
"the tier c needs" for the first-order closed form (``analytic.tier_first_order``).

A scenario without tiers or classes is today's single-tier, single-class model, unchanged.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from simulator.errors import InputError
from simulator.model.failures import parse_failure

__all__ = [
    "FailureClass",
    "Tier",
    "class_terms",
    "first_order_plan",
    "jit_tier",
    "parse_classes",
    "parse_tiers",
    "scheduled",
    "write_time_s",
]


def _number(owner: str, name: str, value, unit: str, *, allow_zero: bool = False) -> None:
    if value is None:
        return
    ok = not isinstance(value, bool) and isinstance(value, int | float) and math.isfinite(value)
    if not ok or (value < 0 if allow_zero else value <= 0):
        sign = "non-negative" if allow_zero else "positive"
        raise InputError(f"{owner}: {name} must be a {sign} number of {unit}, got {value!r}")


def _name(kind: str, value) -> str:
    if not isinstance(value, str) or not value.strip():
        raise InputError(f"every [[{kind}]] needs a non-empty name, got {value!r}")
    return value


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

    def components(self, gpus: int | None, nodes: int | None) -> int:
        """How many independently failing units this class's MTBF is given for."""
        if self.mtbf_h is not None:
            return 1
        count = gpus if self.gpu_mtbf_h is not None else nodes
        if count is None:
            unit = "gpu_mtbf_h" if self.gpu_mtbf_h is not None else "node_mtbf_h"
            raise InputError(f"failure_class {self.name!r}: {unit} needs gpus to scale")
        return count

    def rate_per_s(self, gpus: int | None, nodes: int | None) -> float:
        """Long-run rate of this class's failures on the job, per second (renewal theorem)."""
        mtbf_h = self.mtbf_h or self.gpu_mtbf_h or self.node_mtbf_h
        return self.components(gpus, nodes) / (mtbf_h * 3600.0)


@dataclass(frozen=True, kw_only=True)
class Tier:
    """One place checkpoints go, and which failure classes a copy there survives."""

    name: str
    """A label (``--tier-interval-s NAME=SECONDS`` names it)."""
    survives: frozenset[str] = field(default_factory=frozenset)
    """Names of the failure classes a copy in this tier survives."""
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
        by_bytes = self.checkpoint_bytes is not None and (
            self.write_bytes_per_s_per_node is not None or self.storage_bytes_per_s is not None
        )
        if (self.checkpoint_s is None) == (not by_bytes):
            raise InputError(
                f"{owner}: give either checkpoint_s or checkpoint_bytes with a write bandwidth "
                "(write_bytes_per_s_per_node or storage_bytes_per_s), not both or neither"
            )
        if not isinstance(self.asynchronous, bool):
            raise InputError(f"{owner}: async must be true or false, got {self.asynchronous!r}")
        if not isinstance(self.jit, bool):
            raise InputError(f"{owner}: jit must be true or false, got {self.jit!r}")
        if self.jit and (self.asynchronous or self.interval_s is not None):
            raise InputError(
                f"{owner}: a jit tier is saved after a failure, not on a schedule: it takes "
                "neither async nor interval_s"
            )
        if self.asynchronous and self.staging_s is None:
            raise InputError(f"{owner}: async needs staging_s (the training stall of a save)")
        if isinstance(self.retention, bool) or not isinstance(self.retention, int):
            raise InputError(f"{owner}: retention must be a whole number, got {self.retention!r}")
        _number(owner, "retention", self.retention, "checkpoints")

    def write_s(self, writers: int) -> float:
        """Time to write one checkpoint into this tier from ``writers`` nodes, seconds."""
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
    """The tiers saved on a schedule: all but the just-in-time ones."""
    return [t for t in tiers if not t.jit]


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
            survives = t.get("survives", [])
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
    return tuple(out)


def _unique(kind: str, names: list[str]) -> None:
    seen = set()
    for n in names:
        if n in seen:
            raise InputError(f"two [[{kind}]] tables are named {n!r}; names must be unique")
        seen.add(n)


def first_order_plan(scenario) -> dict[str, Any]:
    """The first-order tier intervals and waste of a scenario with tiers (``analytic``).

    Each class's failures are charged to the cheapest tier (least save stall) that survives
    them; its recovery is its detection and restart, that tier's restore and the warm-up. A
    class a just-in-time tier survives loses no work: it pays that tier's save and restore in
    its recovery, and the scheduled tiers' intervals leave it out.
    Returns ``tier_intervals_s`` (tier name -> seconds; ``inf``: only the final save goes
    there), ``rates_per_s`` (λℓ per tier) and ``waste_fraction``.
    """
    from simulator import analytic  # scipy: only when a closed form is asked for

    if not scenario.tiers:
        raise InputError("the tier closed form needs [[tier]] tables in the scenario")
    writers = _writers(scenario)
    costs = {t.name: t.stall_s(writers) for t in scheduled(scenario.tiers)}
    rates = dict.fromkeys(costs, 0.0)
    restart_cost = 0.0
    for name, rate, recovery_s in class_terms(scenario):
        jit = jit_tier(scenario.tiers, name)
        if jit is not None:  # no work lost; the recovery pays the just-in-time save
            restart_cost += rate * (recovery_s + jit.write_s(writers) + jit.restore_s)
            continue
        surviving = [t for t in scheduled(scenario.tiers) if name in t.survives]
        if not surviving:
            raise InputError(
                f"no tier survives failure class {name!r}: each such failure would restart "
                "the job from its beginning; add it to a tier's survives"
            )
        tier = min(surviving, key=lambda t: costs[t.name])
        rates[tier.name] += rate
        restart_cost += rate * (recovery_s + tier.restore_s)
    tau, waste = analytic.tier_first_order(list(costs.values()), list(rates.values()), restart_cost)
    return {
        "tier_intervals_s": {n: float(x) for n, x in zip(costs, tau, strict=True)},
        "rates_per_s": rates,
        "waste_fraction": waste,
    }


def class_terms(scenario):
    """(name, rate per second, detection + restart + warm-up seconds) of each class."""
    from simulator.model.scenario import IMPLICIT_CLASS

    if not scenario.failure_classes:
        recovery = scenario.detection_s + scenario.restart_s + scenario.warmup_s
        return [(IMPLICIT_CLASS, scenario.failure_rate_per_s, recovery)]
    out = []
    for c in scenario.failure_classes:
        restart = scenario.restart_s if c.restart_s is None else c.restart_s
        rate = c.rate_per_s(scenario.gpus, scenario.nodes)
        out.append((c.name, rate, c.detection_s + restart + scenario.warmup_s))
    return out


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


def single_tier_plan(scenario) -> dict[str, Any]:
    """The best single-tier answer beside the tiered one: every save to the cheapest tier that
    survives every class (the persistent one), at the first-order optimum for all failures."""
    from simulator import analytic

    writers = _writers(scenario)
    terms = class_terms(scenario)
    names = {name for name, _, _ in terms}
    surviving = [t for t in scheduled(scenario.tiers) if names <= set(t.survives)]
    if not surviving:
        raise InputError("no tier survives every failure class: add one (the persistent tier)")
    tier = min(surviving, key=lambda t: t.stall_s(writers))
    rate = sum(r for _, r, _ in terms)
    restart_cost = sum(r * (recovery_s + tier.restore_s) for _, r, recovery_s in terms)
    tau, waste = analytic.tier_first_order([tier.stall_s(writers)], [rate], restart_cost)
    return {"tier": tier.name, "interval_s": float(tau[0]), "waste_fraction": waste}


def _jit_rates_per_h(scenario) -> dict[str, float]:
    """Each just-in-time tier's failures per hour (the classes it serves)."""
    out = {t.name: 0.0 for t in scenario.tiers if t.jit}
    for name, rate, _ in class_terms(scenario):
        jit = jit_tier(scenario.tiers, name)
        if jit is not None:
            out[jit.name] += rate * 3600.0
    return out


def _writers(scenario) -> int:
    """Nodes that write a save in parallel (the scenario's writer_nodes, else all)."""
    return scenario.writer_nodes or scenario.nodes or 1


def what_it_assumes(scenario, tier: Tier) -> str:
    """What a plan that saves to ``tier`` takes for granted, for a person: which failures a
    copy there survives (so which hardware must hold it: host memory, a peer, shared
    storage), and what a save and a restore cost."""
    from simulator.model.scenario import IMPLICIT_CLASS

    writers = _writers(scenario)
    classes = sorted(c.name for c in scenario.failure_classes) or [IMPLICIT_CLASS]
    survived = [c for c in classes if c in tier.survives]
    lost = [c for c in classes if c not in tier.survives]
    if tier.jit:
        return (
            f"{tier.name}: healthy replicas still hold the whole state after a "
            f"{', '.join(survived)} failure and save it in {tier.checkpoint_s or 0.0:g} s "
            f"(restore {tier.restore_s:g} s)"
        )
    cost = f"{tier.stall_s(writers):.3g} s stall per save, restore {tier.restore_s:g} s"
    if not lost:
        return f"{tier.name}: a copy every failure class leaves intact ({cost})"
    return (
        f"{tier.name}: a copy that outlives {', '.join(survived)} failures but not "
        f"{', '.join(lost)} ({cost})"
    )


def recommend_tiers(scenario) -> dict[str, Any]:
    """Every tier's interval (first order) and its waste and money, with the best single-tier
    answer beside it: the dict ``ckptsim optimize --json`` prints for a tiered scenario."""
    from simulator.model import money

    plan = first_order_plan(scenario)
    single = single_tier_plan(scenario)
    if plan["waste_fraction"] >= 1.0:
        raise InputError(
            f"this job would make no headway: even at the tiers' first-order intervals, saves, "
            f"lost work and restarts would take {plan['waste_fraction']:.3g}x the wall time "
            "(at most 1); make saves or restarts cheaper, or failures rarer"
        )
    out: dict[str, Any] = {
        "scenario": scenario.to_dict(),
        "method": "first-order multi-tier optimum (Benoit et al., IEEE TC 2017)",
        "tier_intervals_s": plan["tier_intervals_s"],
        "tier_failure_rates_per_h": {k: v * 3600.0 for k, v in plan["rates_per_s"].items()},
        "jit_failure_rates_per_h": _jit_rates_per_h(scenario),
        "optimal_waste_fraction": plan["waste_fraction"],
        "single_tier": single["tier"],
        "single_tier_interval_s": single["interval_s"],
        "single_tier_waste_fraction": single["waste_fraction"],
        "assumes": {
            "tiers": [what_it_assumes(scenario, t) for t in scenario.tiers],
            "single_tier": what_it_assumes(
                scenario, next(t for t in scenario.tiers if t.name == single["tier"])
            ),
        },
        "warnings": [
            f"failure class {c.name!r} is {c.failure}: the first-order plan assumes exponential "
            "failures; --simulate finds the intervals for the family itself"
            for c in scenario.failure_classes
            if not c.failure.strip().lower().startswith("exponential")
        ],
    }
    if scenario.gpus is not None and scenario.usd_per_gpu_hour is not None:
        per_day = {
            key: float(money.usd_lost_per_day(scenario.gpus, scenario.usd_per_gpu_hour, w))
            for key, w in (("tiers", plan["waste_fraction"]), ("single", single["waste_fraction"]))
        }
        out["usd_lost_per_day"] = per_day["tiers"]
        out["single_tier_usd_lost_per_day"] = per_day["single"]
        out["usd_saved_per_day"] = per_day["single"] - per_day["tiers"]
    return out
