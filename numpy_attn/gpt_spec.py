"""The book's chapter-4 GPT, framework-neutrally: its config, its weights' names and shapes, and the
order of its steps (the block and model loops both packages run).

``config`` is the book's dict (``vocab_size``, ``context_length``, ``emb_dim``, ``n_heads``,
``n_layers``, ``drop_rate``, ``qkv_bias``). The weights are torch_ref ``GPTModel``'s ``state_dict``
names (buffers such as ``trf_blocks.{i}.att.mask`` excluded), torch layout, as
``decoder_spec.gpt_param_shapes`` lists them (``decoder_spec.MODELS`` holds the three models).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from numpy_attn import checks
from numpy_attn.spec import SPECS
from numpy_attn.steps import Steps

CONFIG_KEYS = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "drop_rate", "qkv_bias")
FIRST_WEIGHT = "tok_emb.weight"  # the weight whose dtype the others must have
BLOCK_ATTENTION = SPECS["MultiHeadAttention"]  # each block's ``att``
LAYER_NORM_EPS = 1e-5
BLOCK_STEPS = {
    "norm1": "(B, T, D) norm1(x)",
    "att": "(B, T, D) att(norm1(x)), before the residual dropout",
    "shortcut1": "(B, T, D) x + drop(att(norm1(x))): the first residual sum",
    "norm2": "(B, T, D) norm2(shortcut1)",
    "ff": "(B, T, D) ff(norm2(shortcut1)), before the residual dropout",
    "output": "(B, T, D) shortcut1 + drop(ff(norm2(shortcut1))): the block's output",
}
MODEL_STEPS = {  # a model's own, around its blocks' trf_blocks.{i}.<step>
    "embeddings": "(B, T, D) the embedded tokens (and positions), after dropout",
    "final_norm": "(B, T, D) the final norm of the last block's output",
    "output": "(B, T, V) the logits",
}


def check_config(config: Any) -> None:
    """ValueError naming missing keys or values that cannot build a GPT (TypeError for a size that is
    not an int, as ``check_size``, or a ``qkv_bias`` that is not a bool)."""
    check_config_sizes("config", config, "GPT", CONFIG_KEYS, CONFIG_KEYS[:5])  # sizes: vocab_size..n_layers
    checks.check_divisible("emb_dim", config["emb_dim"], config["n_heads"])
    checks.check_dropout("config['drop_rate']", config["drop_rate"])
    checks.check_flag("config['qkv_bias']", config["qkv_bias"])


def check_config_sizes(name: str, config: Any, model: str, keys: Sequence[str], sizes: Sequence[str]) -> None:
    """``config`` (named ``name``) a mapping (TypeError) with every one of ``keys`` (ValueError
    naming the missing ones and ``model``) and each of ``sizes`` a positive int (``check_size``)."""
    if not isinstance(config, Mapping):
        raise TypeError(f"{name} must be a mapping with keys {list(keys)}, got {type(config).__name__}")
    if missing := [key for key in keys if key not in config]:
        raise ValueError(f"{name} is missing keys {missing}; a {model} {name} has {list(keys)}")
    for key in sizes:
        checks.check_size(f"{name}[{key!r}]", config[key])


def _prefixed(prefix: str, shapes: Mapping[str, tuple[int, ...]]) -> dict[str, tuple[int, ...]]:
    return {prefix + name: shape for name, shape in shapes.items()}


def layer_norm_shapes(emb_dim: int) -> dict[str, tuple[int, ...]]:
    """A ``LayerNorm``'s weights (``norm1.``, ``norm2.``, ``final_norm.`` in the model)."""
    return {"scale": (emb_dim,), "shift": (emb_dim,)}


def feed_forward_shapes(emb_dim: int) -> dict[str, tuple[int, ...]]:
    """A ``FeedForward``'s weights (``ff.`` in a block): D -> 4D, then 4D -> D."""
    return {
        "layers.0.weight": (4 * emb_dim, emb_dim),
        "layers.0.bias": (4 * emb_dim,),
        "layers.2.weight": (emb_dim, 4 * emb_dim),
        "layers.2.bias": (emb_dim,),
    }


PART_SHAPES: dict[str, Callable[[int], dict[str, tuple[int, ...]]]] = {
    "LayerNorm": layer_norm_shapes,
    "FeedForward": feed_forward_shapes,
}


def block_shapes(emb_dim: int, qkv_bias: bool) -> dict[str, tuple[int, ...]]:
    """A ``TransformerBlock``'s weights (``trf_blocks.{i}.`` in the model), in torch's order."""
    attention = BLOCK_ATTENTION.shapes(d_in=emb_dim, d_out=emb_dim, qkv_bias=qkv_bias, out_bias=True)
    return (
        _prefixed("att.", attention)
        | _prefixed("ff.", feed_forward_shapes(emb_dim))
        | _prefixed("norm1.", layer_norm_shapes(emb_dim))
        | _prefixed("norm2.", layer_norm_shapes(emb_dim))
    )


def sub_params(params: Mapping[str, Any], prefix: str) -> dict[str, Any]:
    """The weights under ``prefix`` (``"trf_blocks.0.att."``) with the prefix removed."""
    return {name[len(prefix) :]: value for name, value in params.items() if name.startswith(prefix)}


Part = Callable[[Any], Any]


