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
        f'jax_attn needs {error.name}, which is not installed: pip install ".[jax]" '
        "(from the clone's folder)",
        name=error.name,
    ) from error

import jax.numpy as jnp

from jax_attn import generation, ops
from jax_attn.decoder_module import Llama3Model, Qwen3Model, from_hf
from jax_attn.fast import blockwise
from jax_attn.framework import JaxFramework
from jax_attn.gpt_module import GPTModel
from jax_attn.kv_cache import KVCache
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
from numpy_attn import __version__ as __version__  # one version for both packages
from numpy_attn import api
from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, fuses_projections

FRAMEWORK = JaxFramework(ops=ops, blockwise=blockwise, xp=jnp, kv_cache=KVCache)
# every layer, block and GPT function (numpy_attn.api); generate takes a GPTModel here
globals().update(api.export(FRAMEWORK, "jax_attn", checks={"generate": generation.check_generate}))

__all__ = [
    *api.NAMES,
    "AttnDropout",
    "ComputePath",
    "KVCache",
    "Masking",
    "fuses_projections",
    # the Flax NNX modules: the notes' classes, named as the torch ones, and the book's GPT
    "SelfAttentionV1",
    "SelfAttentionV2",
    "CausalAttention",
    "MultiHeadAttentionWrapper",
    "MultiHeadAttention",
    "FusedSingleHeadAttention",
    "FusedMultiHeadAttention",
    "FusedCausalAttention",
    "GPTModel",
    # the book's Llama 3 and Qwen3, and any of the three models from a Hugging Face folder
    "Llama3Model",
    "Qwen3Model",
    "from_hf",
]
