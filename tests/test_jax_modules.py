"""Flax NNX modules: the weights format both ways, split/merge, torch-like initialisation."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
import torch
from flax import nnx

import jax_attn
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.frameworks import jax_context
from torch_ref import load_params, to_params

LAYERS = list(FUNCTION_NAMES)


def module_case(layer, dtype="float32"):
    return Case(layer, batch=2, tokens=6, d_in=5, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=2)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layer", LAYERS)
def test_round_trip_torch_params_flax_params_torch_is_bit_identical(layer, dtype):
    case = module_case(layer, dtype)
    source = case.build_torch()
    params = to_params(source)
    with jax_context(dtype):
        flax_module = getattr(jax_attn, layer).from_params(params, **case.kwargs())
        back = flax_module.to_params()
    assert list(back) == list(params)  # torch's names, in torch's order
    for name in params:
        assert back[name].dtype == params[name].dtype
        np.testing.assert_array_equal(back[name], params[name])
    target = load_params(case.with_(seed=3).build_torch(), back)
    x = torch.from_numpy(case.make_input())
    assert torch.equal(target(x), source(x))


@pytest.mark.parametrize("layer", LAYERS)
def test_from_params_passes_every_argument_on(layer):
    """The implementation and block size reach the module (a bad one is refused at the call),
    and so do the constructor arguments that the weights cannot tell."""
    case = module_case(layer)
    params, x = to_params(case.build_torch()), case.make_input()
    build = getattr(jax_attn, layer).from_params
    module = build(params, **case.kwargs(0.25), implementation="blockwise", block_size=3)
    assert (module.implementation, module.block_size) == ("blockwise", 3)
    for name, value in case.kwargs(0.25).items():
        assert getattr(module, name) == value
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        build(params, **case.kwargs(), implementation="blockwise", block_size=0)(x)
    with pytest.raises(ValueError, match=r"implementation must be one of .*, got 'fast'"):
        build(params, **case.kwargs(), implementation="fast")(x)


@pytest.mark.parametrize("layer", LAYERS)
def test_kernels_are_in_flax_layout(layer):
    case = module_case(layer)
    params = to_params(case.build_torch())
    module = getattr(jax_attn, layer).from_params(params, **case.kwargs())
    if layer == "SelfAttentionV1":
        np.testing.assert_array_equal(module.W_query[...], params["W_query"])  # already (in, out)
    elif layer.startswith("Fused"):
        np.testing.assert_array_equal(module.Wqkv.kernel[...], params["Wqkv.weight"].T)
    elif layer == "MultiHeadAttentionWrapper":
        np.testing.assert_array_equal(module.heads[1].W_key.kernel[...], params["heads.1.W_key.weight"].T)
    else:
        np.testing.assert_array_equal(module.W_value.kernel[...], params["W_value.weight"].T)


@pytest.mark.parametrize("layer", LAYERS)
def test_split_merge_and_nnx_jit(layer):
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())
    x = case.make_input()
    graphdef, state = nnx.split(module)
    merged = nnx.merge(graphdef, state)
    np.testing.assert_array_equal(merged(x), module(x))
    np.testing.assert_allclose(nnx.jit(lambda m, x: m(x))(merged, x), module(x), rtol=1e-6, atol=1e-6)


def test_load_params_names_bad_keys_like_the_functions():
    case = module_case("MultiHeadAttention")
    params = to_params(case.build_torch())
    del params["out_proj.bias"]
    with pytest.raises(
        ValueError, match=r"params do not fit MultiHeadAttention: missing keys \['out_proj.bias'\]"
    ):
        jax_attn.MultiHeadAttention(5, 8, 6, 0.0, 2, True, True, rngs=nnx.Rngs(0)).load_params(params)


def bounds_of(layer, name, shape):
    """torch's default ranges: rand in [0, 1) for V1, ±1/sqrt(fan_in) for Linear weight and bias."""
    if layer == "SelfAttentionV1":
        return 0.0, 1.0
    fan_in = shape[1] if name.endswith("weight") else None
    return (-1 / math.sqrt(fan_in), 1 / math.sqrt(fan_in)) if fan_in else None


