"""The book's chapter-4 ``GPTModel`` as a Flax NNX module, under the book's attribute names.

``tok_emb``, ``pos_emb`` (``nnx.Embed``), ``drop_emb``, ``trf_blocks`` (an ``nnx.List`` of
``TransformerBlock``: ``att``, jax_attn's ``MultiHeadAttention``; ``ff.layers`` = [Linear, GELU,
Linear]; ``norm1``, ``norm2``, ``drop_shortcut``), ``final_norm``, ``out_head`` (an ``nnx.Linear``,
or with ``tie_embeddings`` the ``tok_emb`` module itself). The block and model loops are
``numpy_attn.gpt_spec``'s, the LayerNorm and GELU math ``jax_attn.gpt``'s. It works under
``nnx.jit`` and ``nnx.grad``; ``.train()``/``.eval()`` switch dropout.
"""

from __future__ import annotations

import functools
import os
from collections.abc import Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_attn
from jax_attn import gpt
from jax_attn import module_base as base
from jax_attn.modules import MultiHeadAttention
from numpy_attn import checks, gpt_checks
from numpy_attn import gpt_spec as spec
from numpy_attn.decoder_spec import (
    MODELS,
    decoder_param_count,
    decoder_param_shapes,
    without_buffers,
)
from numpy_attn.gpt_spec import FIRST_WEIGHT
from numpy_attn.hf_gpt2 import load_hf_gpt2, save_hf_gpt2, tied
from numpy_attn.steps import Steps

Output = jax.Array | tuple[jax.Array, Steps]  # the output, or (output, steps) with return_steps


