"""``CausalAttention`` and ``MultiHeadAttentionWrapper`` from notes 002 and 004."""

from __future__ import annotations

import torch
from torch import nn

from torch_ref.recording import Recorder, dropout_or_keep

__all__ = ["CausalAttention", "MultiHeadAttentionWrapper"]


class CausalAttention(nn.Module):
    """One causal head; ``attn_keep_mask`` (bool ``(B, T, S)``, True = keep) replaces dropout's
    random draw."""

    def __init__(self, d_in: int, d_out: int, context_length: int, dropout: float, qkv_bias: bool = False):
        super().__init__()
        self.d_out = d_out
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.dropout = nn.Dropout(dropout)
        self.register_buffer("mask", torch.triu(torch.ones(context_length, context_length), diagonal=1))

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_keep_mask: torch.Tensor | None = None,
        return_steps: bool = False,
    ):
        record = Recorder(return_steps)
        b, num_tokens, d_in = x.shape
        keys = self.W_key(x)
        queries = self.W_query(x)
        values = self.W_value(x)

        attn_scores = queries @ keys.transpose(1, 2)
        record(queries=queries, keys=keys, values=values, attn_scores=attn_scores)
        attn_scores.masked_fill_(self.mask.bool()[:num_tokens, :num_tokens], -torch.inf)
        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights_dropped = dropout_or_keep(self.dropout, attn_weights, attn_keep_mask)

        context_vec = attn_weights_dropped @ values
        record(masked_scores=attn_scores, attn_weights=attn_weights)
        record(attn_weights_dropped=attn_weights_dropped, context_vec=context_vec)
        return record.result(context_vec)


class MultiHeadAttentionWrapper(nn.Module):
    """``num_heads`` causal heads run one after another, outputs concatenated (width
    ``num_heads * d_out``, no projection). ``attn_keep_mask``: bool ``(B, N, T, S)``."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
    ):
        super().__init__()
        self.heads = nn.ModuleList(
            [CausalAttention(d_in, d_out, context_length, dropout, qkv_bias) for _ in range(num_heads)]
        )

    def forward(
        self,
        x: torch.Tensor,
        *,
        attn_keep_mask: torch.Tensor | None = None,
        return_steps: bool = False,
    ):
        record = Recorder(return_steps)
        head_outputs = []
        for i, head in enumerate(self.heads):
            keep = None if attn_keep_mask is None else attn_keep_mask[:, i]
            head_output, head_steps = head(x, attn_keep_mask=keep, return_steps=True)
            head_outputs.append(head_output)
            record(**{f"heads.{i}.{name}": value for name, value in head_steps.items()})
        context_vec = torch.cat(head_outputs, dim=-1)
        record(context_vec=context_vec)
        return record.result(context_vec)
