"""The project's three models, framework-neutrally: ``MODELS``, the one table of the book's GPT
(``numpy_attn.gpt_spec``), Llama 3 and Qwen3 that the model functions, their checks, the Flax
modules and the files read; the decoders' cfg, their weights' names and shapes, RoPE's frequencies
and the steps of their attention; ``apply_decoder``, their full pass in both packages (around
``numpy_attn.gpt_spec``'s block and model loops).

``cfg`` is the book's dict: ``vocab_size``, ``context_length``, ``emb_dim``, ``n_heads``,
``n_layers``, ``hidden_dim``, ``n_kv_groups``, ``rope_base``; Llama 3 adds ``rope_freq`` (None, or
its frequency scaling: ``factor``, ``low_freq_factor``, ``high_freq_factor``,
``original_context_length``), Qwen3 ``head_dim`` (None: ``emb_dim // n_heads``) and ``qk_norm``.
Optional: ``rms_norm_eps`` (a Hugging Face config's; the book's eps otherwise: Llama 3 1e-5,
Qwen3 1e-6) and ``dtype`` (a torch dtype, a NumPy one or a name: the dtype modules are built in;
the functions compute in their weights' dtype). The weights are torch_ref ``Llama3Model``'s and
``Qwen3Model``'s ``state_dict`` names (the RoPE buffers ``cos`` and ``sin`` left out), torch layout,
as ``decoder_param_shapes`` lists them.
"""

from __future__ import annotations

import functools
import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from numpy_attn import checks, gpt_spec
from numpy_attn.gpt_spec import check_config_sizes

Shapes = dict[str, tuple[int, ...]]
SIZES = ("vocab_size", "context_length", "emb_dim", "n_heads", "n_layers", "hidden_dim", "n_kv_groups")
FREQ_CONFIG_KEYS = ("factor", "low_freq_factor", "high_freq_factor", "original_context_length")
GQA_STEPS = {
    "queries": "(B, T, N*H) W_query(x)",
    "keys": "(B, S, G*H) W_key(x): G = n_kv_groups key/value heads",
    "values": "(B, S, G*H) W_value(x)",
    "q_norm": "(B, N, T, H) each query head RMS-normalised (qk_norm only)",
    "k_norm": "(B, G, S, H) each key head RMS-normalised (qk_norm only)",
    "queries_rope": "(B, N, T, H) the query heads rotated (RoPE)",
    "keys_rope": "(B, G, S, H) the key heads rotated (RoPE)",
    "attn_scores": "(B, N, T, S) query head n @ key head n // (N/G), transposed",
    "masked_scores": "(B, N, T, S) attn_scores with -inf where the causal mask hides a key",
    "attn_weights": "(B, N, T, S) softmax(masked_scores / sqrt(H)) over S",
    "context_vec": "(B, T, N*H) attn_weights @ value head n // (N/G), heads merged",
    "output": "(B, T, D) out_proj(context_vec)",
}


@dataclass(frozen=True)
class Model:
    """One model of the project: what its functions, checks, modules and files read of it.

    ``config_name``: its config argument (``config``, ``cfg``), of the keys ``keys``, checked by
    ``check_config``; ``block_shapes``: one block's weights for a config; ``norms``: each norm's
    weights (``(D,)`` each; an RMSNorm's one, ``norms[0]``), with ``eps`` where the config has no
    ``rms_norm_eps``; ``positions``: whether it adds position embeddings; ``buffers``: its
    ``state_dict()``'s buffers (``{i}``: each block's); ``cache_heads``: the config key of its KV
    caches' heads, ``cache_axes`` their axes in the messages; ``module``: the file of its math in
    each package, whose ``init_cache`` makes its caches and ``decode`` runs a decoding step."""

    config_name: str
    keys: tuple[str, ...]
    check_config: Callable[[Any], None]
    block_shapes: Callable[[Mapping[str, Any]], Shapes]
    norms: tuple[str, ...]
    eps: float
    positions: bool
    buffers: tuple[str, ...]
    cache_heads: str
    cache_axes: str
    module: str
    init_cache: str


