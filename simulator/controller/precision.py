"""Smaller saves: the optimizer's moments, and the model's weights, stored in reduced precision.

Both are opt-in options of :class:`~simulator.controller.AdaptiveCheckpointer`; with the
defaults nothing is reduced, the checkpoint is exactly what it always was and a resume is
bit-exact.

``optimizer_precision`` (the optimizer's per-parameter state, ``optimizer["state"][i][name]``):

- ``"fp32"`` (the default): exact.
- ``"bf16"``: each reduced tensor is stored as bfloat16 (2 bytes a value, ~2x smaller).
- ``"int8"``: 8-bit blockwise, one float32 scale per :data:`BLOCK` values (~3.9x smaller).
  A tensor with a negative value is quantised linearly (``round(x / s)`` in [-127, 127],
  ``s = absmax / 127``). A non-negative one (AdamW's ``exp_avg_sq``) is quantised on the
  square-root scale (``round(sqrt(x) / s)`` in [0, 255], ``s = max(sqrt(x)) / 255``): Adam
  divides by ``sqrt(exp_avg_sq)``, so that is the quantity whose error matters, the result is
  non-negative by construction, and a positive value never rounds to 0 (it is stored as at
  least one step), which would turn its update into ``exp_avg / eps``.

``weights_precision`` (the model's state dict, parameters and floating buffers):

- ``"fp32"`` (the default): exact, whatever the model's dtype.
- ``"bf16"``: each float32/float64 tensor is stored as bfloat16 (round to nearest even). It is
  for a run that trains in bf16 with fp32 masters: fp32 parameters under bf16 autocast
  (``torch.autocast``, Lightning's ``"bf16-mixed"``, Hugging Face ``bf16=True``). There the
  parameters are the masters, and what is lost is their low 16 mantissa bits: the fraction of
  a bf16 step that small updates have accumulated since the weight last crossed one, once
  (training on accumulates in fp32 again). The matmuls of the resumed run see the same bf16
  weights autocast made of the masters before the save. A model whose weights are already
  bf16 (``"bf16-true"``) gains nothing: its tensors are stored as they are, so its resume
  stays bit-exact. Where a run keeps fp32 masters outside the model (a list the optimizer
  steps, copied into bf16 weights after each step, as ``ckptsim bench --dtype bf16`` does)
  the model's bf16 weights are ``round(master)`` and redundant (2 of 14 bytes a parameter),
  but they are not dropped: ``optimizer.state_dict()`` holds no parameter values, so the
  masters travel in ``extra`` where nothing says which weight is rounded from which, and
  only the weights make the model loadable by itself. No optimizer this project's adapters
  or tests use keeps masters of its own (torch's optimizers step the parameters; Lightning
  and Hugging Face mixed precision autocast around fp32 parameters; their own saves are
  theirs, the adapters only schedule them).

What is reduced: floating tensors (float16 too for int8; only 4- and 8-byte ones for bf16,
where a 2-byte tensor would shrink by nothing) of at least :data:`MIN_NUMEL` values whose
values are all finite and at most :data:`LIMIT` in magnitude (anything else is kept exactly as
it is, so a decoded value cannot overflow). Step counters, ``param_groups``, small tensors and
everything else stay exact. Why 256 values a block: one float32 scale per block costs 4/256 =
1.6 % of the int8 payload, while an outlier only coarsens the 255 values of its own block
(bitsandbytes' blockwise optimizer states use blocks of this order, 256-2048). Which tensors
qualify is decided in one pass over the whole state with one host-device synchronisation per
device (not one per tensor); the checkpointer encodes a synchronous save on the training
thread and an asynchronous one's staged CPU copy in its background writer, so an async save's
stall is the exact save's.

On disk a reduced tensor is a small dict in place of the tensor (its bfloat16, or its uint8/int8
codes and float32 scales, in the safetensors file; its shape and original dtype in the JSON);
tied weights stay one stored tensor. The state records ``"precision": {"optimizer": ...,
"weights": ..., "block": ..., "min_numel": ...}`` in ``meta.json``, naming what was actually
reduced (a state with nothing to reduce, e.g. before the optimizer's first step, is saved
exactly and records nothing). A restore follows the checkpoint's record, whatever this run's
options, decodes each tensor back into its original dtype (which the optimizer's and model's
``load_state_dict`` then take as they always do) and warns once with what is not bit-exact.
Decoding trusts nothing: an entry of the wrong form, a reduced entry in a section the record
calls exact, a dtype that is no float, data that does not fit the shape, a non-finite or
negative scale or a decoded value that is not finite is a
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
    "LIMIT",
    "MIN_NUMEL",
    "PRECISIONS",
    "WEIGHT_PRECISIONS",
    "check_precision",
    "expand_state",
    "reduce_state",
]

PRECISIONS = ("fp32", "bf16", "int8")
"""``optimizer_precision``'s values."""
WEIGHT_PRECISIONS = ("fp32", "bf16")
"""``weights_precision``'s values."""
BLOCK = 256
"""Values per float32 scale in ``"int8"``."""
MIN_NUMEL = 1024
"""Smaller tensors (biases, norms, step counters) are kept exact: they weigh nothing."""
LIMIT = 2.0**126
"""Largest magnitude reduced (float16: half its largest value): encoded in float32 and decoded
(a square of the int8 square-root scale included), such a value cannot round past the largest
finite value of bfloat16, float32 or its own dtype."""

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
_RECORD = frozenset({"optimizer", "block", "min_numel"})
_MAX_BLOCK = 1 << 20


