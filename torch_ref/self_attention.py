"""``SelfAttentionV1`` and ``SelfAttentionV2`` from notes 002 and 004 (2-D ``(T, D)`` input)."""

from __future__ import annotations

import torch
from torch import nn

from torch_ref.recording import Recorder

__all__ = ["SelfAttentionV1", "SelfAttentionV2"]


class SelfAttentionV1(nn.Module):
    """Raw ``(d_in, d_out)`` weight matrices drawn with ``torch.rand`` as in the book and note 004
    (note 002 draws ``torch.randn`` and names them ``W_q``...; load such weights to get its table)."""

    def __init__(self, d_in: int, d_out: int):
        super().__init__()
        self.W_query = nn.Parameter(torch.rand(d_in, d_out))
        self.W_key = nn.Parameter(torch.rand(d_in, d_out))
        self.W_value = nn.Parameter(torch.rand(d_in, d_out))

    def forward(self, x: torch.Tensor, *, return_steps: bool = False):
        record = Recorder(return_steps)
        queries = x @ self.W_query
        keys = x @ self.W_key
        values = x @ self.W_value

        attn_scores = queries @ keys.T
        d_k = keys.shape[-1]
        attn_weights = torch.softmax(attn_scores / d_k**0.5, dim=-1)
        context_vec = attn_weights @ values
        record(queries=queries, keys=keys, values=values)
        record(attn_scores=attn_scores, attn_weights=attn_weights, context_vec=context_vec)
        return record.result(context_vec)


class SelfAttentionV2(nn.Module):
    """``nn.Linear`` projections instead of raw matrices."""

    def __init__(self, d_in: int, d_out: int, qkv_bias: bool = False):
        super().__init__()
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)

    def forward(self, x: torch.Tensor, *, return_steps: bool = False):
        record = Recorder(return_steps)
        queries = self.W_query(x)
        keys = self.W_key(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.T
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        context_vec = attn_weights @ values
        record(queries=queries, keys=keys, values=values)
        record(attn_scores=attn_scores, attn_weights=attn_weights, context_vec=context_vec)
        return record.result(context_vec)
