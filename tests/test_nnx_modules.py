"""Flax NNX-native modules: from_params with constructor arguments and any array source, real
submodules called, steps sown, nnx transforms, dropout streams, no host transfer per call."""

import inspect
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jax_attn
import numpy_attn
import numpy_attn.finite
import torch_ref
from parity_tests.cases import FUNCTION_NAMES, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import run_torch
from parity_tests.tolerances import tolerance_for
from torch_ref import to_params

LAYERS = list(FUNCTION_NAMES)
SOURCES = ["numpy", "jax", "torch_tensors", "torch_state_dict"]


def module_case(layer, dtype="float32"):
    return Case(layer, batch=2, tokens=6, d_in=5, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=4)


def constructor_arguments(case):
    """Every argument of the torch constructor that built ``case.build_torch()``, by name."""
    sizes = {
        "SelfAttentionV1": {"d_in": case.d_in, "d_out": case.d_out},
        "SelfAttentionV2": {"d_in": case.d_in, "d_out": case.d_out, "qkv_bias": case.bias},
        "CausalAttention": {"d_in": case.d_in, "d_out": case.d_out, "qkv_bias": case.bias},
        "MultiHeadAttentionWrapper": {"d_in": case.d_in, "d_out": case.d_out, "qkv_bias": case.bias},
        "MultiHeadAttention": {
            "d_in": case.d_in, "d_out": case.d_out, "qkv_bias": case.bias, "out_bias": case.out_bias,
        },
        "FusedSingleHeadAttention": {"hidden_size": case.d_out, "bias": case.bias},
        "FusedMultiHeadAttention": {"hidden_size": case.d_out, "bias": case.bias},
        "FusedCausalAttention": {"hidden_size": case.d_out, "bias": case.bias},
    }[case.layer]  # fmt: skip
    return sizes | case.kwargs()


def weights_from(source, torch_module):
    if source == "torch_state_dict":
        return torch_module.state_dict()  # as it is: the mask buffers included
    if source == "torch_tensors":
        return dict(torch_module.named_parameters())  # tensors that require grad
    params = to_params(torch_module)
    return params if source == "numpy" else {k: jnp.asarray(v) for k, v in params.items()}


def assert_close(actual, expected):
    rtol, atol = tolerance_for(np.asarray(expected).dtype)
    np.testing.assert_allclose(np.asarray(actual), np.asarray(expected), rtol=rtol, atol=atol)


@pytest.mark.parametrize("source", SOURCES)
@pytest.mark.parametrize("layer", LAYERS)
def test_from_params_takes_every_constructor_argument_and_any_array_source(layer, source):
    case = module_case(layer)
    torch_module = case.build_torch()
    x = case.make_input()
    module = getattr(jax_attn, layer).from_params(
        weights_from(source, torch_module), **constructor_arguments(case)
    )
    expected = run_torch(torch_module, x)[0].detach().numpy()
    assert_close(module(x), expected)
    for name, value in to_params(torch_module).items():
        np.testing.assert_array_equal(module.to_params()[name], value)


def test_the_issue_call_works():
    torch_module = torch_ref.MultiHeadAttention(8, 8, 6, 0.0, num_heads=2)
    module = jax_attn.MultiHeadAttention.from_params(
        to_params(torch_module), d_in=8, d_out=8, context_length=6, num_heads=2
    )
    assert (module.W_query.kernel.shape, module.context_length, module.num_heads) == ((8, 8), 6, 2)


def test_bfloat16_torch_tensors_load_as_they_are():
    case = module_case("FusedCausalAttention")
    torch_module = case.build_torch().to(torch.bfloat16)
    module = jax_attn.FusedCausalAttention.from_params(torch_module.state_dict(), **case.kwargs())
    assert module.Wqkv.kernel[...].dtype == jnp.bfloat16
    expected = torch_module.Wqkv.weight.detach().float().numpy().T
    np.testing.assert_array_equal(np.asarray(module.Wqkv.kernel[...], np.float32), expected)


