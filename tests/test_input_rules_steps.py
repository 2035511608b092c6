"""``return_steps`` is a bool in every public function that takes it, the same TypeError in
numpy_attn, jax_attn eager and under ``jax.jit`` (where it is a static Python value): before,
``return_steps="no"`` returned the steps (a truthy string) and ``None`` left them out."""

import functools
import re

import jax
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn.gpt_spec import block_shapes
from parity_tests.cases import FUNCTION_NAMES, Case
from torch_ref import to_params

PACKAGES = {"numpy": numpy_attn, "jax": jax_attn, "jit": jax_attn}
BAD_FLAGS = [("no", "'no' (str)"), (None, "None (NoneType)"), (1, "1 (int)"), ([True], "[True] (list)")]
CONFIG = {"vocab_size": 16, "context_length": 8, "emb_dim": 4, "n_heads": 2, "n_layers": 1,
          "drop_rate": 0.0, "qkv_bias": False}  # fmt: skip


def raises_exactly(message):
    """The TypeError ``message``, and no more: a note may follow where jit traced the call (JAX's
    "For simplicity, JAX has removed its internal frames" note, which pytest matches too)."""
    return pytest.raises(TypeError, match=f"^{re.escape(message)}(\n|$)")


def _weights(shapes, rng):
    return {name: (rng.standard_normal(shape) * 0.1).astype(np.float32) for name, shape in shapes.items()}


def _building_block_call(name):
    """``(arrays, others, kwargs)`` of a call of the function ``name``: ``arrays`` are traced
    under jit, ``others`` (positional) and ``kwargs`` are closed over."""
    rng = np.random.default_rng(28)
    q, k, v = (rng.standard_normal((2, 3, 4)).astype(np.float32) for _ in range(3))
    x = rng.standard_normal((2, 3, 4)).astype(np.float32)
    if name == "simplified_self_attention":
        return (x[0],), (), {}
    if name in ("scaled_dot_product_attention", "attend"):
        return (q, k, v), (), {}
    if name == "attend_heads":
        return (x, (rng.standard_normal((12, 4)).astype(np.float32), None)), (2,), {}
    if name == "transformer_block":
        return (_weights(block_shapes(4, False), rng), x), (), {"num_heads": 2, "context_length": 8}
    ids = rng.integers(0, CONFIG["vocab_size"], (2, 3))
    return (_weights(numpy_attn.gpt_param_shapes(CONFIG), rng), ids), (CONFIG,), {}


def call_layer(path, layer, return_steps):
    case = Case(layer, d_in=4, d_out=4, num_heads=2, bias=True)
    params, x = to_params(case.build_torch()), case.make_input()
    fn = getattr(PACKAGES[path], case.function_name)
    kwargs = case.kwargs() | {"return_steps": return_steps}
    if path == "jit":
        return jax.jit(functools.partial(fn, **kwargs))(params, x)
    return fn(params, x, **kwargs)


def call_building_block(path, name, return_steps):
    arrays, others, kwargs = _building_block_call(name)
    fn = getattr(PACKAGES[path], name)
    kwargs |= {"return_steps": return_steps}
    if path == "jit":
        return jax.jit(lambda *traced: fn(*traced, *others, **kwargs))(*arrays)
    return fn(*arrays, *others, **kwargs)


BUILDING_BLOCKS = [
    "simplified_self_attention",
    "scaled_dot_product_attention",
    "attend",
    "attend_heads",
    "transformer_block",
    "gpt_model",
]


@pytest.mark.parametrize("bad, given", BAD_FLAGS, ids=[repr(flag) for flag, _ in BAD_FLAGS])
@pytest.mark.parametrize("layer", list(FUNCTION_NAMES))
@pytest.mark.parametrize("path", list(PACKAGES))
def test_a_layer_refuses_a_return_steps_that_is_not_a_bool(path, layer, bad, given):
    with raises_exactly(f"return_steps must be a bool, got {given}"):
        call_layer(path, layer, bad)


@pytest.mark.parametrize("bad, given", BAD_FLAGS, ids=[repr(flag) for flag, _ in BAD_FLAGS])
@pytest.mark.parametrize("name", BUILDING_BLOCKS)
@pytest.mark.parametrize("path", list(PACKAGES))
def test_the_other_functions_refuse_a_return_steps_that_is_not_a_bool(path, name, bad, given):
    with raises_exactly(f"return_steps must be a bool, got {given}"):
        call_building_block(path, name, bad)


@pytest.mark.parametrize("path", list(PACKAGES))
def test_numpy_bools_are_bools(path):
    """``np.True_`` (a comparison's result) gives the steps, ``np.False_`` leaves them out."""
    output, steps = call_layer(path, "MultiHeadAttention", np.True_)
    assert "context_vec" in steps
    assert call_layer(path, "MultiHeadAttention", np.False_).shape == output.shape
    output, steps = call_building_block(path, "gpt_model", np.True_)
    assert call_building_block(path, "gpt_model", np.False_).shape == output.shape


def test_an_unhashable_static_argument_gets_the_layers_error_in_jax_attn():
    """jit's own "Non-hashable static arguments" ValueError before: eager calls with one now
    run op by op, where the layer's check names the value, as numpy_attn's does."""
    case = Case("MultiHeadAttention", d_in=4, d_out=4, num_heads=2, bias=True)
    params, x = to_params(case.build_torch()), case.make_input()
    message = "num_heads must be a positive int, got [2] (list)"
    for package in (numpy_attn, jax_attn):
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            package.multi_head_attention(params, x, **case.kwargs() | {"num_heads": [2]})
