"""numpy_attn: the attention classes of the notes as pure NumPy functions.

The readable definition of the math; NumPy is its only dependency (``safetensors`` reads and
writes its weight files).

Axis letters, in every docstring and shape comment:
    B batch, T query tokens, S key tokens (S = T in self-attention), N heads, H head size,
    D input width (``d_in``, ``hidden_size``), E projection width (``d_out`` = N * H).

Layer functions take ``(params, x, *, <constructor arguments the weights cannot tell>,
implementation="reference", block_size=512, return_steps=False)``. ``params`` is the project's one
weights format: a plain dict of arrays keyed by the torch class's ``state_dict`` names, in torch's
layout (``numpy_attn.spec``). Masks are boolean with True = hidden (the notes' meaning); dropout
keep-masks have True = keep. A query whose every key is hidden gets zero attention weights (the
notes' classes give NaN). Dropout happens only with an ``rng`` (``numpy.random.Generator``) or a
keep-mask. ``implementation``: ``"reference"`` (the notes' math), ``"blockwise"`` (O(T) memory,
``numpy_attn.fast``) or ``"auto"`` (blockwise for long sequences).

How it is built: each module of math (``multi_head.py``, ``ops.py``...) trusts its arguments and
returns ``(output, steps)``; this package exports it behind the door (``numpy_attn.door``), which
checks each call once against the layer's spec, chooses the path and returns the output, or
``(output, steps)`` with ``return_steps=True``.
"""

import numpy as np

from numpy_attn import cache_checks, calls, door, gpt_checks, ops
from numpy_attn import causal as _causal
from numpy_attn import fused as _fused
from numpy_attn import generation as _generation
from numpy_attn import gpt as _gpt
from numpy_attn import kv_cache as _kv_cache
from numpy_attn import multi_head as _multi_head
from numpy_attn import self_attention as _self_attention
from numpy_attn import simplified as _simplified
from numpy_attn.door import check_layer
from numpy_attn.fast import attend as _attend
from numpy_attn.fast import blockwise as _blockwise
from numpy_attn.fast import projections as _projections
from numpy_attn.fast.options import IMPLEMENTATIONS, AttnDropout, ComputePath, Masking, fuses_projections
from numpy_attn.fast.threads import parallel_heads
from numpy_attn.gpt_spec import gpt_param_shapes
from numpy_attn.hf_gpt2 import load_hf_gpt2, save_hf_gpt2
from numpy_attn.kv_cache import KVCache
from numpy_attn.spec import LAYERS, SPECS, constructor_arguments, parameter_names, parameter_shapes
from numpy_attn.steps import STEP_DOCS, Steps
from numpy_attn.weights_file import load_weights, save_weights

FRAMEWORK = door.Framework(ops=ops, blockwise=_blockwise, xp=np, kv_cache=KVCache)


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
gpt_model = door.block(_gpt.gpt_model, gpt_checks.gpt_model, FRAMEWORK, steps=True)
init_gpt_cache = door.block(_gpt.init_gpt_cache, gpt_checks.init_gpt_cache, FRAMEWORK)
gpt_model_decode = door.block(_gpt.gpt_model_decode, gpt_checks.gpt_model_decode, FRAMEWORK)
generate = door.block(_generation.generate, gpt_checks.generate, FRAMEWORK)


def check_gpt_params(params, config):  # noqa: ANN001, ANN201
    """One ValueError naming every missing, unexpected and mis-shaped weight of ``GPTModel(config)``,
    then one floating dtype for all (TypeError), then finite values."""
    gpt_checks.check_gpt_params(FRAMEWORK, params, config)


__all__ = [
    "transformer_block",
    "save_weights",
    "save_hf_gpt2",
    "load_weights",
    "load_hf_gpt2",
    "layer_norm",
    "init_gpt_cache",
    "gpt_param_shapes",
    "gpt_model_decode",
    "gpt_model",
    "generate",
    "gelu",
    "feed_forward",
    "IMPLEMENTATIONS",
    "LAYERS",
    "SPECS",
    "STEP_DOCS",
    "AttnDropout",
    "ComputePath",
    "KVCache",
    "Masking",
    "Steps",
    "attend",
    "attend_heads",
    "blockwise_attention",
    "blockwise_self_attention",
    "causal_attention",
    "causal_mask",
    "check_gpt_params",
    "check_layer",
    "constructor_arguments",
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
    "parallel_heads",
    "parameter_names",
    "parameter_shapes",
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
