"""Dropout in JAX: keep-mask parity with torch in training mode, NNX rng streams, eval mode."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import jax_attn
from parity_tests.cases import DROPOUT_LAYERS, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_jax, run_torch
from parity_tests.gradients import jax_gradients, torch_gradients
from torch_ref import to_params

P = 0.3


def dropout_case(layer, dtype="float64"):
    return Case(layer, batch=2, tokens=6, d_in=5, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=5)


def keep_masks(case, x):
    rng = np.random.default_rng(8)
    masks = {"attn_keep_mask": rng.random(case.attn_shape) >= P}
    if case.layer == "FusedCausalAttention":
        masks["out_keep_mask"] = rng.random(x.shape) >= P
    return masks


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_training_mode_outputs_and_gradients_match_torch(layer, dtype):
    case = dropout_case(layer, dtype)
    module = case.build_torch(dropout=P).train()
    x = case.make_input()
    masks = keep_masks(case, x)
    params = to_params(module)
    expected = run_torch(module, x, **masks)[1]
    cotangent = np.random.default_rng(1).standard_normal(expected["output"].shape).astype(dtype)
    expected_grads = torch_gradients(module, x, cotangent, **masks)
    with jax_context(dtype):
        actual = run_jax(case, params, x, dropout=P, jit=True, **masks)[1]
        actual_grads = jax_gradients(case, params, x, cotangent, dropout=P, **masks)
        forward, backward = compare_steps(expected, actual), compare_steps(expected_grads, actual_grads)
    assert forward.ok, f"\n{forward}"
    assert backward.ok, f"\n{backward}"


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_nnx_rngs_seed_decides_the_masks_and_eval_mode_is_exact(layer):
    case = dropout_case(layer, "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    kwargs = case.kwargs(dropout=0.5)
    build = lambda seed: getattr(jax_attn, layer).from_params(params, **kwargs, rngs=nnx.Rngs(seed))  # noqa: E731
    seeded = [build(0), build(0), build(1)]
    assert not seeded[0].deterministic  # built with rngs: train mode, like a fresh torch module
    first, same_seed, other_seed = (np.asarray(m(x)) for m in seeded)
    np.testing.assert_array_equal(first, same_seed)
    assert not np.allclose(first, other_seed)
    assert not np.allclose(first, np.asarray(seeded[0](x)))  # the stream moves on: a new mask

    eval_module = build(0)
    eval_module.eval()
    expected_eval = run_torch(case.build_torch(dropout=0.5).eval(), x)[0].detach().numpy()
    eval_outputs = [np.asarray(eval_module(x)) for _ in range(2)]
    np.testing.assert_array_equal(*eval_outputs)  # no randomness left in eval mode
    np.testing.assert_allclose(eval_outputs[0], expected_eval, rtol=1e-5, atol=1e-6)


def test_module_without_rngs_starts_in_eval_mode_and_refuses_training():
    case = dropout_case("MultiHeadAttention", "float32")
    module = jax_attn.MultiHeadAttention.from_params(to_params(case.build_torch()), **case.kwargs(0.2))
    assert module.deterministic
    module.train()
    with pytest.raises(ValueError, match="in train mode but has no dropout stream"):
        module(case.make_input())


def test_jax_dropout_statistics_and_keys():
    x = jnp.ones((1000, 1000))
    for p in (0.1, 0.5, 0.9):
        dropped = np.asarray(jax_attn.dropout(x, p, key=jax.random.key(0)))
        kept = dropped != 0
        assert abs(kept.mean() - (1 - p)) < 0.005
        np.testing.assert_allclose(dropped[kept], 1 / (1 - p), rtol=1e-6)
    same = [jax_attn.dropout(x, 0.5, key=jax.random.key(3)) for _ in range(2)]
    np.testing.assert_array_equal(*same)
    assert not np.array_equal(same[0], jax_attn.dropout(x, 0.5, key=jax.random.key(4)))
    assert jax_attn.dropout(x, 0.5) is x  # no key, no mask: the identity


def test_module_dropout_works_under_nnx_jit():
    case = dropout_case("FusedCausalAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    module = jax_attn.FusedCausalAttention.from_params(params, **case.kwargs(0.5), rngs=nnx.Rngs(0))
    step = nnx.jit(lambda m, x: m(x))
    first, second = np.asarray(step(module, x)), np.asarray(step(module, x))
    assert not np.allclose(first, second)  # the rng state advanced inside nnx.jit
    module.eval()
    np.testing.assert_allclose(
        np.asarray(step(module, x)), np.asarray(run_jax(case, params, x)[0]), rtol=1e-5, atol=1e-6
    )
