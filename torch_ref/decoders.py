"""The book's Llama 3 and Qwen3 decoders (``llms_from_scratch.llama3``, ``.qwen3``): the oracle's own code.

Attribute names are the book's, so that the book's ``state_dict()`` loads strictly: ``tok_emb``,
``trf_blocks`` (each ``att``: ``W_query``, ``W_key``, ``W_value``, ``out_proj``, Qwen3's ``q_norm``
and ``k_norm``; ``ff``: ``fc1``, ``fc2``, ``fc3``; ``norm1``, ``norm2``), ``final_norm``, ``out_head``.
Llama 3's RMSNorms hold ``weight`` (torch's ``nn.RMSNorm``), Qwen3's ``scale`` (the book's class).
RoPE's ``cos`` and ``sin`` are buffers left out of the ``state_dict`` (``persistent=False``), as
in the book.

``cfg`` is the book's dict: ``vocab_size``, ``context_length``, ``emb_dim``, ``n_heads``,
``n_layers``, ``hidden_dim``, ``n_kv_groups``, ``rope_base``, ``dtype`` (a torch dtype or its name;
float32 where absent); Llama 3 adds ``rope_freq`` (None or its frequency scaling), Qwen3
``head_dim`` (None: ``emb_dim // n_heads``) and ``qk_norm``. Optional ``rms_norm_eps`` (a
Hugging Face config's) replaces the book's eps (Llama 3 1e-5, Qwen3 1e-6). Every ``forward``
takes ``return_steps=False``; True returns ``(output, steps)`` with numpy_attn's step names.

Differences from the book, all in rounding: the weights are all of ``cfg["dtype"]`` (the book's
Qwen3 keeps its RMSNorms in float32), RoPE's tables as ``torch_ref.rope`` computes them.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import torch
from torch import nn

from torch_ref.recording import Recorder
from torch_ref.rope import apply_rope, compute_rope_params

__all__ = [
    "DecoderBlock",
    "GroupedQueryAttention",
    "Llama3Model",
    "Qwen3Model",
    "RMSNorm",
    "SwiGLUFeedForward",
]

_SIZES = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "hidden_dim", "n_kv_groups")
CONFIG_KEYS = {
    "Llama3Model": (*_SIZES, "rope_base", "rope_freq"),
    "Qwen3Model": (*_SIZES, "rope_base", "head_dim", "qk_norm"),
}


def _dtype(cfg: Mapping[str, Any]) -> torch.dtype:
    """``cfg["dtype"]``: a torch dtype, its name (``"bfloat16"``) or None (float32)."""
    dtype = cfg.get("dtype")
    if dtype is None:
        return torch.float32
    if isinstance(dtype, str):
        dtype = getattr(torch, dtype.removeprefix("torch."), None)
    if not isinstance(dtype, torch.dtype) or not dtype.is_floating_point:
        raise TypeError(f"cfg['dtype'] must be a floating torch dtype or its name, got {cfg['dtype']!r}")
    return dtype


def _check_config(model: str, cfg: Mapping[str, Any]) -> None:
    missing = [key for key in CONFIG_KEYS[model] if key not in cfg]
    if missing:
        raise ValueError(f"cfg is missing keys {missing}; a {model} cfg has {list(CONFIG_KEYS[model])}")


class RMSNorm(nn.Module):
    """``x / sqrt(mean(x^2) + eps) * weight`` over the last axis, computed in at least float32.

    ``weight_name``: the parameter's name, ``"scale"`` (the book's RMSNorm, Qwen3) or ``"weight"``
    (torch's ``nn.RMSNorm``, the book's Llama 3); ones at first."""

    def __init__(self, emb_dim: int, eps: float = 1e-6, *, weight_name: str = "scale", dtype=None):
        super().__init__()
        self.eps, self.weight_name = eps, weight_name
        self.register_parameter(weight_name, nn.Parameter(torch.ones(emb_dim, dtype=dtype)))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        compute = torch.promote_types(x.dtype, torch.float32)
        x_acc = x.to(compute)
        variance = x_acc.pow(2).mean(dim=-1, keepdim=True)  # (..., 1)
        norm_x = x_acc * torch.rsqrt(variance + self.eps)
        return (norm_x * getattr(self, self.weight_name).to(compute)).to(x.dtype)


class SwiGLUFeedForward(nn.Module):
    """``fc3(silu(fc1(x)) * fc2(x))``: D -> hidden_dim (twice, gated) -> D, no biases."""

    def __init__(self, emb_dim: int, hidden_dim: int, dtype=None):
        super().__init__()
        self.fc1 = nn.Linear(emb_dim, hidden_dim, bias=False, dtype=dtype)
        self.fc2 = nn.Linear(emb_dim, hidden_dim, bias=False, dtype=dtype)
        self.fc3 = nn.Linear(hidden_dim, emb_dim, bias=False, dtype=dtype)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.fc3(nn.functional.silu(self.fc1(x)) * self.fc2(x))  # (B, T, D)


class GroupedQueryAttention(nn.Module):
    """Causal attention of ``num_heads`` query heads sharing ``num_kv_groups`` key/value heads
    (query head n uses key/value head ``n // (num_heads // num_kv_groups)``, the book's
    ``repeat_interleave``), RoPE on queries and keys, optional RMSNorm of each query and key head
    (``qk_norm``, Qwen3) before RoPE. x ``(B, T, D)`` -> ``(B, T, D)``."""

    def __init__(
        self, d_in: int, num_heads: int, num_kv_groups: int, head_dim: int | None = None,
        qk_norm: bool = False, dtype=None, *, norm_eps: float = 1e-6, norm_weight: str = "scale",
    ):  # fmt: skip
        super().__init__()
        if num_heads % num_kv_groups:
            raise ValueError(f"num_heads={num_heads} is not divisible by num_kv_groups={num_kv_groups}")
        if head_dim is None:
            if d_in % num_heads:
                raise ValueError(f"d_in={d_in} is not divisible by num_heads={num_heads}")
            head_dim = d_in // num_heads
        self.num_heads, self.num_kv_groups, self.head_dim = num_heads, num_kv_groups, head_dim
        self.group_size, self.d_out = num_heads // num_kv_groups, num_heads * head_dim
        self.W_query = nn.Linear(d_in, self.d_out, bias=False, dtype=dtype)
        self.W_key = nn.Linear(d_in, num_kv_groups * head_dim, bias=False, dtype=dtype)
        self.W_value = nn.Linear(d_in, num_kv_groups * head_dim, bias=False, dtype=dtype)
        self.out_proj = nn.Linear(self.d_out, d_in, bias=False, dtype=dtype)
        if qk_norm:
            self.q_norm = RMSNorm(head_dim, norm_eps, weight_name=norm_weight, dtype=dtype)
            self.k_norm = RMSNorm(head_dim, norm_eps, weight_name=norm_weight, dtype=dtype)
        else:
            self.q_norm = self.k_norm = None

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, return_steps: bool = False):
        b, num_tokens, _ = x.shape
        record = Recorder(return_steps)
        queries = self.W_query(x)  # (B, T, N*H)
        keys = self.W_key(x)  # (B, S, G*H)
        values = self.W_value(x)  # (B, S, G*H)
        record(queries=queries, keys=keys, values=values)
        queries = queries.view(b, num_tokens, self.num_heads, self.head_dim).transpose(1, 2)  # (B, N, T, H)
        keys = keys.view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)  # (B, G, S, H)
        values = values.view(b, num_tokens, self.num_kv_groups, self.head_dim).transpose(1, 2)  # (B, G, S, H)
        if self.q_norm is not None:
            queries, keys = self.q_norm(queries), self.k_norm(keys)
            record(q_norm=queries, k_norm=keys)
        queries, keys = apply_rope(queries, cos, sin), apply_rope(keys, cos, sin)
        record(queries_rope=queries, keys_rope=keys)
        keys = keys.repeat_interleave(self.group_size, dim=1)  # (B, N, S, H)
        values = values.repeat_interleave(self.group_size, dim=1)  # (B, N, S, H)
        attn_scores = queries @ keys.transpose(2, 3)  # (B, N, T, S)
        mask = torch.triu(torch.ones(num_tokens, num_tokens, dtype=torch.bool, device=x.device), diagonal=1)
        masked_scores = attn_scores.masked_fill(mask, -torch.inf)
        attn_weights = torch.softmax(masked_scores / self.head_dim**0.5, dim=-1)  # (B, N, T, S)
        record(attn_scores=attn_scores, masked_scores=masked_scores, attn_weights=attn_weights)
        context_vec = (attn_weights @ values).transpose(1, 2)  # (B, T, N, H)
        context_vec = context_vec.reshape(b, num_tokens, self.d_out)  # (B, T, N*H)
        record(context_vec=context_vec)
        return record.result(self.out_proj(context_vec))  # (B, T, D)


class DecoderBlock(nn.Module):
    """Pre-RMSNorm block: ``x + att(norm1(x))``, then ``+ ff(norm2(.))``; no dropout."""

    def __init__(
        self, cfg: Mapping[str, Any], *, head_dim: int | None, qk_norm: bool, eps: float, norm_weight: str
    ):
        super().__init__()
        dtype = _dtype(cfg)
        self.att = GroupedQueryAttention(
            cfg["emb_dim"], cfg["n_heads"], cfg["n_kv_groups"], head_dim, qk_norm, dtype, norm_eps=eps,
            norm_weight=norm_weight,
        )  # fmt: skip
        self.ff = SwiGLUFeedForward(cfg["emb_dim"], cfg["hidden_dim"], dtype)
        self.norm1 = RMSNorm(cfg["emb_dim"], eps, weight_name=norm_weight, dtype=dtype)
        self.norm2 = RMSNorm(cfg["emb_dim"], eps, weight_name=norm_weight, dtype=dtype)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor, *, return_steps: bool = False):
        steps: OrderedDict[str, torch.Tensor] = OrderedDict()
        shortcut = x
        x = steps["norm1"] = self.norm1(x)
        x = steps["att"] = self.att(x, cos, sin)  # (B, T, D)
        x = steps["shortcut1"] = x + shortcut
        shortcut = x
        x = steps["norm2"] = self.norm2(x)
        x = steps["ff"] = self.ff(x)  # (B, T, D)
        x = steps["output"] = x + shortcut
        return (x, steps) if return_steps else x


class _Decoder(nn.Module):
    """Token ids ``(B, T)``, T <= context_length -> logits ``(B, T, vocab_size)``."""

    norm_weight: str  # the RMSNorms' parameter
    eps: float  # their eps, where cfg has no rms_norm_eps
    variant: tuple[str, ...]  # the keys of cfg this model reads beside the sizes and rope_base

    def __init__(self, cfg: Mapping[str, Any]):
        super().__init__()
        _check_config(type(self).__name__, cfg)
        dtype, eps = _dtype(cfg), cfg.get("rms_norm_eps", self.eps)
        head_dim = cfg["head_dim"] if "head_dim" in self.variant else None
        qk_norm = bool(cfg["qk_norm"]) if "qk_norm" in self.variant else False
        rope_freq = cfg["rope_freq"] if "rope_freq" in self.variant else None
        self.tok_emb = nn.Embedding(cfg["vocab_size"], cfg["emb_dim"], dtype=dtype)
        self.trf_blocks = nn.ModuleList(
            DecoderBlock(cfg, head_dim=head_dim, qk_norm=qk_norm, eps=eps, norm_weight=self.norm_weight)
            for _ in range(cfg["n_layers"])
        )
        self.final_norm = RMSNorm(cfg["emb_dim"], eps, weight_name=self.norm_weight, dtype=dtype)
        self.out_head = nn.Linear(cfg["emb_dim"], cfg["vocab_size"], bias=False, dtype=dtype)
        size = head_dim or cfg["emb_dim"] // cfg["n_heads"]
        cos, sin = compute_rope_params(
            size, cfg["rope_base"], cfg["context_length"], rope_freq, dtype
        )  # (L, H)
        self.register_buffer("cos", cos, persistent=False)
        self.register_buffer("sin", sin, persistent=False)
        self.cfg = dict(cfg)

    def forward(self, in_idx: torch.Tensor, *, return_steps: bool = False):
        num_tokens = in_idx.shape[1]
        if num_tokens > self.cos.shape[0]:
            raise ValueError(
                f"token_ids has {num_tokens} tokens, more than context_length {self.cos.shape[0]}"
            )
        x = self.tok_emb(in_idx)  # (B, T, D)
        steps: OrderedDict[str, torch.Tensor] = OrderedDict(embeddings=x)
        for index, block in enumerate(self.trf_blocks):
            x, block_steps = block(x, self.cos, self.sin, return_steps=True)
            steps.update((f"trf_blocks.{index}.{name}", value) for name, value in block_steps.items())
        x = steps["final_norm"] = self.final_norm(x)
        logits = steps["output"] = self.out_head(x)  # (B, T, V)
        return (logits, steps) if return_steps else logits


class Llama3Model(_Decoder):
    """The book's Llama 3 (and Llama 3.1/3.2): RMSNorm ``weight``, eps 1e-5, RoPE with ``rope_freq``."""

    norm_weight, eps, variant = "weight", 1e-5, ("rope_freq",)


class Qwen3Model(_Decoder):
    """The book's Qwen3 (dense): RMSNorm ``scale``, eps 1e-6, ``head_dim``, QK-norm with ``qk_norm``."""

    norm_weight, eps, variant = "scale", 1e-6, ("head_dim", "qk_norm")
