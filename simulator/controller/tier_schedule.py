"""When each checkpoint tier is due: the live controller's two-tier schedule (no torch).

With a local tier (``AdaptiveCheckpointer(..., local_dir=...)``) a run keeps two kinds of copy:
a *local* one in host memory or on local NVMe, which outlives a crash of the training process
but not the loss of its host, and the *persistent* one, which outlives both. Failures come in
two classes accordingly: ``process`` (the host survives: a crash, a hang that ends in a kill)
and ``node`` (it does not). The run log tells them apart after the fact: a restart that found
its local tier (of this run) had survived a process failure, one that did not had lost its
node (:func:`simulator.controller.runlog.failures_by_class`).

:class:`TieredSchedule` keeps a Gamma–Poisson posterior per class and each tier's measured save
stall, builds the model's own objects from them (:func:`tier_scenario`: a
:class:`~simulator.model.scenario.Scenario` with ``[[tier]]`` and ``[[failure_class]]``
tables) and asks the model's first-order plan (:func:`simulator.model.tiers.first_order_plan`,
Benoit et al., IEEE TC 2017: τℓ = √(2 Cℓ / λℓ)) for each tier's interval — the same function
``ckptsim optimize`` answers with and the same objects the tiered simulator runs. A
:class:`~simulator.model.tiers.TierSchedule` given as the policy fixes the intervals instead
(hand-set values). Each tier keeps its own due step, as the tiered simulator keeps each tier's
own mark: a save to one tier does not move the other's.

Priors: from a scenario's ``[[failure_class]]`` tables when given (a class that takes no node
down, ``nodes_lost = 0``, is a process failure; the others are node losses) and its
``[[tier]]`` tables (the tier that survives every class is the persistent one, the cheapest
other one the local one), else from ``mtbf_h`` split as Llama 3 405B's interruptions were
(:func:`simulator.model.tiers.split_mtbf`: the preset ``llama3-mix``, whose host-surviving
classes — software and hangs — are 15 % of the rate).
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from simulator.controller.estimate import FailureRatePosterior, RunningMean
from simulator.controller.schedule import _MIN_CHECKPOINT_S, Schedule, interval_steps
from simulator.errors import InputError
from simulator.model.tiers import default_process_share, split_mtbf
from simulator.policies import after_the_write

__all__ = [
    "LOCAL",
    "NODE",
    "PERSISTENT",
    "PROCESS",
    "TIERS",
    "TieredSchedule",
    "default_process_share",
    "mtbf_by_class",
    "scenario_priors",
    "tier_scenario",
]

LOCAL, PERSISTENT = "local", "persistent"
TIERS = (LOCAL, PERSISTENT)
"""The live tiers, cheapest first (the order saves due at one step are made in)."""
PROCESS, NODE = "process", "node"
"""The failure classes the run log can tell apart."""
NEVER = 2**62
"""A due step never reached (a tier no failure class needs: only the final save goes there)."""


def mtbf_by_class(mtbf_s: float) -> dict[str, float]:
    """A job's MTBF, seconds, as the MTBF of each live class (``model.tiers.split_mtbf``)."""
    return dict(zip((PROCESS, NODE), split_mtbf(mtbf_s), strict=True))


def scenario_priors(scenario) -> dict:
    """What a scenario says about the two classes and tiers: ``mtbf_s`` per class (None where
    it has none) and each tier's save stall prior (None where it has no such tier)."""
    out: dict = {"mtbf_s": {PROCESS: None, NODE: None}, "stall_s": {LOCAL: None, PERSISTENT: None}}
    if scenario.failure_classes:
        rates = {PROCESS: 0.0, NODE: 0.0}
        for c in scenario.failure_classes:
            key = PROCESS if c.nodes_lost == 0 else NODE
            rates[key] += c.rate_per_s(scenario.gpus, scenario.nodes)
        for key, rate in rates.items():
            out["mtbf_s"][key] = 1.0 / rate if rate > 0 else None
    elif scenario.has_mtbf:
        out["mtbf_s"] = mtbf_by_class(scenario.system_mtbf_s)
    writers = scenario.writer_nodes or scenario.nodes or 1
    every = {c.name for c in scenario.failure_classes}
    scheduled = [t for t in scenario.tiers if not t.jit]
    lasting = [t for t in scheduled if every <= t.survives]
    if lasting:
        out["stall_s"][PERSISTENT] = min(t.stall_s(writers) for t in lasting)
        cheaper = [t for t in scheduled if t not in lasting]
        if cheaper:
            out["stall_s"][LOCAL] = min(t.stall_s(writers) for t in cheaper)
    else:
        out["stall_s"][PERSISTENT] = scenario.save_stall_s
    return out


