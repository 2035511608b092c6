"""jax_attn: the math of numpy_attn in JAX, and Flax NNX modules built on it.

The functions have the names, arguments, checks, error messages and step traces of numpy_attn
(see its docstring for the axis letters and the weights format); randomness comes from a
``jax.random`` key (``key=``) instead of a NumPy generator. They work under ``jax.jit`` (the layers'
sizes, rates, ``implementation``, ``block_size`` and ``return_steps`` are static), ``jax.grad`` and
``jax.vmap``. An eager layer call runs the program ``jax.jit`` compiles for it: eager and jitted
results are bit-identical. Masks are boolean with True = hidden (the notes' meaning, the opposite of
``jax.nn.dot_product_attention``).

Precision: on GPUs and TPUs JAX's default float32 matmuls may use TF32/bfloat16 passes, which
differ from float32 at about 1e-3; compare with torch under
``jax.default_matmul_precision("float32")``.
"""

try:  # the framework comes with an extra: name it rather than fail deep inside an import
    import flax  # noqa: F401
    import jax  # noqa: F401
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"jax_attn needs {error.name}, which is not installed: pip install 'attn-parity[jax]'", name=error.name
    ) from error

import jax.numpy as jnp

from jax_attn import causal as _causal
from jax_attn import fused as _fused
from jax_attn import generation as _generation
from jax_attn import gpt as _gpt
from jax_attn import kv_cache as _kv_cache
from jax_attn import multi_head as _multi_head
from jax_attn import ops
from jax_attn import self_attention as _self_attention
from jax_attn import simplified as _simplified
from jax_attn.fast import blockwise as _blockwise
from jax_attn.fast import projections as _projections
from jax_attn.framework import JaxFramework
from jax_attn.kv_cache import KVCache
from numpy_attn import cache_checks, calls, door, gpt_checks
from numpy_attn.fast import attend as _attend
from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, fuses_projections
from numpy_attn.spec import SPECS

FRAMEWORK = JaxFramework(ops=ops, blockwise=_blockwise, xp=jnp, kv_cache=KVCache)


def _layer(fn):
    return door.layer(SPECS[_LAYER_OF[fn.__name__]], FRAMEWORK, fn)


_LAYER_OF = {spec.function: name for name, spec in SPECS.items()}

# the notes' layers
self_attention_v1 = _layer(_self_attention.self_attention_v1)
self_attention_v2 = _layer(_self_attention.self_attention_v2)
causal_attention = _layer(_causal.causal_attention)
multi_head_attention_wrapper = _layer(_causal.multi_head_attention_wrapper)
multi_head_attention = _layer(_multi_head.multi_head_attention)
fused_single_head_attention = _layer(_fused.fused_single_head_attention)
fused_multi_head_attention = _layer(_fused.fused_multi_head_attention)
fused_causal_attention = _layer(_fused.fused_causal_attention)
simplified_self_attention = door.block(_simplified.simplified_self_attention, calls.simplified_self_attention,
                                       FRAMEWORK, steps=True)  # fmt: skip

# the building blocks
softmax = door.block(ops.softmax, calls.softmax, FRAMEWORK)
softmax_naive = door.block(ops.softmax_naive, calls.softmax_naive, FRAMEWORK)
causal_mask = door.block(ops.causal_mask, calls.causal_mask, FRAMEWORK)
dropout = door.block(ops.dropout, calls.dropout, FRAMEWORK)
linear = door.block(ops.linear, calls.linear, FRAMEWORK)
split_heads = door.block(ops.split_heads, calls.split_heads, FRAMEWORK)
merge_heads = door.block(ops.merge_heads, calls.merge_heads, FRAMEWORK)
scaled_dot_product_attention = door.block(
    ops.scaled_dot_product_attention, calls.scaled_dot_product_attention, FRAMEWORK, steps=True
)

# the fast paths
attend = door.block(_attend.attend, calls.attend, FRAMEWORK, framework_first=True)
attend_heads = door.block(_attend.attend_heads, calls.attend_heads, FRAMEWORK, framework_first=True)
blockwise_attention = door.block(_blockwise.blockwise_attention, calls.blockwise_attention, FRAMEWORK)
blockwise_self_attention = door.block(_blockwise.blockwise_self_attention, calls.blockwise_self_attention, FRAMEWORK)
qkv_projections = door.block(_projections.qkv_projections, calls.qkv_projections, FRAMEWORK)
qkv_weights = door.block(_projections.qkv_weights, calls.qkv_weights, FRAMEWORK)
split_projection = door.block(_projections.split_projection, calls.split_projection, FRAMEWORK)

# decoding with a KV cache
init_kv_cache = door.block(_kv_cache.init_kv_cache, cache_checks.init_kv_cache, FRAMEWORK)
multi_head_attention_decode = door.block(
    _kv_cache.multi_head_attention_decode, cache_checks.multi_head_attention_decode, FRAMEWORK
)
fused_causal_attention_decode = door.block(
    _kv_cache.fused_causal_attention_decode, cache_checks.fused_causal_attention_decode, FRAMEWORK
)

# the book's GPT (chapter 4)
layer_norm = door.block(_gpt.layer_norm, gpt_checks.layer_norm, FRAMEWORK)
gelu = door.block(_gpt.gelu, gpt_checks.gelu, FRAMEWORK)
feed_forward = door.block(_gpt.feed_forward, gpt_checks.feed_forward, FRAMEWORK)
transformer_block = door.block(_gpt.transformer_block, gpt_checks.transformer_block, FRAMEWORK, steps=True)
gpt_model = door.block(_gpt.gpt_model, gpt_checks.gpt_model, FRAMEWORK, steps=True, static=("config",))
init_gpt_cache = door.block(_gpt.init_gpt_cache, gpt_checks.init_gpt_cache, FRAMEWORK)
gpt_model_decode = door.block(_gpt.gpt_model_decode, gpt_checks.gpt_model_decode, FRAMEWORK)
generate = door.block(_generation.generate, _generation.check_generate, FRAMEWORK)

__all__ = [
    "transformer_block",
    "layer_norm",
    "init_gpt_cache",
    "gpt_model_decode",
    "gpt_model",
    "generate",
    "gelu",
    "feed_forward",
    "AttnDropout",
    "ComputePath",
    "KVCache",
    "Masking",
    "attend",
    "attend_heads",
    "blockwise_attention",
    "blockwise_self_attention",
    "causal_attention",
    "causal_mask",
    "dropout",
    "fused_causal_attention",
    "fused_causal_attention_decode",
    "fused_multi_head_attention",
    "fused_single_head_attention",
    "fuses_projections",
    "init_kv_cache",
    "linear",
    "merge_heads",
    "multi_head_attention",
    "multi_head_attention_decode",
    "multi_head_attention_wrapper",
    "qkv_projections",
    "qkv_weights",
    "scaled_dot_product_attention",
    "self_attention_v1",
    "self_attention_v2",
    "simplified_self_attention",
    "softmax",
    "softmax_naive",
    "split_heads",
    "split_projection",
]
