"""The book's chapter-4 GPT around the notes' ``MultiHeadAttention``: the oracle of the GPT ports.

Attribute names are the book's (``tok_emb``, ``pos_emb``, ``drop_emb``, ``trf_blocks``,
``final_norm``, ``out_head``; in a block ``att``, ``ff.layers``, ``norm1``, ``norm2``,
``drop_shortcut``; a LayerNorm's ``scale`` and ``shift``), so the book's ``GPTModel.state_dict()``
loads as it is. ``config`` is the book's dict: ``vocab_size``, ``context_length``, ``emb_dim``,
``n_heads``, ``n_layers``, ``drop_rate``, ``qkv_bias``. Every ``forward`` takes
``return_steps=False``; True returns ``(output, steps)`` with the steps named in
``numpy_attn.gpt.BLOCK_STEPS`` (per block, prefixed ``trf_blocks.{i}.`` in the model's trace).
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torch_ref.multi_head import MultiHeadAttention

__all__ = ["CONFIG_KEYS", "GELU", "FeedForward", "GPTModel", "LayerNorm", "TransformerBlock"]

CONFIG_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")


def _check_config(config: Mapping[str, Any]) -> None:
    missing = [key for key in CONFIG_KEYS if key not in config]
    if missing:
        raise ValueError(f"config is missing keys {missing}; a GPT config has {list(CONFIG_KEYS)}")


class LayerNorm(nn.Module):
    """Normalise over the last axis with the biased variance, eps 1e-5, then ``scale``/``shift``."""

    def __init__(self, emb_dim: int):
        super().__init__()
        self.eps = 1e-5
        self.scale = nn.Parameter(torch.ones(emb_dim))
        self.shift = nn.Parameter(torch.zeros(emb_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mean = x.mean(dim=-1, keepdim=True)  # (B, T, 1)
        var = x.var(dim=-1, keepdim=True, unbiased=False)  # (B, T, 1)
        norm_x = (x - mean) / torch.sqrt(var + self.eps)
        return self.scale * norm_x + self.shift


class GELU(nn.Module):
    """GELU, tanh approximation (GPT-2's ``gelu_new``), written as the book writes it: the constant
    sqrt(2 / pi) is computed by torch in float32 (the book's dtype; a Python float would round to
    another float32 on some CPUs' kernels), or in float64 for a float64 input."""

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale = torch.sqrt(torch.tensor(2.0 / torch.pi, dtype=torch.promote_types(x.dtype, torch.float32)))
        return 0.5 * x * (1 + torch.tanh(scale * (x + 0.044715 * torch.pow(x, 3))))


class FeedForward(nn.Module):
    """``layers``: Linear(emb, 4 emb), GELU, Linear(4 emb, emb)."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        emb_dim = config["emb_dim"]
        self.layers = nn.Sequential(nn.Linear(emb_dim, 4 * emb_dim), GELU(), nn.Linear(4 * emb_dim, emb_dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.layers(x)


class TransformerBlock(nn.Module):
    """Pre-LayerNorm block: ``x + drop(att(norm1(x)))``, then ``x + drop(ff(norm2(x)))``."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        _check_config(config)
        self.att = MultiHeadAttention(
            d_in=config["emb_dim"], d_out=config["emb_dim"], context_length=config["context_length"],
            dropout=config["drop_rate"], num_heads=config["n_heads"], qkv_bias=config["qkv_bias"],
        )  # fmt: skip
        self.ff = FeedForward(config)
        self.norm1 = LayerNorm(config["emb_dim"])
        self.norm2 = LayerNorm(config["emb_dim"])
        self.drop_shortcut = nn.Dropout(config["drop_rate"])

    def forward(self, x: torch.Tensor, *, return_steps: bool = False):
        steps: OrderedDict[str, torch.Tensor] = OrderedDict()
        shortcut = x
        x = self.norm1(x)
        steps["norm1"] = x
        x = self.att(x)  # (B, T, D)
        steps["att"] = x
        x = self.drop_shortcut(x) + shortcut
        steps["shortcut1"] = x
        shortcut = x
        x = self.norm2(x)
        steps["norm2"] = x
        x = self.ff(x)  # (B, T, D)
        steps["ff"] = x
        x = self.drop_shortcut(x) + shortcut
        steps["output"] = x
        return (x, steps) if return_steps else x


class GPTModel(nn.Module):
    """Token ids ``(B, T)`` -> logits ``(B, T, vocab_size)``; ``out_head`` has no bias."""

    def __init__(self, config: Mapping[str, Any]):
        super().__init__()
        _check_config(config)
        self.tok_emb = nn.Embedding(config["vocab_size"], config["emb_dim"])
        self.pos_emb = nn.Embedding(config["context_length"], config["emb_dim"])
        self.drop_emb = nn.Dropout(config["drop_rate"])
        self.trf_blocks = nn.Sequential(*[TransformerBlock(config) for _ in range(config["n_layers"])])
        self.final_norm = LayerNorm(config["emb_dim"])
        self.out_head = nn.Linear(config["emb_dim"], config["vocab_size"], bias=False)

    def forward(self, in_idx: torch.Tensor, *, return_steps: bool = False):
        batch_size, seq_len = in_idx.shape
        if seq_len > self.pos_emb.num_embeddings:
            raise ValueError(
                f"token_ids has {seq_len} tokens, more than context_length {self.pos_emb.num_embeddings}"
            )
        tok_embeds = self.tok_emb(in_idx)  # (B, T, D)
        pos_embeds = self.pos_emb(torch.arange(seq_len, device=in_idx.device))  # (T, D)
        x = self.drop_emb(tok_embeds + pos_embeds)
        steps: OrderedDict[str, torch.Tensor] = OrderedDict(embeddings=x)
        for index, block in enumerate(self.trf_blocks):
            x, block_steps = block(x, return_steps=True)
            steps.update((f"trf_blocks.{index}.{name}", value) for name, value in block_steps.items())
        x = self.final_norm(x)
        steps["final_norm"] = x
        logits = self.out_head(x)  # (B, T, V)
        steps["output"] = logits
        return (logits, steps) if return_steps else logits