def _decoder(name: str, norm: str, eps: float, keys: tuple[str, ...]) -> Model:
    """A Llama 3 or Qwen3 row of ``MODELS``: its RMSNorms' weight ``norm``, ``keys`` beside ``SIZES``."""
    return Model(
        "cfg", (*SIZES, "rope_base", *keys), lambda cfg: check_config(cfg, name),
        lambda cfg: block_shapes(cfg, name), (norm,), eps, positions=False, buffers=("cos", "sin"),
        cache_heads="n_kv_groups", cache_axes="batch, n_kv_groups, context_length, head_dim",
        module="decoders", init_cache="init_decoder_cache",
    )  # fmt: skip


MODELS = {
    "GPTModel": Model(
        "config", gpt_spec.CONFIG_KEYS, gpt_spec.check_config,
        lambda config: gpt_spec.block_shapes(config["emb_dim"], bool(config["qkv_bias"])),
        ("scale", "shift"), gpt_spec.LAYER_NORM_EPS, positions=True,
        buffers=tuple(f"trf_blocks.{{i}}.att.{b}" for b in gpt_spec.BLOCK_ATTENTION.buffers),
        cache_heads="n_heads", cache_axes="batch, num_heads, max_length, head_dim",
        module="gpt", init_cache="init_gpt_cache",
    ),
    "Llama3Model": _decoder("Llama3Model", "weight", 1e-5, ("rope_freq",)),  # torch's nn.RMSNorm
    "Qwen3Model": _decoder("Qwen3Model", "scale", 1e-6, ("head_dim", "qk_norm")),  # the book's RMSNorm
}  # fmt: skip


def _check_number(name: str, value: Any, *, low: float = 0.0) -> None:
    """A finite real number above ``low`` (TypeError for a bool or another type)."""
    what = f"a finite number above {low:g}"
    checks.check_number(name, value, what, lambda v: math.isfinite(float(v)) and float(v) > low)


def check_eps(eps: Any, name: str = "eps") -> None:
    """An RMSNorm's eps: a finite number >= 0 (TypeError for a bool or another type)."""
    checks.check_number(name, eps, "a finite number >= 0", lambda v: math.isfinite(float(v)) and v >= 0)


def check_rope_base(value: Any, name: str = "rope_base") -> None:
    """RoPE's base: a finite number above 1 (1 would give every pair the same frequency, 0)."""
    _check_number(name, value, low=1.0)


def check_rope_freq(value: Any, name: str = "rope_freq") -> None:
    """None, or Llama 3's frequency scaling: a mapping of ``FREQ_CONFIG_KEYS`` to finite positive
    numbers with ``high_freq_factor > low_freq_factor`` (the smoothing divides by their difference)."""
    if value is None:
        return
    if not isinstance(value, Mapping):
        raise TypeError(f"{name} must be None or a mapping with keys {list(FREQ_CONFIG_KEYS)}, got {value!r}")
    if missing := [key for key in FREQ_CONFIG_KEYS if key not in value]:
        raise ValueError(f"{name} is missing keys {missing}; Llama 3's scaling has {list(FREQ_CONFIG_KEYS)}")
    for key in FREQ_CONFIG_KEYS:
        _check_number(f"{name}[{key!r}]", value[key])
    if not value["high_freq_factor"] > value["low_freq_factor"]:
        raise ValueError(
            f"{name}['high_freq_factor']={value['high_freq_factor']!r} must exceed "
            f"{name}['low_freq_factor']={value['low_freq_factor']!r}"
        )


