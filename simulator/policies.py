"""Checkpoint policies: the one place that decides WHEN the next save is due.

A policy maps what is known now — the save stall δ, the restart cost R, the failure model or
the current estimate of the failure rate, and the time since the last restart — to the compute
time until the next save. The simulator (``simulator.engines.des``) and the live-training controller
(``simulator.controller``) call the very same objects, so what is simulated is what runs.
Policies are pure: no SimPy, no torch, no clocks.

What a policy sees is a ``PolicyContext``; ``PolicyContext.from_scenario`` is the one place a
scenario becomes one (both engines and the optimiser call it), so a rule about what a policy
knows — the job's rate with node failures, the job-level lifetime when the GPU count is
unknown — is written once.
"""

from __future__ import annotations

import functools
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

import numpy as np

from simulator import analytic
from simulator.errors import InputError
from simulator.model.failures import Exponential, Lifetime, Weibull

if TYPE_CHECKING:
    from simulator.model.scenario import Scenario

__all__ = [
    "POLICY_NAMES",
    "USUAL_INTERVALS",
    "USUAL_STEPS",
    "Adaptive",
    "Daly",
    "ExactOptimal",
    "FixedInterval",
    "Policy",
    "PolicyContext",
    "UsualDefault",
    "Young",
    "after_the_write",
    "is_steady",
    "make_policy",
    "optimal_fraction",
]


@dataclass(frozen=True)
class UsualDefault:
    """An interval people configure without a model (a wall-clock timer)."""

    name: str
    """Its policy name among the baselines (``fixed-1h``)."""
    label: str
    """How a table says it (``hourly``)."""
    short: str
    """How a figure's mark says it (``1 h``)."""
    interval_s: float


USUAL_INTERVALS = (
    UsualDefault("fixed-30min", "every 30 min", "30 min", 1800.0),
    UsualDefault("fixed-1h", "hourly", "1 h", 3600.0),
    UsualDefault("fixed-3h", "every 3 h", "3 h", 10800.0),
)
"""The timers every comparison (optimize's table, the baselines, the figures' marks) shows."""
USUAL_STEPS = (500, 1000)
"""The step counts people configure (every 500 / 1000 steps), shown when a step time is known."""


@dataclass(frozen=True, kw_only=True)
class PolicyContext:
    """What a policy may look at when it decides the next save."""

    checkpoint_s: float
    """Current estimate of the training stall of one save, seconds (δ)."""
    restart_s: float
    """Current estimate of the restart cost, seconds (R)."""
    mtbf_s: float
    """Current estimate of the job's mean time between failures, seconds (M)."""
    age_s: float = 0.0
    """Wall time since the job last (re)started, seconds."""
    component: Lifetime | None = None
    """Per-component lifetime model, for hazard-aware policies (None: exponential at mtbf_s)."""
    n_components: int = 1
    """Number of components whose failures stop the job."""
    other_rate_per_s: float = 0.0
    """Long-run rate of the failures ``component`` does not model (node-level ones), per second.

    Hazard-aware policies add it to the components' rate; ``mtbf_s`` already includes it."""
    write_s: float = 0.0
    """Background write time of an asynchronous save, seconds (0: saves block)."""
    failures_seen: int = 0
    """Failures the job has met so far (a learning policy's evidence; 0 for the others)."""
    exposure_s: float = 0.0
    """Running time over which ``failures_seen`` were met, seconds (recovery excluded)."""
    checkpoints_committed: int = 0
    """Saves completed so far (0: a restart now would start the job from scratch)."""
    saves_since_start: int = 0
    """Saves begun since the job last (re)started."""

    @classmethod
    def from_scenario(
        cls, scenario: Scenario, *, age_s: float = 0.0, whole_job: bool = False
    ) -> PolicyContext:
        """What a policy sees of ``scenario``, at ``age_s`` seconds since the last (re)start.

        δ is the training stall of one save, R the whole recovery, M the job's MTBF with every
        failure source (``Scenario.system_mtbf_s``). The component model is each GPU's lifetime
        when ``gpus`` is known, the node-level failures riding on top as ``other_rate_per_s``;
        without ``gpus`` it is the job's own lifetime (the job renews as one unit), which is
        also what ``whole_job`` asks for. Without a failure rate, M is infinite and there is
        no component: only a fixed interval can decide.
        """
        base = dict(
            checkpoint_s=scenario.save_stall_s,
            restart_s=scenario.recovery_s,
            age_s=age_s,
            write_s=scenario.background_write_s,
        )
        if not scenario.has_mtbf:
            return cls(mtbf_s=math.inf, **base)
        if scenario.gpus is None or whole_job:
            component, n, other = scenario.system_lifetime(), 1, 0.0
        else:
            component, n = scenario.gpu_lifetime(), scenario.gpus
            other = scenario.node_failure_rate_per_s
        return cls(
            mtbf_s=scenario.system_mtbf_s,
            component=component,
            n_components=n,
            other_rate_per_s=other,
            **base,
        )