# layer -> (argument, wrong value, regex of the evidence, value the weights say)
CONTRADICTIONS = {
    "SelfAttentionV1": ("d_in", 7, r"W_query has shape \(5, 8\)", 5),
    "SelfAttentionV2": ("d_out", 4, r"W_query.weight has shape \(8, 5\)", 8),
    "CausalAttention": ("qkv_bias", False, r"W_query.bias is present", True),
    "MultiHeadAttentionWrapper": ("d_out", 4, r"heads.0.W_query.weight has shape \(8, 5\)", 8),
    "MultiHeadAttention": ("d_in", 8, r"W_query.weight has shape \(8, 5\)", 5),
    "FusedSingleHeadAttention": ("hidden_size", 12, r"Wqkv.weight has shape \(6, 8\)", 8),
    "FusedMultiHeadAttention": ("bias", False, r"Wqkv.bias is present", True),
    "FusedCausalAttention": ("hidden_size", 4, r"Wqkv.weight has shape \(24, 8\)", 8),
}


@pytest.mark.parametrize("layer", LAYERS)
def test_an_argument_that_contradicts_the_weights_names_both_values(layer):
    case = module_case(layer)
    argument, wrong, evidence, right = CONTRADICTIONS[layer]
    arguments = constructor_arguments(case) | {argument: wrong}
    message = f"{argument}={wrong!r} contradicts the weights: {evidence}, so {argument}={right!r}"
    with pytest.raises(ValueError, match=f"^{message}$"):
        getattr(jax_attn, layer).from_params(case.build_torch().state_dict(), **arguments)


@pytest.mark.parametrize("layer", ["MultiHeadAttentionWrapper", "FusedCausalAttention"])
def test_an_unknown_key_is_named(layer):
    case = module_case(layer)
    params = case.build_torch().state_dict()
    params["heads.0.extra"] = torch.zeros(2)
    params["mask"] = torch.zeros(6, 6)  # the buffer of the book's classes, not of note 003's
    unexpected = ["heads.0.extra"] if layer.startswith("Multi") else ["heads.0.extra", "mask"]
    expected = f"unexpected keys {unexpected}"
    with pytest.raises(ValueError, match=re.escape(f"params do not fit {layer}: {expected}")):
        getattr(jax_attn, layer).from_params(params, **case.kwargs())


LINEAR_CALLS = {
    "SelfAttentionV2": 3,
    "CausalAttention": 3,
    "MultiHeadAttentionWrapper": 6,  # 3 per head, 2 heads
    "MultiHeadAttention": 4,
    "FusedSingleHeadAttention": 2,
    "FusedMultiHeadAttention": 2,
    "FusedCausalAttention": 2,
}


@pytest.mark.parametrize("layer", list(LINEAR_CALLS))
def test_the_call_runs_the_linear_submodules(layer, monkeypatch):
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())
    called = []
    linear_call = nnx.Linear.__call__
    counting = lambda self, x: called.append(self) or linear_call(self, x)  # noqa: E731
    monkeypatch.setattr(nnx.Linear, "__call__", counting)
    module(case.make_input())
    assert len(called) == LINEAR_CALLS[layer]
    assert len({id(linear) for linear in called}) == LINEAR_CALLS[layer]  # each one once


def test_the_wrapper_calls_each_head_module():
    case = module_case("MultiHeadAttentionWrapper")
    module = jax_attn.MultiHeadAttentionWrapper.from_params(to_params(case.build_torch()), **case.kwargs())
    x = case.make_input()
    before = np.asarray(module(x))
    module.heads[1].W_value.kernel[...] = jnp.zeros_like(module.heads[1].W_value.kernel[...])
    after = np.asarray(module(x))
    assert_close(after[..., :8], before[..., :8])  # head 0 unchanged
    assert_close(after[..., 8:], module.heads[1].W_value.bias[...] * np.ones((2, 6, 1)))  # weights @ bias


def test_v1_uses_its_own_matrices():
    case = module_case("SelfAttentionV1")
    module = jax_attn.SelfAttentionV1.from_params(to_params(case.build_torch()))
    x = case.make_input()
    module.W_value[...] = jnp.eye(5, 8)
    (context_vec, steps), _ = nnx.capture(module, nnx.Intermediate)(x, return_steps=True)
    np.testing.assert_allclose(steps["values"], np.asarray(x) @ np.eye(5, 8), rtol=1e-6)
    np.testing.assert_allclose(context_vec, steps["attn_weights"] @ steps["values"], rtol=1e-5, atol=1e-6)