def dtype_name(cfg: Mapping[str, Any]) -> str | None:
    """``cfg["dtype"]``'s name (``"bfloat16"``), None where absent or None: a torch dtype, a NumPy
    dtype or a name, of jax_attn's floats (TypeError otherwise)."""
    dtype = cfg.get("dtype")
    if dtype is None:
        return None
    name = dtype if isinstance(dtype, str) else str(dtype) if type(dtype).__module__ == "torch" else None
    if name is None:
        try:
            name = np.dtype(dtype).name
        except TypeError:
            name = ""
    name = name.removeprefix("torch.")
    if name not in checks.JAX_FLOATS:
        raise TypeError(
            f"cfg['dtype'] must be a floating dtype ({checks.FLOATS_ACCEPTED}) or None, got {dtype!r}"
        )
    return name


def check_config(cfg: Any, model: str) -> None:
    """ValueError naming missing keys or values that cannot build ``model`` (``"Llama3Model"``,
    ``"Qwen3Model"``); TypeError for a size that is not an int, a flag that is not a bool."""
    keys = MODELS[model].keys
    check_config_sizes("cfg", cfg, model, keys, SIZES)
    checks.check_divisible(
        "cfg['n_heads']", cfg["n_heads"], cfg["n_kv_groups"], heads_name="cfg['n_kv_groups']"
    )
    if "head_dim" in keys and cfg["head_dim"] is not None:
        checks.check_size("cfg['head_dim']", cfg["head_dim"])
    else:
        checks.check_divisible("cfg['emb_dim']", cfg["emb_dim"], cfg["n_heads"], heads_name="cfg['n_heads']")
    size = head_dim(cfg, model)
    if size % 2:
        raise ValueError(f"head_dim={size} must be even: RoPE rotates pairs of a head's features")
    check_rope_base(cfg["rope_base"], "cfg['rope_base']")
    if "rope_freq" in keys:
        check_rope_freq(cfg["rope_freq"], "cfg['rope_freq']")
    if "qk_norm" in keys:
        checks.check_flag("cfg['qk_norm']", cfg["qk_norm"])
    if "rms_norm_eps" in cfg:
        check_eps(cfg["rms_norm_eps"], "cfg['rms_norm_eps']")
    if cfg.get("num_experts"):  # the book's Qwen3 30B-A3B
        raise ValueError(
            f"cfg['num_experts']={cfg['num_experts']!r}: mixture-of-experts models are not supported"
        )
    dtype_name(cfg)


def model_of(cfg: Mapping[str, Any]) -> str:
    """The decoder a cfg describes: ``"Qwen3Model"`` where it has ``qk_norm``, ``"Llama3Model"`` otherwise."""
    return "Qwen3Model" if "qk_norm" in cfg else "Llama3Model"


def model_kind(config: Any) -> str:
    """The model a config describes, for the functions that take every model (``generate``): a
    Llama 3 or Qwen3 cfg (it has ``n_kv_groups``) by ``model_of``, else ``"GPTModel"`` (whose checks
    then name what a config that is neither lacks)."""
    return model_of(config) if isinstance(config, Mapping) and "n_kv_groups" in config else "GPTModel"


def head_dim(cfg: Mapping[str, Any], model: str) -> int:
    """H: Qwen3's ``head_dim`` where given, ``emb_dim // n_heads`` otherwise."""
    if "head_dim" in MODELS[model].keys and cfg["head_dim"] is not None:
        return cfg["head_dim"]
    return cfg["emb_dim"] // cfg["n_heads"]


def attention_arguments(cfg: Mapping[str, Any], model: str) -> dict[str, Any]:
    """The keyword arguments of each block's ``grouped_query_attention`` in ``model``."""
    return {
        "num_heads": cfg["n_heads"],
        "num_kv_groups": cfg["n_kv_groups"],
        "rope_base": cfg["rope_base"],
        "rope_freq": cfg["rope_freq"] if "rope_freq" in MODELS[model].keys else None,
        "norm_eps": norm_eps(cfg, model),
    }


def norm_eps(cfg: Mapping[str, Any], model: str) -> float:
    """The eps of every RMSNorm of ``model``: ``cfg["rms_norm_eps"]``, or the book's."""
    return cfg.get("rms_norm_eps", MODELS[model].eps)


