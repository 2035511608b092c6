"""Note 003's classes with a fused ``Wqkv`` projection (renamed ``Fused*`` here)."""

from __future__ import annotations

import math

import torch
from torch import BoolTensor, Tensor, nn

from torch_ref.checks import check_divisible
from torch_ref.recording import Recorder, dropout_or_keep

__all__ = ["FusedCausalAttention", "FusedMultiHeadAttention", "FusedSingleHeadAttention"]


class FusedSingleHeadAttention(nn.Module):
    """Note 003's ``SingleHeadAttention``: bidirectional, head size ``hidden_size // 4``."""

    def __init__(self, hidden_size: int, bias: bool = True):
        super().__init__()
        self.Wqkv = nn.Linear(hidden_size, (hidden_size // 4) * 3, bias=bias)
        self.Wo = nn.Linear(hidden_size // 4, hidden_size, bias=bias)

    def forward(self, x: Tensor, *, return_steps: bool = False):
        record = Recorder(return_steps)
        B, S, C = x.shape

        q, k, v = self.Wqkv(x).reshape(B, S, 3, C // 4).unbind(dim=2)
        record(queries=q, keys=k, values=v)

        attn = q @ k.transpose(-2, -1)
        record(attn_scores=attn)
        attn = attn / math.sqrt(k.size(-1))

        attn = attn.softmax(dim=-1)
        record(attn_weights=attn)

        x = attn @ v
        record(context_vec=x)

        return record.result(self.Wo(x))


def _record_thirds(record: Recorder, qkv: Tensor) -> None:
    """Record the three thirds of the fused projection's output as queries, keys, values."""
    queries, keys, values = qkv.chunk(3, dim=-1)
    record(queries=queries, keys=keys, values=values)


class FusedMultiHeadAttention(nn.Module):
    """Note 003's bidirectional ``MultiHeadAttention``."""

    def __init__(self, hidden_size: int, num_heads: int, bias: bool = True):
        super().__init__()
        check_divisible("hidden_size", hidden_size, num_heads)  # the notes' assert
        self.nh = num_heads
        self.Wqkv = nn.Linear(hidden_size, hidden_size * 3, bias=bias)
        self.Wo = nn.Linear(hidden_size, hidden_size, bias=bias)

    def forward(self, x: Tensor, *, return_steps: bool = False):
        record = Recorder(return_steps)
        B, S, C = x.shape

        qkv = self.Wqkv(x)
        _record_thirds(record, qkv)
        x = qkv.reshape(B, S, 3, self.nh, C // self.nh)
        q, k, v = x.transpose(3, 1).unbind(dim=2)

        attn = q @ k.transpose(-2, -1)
        record(attn_scores=attn)
        attn = attn / math.sqrt(k.size(-1))

        attn = attn.softmax(dim=-1)
        record(attn_weights=attn)

        x = attn @ v

        x = x.transpose(1, 2).reshape(B, S, C)
        record(context_vec=x)
        return record.result(self.Wo(x))


class FusedCausalAttention(nn.Module):
    """Note 003's ``CausalAttention``: causal mask OR a ``(B, S)`` padding mask (True = padding;
    None here means no padding), dropout on the weights and on the output. Injected keep-masks:
    ``attn_keep_mask`` bool ``(B, N, T, S)`` and ``out_keep_mask`` bool ``(B, T, D)``."""

    def __init__(
        self,
        hidden_size: int,
        num_heads: int,
        context_size: int,
        attn_drop: float = 0.1,
        out_drop: float = 0.1,
        bias: bool = True,
    ):
        super().__init__()
        check_divisible("hidden_size", hidden_size, num_heads)  # the notes' assert
        self.nh = num_heads
        self.Wqkv = nn.Linear(hidden_size, hidden_size * 3, bias=bias)
        self.Wo = nn.Linear(hidden_size, hidden_size, bias=bias)
        self.attn_drop = nn.Dropout(attn_drop)
        self.out_drop = nn.Dropout(out_drop)
        self.register_buffer(
            "causal_mask",
            torch.triu(torch.ones([context_size, context_size], dtype=torch.bool), diagonal=1).view(
                1, 1, context_size, context_size
            ),
        )

    def forward(
        self,
        x: Tensor,
        mask: BoolTensor | None = None,
        *,
        attn_keep_mask: Tensor | None = None,
        out_keep_mask: Tensor | None = None,
        return_steps: bool = False,
    ):
        record = Recorder(return_steps)
        B, S, C = x.shape

        qkv = self.Wqkv(x)
        _record_thirds(record, qkv)
        x = qkv.reshape(B, S, 3, self.nh, C // self.nh)
        q, k, v = x.transpose(3, 1).unbind(dim=2)

        attn = q @ k.transpose(-2, -1)
        record(attn_scores=attn)
        attn = attn / math.sqrt(k.size(-1))

        combined_mask = self.causal_mask[:, :, :S, :S]
        if mask is not None:
            combined_mask = combined_mask + mask.view(B, 1, 1, S)
        if return_steps:  # the trace's masked_scores are unscaled, as in the other classes
            record(masked_scores=record.steps["attn_scores"].masked_fill(combined_mask, float("-inf")))
        attn = attn.masked_fill(combined_mask, float("-inf"))

        attn = attn.softmax(dim=-1)
        record(attn_weights=attn)
        attn = dropout_or_keep(self.attn_drop, attn, attn_keep_mask)
        record(attn_weights_dropped=attn)

        x = attn @ v

        x = x.transpose(1, 2).reshape(B, S, C)
        record(context_vec=x)
        projected = self.Wo(x)
        record(projected=projected)
        return record.result(dropout_or_keep(self.out_drop, projected, out_keep_mask))
