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
"""

from __future__ import annotations

import os
import signal
from dataclasses import dataclass

import numpy as np

from simulator.errors import InputError
from simulator.model.failures import Exponential, Lifetime, Weibull

__all__ = ["KillSchedule", "kill", "make_lifetime"]


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

    def __post_init__(self):
        if any(not (t > 0) for t in self.lifetimes_s):
            raise InputError("kill lifetimes_s must all be positive seconds")

    @classmethod
    def draw(cls, lifetime: Lifetime, rng: np.random.Generator, n: int = 200) -> KillSchedule:
        """``n`` lifetimes drawn with the caller's generator."""
        return cls(lifetimes_s=tuple(float(x) for x in lifetime.sample(rng, n)))

    def lifetime_s(self, attempt: int) -> float:
        """How long launch ``attempt`` lives (inf: it is never killed)."""
        return self.lifetimes_s[attempt] if attempt < len(self.lifetimes_s) else float("inf")


def kill(pid: int) -> None:
    """SIGKILL: no handler runs, no buffer is flushed, nothing is cleaned up — a hard crash."""
    try:
        os.kill(pid, signal.SIGKILL)
    except ProcessLookupError:
        pass  # it finished on its own in the same instant