def norm_math(cfg: Mapping[str, Any], model: str, rms_norm: Callable[..., Any]) -> gpt_spec.Math:
    """``model``'s RMSNorm as a part's math for ``gpt_spec.block_parts``: ``(its weights, x)`` ->
    ``rms_norm`` of x with the weight ``MODELS[model].norms[0]`` and the cfg's ``norm_eps``."""
    weight, eps = MODELS[model].norms[0], norm_eps(cfg, model)
    return lambda params, x: rms_norm(x, weight=params[weight], eps=eps)


def apply_decoder(
    model: str, params: Mapping[str, Any], x: Any, cfg: Mapping[str, Any], *,
    attention: Callable[..., Any], rms_norm: Callable[..., Any], feed_forward: gpt_spec.Math,
    linear: Callable[..., Any],
) -> tuple[Any, Any]:  # fmt: skip
    """``model``'s full causal pass after the token embeddings ``x`` (B, T, D), in NumPy or JAX:
    ``gpt_spec.apply_layers`` with each block ``attention`` (``grouped_query_attention``) between
    its RMSNorms (``norm_math``) and ``feed_forward`` (the SwiGLU), no dropout. Returns
    ``(logits (B, T, V), steps)``."""
    norm = norm_math(cfg, model, rms_norm)
    arguments = attention_arguments(cfg, model)

    def block(index: int, weights: Mapping[str, Any]) -> Callable[[Any], Any]:
        def att(h: Any) -> Any:
            return attention(gpt_spec.sub_params(weights, "att."), h, **arguments)[0]

        parts = gpt_spec.block_parts(weights, norm=norm, feed_forward=feed_forward)
        return functools.partial(gpt_spec.apply_block, **parts, att=att, drop_shortcut=lambda h: h)

    return gpt_spec.apply_layers(params, x, cfg["n_layers"], block=block, norm=norm, linear=linear)


def uses_qk_norm(cfg: Mapping[str, Any], model: str) -> bool:
    return "qk_norm" in MODELS[model].keys and bool(cfg["qk_norm"])


def gqa_shapes(
    d_in: int, num_heads: int, num_kv_groups: int, head_size: int, qk_norm: bool, norm_weight: str = "scale"
) -> dict[str, tuple[int, ...]]:
    """A ``GroupedQueryAttention``'s weights (``att.`` in a block), in torch's order."""
    shapes = {
        "W_query.weight": (num_heads * head_size, d_in),
        "W_key.weight": (num_kv_groups * head_size, d_in),
        "W_value.weight": (num_kv_groups * head_size, d_in),
        "out_proj.weight": (d_in, num_heads * head_size),
    }
    norms = {f"q_norm.{norm_weight}": (head_size,), f"k_norm.{norm_weight}": (head_size,)}
    return shapes | norms if qk_norm else shapes


def swiglu_shapes(emb_dim: int, hidden_dim: int) -> dict[str, tuple[int, ...]]:
    """A ``SwiGLUFeedForward``'s weights (``ff.`` in a block)."""
    return {
        "fc1.weight": (hidden_dim, emb_dim),
        "fc2.weight": (hidden_dim, emb_dim),
        "fc3.weight": (emb_dim, hidden_dim),
    }


def block_shapes(cfg: Mapping[str, Any], model: str) -> dict[str, tuple[int, ...]]:
    """A ``DecoderBlock``'s weights (``trf_blocks.{i}.`` in the model), in torch's order."""
    emb, weight = cfg["emb_dim"], MODELS[model].norms[0]
    attention = gqa_shapes(
        emb, cfg["n_heads"], cfg["n_kv_groups"], head_dim(cfg, model), uses_qk_norm(cfg, model), weight
    )
    return (
        {f"att.{name}": shape for name, shape in attention.items()}
        | {f"ff.{name}": shape for name, shape in swiglu_shapes(emb, cfg["hidden_dim"]).items()}
        | {f"norm1.{weight}": (emb,), f"norm2.{weight}": (emb,)}
    )


