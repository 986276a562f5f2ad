"""The complete state of a training run, and its lossless split into tensors plus JSON.

A run resumes bit-exactly only if everything that shapes its future is saved: the model, the
optimizer, the LR scheduler, the AMP grad scaler, the data position, the Python, NumPy and torch
RNG states (CUDA too where present) and the step. :func:`capture_state` gathers them into one
nested dict; :func:`restore_state` puts them back. An ``extra`` entry is either an object with
``state_dict``/``load_state_dict`` or a plain value (tensors and containers of them, such as a
batch prefetched before the step ended), which restore puts back into the ``extra`` mapping.

On disk that dict becomes a flat ``{key: tensor}`` map (for safetensors) plus a JSON tree that
names the tensors by key (:func:`flatten` / :func:`unflatten`). JSON cannot express tuples,
non-string dict keys, bytes or NumPy values, so those are tagged (``{"__tuple__": [...]}``);
anything else is refused with the path where it was found, rather than pickled: loading a
checkpoint must never execute code.
"""

from __future__ import annotations

import base64
import random
from collections.abc import Mapping
from typing import Any

import numpy as np
import torch

from simulator import ckptio
from simulator.errors import InputError

__all__ = [
    "UnsupportedState",
    "capture_state",
    "flatten",
    "restore_state",
    "rng_state",
    "set_rng_state",
    "stage",
    "unflatten",
]

_PLAIN = frozenset({int, float, str, bool, type(None)})
_TAGS = ("__tensor__", "__tuple__", "__dict__", "__bytes__", "__ndarray__", "__npscalar__")


class UnsupportedState(TypeError):
    """A value in a state dict that the checkpoint format does not store (it would need pickle)."""


# -- capture / restore ------------------------------------------------------------------------
def rng_state() -> dict[str, Any]:
    """Python, NumPy (legacy global) and torch RNG states, CUDA per device when available."""
    out = {
        "python": random.getstate(),
        # The legacy global generator: user code and libraries still draw from it.
        "numpy": np.random.get_state(),  # noqa: NPY002
        "torch": torch.get_rng_state(),
    }
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        out["cuda"] = torch.cuda.get_rng_state_all()
    return out


def set_rng_state(state: Mapping[str, Any]) -> None:
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"].to("cpu", torch.uint8))
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all([t.to("cpu", torch.uint8) for t in state["cuda"]])


def capture_state(
    *,
    step: int,
    model=None,
    optimizer=None,
    scheduler=None,
    scaler=None,
    dataloader=None,
    extra: Mapping[str, Any] | None = None,
    config: Mapping[str, Any] | None = None,
    backend=None,
) -> dict[str, Any]:
    """One nested dict with everything a bit-exact resume needs. Tensors are live references.

    ``backend`` (a controller ``Backend``): the model and optimizer state come from its
    ``model_state_dict`` — under ``DistributedBackend`` DCP's ``get_state_dict`` (FQN keys, an
    FSDP2 model's DTensor shards), which also gives a fresh optimizer its state, so a restore
    template has every shard to load into in place. (Captured before the first optimizer
    step, that initialisation is a zero-lr step.)
    """
    state: dict[str, Any] = {"step": int(step), "rng": rng_state()}
    if backend is not None and model is not None:
        state["model"], optim_sd = backend.model_state_dict(model, optimizer)
        if optimizer is not None:
            state["optimizer"] = optim_sd
        model = optimizer = None  # taken
    for name, obj in (
        ("model", model),
        ("optimizer", optimizer),
        ("scheduler", scheduler),
        ("scaler", scaler),
        ("dataloader", dataloader),
    ):
        if obj is not None:
            state[name] = obj.state_dict()
    if extra:
        state["extra"] = {k: _extra_state(k, v) for k, v in extra.items()}
    if config is not None:
        state["config"] = dict(config)
    return state


def _has_state(obj: Any) -> bool:
    return callable(getattr(obj, "state_dict", None)) and callable(
        getattr(obj, "load_state_dict", None)
    )


def _extra_state(key: str, value: Any) -> Any:
    """An ``extra`` entry's state: its ``state_dict()``, or the value itself (tensors, numbers,
    strings and lists/tuples/dicts of them, e.g. a prefetched batch)."""
    if _has_state(value):
        return value.state_dict()
    try:
        flatten(value)
    except UnsupportedState as exc:
        raise InputError(
            f"extra[{key!r}] is a {type(value).__name__}: give it state_dict/load_state_dict, "
            f"or store tensors, numbers, strings and lists/tuples/dicts of them ({exc})"
        ) from None
    return value