def tier_scenario(
    *,
    local_s: float,
    persistent_s: float,
    rates_per_s: Mapping[str, float],
    restart_s: float,
    local_survives: tuple[str, ...] = (PROCESS,),
    extra_tiers: tuple = (),
    classes: tuple = (),
    **fields,
):
    """The model's scenario for a run with a local and a persistent tier.

    ``rates_per_s``: failure class -> rate (every class but those in ``classes``, which are
    given whole as :class:`~simulator.model.tiers.FailureClass` objects). The local tier
    survives ``local_survives``; the persistent one every class. ``fields``: more Scenario
    fields (``work_h``...). The simulator's predictions of a tiered run and the live schedule
    build their scenario here, so both charge each class to the same tier.
    """
    from simulator.model.scenario import Scenario
    from simulator.model.tiers import FailureClass, Tier

    made = [
        FailureClass(
            name=name, mtbf_h=1.0 / (rate * 3600.0), nodes_lost=0 if name == PROCESS else 1
        )
        for name, rate in rates_per_s.items()
    ]
    every = frozenset(c.name for c in (*made, *classes))
    tiers = (
        Tier(
            name=LOCAL,
            survives=frozenset(local_survives) & every,
            checkpoint_s=max(float(local_s), _MIN_CHECKPOINT_S),
        ),
        Tier(
            name=PERSISTENT,
            survives=every,
            checkpoint_s=max(float(persistent_s), _MIN_CHECKPOINT_S),
        ),
        *extra_tiers,
    )
    return Scenario(
        name="live tiers",
        restart_s=float(restart_s),
        tiers=tiers,
        failure_classes=(*made, *classes),
        **fields,
    )


def _live_tiers():
    """The two live tiers as the model's objects: what each one's copy outlives."""
    from simulator.model.tiers import Tier

    return (
        Tier(name=LOCAL, survives=frozenset({PROCESS}), checkpoint_s=1.0),
        Tier(name=PERSISTENT, survives=frozenset({PROCESS, NODE}), checkpoint_s=1.0),
    )


