"""Checks at the door, once per public call: the same errors for every bad call, inputs left
untouched, and no building block's own check inside a layer, the GPT, generate's loop or the
blockwise loops (they call the plain math)."""

import re
import tracemalloc

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn import checks, finite
from numpy_attn.door import check_layer
from numpy_attn.finite import check_finite
from numpy_attn.spec import QKV
from parity_tests.tolerances import TOLERANCES


def weights(dtype=np.float32):
    rng = np.random.default_rng(3)
    return {name: rng.standard_normal((4, 3)).astype(dtype) for name in ("a", "b", "c", "d")}


@pytest.mark.parametrize("to_array", [np.asarray, jnp.asarray], ids=["numpy", "jax"])
def test_check_finite_names_the_first_non_finite_weight(to_array):
    params = weights()
    params["b"][1, 2] = np.nan
    params["d"][0, 0] = -np.inf
    with pytest.raises(ValueError, match=re.escape("params['b'] has non-finite values (NaN or inf)")):
        check_finite({k: to_array(v) for k, v in params.items()})
    params["b"][1, 2] = 0.0
    with pytest.raises(ValueError, match=re.escape("params['d'] has non-finite values (NaN or inf)")):
        check_finite({k: to_array(v) for k, v in params.items()})


def test_check_finite_accepts_finite_weights_whatever_their_size():
    params = weights()
    params["a"][:] = np.finfo(np.float32).max  # a sum of these would overflow to inf: none is taken
    params["e"] = np.float32(2.5)  # a 0-d weight
    assert check_finite(params) is None
    assert check_finite({}) is None


def test_softmax_leaves_its_input_alone_and_zeroes_fully_masked_rows():
    scores = np.array([[1.0, 2.0, -np.inf], [-np.inf, -np.inf, -np.inf], [0.5, -np.inf, 0.5]], np.float32)
    before = scores.copy()
    actual = numpy_attn.softmax(scores)
    np.testing.assert_array_equal(scores, before)
    e = np.exp(np.float32(-1.0))
    expected = np.array([[e / (1 + e), 1 / (1 + e), 0.0], [0.0, 0.0, 0.0], [0.5, 0.0, 0.5]], np.float32)
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    single = np.array([[-np.inf], [3.0]])  # one key: the reduction's output could alias a view
    np.testing.assert_array_equal(numpy_attn.softmax(single), [[0.0], [1.0]])
    np.testing.assert_array_equal(single, [[-np.inf], [3.0]])


def small_layer_call():
    """The issue's small call: MultiHeadAttention, B=2, T=6, d 3 -> 4, float32."""
    rng = np.random.default_rng(16)
    params = {f"{n}.weight": rng.standard_normal((4, 3)).astype(np.float32) for n in QKV}
    params["out_proj.weight"] = rng.standard_normal((4, 4)).astype(np.float32)
    params["out_proj.bias"] = rng.standard_normal(4).astype(np.float32)
    return params, rng.standard_normal((2, 6, 3)).astype(np.float32)


@pytest.mark.parametrize(
    "change, error, message",
    [
        ("nan_weight", ValueError, r"params\['W_key.weight'\] has non-finite values \(NaN or inf\)"),
        ("float64_bias", TypeError, r"params\['out_proj.bias'\] has dtype float64 but x has dtype float32"),
        ("num_heads_true", TypeError, r"num_heads must be a positive int, got True \(bool\)"),
        ("dropout_false", TypeError, r"dropout must be a float in \[0, 1\), got bool"),
        ("list_weight", TypeError, r"params\['W_query.weight'\] must be an array, got list"),
        ("keep_mask_int", ValueError, r"attn_keep_mask must be a bool array of shape .* got int64 array"),
    ],
)
def test_a_bad_call_after_a_good_one_of_the_same_shapes_still_raises(change, error, message):
    """Every call is checked: nothing learnt from a good call lets a bad one of the same shapes
    through (True == 1 and False == 0, but bools are refused)."""
    params, x = small_layer_call()
    good = {"num_heads": 1, "context_length": 6, "dropout": 0, "implementation": "auto"}
    keep = np.ones((2, 1, 6, 6), bool)
    numpy_attn.multi_head_attention(params, x, **good)
    numpy_attn.multi_head_attention(params, x, **good, attn_keep_mask=keep)
    bad = dict(good)
    if change == "nan_weight":
        params["W_key.weight"] = params["W_key.weight"].copy()
        params["W_key.weight"][1, 2] = np.nan
    elif change == "float64_bias":
        params["out_proj.bias"] = params["out_proj.bias"].astype(np.float64)
    elif change == "list_weight":
        params["W_query.weight"] = params["W_query.weight"].tolist()
    elif change == "keep_mask_int":
        bad["attn_keep_mask"] = keep.astype(np.int64)
    else:
        name = change.rsplit("_", 1)[0]
        bad[name] = change.endswith("_true")  # True == 1 and False == 0, but bools are refused
    with pytest.raises(error, match=message):
        numpy_attn.multi_head_attention(params, x, **bad)