class LayerNorm(nnx.Module):
    """The book's ``LayerNorm``: ``scale`` (ones) and ``shift`` (zeros), ``(D,)``; x ``(..., D)`` -> same."""

    def __init__(self, emb_dim: int, *, dtype: Any = jnp.float32) -> None:
        self.scale = nnx.Param(jnp.ones((emb_dim,), dtype))
        self.shift = nnx.Param(jnp.zeros((emb_dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return gpt.layer_norm({"scale": self.scale[...], "shift": self.shift[...]}, x)


class GELU(nnx.Module):
    """GELU, tanh approximation; no weights (it keeps ``ff.layers``' torch numbering)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return gpt.gelu(x)


class FeedForward(nnx.Module):
    """``layers``: Linear(D, 4D), GELU, Linear(4D, D), drawn as ``nn.Linear``; x ``(..., D)`` -> same."""

    def __init__(self, config: Mapping[str, Any], *, dtype: Any = jnp.float32, rngs: nnx.Rngs) -> None:
        emb = config["emb_dim"]
        expand = base.torch_linear(emb, 4 * emb, True, dtype, rngs)
        self.layers = nnx.List([expand, GELU(), base.torch_linear(4 * emb, emb, True, dtype, rngs)])

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)  # (B, T, 4D), then (B, T, D)
        return x


class TransformerBlock(nnx.Module):
    """The pre-LayerNorm block: ``x + drop(att(norm1(x)))``, then ``+ drop(ff(norm2(.)))``; x
    ``(B, T, D)`` -> ``(B, T, D)``, with ``return_steps`` and the ``gpt_spec.BLOCK_STEPS``."""

    def __init__(self, config: Mapping[str, Any], *, dtype: Any = jnp.float32, rngs: nnx.Rngs) -> None:
        emb, rate = config["emb_dim"], config["drop_rate"]
        sizes = (emb, emb, config["context_length"], rate, config["n_heads"], config["qkv_bias"])
        self.att = MultiHeadAttention(*sizes, dtype=dtype, rngs=rngs)
        self.ff = FeedForward(config, dtype=dtype, rngs=rngs)
        self.norm1, self.norm2 = LayerNorm(emb, dtype=dtype), LayerNorm(emb, dtype=dtype)
        self.drop_shortcut = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False) -> Output:
        parts = {"norm1": self.norm1, "att": self.att, "norm2": self.norm2, "ff": self.ff}
        x, steps = spec.apply_block(x, **parts, drop_shortcut=self.drop_shortcut)
        return (x, steps) if return_steps else x


class ModelWeights(base.TorchWeights):
    """A model of ``numpy_attn.decoder_spec.MODELS`` (``model``, its key) holding its config under the
    row's ``config_name``: its weights format, its checks of a build, of token ids and of weights."""

    model: ClassVar[str]

    @property
    def model_config(self) -> dict[str, Any]:
        """The config the model was built from: a ``GPTModel``'s ``config``, a decoder's ``cfg``."""
        return getattr(self, MODELS[self.model].config_name)

    def _check_build(self, config: Any, tie_embeddings: bool, dtype: Any, rngs: nnx.Rngs) -> np.dtype:
        """The constructor's checks: the config, ``tie_embeddings`` a bool, ``rngs``, weights of
        ``dtype`` that fit in memory. Returns the dtype."""
        MODELS[self.model].check_config(config)
        checks.check_flag("tie_embeddings", tie_embeddings)
        base.check_rngs(rngs)
        one_block = decoder_param_shapes({**config, "n_layers": 1}, self.model)  # every block's shapes
        base.check_weights_to_draw(dtype, one_block, self.model, decoder_param_count(config, self.model))
        return jax_attn.FRAMEWORK.check_dtype(dtype)

    def _init_head(self, tie_embeddings: bool, dtype: np.dtype, rngs: nnx.Rngs) -> None:
        """``out_head``: a Linear D -> V with no bias, drawn as ``nn.Linear``; with ``tie_embeddings``
        the ``tok_emb`` module itself, one variable under both torch names (``tok_emb.weight`` and
        ``out_head.weight``, torch's ``(V, D)`` both), as transformers ties ``lm_head`` to the
        embeddings: trained as one matrix."""
        self.tie_embeddings = bool(tie_embeddings)
        vocab, emb = self.model_config["vocab_size"], self.model_config["emb_dim"]
        self.out_head = self.tok_emb if tie_embeddings else base.torch_linear(emb, vocab, False, dtype, rngs)

    def _logits(self, x: jax.Array) -> jax.Array:
        """The output head on x ``(B, T, D)`` -> logits ``(B, T, V)``: ``out_head``, or the token
        embedding's transpose where tied (``nnx.Embed.attend``: ``x @ embedding.T``)."""
        return self.out_head.attend(x) if self.tie_embeddings else self.out_head(x)

    def _check_call(self, token_ids: Any, return_steps: bool) -> None:
        """A call's checks: ``return_steps`` a bool, the token ids (their values where not traced)."""
        checks.check_flag("return_steps", return_steps)
        known = jax_attn.FRAMEWORK.concrete({"token_ids": token_ids})
        gpt_checks.check_token_ids(token_ids, self.model_config, values=known)

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], config: Mapping[str, Any], *, tie_embeddings: bool = False,
        rngs: nnx.Rngs | None = None,
    ) -> Self:  # fmt: skip
        """A model holding ``params`` (the weights format, or a ``state_dict()`` as it is: its buffers
        left out), in their dtype, loaded by ``load_params``; with ``tie_embeddings`` its head tied
        to its token embedding (one variable: ``out_head.weight`` must equal ``tok_emb.weight``);
        without ``rngs`` built as shapes (no weight drawn to be thrown away; a GPT in eval mode with
        no dropout stream). Raises ``check_model_params``' errors, and ``load_params``' ValueError
        for tied weights that differ."""
        weights = base.readable_weights(without_buffers(cls.model, params, config))
        gpt_checks.check_model_params(jax_attn.FRAMEWORK, cls.model, weights, config, values=False)
        dtype = weights[FIRST_WEIGHT].dtype
        build = functools.partial(cls, config, tie_embeddings=tie_embeddings, dtype=dtype)
        module = base.build_to_load(lambda rngs: build(rngs=rngs), rngs)
        base.check_loaded(module.load_params(weights))
        return module

    @classmethod
    def _from_checkpoint(
        cls, params: dict[str, np.ndarray], config: Mapping[str, Any], rngs: nnx.Rngs | None
    ) -> Self:
        """A model of a Hugging Face checkpoint's weights (``numpy_attn``'s loaders), tied where the
        checkpoint is: where its ``out_head.weight`` equals its ``tok_emb.weight`` (the file held no
        ``lm_head``, or an equal one), the savers' rule for writing a tied folder."""
        return cls.from_params(params, config, tie_embeddings=tied(params), rngs=rngs)

    def _format(self) -> dict[str, tuple[int, ...]]:
        return decoder_param_shapes(self.model_config, self.model)

    def _without_buffers(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return without_buffers(self.model, params, self.model_config)

    def _check_load(self, weights: Mapping[str, Any], variables: base.Variables) -> None:
        gpt_checks.check_model_params(jax_attn.FRAMEWORK, self.model, weights, self.model_config)


class GPTModel(ModelWeights):
    """The book's ``GPTModel(config)``: token ids ``(B, T)``, T <= context_length -> logits ``(B, T, V)``.

    Drawn as torch draws it (embeddings N(0, 1), Linear layers U(±1/sqrt(in_features)), LayerNorms
    ones and zeros) from ``rngs``' ``params`` stream; dropout draws from its ``dropout`` stream in
    train mode (the default, as in torch). ``tie_embeddings=True`` ties the output head to the token
    embedding, as GPT-2 does (``out_head`` is ``tok_emb``; the book's GPT holds them apart).
    ``return_steps=True`` gives ``(logits, steps)``: ``embeddings``, ``trf_blocks.{i}.<step>``,
    ``final_norm``, ``output``. ``from_params``, ``load_params`` and ``to_params`` take and give the
    weights format (a tied model's under both names, equal); ``from_hf_gpt2`` reads a Hugging Face
    GPT-2 folder (tied where it is), ``save_hf_gpt2`` writes one.
    A bad config, dtype, rngs or token ids raise numpy_attn's errors (``gpt_checks``).
    """

    model = "GPTModel"

    def __init__(
        self, config: Mapping[str, Any], *, tie_embeddings: bool = False, dtype: Any = jnp.float32,
        rngs: nnx.Rngs,
    ) -> None:  # fmt: skip
        dtype = self._check_build(config, tie_embeddings, dtype, rngs)
        self.config = dict(config)
        vocab, emb = config["vocab_size"], config["emb_dim"]
        embed = functools.partial(nnx.Embed, dtype=dtype, param_dtype=dtype, embedding_init=base.torch_normal)
        self.tok_emb = embed(vocab, emb, rngs=rngs)
        self.pos_emb = embed(config["context_length"], emb, rngs=rngs)
        self.drop_emb = nnx.Dropout(config["drop_rate"], rngs=rngs)
        blocks = [TransformerBlock(config, dtype=dtype, rngs=rngs) for _ in range(config["n_layers"])]
        self.trf_blocks = nnx.List(blocks)
        self.final_norm = LayerNorm(emb, dtype=dtype)
        self._init_head(tie_embeddings, dtype, rngs)

    def __call__(self, token_ids: jax.Array, *, return_steps: bool = False) -> Output:
        self._check_call(token_ids, return_steps)
        tok_embeds = self.tok_emb(token_ids)  # (B, T, D)
        pos_embeds = self.pos_emb.embedding[: token_ids.shape[1]]  # (T, D)
        x = self.drop_emb(tok_embeds + pos_embeds)  # (B, T, D)
        blocks = [functools.partial(block, return_steps=True) for block in self.trf_blocks]
        logits, steps = spec.apply_model(x, blocks=blocks, final_norm=self.final_norm, out_head=self._logits)
        return (logits, steps) if return_steps else logits  # (B, T, V)

    @classmethod
    def from_hf_gpt2(cls, directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None) -> Self:
        """A model from a Hugging Face GPT-2 folder (``config.json`` and ``model.safetensors``), its
        head tied to its token embedding where the checkpoint's is (``numpy_attn.hf_gpt2.tied``)."""
        return cls._from_checkpoint(*load_hf_gpt2(directory), rngs)

    def save_hf_gpt2(self, directory: str | os.PathLike) -> None:
        """Write the model as a folder transformers' ``GPT2LMHeadModel.from_pretrained`` loads (tied
        where ``out_head.weight`` equals ``tok_emb.weight``: always for a tied model)."""
        save_hf_gpt2(directory, self.to_params(), self.config)
