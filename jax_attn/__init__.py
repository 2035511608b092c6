"""jax_attn: the math of numpy_attn in JAX, and Flax NNX modules built on it.

The functions have exactly the names, arguments, validation, error messages and step traces of
numpy_attn (see its docstring for the axis letters B, T, S, N, H, D, E and the weights format);
randomness comes from a ``jax.random`` key (``key=``) instead of a NumPy generator. They work
under ``jax.jit`` (mark ``num_heads``, ``context_length``/``context_size``, the dropout
probabilities, ``implementation``, ``block_size`` and ``return_steps`` static), ``jax.grad``
and ``jax.vmap``. ``implementation="blockwise"`` is the O(T)-memory path (online softmax over
key blocks, hidden causal blocks skipped with ``lax.switch``; the multi-head layers project
each head inside the loop over heads); ``"auto"`` uses it for long sequences. Masks are
boolean with True = hidden (the notes' meaning, the opposite of ``jax.nn.dot_product_attention``).

Eager calls of the layer functions run the program ``jax.jit`` compiles for them
(``jax_attn.compiled``): eager and jitted results are bit-identical.

Precision: on GPUs and TPUs JAX's default float32 matmuls may use TF32/bfloat16 passes, which
differ from float32 at about 1e-3. Parity checks run under
``jax.default_matmul_precision("float32")``; do the same when comparing with torch.
"""

try:  # the framework comes with an extra: name it rather than fail deep inside an import
    import flax  # noqa: F401
    import jax  # noqa: F401
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f"jax_attn needs {error.name}, which is not installed: pip install 'attn-parity[jax]'",
        name=error.name,
    ) from error

from jax_attn.attend import attend, attend_heads
from jax_attn.attention import scaled_dot_product_attention
from jax_attn.blockwise import blockwise_attention, blockwise_self_attention
from jax_attn.causal import causal_attention, multi_head_attention_wrapper
from jax_attn.dropout import dropout
from jax_attn.fused import fused_causal_attention, fused_multi_head_attention, fused_single_head_attention
from jax_attn.gpt import GPTModel, feed_forward, gelu, gpt_model, layer_norm, transformer_block
from jax_attn.gpt_generate import generate, gpt_model_decode, init_gpt_cache
from jax_attn.heads import merge_heads, split_heads
from jax_attn.kv_cache import (
    KVCache,
    fused_causal_attention_decode,
    init_kv_cache,
    multi_head_attention_decode,
)
from jax_attn.linear import linear, qkv_projections, qkv_weights, split_projection
from jax_attn.masks import causal_mask
from jax_attn.modules import (
    CausalAttention,
    FusedCausalAttention,
    FusedMultiHeadAttention,
    FusedSingleHeadAttention,
    MultiHeadAttention,
    MultiHeadAttentionWrapper,
    SelfAttentionV1,
    SelfAttentionV2,
)
from jax_attn.multi_head import multi_head_attention
from jax_attn.self_attention import self_attention_v1, self_attention_v2
from jax_attn.simplified import simplified_self_attention
from jax_attn.softmax import softmax, softmax_naive
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import fuses_projections

__all__ = [
    "AttnDropout",
    "CausalAttention",
    "ComputePath",
    "FusedCausalAttention",
    "FusedMultiHeadAttention",
    "FusedSingleHeadAttention",
    "GPTModel",
    "KVCache",
    "Masking",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "attend",
    "attend_heads",
    "blockwise_attention",
    "blockwise_self_attention",
    "causal_attention",
    "causal_mask",
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
    "init_gpt_cache",
    "init_kv_cache",
    "layer_norm",
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
    "transformer_block",
]