def flat_steps(state):
    """Sown intermediates (each a one-call tuple) by dotted path: ``heads.0.queries``..."""
    flat = {".".join(map(str, path)): variable.get_value() for path, variable in nnx.to_flat_state(state)}
    assert all(len(value) == 1 for value in flat.values())
    return {name: value[0] for name, value in flat.items()}


@pytest.mark.parametrize("layer", LAYERS)
def test_sown_steps_equal_torch_steps(layer):
    case = module_case(layer)
    torch_module = case.build_torch()
    x = case.make_input()
    expected = run_torch(torch_module, x)[1]
    module = getattr(jax_attn, layer).from_params(to_params(torch_module), **case.kwargs())
    forward = nnx.jit(nnx.capture(lambda m, x: m(x, return_steps=True), nnx.Intermediate))
    (_, returned), sown = forward(module, x)
    actual = flat_steps(sown)
    report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    assert set(actual) == set(expected) == set(returned)
    assert not nnx.state(module, nnx.Intermediate)  # capture took them: the module is as it was


SOW_OUTSIDE_CAPTURE = "error:Using 'Module.sow\\(\\)' outside of 'nnx.capture\\(\\)':DeprecationWarning"


@pytest.mark.filterwarnings(SOW_OUTSIDE_CAPTURE)
def test_a_direct_call_returns_the_steps_and_sows_nothing_a_captured_call_collects_them():
    case = module_case("MultiHeadAttentionWrapper")
    module = jax_attn.MultiHeadAttentionWrapper.from_params(to_params(case.build_torch()), **case.kwargs())
    _, expected = module(case.make_input(), return_steps=True)  # Flax's deprecation would raise here
    assert not nnx.state(module, nnx.Intermediate)
    (_, returned), sown = nnx.capture(module, nnx.Intermediate)(case.make_input(), return_steps=True)
    actual = flat_steps(sown)
    assert set(actual) == set(expected) == set(returned)
    assert "heads.1.attn_weights" in actual
    for name, value in expected.items():
        np.testing.assert_array_equal(actual[name], value)
    assert not nnx.state(module, nnx.Intermediate)


@pytest.mark.parametrize("layer", LAYERS)
def test_nnx_vmap_over_a_batch_of_inputs(layer):
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())
    xs = np.stack([case.with_(seed=seed).make_input() for seed in range(3)])
    actual = nnx.vmap(lambda m, x: m(x), in_axes=(None, 0))(module, xs)
    expected = np.stack([np.asarray(module(x)) for x in xs])
    assert_close(actual, expected)


@pytest.mark.parametrize("layer", ["MultiHeadAttentionWrapper", "FusedCausalAttention"])
def test_no_host_transfer_in_a_jitted_call(layer):
    case = module_case(layer)
    params = to_params(case.build_torch())
    x = jnp.asarray(case.make_input())
    for rngs in (None, nnx.Rngs(0)):  # eval mode, then train mode drawing from a stream
        module = getattr(jax_attn, layer).from_params(params, **case.kwargs(0.5), rngs=rngs)
        forward = nnx.jit(lambda m, x: m(x))
        forward(module, x)  # compiles
        with jax.transfer_guard("disallow"):
            forward(module, x)


def test_call_time_deterministic_and_rngs_override_the_module_as_in_nnx_dropout():
    case = module_case("MultiHeadAttention")
    params, x = to_params(case.build_torch()), case.make_input()
    module = jax_attn.MultiHeadAttention.from_params(params, **case.kwargs(0.5))  # eval, no stream
    eval_output = np.asarray(module(x))
    first = np.asarray(module(x, deterministic=False, rngs=nnx.Rngs(dropout=3)))
    again = np.asarray(module(x, deterministic=False, rngs=nnx.Rngs(dropout=3)))
    other = np.asarray(module(x, deterministic=False, rngs=nnx.Rngs(dropout=4)))
    np.testing.assert_array_equal(first, again)
    assert not np.allclose(first, other) and not np.allclose(first, eval_output)
    module.train()
    with pytest.raises(ValueError, match="MultiHeadAttention is in train mode but has no dropout stream"):
        module(x)
    np.testing.assert_array_equal(module(x, deterministic=True), eval_output)