class TieredSchedule(Schedule):
    """A :class:`Schedule` with a local tier: each tier's own due step, from the model's plan.

    The base class's estimates are the persistent tier's (``stall``, ``write``), the iteration
    time and the all-class posterior; this adds the local tier's stall and a posterior per
    failure class. ``fixed``: tier -> interval in seconds of compute (a hand-set schedule).
    """

    def __init__(
        self,
        *,
        class_priors: Mapping[str, FailureRatePosterior],
        local_prior_s: float | None = None,
        fixed: Mapping[str, float] | None = None,
        **base,
    ):
        super().__init__(**base)
        self.local_stall = RunningMean()
        self.local_prior_s = local_prior_s
        self.class_priors = dict(class_priors)
        self.class_posteriors = dict(class_priors)
        self.past_by_class = dict.fromkeys(self.class_priors, 0)
        self.fixed = None if fixed is None else {t: float(fixed[t]) for t in TIERS}
        self.due = dict.fromkeys(TIERS, 0)
        self.local_enabled = True
        """False when the local tier cannot be used this session: the persistent tier alone,
        at the interval for every failure class."""
        self._planned: set[str] = set()
        self.tier_interval_s = dict.fromkeys(TIERS, math.nan)
        self.tier_interval_steps = dict.fromkeys(TIERS, 0)

    # -- evidence ---------------------------------------------------------------------------
    def set_history(
        self, failures: int, exposure_s: float, by_class: Mapping[str, int] | None = None
    ) -> None:
        super().set_history(failures, exposure_s)
        self.past_by_class = {k: int((by_class or {}).get(k, 0)) for k in self.class_priors}
        self._observe(self.past_exposure_s)

    def update_exposure(self, session_s: float) -> None:
        super().update_exposure(session_s)
        self._observe(self.past_exposure_s + max(0.0, session_s))

    def _observe(self, exposure_s: float) -> None:
        self.class_posteriors = {
            k: prior.observe(self.past_by_class[k], exposure_s)
            for k, prior in self.class_priors.items()
        }

    def seed_local(self, stall_s) -> None:
        """The local tier's stall from a previous session (its checkpoint holds it)."""
        ok = type(stall_s) in (int, float) and math.isfinite(stall_s) and stall_s > 0
        if ok and self.local_stall.value is None:
            self.local_stall.value = float(stall_s)

    # -- decisions --------------------------------------------------------------------------
    @property
    def local_s(self) -> float | None:
        value = self.local_stall.value if self.local_stall.value is not None else self.local_prior_s
        return None if value is None else max(value, _MIN_CHECKPOINT_S)

    @property
    def needs_first_save(self) -> bool:
        """A tier's stall is unknown (neither measured, stored nor given) and the plan needs it."""
        if self.fixed is not None:
            return False
        return self.checkpoint_s is None or (self.local_enabled and self.local_s is None)

    def plan_s(self) -> dict[str, float]:
        """Each tier's interval, seconds of compute: the model's first-order plan at what the
        run has learned (or the fixed intervals)."""
        from simulator.model.tiers import first_order_plan

        if self.fixed is not None:
            plan = dict(self.fixed)
        else:
            scenario = tier_scenario(
                local_s=self.local_s or self.checkpoint_s,
                persistent_s=self.checkpoint_s,
                rates_per_s={k: p.rate_per_s for k, p in self.class_posteriors.items()},
                restart_s=self.restart_s,
                local_survives=(PROCESS,) if self.local_enabled else (),
            )
            plan = dict(first_order_plan(scenario)["tier_intervals_s"])
        if self.asynchronous and self.write.value is not None:
            plan[PERSISTENT] = after_the_write(plan[PERSISTENT], self.write.value)
        return plan

    def next_due(self, step: int, *, age_s: float, tier: str | None = None) -> int:
        """The step of the next save to any tier, after a save to ``tier`` at ``step`` (None:
        a probe's end: both tiers count from it; a restore: :meth:`restart`). ``age_s`` is
        the single-tier :class:`Schedule`'s argument; the tiers' first-order plan has no use
        for it."""
        return self._plan_from(step, tier, {})

    def restart(self, step: int, persistent_step: int) -> int:
        """After a restore at ``step`` (the newest copy of either tier): each tier counts from
        :func:`simulator.model.tiers.interval_origin`, the rule the tiered simulator's marks
        follow — the local tier from the restore, the persistent tier from its own newest copy
        (``persistent_step``; 0: none, so from the start)."""
        from simulator.model.tiers import interval_origin

        copies = {LOCAL: step, PERSISTENT: persistent_step or None}
        origin = int(interval_origin(copies, _live_tiers(), PERSISTENT))
        return self._plan_from(step, None, {PERSISTENT: origin})

    def _plan_from(self, step: int, tier: str | None, origins: Mapping[str, int]) -> int:
        """Plan the tiers due after ``step`` (all of them when ``tier`` is None), each counting
        from its ``origins`` step (default ``step``); a tier overdue from its origin is saved
        at the next step. Returns the next step any tier is due."""
        if self.needs_probe:
            for t in TIERS:
                self.due[t] = step + self.probe_steps
            self._planned = set()
            self.interval_s = math.nan
            self.interval_steps = self.probe_steps
            return self._next(step)
        plan = self.plan_s()
        # A tier still on the probe's due step is planned now too.
        for t in TIERS if tier is None else {tier} | (set(TIERS) - self._planned):
            start = origins.get(t, step)
            self._set_tier(t, start, plan[t])
            if start < step:
                self.due[t] = max(self.due[t], step + 1)
            self._planned.add(t)
        self.interval_s = self.tier_interval_s[PERSISTENT]
        self.interval_steps = self.tier_interval_steps[PERSISTENT]
        return self._next(step)

    def _set_tier(self, tier: str, step: int, interval_s: float) -> None:
        self.tier_interval_s[tier] = interval_s
        if not math.isfinite(interval_s) or (tier == LOCAL and not self.local_enabled):
            self.tier_interval_steps[tier] = 0
            self.due[tier] = NEVER
            return
        steps = interval_steps(interval_s, self.iteration.value)
        self.tier_interval_steps[tier] = steps
        self.due[tier] = step + steps

    def _next(self, step: int) -> int:
        for m in self.milestones:  # a milestone is a persistent save
            if step < m < self.due[PERSISTENT]:
                self.due[PERSISTENT] = m
                break
        return min(self.due.values())

    def tiers_due(self, step: int) -> list[str]:
        """The tiers to save at ``step``, cheapest first (both at a first save: each is timed)."""
        tiers = TIERS if self.local_enabled else (PERSISTENT,)
        if self.needs_first_save:
            return list(tiers)
        return [t for t in tiers if self.due[t] <= step]


def check_tier_intervals(intervals: Mapping[str, float], every: Mapping) -> dict[str, float]:
    """A hand-set :class:`~simulator.model.tiers.TierSchedule` for the live tiers, checked."""
    if every:
        raise InputError(
            "the live controller takes a TierSchedule of intervals_s only (every k-th save of "
            f"another tier is the simulator's), got every={dict(every)!r}"
        )
    if set(intervals) != set(TIERS):
        raise InputError(
            f"a TierSchedule for the live tiers names exactly {LOCAL!r} and {PERSISTENT!r}, "
            f"got {sorted(intervals)}"
        )
    return {t: float(intervals[t]) for t in TIERS}