def restore_state(
    state: Mapping[str, Any],
    *,
    model=None,
    optimizer=None,
    scheduler=None,
    scaler=None,
    dataloader=None,
    extra: Mapping[str, Any] | None = None,
    backend=None,
) -> int:
    """Load ``state`` into the given objects; returns the step it was taken at.

    ``backend``: model and optimizer load through its ``load_model_state_dict`` (the inverse
    of :func:`capture_state` with the same backend).
    """
    objects = (
        ("model", model),
        ("optimizer", optimizer),
        ("scheduler", scheduler),
        ("scaler", scaler),
        ("dataloader", dataloader),
    )
    for name, obj in objects:
        if obj is not None and name not in state:
            raise KeyError(f"checkpoint has no {name} state but this run has a {name}")
    by_backend = backend is not None and model is not None
    if by_backend:
        backend.load_model_state_dict(model, optimizer, state["model"], state.get("optimizer", {}))
    for name, obj in objects:
        if obj is None or (by_backend and name in ("model", "optimizer")):
            continue
        # A disabled GradScaler saves {}, and refuses to load it.
        if name == "scaler" and not state[name]:
            continue
        obj.load_state_dict(state[name])
    for key, obj in list((extra or {}).items()):
        if key not in state.get("extra", {}):
            raise KeyError(f"checkpoint has no extra state {key!r}")
        if _has_state(obj):
            obj.load_state_dict(state["extra"][key])
        else:  # a value (a prefetched batch): the saved one replaces it
            extra[key] = state["extra"][key]
    set_rng_state(state["rng"])
    return int(state["step"])


def stage(state: Any) -> Any:
    """A snapshot of ``state`` that training can no longer change: the stall of an async save.

    Tensors are copied to CPU by :func:`simulator.ckptio.stage` (pinned memory for CUDA);
    everything else is rebuilt from its JSON form, which is a deep copy.
    """
    tensors, tree = flatten(state)
    return unflatten(ckptio.stage(tensors), tree)


# -- flatten / unflatten ----------------------------------------------------------------------
def _path_key(path: tuple) -> str:
    return "/".join(str(p) for p in path) or "root"


class _Flattener:
    def __init__(self):
        self.tensors: dict[str, torch.Tensor] = {}
        self._views: dict[tuple, str] = {}

    def tensor(self, t: torch.Tensor, path: tuple) -> dict:
        # Tied weights appear as separate tensor objects over one storage: store the bytes
        # once and let the second path alias the first. Other overlaps (slices of one
        # buffer) are copied apart by ckptio, since safetensors refuses shared memory.
        view = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype)
        if t.data_ptr() != 0 and view in self._views:
            return {"__tensor__": self._views[view]}
        key = base = _path_key(path)
        n = 1
        while key in self.tensors:
            key, n = f"{base}#{n}", n + 1
        self.tensors[key] = t.detach()
        if t.data_ptr() != 0:
            self._views[view] = key
        return {"__tensor__": key}

    def encode(self, obj: Any, path: tuple) -> Any:
        if isinstance(obj, torch.Tensor):
            return self.tensor(obj, path)
        if obj is None or isinstance(obj, bool | int | float | str):
            return obj
        if isinstance(obj, Mapping):
            if all(isinstance(k, str) and not k.startswith("__") for k in obj):
                return {k: self.encode(v, (*path, k)) for k, v in obj.items()}
            return {
                "__dict__": [
                    [self.encode(k, (*path, "key")), self.encode(v, (*path, k))]
                    for k, v in obj.items()
                ]
            }
        if isinstance(obj, list | tuple):
            # RNG states are long runs of ints; skip the per-item recursion for those.
            if all(type(v) in _PLAIN for v in obj):
                items = list(obj)
            else:
                items = [self.encode(v, (*path, i)) for i, v in enumerate(obj)]
            return {"__tuple__": items} if isinstance(obj, tuple) else items
        if isinstance(obj, bytes):
            return {"__bytes__": base64.b64encode(obj).decode("ascii")}
        if isinstance(obj, np.ndarray) and obj.dtype.kind in "biuf":
            return {"__ndarray__": [obj.dtype.str, list(obj.shape), obj.ravel().tolist()]}
        if isinstance(obj, np.generic) and obj.dtype.kind in "biuf":
            return {"__npscalar__": [obj.dtype.str, obj.item()]}
        where = "state" + "".join(f"[{p!r}]" for p in path)
        raise UnsupportedState(
            f"cannot store {type(obj).__name__} at {where}: checkpoints hold tensors, numbers, "
            "strings, lists, tuples and dicts only (never pickles)"
        )


def flatten(state: Any) -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested state into ``{key: tensor}`` (live, not copied) and a JSON tree."""
    f = _Flattener()
    tree = f.encode(state, ())
    return f.tensors, tree


def unflatten(tensors: Mapping[str, torch.Tensor], tree: Any) -> Any:
    """Inverse of :func:`flatten`."""
    if isinstance(tree, list):
        if all(type(v) in _PLAIN for v in tree):
            return list(tree)
        return [unflatten(tensors, v) for v in tree]
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        ((tag, value),) = tree.items()
        if tag == "__tensor__":
            return tensors[value]
        if tag == "__tuple__":
            return tuple(unflatten(tensors, value))
        if tag == "__dict__":
            return {unflatten(tensors, k): unflatten(tensors, v) for k, v in value}
        if tag == "__bytes__":
            return base64.b64decode(value)
        if tag == "__ndarray__":
            dtype, shape, data = value
            return np.asarray(data, dtype=np.dtype(dtype)).reshape(shape)
        if tag == "__npscalar__":
            dtype, data = value
            return np.dtype(dtype).type(data)
    if any(k in _TAGS for k in tree):
        raise ValueError(f"malformed checkpoint tree: tagged dict with keys {sorted(tree)}")
    return {k: unflatten(tensors, v) for k, v in tree.items()}
