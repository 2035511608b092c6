"""The book's chapter-4 GPT in JAX: numpy_attn.gpt's functions, and ``GPTModel`` as an NNX module.

The functions mirror numpy_attn.gpt (same names, arguments, checks and step traces; a
``jax.random`` ``key`` instead of an ``rng``); under ``jax.jit`` close over ``config``.
``GPTModel(config, *, rngs)`` holds the book's submodules under the book's names (``tok_emb``,
``pos_emb``, ``drop_emb``, ``trf_blocks`` (an ``nnx.List`` of ``TransformerBlock``: ``att``,
``ff.layers`` = [Linear, GELU, Linear], ``norm1``, ``norm2``, ``drop_shortcut``), ``final_norm``,
``out_head``) in Flax layout; ``from_params``/``to_params`` convert to and from the weights format
once, here; ``from_hf_gpt2`` reads a Hugging Face GPT-2 folder, ``save_hf_gpt2`` writes one.
It works under ``nnx.jit`` and ``nnx.grad``; ``.train()``/``.eval()`` switch dropout (a module
built by ``from_params`` without ``rngs`` starts in eval mode, with no dropout stream).
"""

from __future__ import annotations

import functools
import os
from collections.abc import Callable, Mapping
from typing import Any, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attn.checks import check_jax_operands, check_key, check_x64, is_concrete
from jax_attn.convert import flax_path, flax_value, torch_name, torch_value
from jax_attn.dropout import unchecked_dropout
from jax_attn.linear import unchecked_linear
from jax_attn.module_base import (
    build_to_load,
    check_loaded,
    check_rngs,
    check_weights_to_draw,
    load_variables,
    named_params,
    readable_weights,
    torch_linear,
    torch_normal,
)
from jax_attn.modules import MultiHeadAttention
from jax_attn.multi_head import multi_head_attention
from numpy_attn.gpt import BLOCK_STEPS, LAYER_NORM_EPS, apply_block, apply_model
from numpy_attn.gpt_spec import (
    CONFIG_KEYS,
    FIRST_WEIGHT,
    check_block,
    check_config,
    check_gpt_params,
    check_part,
    check_token_ids,
    gpt_param_shapes,
    sub_params,
    without_gpt_buffers,
)
from numpy_attn.hf_gpt2 import load_hf_gpt2, save_hf_gpt2
from numpy_attn.steps import Steps
from numpy_attn.validation import JAX_FLOATS, check_cast_finite, check_flag

__all__ = [
    "BLOCK_STEPS",
    "GELU",
    "FeedForward",
    "GPTModel",
    "LayerNorm",
    "TransformerBlock",
    "block_parts",
    "feed_forward",
    "gelu",
    "gpt_model",
    "head_parts",
    "layer_norm",
    "transformer_block",
    "unchecked_feed_forward",
    "unchecked_gelu",
    "unchecked_layer_norm",
    "unchecked_transformer_block",
]

EMBEDDINGS = ("tok_emb.weight", "pos_emb.weight")  # nnx.Embed keeps torch's (V, D) layout


def layer_norm(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``unchecked_layer_norm`` of a floating x ``(..., D)`` with ``params`` exactly
    ``{"scale": (D,), "shift": (D,)}`` in x's dtype (TypeError or ValueError otherwise; float64
    needs 64-bit mode)."""
    check_jax_operands(x=x)  # float64 refused as such before a weight is named against it
    check_part("LayerNorm", params, x, floating=JAX_FLOATS)
    return unchecked_layer_norm(params, jnp.asarray(x))


def unchecked_layer_norm(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``LayerNorm``: normalise over the last axis (biased variance, eps 1e-5), then
    ``scale * x + shift`` with ``params`` ``{"scale": (D,), "shift": (D,)}``, for arguments
    already checked (the GPT's)."""
    mean = x.mean(axis=-1, keepdims=True)  # (B, T, 1)
    var = x.var(axis=-1, keepdims=True)  # (B, T, 1), biased
    norm_x = (x - mean) / jnp.sqrt(var + LAYER_NORM_EPS)
    return params["scale"] * norm_x + params["shift"]


def gelu(x: jax.Array) -> jax.Array:
    """``unchecked_gelu`` of a floating array (TypeError otherwise: an integer one would give
    ``0.5 * x``; float64 needs 64-bit mode)."""
    check_jax_operands(x=x)  # float64 refused as such before a weight is named against it
    return unchecked_gelu(jnp.asarray(x))