def decoder_param_shapes(cfg: Mapping[str, Any], model: str) -> Shapes:
    """Every weight of torch_ref's ``model(cfg)``, any model of ``MODELS``: torch name -> shape, in
    torch's order."""
    row = MODELS[model]
    row.check_config(cfg)
    vocab, context, emb = cfg["vocab_size"], cfg["context_length"], cfg["emb_dim"]
    shapes = {"tok_emb.weight": (vocab, emb)} | ({"pos_emb.weight": (context, emb)} if row.positions else {})
    block = row.block_shapes(cfg)
    for index in range(cfg["n_layers"]):
        shapes |= {f"trf_blocks.{index}.{name}": shape for name, shape in block.items()}
    return shapes | {f"final_norm.{norm}": (emb,) for norm in row.norms} | {"out_head.weight": (vocab, emb)}


def gpt_param_shapes(config: Mapping[str, Any]) -> Shapes:
    """Every weight of ``GPTModel(config)``: torch name -> shape, in torch's order."""
    return decoder_param_shapes(config, "GPTModel")


def decoder_param_count(cfg: Mapping[str, Any], model: str) -> int:
    """How many weights ``model(cfg)`` holds, counted from one block's (every block is alike)."""
    one_block = decoder_param_shapes({**cfg, "n_layers": 1}, model)
    block = sum(math.prod(shape) for shape in MODELS[model].block_shapes(cfg).values())
    return sum(math.prod(shape) for shape in one_block.values()) + (cfg["n_layers"] - 1) * block


def without_buffers(model: str, params: Any, cfg: Any) -> dict[str, Any]:
    """The weights of torch_ref ``model(cfg)``'s ``state_dict()`` as it is, after ``cfg``'s checks: its
    buffers (the GPT's masks, RoPE's tables) left out, every other key kept for the checks to name."""
    MODELS[model].check_config(cfg)
    checks.check_mapping(params)
    buffers = {name.format(i=i) for name in MODELS[model].buffers for i in range(cfg["n_layers"])}
    return {name: value for name, value in params.items() if name not in buffers}


def cache_shape(cfg: Mapping[str, Any], model: str, batch: int) -> tuple[int, int, int, int]:
    """The keys' shape ``(B, heads, context_length, H)`` of each block's KV cache in ``model``: the
    GPT's heads, a decoder's key/value heads alone (``n_kv_groups``)."""
    return (batch, cfg[MODELS[model].cache_heads], cfg["context_length"], head_dim(cfg, model))


def rope_frequencies(
    head_size: int, rope_base: float, rope_freq: Mapping[str, Any] | None = None
) -> np.ndarray:
    """RoPE's ``inv_freq`` ``(H/2,)``, float32: ``rope_base ** (-2i / H)``, with Llama 3's scaling
    (``rope_freq``: frequencies of wavelength ``2 pi / f`` above ``original_context_length /
    low_freq_factor`` divided by ``factor``, below ``original_context_length / high_freq_factor``
    kept, between interpolated). A function of the sizes (static under ``jax.jit``), computed in
    float64 and kept in float32 as the book and transformers keep it: the same in every framework."""
    inv_freq = 1.0 / float(rope_base) ** (np.arange(0, head_size, 2, dtype=np.float64) / head_size)  # (H/2,)
    if rope_freq is not None:
        factor, context = float(rope_freq["factor"]), float(rope_freq["original_context_length"])
        low, high = float(rope_freq["low_freq_factor"]), float(rope_freq["high_freq_factor"])
        wavelength = 2 * np.pi / inv_freq
        smooth = (context / wavelength - low) / (high - low)
        smoothed = (1 - smooth) * inv_freq / factor + smooth * inv_freq
        scaled = np.where(wavelength > context / low, inv_freq / factor, smoothed)
        inv_freq = np.where(wavelength < context / high, inv_freq, scaled)
    return inv_freq.astype(np.float32)
