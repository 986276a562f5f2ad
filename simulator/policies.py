"""Checkpoint policies: the one place that decides WHEN the next save is due.

A policy maps what is known now — the save stall δ, the restart cost R, the failure model or
the current estimate of the failure rate, and the time since the last restart — to the compute
time until the next save. The simulator (``simulator.des``) and the live-training controller
(``simulator.controller``) call the very same objects, so what is simulated is what runs.
Policies are pure: no SimPy, no torch, no clocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Protocol, runtime_checkable

from simulator import analytic
from simulator.errors import InputError
from simulator.failures import Lifetime

__all__ = [
    "Daly",
    "ExactOptimal",
    "FixedInterval",
    "Policy",
    "PolicyContext",
    "Young",
    "make_policy",
]


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


@runtime_checkable
class Policy(Protocol):
    """Answers: how much compute time from now until the next save is due?"""

    name: str

    def next_interval_s(self, ctx: PolicyContext) -> float: ...


@dataclass(frozen=True)
class FixedInterval:
    """Save every ``interval_s`` seconds of compute, whatever happens."""

    interval_s: float
    name: str = "fixed"

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

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return float(analytic.young_interval(ctx.checkpoint_s, ctx.mtbf_s))


@dataclass(frozen=True)
class Daly:
    """Daly (2006) higher-order estimate."""

    name: str = "daly"

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return float(analytic.daly_interval(ctx.checkpoint_s, ctx.mtbf_s))


@dataclass(frozen=True)
class ExactOptimal:
    """The exact minimiser of Daly's expected wall time (exponential failures)."""

    name: str = "optimal"

    def next_interval_s(self, ctx: PolicyContext) -> float:
        return float(analytic.optimal_interval(ctx.checkpoint_s, ctx.mtbf_s))


def make_policy(name: str, interval_s: float | None = None) -> Policy:
    """A policy by its command-line name."""
    if interval_s is not None:
        return FixedInterval(interval_s)
    table = {"young": Young, "daly": Daly, "optimal": ExactOptimal}
    if name not in table:
        raise InputError(f"unknown policy {name!r}; use one of {', '.join(table)}")
    return table[name]()