def check_precision(
    value: Any, *, name: str = "optimizer_precision", allowed: tuple[str, ...] = PRECISIONS
) -> str:
    """``value`` if it is one of ``allowed``, else one clear InputError naming ``name``."""
    if not isinstance(value, str) or value not in allowed:
        raise InputError(f"{name} must be one of {', '.join(map(repr, allowed))}, got {value!r}")
    return value


# -- saving -----------------------------------------------------------------------------------
def reduce_state(
    state: dict[str, Any], optimizer: str = "fp32", *, weights: str = "fp32"
) -> dict[str, Any]:
    """``state`` with its optimizer moments reduced to ``optimizer`` and its model weights to
    ``weights`` (a new dict; the live tensors it references are never modified). Where nothing
    is reduced (both ``"fp32"``, or no tensor qualifies) it returns ``state`` itself."""
    # (section, container key, entry name or None, tensor, how): every candidate first, so
    # which ones qualify is one synchronisation per device, not one per tensor.
    found: list[tuple[str, Any, Any, torch.Tensor, str]] = []
    model = state.get("model")
    if weights == "bf16" and isinstance(model, Mapping):
        found += [("model", k, None, t, "bf16") for k, t in model.items() if _candidate(t, "bf16")]
    optim = state.get("optimizer")
    per_param = optim.get("state") if isinstance(optim, Mapping) else None
    if optimizer != "fp32" and isinstance(per_param, Mapping):
        found += [
            ("optimizer", pid, name, t, optimizer)
            for pid, entry in per_param.items()
            if isinstance(entry, Mapping)
            for name, t in entry.items()
            if _candidate(t, optimizer)
        ]
    ranges = _ranges([t for *_, t, _ in found])
    encoded: dict[tuple, Any] = {}  # tied weights: one stored tensor, as flatten keeps them
    done = {"model": {}, "optimizer": {}}
    for (section, key, name, t, how), (lo, hi) in zip(found, ranges, strict=True):
        if not _in_range(t, lo, hi):
            continue
        view = (t.device, t.data_ptr(), tuple(t.shape), t.stride(), t.dtype, how)
        if view not in encoded:
            encoded[view] = _encode(t.detach(), how, nonneg=lo >= 0)
        done[section][key if name is None else (key, name)] = encoded[view]
    if not done["model"] and not done["optimizer"]:
        return state
    out = dict(state)
    if done["model"]:
        out["model"] = {k: done["model"].get(k, t) for k, t in model.items()}
    if done["optimizer"]:
        reduced = {
            pid: (
                {n: done["optimizer"].get((pid, n), t) for n, t in entry.items()}
                if isinstance(entry, Mapping)
                else entry
            )
            for pid, entry in per_param.items()
        }
        out["optimizer"] = {**optim, "state": reduced}
    out[_KEY] = {
        "optimizer": optimizer if done["optimizer"] else "fp32",
        "weights": weights if done["model"] else "fp32",
        "block": BLOCK,
        "min_numel": MIN_NUMEL,
    }
    return out


def _candidate(t: Any, how: str) -> bool:
    """Whether ``t`` is a tensor ``how`` would shrink (its values not yet looked at)."""
    return (
        isinstance(t, torch.Tensor)
        and t.dtype in _NAMES
        and t.dtype != torch.bfloat16
        and (how != "bf16" or t.element_size() > 2)
        and t.layout == torch.strided
        and t.device.type != "meta"
        and t.numel() >= MIN_NUMEL
    )


def _ranges(tensors: list[torch.Tensor]) -> list[tuple[float, float]]:
    """Each tensor's (min, max), NaN if it holds one: one device-to-host copy per device."""
    out: list[tuple[float, float]] = [(math.nan, math.nan)] * len(tensors)
    by_device: dict[torch.device, list[int]] = {}
    for i, t in enumerate(tensors):
        by_device.setdefault(t.device, []).append(i)
    for idx in by_device.values():
        with torch.no_grad():
            # float32: a float64 beyond its range becomes inf, and is kept exact.
            rows = torch.stack(
                [torch.stack([tensors[i].amin(), tensors[i].amax()]).float() for i in idx]
            )
        for i, (lo, hi) in zip(idx, rows.tolist(), strict=True):
            out[i] = (lo, hi)
    return out