@pytest.mark.parametrize("layer", LAYERS)
def test_fresh_modules_draw_from_torch_default_distributions(layer):
    case = Case(layer, d_in=64, d_out=64, num_heads=4, bias=True)
    torch_module = case.build_torch()
    args = {
        "SelfAttentionV1": (64, 64),
        "SelfAttentionV2": (64, 64, True),
        "CausalAttention": (64, 64, 6, 0.0, True),
        "MultiHeadAttentionWrapper": (64, 64, 6, 0.0, 4, True),
        "MultiHeadAttention": (64, 64, 6, 0.0, 4, True),
        "FusedSingleHeadAttention": (64, True),
        "FusedMultiHeadAttention": (64, 4, True),
        "FusedCausalAttention": (64, 4, 6),
    }[layer]
    flax_module = getattr(jax_attn, layer)(*args, rngs=nnx.Rngs(0))
    ours, theirs = flax_module.to_params(), to_params(torch_module)
    assert {k: v.shape for k, v in ours.items()} == {k: v.shape for k, v in theirs.items()}
    for name, value in ours.items():
        torch_value = theirs[name]
        # same support: the range torch draws from (weights' bounds also cover their biases)
        low, high = float(torch_value.min()), float(torch_value.max())
        weight_name = name.replace(".bias", ".weight")
        bounds = bounds_of(layer, weight_name, theirs[weight_name].shape)
        assert bounds[0] <= value.min() and value.max() < bounds[1], name
        if value.size >= 1000:  # and the same spread (uniform: std = width / sqrt(12))
            np.testing.assert_allclose(value.std(), (bounds[1] - bounds[0]) / math.sqrt(12), rtol=0.05)
            np.testing.assert_allclose(value.std(), torch_value.std(), rtol=0.08)
            assert bounds[0] <= low and high < bounds[1]


def test_one_optax_training_step_lowers_the_loss():
    case = module_case("MultiHeadAttention")
    model = jax_attn.MultiHeadAttention.from_params(
        to_params(case.build_torch()), **case.kwargs(0.1), rngs=nnx.Rngs(0)
    )
    x = jnp.asarray(case.make_input())
    target = jnp.zeros((2, 6, 8))
    optimizer = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

    @nnx.jit
    def train_step(model, optimizer, x):
        loss, grads = nnx.value_and_grad(lambda m: jnp.mean((m(x) - target) ** 2))(model)
        optimizer.update(model, grads)
        return loss

    model.eval()
    before = jnp.mean((model(x) - target) ** 2)
    model.train()
    for _ in range(5):
        train_step(model, optimizer, x)
    model.eval()
    after = jnp.mean((model(x) - target) ** 2)
    assert after < before


def refuse_draws(monkeypatch):
    """A jax.random draw of weights with a concrete key fails: ``from_params`` may build its
    module as shapes (the draws traced, none made), never draw weights it then throws away."""
    for name in ("uniform", "normal"):
        draw = getattr(jax.random, name)

        def refused(key, *args, draw=draw, **kwargs):
            if not isinstance(key, jax.core.Tracer):
                raise AssertionError("a weight was drawn")
            return draw(key, *args, **kwargs)

        monkeypatch.setattr(jax.random, name, refused)


@pytest.mark.parametrize("layer", ["MultiHeadAttention", "FusedCausalAttention"])
def test_from_params_draws_no_weight_without_rngs(layer, monkeypatch):
    case = module_case(layer)
    params = to_params(case.build_torch())
    expected = getattr(jax_attn, layer).from_params(params, **case.kwargs(0.0))
    refuse_draws(monkeypatch)
    module = getattr(jax_attn, layer).from_params(params, **case.kwargs(0.0))
    assert module.deterministic and module.rngs is None  # eval mode, no stream
    x = case.make_input()
    np.testing.assert_array_equal(module(x), expected(x))
    with pytest.raises(AssertionError, match="a weight was drawn"):  # rngs given: built as it is
        getattr(jax_attn, layer).from_params(params, **case.kwargs(0.0), rngs=nnx.Rngs(0))


def test_a_module_built_for_loading_must_be_filled():
    from jax_attn.module_base import build_to_load, check_loaded

    module = build_to_load(lambda rngs: jax_attn.SelfAttentionV2(3, 4, rngs=rngs), None)
    with pytest.raises(RuntimeError, match=r"without values after loading: .*kernel"):
        check_loaded(module)
