"""Smaller saves: the optimizer's moment tensors stored in reduced precision (opt-in).

``optimizer_precision`` of :class:`~simulator.controller.AdaptiveCheckpointer`:

- ``"fp32"`` (the default): nothing is reduced; the checkpoint is exactly what it always was
  and a resume is bit-exact.
- ``"bf16"``: each reduced tensor is stored as bfloat16 (2 bytes a value, ~2x smaller).
- ``"int8"``: 8-bit blockwise, one float32 scale per :data:`BLOCK` values (~3.9x smaller).
  A tensor with a negative value is quantised linearly (``round(x / s)`` in [-127, 127],
  ``s = absmax / 127``). A non-negative one (AdamW's ``exp_avg_sq``) is quantised on the
  square-root scale (``round(sqrt(x) / s)`` in [0, 255], ``s = max(sqrt(x)) / 255``): Adam
  divides by ``sqrt(exp_avg_sq)``, so that is the quantity whose error matters, the result is
  non-negative by construction, and a positive value never rounds to 0 (it is stored as at
  least one step), which would turn its update into ``exp_avg / eps``.

Only the optimizer's per-parameter state is reduced (``optimizer["state"][i][name]``), and of
it only floating tensors of at least :data:`MIN_NUMEL` values whose values are all finite (a
tensor holding inf or NaN is kept exactly as it is); step counters, ``param_groups``, the model
and everything else stay exact. Why 256 values a block: one float32 scale per block costs
4/256 = 1.6 % of the int8 payload, while an outlier only coarsens the 255 values of its own
block (bitsandbytes' blockwise optimizer states use blocks of this order, 256-2048).

On disk a reduced tensor is a small dict in place of the tensor (its bfloat16, or its uint8/int8
codes and float32 scales, in the safetensors file; its shape and original dtype in the JSON),
and the state records ``"precision": {"optimizer": ..., "block": ..., "min_numel": ...}`` in
``meta.json``. A restore follows the checkpoint's record, whatever this run's option, decodes
each tensor back into its original dtype (which the optimizer's ``load_state_dict`` then casts
as it always does) and warns once that the moments are not bit-exact. Decoding trusts nothing:
an entry of the wrong form, a dtype that is no float, codes that do not fit the shape, a
non-finite or negative scale or a decoded value that is not finite is a
:class:`~simulator.ckptio.CorruptCheckpoint` (fall back to an older checkpoint).
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from typing import Any

import torch

from simulator import ckptio
from simulator.ckptio.layout import shown
from simulator.errors import InputError

__all__ = [
    "BLOCK",
    "MIN_NUMEL",
    "PRECISIONS",
    "check_precision",
    "expand_state",
    "reduce_state",
]

PRECISIONS = ("fp32", "bf16", "int8")
BLOCK = 256
"""Values per float32 scale in ``"int8"``."""
MIN_NUMEL = 1024
"""Smaller tensors (biases, norms, step counters) are kept exact: they weigh nothing."""

_KEY = "precision"
_FLOATS = {
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "float32": torch.float32,
    "float64": torch.float64,
}
_NAMES = {v: k for k, v in _FLOATS.items()}
_BF16_KEYS = frozenset({"bf16", "dtype", "shape"})
_INT8_KEYS = frozenset({"int8", "scale", "sqrt", "dtype", "shape"})
_MAX_BLOCK = 1 << 20


def check_precision(value: Any) -> str:
    """``value`` if it is one of :data:`PRECISIONS`, else one clear InputError."""
    if not isinstance(value, str) or value not in PRECISIONS:
        raise InputError(
            f"optimizer_precision must be one of {', '.join(map(repr, PRECISIONS))}, got {value!r}"
        )
    return value


# -- saving -----------------------------------------------------------------------------------
def reduce_state(state: dict[str, Any], precision: str) -> dict[str, Any]:
    """``state`` with its optimizer moments reduced to ``precision`` (a new dict; the live
    optimizer state it references is never modified). ``"fp32"`` returns ``state`` itself."""
    if precision == "fp32" or not isinstance(state.get("optimizer"), Mapping):
        return state
    optim = state["optimizer"]
    per_param = optim.get("state")
    if not isinstance(per_param, Mapping):
        return state
    reduced = {
        pid: (
            {name: _reduce(t, precision) for name, t in entry.items()}
            if isinstance(entry, Mapping)
            else entry
        )
        for pid, entry in per_param.items()
    }
    out = dict(state)
    out["optimizer"] = {**optim, "state": reduced}
    out[_KEY] = {"optimizer": precision, "block": BLOCK, "min_numel": MIN_NUMEL}
    return out


def _reducible(t: Any) -> bool:
    return (
        isinstance(t, torch.Tensor)
        and t.dtype in _NAMES
        and t.dtype != torch.bfloat16
        and t.layout == torch.strided
        and t.numel() >= MIN_NUMEL
        and bool(torch.isfinite(t).all())
    )


def _reduce(t: Any, precision: str) -> Any:
    if not _reducible(t):
        return t
    t = t.detach()
    head = {"dtype": _NAMES[t.dtype], "shape": list(t.shape)}
    if precision == "bf16":
        low = t.to(torch.bfloat16)
        if not bool(torch.isfinite(low).all()):  # a value beyond bfloat16's range: keep it
            return t
        return {"bf16": low.reshape(-1), **head}
    x = t.reshape(-1).float()
    n = x.numel()
    pad = (-n) % BLOCK
    blocks = torch.nn.functional.pad(x, (0, pad)).view(-1, BLOCK)
    nonneg = bool((x >= 0).all())
    if nonneg:
        root = blocks.sqrt()
        scale = root.amax(dim=1) / 255.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        q = torch.round(root / safe[:, None]).clamp_(0, 255)
        q = torch.where(root > 0, q.clamp(min=1), q)  # a positive value never becomes 0
        codes = q.to(torch.uint8)
    else:
        scale = blocks.abs().amax(dim=1) / 127.0
        safe = torch.where(scale > 0, scale, torch.ones_like(scale))
        codes = torch.round(blocks / safe[:, None]).clamp_(-127, 127).to(torch.int8)
    return {"int8": codes.reshape(-1)[:n], "scale": scale, "sqrt": nonneg, **head}


# -- restoring --------------------------------------------------------------------------------
def expand_state(state: dict[str, Any], *, where: str = "") -> tuple[dict[str, Any], str | None]:
    """``state`` with reduced optimizer tensors decoded, and what was lost (None: nothing).

    Raises :class:`~simulator.ckptio.CorruptCheckpoint` for a record or an entry that
    :func:`reduce_state` could not have written.
    """
    if _KEY not in state:
        return state, None
    prefix = f"{where}: " if where else ""

    def bad(what: str) -> ckptio.CorruptCheckpoint:
        return ckptio.CorruptCheckpoint(f"{prefix}malformed state: {what}")

    record = state[_KEY]
    if not (isinstance(record, Mapping) and set(record) == {"optimizer", "block", "min_numel"}):
        raise bad(f"precision is {shown(record, 80)}, not a precision record")
    precision, block = record["optimizer"], record["block"]
    if precision not in ("bf16", "int8"):
        raise bad(f"precision of the optimizer is {shown(precision, 40)}, not 'bf16' or 'int8'")
    if type(block) is not int or not 1 <= block <= _MAX_BLOCK:
        raise bad(f"precision block is {shown(block, 40)}, not a block size")
    if type(record["min_numel"]) is not int or record["min_numel"] < 0:
        raise bad(f"precision min_numel is {shown(record['min_numel'], 40)}")
    optim = state.get("optimizer")
    if not isinstance(optim, Mapping) or not isinstance(optim.get("state"), Mapping):
        raise bad("a reduced-precision checkpoint without an optimizer state")
    decoded: dict = {}
    for pid, entry in optim["state"].items():
        if not isinstance(entry, Mapping):
            decoded[pid] = entry
            continue
        out = {}
        for name, value in entry.items():
            # Ours by its data key; any other dict is the optimizer's own, for it to judge.
            if isinstance(value, Mapping) and ("bf16" in value or "int8" in value):
                try:
                    value = _expand(value, precision, block)
                except ValueError as exc:
                    raise bad(
                        f"optimizer state {shown(pid, 20)}/{shown(name, 40)}: {exc}"
                    ) from None
            out[name] = value
        decoded[pid] = out
    state = {k: v for k, v in state.items() if k != _KEY}
    state["optimizer"] = {**optim, "state": decoded}
    how = "bf16" if precision == "bf16" else f"int8 (blockwise, {block})"
    return state, f"optimizer moments restored from {how}: not bit-exact"


def _expand(entry: Mapping[str, Any], precision: str, block: int) -> torch.Tensor:
    keys = _BF16_KEYS if precision == "bf16" else _INT8_KEYS
    if set(entry) != keys:
        raise ValueError(f"a reduced tensor has keys {shown(sorted(entry), 80)}")
    dtype = _FLOATS.get(entry["dtype"]) if isinstance(entry["dtype"], str) else None
    if dtype is None:
        raise ValueError(f"dtype {shown(entry['dtype'], 40)} is not a float dtype")
    shape = entry["shape"]
    if not (isinstance(shape, list) and all(type(d) is int and d >= 0 for d in shape)):
        raise ValueError(f"shape {shown(shape, 40)} is not a list of sizes")
    n = math.prod(shape)
    if precision == "bf16":
        low = entry["bf16"]
        if not (
            isinstance(low, torch.Tensor) and low.dtype == torch.bfloat16 and low.shape == (n,)
        ):
            raise ValueError(f"bf16 data is {_what(low)}, not {n} bfloat16 values")
        out = low.to(dtype)
    else:
        codes, scale, root = entry["int8"], entry["scale"], entry["sqrt"]
        if type(root) is not bool:
            raise ValueError(f"sqrt is {shown(root, 40)}, not a bool")
        want = torch.uint8 if root else torch.int8
        if not (isinstance(codes, torch.Tensor) and codes.dtype == want and codes.shape == (n,)):
            raise ValueError(f"codes are {_what(codes)}, not {n} {want} values")
        nblocks = -(-n // block)
        if not (
            isinstance(scale, torch.Tensor)
            and scale.dtype == torch.float32
            and scale.shape == (nblocks,)
        ):
            raise ValueError(f"scales are {_what(scale)}, not {nblocks} float32 values")
        if not bool(torch.isfinite(scale).all()) or bool((scale < 0).any()):
            raise ValueError("a scale is negative or not finite")
        pad = nblocks * block - n
        q = torch.nn.functional.pad(codes.float(), (0, pad)).view(nblocks, block)
        x = q * scale[:, None]
        if root:
            x = x.square()
        out = x.reshape(-1)[:n].to(dtype)
    if not bool(torch.isfinite(out).all()):
        raise ValueError(f"decodes to values that are not finite in {entry['dtype']}")
    return out.reshape(shape)


def _what(t: Any) -> str:
    if isinstance(t, torch.Tensor):
        return f"{t.dtype} {tuple(t.shape)}"
    return shown(t, 40)