def test_an_unhashable_argument_gets_its_own_error():
    params, x = small_layer_call()
    with pytest.raises(TypeError, match=re.escape("num_heads must be a positive int, got [2] (list)")):
        numpy_attn.multi_head_attention(params, x, num_heads=[2], context_length=6)


def test_the_returned_arguments_are_the_callers_to_change():
    params, x = small_layer_call()
    first = check_layer("MultiHeadAttention", params, x, num_heads=2, context_length=6)
    first["d_in"] = 99
    actual = check_layer("MultiHeadAttention", params, x, num_heads=2, context_length=6)
    assert actual["d_in"] == 3 and actual["num_heads"] == 2


def test_a_causal_mask_written_to_leaves_the_next_one_alone():
    """The mask is built from the shapes at each call (no buffer kept): a caller's writes to
    the array it got change no later mask."""
    mask = numpy_attn.causal_mask(4)
    mask[0, 1] = False
    np.testing.assert_array_equal(numpy_attn.causal_mask(4), np.triu(np.ones((4, 4), bool), 1))


@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_split_projection_refuses_rows_that_do_not_cut_into_equal_parts(package):
    x, weight = np.ones((2, 3), np.float32), np.ones((10, 3), np.float32)
    message = "weight of shape (10, 3) does not cut into parts=3 equal row blocks"
    with pytest.raises(ValueError, match=re.escape(message)):
        package.split_projection(x, weight)


# the checks only the building blocks' doors make (the layers', the GPT's and generate's doors check
# their weights against the spec or the config instead)
BLOCK_CHECKS = (
    "check_operands",
    "check_attention_shapes",
    "check_linear_shapes",
    "check_scores_mask",
    "check_mask_operands",
    "check_axis",
    "check_causal_mask_args",
)


@pytest.fixture
def refuse_block_checks(monkeypatch):
    """The building blocks' own checks replaced by one that raises, for the calls that must not
    run them (their door has checked their input already)."""

    def refuse(*args, **kwargs):
        raise AssertionError("a building block's check ran inside a layer")

    for name in BLOCK_CHECKS:
        monkeypatch.setattr(checks, name, refuse)
    for package, to_array in ((numpy_attn, np.asarray), (jax_attn, jnp.asarray)):  # the patch is in place
        with pytest.raises(AssertionError, match="inside a layer"):
            package.softmax(to_array(np.ones(2, np.float32)))


# numpy_attn on both paths, with and without steps; jax_attn (each layer compiled) on the blockwise
# path, whose steps come from the reference math
PLAIN_RUNS = [
    *(
        (numpy_attn, implementation, steps)
        for implementation in ("reference", "blockwise")
        for steps in (False, True)
    ),
    (jax_attn, "blockwise", False),
    (jax_attn, "blockwise", True),
]


@pytest.mark.parametrize("package, implementation, steps", PLAIN_RUNS)
def test_the_layers_call_the_plain_building_blocks(refuse_block_checks, package, implementation, steps):
    """The door has checked a layer's call: the building blocks' own checks must not run again
    inside it, on either path (the blockwise one: ``fast_layer``, ``attend``, the blockwise
    loops), with random dropout too."""
    from parity_tests.cases import FUNCTION_NAMES, Case
    from torch_ref import to_params

    random = np.random.default_rng(0) if package is numpy_attn else jax.random.key(0)
    for layer in FUNCTION_NAMES:
        case = Case(layer, d_in=4, d_out=4, num_heads=2, bias=True)
        params, x = to_params(case.build_torch()), case.make_input()
        kwargs = case.kwargs(0.5) | {"implementation": implementation, "block_size": 2}
        kwargs |= {package.FRAMEWORK.random: random} if case.spec.dropouts else {}
        output = getattr(package, case.function_name)(params, x, **kwargs, return_steps=steps)
        assert np.isfinite(output[0] if steps else output).all()


