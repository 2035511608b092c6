"""numpy_attn: the attention classes of the notes as pure NumPy functions.

This package is the readable definition of the math; it imports NumPy and nothing else.

Axis letters, used in every docstring and shape comment:
    B batch, T query tokens, S key tokens (S = T in self-attention), N heads, H head size,
    D input width (``d_in``, ``hidden_size``), E projection width (``d_out`` = N * H).

Layer functions take ``(params, x, *, <constructor arguments the weights cannot tell>,
return_steps=False)``. ``params`` is the project's one weights format: a plain dict of arrays
keyed by the torch class's ``state_dict`` names, in torch's layout (see ``numpy_attn.spec``).
Masks are boolean with True = hidden (the notes' meaning); dropout keep-masks have True = keep.
A query whose every key is hidden gets zero attention weights (the notes' classes give NaN).
Dropout happens only when an ``rng`` (``numpy.random.Generator``) or a keep-mask is passed.
Every layer takes ``implementation="reference" | "blockwise" | "auto"``: the readable
transcription of the notes, or the O(T)-memory blockwise path (online softmax, hidden causal
blocks skipped; the multi-head layers project one head at a time), or blockwise for long
sequences only; ``numpy_attn.implementation`` holds these rules for numpy_attn and jax_attn.
Within ``parallel_heads`` the blockwise path runs its heads on threads (``numpy_attn.threads``).

Each layer is defined once, framework-neutrally, in ``numpy_attn.spec.SPECS`` (weights, the
constructor's arguments, buffers, steps); checks, ``constructor_arguments`` and the parity
harness derive from it.
"""

from numpy_attn.attend import attend, attend_heads
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.attention import scaled_dot_product_attention
from numpy_attn.blockwise import blockwise_attention, blockwise_self_attention
from numpy_attn.causal import causal_attention, multi_head_attention_wrapper
from numpy_attn.dropout import dropout
from numpy_attn.fused import (
    fused_causal_attention,
    fused_multi_head_attention,
    fused_single_head_attention,
)
from numpy_attn.gpt import feed_forward, gelu, gpt_model, layer_norm, transformer_block
from numpy_attn.gpt_generate import generate, gpt_model_decode, init_gpt_cache
from numpy_attn.gpt_spec import check_gpt_params, gpt_param_shapes
from numpy_attn.heads import merge_heads, split_heads
from numpy_attn.hf_gpt2 import load_hf_gpt2, save_hf_gpt2
from numpy_attn.implementation import IMPLEMENTATIONS, fuses_projections
from numpy_attn.kv_cache import (
    KVCache,
    fused_causal_attention_decode,
    init_kv_cache,
    multi_head_attention_decode,
)
from numpy_attn.linear import linear, qkv_projections, qkv_weights, split_projection
from numpy_attn.masks import causal_mask
from numpy_attn.multi_head import multi_head_attention
from numpy_attn.self_attention import self_attention_v1, self_attention_v2
from numpy_attn.simplified import simplified_self_attention
from numpy_attn.softmax import softmax, softmax_naive
from numpy_attn.spec import (
    LAYERS,
    SPECS,
    check_layer,
    constructor_arguments,
    parameter_names,
    parameter_shapes,
)
from numpy_attn.steps import STEP_DOCS, Steps
from numpy_attn.threads import parallel_heads
from numpy_attn.weights_file import load_weights, save_weights

__all__ = [
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
    "feed_forward",
    "fused_causal_attention",
    "fused_causal_attention_decode",
    "fused_multi_head_attention",
    "fused_single_head_attention",
    "fuses_projections",
    "gelu",
    "generate",
    "gpt_model",
    "gpt_model_decode",
    "gpt_param_shapes",
    "init_gpt_cache",
    "init_kv_cache",
    "layer_norm",
    "linear",
    "load_hf_gpt2",
    "load_weights",
    "merge_heads",
    "multi_head_attention",
    "multi_head_attention_decode",
    "multi_head_attention_wrapper",
    "parallel_heads",
    "parameter_names",
    "parameter_shapes",
    "qkv_projections",
    "qkv_weights",
    "save_hf_gpt2",
    "save_weights",
    "scaled_dot_product_attention",
    "self_attention_v1",
    "self_attention_v2",
    "simplified_self_attention",
    "softmax",
    "softmax_naive",
    "split_heads",
    "split_projection",
    "transformer_block",
]
