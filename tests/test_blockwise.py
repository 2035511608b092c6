"""The blockwise (O(T)-memory) path of every class equals torch_ref and the reference path (its
building blocks: tests/test_blockwise_cores.py; every door path: tests/test_blockwise_layers.py)."""

import functools
import itertools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
from numpy_attn.fast.options import AUTO_BLOCKWISE_TOKENS, uses_blockwise
from numpy_attn.spec import parameter_shapes
from parity_tests.cases import DROPOUT_LAYERS, FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import jax_context, run_case, run_flax, run_jax, run_torch
from parity_tests.gradients import torch_gradients
from tests.covering import covering_params, each_value_params
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
BLOCK_SIZES = [1, 3, 4, 7, 512]  # 3, 4 and 7 do not divide T = 13; 512 is one block


def blockwise_case(layer, dtype):
    return Case(layer, batch=2, tokens=13, d_in=6, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=21)


# class x dtype x block size: `make test` runs every class in every dtype, the block sizes in
# turn, so that every block size meets every dtype too (the block loops are the shared cores'; a
# class only picks one of the two); `make test-slow` runs the rest
OUTPUT_AXES = {"layer": LAYERS, "dtype": ["float32", "float64"], "block_size": BLOCK_SIZES}
FAST_OUTPUT_RUNS = [
    (layer, dtype, BLOCK_SIZES[i % len(BLOCK_SIZES)])
    for i, (layer, dtype) in enumerate(itertools.product(LAYERS, OUTPUT_AXES["dtype"]))
]


def test_the_default_output_runs_meet_every_dtype_with_every_class_and_block_size():
    for axis in ("layer", "block_size"):
        position = list(OUTPUT_AXES).index(axis)
        met = {(run[position], run[1]) for run in FAST_OUTPUT_RUNS}
        assert met == set(itertools.product(OUTPUT_AXES[axis], OUTPUT_AXES["dtype"])), axis


@pytest.mark.parametrize(
    "layer, dtype, block_size", covering_params(itertools.product(*OUTPUT_AXES.values()), FAST_OUTPUT_RUNS)
)
def test_blockwise_output_matches_torch(layer, dtype, block_size):
    case = blockwise_case(layer, dtype)
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = {"output": run_torch(module, x)[0]}
    fast = {"implementation": "blockwise", "block_size": block_size}
    with jax_context(dtype):
        outputs = {
            "numpy": run_case("numpy", case, params, x, **fast)[0],
            "jax_jit": run_jax(case, params, x, jit=True, **fast)[0],
        }
        reports = {name: compare_steps(expected, {"output": out}) for name, out in outputs.items()}
    for name, report in reports.items():
        assert report.ok, f"{name}\n{report}"


TRACE_RUNNERS = {
    "jax": functools.partial(run_jax, implementation="blockwise", block_size=4),
    "flax": functools.partial(run_flax, implementation="blockwise", block_size=4),
}


# NumPy on every class; of class x JAX runner (each compiles a program), `make test` runs a set in
# which every class and runner appears, `make test-slow` the rest
@pytest.mark.parametrize("layer, runner", each_value_params({"layer": LAYERS, "runner": list(TRACE_RUNNERS)}))
def test_blockwise_traces_keep_every_step(layer, runner):
    """With return_steps the (T, S) steps are materialised; the context comes from blockwise."""
    case = blockwise_case(layer, "float64")
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    with jax_context("float64"):
        traces = {
            "numpy": run_case("numpy", case, params, x, implementation="blockwise", block_size=4)[1],
            runner: TRACE_RUNNERS[runner](case, params, x)[1],
        }
        reports = {name: compare_steps(expected, trace) for name, trace in traces.items()}
    for name, report in reports.items():
        assert report.ok, f"{name}\n{report}"


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_blockwise_padding_and_fully_masked_rows(dtype):
    case = Case("FusedCausalAttention", batch=2, tokens=11, d_out=8, num_heads=2, bias=True, dtype=dtype)
    params, x = to_params(case.build_torch()), case.make_input()
    padding_mask = np.zeros((2, 11), bool)
    padding_mask[0, :3] = True  # left padding: rows 0-2 of sequence 0 see no key
    padding_mask[1, 8:] = True  # right padding
    with jax_context(dtype):
        expected = run_case("numpy", case, params, x, padding_mask)[0]
        for block_size in (2, 5, 16):
            fast = {"implementation": "blockwise", "block_size": block_size}
            numpy_output = run_case("numpy", case, params, x, padding_mask, **fast)[0]
            jax_output = np.asarray(run_jax(case, params, x, padding_mask, jit=True, **fast)[0])
            for output in (numpy_output, jax_output):
                assert compare_steps({"o": expected}, {"o": output}).ok
                np.testing.assert_array_equal(output[0, :3], np.broadcast_to(params["Wo.bias"], (3, 8)))


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_blockwise_dropout_with_keep_masks_matches_torch_training_mode(layer):
    case = blockwise_case(layer, "float64")
    module = case.build_torch(dropout=0.3).train()
    params, x = to_params(module), case.make_input()
    rng = np.random.default_rng(2)
    masks = {"attn_keep_mask": rng.random(case.attn_shape) >= 0.3}
    if layer == "FusedCausalAttention":
        masks["out_keep_mask"] = rng.random(x.shape) >= 0.3
    expected = {"output": run_torch(module, x, **masks)[0]}
    fast = {"implementation": "blockwise", "block_size": 5, "dropout": 0.3}
    with jax_context("float64"):
        outputs = [
            run_case("numpy", case, params, x, **fast, **masks)[0],
            run_jax(case, params, x, jit=True, **fast, **masks)[0],
        ]
        for output in outputs:
            report = compare_steps(expected, {"output": output})
            assert report.ok, f"\n{report}"


