"""What the KV-cache functions of numpy_attn and jax_attn check at their door (``calls``' kin)."""

from __future__ import annotations

import functools
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from numpy_attn import checks, memory
from numpy_attn.decoder_spec import MODELS, cache_shape
from numpy_attn.door import check_layer_call
from numpy_attn.spec import SPECS

A = Mapping[str, Any]


def init_kv_cache(fw: Any, a: A) -> None:
    for name in ("batch", "num_heads", "max_length", "head_dim"):
        checks.check_size(name, a[name])
    shape = (a["batch"], a["num_heads"], a["max_length"], a["head_dim"])
    check_cache_memory(fw, shape, "batch, num_heads, max_length, head_dim", a["dtype"], blocks=1)


def check_cache_memory(fw: Any, shape: tuple[int, ...], axes: str, dtype: Any, blocks: int) -> None:
    """Keys of ``shape`` (B, N, L, H), named by ``axes``, an array may hold; ``dtype`` one the framework
    computes in; ``blocks`` caches of keys, values and padding that fit in its memory (ValueError
    naming the size otherwise)."""
    memory.check_array_size(f"the cache's keys ({axes})", shape)
    dtype = fw.check_dtype(dtype)
    batch, num_heads, length, head_dim = (int(size) for size in shape)
    nbytes = blocks * (2 * batch * num_heads * length * head_dim * np.dtype(dtype).itemsize + batch * length)
    memory.check_memory(f"{blocks} KV cache(s) of keys and values {tuple(shape)} in {np.dtype(dtype).name}",
                        nbytes, fw.memory_bytes())  # fmt: skip


