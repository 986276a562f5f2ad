"""A small text corpus the project generates itself, so the closed-loop study needs no download.

Sentences come from a tiny probabilistic grammar (subject, verb, object, an optional clause)
over a few hundred words, drawn with a seeded ``numpy.random.Generator``: the same seed gives
the same bytes on every machine. The text has enough structure (agreement-free but regular
word order, recurring phrases) that a character-level model's loss visibly falls within a few
hundred steps, which is all the study needs from it.
"""

from __future__ import annotations

import numpy as np

__all__ = ["VOCAB", "decode", "encode", "generate_corpus"]

_SUBJECTS = (
    "the cluster",
    "a node",
    "the scheduler",
    "every worker",
    "the operator",
    "a replica",
    "the storage array",
    "the old server",
    "a young engineer",
    "the training job",
    "the model",
    "our team",
    "the network",
    "a spare machine",
    "the controller",
    "the night shift",
)
_VERBS = (
    "writes",
    "reads",
    "restarts",
    "checks",
    "saves",
    "loses",
    "finds",
    "moves",
    "counts",
    "repairs",
    "measures",
    "waits for",
    "replaces",
    "sends",
    "keeps",
    "drops",
)
_OBJECTS = (
    "the checkpoint",
    "a large file",
    "the last good state",
    "every shard",
    "the optimizer",
    "a batch of tokens",
    "the failure log",
    "a broken disk",
    "the gradient",
    "the weights",
    "a quiet hour",
    "the learning rate",
    "a long queue",
    "the data loader",
    "the manifest",
)
_CLAUSES = (
    "before the power fails",
    "after the restart",
    "while the fans spin",
    "when the job ends",
    "because the disk is slow",
    "as the loss falls",
    "until the morning",
    "without a sound",
    "in the cold room",
    "at the end of the epoch",
)


def generate_corpus(n_sentences: int = 4000, seed: int = 0) -> str:
    """``n_sentences`` sentences of the grammar, deterministic in ``seed``."""
    rng = np.random.default_rng(seed)
    parts = []
    for _ in range(n_sentences):
        words = [
            _SUBJECTS[rng.integers(len(_SUBJECTS))],
            _VERBS[rng.integers(len(_VERBS))],
            _OBJECTS[rng.integers(len(_OBJECTS))],
        ]
        if rng.random() < 0.5:
            words.append(_CLAUSES[rng.integers(len(_CLAUSES))])
        sentence = " ".join(words)
        parts.append(sentence[0].upper() + sentence[1:] + ".")
    return " ".join(parts) + "\n"


# Every character the grammar can emit, fixed so the vocabulary never depends on the sample.
VOCAB = "".join(
    sorted(
        set("".join(_SUBJECTS + _VERBS + _OBJECTS + _CLAUSES).upper())
        | set("".join(_SUBJECTS + _VERBS + _OBJECTS + _CLAUSES))
        | {" ", ".", "\n"}
    )
)
_INDEX = {c: i for i, c in enumerate(VOCAB)}


def encode(text: str) -> np.ndarray:
    """Character ids (uint8) of ``text``."""
    return np.fromiter((_INDEX[c] for c in text), dtype=np.uint8, count=len(text))


def decode(ids) -> str:
    return "".join(VOCAB[int(i)] for i in ids)
