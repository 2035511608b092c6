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

__version__ = "0.2.0"  # pyproject.toml's; CHANGELOG.md says what changed

from numpy_attn import api, door, gpt_checks, ops
from numpy_attn.decoder_spec import decoder_param_shapes, gpt_param_shapes
from numpy_attn.door import check_layer
from numpy_attn.fast import blockwise
from numpy_attn.fast.options import IMPLEMENTATIONS, AttnDropout, ComputePath, Masking, fuses_projections
from numpy_attn.fast.threads import parallel_heads
from numpy_attn.hf_decoders import load_hf, save_hf
from numpy_attn.hf_gpt2 import load_hf_gpt2, save_hf_gpt2
from numpy_attn.kv_cache import KVCache
from numpy_attn.spec import LAYERS, SPECS, constructor_arguments, parameter_names, parameter_shapes
from numpy_attn.steps import STEP_DOCS, Steps
from numpy_attn.weights_file import load_weights, save_weights

FRAMEWORK = door.Framework(ops=ops, blockwise=blockwise, xp=np, kv_cache=KVCache)
globals().update(api.export(FRAMEWORK, "numpy_attn"))  # every layer, block, GPT and decoder function (api)


def check_gpt_params(params, config) -> None:
    """One ValueError naming every missing, unexpected and mis-shaped weight of ``GPTModel(config)``,
    then one floating dtype for all (TypeError), then finite values."""
    gpt_checks.check_model_params(FRAMEWORK, "GPTModel", params, config)


__all__ = [
    *api.NAMES,
    "IMPLEMENTATIONS",
    "LAYERS",
    "SPECS",
    "STEP_DOCS",
    "AttnDropout",
    "ComputePath",
    "KVCache",
    "Masking",
    "Steps",
    "check_gpt_params",
    "check_layer",
    "constructor_arguments",
    "decoder_param_shapes",
    "fuses_projections",
    "gpt_param_shapes",
    "load_hf",
    "load_hf_gpt2",
    "load_weights",
    "parallel_heads",
    "parameter_names",
    "parameter_shapes",
    "save_hf",
    "save_hf_gpt2",
    "save_weights",
]