def test_the_wrapper_heads_draw_different_masks_from_its_stream():
    case = module_case("MultiHeadAttentionWrapper")
    torch_module = case.build_torch()
    torch_module.heads[1].load_state_dict(torch_module.heads[0].state_dict())  # two equal heads
    module = jax_attn.MultiHeadAttentionWrapper.from_params(
        to_params(torch_module), **case.kwargs(0.5), rngs=nnx.Rngs(0)
    )
    output = np.asarray(module(case.make_input()))
    assert not np.allclose(output[..., :8], output[..., 8:])
    module.eval()
    output = np.asarray(module(case.make_input()))
    assert_close(output[..., :8], output[..., 8:])


@pytest.mark.parametrize(
    "layer, args, kwargs, message",
    [
        ("SelfAttentionV2", (0, 4), {}, "d_in must be a positive int, got 0"),
        ("CausalAttention", (3, 4, -1, 0.0), {}, "context_length must be a positive int, got -1"),
        ("CausalAttention", (3, 4, 6, 1.0), {}, r"dropout must be in \[0, 1\), got 1.0"),
        ("MultiHeadAttention", (3, 4, 6, 0.0, 3), {}, "d_out=4 is not divisible by num_heads=3"),
        ("MultiHeadAttentionWrapper", (3, 4, 6, 0.0, 0), {}, "num_heads must be a positive int, got 0"),
        ("FusedSingleHeadAttention", (3,), {}, r"hidden_size=3 must be at least 4 .*hidden_size // 4"),
        ("FusedCausalAttention", (8, 2, 6, 0.1, -0.5), {}, r"out_drop must be in \[0, 1\), got -0.5"),
        ("FusedMultiHeadAttention", (8, 2), {"implementation": "fast"}, "implementation must be one of"),
        ("SelfAttentionV1", (3, 4), {"block_size": 0}, "block_size must be a positive int, got 0"),
    ],
)
def test_bad_constructor_arguments_raise_value_errors_naming_them(layer, args, kwargs, message):
    with pytest.raises(ValueError, match=message):
        getattr(jax_attn, layer)(*args, **kwargs, rngs=nnx.Rngs(0))


@pytest.mark.parametrize("layer", ["SelfAttentionV2", "MultiHeadAttention", "FusedCausalAttention"])
def test_bad_inputs_raise_the_functions_errors_word_for_word(layer):
    case = module_case(layer)
    params = to_params(case.build_torch())
    module = getattr(jax_attn, layer).from_params(params, **case.kwargs())
    function = getattr(jax_attn, case.function_name)
    x = case.make_input()
    for bad in (x.astype("float64"), x[..., :-1], x[..., None]):  # float64: without x64, its hint
        with pytest.raises((TypeError, ValueError)) as expected:
            function({k: v.astype(bad.dtype) for k, v in params.items()}, bad, **case.kwargs())
        with pytest.raises(expected.type, match=f"^{re.escape(str(expected.value))}$"):
            module(bad)


def the_functions_error(layer, params, **kwargs):
    """The error ``layer``'s jax_attn function raises for ``params``, ``kwargs`` (the module
    case's keyword arguments by default) and a float32 input."""
    case = module_case(layer)
    with pytest.raises((TypeError, ValueError)) as expected:
        getattr(jax_attn, case.function_name)(params, case.make_input(), **(case.kwargs() | kwargs))
    return expected


def raises_exactly(expected):
    return pytest.raises(expected.type, match=f"^{re.escape(str(expected.value))}$")


def retyped(params, dtype, keys=None):
    return {k: v.astype(dtype) if keys is None or k in keys else v for k, v in params.items()}


