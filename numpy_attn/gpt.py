"""The book's chapter-4 GPT as NumPy functions on the weights format (torch_ref ``GPTModel``'s names).

Axis letters: B batch, T tokens, D model width (``emb_dim``), V vocabulary. A block is
pre-LayerNorm: ``x + att(norm1(x))`` then ``x + ff(norm2(x))``, dropout after the embeddings,
on the attention weights and on both residual branches (``drop_rate``) when an ``rng`` is passed.
``BLOCK_STEPS`` names a block's step trace; ``gpt_model``'s trace holds ``embeddings``, each
block's steps as ``trf_blocks.{i}.<step>``, ``final_norm`` and ``output`` (the logits).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import numpy as np

from numpy_attn.dropout import unchecked_dropout
from numpy_attn.gpt_spec import (
    check_block,
    check_config,
    check_gpt_params,
    check_part,
    check_token_ids,
    sub_params,
    without_gpt_buffers,
)
from numpy_attn.linear import unchecked_linear
from numpy_attn.multi_head import multi_head_attention
from numpy_attn.steps import Steps
from numpy_attn.validation import check_flag, check_floating, check_rng

__all__ = [
    "BLOCK_STEPS",
    "LAYER_NORM_EPS",
    "apply_block",
    "apply_model",
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

LAYER_NORM_EPS = 1e-5
BLOCK_STEPS = {
    "norm1": "(B, T, D) norm1(x)",
    "att": "(B, T, D) att(norm1(x)), before the residual dropout",
    "shortcut1": "(B, T, D) x + drop(att(norm1(x))): the first residual sum",
    "norm2": "(B, T, D) norm2(shortcut1)",
    "ff": "(B, T, D) ff(norm2(shortcut1)), before the residual dropout",
    "output": "(B, T, D) shortcut1 + drop(ff(norm2(shortcut1))): the block's output",
}


def layer_norm(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``unchecked_layer_norm`` of a floating x ``(..., D)`` with ``params`` exactly
    ``{"scale": (D,), "shift": (D,)}`` in x's dtype (TypeError or ValueError otherwise)."""
    check_part("LayerNorm", params, x)
    return unchecked_layer_norm(params, np.asarray(x))


