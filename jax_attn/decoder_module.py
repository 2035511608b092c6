"""The book's Llama 3 and Qwen3 as Flax NNX modules, under the book's attribute names.

``tok_emb`` (``nnx.Embed``), ``trf_blocks`` (an ``nnx.List`` of ``DecoderBlock``: ``att``, a
``GroupedQueryAttention`` holding ``W_query``, ``W_key``, ``W_value``, ``out_proj`` (``nnx.Linear``,
no biases) and Qwen3's ``q_norm``, ``k_norm``; ``ff``: ``fc1``, ``fc2``, ``fc3``; ``norm1``,
``norm2``), ``final_norm``, ``out_head`` (an ``nnx.Linear``, or with ``tie_embeddings`` the
``tok_emb`` module itself). The modules call ``jax_attn``'s math (``rms_norm``, ``silu``,
``grouped_query.rotated_heads``, ``attend_groups``); the block and model loops are
``numpy_attn.gpt_spec``'s. RoPE's tables are not held: they are built from the positions. The
weights go in and out in the weights format (``from_params``, ``load_params``, ``to_params``).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
from flax import nnx

import jax_attn
from jax_attn import module_base as base
from jax_attn.decoders import silu
from jax_attn.gpt_module import ModelWeights
from jax_attn.grouped_query import attend_groups, rotated_heads
from jax_attn.ops import causal_mask
from jax_attn.rms_norm import rms_norm
from numpy_attn import decoder_spec as spec
from numpy_attn.gpt_spec import apply_block, apply_model
from numpy_attn.hf_decoders import load_hf, save_hf
from numpy_attn.steps import Steps

Output = jax.Array | tuple[jax.Array, Steps]  # the output, or (output, steps) with return_steps


class RMSNorm(nnx.Module):
    """RMSNorm over the last axis; its weight, ones at first, is named ``weight_name`` (``"weight"``
    in Llama 3, ``"scale"`` in Qwen3, as torch_ref names it). x ``(..., D)`` -> same."""

    def __init__(self, dim: int, eps: float, *, weight_name: str = "scale", dtype: Any = jnp.float32) -> None:
        self.eps, self.weight_name = eps, weight_name
        setattr(self, weight_name, nnx.Param(jnp.ones((dim,), dtype)))

    def __call__(self, x: jax.Array) -> jax.Array:
        return rms_norm(x, getattr(self, self.weight_name)[...], eps=self.eps)


class SwiGLUFeedForward(nnx.Module):
    """``fc3(silu(fc1(x)) * fc2(x))``: D -> F (twice) -> D, drawn as ``nn.Linear``, no biases."""

    def __init__(self, emb_dim: int, hidden_dim: int, *, dtype: Any = jnp.float32, rngs: nnx.Rngs) -> None:
        self.fc1 = base.torch_linear(emb_dim, hidden_dim, False, dtype, rngs)
        self.fc2 = base.torch_linear(emb_dim, hidden_dim, False, dtype, rngs)
        self.fc3 = base.torch_linear(hidden_dim, emb_dim, False, dtype, rngs)

    def __call__(self, x: jax.Array) -> jax.Array:
        return self.fc3(silu(self.fc1(x)) * self.fc2(x))  # (B, T, D)


class GroupedQueryAttention(nnx.Module):
    """Causal grouped-query attention with RoPE (``jax_attn.grouped_query``): x ``(B, T, D)`` ->
    ``(B, T, D)``, with ``return_steps`` and the ``decoder_spec.GQA_STEPS``."""

    def __init__(
        self, d_in: int, num_heads: int, num_kv_groups: int, head_dim: int, qk_norm: bool, *,
        rope_base: float, rope_freq: Mapping[str, Any] | None, norm_eps: float, norm_weight: str,
        dtype: Any = jnp.float32, rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        self.num_heads, self.num_kv_groups, self.head_dim = num_heads, num_kv_groups, head_dim
        self.rope_base, self.rope_freq = rope_base, None if rope_freq is None else dict(rope_freq)
        self.W_query = base.torch_linear(d_in, num_heads * head_dim, False, dtype, rngs)
        self.W_key = base.torch_linear(d_in, num_kv_groups * head_dim, False, dtype, rngs)
        self.W_value = base.torch_linear(d_in, num_kv_groups * head_dim, False, dtype, rngs)
        self.out_proj = base.torch_linear(num_heads * head_dim, d_in, False, dtype, rngs)
        norm = functools.partial(RMSNorm, head_dim, norm_eps, weight_name=norm_weight, dtype=dtype)
        self.q_norm, self.k_norm = (norm(), norm()) if qk_norm else (None, None)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        inv_freq = spec.rope_frequencies(self.head_dim, self.rope_base, self.rope_freq)  # (H/2,)
        queries, keys, values, steps = rotated_heads(
            self.W_query(x), self.W_key(x), self.W_value(x), num_heads=self.num_heads,
            num_kv_groups=self.num_kv_groups, inv_freq=inv_freq, q_norm=self.q_norm, k_norm=self.k_norm,
        )  # fmt: skip
        context_vec, attention_steps = attend_groups(queries, keys, values, causal_mask(x.shape[1]))
        output = self.out_proj(context_vec)  # (B, T, D)
        steps = Steps(**steps, **attention_steps, context_vec=context_vec, output=output)
        return (output, steps) if return_steps else output


class DecoderBlock(nnx.Module):
    """Pre-RMSNorm block: ``x + att(norm1(x))``, then ``+ ff(norm2(.))``; x ``(B, T, D)`` -> same, with
    ``return_steps`` and the ``gpt_spec.BLOCK_STEPS``."""

    def __init__(self, cfg: Mapping[str, Any], model: str, *, dtype: Any, rngs: nnx.Rngs) -> None:
        weight, eps = spec.MODELS[model].norms[0], spec.norm_eps(cfg, model)
        arguments = spec.attention_arguments(cfg, model)
        heads = (arguments.pop("num_heads"), arguments.pop("num_kv_groups"), spec.head_dim(cfg, model))
        qk_norm = spec.uses_qk_norm(cfg, model)
        self.att = GroupedQueryAttention(
            cfg["emb_dim"], *heads, qk_norm, **arguments, norm_weight=weight, dtype=dtype, rngs=rngs
        )
        self.ff = SwiGLUFeedForward(cfg["emb_dim"], cfg["hidden_dim"], dtype=dtype, rngs=rngs)
        self.norm1 = RMSNorm(cfg["emb_dim"], eps, weight_name=weight, dtype=dtype)
        self.norm2 = RMSNorm(cfg["emb_dim"], eps, weight_name=weight, dtype=dtype)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        parts = {"norm1": self.norm1, "att": self.att, "norm2": self.norm2, "ff": self.ff}
        x, steps = apply_block(x, **parts, drop_shortcut=lambda h: h)
        return (x, steps) if return_steps else x


class _Decoder(ModelWeights):
    """Token ids ``(B, T)``, T <= context_length -> logits ``(B, T, V)``.

    Drawn as torch draws it (embeddings N(0, 1), Linear layers U(±1/sqrt(in_features)), RMSNorms
    ones) from ``rngs``' ``params`` stream, in ``dtype`` (``cfg["dtype"]`` by default, else float32).
    ``tie_embeddings=True`` ties the output head to the token embedding, as Llama 3.2 1B and 3B and
    the small Qwen3 models do (``out_head`` is ``tok_emb``; the book's classes hold them apart).
    ``return_steps=True`` gives ``(logits, steps)``: ``embeddings``, ``trf_blocks.{i}.<step>``,
    ``final_norm``, ``output``. ``from_params``, ``load_params`` and ``to_params`` take and give the
    weights format (a tied model's under both names, equal); ``from_hf`` reads a Hugging Face folder
    (tied where it is), ``save_hf`` writes one. A bad cfg, dtype, rngs or token ids raise
    numpy_attn's errors (``decoder_checks``).
    """

    def __init__(
        self, cfg: Mapping[str, Any], *, tie_embeddings: bool = False, dtype: Any = None, rngs: nnx.Rngs
    ) -> None:
        spec.check_config(cfg, self.model)  # before its dtype is read
        dtype = spec.dtype_name(cfg) or jnp.float32 if dtype is None else dtype
        dtype = self._check_build(cfg, tie_embeddings, dtype, rngs)
        self.cfg = dict(cfg)
        vocab, emb = cfg["vocab_size"], cfg["emb_dim"]
        init = base.torch_normal
        self.tok_emb = nnx.Embed(vocab, emb, dtype=dtype, param_dtype=dtype, embedding_init=init, rngs=rngs)
        blocks = [DecoderBlock(cfg, self.model, dtype=dtype, rngs=rngs) for _ in range(cfg["n_layers"])]
        self.trf_blocks = nnx.List(blocks)
        weight = spec.MODELS[self.model].norms[0]
        self.final_norm = RMSNorm(emb, spec.norm_eps(cfg, self.model), weight_name=weight, dtype=dtype)
        self._init_head(tie_embeddings, dtype, rngs)

    def __call__(self, token_ids: jax.Array, *, return_steps: bool = False) -> Output:
        self._check_call(token_ids, return_steps)
        x = self.tok_emb(token_ids)  # (B, T, D)
        blocks = [functools.partial(block, return_steps=True) for block in self.trf_blocks]
        logits, steps = apply_model(x, blocks=blocks, final_norm=self.final_norm, out_head=self._logits)
        return (logits, steps) if return_steps else logits  # (B, T, V)

    @classmethod
    def from_hf(cls, directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None) -> Self:
        """A model from a transformers folder of this architecture (``numpy_attn.load_hf``), its head
        tied to its token embedding where the checkpoint's is (``numpy_attn.hf_gpt2.tied``)."""
        params, cfg = load_hf(directory)
        if spec.model_kind(cfg) != cls.model:
            raise ValueError(f"{os.fspath(directory)} holds no {cls.model}: load it with jax_attn.from_hf")
        return cls._from_checkpoint(params, cfg, rngs)

    def save_hf(self, directory: str | os.PathLike) -> None:
        """Write the model as a folder transformers' ``AutoModelForCausalLM.from_pretrained`` loads
        (tied where ``out_head.weight`` equals ``tok_emb.weight``: always for a tied model)."""
        save_hf(directory, self.to_params(), self.cfg)


class Llama3Model(_Decoder):
    """The book's ``Llama3Model(cfg)`` (Llama 3, 3.1, 3.2): RMSNorms' ``weight``, RoPE with ``rope_freq``."""

    model = "Llama3Model"


class Qwen3Model(_Decoder):
    """The book's ``Qwen3Model(cfg)`` (dense): RMSNorms' ``scale``, ``head_dim``, QK-norm with ``qk_norm``."""

    model = "Qwen3Model"


def from_hf(directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None) -> nnx.Module:
    """The model of a transformers folder, by its config.json's ``model_type``: a ``GPTModel`` (gpt2),
    a ``Llama3Model`` (llama) or a ``Qwen3Model`` (qwen3), its weights in their dtype, its head tied
    to its token embedding where the checkpoint's is (``numpy_attn.hf_gpt2.tied``)."""
    params, cfg = load_hf(directory)
    classes = {cls.model: cls for cls in (jax_attn.GPTModel, Llama3Model, Qwen3Model)}
    return classes[spec.model_kind(cfg)]._from_checkpoint(params, cfg, rngs)
