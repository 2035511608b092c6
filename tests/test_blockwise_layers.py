"""Every layer's door sends ``implementation="blockwise"`` to ``numpy_attn.fast``'s ``fast_layer``:
there each of the 8 classes gives its reference path's output and steps, in numpy_attn and in
jax_attn (eager and under ``jax.jit``), with dropout keep-masks, a padding mask where the class
takes one (with fully hidden rows), and in half precision."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context
from tests.covering import covering_params, each_value
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
JAX_RUNS = ["jax", "jax-jit"]  # eager (the door's compiled program) and inside the caller's jax.jit


def params_for(jax_runs, jax_layers=LAYERS):
    """layer x run: numpy_attn on every class and, of the JAX runs (each compiles programs), a set
    in which every class of ``jax_layers`` and every run appears, for ``make test``; ``make
    test-slow`` runs the rest."""
    fast = [("numpy", layer) for layer in LAYERS]
    fast += [(row["run"], row["layer"]) for row in each_value({"layer": jax_layers, "run": jax_runs})]
    return covering_params(itertools.product(["numpy", *JAX_RUNS], LAYERS), fast)


def layer_call(run, case, **fixed):
    """``(params, x, **masks) -> output or (output, steps)``: the case's layer function in
    ``run``, its constructor arguments (dropout 0.25) and ``fixed`` bound (static under jit)."""
    package = numpy_attn if run == "numpy" else jax_attn
    call = functools.partial(getattr(package, case.function_name), **case.kwargs(0.25), **fixed)
    return jax.jit(call) if run == "jax-jit" else call


def masks_of(case, x):
    """The case's dropout keep-masks (True = keep) and, where the class takes one, a padding mask
    (True = padding) that hides every key of row 0's first queries."""
    rng = np.random.default_rng(7)
    masks = {}
    if case.spec.dropouts:
        masks["attn_keep_mask"] = rng.random(case.attn_shape) >= 0.25
    if case.spec.out_dropout:
        masks["out_keep_mask"] = rng.random(x.shape) >= 0.25
    if case.spec.padding:
        padding_mask = np.zeros(x.shape[:2], bool)
        padding_mask[0, :4] = True  # causal: queries 0 to 3 of row 0 see no key
        padding_mask[1, -2:] = True
        masks["padding_mask"] = padding_mask
    return masks


def inputs(run, case):
    """The case's weights, input and masks, as JAX arrays for a JAX run."""
    params, x = to_params(case.build_torch()), case.make_input()
    arrays = (params, x, masks_of(case, x))
    return arrays if run == "numpy" else jax.tree.map(jnp.asarray, arrays)


@pytest.mark.parametrize("run, layer", params_for(JAX_RUNS))
def test_the_blockwise_path_gives_the_reference_output_and_steps(run, layer):
    """With and without ``return_steps``; blocks that do not divide T = 9."""
    case = Case(layer, batch=2, tokens=9, d_in=5, d_out=8, num_heads=2, bias=True, dtype="float64", seed=3)
    with jax_context("float64"):
        params, x, masks = inputs(run, case)
        expected, expected_steps = layer_call(run, case, return_steps=True)(params, x, **masks)
        fast = {"implementation": "blockwise", "block_size": 4}
        output, steps = layer_call(run, case, return_steps=True, **fast)(params, x, **masks)
        alone = layer_call(run, case, **fast)(params, x, **masks)
        assert list(steps) == list(expected_steps)
        report = compare_steps(
            {**expected_steps, "alone": expected}, {**steps, "alone": alone}
        )  # the output without steps too
    assert report.ok, f"\n{report}"


# JAX in make test: the structures tests/test_blockwise_half.py does not run in bfloat16 (it runs
# CausalAttention and MultiHeadAttention): a stack of heads, a fused Wqkv, plain matrices
HALF_JAX_LAYERS = ["MultiHeadAttentionWrapper", "FusedCausalAttention", "SelfAttentionV1"]


@pytest.mark.parametrize("run, layer", params_for(JAX_RUNS[::-1], HALF_JAX_LAYERS))
def test_the_blockwise_path_in_half_precision_gives_the_reference_output(run, layer):
    """float16 in numpy_attn, bfloat16 in jax_attn: the blockwise core computes in float32 and
    casts the context once, as the reference computes its scores and softmax in float32."""
    dtype = "float16" if run == "numpy" else "bfloat16"
    case = Case(layer, batch=2, tokens=9, d_in=5, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=4)
    params, x, masks = inputs(run, case)
    expected = layer_call(run, case)(params, x, **masks)
    actual = layer_call(run, case, implementation="blockwise", block_size=4)(params, x, **masks)
    assert actual.dtype == expected.dtype == x.dtype
    report = compare_steps({"output": expected}, {"output": actual})
    assert report.ok, f"\n{report}"


@pytest.mark.parametrize("run", ["numpy", "jax-jit"])
@pytest.mark.parametrize("layer", ["CausalAttention", "MultiHeadAttention"])
def test_random_dropout_with_steps_uses_one_keep_mask_on_both_paths(layer, run):
    """With ``return_steps`` the blockwise path draws one keep-mask, which the (T, S) steps show
    and its own blocks use: its output is the reference math's with that mask."""
    case = Case(layer, batch=2, tokens=9, d_in=5, d_out=8, num_heads=2, bias=True, dtype="float64", seed=5)
    random = {"rng": np.random.default_rng(1)} if run == "numpy" else {"key": jax.random.key(1)}
    with jax_context("float64"):
        params, x, _ = inputs(run, case)
        fast = {"implementation": "blockwise", "block_size": 4, "return_steps": True}
        output, steps = layer_call(run, case, **fast)(params, x, **random)
        keep_mask = (steps["attn_weights_dropped"] != 0) | (steps["attn_weights"] == 0)
        expected = layer_call(run, case)(params, x, attn_keep_mask=keep_mask)
    report = compare_steps({"output": expected}, {"output": output})
    assert report.ok, f"\n{report}"