def _in_range(t: torch.Tensor, lo: float, hi: float) -> bool:
    limit = min(LIMIT, torch.finfo(t.dtype).max / 2)
    # NaN fails every comparison, inf the bound: both kept exact.
    return -limit <= lo <= hi <= limit


def _encode(t: torch.Tensor, how: str, *, nonneg: bool) -> dict[str, Any]:
    head = {"dtype": _NAMES[t.dtype], "shape": list(t.shape)}
    if how == "bf16":
        return {"bf16": t.to(torch.bfloat16).reshape(-1), **head}
    x = t.reshape(-1).float()
    n = x.numel()
    pad = (-n) % BLOCK
    blocks = torch.nn.functional.pad(x, (0, pad)).view(-1, BLOCK)
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
    """``state`` with reduced tensors decoded, and what was lost (None: nothing).

    Raises :class:`~simulator.ckptio.CorruptCheckpoint` for a record or an entry that
    :func:`reduce_state` could not have written.
    """
    if _KEY not in state:
        return state, None
    prefix = f"{where}: " if where else ""

    def bad(what: str) -> ckptio.CorruptCheckpoint:
        return ckptio.CorruptCheckpoint(f"{prefix}malformed state: {what}")

    record = state[_KEY]
    # A record without "weights" was written before weights could be reduced: weights exact.
    if not (isinstance(record, Mapping) and _RECORD <= set(record) <= _RECORD | {"weights"}):
        raise bad(f"precision is {shown(record, 80)}, not a precision record")
    precision, block = record["optimizer"], record["block"]
    weights = record.get("weights", "fp32")
    if precision not in PRECISIONS:
        raise bad(f"precision of the optimizer is {shown(precision, 40)}, not one of {PRECISIONS}")
    if weights not in WEIGHT_PRECISIONS:
        raise bad(f"precision of the weights is {shown(weights, 40)}, not 'fp32' or 'bf16'")
    if precision == weights == "fp32":
        raise bad("a precision record that reduces nothing")
    if type(block) is not int or not 1 <= block <= _MAX_BLOCK:
        raise bad(f"precision block is {shown(block, 40)}, not a block size")
    if type(record["min_numel"]) is not int or record["min_numel"] < 0:
        raise bad(f"precision min_numel is {shown(record['min_numel'], 40)}")
    state = {k: v for k, v in state.items() if k != _KEY}
    # Both sections are read whatever the record says: an entry of ours in a section the
    # record calls exact is one reduce_state could not have written.
    lost = []
    optim = state.get("optimizer")
    per_param = optim.get("state") if isinstance(optim, Mapping) else None
    if precision != "fp32" and not isinstance(per_param, Mapping):
        raise bad("a reduced-precision optimizer record without an optimizer state")
    if isinstance(per_param, Mapping):
        decoded: dict = {}
        for pid, entry in per_param.items():
            if not isinstance(entry, Mapping):
                decoded[pid] = entry
                continue
            decoded[pid] = {
                name: _decoded(
                    value,
                    precision,
                    block,
                    lambda: f"optimizer state {shown(pid, 20)}/{shown(name, 40)}",  # noqa: B023
                    bad,
                )
                for name, value in entry.items()
            }
        state["optimizer"] = {**optim, "state": decoded}
    if precision != "fp32":
        how = "bf16" if precision == "bf16" else f"int8 (blockwise, {block})"
        lost.append(f"optimizer moments restored from {how}")
    model = state.get("model")
    if weights == "bf16" and not isinstance(model, Mapping):
        raise bad("a reduced-precision weights record without a model state")
    if isinstance(model, Mapping):
        state["model"] = {
            k: _decoded(v, weights, block, lambda: f"model {shown(k, 60)}", bad)  # noqa: B023
            for k, v in model.items()
        }
    if weights == "bf16":
        lost.append("model weights restored from bf16")
    return state, " and ".join(lost) + ": not bit-exact"


def _decoded(value: Any, precision: str, block: int, where, bad) -> Any:
    """``value`` decoded if it is one of ours (by its data key), else as it is: any other dict
    is the optimizer's or the model's own, for its ``load_state_dict`` to judge."""
    if not (isinstance(value, Mapping) and ("bf16" in value or "int8" in value)):
        return value
    if precision == "fp32":
        raise bad(f"{where()}: a reduced tensor where the precision record says 'fp32'")
    try:
        return _expand(value, precision, block)
    except ValueError as exc:
        raise bad(f"{where()}: {exc}") from None


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