def unchecked_gelu(x: jax.Array) -> jax.Array:
    """GELU, tanh approximation (the book's ``GELU``, GPT-2's ``gelu_new``), in x's floating
    dtype, for an x already checked (the GPT's)."""
    return 0.5 * x * (1 + jnp.tanh(jnp.sqrt(2.0 / jnp.pi).astype(x.dtype) * (x + 0.044715 * x**3)))


def feed_forward(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``unchecked_feed_forward`` of a floating x ``(..., D)`` with ``params`` exactly
    ``layers.0`` (``weight`` (4D, D), ``bias`` (4D,)) and ``layers.2`` (``weight`` (D, 4D),
    ``bias`` (D,)) in x's dtype (TypeError or ValueError otherwise; float64 needs 64-bit mode)."""
    check_jax_operands(x=x)  # float64 refused as such before a weight is named against it
    check_part("FeedForward", params, x, floating=JAX_FLOATS)
    return unchecked_feed_forward(params, jnp.asarray(x))


def unchecked_feed_forward(params: Mapping[str, jax.Array], x: jax.Array) -> jax.Array:
    """``FeedForward``: ``layers.0`` (D -> 4D), GELU, ``layers.2`` (4D -> D), for arguments
    already checked (the GPT's)."""
    hidden = unchecked_linear(x, params["layers.0.weight"], params["layers.0.bias"])  # (B, T, 4D)
    hidden = unchecked_gelu(hidden)
    return unchecked_linear(hidden, params["layers.2.weight"], params["layers.2.bias"])  # (B, T, D)


def block_parts(params: Mapping[str, jax.Array]) -> dict[str, Callable[[jax.Array], jax.Array]]:
    """``apply_block``'s ``norm1``, ``norm2`` and ``ff`` on a block's weights (checked already:
    the unchecked parts)."""
    return {
        "norm1": lambda x: unchecked_layer_norm(sub_params(params, "norm1."), x),
        "norm2": lambda x: unchecked_layer_norm(sub_params(params, "norm2."), x),
        "ff": lambda x: unchecked_feed_forward(sub_params(params, "ff."), x),
    }


def head_parts(params: Mapping[str, jax.Array]) -> dict[str, Callable[[jax.Array], jax.Array]]:
    """``apply_model``'s ``final_norm`` and ``out_head`` on the model's weights (checked already)."""
    return {
        "final_norm": lambda x: unchecked_layer_norm(sub_params(params, "final_norm."), x),
        "out_head": lambda x: unchecked_linear(x, params["out_head.weight"]),
    }


def _dropout_stream(rate: float, key: jax.Array | None, count: int) -> Callable[[jax.Array], jax.Array]:
    """Dropout drawing a new mask on each of ``count`` calls (identity without a key): the
    block's two residual branches."""
    keys = iter(jax.random.split(key, count)) if key is not None else None
    return lambda x: x if keys is None else unchecked_dropout(x, rate, key=next(keys))


def transformer_block(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    key: jax.Array | None = None,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``unchecked_transformer_block`` after the checks of ``check_block`` (x a floating
    ``(B, T, D)``, T <= context_length; the weights exactly a block's for D, in x's dtype;
    ``num_heads`` dividing D; ``dropout_rate`` in [0, 1)) and of ``key``; float64 needs 64-bit
    mode."""
    check_jax_operands(x=x)  # float64 refused as such before a weight is named against it
    check_block(
        params, x, num_heads=num_heads, context_length=context_length, dropout_rate=dropout_rate,
        floating=JAX_FLOATS,
    )  # fmt: skip
    check_key(key)  # before jax.random.split reads it
    check_flag("return_steps", return_steps)
    return unchecked_transformer_block(
        params, jnp.asarray(x), num_heads=num_heads, context_length=context_length,
        dropout_rate=dropout_rate, key=key, return_steps=return_steps,
    )  # fmt: skip


def unchecked_transformer_block(
    params: Mapping[str, jax.Array],
    x: jax.Array,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    key: jax.Array | None = None,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``TransformerBlock`` on ``x`` (B, T, D) with the block's weights (``att.*``, ``ff.*``,
    ``norm1.*``, ``norm2.*``); dropout (``dropout_rate``) only with a ``key``. For arguments
    already checked (the GPT's); the attention layer checks its own."""
    att_key, drop_key = (None, None) if key is None else jax.random.split(key)
    x, steps = apply_block(
        x, **block_parts(params),
        att=lambda h: multi_head_attention(
            sub_params(params, "att."), h, num_heads=num_heads, context_length=context_length,
            dropout=dropout_rate, key=att_key,
        ),
        drop_shortcut=_dropout_stream(dropout_rate, drop_key, 2),
    )  # fmt: skip
    return (x, steps) if return_steps else x


def gpt_model(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    config: Mapping[str, Any],
    *,
    key: jax.Array | None = None,
    return_steps: bool = False,
) -> jax.Array | tuple[jax.Array, Steps]:
    """``GPTModel``: integer ``token_ids`` (B, T), T <= context_length -> logits (B, T, V).

    ``params`` may be a ``state_dict()`` as it is (its causal-mask buffers are ignored:
    ``without_gpt_buffers``). Every weight name and shape is checked against ``config`` first,
    then the ids (their values only where concrete). Eager calls run one compiled program (as
    ``jax_attn.compiled`` does for the layers): eager and jitted results are bit-identical.
    """
    check_config(config)
    params = without_gpt_buffers(params, config)
    concrete = is_concrete(params) and not any(isinstance(a, jax.core.Tracer) for a in (token_ids, key))
    check_jax_gpt_params(params, config, check_values=concrete)
    check_token_ids(token_ids, config, check_values=concrete)
    check_key(key)  # before jit makes an array of an int and jax.random.split reads it
    check_flag("return_steps", return_steps)  # before jit hashes it as a static argument
    if concrete:
        return _compiled_gpt_model(params, token_ids, static_config(config), key, return_steps)
    return _gpt_model(params, token_ids, config, key, return_steps)


def static_config(config: Mapping[str, Any]) -> tuple[tuple[str, Any], ...]:
    """A checked ``config``'s ``CONFIG_KEYS`` items, a static ``jax.jit`` argument (hashable): the
    other keys a config may carry (a list from config.json) are not the model's, and left out."""
    return tuple((key, config[key]) for key in CONFIG_KEYS)


def check_jax_gpt_params(
    params: Mapping[str, Any], config: Mapping[str, Any], *, check_values: bool = True
) -> None:
    """``check_gpt_params`` with JAX's floats (bfloat16 too); float64 weights only in JAX's 64-bit
    mode (``check_x64``), as the layers' inputs."""
    check_gpt_params(params, config, check_values=check_values, floating=JAX_FLOATS)
    check_x64(f"params[{FIRST_WEIGHT!r}]", params[FIRST_WEIGHT])


def _gpt_model(
    params: Mapping[str, jax.Array],
    token_ids: jax.Array,
    config: Mapping[str, Any],
    key: jax.Array | None,
    return_steps: bool,
) -> jax.Array | tuple[jax.Array, Steps]:
    num_tokens = token_ids.shape[1]
    rate = config["drop_rate"]
    keys = (
        [None] * (config["n_layers"] + 1)
        if key is None
        else list(jax.random.split(key, config["n_layers"] + 1))
    )
    # jnp: a NumPy table (load_weights') cannot be indexed by ids that jax.jit or jax.vmap traces
    tok_embeds = jnp.asarray(params["tok_emb.weight"])[token_ids]  # (B, T, D)
    pos_embeds = params["pos_emb.weight"][:num_tokens]  # (T, D)
    x = unchecked_dropout(tok_embeds + pos_embeds, rate, key=keys[0])  # (B, T, D)
    blocks = [
        functools.partial(
            unchecked_transformer_block,
            sub_params(params, f"trf_blocks.{index}."),
            num_heads=config["n_heads"],
            context_length=config["context_length"],
            dropout_rate=rate,
            key=keys[index + 1],
            return_steps=True,
        )
        for index in range(config["n_layers"])
    ]
    logits, steps = apply_model(x, blocks=blocks, **head_parts(params))  # (B, T, V)
    return (logits, steps) if return_steps else logits


@functools.partial(jax.jit, static_argnames=("config_items", "return_steps"))
def _compiled_gpt_model(params, token_ids, config_items, key, return_steps):
    return _gpt_model(params, token_ids, dict(config_items), key, return_steps)


class LayerNorm(nnx.Module):
    """The book's ``LayerNorm``: ``scale`` (ones) and ``shift`` (zeros), eps 1e-5."""

    def __init__(self, emb_dim: int, *, dtype: Any = jnp.float32):
        self.scale = nnx.Param(jnp.ones((emb_dim,), dtype))
        self.shift = nnx.Param(jnp.zeros((emb_dim,), dtype))

    def __call__(self, x: jax.Array) -> jax.Array:
        return unchecked_layer_norm({"scale": self.scale[...], "shift": self.shift[...]}, x)


class GELU(nnx.Module):
    """GELU, tanh approximation (no weights: it keeps ``ff.layers``' torch numbering)."""

    def __call__(self, x: jax.Array) -> jax.Array:
        return unchecked_gelu(x)


class FeedForward(nnx.Module):
    """``layers``: Linear(D, 4D), GELU, Linear(4D, D), initialised as torch's ``nn.Linear``."""

    def __init__(self, config: Mapping[str, Any], *, dtype: Any = jnp.float32, rngs: nnx.Rngs):
        emb_dim = config["emb_dim"]
        self.layers = nnx.List(
            [
                torch_linear(emb_dim, 4 * emb_dim, True, dtype, rngs),
                GELU(),
                torch_linear(4 * emb_dim, emb_dim, True, dtype, rngs),
            ]
        )

    def __call__(self, x: jax.Array) -> jax.Array:
        for layer in self.layers:
            x = layer(x)  # (B, T, 4D), then (B, T, D)
        return x


class TransformerBlock(nnx.Module):
    """Pre-LayerNorm block around jax_attn's ``MultiHeadAttention`` (``att``)."""

    def __init__(self, config: Mapping[str, Any], *, dtype: Any = jnp.float32, rngs: nnx.Rngs):
        emb_dim, rate = config["emb_dim"], config["drop_rate"]
        self.att = MultiHeadAttention(
            emb_dim, emb_dim, config["context_length"], rate, config["n_heads"], config["qkv_bias"],
            dtype=dtype, rngs=rngs,
        )  # fmt: skip
        self.ff = FeedForward(config, dtype=dtype, rngs=rngs)
        self.norm1 = LayerNorm(emb_dim, dtype=dtype)
        self.norm2 = LayerNorm(emb_dim, dtype=dtype)
        self.drop_shortcut = nnx.Dropout(rate, rngs=rngs)

    def __call__(self, x: jax.Array, *, return_steps: bool = False):
        x, steps = apply_block(
            x, norm1=self.norm1, att=self.att, norm2=self.norm2, ff=self.ff, drop_shortcut=self.drop_shortcut
        )
        return (x, steps) if return_steps else x


class GPTModel(nnx.Module):
    """The book's ``GPTModel(config)``: token ids ``(B, T)`` -> logits ``(B, T, V)``.

    Initialised as torch initialises it (embeddings N(0, 1), Linear layers uniform in
    ±1/sqrt(in_features), LayerNorms ones and zeros), from ``rngs``'s ``params`` stream; dropout
    draws from its ``dropout`` stream in train mode (the default, as in torch).
    """

    def __init__(self, config: Mapping[str, Any], *, dtype: Any = jnp.float32, rngs: nnx.Rngs):
        check_config(config)
        check_rngs(rngs)
        check_weights_to_draw(gpt_param_shapes({**config, "n_layers": 1}), dtype)  # one block: each block's
        self.config = dict(config)
        vocab, context, emb = config["vocab_size"], config["context_length"], config["emb_dim"]
        self.tok_emb = nnx.Embed(
            vocab, emb, dtype=dtype, param_dtype=dtype, embedding_init=torch_normal, rngs=rngs
        )
        self.pos_emb = nnx.Embed(
            context, emb, dtype=dtype, param_dtype=dtype, embedding_init=torch_normal, rngs=rngs
        )
        self.drop_emb = nnx.Dropout(config["drop_rate"], rngs=rngs)
        self.trf_blocks = nnx.List(
            [TransformerBlock(config, dtype=dtype, rngs=rngs) for _ in range(config["n_layers"])]
        )
        self.final_norm = LayerNorm(emb, dtype=dtype)
        self.out_head = torch_linear(emb, vocab, False, dtype, rngs)

    def __call__(self, token_ids: jax.Array, *, return_steps: bool = False):
        check_flag("return_steps", return_steps)
        check_token_ids(token_ids, self.config, check_values=not isinstance(token_ids, jax.core.Tracer))
        num_tokens = token_ids.shape[1]
        tok_embeds = self.tok_emb(token_ids)  # (B, T, D)
        pos_embeds = self.pos_emb.embedding[:num_tokens]  # (T, D)
        x = self.drop_emb(tok_embeds + pos_embeds)
        blocks = [functools.partial(block, return_steps=True) for block in self.trf_blocks]
        logits, steps = apply_model(x, blocks=blocks, final_norm=self.final_norm, out_head=self.out_head)
        return (logits, steps) if return_steps else logits

    @classmethod
    def from_params(
        cls, params: Mapping[str, Any], config: Mapping[str, Any], *, rngs: nnx.Rngs | None = None
    ) -> Self:
        """A model holding ``params`` (the weights format, or a torch ``state_dict()`` as it is,
        its causal-mask buffers ignored (``without_gpt_buffers``), checked against ``config``: every
        missing, unexpected and mis-shaped key at once, then finiteness); the dtype is the
        weights'. Without ``rngs`` it is built as shapes (no weight is drawn to be thrown away),
        starts in eval mode and has no dropout stream."""
        weights = readable_weights(without_gpt_buffers(params, config))
        check_jax_gpt_params(weights, config)
        dtype = weights[FIRST_WEIGHT].dtype
        model = build_to_load(lambda rngs: cls(config, dtype=dtype, rngs=rngs), rngs)
        model.load_params(weights)
        check_loaded(model)
        return model

    @classmethod
    def from_hf_gpt2(cls, directory: str | os.PathLike, *, rngs: nnx.Rngs | None = None) -> Self:
        """A model from a Hugging Face GPT-2 folder (``config.json`` + ``model.safetensors``)."""
        params, config = load_hf_gpt2(directory)
        return cls.from_params(params, config, rngs=rngs)

    def save_hf_gpt2(self, directory: str | os.PathLike) -> None:
        """Write the model as a folder transformers' ``GPT2LMHeadModel.from_pretrained`` loads."""
        save_hf_gpt2(directory, self.to_params(), self.config)

    def _param_variables(self) -> dict[str, nnx.Param]:
        """torch name -> parameter, for each name of ``gpt_param_shapes`` that a path of the model
        has (a shared parameter under each of its names, an alias attribute left out:
        ``named_params``)."""
        named = named_params(self, gpt_param_shapes(self.config), _torch_name)
        return {name: node for name, (_, node) in named.items()}

    def torch_params(self) -> dict[str, jax.Array]:
        """The weights as JAX arrays in the weights format (torch names, layout and order)."""
        variables = self._param_variables()
        return {name: _torch_layout(name, variables[name][...]) for name in gpt_param_shapes(self.config)}

    def to_params(self) -> dict[str, np.ndarray]:
        """The weights in the weights format, as NumPy arrays in torch's order."""
        return {name: np.asarray(value) for name, value in self.torch_params().items()}

    def load_params(self, params: Mapping[str, Any]) -> Self:
        """Copy weights-format ``params`` (or a ``state_dict()``, its causal-mask buffers
        ignored) in, in place, after checking all of them; values are
        cast to the model's dtype. Nothing is written unless every key, shape and value fits, a
        finite value too large for the model's dtype (1e5 into float16) included."""
        weights = readable_weights(without_gpt_buffers(params, self.config))
        check_jax_gpt_params(weights, self.config)
        variables = self._param_variables()
        check_cast_finite(weights, {name: variable.get_value().dtype for name, variable in variables.items()})
        load_variables(variables, lambda name: jnp.asarray(_flax_layout(name, weights[name])))
        return self


def _torch_name(path: tuple[str | int, ...]) -> str:
    """``("tok_emb", "embedding")`` -> ``"tok_emb.weight"``; other paths as ``convert`` maps them."""
    return torch_name((*path[:-1], "kernel")) if path[-1] == "embedding" else torch_name(path)


def _flax_layout(name: str, value: Any) -> Any:
    return value if name in EMBEDDINGS else flax_value(name, value)


def _torch_layout(name: str, value: Any) -> Any:
    return value if name in EMBEDDINGS else torch_value(flax_path(name), value)