def test_decoding_the_gpt_and_the_blockwise_loop_call_the_plain_building_blocks(refuse_block_checks):
    """The KV-cache decoders, the GPT and the blockwise loop (a projection per head) check their
    input once, at the door, like the layers."""
    rng = np.random.default_rng(0)
    params = {
        **{
            f"{n}.weight": rng.standard_normal((4, 4)).astype(np.float32)
            for n in ("W_query", "W_key", "W_value")
        },
        "out_proj.weight": rng.standard_normal((4, 4)).astype(np.float32),
        "out_proj.bias": rng.standard_normal(4).astype(np.float32),
    }
    x = rng.standard_normal((2, 6, 4)).astype(np.float32)
    expected = numpy_attn.multi_head_attention(params, x, num_heads=2, context_length=8)
    cache = numpy_attn.init_kv_cache(2, 2, 8, 2)
    decoded, cache = numpy_attn.multi_head_attention_decode(
        params, x[:, :5], cache, num_heads=2, context_length=8
    )
    last, _ = numpy_attn.multi_head_attention_decode(params, x[:, 5:], cache, num_heads=2, context_length=8)
    np.testing.assert_allclose(np.concatenate([decoded, last], axis=1), expected, rtol=1e-5, atol=1e-6)
    blockwise = numpy_attn.multi_head_attention(
        params, x, num_heads=2, context_length=8, implementation="blockwise", block_size=2
    )
    np.testing.assert_allclose(blockwise, expected, rtol=1e-5, atol=1e-6)
    config, gpt_params, ids = gpt_call(rng)
    logits = numpy_attn.gpt_model(gpt_params, ids, config, rng=np.random.default_rng(1))
    assert logits.shape == (2, 6, 16) and np.isfinite(logits).all()
    assert numpy_attn.generate(gpt_params, ids[:, :2], config, 2).shape == (2, 4)
    # the GPT's parts (layer_norm, gelu, feed_forward, the block) run plain in jax_attn too
    jax_logits = jax_attn.gpt_model(gpt_params, ids, config, key=jax.random.key(1))
    assert jax_logits.shape == (2, 6, 16) and np.isfinite(jax_logits).all()


def gpt_call(rng, n_layers=1, drop_rate=0.1, qkv_bias=False):
    """A small GPT's config, float32 weights and (2, 6) token ids."""
    config = {"vocab_size": 16, "context_length": 8, "emb_dim": 4, "n_heads": 2, "n_layers": n_layers,
              "drop_rate": drop_rate, "qkv_bias": qkv_bias}  # fmt: skip
    params = {
        name: rng.standard_normal(shape).astype(np.float32) * 0.1
        for name, shape in numpy_attn.gpt_param_shapes(config).items()
    }
    return config, params, rng.integers(0, 16, (2, 6))


def test_the_flax_gpt_runs_its_parts_plain(refuse_block_checks):
    config, gpt_params, ids = gpt_call(np.random.default_rng(0))
    logits = jax_attn.GPTModel.from_params(gpt_params, config)(ids)
    assert logits.shape == (2, 6, 16) and np.isfinite(logits).all()


def test_check_finite_tests_large_weights_without_copying_them():
    """Above ``_JOINED_ELEMENTS`` values the weights are tested key by key in chunks: the check's
    temporaries stay one chunk's bools (1 MiB), whatever the weights' size (64 MiB here)."""
    params = {f"w{i}": np.ones(1 << 22, np.float32) for i in range(4)}
    tracemalloc.start()
    try:
        check_finite(params)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 2 * finite._FINITE_CHUNK
    params["w2"][-1] = np.inf  # the last entry of the last chunk
    with pytest.raises(ValueError, match=re.escape("params['w2'] has non-finite values (NaN or inf)")):
        check_finite(params)


def count_checks(monkeypatch) -> dict[str, int]:
    """How often each check of ``numpy_attn.checks`` and ``numpy_attn.finite`` runs from here on, by name."""
    counts: dict[str, int] = {}

    def counted(name, function):
        def count(*args, **kwargs):
            counts[name] = counts.get(name, 0) + 1
            return function(*args, **kwargs)

        return count

    for module in (checks, finite):
        for name, function in vars(module).items():
            if name.startswith("check_") and callable(function):
                monkeypatch.setattr(module, name, counted(name, function))
    return counts


@pytest.mark.parametrize("sampling", [False, True])
def test_generate_checks_once_not_per_token(refuse_block_checks, monkeypatch, sampling):
    """generate checks its arguments once, at its door: as many checks for 1 new token as for 5,
    and no building block's check (softmax's at every sample) in its loop."""
    config, params, ids = gpt_call(np.random.default_rng(0), n_layers=2, drop_rate=0.0, qkv_bias=True)
    counts = count_checks(monkeypatch)
    sample = {"temperature": 0.8, "top_k": 5} if sampling else {}
    runs = {}
    for max_new_tokens in (1, 5):
        counts.clear()
        rng = np.random.default_rng(0) if sampling else None
        generated = numpy_attn.generate(params, ids[:, :2], config, max_new_tokens, rng=rng, **sample)
        assert generated.shape == (2, 2 + max_new_tokens)
        np.testing.assert_array_equal(generated[:, :2], ids[:, :2])
        runs[max_new_tokens] = dict(counts)
    assert runs[1] == runs[5] and runs[1]
