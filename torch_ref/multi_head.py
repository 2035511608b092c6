"""The book's ``MultiHeadAttention`` (notes 000, 001, 002) and note 004's variant."""

from __future__ import annotations

import torch
from torch import nn

from torch_ref.checks import check_divisible
from torch_ref.recording import Recorder, dropout_or_keep

__all__ = ["MultiHeadAttention"]


class MultiHeadAttention(nn.Module):
    """``out_bias=True`` is the book's class (``out_proj`` always has a bias);
    ``out_bias=qkv_bias`` is note 004's ``MultiHeadAttentionClass``.
    ``attn_keep_mask``: bool ``(B, N, T, S)``, True = keep, replaces dropout's random draw."""

    def __init__(
        self,
        d_in: int,
        d_out: int,
        context_length: int,
        dropout: float,
        num_heads: int,
        qkv_bias: bool = False,
        out_bias: bool = True,
    ):
        super().__init__()
        check_divisible("d_out", d_out, num_heads)  # the notes' assert

        self.d_out = d_out
        self.num_heads = num_heads
        self.head_dim = d_out // num_heads
        self.W_query = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_key = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.W_value = nn.Linear(d_in, d_out, bias=qkv_bias)
        self.out_proj = nn.Linear(d_out, d_out, bias=out_bias)
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
        record(queries=queries, keys=keys, values=values)

        keys = keys.view(b, num_tokens, self.num_heads, self.head_dim)
        values = values.view(b, num_tokens, self.num_heads, self.head_dim)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim)

        keys = keys.transpose(1, 2)
        queries = queries.transpose(1, 2)
        values = values.transpose(1, 2)

        attn_scores = queries @ keys.transpose(2, 3)
        record(attn_scores=attn_scores)
        mask_bool = self.mask.bool()[:num_tokens, :num_tokens]
        attn_scores.masked_fill_(mask_bool, -torch.inf)

        attn_weights = torch.softmax(attn_scores / keys.shape[-1] ** 0.5, dim=-1)
        attn_weights_dropped = dropout_or_keep(self.dropout, attn_weights, attn_keep_mask)
        record(masked_scores=attn_scores, attn_weights=attn_weights)
        record(attn_weights_dropped=attn_weights_dropped)

        context_vec = (attn_weights_dropped @ values).transpose(1, 2)

        context_vec = context_vec.contiguous().view(b, num_tokens, self.d_out)
        record(context_vec=context_vec)
        context_vec = self.out_proj(context_vec)
        return record.result(context_vec)
