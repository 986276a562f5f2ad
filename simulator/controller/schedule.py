"""When the next save is due, as a step number, from what the run has measured about itself.

The policy (``simulator.policies``) answers in seconds of compute; training counts steps. The
:class:`Schedule` keeps the estimates a policy needs — the save stall δ and, for asynchronous
saves, the background write time (running means over the saves so far), the iteration time
(measured between saves, so the hot path does no timing), the failure-rate posterior (a prior
from the scenario or ``mtbf_h``, updated by the restarts in the run log) — and turns the
policy's interval into a step count. Milestone steps are always due.

Before the first save nothing about δ has been measured. With a scenario, its
``checkpoint_s`` is used (``checkpoint_s_source == "scenario"``) once a short probe of
``probe_steps`` steps has measured the iteration time; without one, the first save happens at
the end of the probe and measures δ itself (``"first save"``). A resumed run starts from the
estimates stored in the checkpoint it resumed from (``"previous session"``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from simulator.controller.estimate import FailureRatePosterior, RunningMean
from simulator.model.failures import Lifetime
from simulator.policies import FixedInterval, Policy, PolicyContext, after_the_write

__all__ = [
    "DEFAULT_MTBF_S",
    "ControllerPolicy",
    "Estimates",
    "Schedule",
    "after_the_write",
    "interval_steps",
    "learned_context",
]

DEFAULT_MTBF_S = 24 * 3600.0
"""Prior MTBF when neither a scenario nor ``mtbf_h`` is given: a weak guess (weight 1)."""

_MIN_CHECKPOINT_S = 1e-3  # a save is never free; keeps closed forms away from τ = 0


def learned_context(
    posterior: FailureRatePosterior,
    *,
    checkpoint_s: float,
    restart_s: float,
    age_s: float,
    component: Lifetime | None,
    n_components: int,
    other_rate_per_s: float = 0.0,
) -> PolicyContext:
    """What the controller's policy sees: the failure-rate posterior as the MTBF, and the
    component model's hazard shape kept but centred on what the run has learned.

    The one rule the live :class:`Schedule` and the simulated :class:`ControllerPolicy` share."""
    if component is not None:
        learned_rate = 1.0 / posterior.mtbf_s - other_rate_per_s
        component_mean = n_components / learned_rate if learned_rate > 0 else math.inf
        if math.isfinite(component_mean):
            component = component.with_mean(component_mean)
        else:
            component = None
    return PolicyContext(
        checkpoint_s=checkpoint_s,
        restart_s=restart_s,
        mtbf_s=posterior.mtbf_s,
        age_s=age_s,
        component=component,
        n_components=n_components,
        other_rate_per_s=other_rate_per_s if component is not None else 0.0,
    )


def interval_steps(interval_s: float, iteration_s: float) -> int:
    """An interval as whole training steps: the nearest count, never fewer than one (the
    controller saves only between steps)."""
    return max(1, round(float(interval_s) / max(float(iteration_s), 1e-9)))


@dataclass(frozen=True)
class ControllerPolicy:
    """The live controller's decision, for the simulator: ``inner`` (``Adaptive`` by default,
    as :class:`~simulator.controller.AdaptiveCheckpointer`) at the failure-rate posterior that
    a run learns from the failures it meets, from a Gamma prior of ``prior_weight`` failures
    centred on ``prior_mtbf_s`` (None: the job's true MTBF, as the controller's prior from a
    scenario), with the async clamp. It learns, so it needs the DES, which passes
    ``failures_seen`` and ``exposure_s`` in each :class:`PolicyContext`.

    With ``step_s`` it also keeps the live controller's step rules: intervals are whole steps
    (:func:`interval_steps`), and a start with no checkpoint to resume probes ``probe_steps``
    steps first — the probe is compute without a save, after which the first interval starts,
    or, with ``first_save_at_probe`` (a controller given no scenario, so no δ before its first
    save), the probe ends in the first save. A restart from a checkpoint does not probe: the
    checkpoint holds the measured iteration time (``Estimates``)."""

    prior_mtbf_s: float | None = None
    prior_weight: float = 2.0
    inner: Policy | None = None
    step_s: float | None = None
    """Seconds per training step (None: intervals in continuous time, no probe)."""
    probe_steps: int = 20
    first_save_at_probe: bool = False
    name: str = "controller"
    learns = True

    def next_interval_s(self, ctx: PolicyContext) -> float:
        from simulator.policies import Adaptive

        fresh = self.step_s is not None and ctx.checkpoints_committed == 0
        probe_s = self.probe_steps * self.step_s if fresh and ctx.saves_since_start == 0 else 0.0
        if probe_s and self.first_save_at_probe:
            return probe_s
        # The live controller chooses its first interval when the probe ends, not before it.
        prior_mtbf = self.prior_mtbf_s if self.prior_mtbf_s is not None else ctx.mtbf_s
        posterior = FailureRatePosterior.from_prior(prior_mtbf, self.prior_weight).observe(
            ctx.failures_seen, ctx.exposure_s + probe_s
        )
        learned = learned_context(
            posterior,
            checkpoint_s=ctx.checkpoint_s,
            restart_s=ctx.restart_s,
            age_s=ctx.age_s + probe_s,
            component=ctx.component,
            n_components=ctx.n_components,
            other_rate_per_s=ctx.other_rate_per_s,
        )
        interval_s = after_the_write(
            (self.inner or Adaptive()).next_interval_s(learned), ctx.write_s
        )
        if self.step_s is None:
            return interval_s
        return probe_s + interval_steps(interval_s, self.step_s) * self.step_s


@dataclass(frozen=True, kw_only=True)
class Estimates:
    """What one session measured, stored in each checkpoint for the next session."""

    save_stall_s: float | None = None
    write_s: float | None = None
    iteration_s: float | None = None

    @classmethod
    def bad_entry(cls, record: dict) -> tuple[object, object] | None:
        """The first (key, value) of a stored record (a checkpoint's, a run log's) that is not
        an estimate (a known name, None or a finite number >= 0), or None when all are."""
        for key, value in record.items():
            ok = value is None or (type(value) in (int, float) and 0 <= value < math.inf)
            if key not in cls.__dataclass_fields__ or not ok:
                return key, value
        return None


class Schedule:
    """The estimates behind the interval, and the step at which the next save is due."""

    def __init__(
        self,
        *,
        policy: Policy,
        prior: FailureRatePosterior,
        restart_s: float,
        checkpoint_prior_s: float | None,
        asynchronous: bool,
        milestones: tuple[int, ...] = (),
        component: Lifetime | None = None,
        n_components: int = 1,
        probe_steps: int = 20,
    ):
        self.policy = policy
        self.prior = prior
        self.posterior = prior
        self.restart_s = float(restart_s)
        self.checkpoint_prior_s = checkpoint_prior_s
        self.asynchronous = asynchronous
        self.milestones = tuple(sorted(set(milestones)))
        self.component = component
        self.n_components = n_components
        self.probe_steps = int(probe_steps)
        self.stall = RunningMean()
        self.write = RunningMean()
        self.iteration = RunningMean()
        self.past_failures = 0
        self.past_exposure_s = 0.0
        self._seeded = False
        self.interval_s = math.nan
        self.interval_steps = 0

    # -- evidence ---------------------------------------------------------------------------
    def set_history(self, failures: int, exposure_s: float) -> None:
        """Failures and exposure of the past sessions (from the run log)."""
        self.past_failures = int(failures)
        self.past_exposure_s = float(exposure_s)
        self.posterior = self.prior.observe(self.past_failures, self.past_exposure_s)

    def update_exposure(self, session_s: float) -> None:
        """This session has run ``session_s`` seconds without failing (so far)."""
        self.posterior = self.prior.observe(
            self.past_failures, self.past_exposure_s + max(0.0, session_s)
        )

    def seed(self, est: Estimates) -> None:
        """Start from a previous session's measurements."""
        for mean, value in (
            (self.stall, est.save_stall_s),
            (self.write, est.write_s),
            (self.iteration, est.iteration_s),
        ):
            if value is not None and math.isfinite(value) and value > 0 and mean.value is None:
                mean.value = float(value)
        self._seeded = self.stall.value is not None

    @property
    def checkpoint_s_source(self) -> str:
        """Where δ comes from: measured, previous session, scenario, or first save (pending)."""
        if self.stall.count:
            return "measured"
        if self._seeded:
            return "previous session"
        return "scenario" if self.checkpoint_prior_s is not None else "first save"

    def estimates(self) -> Estimates:
        return Estimates(
            save_stall_s=self.stall.value,
            write_s=self.write.value,
            iteration_s=self.iteration.value,
        )

    # -- decisions --------------------------------------------------------------------------
    @property
    def needs_probe(self) -> bool:
        """True until the iteration time, and δ where the policy uses it, can be known."""
        return self.iteration.value is None or self.needs_first_save

    @property
    def needs_first_save(self) -> bool:
        """No δ from a measurement, a previous session or the scenario, and the policy needs one."""
        unknown = self.stall.value is None and self.checkpoint_prior_s is None
        return unknown and not isinstance(self.policy, FixedInterval)

    @property
    def checkpoint_s(self) -> float | None:
        value = self.stall.value if self.stall.value is not None else self.checkpoint_prior_s
        return None if value is None else max(value, _MIN_CHECKPOINT_S)

    def context(self, age_s: float) -> PolicyContext:
        return learned_context(
            self.posterior,
            checkpoint_s=self.checkpoint_s if self.checkpoint_s is not None else 60.0,
            restart_s=self.restart_s,
            age_s=age_s,
            component=self.component,
            n_components=self.n_components,
        )

    def next_due(self, step: int, *, age_s: float) -> int:
        """The step at which the next save is due, counted from a save (or probe) at ``step``."""
        if self.needs_probe:
            steps = self.probe_steps
            self.interval_s = math.nan
        else:
            interval_s = float(self.policy.next_interval_s(self.context(age_s)))
            if self.asynchronous and self.write.value is not None:
                interval_s = after_the_write(interval_s, self.write.value)
            self.interval_s = interval_s
            steps = interval_steps(interval_s, self.iteration.value)
        self.interval_steps = steps
        due = step + steps
        for m in self.milestones:
            if step < m < due:
                return m
        return due