@runtime_checkable
class Policy(Protocol):
    """Answers: how much compute time from now until the next save is due?"""

    name: str

    def next_interval_s(self, ctx: PolicyContext) -> float: ...


def after_the_write(interval_s: float, write_s: float) -> float:
    """An asynchronous save's interval: no shorter than its background write, which must end
    before the next save may start. The one rule the live controller's async clamp, the
    learning ``ControllerPolicy`` and the tier plan apply."""
    return max(float(interval_s), float(write_s))


def is_steady(policy: Policy) -> bool:
    """Whether ``policy`` gives one interval all run long: it reads only the scenario's part of
    the context (δ, R, the MTBF), never the age, the failures seen, the exposure or the saves.
    A policy says so with a class attribute ``steady = True``; the DES then books the saves
    between two failures without asking it again (``tests/test_policies.py`` checks every
    policy that claims it against contexts that differ in everything else)."""
    return bool(getattr(policy, "steady", False))


def _phi(a: float) -> float:
    """−a − ln(1 − a) = Σ_{k≥2} aᵏ/k; the series avoids cancellation for small a."""
    if a < 0.05:
        return a * a * sum(a ** (k - 2) / k for k in range(2, 14))
    return -a - math.log1p(-a)


def optimal_fraction(x: float) -> float:
    """τ*/M for x = δ/M: the root a ∈ (0, 1) of −a − ln(1 − a) = x (scalar, fast).

    The same root as ``analytic.optimal_interval`` (which handles arrays and Lambert W);
    this scalar Newton solve is what policies call once per decision, thousands of times
    per simulated job. For x >= 0.5 it solves for b = −ln(1 − a), where b − 1 + e^(−b) = x
    stays well conditioned as a approaches 1.
    """
    if x >= 0.5:
        b = x + 1.0
        for _ in range(60):
            step = (b - 1.0 + math.exp(-b) - x) / (-math.expm1(-b))
            b -= step
            if abs(step) <= 1e-15 * b:
                break
        return -math.expm1(-b)
    a = min(math.sqrt(2.0 * x), 0.9)
    for _ in range(60):
        step = (_phi(a) - x) * (1.0 - a) / a  # φ'(a) = a / (1 − a)
        a = min(max(a - step, 0.5 * a), 0.5 * (a + 1.0))
        if abs(step) <= 1e-15 * a:
            break
    return a


@functools.lru_cache(maxsize=4096)
def _optimal_s(delta_s: float, mtbf_s: float) -> float:
    if not (delta_s > 0 and mtbf_s > 0):
        raise InputError(f"need positive checkpoint_s and mtbf_s, got {delta_s!r}, {mtbf_s!r}")
    if math.isinf(mtbf_s):
        return math.inf
    return mtbf_s * optimal_fraction(delta_s / mtbf_s)


# Decisions repeat with the same (δ, M) all run long; caching keeps numpy off the hot path.
@functools.lru_cache(maxsize=4096)
def _young_s(delta_s: float, mtbf_s: float) -> float:
    return float(analytic.young_interval(delta_s, mtbf_s))


@functools.lru_cache(maxsize=4096)
def _daly_s(delta_s: float, mtbf_s: float) -> float:
    return float(analytic.daly_interval(delta_s, mtbf_s))


@dataclass(frozen=True)
class FixedInterval:
    """Save every ``interval_s`` seconds of compute, whatever happens."""

    interval_s: float
    name: str = "fixed"
    steady = True

    def __post_init__(self):
        if not (math.isfinite(self.interval_s) and self.interval_s > 0):
            raise InputError(
                f"interval_s must be a positive number of seconds, got {self.interval_s!r}"
            )

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return float(self.interval_s)


@dataclass(frozen=True)
class Young:
    """Young (1974): τ = sqrt(2 δ M)."""

    name: str = "young"
    steady = True

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return _young_s(float(ctx.checkpoint_s), float(ctx.mtbf_s))


@dataclass(frozen=True)
class Daly:
    """Daly (2006) higher-order estimate."""

    name: str = "daly"
    steady = True

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return _daly_s(float(ctx.checkpoint_s), float(ctx.mtbf_s))


@dataclass(frozen=True)
class ExactOptimal:
    """The exact minimiser of Daly's expected wall time (exponential failures)."""

    name: str = "optimal"
    steady = True

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return _optimal_s(float(ctx.checkpoint_s), float(ctx.mtbf_s))