@pytest.mark.parametrize(
    "dtype, keys",
    [
        ("int32", None), ("bool", None), ("complex64", None), ("object", None), ("int64", ["W_key.weight"]),
        ("float64", ["W_value.weight"]), ("float64", ["out_proj.bias"]), ("float16", ["W_key.bias"]),
    ],
)  # fmt: skip
@pytest.mark.parametrize("load", ["from_params", "load_params"])
def test_weights_of_a_wrong_or_mixed_dtype_raise_the_functions_error(load, dtype, keys):
    """Not one floating dtype: the TypeError the function raises for a float32 x, word for word,
    instead of a cast (or JAX's own errors)."""
    case = module_case("MultiHeadAttention")
    bad = retyped(to_params(case.build_torch()), dtype, keys)
    expected = the_functions_error("MultiHeadAttention", bad)
    assert expected.type is TypeError and "but x has dtype float32" in str(expected.value)
    with raises_exactly(expected):
        if load == "from_params":
            jax_attn.MultiHeadAttention.from_params(bad, **case.kwargs())
        else:
            jax_attn.MultiHeadAttention(5, 8, 6, 0.0, 2, True, rngs=nnx.Rngs(0)).load_params(bad)


@pytest.mark.parametrize("load", ["from_params", "load_params"])
def test_big_endian_weights_are_named_with_their_byte_order(load):
    case = module_case("MultiHeadAttention")
    params = to_params(case.build_torch())
    params["W_key.weight"] = params["W_key.weight"].astype(">f4")
    message = (
        "params['W_key.weight'] has dtype >f4, big-endian; give it in the machine's byte order: "
        ".astype(np.float32)"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        if load == "from_params":
            jax_attn.MultiHeadAttention.from_params(params, **case.kwargs())
        else:
            jax_attn.MultiHeadAttention(5, 8, 6, 0.0, 2, True, rngs=nnx.Rngs(0)).load_params(params)


DTYPE_X64_MESSAGE = (
    "dtype=float64 needs JAX's 64-bit mode: call jax.config.update('jax_enable_x64', True) at start-up "
    "(or construct inside `with jax.enable_x64(True):`), or pass dtype=jnp.float32"
)


@pytest.mark.parametrize("source", SOURCES)
def test_float64_weights_without_x64_raise_the_functions_x64_error(source):
    """Not a float32 module built in silence: the functions' TypeError with its x64 hint, for
    the first weight instead of x; and for a float64 dtype given to a constructor, a message
    about the dtype argument (it said "dtype has dtype float64 ... or pass float32 arrays")."""
    case = module_case("MultiHeadAttention", "float64")
    params = {k: v.astype(np.float64) for k, v in to_params(case.build_torch()).items()}
    with jax.enable_x64(False), pytest.raises(TypeError) as expected:
        jax_attn.multi_head_attention(params, case.make_input(), **case.kwargs())
    assert str(expected.value).startswith("x has dtype float64, which JAX computes in float32 unless 64-bit")
    hint = str(expected.value).removeprefix("x")
    first = "params['W_query.weight']"
    with jax.enable_x64(True):  # a JAX float64 array is made in 64-bit mode
        weights = weights_from(source, case.build_torch())
    with jax.enable_x64(False):
        with pytest.raises(TypeError, match=f"^{re.escape(first + hint)}$"):
            jax_attn.MultiHeadAttention.from_params(weights, **case.kwargs())
        with pytest.raises(TypeError, match=f"^{re.escape(DTYPE_X64_MESSAGE)}$"):
            jax_attn.MultiHeadAttention(5, 8, 6, 0.0, 2, dtype=jnp.float64, rngs=nnx.Rngs(0))
    with jax.enable_x64(True):  # with x64 the module is float64
        module = jax_attn.MultiHeadAttention.from_params(weights, **case.kwargs())
        assert module.W_query.kernel[...].dtype == np.float64


BAD_CONTEXTS = [6.0, None, float("nan"), float("inf"), True, 0, -1]


@pytest.mark.parametrize("value", BAD_CONTEXTS, ids=repr)
@pytest.mark.parametrize("layer", ["MultiHeadAttention", "FusedCausalAttention"])
def test_a_bad_context_raises_the_functions_error_everywhere(layer, value):
    """The constructors, from_params and numpy_attn.constructor_arguments check the context
    length as the functions do (TypeError for a non-int, ValueError below 1), word for word."""
    case = module_case(layer)
    params = to_params(case.build_torch())
    name = "context_length" if layer == "MultiHeadAttention" else "context_size"
    kwargs = case.kwargs() | {name: value}
    expected = the_functions_error(layer, params, **kwargs)
    assert str(expected.value).startswith(f"{name} must be a positive int, got ")
    with raises_exactly(expected):
        getattr(jax_attn, layer).from_params(params, **kwargs)
    with raises_exactly(expected):
        getattr(jax_attn, layer)(**constructor_arguments(case) | kwargs, rngs=nnx.Rngs(0))
    with raises_exactly(expected):
        numpy_attn.constructor_arguments(layer, params, **kwargs)


@pytest.mark.parametrize("rngs", [0, None, jax.random.key(0)], ids=["int", "None", "key"])
def test_rngs_that_are_not_an_nnx_rngs_are_named(rngs):
    message = f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)), got {rngs!r} ({type(rngs).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.MultiHeadAttention(5, 8, 6, 0.0, 2, rngs=rngs)
    if rngs is not None:  # from_params without rngs: eval mode
        case = module_case("CausalAttention")
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            jax_attn.CausalAttention.from_params(to_params(case.build_torch()), **case.kwargs(), rngs=rngs)


CALL_RNGS_LAYERS = [
    layer for layer in LAYERS if "rngs" in inspect.signature(getattr(jax_attn, layer).__call__).parameters
]


@pytest.mark.parametrize("deterministic", [False, True], ids=["train", "eval"])
@pytest.mark.parametrize("rngs", [0, "seed", jax.random.key(0)], ids=["int", "str", "key"])
@pytest.mark.parametrize("layer", CALL_RNGS_LAYERS)
def test_a_calls_rngs_that_is_not_an_nnx_rngs_is_named(layer, rngs, deterministic):
    """Not 'int' object is not callable: the constructor's check, None allowed, in either mode."""
    assert len(CALL_RNGS_LAYERS) == 4  # the four layers with dropout
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs(0.5))
    x = case.make_input()
    message = f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)) or None, got {rngs!r} ({type(rngs).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        module(x, deterministic=deterministic, rngs=rngs)
    stream = nnx.Rngs(dropout=3)  # an nnx.Rngs or one of its streams is taken
    assert np.isfinite(np.asarray(module(x, deterministic=deterministic, rngs=stream.dropout))).all()
    assert np.isfinite(np.asarray(module(x, deterministic=deterministic, rngs=stream))).all()


@pytest.mark.parametrize("layer", LAYERS)
def test_signatures_are_the_torch_constructors_plus_flax_keywords(layer):
    expected = [*inspect.signature(getattr(torch_ref, layer)).parameters, "dtype", "implementation"]
    expected += ["block_size", "rngs"]
    actual = inspect.signature(getattr(jax_attn, layer)).parameters
    assert list(actual) == expected
    assert all(actual[name].kind is inspect.Parameter.KEYWORD_ONLY for name in expected[-4:])
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())
    call = inspect.signature(module).parameters  # a module's signature is its call's
    assert next(iter(call)) == "x" and "return_steps" in call


@pytest.mark.parametrize(
    "load, dtype, value",
    [("from_params", "float16", 1e5), ("load_params", "float16", 1e5), ("load_params", "bfloat16", 3.4e38)],
)
def test_finite_weights_that_overflow_the_module_dtype_raise_torch_refs_error(load, dtype, value):
    """1e5 is finite in float32 and inf in float16: not a module holding inf, but torch_ref's
    ValueError naming the key, the dtype and its largest value (numpy_attn's text, one check)."""
    case = module_case("MultiHeadAttention")
    good = to_params(case.build_torch())
    module = jax_attn.MultiHeadAttention.from_params(retyped(good, jnp.dtype(dtype)), **case.kwargs())
    before = module.to_params()
    params = good | {"out_proj.bias": good["out_proj.bias"].copy()}
    params["out_proj.bias"][1] = value
    message = (
        f"params['out_proj.bias'] has values too large for the module's dtype {dtype} "
        f"(largest finite {'65504' if dtype == 'float16' else '3.38953e+38'})"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        torch_ref.load_params(case.build_torch().to(getattr(torch, dtype)), params)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        numpy_attn.finite.check_cast_finite(params, dict.fromkeys(params, jnp.dtype(dtype)))
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        if load == "from_params":
            jax_attn.MultiHeadAttention.from_params(params, **case.kwargs(), dtype=dtype)
        else:
            module.load_params(params)
    assert all(np.array_equal(after, before[name]) for name, after in module.to_params().items())


def test_a_module_with_a_shared_submodule_gives_and_takes_every_torch_name():
    """``m.W_key = m.W_query`` (weight tying, kept by nnx.split/merge): to_params raised "params
    do not fit MultiHeadAttention: missing keys ['W_query.weight']" and load_params called the
    key "unexpected" (nnx.iter_graph gives a shared node under one path only)."""
    module = jax_attn.MultiHeadAttention(8, 8, 16, 0.0, 2, rngs=nnx.Rngs(0))
    module.W_key = module.W_query
    params = module.to_params()
    names = ["W_query.weight", "W_key.weight", "W_value.weight", "out_proj.weight", "out_proj.bias"]
    assert list(params) == names
    np.testing.assert_array_equal(params["W_key.weight"], params["W_query.weight"])
    other = jax_attn.MultiHeadAttention(8, 8, 16, 0.0, 2, rngs=nnx.Rngs(1)).to_params()
    tied = other | {"W_key.weight": other["W_query.weight"]}
    loaded = module.load_params(tied).to_params()
    assert jax.tree.all(jax.tree.map(np.array_equal, loaded, tied))
    assert module.W_key is module.W_query
    message = (
        "params['W_key.weight'] and params['W_query.weight'] share one variable in this module (tied "
        "weights) but differ: give them equal values"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        module.load_params(other)  # nothing written: one of the two would have been lost
    assert jax.tree.all(jax.tree.map(np.array_equal, module.to_params(), tied))


def test_a_modules_alias_attribute_is_no_torch_name_and_a_stray_parameter_is_refused():
    """``m.alias = m.W_query`` (a second reference to a submodule, under no torch name): to_params
    raised "params do not fit MultiHeadAttention: unexpected keys ['alias.weight']" although its
    weight is ``W_query.weight``. A parameter under no torch name at all was called an
    "unexpected key" of params that nobody gave."""
    module = jax_attn.MultiHeadAttention(8, 8, 16, 0.0, 2, rngs=nnx.Rngs(0))
    before = module.to_params()
    module.alias = module.W_query
    params = module.to_params()
    assert list(params) == list(before)
    assert jax.tree.all(jax.tree.map(np.array_equal, params, before))
    other = jax_attn.MultiHeadAttention(8, 8, 16, 0.0, 2, rngs=nnx.Rngs(1)).to_params()
    assert jax.tree.all(jax.tree.map(np.array_equal, module.load_params(other).to_params(), other))
    assert module.alias is module.W_query
    module.stray = nnx.Param(jnp.zeros(2))
    message = "MultiHeadAttention has parameters that its weights format has no name for: ['stray']"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        module.to_params()
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        module.load_params(other)


@pytest.mark.parametrize("value", ["no", 1, 0.0, jnp.array(True)], ids=["str", "int", "float", "jax_bool"])
@pytest.mark.parametrize("layer", CALL_RNGS_LAYERS)
def test_a_calls_deterministic_and_return_steps_must_be_bools(layer, value):
    """``deterministic="no"`` turned dropout off without a word (any truthy value did), and
    ``return_steps="no"`` returned the steps: check_flag's TypeError, as for qkv_bias; None (the
    module's mode) and NumPy bools are taken."""
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs(0.5))
    x = case.make_input()
    for name in ("deterministic", "return_steps"):
        message = f"{name} must be a bool, got {value!r} ({type(value).__name__})"
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            module(x, **{name: value})
    eval_output = np.asarray(module(x))
    for flag in (None, True, np.bool_(True)):
        np.testing.assert_array_equal(module(x, deterministic=flag), eval_output)
    output, steps = module(x, return_steps=np.bool_(True))
    np.testing.assert_array_equal(output, eval_output)
    np.testing.assert_array_equal(steps["output"], eval_output)


@pytest.mark.parametrize("layer", [layer for layer in LAYERS if layer not in CALL_RNGS_LAYERS])
def test_return_steps_must_be_a_bool_in_every_module_call(layer):
    case = module_case(layer)
    module = getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())
    with pytest.raises(TypeError, match=r"^return_steps must be a bool, got 'no' \(str\)$"):
        module(case.make_input(), return_steps="no")
