"""The failure clock: when each launch of the job is killed, and the kill itself (SIGKILL).

Each launch ("attempt") of the training process gets its own lifetime, drawn up front from a
``simulator.model.failures.Lifetime`` (exponential or Weibull, scaled to this machine: an MTBF of a
minute or two) with a seeded ``numpy.random.Generator``. Every policy in a comparison is run
against the same list, so the k-th launch of each lives exactly as long — common random
numbers: the differences between policies are not differences in luck.

Where the clock starts: the first launch's at the moment the job reports it is training
(``ready``), since the simulated job also starts at work, and every later launch's at the moment
the process is started, so kills can strike during a restart and its checkpoint load — as in
Daly's model, where failures strike during recovery too.

A schedule may also name the class of each launch's end (``classes``, drawn with the
lifetimes from the classes' shares of the rate: for exponential clocks, the superposition of
one clock per class): ``process`` (SIGKILL; the host and its local tier survive), ``node``
(SIGKILL, and the supervisor wipes the job's local tier: the host is gone), ``hang`` (SIGSTOP:
the process freezes, noticed only after a timeout, then SIGKILL) and ``preemption`` (SIGTERM,
then SIGKILL if the job has not exited within the grace period). Without classes every end is
a ``process`` kill, as before.
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from simulator.errors import InputError
from simulator.model.failures import Exponential, Lifetime, Weibull

__all__ = ["CLASSES", "KillSchedule", "freeze", "kill", "make_lifetime", "terminate"]

CLASSES = ("process", "node", "hang", "preemption")
"""The failure classes the supervisor can inject (module docstring)."""


def make_lifetime(mtbf_s: float, weibull_shape: float | None = None) -> Lifetime:
    """Exponential lifetimes with mean ``mtbf_s``, or Weibull of the given shape and mean."""
    if weibull_shape is None:
        return Exponential(mtbf_s)
    return Weibull.from_mean(mtbf_s, weibull_shape)


@dataclass(frozen=True, kw_only=True)
class KillSchedule:
    """The lifetime of every launch of one job, seconds."""

    lifetimes_s: tuple[float, ...]
    """Lifetime of launch k (0-based); launches past the end are never killed."""
    classes: tuple[str, ...] = ()
    """Class of launch k's end (empty: every one a ``process`` kill)."""

    def __post_init__(self):
        if any(not (t > 0) for t in self.lifetimes_s):
            raise InputError("kill lifetimes_s must all be positive seconds")
        if self.classes and len(self.classes) != len(self.lifetimes_s):
            raise InputError("a kill schedule names one class per lifetime")
        unknown = sorted(set(self.classes) - set(CLASSES))
        if unknown:
            raise InputError(f"unknown failure class {unknown[0]!r} (known: {', '.join(CLASSES)})")

    @classmethod
    def draw(cls, lifetime: Lifetime, rng: np.random.Generator, n: int = 200) -> KillSchedule:
        """``n`` lifetimes drawn with the caller's generator."""
        return cls(lifetimes_s=tuple(float(x) for x in lifetime.sample(rng, n)))

    @classmethod
    def draw_mix(
        cls, mtbf_s: float, shares: dict[str, float], rng: np.random.Generator, n: int = 200
    ) -> KillSchedule:
        """``n`` exponential lifetimes of mean ``mtbf_s`` (every class together), each ending
        in a class drawn by its share of the rate."""
        names = list(shares)
        p = np.asarray([shares[k] for k in names], float)
        lifetimes = make_lifetime(mtbf_s).sample(rng, n)
        picks = rng.choice(len(names), size=n, p=p / p.sum())
        return cls(
            lifetimes_s=tuple(float(x) for x in lifetimes),
            classes=tuple(names[i] for i in picks),
        )

    def lifetime_s(self, attempt: int) -> float:
        """How long launch ``attempt`` lives (inf: it is never killed)."""
        return self.lifetimes_s[attempt] if attempt < len(self.lifetimes_s) else float("inf")

    def class_of(self, attempt: int) -> str:
        """How launch ``attempt`` ends when its lifetime is up."""
        return self.classes[attempt] if attempt < len(self.classes) else "process"


def kill(pid: int) -> None:
    """SIGKILL: no handler runs, no buffer is flushed, nothing is cleaned up — a hard crash."""
    _send(pid, signal.SIGKILL)


def freeze(pid: int) -> None:
    """SIGSTOP: the process stops where it is and does nothing more — a hang."""
    _send(pid, signal.SIGSTOP)


def terminate(pid: int) -> None:
    """SIGTERM: what a scheduler sends before it preempts a job."""
    _send(pid, signal.SIGTERM)


def _send(pid: int, sig: int) -> None:
    try:
        os.kill(pid, sig)
    except ProcessLookupError:
        pass  # it finished on its own in the same instant