def _cumulative_hazard(component: Lifetime, t_s: float) -> float:
    """H(t) = −log S(t) of one component; scipy's logsf keeps precision when S(t) ≈ 1."""
    if isinstance(component, Weibull):
        return (t_s / component.scale) ** component.shape
    if isinstance(component, Exponential):
        return t_s / component.mean
    try:
        return float(-component._frozen().logsf(t_s))
    except NotImplementedError:
        with np.errstate(divide="ignore"):
            return float(-np.log(component.survival(t_s)))


@dataclass(frozen=True)
class Adaptive:
    """Hazard-aware interval: the exact optimum at the failure rate expected over the next interval.

    Without ``ctx.component`` this is ``ExactOptimal`` at ``ctx.mtbf_s`` (the controller feeds
    the posterior MTBF there). With a component model, the job is taken to have restarted with
    ``ctx.n_components`` components of age ``ctx.age_s`` — the hazard-since-restart view — whose
    system rate is n·h(age). For Weibull shape < 1 that rate is infinite at age 0, so rather
    than the instantaneous rate the policy uses the mean rate over the interval it is about to
    choose, n·(H(a + τ) − H(a))/τ, and solves τ = optimum(δ, 1 / rate) by fixed-point
    iteration. The local MTBF is kept within a factor ``bound`` of ``ctx.mtbf_s`` so a model's
    extreme tails (the first minutes of a Weibull, the far end of a lognormal) cannot drive
    the interval to zero or infinity.

    ``renews`` says which components are new at age 0. ``"one"`` (the default, and what the
    simulator models): a failure replaces only the failed part, so at age a one part is a old
    and the other n − 1 are in their long-run state, failing at (n − 1)/mean together; on a
    large cluster this is close to exponential, as the superposition of many renewal processes
    is. ``"all"``: every part is new at a restart (one component, or a job that lands on a
    fresh allocation), the system rate is n·h(age). Failures outside the component model
    (``ctx.other_rate_per_s``: node-level ones) add their long-run rate either way.
    """

    bound: float = 10.0
    """Largest ratio between the local MTBF and ``ctx.mtbf_s`` (either way)."""
    renews: str = "one"
    """Which components are new after a restart: ``"one"`` (the failed part) or ``"all"``."""
    name: str = "adaptive"

    def __post_init__(self):
        if not (math.isfinite(self.bound) and self.bound >= 1):
            raise InputError(f"adaptive bound must be a ratio >= 1, got {self.bound!r}")
        if self.renews not in ("one", "all"):
            raise InputError(f"adaptive renews must be 'one' or 'all', got {self.renews!r}")

    def local_mtbf_s(self, ctx: PolicyContext, interval_s: float) -> float:
        """1 / (mean system failure rate over the next ``interval_s`` from age ``ctx.age_s``)."""
        if ctx.component is None:
            return float(ctx.mtbf_s)
        age = float(ctx.age_s)
        dh = _cumulative_hazard(ctx.component, age + interval_s)
        dh -= _cumulative_hazard(ctx.component, age)
        if self.renews == "all":
            rate = ctx.n_components * dh / interval_s
        else:
            rate = dh / interval_s + (ctx.n_components - 1) / ctx.component.mean_s
        rate += ctx.other_rate_per_s
        lo, hi = ctx.mtbf_s / self.bound, ctx.mtbf_s * self.bound
        return float(min(max(1.0 / rate if rate > 0 else math.inf, lo), hi))

    def next_interval_s(self, ctx: PolicyContext) -> float:
        delta = float(ctx.checkpoint_s)
        tau = _optimal_s(delta, float(ctx.mtbf_s))
        if ctx.component is None:
            return tau
        # The map τ -> optimum(δ, local MTBF(τ)) is monotone and flat near its fixed point;
        # a handful of steps settles it to well under a second.
        for _ in range(30):
            new = _optimal_s(delta, self.local_mtbf_s(ctx, tau))
            if abs(new - tau) <= 1e-9 * tau:
                return new
            tau = new
        return tau


POLICY_NAMES = ("fixed", "young", "daly", "optimal", "adaptive", "controller")


def make_policy(name: str, interval_s: float | None = None) -> Policy:
    """A policy by its command-line name (``interval_s`` given: a fixed interval)."""
    if interval_s is not None:
        return FixedInterval(interval_s)
    table = {
        "young": Young,
        "daly": Daly,
        "optimal": ExactOptimal,
        "adaptive": Adaptive,
        "controller": _controller_policy,
    }
    if name not in table:
        hint = " (fixed needs interval_s)" if name == "fixed" else ""
        raise InputError(f"unknown policy {name!r}{hint}; use one of {', '.join(table)}")
    return table[name]()


def _controller_policy() -> Policy:
    from simulator.controller.schedule import ControllerPolicy  # torch-free; it imports us

    return ControllerPolicy()