def _layer_decode(layer: str, fw: Any, a: A) -> None:
    """A decode function's call: the layer's checks, then its ``cache`` (its heads of the width of the
    output projection's input) with room for x's tokens within the layer's context."""
    spec = SPECS[layer]
    check_layer_call(spec, fw, a)
    x, cache, num_heads = a["x"], a["cache"], a["num_heads"]
    check_kv_cache(fw, cache, x, num_heads, a["params"][f"{spec.out}.weight"].shape[1] // num_heads)
    check_decode_room(fw.cache_length(cache), cache.keys.shape[-2], x.shape, a[spec.context], spec.context)


multi_head_attention_decode = functools.partial(_layer_decode, "MultiHeadAttention")
fused_causal_attention_decode = functools.partial(_layer_decode, "FusedCausalAttention")


def check_kv_cache(fw: Any, cache: Any, x: Any, num_heads: int, head_dim: int, name: str = "cache",
                   x_name: str = "x") -> None:  # fmt: skip
    """A decode function's ``cache``: its own package's ``KVCache`` (TypeError naming both
    otherwise), keys and values ``(B, N, L, H)`` and padding ``(B, L)`` for x's batch, ``num_heads``
    and ``head_dim`` (ValueError), of x's dtype, a bool padding and an integer ``length`` (TypeError)."""
    package = fw.package
    if type(cache) is not fw.kv_cache or not all(
        isinstance(field, fw.array_types) for field in (cache.keys, cache.values, cache.padding)
    ):
        given = type(cache)
        raise TypeError(
            f"{name} must be the KVCache of {package}.init_kv_cache(...), "
            f"got {given.__module__}.{given.__qualname__}"
        )
    batch = x.shape[0]
    for field in ("keys", "values"):
        shape = tuple(getattr(cache, field).shape)
        if len(shape) != 4 or shape[:2] != (batch, num_heads) or shape[3] != head_dim:
            raise ValueError(
                f"{name}.{field} has shape {shape}, but {x_name} of shape {tuple(x.shape)} with "
                f"num_heads={num_heads} needs (B, N, L, H) = ({batch}, {num_heads}, L, {head_dim})"
            )
    expected = (batch, cache.keys.shape[2])
    if tuple(cache.padding.shape) != expected or tuple(cache.values.shape) != tuple(cache.keys.shape):
        raise ValueError(
            f"{name}.padding has shape {tuple(cache.padding.shape)} and {name}.values "
            f"{tuple(cache.values.shape)}, but {name}.keys {tuple(cache.keys.shape)} needs "
            f"{expected} and {tuple(cache.keys.shape)}"
        )
    for field in ("keys", "values"):
        stored = getattr(cache, field)
        checks.check_native_byte_order(f"{name}.{field}", stored)
        if np.dtype(stored.dtype) != np.dtype(x.dtype):
            raise TypeError(
                f"{name} has dtype {np.dtype(stored.dtype).name} "
                f"but {x_name} has dtype {np.dtype(x.dtype).name}"
            )
    if np.dtype(cache.padding.dtype) != np.bool_:
        raise TypeError(
            f"{name}.padding must be bool (True = padding), got {np.dtype(cache.padding.dtype).name}"
        )
    if not checks.is_int_scalar(cache.length, fw.array_types):
        raise TypeError(
            f"{name}.length must be an int or a 0-d integer array (the tokens cached so far), "
            f"got {cache.length!r} ({type(cache.length).__name__})"
        )


def check_group_cache(fw: Any, cache: Any, x: Any, num_kv_groups: int, size: int, name: str = "cache",
                      x_name: str = "x") -> None:  # fmt: skip
    """A grouped KV cache: ``check_kv_cache`` with G = ``num_kv_groups`` key/value heads in place of N
    (ValueError naming G where the cache holds the query heads)."""
    shape = tuple(getattr(getattr(cache, "keys", None), "shape", ()))
    if isinstance(cache, fw.kv_cache) and (len(shape) != 4 or shape[1] != num_kv_groups):
        raise ValueError(
            f"{name}.keys has shape {shape}, but a grouped cache holds the key/value heads: (B, G, L, H) "
            f"with G = n_kv_groups = {num_kv_groups} (init_decoder_cache(cfg, batch))"
        )
    check_kv_cache(fw, cache, x, num_kv_groups, size, name, x_name)


def check_block_caches(fw: Any, a: A, kind: str) -> None:
    """The ``caches`` of a call ``a`` of the model ``kind`` (its config, token ids and weights): a tuple
    or list (TypeError, naming its ``init_cache``) of one cache per block (ValueError), each checked
    as a decode function checks its own (``check_group_cache`` for a decoder's key/value heads)
    against the blocks' input ``(B, t, emb_dim)``, all holding as many tokens, with room for t more."""
    model = MODELS[kind]
    cfg, caches = a[model.config_name], a["caches"]
    if isinstance(caches, fw.kv_cache) or not isinstance(caches, tuple | list):
        raise TypeError(
            f"caches must be a tuple of KVCache, one per block ({model.init_cache}({model.config_name}, "
            f"batch)), got {type(caches).__name__}"
        )
    if len(caches) != cfg["n_layers"]:
        raise ValueError(
            f"caches has {len(caches)} KVCache, but {model.config_name}['n_layers'] = {cfg['n_layers']} "
            "blocks need one each"
        )
    dtype = a["params"]["tok_emb.weight"].dtype
    x = np.broadcast_to(np.zeros((), dtype), (*a["token_ids"].shape, cfg["emb_dim"]))  # (B, t, D)
    _, heads, _, size = cache_shape(cfg, kind, 0)
    check = check_kv_cache if model.cache_heads == "n_heads" else check_group_cache
    for index, cache in enumerate(caches):
        check(fw, cache, x, heads, size, f"caches[{index}]", "the blocks' input")
    lengths = [fw.cache_length(cache) for cache in caches]
    if len({length for length in lengths if length is not None}) > 1:
        raise ValueError(f"the caches hold {lengths} tokens: every block's cache must hold the same tokens")
    for index, (cache, length) in enumerate(zip(caches, lengths, strict=True)):
        check_decode_room(
            length, cache.keys.shape[2], x.shape, cfg["context_length"], name=f"caches[{index}]"
        )


def check_decode_room(length: int | None, max_length: int, shape: Sequence[int], context_length: int,
                      context_name: str = "context_length", name: str = "cache") -> None:  # fmt: skip
    """Room for the t = ``shape[-2]`` new tokens in a cache of ``max_length`` holding ``length``
    (None where traced: the caller keeps within it), and within the layer's ``context_length``."""
    if length is None:
        return
    if not 0 <= length <= max_length:
        raise ValueError(f"{name}.length is {length}, outside [0, {max_length}]: not a cache's length")
    if length + shape[-2] > max_length:
        raise ValueError(f"{name} holds {length} of {max_length} tokens; {shape[-2]} more do not fit")
    checks.check_context_length(shape, context_length, context_name, cached=length)
