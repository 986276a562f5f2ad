"""The complete training state a resume needs, built from a real GPT-style model.

A size name such as ``25M`` or ``1B`` maps to a decoder-only transformer whose depth grows with
its width (about one layer per 64 channels, as in GPT-2/3), so large sizes have realistic
tensor counts and shapes. The state is taken after one real AdamW step on a tiny batch, so
both moments hold real values; in ``bf16`` mode the model holds bf16 weights and AdamW steps
fp32 master weights (14 bytes per parameter), in ``fp32`` mode the model is the master
(12 bytes per parameter). The moments (``exp_avg``, ``exp_avg_sq``: fp32, 8 of those bytes) are
what ``ckptsim bench --optimizer-precision`` reduces; above :data:`REAL_STEP_MAX_PARAMS` they
are filled from the weights (non-zero, ``exp_avg_sq`` positive), which keeps their bytes but
not a real step's value distribution (a real step's tiny squared gradients can include subnormal
floats, which make CPU arithmetic, the encoding's too, slower).
"""

from __future__ import annotations

import math
import random
import re
import warnings
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn
from torch.nn import functional as F

from simulator.errors import InputError

FORMATS = ("torch", "safetensors", "dcp", "dcp-async", "ckptsim")
DTYPES = ("fp32", "bf16")
SIZE_NAMES = ("1M", "10M", "25M", "50M", "100M", "200M", "500M", "1B")
_UNITS = {"K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9}
_CONTEXT = 128
REAL_STEP_MAX_PARAMS = 60_000_000
"""Above this, AdamW's state is filled directly: a CPU step on a large model takes minutes on
a small machine, and the I/O cost depends on the bytes, not on how they were computed."""


def parse_size(text: str) -> int:
    """``'25M'`` -> 25_000_000 target parameters; between 100K and 20B."""
    found = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMBG])?\s*", text.upper())
    if not found:
        raise InputError(f"unknown model size {text!r}: use a count like 25M, 200M, 1B")
    value = float(found.group(1)) * _UNITS.get(found.group(2) or "", 1.0)
    if not 1e5 <= value <= 2e10:
        raise InputError(f"model size {text!r} is out of range: 100K to 20B parameters")
    return int(value)


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of the decoder-only transformer (tied input/output embedding)."""

    vocab: int
    """Vocabulary size, tokens."""
    width: int
    """Model dimension d."""
    layers: int
    """Transformer blocks."""
    context: int = _CONTEXT
    """Positions in the learned position embedding."""

    @classmethod
    def for_params(cls, target: int) -> GPTConfig:
        # Depth ~ width/64 gives params ~ 12 d^2 * d/64; solve for d, round to heads of 64.
        vocab = 32_000 if target >= 100e6 else 4_096 if target >= 5e6 else 512
        width = max(64, 64 * round((target / 0.1875) ** (1 / 3) / 64))
        per_layer = 12 * width * width + 13 * width
        layers = max(1, round((target - (vocab + _CONTEXT) * width) / per_layer))
        return cls(vocab=vocab, width=width, layers=layers)

    @property
    def heads(self) -> int:
        return max(1, self.width // 64)


class _Block(nn.Module):
    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.heads = cfg.heads
        self.ln1 = nn.LayerNorm(cfg.width)
        self.qkv = nn.Linear(cfg.width, 3 * cfg.width)
        self.proj = nn.Linear(cfg.width, cfg.width)
        self.ln2 = nn.LayerNorm(cfg.width)
        self.fc = nn.Linear(cfg.width, 4 * cfg.width)
        self.out = nn.Linear(4 * cfg.width, cfg.width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, t, d = x.shape
        q, k, v = self.qkv(self.ln1(x)).split(d, dim=2)
        q, k, v = (z.view(b, t, self.heads, d // self.heads).transpose(1, 2) for z in (q, k, v))
        y = F.scaled_dot_product_attention(q, k, v, is_causal=True)
        x = x + self.proj(y.transpose(1, 2).reshape(b, t, d))
        return x + self.out(F.gelu(self.fc(self.ln2(x))))


class GPT(nn.Module):
    """A minimal GPT: token + position embeddings, pre-norm blocks, tied output head."""

    def __init__(self, cfg: GPTConfig):
        super().__init__()
        self.wte = nn.Embedding(cfg.vocab, cfg.width)
        self.wpe = nn.Embedding(cfg.context, cfg.width)
        self.blocks = nn.ModuleList(_Block(cfg) for _ in range(cfg.layers))
        self.ln_f = nn.LayerNorm(cfg.width)

    def forward(self, idx: torch.Tensor) -> torch.Tensor:
        pos = torch.arange(idx.shape[1], device=idx.device)
        x = self.wte(idx) + self.wpe(pos)
        for block in self.blocks:
            x = block(x)
        return F.linear(self.ln_f(x), self.wte.weight)


@dataclass
class TrainingState:
    """A resumable state (nested dicts of tensors and plain values) and its size."""

    state: dict[str, Any]
    params: int
    tensor_bytes: int
    dtype: str
    config: GPTConfig
    real_step: bool
    """Whether the AdamW state came from a real step (else from :func:`_fill_adam_state`)."""


def build_state(target_params: int, *, dtype: str = "fp32", seed: int = 0) -> TrainingState:
    """Model, AdamW (after one real step), cosine LR schedule, RNG states, data position."""
    if dtype not in DTYPES:
        raise InputError(f"unknown dtype {dtype!r}: use one of {', '.join(DTYPES)}")
    cfg = GPTConfig.for_params(target_params)
    torch.manual_seed(seed)
    model = GPT(cfg)
    if dtype == "bf16":
        model = model.to(torch.bfloat16)
        master = [p.detach().float().requires_grad_() for p in model.parameters()]
    else:
        master = list(model.parameters())
    optimizer = torch.optim.AdamW(master, lr=3e-4, betas=(0.9, 0.95), weight_decay=0.1)
    scheduler = torch.optim.lr_scheduler.CosineAnnealingLR(optimizer, T_max=10_000)
    data_rng = np.random.default_rng(seed)
    batch = torch.from_numpy(data_rng.integers(0, cfg.vocab, size=(1, 17)))
    real_step = target_params <= REAL_STEP_MAX_PARAMS
    if real_step:
        logits = model(batch[:, :-1])
        F.cross_entropy(logits.flatten(0, 1).float(), batch[:, 1:].flatten()).backward()
        if dtype == "bf16":
            for p, m in zip(model.parameters(), master, strict=True):
                m.grad, p.grad = p.grad.float(), None
        optimizer.step()
    else:
        _fill_adam_state(optimizer)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # "scheduler.step() before optimizer.step()"
        scheduler.step()
    optimizer.zero_grad(set_to_none=True)
    state: dict[str, Any] = {
        "model": model.state_dict(),
        "optimizer": optimizer.state_dict(),
        "scheduler": scheduler.state_dict(),
        "rng": {
            "torch": torch.get_rng_state(),
            "numpy": data_rng.bit_generator.state,
            "python": random.Random(seed).getstate(),
        },
        "data": {"epoch": 0, "step": 1, "sample_index": 1, "token_offset": 17},
    }
    if dtype == "bf16":
        state["master"] = {str(i): m.detach() for i, m in enumerate(master)}
    params = sum(p.numel() for p in model.parameters())
    return TrainingState(
        real_step=real_step,
        state=state,
        params=params,
        tensor_bytes=tensor_bytes(state),
        dtype=dtype,
        config=cfg,
    )


def _fill_adam_state(optimizer: torch.optim.Optimizer) -> None:
    """The state AdamW holds after one step — same keys, dtypes, shapes — with non-zero
    moments derived from the weights by cheap elementwise ops (a sparse or zero-page file
    would flatter the disk)."""
    for group in optimizer.param_groups:
        for p in group["params"]:
            w = p.detach()
            optimizer.state[p] = {
                "step": torch.tensor(1.0),
                "exp_avg": w * 1e-3,
                "exp_avg_sq": w * w + 1e-8,
            }


def tensor_bytes(state: Any) -> int:
    """Bytes of tensor data in a nested state (what any format must at least write)."""
    flat, _ = flatten(state)
    return sum(t.numel() * t.element_size() for t in flat.values())


def flatten(state: Any, prefix: str = "") -> tuple[dict[str, torch.Tensor], Any]:
    """Split a nested state into ``{dotted.name: tensor}`` and a JSON tree of the rest, where
    each tensor's place holds ``{"__tensor__": name}``."""
    tensors: dict[str, torch.Tensor] = {}

    def walk(node: Any, path: str) -> Any:
        if isinstance(node, torch.Tensor):
            tensors[path] = node
            return {"__tensor__": path}
        if isinstance(node, dict):
            return {str(k): walk(v, f"{path}.{k}" if path else str(k)) for k, v in node.items()}
        if isinstance(node, list | tuple):
            return [walk(v, f"{path}.{i}" if path else str(i)) for i, v in enumerate(node)]
        if isinstance(node, float) and not math.isfinite(node):
            return {"__float__": repr(node)}
        return node

    tree = walk(state, prefix)
    return tensors, tree


def unflatten(tensors: dict[str, torch.Tensor], tree: Any) -> Any:
    """Inverse of :func:`flatten` (tuples come back as lists, dict keys as strings)."""
    if isinstance(tree, dict):
        if set(tree) == {"__tensor__"}:
            return tensors[tree["__tensor__"]]
        if set(tree) == {"__float__"}:
            return float(tree["__float__"])
        return {k: unflatten(tensors, v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [unflatten(tensors, v) for v in tree]
    return tree