def apply_block(
    x: Any, *, norm1: Part, att: Part, norm2: Part, ff: Part, drop_shortcut: Part
) -> tuple[Any, Steps]:
    """The ``TransformerBlock``'s steps around its parts (the full causal pass or a cached decode
    step as ``att``), in NumPy or JAX: returns the output and the ``BLOCK_STEPS`` trace."""
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


def apply_model(
    x: Any, *, blocks: Sequence[Callable[[Any], tuple[Any, Steps]]], final_norm: Part, out_head: Part
) -> tuple[Any, Steps]:
    """The ``GPTModel``'s steps after the embeddings ``x`` (B, T, D): each block, the final LayerNorm,
    the output head. Returns the logits (B, T, V) and the trace (``embeddings``,
    ``trf_blocks.{i}.<step>``, ``final_norm``, ``output``)."""
    steps = Steps(embeddings=x)
    for index, block in enumerate(blocks):
        x, block_steps = block(x)  # (B, T, D)
        steps.update((f"trf_blocks.{index}.{name}", value) for name, value in block_steps.items())
    x = final_norm(x)
    steps["final_norm"] = x
    logits = out_head(x)  # (B, T, V)
    steps["output"] = logits
    return logits, steps


Math = Callable[[Mapping[str, Any], Any], Any]  # a part's math: (its weights, x) -> its output


def block_parts(params: Mapping[str, Any], *, norm: Math, feed_forward: Math) -> dict[str, Part]:
    """A block's ``norm1``, ``norm2`` (``norm``) and ``ff`` (``feed_forward``) on its weights
    ``params`` (``norm1.*``, ``norm2.*``, ``ff.*``), for ``apply_block``."""
    return {
        "norm1": functools.partial(norm, sub_params(params, "norm1.")),
        "norm2": functools.partial(norm, sub_params(params, "norm2.")),
        "ff": functools.partial(feed_forward, sub_params(params, "ff.")),
    }


def model_head(params: Mapping[str, Any], *, norm: Math, linear: Callable[..., Any]) -> dict[str, Part]:
    """``apply_model``'s ``final_norm`` (``norm`` on ``final_norm.*``) and ``out_head`` (x times
    ``out_head.weight`` by ``linear``, (B, T, D) -> (B, T, V))."""
    return {
        "final_norm": functools.partial(norm, sub_params(params, "final_norm.")),
        "out_head": lambda x: linear(x, params["out_head.weight"]),  # (B, T, V)
    }


def apply_layers(
    params: Mapping[str, Any], x: Any, n_layers: int, *,
    block: Callable[[int, Mapping[str, Any]], Callable[[Any], tuple[Any, Steps]]], norm: Math,
    linear: Callable[..., Any],
) -> tuple[Any, Steps]:  # fmt: skip
    """A model's full pass after the embeddings ``x`` (B, T, D): ``apply_model`` over
    ``block(i, block i's weights)`` for each of the ``n_layers`` blocks and ``model_head``. Returns
    ``apply_model``'s ``(logits (B, T, V), steps)``."""
    blocks = [block(index, sub_params(params, f"trf_blocks.{index}.")) for index in range(n_layers)]
    return apply_model(x, blocks=blocks, **model_head(params, norm=norm, linear=linear))


def decode_model(
    params: Mapping[str, Any], x: Any, caches: Sequence[Any], *, att: Callable[..., tuple[Any, Any]],
    norm: Math, feed_forward: Math, linear: Callable[..., Any], last_only: bool,
) -> tuple[Any, tuple[Any, ...]]:  # fmt: skip
    """A model's decoding step after the embeddings ``x`` (B, t, D) of its new tokens, in NumPy or JAX:
    block i is ``apply_block`` over its ``block_parts`` (the feed-forward on the B·t rows, no
    dropout) with ``att(its att. weights, h, caches[i])`` (the output and the new cache), then
    ``model_head`` (``out_head`` on the B·t rows, on the last token alone where ``last_only``).
    Returns ``(logits (B, 1 or t, V), new caches)``."""
    new_caches = []

    def block(index: int, cache: Any) -> Callable[[Any], tuple[Any, Steps]]:
        weights = sub_params(params, f"trf_blocks.{index}.")

        def cached_att(h: Any) -> Any:
            output, new_cache = att(sub_params(weights, "att."), h, cache)
            new_caches.append(new_cache)
            return output

        parts = block_parts(weights, norm=norm, feed_forward=feed_forward)
        parts["ff"] = functools.partial(on_rows, parts["ff"])  # (B·t, D) rows
        return functools.partial(apply_block, **parts, att=cached_att, drop_shortcut=lambda h: h)

    head = model_head(params, norm=norm, linear=linear)
    out_head = functools.partial(on_rows, head["out_head"])  # (B, t, V)
    last = (lambda h: out_head(h[:, -1:])) if last_only else out_head  # (B, 1 or t, V)
    blocks = [block(index, cache) for index, cache in enumerate(caches)]
    logits, _ = apply_model(x, blocks=blocks, final_norm=head["final_norm"], out_head=last)
    return logits, tuple(new_caches)


def on_rows(fn: Part, x: Any) -> Any:
    """``fn`` of x ``(B, t, D)`` computed on its B·t rows ``(B·t, D)``: each weight in one product (a
    GEMV at t = 1; XLA:CPU converts a 16-bit weight to float32 first for a 3-D product)."""
    return fn(x.reshape(-1, x.shape[-1])).reshape(*x.shape[:-1], -1)
