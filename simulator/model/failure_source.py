"""Failure sources: the wall-clock times at which some component of the cluster fails.

A cluster of ``n`` components whose failed parts are replaced is a superposition of ``n``
renewal processes: each component carries its own age, and after a failure only the replaced
one is new. ``ComponentFailures`` keeps every component's next failure time in a binary heap,
so each failure costs O(log n) whatever the cluster size — one SimPy process per component
would cost O(n) per replica just to set up, and more memory per event.

The failure times depend only on the source's own random stream, never on what the job is
doing, so two policies simulated with the same stream see exactly the same failures (common
random numbers). ``TraceFailures`` (in ``simulator.model.trace``) replays recorded timestamps
instead.

``BurstFailures`` adds correlated bursts to one failure class: after each failure the lifetime
model gives (a burst's first), a random number of further failures of the class follows within
a window, drawn from a stream of their own, so the burst's first failures stay exactly those
of the lifetime model (and common random numbers still hold).
"""

from __future__ import annotations

import heapq
import math
from typing import Protocol

import numpy as np

from simulator.errors import InputError
from simulator.model.failures import Empirical, Exponential, Lifetime, LogNormal, Weibull

__all__ = [
    "BurstFailures",
    "ComponentFailures",
    "Draws",
    "FailureSource",
    "MergedFailures",
    "stationary_residual",
]

_BATCH = 512


class FailureSource(Protocol):
    """Yields failure times (seconds since job start) in increasing order."""

    def next_failure_s(self) -> float:
        """The next failure time; ``math.inf`` when there are no more."""
        ...


def stationary_residual(lifetime: Lifetime, rng: np.random.Generator, size: int) -> np.ndarray:
    """Remaining lives of components of a renewal process long in service (seconds).

    In equilibrium the component in service has a length-biased lifetime L (density
    x·f(x)/mean) and we stand at a uniform point in it, so the remaining life is (1 − U)·L.
    Length-biasing Weibull(k, λ) makes (L/λ)^k Gamma(1 + 1/k); length-biasing a lognormal
    shifts its log-mean by σ²; an empirical (Kaplan–Meier) lifetime weights each failure time
    by its length (``Empirical.length_biased_sample``); exponential lifetimes are memoryless.
    """
    if isinstance(lifetime, Exponential):
        return lifetime.sample(rng, size)
    u = rng.random(size)
    if isinstance(lifetime, Weibull):
        g = rng.gamma(1.0 + 1.0 / lifetime.shape, 1.0, size)
        biased = lifetime.scale * g ** (1.0 / lifetime.shape)
    elif isinstance(lifetime, LogNormal):
        mu = math.log(lifetime.scale) + lifetime.sigma**2
        biased = rng.lognormal(mu, lifetime.sigma, size)
    elif isinstance(lifetime, Empirical):
        biased = lifetime.length_biased_sample(rng, size)
    else:
        raise InputError(
            f"stationary component ages are not available for {lifetime.family} lifetimes; "
            "use component_age = 'new'"
        )
    return (1.0 - u) * biased


class Draws:
    """Values of a distribution drawn from one stream in order, a batch at a time: the k-th
    value asked for is the same whenever it is asked for, so two runs that ask for different
    numbers of values share the ones both asked for (common random numbers)."""

    def __init__(self, lifetime: Lifetime, rng: np.random.Generator):
        self.lifetime, self.rng = lifetime, rng
        self._fresh: list[float] = []

    def next(self) -> float:
        if not self._fresh:
            # Drawing in batches keeps numpy's per-call overhead off each value. Reversed so
            # pop() hands them out in draw order: a job-level lifetime then draws exactly the
            # gaps simulator.engines.fast draws from the same stream (same history).
            self._fresh = np.asarray(self.lifetime.sample(self.rng, _BATCH), float)[::-1].tolist()
        return self._fresh.pop()


class ComponentFailures:
    """Next failure among ``n`` independently ageing, replace-on-failure components."""

    def __init__(
        self,
        lifetime: Lifetime,
        n: int,
        rng: np.random.Generator,
        *,
        stationary: bool = True,
    ):
        if int(n) < 1:
            raise InputError(f"component count must be >= 1, got {n!r}")
        self.lifetime, self.n, self.rng = lifetime, int(n), rng
        first = stationary_residual(lifetime, rng, self.n) if stationary else None
        if first is None:
            first = np.asarray(lifetime.sample(rng, self.n), dtype=float)
        # Only times matter: any failure consumes one spare and renews one part, whichever.
        self._heap: list[float] = first.tolist()
        heapq.heapify(self._heap)
        self._new_life = Draws(lifetime, rng).next

    def next_failure_s(self) -> float:
        t = self._heap[0]
        heapq.heapreplace(self._heap, t + self._new_life())
        return t


class BurstFailures:
    """A class's failures in bursts: each failure of ``source`` starts a burst, and
    ``followups(rng)`` further failures follow it, each at a uniform time within
    ``window_s`` after it (a Neyman–Scott cluster process: follow-ups start no bursts of their
    own). Follow-ups are drawn from ``rng``, a stream of their own, when their burst starts."""

    def __init__(self, source: FailureSource, followups, window_s: float, rng):
        self.source, self.followups, self.window_s, self.rng = source, followups, window_s, rng
        self._first = source.next_failure_s()  # the next burst's start
        self._pending: list[float] = []  # follow-ups not yet handed out (a heap)

    def next_failure_s(self) -> float:
        if self._pending and self._pending[0] < self._first:
            return heapq.heappop(self._pending)
        t = self._first
        if math.isfinite(t):
            n = int(self.followups(self.rng))
            for offset in self.rng.uniform(0.0, self.window_s, n).tolist():
                heapq.heappush(self._pending, t + offset)
        self._first = self.source.next_failure_s()
        return t


class MergedFailures:
    """Failures from several independent sources (e.g. GPUs and whole nodes) in time order."""

    def __init__(self, *sources: FailureSource):
        self._heads = [(s.next_failure_s(), i) for i, s in enumerate(sources)]
        heapq.heapify(self._heads)
        self._sources = sources

    def next_failure(self) -> tuple[float, int]:
        """The next failure time and the index of the source it came from."""
        t, i = self._heads[0]
        heapq.heapreplace(self._heads, (self._sources[i].next_failure_s(), i))
        return t, i

    def next_failure_s(self) -> float:
        return self.next_failure()[0]