def test_blockwise_random_dropout_is_seeded_and_consistent_with_its_trace():
    case = blockwise_case("MultiHeadAttention", "float64")
    params, x = to_params(case.build_torch()), case.make_input()
    fast = {"implementation": "blockwise", "block_size": 4, "dropout": 0.5}
    first = run_case("numpy", case, params, x, rng=np.random.default_rng(1), **fast)[0]
    again = run_case("numpy", case, params, x, rng=np.random.default_rng(1), **fast)[0]
    other = run_case("numpy", case, params, x, rng=np.random.default_rng(2), **fast)[0]
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other)
    # with a trace, one keep-mask is drawn and both the steps and the output use it
    output, steps = run_case("numpy", case, params, x, rng=np.random.default_rng(1), **fast)
    dropped = steps["attn_weights_dropped"]
    keep = (dropped != 0) | (steps["attn_weights"] == 0)
    reference = run_case("numpy", case, params, x, dropout=0.5, attn_keep_mask=keep)[0]
    np.testing.assert_allclose(output, reference, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("layer", ["MultiHeadAttention", "FusedCausalAttention", "SelfAttentionV2"])
def test_blockwise_gradients_match_torch(layer):
    case = blockwise_case(layer, "float64")
    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    cotangent = np.random.default_rng(3).standard_normal(run_torch(module, x)[0].shape)
    expected = torch_gradients(module, x, cotangent)
    with jax_context("float64"):
        import jax_attn

        fn = getattr(jax_attn, case.function_name)
        grads = jax.jit(
            jax.grad(
                lambda p, x: (
                    fn(p, x, **case.kwargs(), implementation="blockwise", block_size=5) * cotangent
                ).sum(),
                argnums=(0, 1),
            )
        )
        grad_params, grad_x = grads(params, x)
        report = compare_steps(expected, {"x": grad_x, **grad_params})
    assert report.ok, f"\n{report}"


def test_auto_switches_at_the_documented_length():
    assert not uses_blockwise("auto", AUTO_BLOCKWISE_TOKENS - 1)
    assert uses_blockwise("auto", AUTO_BLOCKWISE_TOKENS)
    assert uses_blockwise("blockwise", 1) and not uses_blockwise("reference", 10**6)
    case = Case("MultiHeadAttention", batch=1, tokens=AUTO_BLOCKWISE_TOKENS, d_in=4, d_out=4, dtype="float64")
    params, x = to_params(case.build_torch()), case.make_input()
    auto = run_case("numpy", case, params, x, implementation="auto")[0]
    blockwise = run_case("numpy", case, params, x, implementation="blockwise")[0]
    np.testing.assert_array_equal(auto, blockwise)


@pytest.mark.parametrize(
    ("layer", "function", "kwargs"),
    [
        ("MultiHeadAttention", jax_attn.multi_head_attention, {"context_length": 4096}),
        ("FusedCausalAttention", jax_attn.fused_causal_attention, {"context_size": 4096}),
    ],
)
def test_jax_blockwise_layer_copies_no_whole_array(layer, function, kwargs):
    """XLA's temporaries on the blockwise path: the merged context, the output projection before
    its bias and one head's (T, 3H) projection (1.5 arrays of (T, E) with 2 heads): 3.55 arrays
    of (T, E), plus (block, block) blocks. The (B, T, 3E) projection stored whole, as before
    ``blockwise_self_attention``, took 5.13 (6.0 with fused thirds copied apart); the reference
    path takes T x T matrices)."""
    tokens, width = 4096, 64
    sizes = {"d_in": width, "d_out": width, "hidden_size": width, "qkv_bias": True, "bias": True}
    shapes = parameter_shapes(layer, **sizes)  # each class reads the sizes it takes
    params = {name: jnp.zeros(shape) for name, shape in shapes.items()}
    x = jnp.zeros((1, tokens, width))
    one_array = tokens * width * 4  # bytes of one float32 (T, E) array

    def temporaries(implementation):
        fast = {"implementation": implementation, "block_size": 128}
        call = functools.partial(function, num_heads=2, **fast, **kwargs)
        return jax.jit(call).lower(params, x).compile().memory_analysis().temp_size_in_bytes / one_array

    assert temporaries("blockwise") < 4
    assert temporaries("reference") > 2 * tokens / width  # two (T, T) matrices per head


def test_bad_implementation_and_block_size_are_rejected():
    case = blockwise_case("MultiHeadAttention", "float32")
    params, x = to_params(case.build_torch()), case.make_input()
    with pytest.raises(
        ValueError, match=r"implementation must be one of \('reference', 'blockwise', 'auto'\), got 'fast'"
    ):
        run_case("numpy", case, params, x, implementation="fast")
    with pytest.raises(ValueError, match="block_size must be a positive int, got 0"):
        run_jax(case, params, x, implementation="blockwise", block_size=0)
