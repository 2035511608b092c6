"""Unhashable static arguments of jax_attn's layer functions: the layer's own error."""

import re

import pytest

import jax_attn
import numpy_attn
from parity_tests.cases import Case
from torch_ref import to_params


def test_an_unhashable_static_argument_gets_the_layers_error_in_jax_attn():
    """jit's own "Non-hashable static arguments" ValueError before: eager calls with one now
    run op by op, where the layer's check names the value, as numpy_attn's does."""
    case = Case("MultiHeadAttention", d_in=4, d_out=4, num_heads=2, bias=True)
    params, x = to_params(case.build_torch()), case.make_input()
    message = "num_heads must be a positive int, got [2] (list)"
    for package in (numpy_attn, jax_attn):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            package.multi_head_attention(params, x, **case.kwargs() | {"num_heads": [2]})
