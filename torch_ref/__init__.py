"""torch_ref: the notes' PyTorch classes, faithful to the notes; the project's oracle.

The classes keep the notes' constructors, parameter names and forward computation. What they
gain: every ``forward`` takes ``return_steps=False`` (True returns ``(output, steps)``, the step
trace documented in ``numpy_attn.steps``) and, where the class has dropout, keep-mask keywords
(``attn_keep_mask``, ``out_keep_mask``: bool, True = keep) that replace dropout's random draw so
training-mode runs can be reproduced in other frameworks. ``to_params``/``load_params`` convert
to and from the project's weights format.
"""

try:  # the framework comes with an extra: name it rather than fail deep inside an import
    import torch  # noqa: F401
except ModuleNotFoundError as error:
    raise ModuleNotFoundError(
        f'torch_ref needs {error.name}, which is not installed: pip install ".[torch]" '
        "(from the clone's folder)",
        name=error.name,
    ) from error

from torch_ref.causal import CausalAttention, MultiHeadAttentionWrapper
from torch_ref.decoders import (
    DecoderBlock,
    GroupedQueryAttention,
    Llama3Model,
    Qwen3Model,
    RMSNorm,
    SwiGLUFeedForward,
)
from torch_ref.fused import FusedCausalAttention, FusedMultiHeadAttention, FusedSingleHeadAttention
from torch_ref.gpt import GELU, FeedForward, GPTModel, LayerNorm, TransformerBlock
from torch_ref.multi_head import MultiHeadAttention
from torch_ref.params import from_numpy, load_params, to_numpy, to_params
from torch_ref.rope import apply_rope, compute_rope_params
from torch_ref.self_attention import SelfAttentionV1, SelfAttentionV2
from torch_ref.simplified import simplified_self_attention, softmax_naive

__all__ = [
    "GELU",
    "CausalAttention",
    "DecoderBlock",
    "FeedForward",
    "FusedCausalAttention",
    "FusedMultiHeadAttention",
    "FusedSingleHeadAttention",
    "GPTModel",
    "GroupedQueryAttention",
    "LayerNorm",
    "Llama3Model",
    "MultiHeadAttention",
    "MultiHeadAttentionWrapper",
    "Qwen3Model",
    "RMSNorm",
    "SelfAttentionV1",
    "SelfAttentionV2",
    "SwiGLUFeedForward",
    "TransformerBlock",
    "apply_rope",
    "compute_rope_params",
    "from_numpy",
    "load_params",
    "simplified_self_attention",
    "softmax_naive",
    "to_numpy",
    "to_params",
]
