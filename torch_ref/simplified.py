"""The notes' weight-free self-attention and naive softmax."""

from __future__ import annotations

import torch

from torch_ref.recording import Recorder

__all__ = ["simplified_self_attention", "softmax_naive"]


def softmax_naive(x: torch.Tensor, axis: int = -1) -> torch.Tensor:
    """The notes' ``torch.exp(x) / torch.exp(x).sum(dim=0)`` (for 1-D x dim 0 is the last axis)."""
    return torch.exp(x) / torch.exp(x).sum(dim=axis, keepdim=True)


def simplified_self_attention(x: torch.Tensor, *, return_steps: bool = False):
    """``softmax(inputs @ inputs.T) @ inputs`` for ``(T, D)`` inputs, as in the notes."""
    record = Recorder(return_steps)
    attn_scores = x @ x.T
    attn_weights = torch.softmax(attn_scores, dim=-1)
    context_vec = attn_weights @ x
    record(attn_scores=attn_scores, attn_weights=attn_weights, context_vec=context_vec)
    return record.result(context_vec)