def unchecked_layer_norm(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``LayerNorm``: normalise over the last axis (biased variance, eps 1e-5), then
    ``scale * x + shift`` with ``params`` ``{"scale": (D,), "shift": (D,)}``, for arguments
    already checked (the GPT's)."""
    mean = x.mean(axis=-1, keepdims=True)  # (B, T, 1)
    var = x.var(axis=-1, keepdims=True)  # (B, T, 1), biased
    norm_x = (x - mean) / np.sqrt(var + LAYER_NORM_EPS)
    return params["scale"] * norm_x + params["shift"]


def gelu(x: np.ndarray) -> np.ndarray:
    """``unchecked_gelu`` of a floating array (TypeError otherwise: an integer one would give
    ``0.5 * x``)."""
    check_floating(x)
    return unchecked_gelu(np.asarray(x))


def unchecked_gelu(x: np.ndarray) -> np.ndarray:
    """GELU, tanh approximation (the book's ``GELU``, GPT-2's ``gelu_new``), in x's floating
    dtype, for an x already checked (the GPT's)."""
    return 0.5 * x * (1 + np.tanh(np.sqrt(2.0 / np.pi).astype(x.dtype) * (x + 0.044715 * x**3)))


def feed_forward(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``unchecked_feed_forward`` of a floating x ``(..., D)`` with ``params`` exactly
    ``layers.0`` (``weight`` (4D, D), ``bias`` (4D,)) and ``layers.2`` (``weight`` (D, 4D),
    ``bias`` (D,)) in x's dtype (TypeError or ValueError otherwise)."""
    check_part("FeedForward", params, x)
    return unchecked_feed_forward(params, np.asarray(x))


def unchecked_feed_forward(params: Mapping[str, np.ndarray], x: np.ndarray) -> np.ndarray:
    """``FeedForward``: ``layers.0`` (D -> 4D), GELU, ``layers.2`` (4D -> D), for arguments
    already checked (the GPT's)."""
    hidden = unchecked_linear(x, params["layers.0.weight"], params["layers.0.bias"])  # (B, T, 4D)
    hidden = unchecked_gelu(hidden)
    return unchecked_linear(hidden, params["layers.2.weight"], params["layers.2.bias"])  # (B, T, D)


def apply_block(
    x: np.ndarray,
    *,
    norm1: Callable[[np.ndarray], np.ndarray],
    att: Callable[[np.ndarray], np.ndarray],
    norm2: Callable[[np.ndarray], np.ndarray],
    ff: Callable[[np.ndarray], np.ndarray],
    drop_shortcut: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, Steps]:
    """The ``TransformerBlock``'s steps around its parts (the full causal pass or a cached
    decode step as ``att``): returns the output and the ``BLOCK_STEPS`` trace."""
    shortcut = x
    x = norm1(x)
    steps = Steps(norm1=x)
    x = att(x)  # (B, T, D)
    steps["att"] = x
    x = drop_shortcut(x) + shortcut
    steps["shortcut1"] = shortcut = x
    x = norm2(x)
    steps["norm2"] = x
    x = ff(x)  # (B, T, D)
    steps["ff"] = x
    x = drop_shortcut(x) + shortcut
    steps["output"] = x
    return x, steps


def block_parts(params: Mapping[str, np.ndarray]) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """``apply_block``'s ``norm1``, ``norm2`` and ``ff`` on a block's weights (checked already:
    the unchecked parts)."""
    return {
        "norm1": lambda x: unchecked_layer_norm(sub_params(params, "norm1."), x),
        "norm2": lambda x: unchecked_layer_norm(sub_params(params, "norm2."), x),
        "ff": lambda x: unchecked_feed_forward(sub_params(params, "ff."), x),
    }


def head_parts(params: Mapping[str, np.ndarray]) -> dict[str, Callable[[np.ndarray], np.ndarray]]:
    """``apply_model``'s ``final_norm`` and ``out_head`` on the model's weights (checked already)."""
    return {
        "final_norm": lambda x: unchecked_layer_norm(sub_params(params, "final_norm."), x),
        "out_head": lambda x: unchecked_linear(x, params["out_head.weight"]),
    }


def apply_model(
    x: np.ndarray,
    *,
    blocks: Sequence[Callable[[np.ndarray], tuple[np.ndarray, Steps]]],
    final_norm: Callable[[np.ndarray], np.ndarray],
    out_head: Callable[[np.ndarray], np.ndarray],
) -> tuple[np.ndarray, Steps]:
    """The ``GPTModel``'s steps after the embeddings ``x`` (B, T, D): each block (returning its
    output and trace), the final LayerNorm, the output head. Returns the logits (B, T, V) and
    the model's trace (``embeddings``, ``trf_blocks.{i}.<step>``, ``final_norm``, ``output``)."""
    steps = Steps(embeddings=x)
    for index, block in enumerate(blocks):
        x, block_steps = block(x)  # (B, T, D)
        steps.update((f"trf_blocks.{index}.{name}", value) for name, value in block_steps.items())
    x = final_norm(x)
    steps["final_norm"] = x
    logits = out_head(x)  # (B, T, V)
    steps["output"] = logits
    return logits, steps


def transformer_block(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    rng: np.random.Generator | None = None,
    return_steps: bool = False,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``unchecked_transformer_block`` after the checks of ``check_block`` (x a floating
    ``(B, T, D)``, T <= context_length; the weights exactly a block's for D, in x's dtype;
    ``num_heads`` dividing D; ``dropout_rate`` in [0, 1)) and of ``rng``."""
    check_block(params, x, num_heads=num_heads, context_length=context_length, dropout_rate=dropout_rate)
    check_rng(rng)
    check_flag("return_steps", return_steps)
    return unchecked_transformer_block(
        params, np.asarray(x), num_heads=num_heads, context_length=context_length,
        dropout_rate=dropout_rate, rng=rng, return_steps=return_steps,
    )  # fmt: skip


def unchecked_transformer_block(
    params: Mapping[str, np.ndarray],
    x: np.ndarray,
    *,
    num_heads: int,
    context_length: int,
    dropout_rate: float = 0.0,
    rng: np.random.Generator | None = None,
    return_steps: bool = False,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``TransformerBlock`` on ``x`` (B, T, D) with the block's weights (``att.*``, ``ff.*``,
    ``norm1.*``, ``norm2.*``); dropout (``dropout_rate``) only with an ``rng``. For arguments
    already checked (the GPT's); the attention layer checks its own."""
    x, steps = apply_block(
        x, **block_parts(params),
        att=lambda h: multi_head_attention(
            sub_params(params, "att."), h, num_heads=num_heads, context_length=context_length,
            dropout=dropout_rate, rng=rng,
        ),
        drop_shortcut=lambda h: unchecked_dropout(h, dropout_rate, rng=rng),
    )  # fmt: skip
    return (x, steps) if return_steps else x


def gpt_model(
    params: Mapping[str, np.ndarray],
    token_ids: np.ndarray,
    config: Mapping[str, Any],
    *,
    rng: np.random.Generator | None = None,
    return_steps: bool = False,
) -> np.ndarray | tuple[np.ndarray, Steps]:
    """``GPTModel``: integer ``token_ids`` (B, T), T <= context_length -> logits (B, T, V).

    ``params`` may be a ``state_dict()`` as it is (its causal-mask buffers are ignored:
    ``without_gpt_buffers``; as in ``gpt_model_decode``, ``generate``, ``save_hf_gpt2``). Every
    weight name and shape is checked against ``config`` first, then the ids.
    """
    check_config(config)
    params = without_gpt_buffers(params, config)
    check_gpt_params(params, config)
    check_token_ids(token_ids, config)
    check_rng(rng)
    check_flag("return_steps", return_steps)
    num_tokens = token_ids.shape[1]
    rate = config["drop_rate"]
    tok_embeds = params["tok_emb.weight"][token_ids]  # (B, T, D)
    pos_embeds = params["pos_emb.weight"][:num_tokens]  # (T, D)
    x = unchecked_dropout(tok_embeds + pos_embeds, rate, rng=rng)  # (B, T, D)
    blocks = [
        functools.partial(
            unchecked_transformer_block,
            sub_params(params, f"trf_blocks.{index}."),
            num_heads=config["n_heads"],
            context_length=config["context_length"],
            dropout_rate=rate,
            rng=rng,
            return_steps=True,
        )
        for index in range(config["n_layers"])
    ]
    logits, steps = apply_model(x, blocks=blocks, **head_parts(params))  # (B, T, V)
    return (logits, steps) if return_steps else logits
