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

Reading back trusts nothing: :func:`unflatten` refuses a tree :func:`flatten` could not have
written, and :func:`check_state` (run by :func:`restore_state` before anything is loaded, and by
the checkpointer right after a read) refuses a state whose step, RNG states or sections have
the wrong form. Both raise :class:`~simulator.ckptio.CorruptCheckpoint`: a malformed state is
damage, and a restore falls back to an older checkpoint. A well-formed state that an object's
own ``load_state_dict`` refuses does not fit this run: ``IncompatibleCheckpoint``, a stop.
"""

from __future__ import annotations

import base64
import math
import random
import re
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from typing import Any

import numpy as np
import torch

from simulator import ckptio
from simulator.ckptio.layout import shown
from simulator.controller.integrity import IncompatibleCheckpoint
from simulator.controller.schedule import Estimates
from simulator.errors import InputError

__all__ = [
    "UnsupportedState",
    "capture_state",
    "check_rng_state",
    "check_state",
    "flatten",
    "restore_state",
    "rng_state",
    "set_rng_state",
    "stage",
    "tensor_places",
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
    """Put back what :func:`rng_state` returned; a malformed state (checked first, so no
    generator is touched) is a :class:`~simulator.ckptio.CorruptCheckpoint`."""
    check_rng_state(state)
    random.setstate(state["python"])
    np.random.set_state(state["numpy"])  # noqa: NPY002
    torch.set_rng_state(state["torch"])
    if "cuda" in state and torch.cuda.is_available():
        torch.cuda.set_rng_state_all(list(state["cuda"]))


def check_rng_state(state: Any, where: str = "rng") -> None:
    """Raise CorruptCheckpoint unless ``state`` is an RNG state :func:`set_rng_state` takes.

    The form is checked here, and the values by each library's own setter on a throwaway
    generator, so the global generators stay as they were. CUDA states are checked for form
    only; their values are torch's to refuse when they are set.
    """

    def bad(what: str) -> ckptio.CorruptCheckpoint:
        return ckptio.CorruptCheckpoint(f"malformed state: {where}{what}")

    if not isinstance(state, Mapping):
        raise bad(f" is a {type(state).__name__}, not a dict")
    for key in ("python", "numpy", "torch"):
        if key not in state:
            raise bad(f" has no {key!r} state")
    py = state["python"]
    if not (
        isinstance(py, tuple)
        and len(py) == 3
        and isinstance(py[1], tuple)
        and all(type(v) is int for v in py[1])
        and (py[2] is None or type(py[2]) is float)
    ):
        raise bad(f"['python'] is {shown(py)}, not (version, tuple of ints, gauss)")
    np_state = state["numpy"]
    if not (
        isinstance(np_state, tuple)
        and len(np_state) == 5
        and isinstance(np_state[1], np.ndarray)
        and np_state[1].dtype == np.uint32
        and np_state[1].shape == (624,)
        and all(type(v) is int for v in np_state[2:4])
        and 0 <= np_state[2] <= 624
        and type(np_state[4]) is float
    ):
        raise bad(f"['numpy'] is {shown(np_state)}, not NumPy's legacy MT19937 state")
    tensors = [("torch", state["torch"])]
    if "cuda" in state:
        if not isinstance(state["cuda"], list | tuple):
            raise bad(f"['cuda'] is a {type(state['cuda']).__name__}, not a list of states")
        tensors += [(f"cuda'][{i}", t) for i, t in enumerate(state["cuda"])]
    for key, t in tensors:
        if not (
            isinstance(t, torch.Tensor)
            and t.dtype == torch.uint8
            and t.dim() == 1
            and t.device.type == "cpu"
        ):
            what = f"{t.dtype} {tuple(t.shape)}" if isinstance(t, torch.Tensor) else shown(t)
            raise bad(f"['{key}'] is {what}, not a 1-D uint8 CPU tensor")
    setters = [
        ("python", random.Random().setstate, py),
        ("numpy", np.random.RandomState().set_state, np_state),
        ("torch", torch.Generator().set_state, state["torch"]),
    ]
    for key, setter, value in setters:
        try:
            setter(value)
        except (TypeError, ValueError, OverflowError, RuntimeError) as exc:
            raise bad(f"['{key}'] is refused by its generator: {shown(str(exc))}") from None


_SECTIONS = ("model", "optimizer", "scheduler", "scaler", "dataloader")


def check_state(state: Any, *, where: str | None = None) -> Any:
    """Return ``state`` if it has the form :func:`restore_state` relies on, else raise
    :class:`~simulator.ckptio.CorruptCheckpoint` (``where``: the checkpoint, for the reason).

    Malformed — the parts the controller itself decodes: the state a dict, ``step`` a count,
    the RNG states, each object's section a dict, the controller's estimates numbers, the
    config a dict. That is damage (fall back to an older checkpoint), unlike state that is
    well-formed but does not fit this run, which :func:`restore_state` reports as
    :class:`~simulator.controller.integrity.IncompatibleCheckpoint` or KeyError.
    """
    try:
        if not isinstance(state, Mapping):
            raise ckptio.CorruptCheckpoint(f"malformed state: a {type(state).__name__}, not a dict")
        step = state.get("step")
        if type(step) is not int or step < 0:
            raise ckptio.CorruptCheckpoint(f"malformed state: step is {shown(step, 40)}")
        check_rng_state(state.get("rng"))
        for name in (*_SECTIONS, "extra", "config", "controller"):
            if name in state and not isinstance(state[name], Mapping):
                raise ckptio.CorruptCheckpoint(
                    f"malformed state: {name} is a {type(state[name]).__name__}, not a dict"
                )
        bad = Estimates.bad_entry(state.get("controller", {}))
        if bad is not None:
            key, value = bad
            raise ckptio.CorruptCheckpoint(
                f"malformed state: controller estimate {shown(key, 40)} = {shown(value, 40)}"
            )
    except ckptio.CorruptCheckpoint as exc:
        if where is None:
            raise
        raise ckptio.CorruptCheckpoint(f"{where}: {exc}") from None
    return state


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
    check_state(state)
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
    for key in extra or {}:
        if key not in state.get("extra", {}):
            raise KeyError(f"checkpoint has no extra state {key!r}")
    by_backend = backend is not None and model is not None
    if by_backend:
        with _not_fitting("model" if optimizer is None else "model and optimizer"):
            backend.load_model_state_dict(
                model, optimizer, state["model"], state.get("optimizer", {})
            )
    for name, obj in objects:
        if obj is None or (by_backend and name in ("model", "optimizer")):
            continue
        # A disabled GradScaler saves {}, and refuses to load it.
        if name == "scaler" and not state[name]:
            continue
        with _not_fitting(name):
            obj.load_state_dict(state[name])
    for key, obj in list((extra or {}).items()):
        if _has_state(obj):
            with _not_fitting(f"extra {key!r}"):
                obj.load_state_dict(state["extra"][key])
        else:  # a value (a prefetched batch): the saved one replaces it
            extra[key] = state["extra"][key]
    set_rng_state(state["rng"])
    return state["step"]


@contextmanager
def _not_fitting(name: str) -> Iterator[None]:
    """What an object's own ``load_state_dict`` refuses does not fit it: IncompatibleCheckpoint
    (a stop, not a fallback), whatever the exception type it used."""
    try:
        yield
    except (KeyError, RuntimeError, ValueError, TypeError, AttributeError, IndexError) as exc:
        if isinstance(exc, IncompatibleCheckpoint):
            raise
        raise IncompatibleCheckpoint(
            f"the saved {name} state does not load ({type(exc).__name__}: {summary(exc)})"
        ) from exc


def summary(exc: BaseException, lines: int = 3) -> str:
    """An exception's message on one line: its first ``lines`` non-blank lines joined with
    "; " (torch's ``load_state_dict`` puts a heading first and each mismatch on a line of its
    own, so the heading alone says nothing), and how many more there were."""
    text = [line.strip() for line in str(exc).splitlines() if line.strip()]
    if not text:
        return type(exc).__name__
    head = " ".join(text[:2]) if text[0].endswith(":") and len(text) > 1 else text[0]
    rest = text[2:] if head != text[0] else text[1:]
    shown_lines = [head, *rest[: lines - 1]]
    more = len(rest) - (lines - 1)
    return "; ".join(shown_lines) + (f" (and {more} more)" if more > 0 else "")


def stage(state: Any, *, reuse: dict | None = None) -> tuple[Any, dict]:
    """A snapshot of ``state`` that training can no longer change: the stall of an async save.

    Tensors are copied to CPU by :func:`simulator.ckptio.stage` (pinned memory for CUDA);
    everything else is rebuilt from its JSON form, which is a deep copy. Returns the snapshot
    and its flat tensors; those, passed back as ``reuse`` once nothing reads them any more
    (the previous background write has finished), are copied into again where names, shapes
    and dtypes match, instead of fresh memory (page faults on a CPU, page-locking for CUDA).
    """
    tensors, tree = flatten(state)
    staged = ckptio.stage(tensors, out=reuse)
    return unflatten(staged, tree), staged


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


def tensor_places(tree: Any) -> dict[str, frozenset[tuple]]:
    """Where each tensor key of a :func:`flatten` tree sits in the state, as paths (dict keys
    and list positions; a non-string-keyed dict's keys where they are plain). Any JSON is
    walked (a checkpoint's tree is untrusted); what is no tensor reference is passed over."""
    places: dict[str, set[tuple]] = {}
    pending = [(tree, ())]
    while pending:
        node, path = pending.pop()
        if isinstance(node, list):
            pending += [(v, (*path, i)) for i, v in enumerate(node) if type(v) not in _PLAIN]
        elif isinstance(node, dict):
            if len(node) == 1 and isinstance(node.get("__tensor__"), str):
                places.setdefault(node["__tensor__"], set()).add(path)
            elif len(node) == 1 and isinstance(node.get("__dict__"), list):
                for i, pair in enumerate(node["__dict__"]):
                    if isinstance(pair, list) and len(pair) == 2:
                        key = pair[0] if type(pair[0]) in _PLAIN else ("__key__", i)
                        pending += [(pair[0], (*path, ("__key__", i))), (pair[1], (*path, key))]
            else:
                pending += [(v, (*path, k)) for k, v in node.items()]
    return {key: frozenset(paths) for key, paths in places.items()}


def unflatten(tensors: Mapping[str, torch.Tensor], tree: Any) -> Any:
    """Inverse of :func:`flatten`.

    A tree that :func:`flatten` could not have written (a tag with a value of the wrong form,
    a tensor the tensor file lacks, an array of a dtype that is no number, nesting deeper than
    any state) is a :class:`~simulator.ckptio.CorruptCheckpoint` naming where it was found.
    """
    try:
        return _decode(tensors, tree)
    except _Malformed as exc:
        where = "state" + "".join(f"[{p!r}]" for p in reversed(exc.path))
        raise ckptio.CorruptCheckpoint(f"malformed state tree at {where}: {exc}") from None
    except RecursionError:
        raise ckptio.CorruptCheckpoint("malformed state tree: nested too deeply") from None


class _Malformed(Exception):
    """Raised inside :func:`_decode`; each level on the way out adds its key to ``path``."""

    def __init__(self, reason: str):
        super().__init__(reason)
        self.path: list = []


def _decode(tensors: Mapping[str, torch.Tensor], tree: Any) -> Any:
    if isinstance(tree, list):
        if all(type(v) in _PLAIN for v in tree):
            return list(tree)
        return _decode_items(tensors, tree)
    if not isinstance(tree, dict):
        return tree
    if len(tree) == 1:
        ((tag, value),) = tree.items()
        if tag in _TAGS:
            try:
                return _decode_tag(tensors, tag, value)
            except _Malformed as exc:
                exc.path.append(tag)
                raise
    if any(k in _TAGS for k in tree):
        raise _Malformed(f"tagged dict with keys {shown(sorted(tree))}")
    out = {}
    for k, v in tree.items():
        try:
            out[k] = _decode(tensors, v)
        except _Malformed as exc:
            exc.path.append(k)
            raise
    return out


def _decode_items(tensors: Mapping[str, torch.Tensor], items: list) -> list:
    out = []
    for i, v in enumerate(items):
        try:
            out.append(_decode(tensors, v))
        except _Malformed as exc:
            exc.path.append(i)
            raise
    return out


def _decode_tag(tensors: Mapping[str, torch.Tensor], tag: str, value: Any) -> Any:
    if tag == "__tensor__":
        if type(value) is not str or value not in tensors:
            raise _Malformed(f"names tensor {shown(value)}, which the tensor file does not hold")
        return tensors[value]
    if tag == "__tuple__":
        if not isinstance(value, list):
            raise _Malformed(f"a tuple must be a list, got {type(value).__name__}")
        return tuple(_decode(tensors, value))
    if tag == "__dict__":
        if not isinstance(value, list):
            raise _Malformed(f"a dict must be a list of pairs, got {type(value).__name__}")
        out = {}
        for pair in value:
            if not (isinstance(pair, list) and len(pair) == 2):
                raise _Malformed(f"a dict item must be a [key, value] pair, got {shown(pair)}")
            key = _decode(tensors, pair[0])
            try:
                hash(key)
            except TypeError:
                raise _Malformed(f"dict key {shown(key)} is not hashable") from None
            out[key] = _decode(tensors, pair[1])
        return out
    if tag == "__bytes__":
        try:
            return base64.b64decode(value, validate=True)
        except (TypeError, ValueError):
            raise _Malformed(f"{shown(value)} is not base64") from None
    if tag == "__ndarray__":
        if not (isinstance(value, list) and len(value) == 3):
            raise _Malformed(f"an array must be [dtype, shape, data], got {shown(value)}")
        dtype, shape, data = value
        dtype = _number_dtype(dtype)
        if not (
            isinstance(shape, list)
            and all(type(n) is int and n >= 0 for n in shape)
            and isinstance(data, list)
            and math.prod(shape) == len(data)
            and all(type(v) in (int, float, bool) for v in data)
        ):
            raise _Malformed(f"array shape {shown(shape, 40)} does not match its flat data")
        try:
            return np.asarray(data, dtype=dtype).reshape(shape)
        except (TypeError, ValueError, OverflowError) as exc:
            raise _Malformed(f"array data do not fit {dtype} ({exc})") from None
    # "__npscalar__"
    if not (isinstance(value, list) and len(value) == 2):
        raise _Malformed(f"a NumPy scalar must be [dtype, value], got {shown(value)}")
    dtype = _number_dtype(value[0])
    if type(value[1]) not in (int, float, bool):
        raise _Malformed(f"NumPy scalar {shown(value[1])} is not a number")
    try:
        return dtype.type(value[1])
    except (TypeError, ValueError, OverflowError) as exc:
        raise _Malformed(f"{shown(value[1])} does not fit {dtype} ({exc})") from None


_NUMBER_DTYPE = re.compile(r"[<>|=]?[biuf]\d{1,2}")
"""The form of a ``dtype.str`` :func:`flatten` stores for a bool, int or float (``<f8``,
``|b1``): anything else is refused before NumPy parses it (its parser also builds subarray
and record dtypes from strings such as ``(-1,)f8``, and fails on some with ValueError)."""


def _number_dtype(name: Any) -> np.dtype:
    """The NumPy dtype ``name`` if it is one :func:`flatten` stores (bool, int, float)."""
    try:
        ok = isinstance(name, str) and _NUMBER_DTYPE.fullmatch(name) is not None
        dtype = np.dtype(name) if ok else None
    except (TypeError, ValueError):
        dtype = None
    if dtype is None or dtype.kind not in "biuf":
        raise _Malformed(f"dtype {shown(name, 40)} is not a bool, integer or float dtype")
    return dtype
