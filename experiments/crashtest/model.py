"""A small GPT-style language model built from torch's own transformer layers.

Decoder-only: token and position embeddings, a stack of pre-norm ``nn.TransformerEncoderLayer``
blocks run with a causal mask (which makes them GPT blocks), a final LayerNorm and a linear
head tied to the token embedding. ``train_gpt`` builds 4 blocks of width 192 by default (1.8 M
parameters): one training step takes tens of milliseconds on one CPU thread — small enough
that a study of many failures fits in minutes — and a checkpoint (weights + AdamW moments,
about 21 MB) stalls training for tens of milliseconds, which against a one-minute failure
clock puts the save-cost to MTBF ratio near a real cluster's (δ/M ≈ 1e-3).
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import nn

__all__ = ["GPTConfig", "TinyGPT"]


@dataclass(frozen=True, kw_only=True)
class GPTConfig:
    """Shape of the model."""

    vocab_size: int
    """Distinct token ids."""
    block_size: int = 64
    """Context length, tokens."""
    n_layer: int = 4
    """Transformer blocks."""
    n_embd: int = 128
    """Width of the residual stream."""
    n_head: int = 4
    """Attention heads per block."""


class TinyGPT(nn.Module):
    def __init__(self, config: GPTConfig):
        super().__init__()
        self.config = config
        self.tok = nn.Embedding(config.vocab_size, config.n_embd)
        self.pos = nn.Embedding(config.block_size, config.n_embd)
        layer = nn.TransformerEncoderLayer(
            config.n_embd,
            config.n_head,
            dim_feedforward=4 * config.n_embd,
            dropout=0.0,  # no dropout: training is a pure function of (state, batch)
            activation="gelu",
            batch_first=True,
            norm_first=True,
        )
        self.blocks = nn.TransformerEncoder(layer, config.n_layer, enable_nested_tensor=False)
        self.norm = nn.LayerNorm(config.n_embd)
        self.head = nn.Linear(config.n_embd, config.vocab_size, bias=False)
        self.head.weight = self.tok.weight
        mask = nn.Transformer.generate_square_subsequent_mask(config.block_size)
        self.register_buffer("causal_mask", mask, persistent=False)

    def forward(self, idx: torch.Tensor, targets: torch.Tensor | None = None):
        t = idx.shape[1]
        x = self.tok(idx) + self.pos(torch.arange(t, device=idx.device))
        x = self.blocks(x, mask=self.causal_mask[:t, :t], is_causal=True)
        logits = self.head(self.norm(x))
        if targets is None:
            return logits, None
        loss = nn.functional.cross_entropy(logits.flatten(0, 1), targets.flatten())
        return logits, loss
