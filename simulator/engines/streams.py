"""Random streams of a simulation, derived from one seed: the one rule both engines follow.

Replica ``i`` of a run seeded ``seed`` uses the ``i``-th child of ``SeedSequence(seed)``
(what ``SeedSequence.spawn`` would give, derived from the spawn key so that asking twice
gives the same answer). Inside a replica, child 0 drives GPU (or job) failures and traces,
child 1 node failures, child 2 everything else (repair times), child ``CLASSES + i`` the
failures of a scenario's failure class i, whose own children 0 and 1 draw that class's
detection times and its bursts' follow-ups (``class_parts``). Because the failure stream
does not depend on the policy or on the engine, policies compared under one seed face the
same failure stream (common random numbers) in either engine.
"""

from __future__ import annotations

import numpy as np

from simulator.errors import InputError

__all__ = [
    "GPU",
    "NODE",
    "OTHER",
    "class_parts",
    "class_streams",
    "replica_seed",
    "replica_seeds",
    "replica_streams",
    "run_seed",
    "search_and_check",
]

GPU, NODE, OTHER, CLASSES = 0, 1, 2, 3
"""Indices of a replica's child streams (failure class i: ``CLASSES + i``)."""


def _child(ss: np.random.SeedSequence, index: int) -> np.random.SeedSequence:
    # Not ss.spawn(): its counter would give a different child the second time it is asked.
    return np.random.SeedSequence(ss.entropy, spawn_key=(*ss.spawn_key, int(index)))


def _as_seed_sequence(seed) -> np.random.SeedSequence:
    if isinstance(seed, np.random.SeedSequence):
        return seed
    if seed is None or (isinstance(seed, int | np.integer) and not isinstance(seed, bool)):
        return np.random.SeedSequence(None if seed is None else int(seed))
    raise InputError(f"a seed must be a whole number or a SeedSequence, got {seed!r}")


def search_and_check(seed) -> tuple[np.random.SeedSequence, np.random.SeedSequence]:
    """The seeds of a search and of its out-of-sample check: children 0 and 1 of ``seed``
    (``SeedSequence(seed).spawn(2)``), so the check meets failures the search never saw."""
    ss = _as_seed_sequence(seed)
    return _child(ss, 0), _child(ss, 1)


def replica_seed(seed, index: int) -> np.random.SeedSequence:
    """The seed of replica ``index``: the same child ``SeedSequence(seed).spawn`` yields."""
    return _child(_as_seed_sequence(seed), index)


def replica_seeds(seed, replicas: int) -> list[np.random.SeedSequence]:
    """Seeds of replicas 0..replicas-1 (see ``replica_seed``)."""
    ss = _as_seed_sequence(seed)
    return [_child(ss, i) for i in range(replicas)]


def replica_streams(rng_or_seed) -> tuple[np.random.Generator, ...]:
    """A replica's three generators (GPU failures, node failures, everything else).

    Given a Generator (a caller's own stream), its three spawned children instead.
    """
    if isinstance(rng_or_seed, np.random.Generator):
        return tuple(rng_or_seed.spawn(3))
    if isinstance(rng_or_seed, bool) or not isinstance(
        rng_or_seed, np.random.SeedSequence | int | np.integer
    ):
        raise InputError(
            f"rng_or_seed must be a Generator, SeedSequence or int, got {rng_or_seed!r}"
        )
    ss = _as_seed_sequence(rng_or_seed)
    return tuple(np.random.default_rng(_child(ss, k)) for k in (GPU, NODE, OTHER))


def run_seed(seed: int | None) -> int:
    """The seed a run records: ``seed``, or fresh entropy when None (so the run can be
    repeated from what it reports); a bad seed is a one-line InputError."""
    if seed is None:
        return int(np.random.SeedSequence().entropy % (2**63))
    if isinstance(seed, bool) or not isinstance(seed, int | np.integer) or seed < 0:
        raise InputError(f"seed must be a non-negative whole number, got {seed!r}")
    return int(seed)


def class_streams(rng_or_seed, n: int) -> list[np.random.Generator]:
    """Generators of a replica's ``n`` failure classes (children CLASSES .. CLASSES + n - 1)."""
    if isinstance(rng_or_seed, np.random.Generator):
        # Spawning again continues the child counter past replica_streams' three.
        return list(rng_or_seed.spawn(n))
    ss = _as_seed_sequence(rng_or_seed)
    return [np.random.default_rng(_child(ss, CLASSES + i)) for i in range(n)]


def class_parts(class_rng: np.random.Generator) -> tuple[np.random.Generator, np.random.Generator]:
    """The streams of a failure class's detection times and of its bursts' follow-ups: children
    0 and 1 of the class's stream (``class_streams``). Spawning draws nothing from the class's
    own stream, so its failure times stay what they are without detection draws or bursts;
    each failure of the class takes the next detection time in order, so schedules compared on
    one seed meet the same detection times too. Ask once per class stream."""
    detection, bursts = class_rng.spawn(2)
    return detection, bursts
