"""Bad input to the GPT: the same ValueError, naming the problem, in numpy_attn and jax_attn."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx

import jax_attn
import numpy_attn
import torch_ref
from tests.gpt_cases import TINY, token_ids, torch_model


@pytest.fixture(scope="module")
def params():
    return torch_ref.to_params(torch_model())


def numpy_call(params, ids, config):
    return numpy_attn.gpt_model(params, ids, config)


def jax_call(params, ids, config):
    return jax_attn.gpt_model(params, jnp.asarray(ids), config)


def module_call(params, ids, config):
    return jax_attn.GPTModel.from_params(params, config)(jnp.asarray(ids))


CALLS = pytest.mark.parametrize("call", [numpy_call, jax_call, module_call], ids=["numpy", "jax", "nnx"])


@CALLS
@pytest.mark.parametrize("bad_id", [-1, TINY["vocab_size"]], ids=["negative", "vocab_size"])
def test_token_ids_outside_the_vocabulary(params, call, bad_id):
    ids = token_ids(2, 5)
    ids[1, 3] = bad_id
    with pytest.raises(
        ValueError, match=r"token_ids hold ids in \[-?\d+, \d+\], outside the vocabulary \[0, 61\)"
    ):
        call(params, ids, TINY)


@CALLS
def test_more_tokens_than_the_context_length(params, call):
    with pytest.raises(ValueError, match="token_ids has T=17 tokens, more than context_length 16"):
        call(params, token_ids(1, 17), TINY)


@CALLS
def test_an_empty_batch_of_token_ids(params, call):
    """One rule for every GPT entry point (check_token_ids): generate's caches need B >= 1."""
    message = "token_ids must have shape (B, T) with B >= 1 and T >= 1, got (0, 4)"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(params, token_ids(0, 4), TINY)


def test_torch_ref_refuses_more_tokens_than_the_context_length():
    with pytest.raises(ValueError, match="token_ids has 17 tokens, more than context_length 16"):
        torch_model()(torch.tensor(token_ids(1, 17)))


@CALLS
def test_float_token_ids(params, call):
    with pytest.raises(TypeError, match="token_ids must be an integer array"):
        call(params, token_ids(1, 4).astype(np.float32), TINY)


@CALLS
def test_a_config_missing_keys(params, call):
    config = {k: v for k, v in TINY.items() if k not in ("n_heads", "qkv_bias")}
    with pytest.raises(ValueError, match=r"config is missing keys \['n_heads', 'qkv_bias'\]"):
        call(params, token_ids(1, 4), config)


def test_torch_ref_and_the_jax_constructor_refuse_a_config_missing_keys():
    config = {k: v for k, v in TINY.items() if k != "emb_dim"}
    with pytest.raises(ValueError, match=r"config is missing keys \['emb_dim'\]"):
        torch_ref.GPTModel(config)
    with pytest.raises(ValueError, match=r"config is missing keys \['emb_dim'\]"):
        jax_attn.GPTModel(config, rngs=None)


@CALLS
def test_a_config_contradicting_the_weights(params, call):
    config = TINY | {"n_layers": 3, "qkv_bias": False, "context_length": 20}
    with pytest.raises(
        ValueError, match=r"params do not fit GPTModel: missing keys \['trf_blocks\.2\."
    ) as error:
        call(params, token_ids(1, 4), config)
    message = str(error.value)
    assert "unexpected keys ['trf_blocks.0.att.W_key.bias'" in message
    assert "'pos_emb.weight' has shape (16, 32), expected (20, 32)" in message


@CALLS
def test_heads_that_do_not_divide_the_width(params, call):
    with pytest.raises(ValueError, match="emb_dim"):
        call(params, token_ids(1, 4), TINY | {"n_heads": 3})


@CALLS
def test_a_state_dict_with_other_keys_than_its_buffers_is_refused_naming_them(params, call):
    """The blocks' causal-mask buffers are ignored whatever their values, as the attention modules'
    ``from_params`` ignores theirs; any other key, a mask of a block the config lacks included,
    is named as before."""
    masks = {"trf_blocks.0.att.mask": np.ones(1, np.float32), "trf_blocks.1.att.mask": np.ones((16, 16))}
    extra = {"trf_blocks.2.att.mask": np.ones((16, 16)), "out_head.bias": np.zeros(61, np.float32)}
    message = "params do not fit GPTModel: unexpected keys ['out_head.bias', 'trf_blocks.2.att.mask']"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(params | masks | extra, token_ids(1, 4), TINY)


def test_loading_bad_weights_into_a_jax_model_leaves_it_untouched(params):
    model = jax_attn.GPTModel.from_params(params, TINY)
    bad = dict(params) | {"out_head.weight": np.full((61, 32), np.nan, np.float32)}
    with pytest.raises(ValueError, match=r"params\['out_head.weight'\] has non-finite values"):
        model.load_params(bad)
    del bad["final_norm.scale"]
    with pytest.raises(ValueError, match=r"missing keys \['final_norm.scale'\]"):
        model.load_params(bad)
    actual = model.to_params()
    assert all(np.array_equal(actual[name], params[name]) for name in params)


@pytest.mark.parametrize("rngs", [0, "seed"], ids=["int", "str"])
def test_rngs_that_are_not_an_nnx_rngs_are_named(params, rngs):
    """Not ``'int' object is not subscriptable``: a TypeError naming rngs, what it must be and
    what was given, from the constructor and from from_params."""
    message = f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)), got {rngs!r} ({type(rngs).__name__})"
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel(TINY, rngs=rngs)
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.GPTModel.from_params(params, TINY, rngs=rngs)


def load_call(params, ids, config):
    model = jax_attn.GPTModel.from_params(torch_ref.to_params(torch_model()), config)
    return model.load_params(params)(jnp.asarray(ids))


def one_changed(params, name, dtype):
    return {**params, name: params[name].astype(dtype)}


@pytest.mark.parametrize(
    "call", [numpy_call, jax_call, module_call, load_call], ids=["numpy", "jax", "nnx", "load"]
)
@pytest.mark.parametrize(
    "change, message",
    [
        (lambda p: one_changed(p, "out_head.weight", np.float64),
         "params['out_head.weight'] has dtype float64 but params['tok_emb.weight'] has dtype float32"),
        (lambda p: one_changed(p, "final_norm.shift", np.int64),
         "params['final_norm.shift'] has dtype int64 but params['tok_emb.weight'] has dtype float32"),
        (lambda p: {k: v.astype(">f4") for k, v in p.items()},
         "params['tok_emb.weight'] has dtype >f4, big-endian; give it in the machine's byte order: "
         ".astype(np.float32)"),
    ],
    ids=["float64_among_float32", "int64_among_float32", "big_endian"],
)  # fmt: skip
def test_the_weights_share_one_floating_dtype_the_first_weights(params, call, change, message):
    """As a layer's weights must have x's dtype, the GPT's must have its first weight's: numpy
    promoted the logits to float64 (or took integer weights), JAX and the module cast silently."""
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        call(change(params), token_ids(2, 5), TINY)


@pytest.mark.parametrize("call", [jax_call, module_call], ids=["jax", "nnx"])
def test_float64_weights_without_x64_are_refused_by_the_jax_gpt(params, call):
    """Without JAX's 64-bit mode a float64 model computed in float32, without a word."""
    weights = {k: v.astype(np.float64) for k, v in params.items()}
    with pytest.raises(
        TypeError, match=r"^params\['tok_emb.weight'\] has dtype float64, which JAX computes in float32"
    ):
        call(weights, token_ids(2, 5), TINY)


def test_a_float64_kv_cache_without_x64_is_refused():
    """jax_attn.init_kv_cache(dtype=float64) made float32 arrays without x64."""
    message = (
        "dtype=float64 needs JAX's 64-bit mode: call jax.config.update('jax_enable_x64', True) at start-up "
        "(or construct inside `with jax.enable_x64(True):`), or pass dtype=jnp.float32"
    )
    with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
        jax_attn.init_kv_cache(2, 2, 8, 2, dtype=np.float64)


@CALLS
@pytest.mark.parametrize(
    "key, value, error, message",
    [
        ("n_layers", 2.0, TypeError, "config['n_layers'] must be a positive int, got 2.0 (float)"),
        ("emb_dim", True, TypeError, "config['emb_dim'] must be a positive int, got True (bool)"),
        ("vocab_size", 0, ValueError, "config['vocab_size'] must be a positive int, got 0"),
    ],
)
def test_config_sizes_follow_the_one_size_rule(params, call, key, value, error, message):
    """TypeError for a size that is not an int, ValueError below 1: ``check_size``, as every size."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(params, token_ids(1, 4), TINY | {key: value})


@pytest.mark.parametrize("params_given", [[1, 2], None], ids=["list", "None"])
def test_the_jax_model_refuses_weights_that_are_not_a_mapping(params_given):
    """The weights format's TypeError (not dict()'s "cannot convert dictionary update sequence")."""
    message = f"^params must be a mapping of str to arrays, got {type(params_given).__name__}$"
    with pytest.raises(TypeError, match=message):
        jax_attn.GPTModel.from_params(params_given, TINY)
    with pytest.raises(TypeError, match=message):
        jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0)).load_params(params_given)


# ------------------------------------------------- the GPT's building blocks: gelu, layer_norm, ...

PACKAGES = pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
FLOATING = "x must have a floating dtype (float16, float32, float64; bfloat16 in jax_attn), got "


def block_params(config=TINY):
    weights = torch_ref.to_params(torch_model(config))
    return numpy_attn.gpt_spec.sub_params(weights, "trf_blocks.0.")


def embeddings(batch=2, num_tokens=5, dtype=np.float32):
    return np.random.default_rng(2).standard_normal((batch, num_tokens, TINY["emb_dim"])).astype(dtype)


@PACKAGES
def test_gelu_refuses_what_it_cannot_compute(package):
    """An integer x gave 0.5 * x (the constant sqrt(2/pi) cast to 0), None an AttributeError."""
    with pytest.raises(TypeError, match=f"^{re.escape(FLOATING)}int64 with shape \\(3,\\)$"):
        package.gelu(np.array([1, 2, 3]))
    with pytest.raises(TypeError, match=r"^x must be an array, got NoneType$"):
        package.gelu(None)
    expected = [0.841192, 1.954598, 2.996363]  # the tanh approximation at 1, 2, 3
    np.testing.assert_allclose(package.gelu(np.array([1.0, 2.0, 3.0], np.float32)), expected, rtol=1e-5)


def norm_params(width=TINY["emb_dim"], dtype=np.float32):
    return {"scale": np.ones(width, dtype), "shift": np.zeros(width, dtype)}


@PACKAGES
@pytest.mark.parametrize(
    "part, params, x, error, message",
    [
        ("layer_norm", norm_params(1), embeddings(), ValueError,
         "params do not fit LayerNorm: mis-shaped keys: 'scale' has shape (1,), expected (32,); "
         "'shift' has shape (1,), expected (32,)"),
        ("layer_norm", {"scale": np.ones(32, np.float32), "bias": np.ones(32, np.float32)}, embeddings(),
         ValueError, "params do not fit LayerNorm: missing keys ['shift']; unexpected keys ['bias']"),
        ("layer_norm", norm_params(), embeddings(dtype=np.float16), TypeError,
         "params['scale'] has dtype float32 but x has dtype float16"),
        ("layer_norm", norm_params(), None, TypeError, "x must be an array, got NoneType"),
        ("layer_norm", norm_params(), np.float32(1.0), ValueError,
         "x must have shape (..., D) with D >= 1, got shape ()"),
        ("layer_norm", norm_params(), embeddings().astype(np.int64), TypeError,
         FLOATING + "int64 with shape (2, 5, 32)"),
        ("feed_forward", {}, embeddings(), ValueError,
         "params do not fit FeedForward: missing keys ['layers.0.weight', 'layers.0.bias', "
         "'layers.2.weight', 'layers.2.bias']"),
        ("feed_forward", numpy_attn.gpt_spec.sub_params(block_params(), "ff."), embeddings()[..., :8],
         ValueError,
         "params do not fit FeedForward: mis-shaped keys: 'layers.0.weight' has shape (128, 32), "
         "expected (32, 8); 'layers.0.bias' has shape (128,), expected (32,); 'layers.2.weight' has "
         "shape (32, 128), expected (8, 32); 'layers.2.bias' has shape (32,), expected (8,)"),
    ],
    ids=["norm_width_1", "norm_keys", "float16_x", "x_none", "x_0d", "x_int", "ff_empty", "ff_width"],
)  # fmt: skip
def test_layer_norm_and_feed_forward_check_x_and_their_weights(package, part, params, x, error, message):
    """A (1,) scale broadcast silently, float16 x became float32, missing weights were KeyErrors,
    a wrong width NumPy's or JAX's own broadcast error: the building blocks' rules now, one text."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        getattr(package, part)(params, x)


@PACKAGES
def test_layer_norm_and_feed_forward_give_the_models_steps(package):
    """The checked parts compute what the model's unchecked ones do."""
    params = torch_ref.to_params(torch_model())
    _, steps = numpy_attn.gpt_model(params, token_ids(2, 5), TINY, return_steps=True)
    block = numpy_attn.gpt_spec.sub_params(params, "trf_blocks.0.")
    norm1 = package.layer_norm(numpy_attn.gpt_spec.sub_params(block, "norm1."), steps["embeddings"])
    np.testing.assert_allclose(norm1, steps["trf_blocks.0.norm1"], rtol=1e-5, atol=1e-6)
    ff = package.feed_forward(numpy_attn.gpt_spec.sub_params(block, "ff."), steps["trf_blocks.0.norm2"])
    np.testing.assert_allclose(ff, steps["trf_blocks.0.ff"], rtol=1e-5, atol=1e-5)
    output = package.transformer_block(block, steps["embeddings"], num_heads=2, context_length=16)
    np.testing.assert_allclose(output, steps["trf_blocks.0.output"], rtol=1e-5, atol=1e-5)


@PACKAGES
@pytest.mark.parametrize(
    "change, error, message",
    [
        ({"x": embeddings().astype(np.int64)}, TypeError, FLOATING + "int64 with shape (2, 5, 32)"),
        ({"x": embeddings()[0]}, ValueError, "x must have shape (B, T, D), got shape (5, 32) (rank 2)"),
        ({"params": lambda p: {k: v for k, v in p.items() if k != "norm2.shift"} | {"norm3.shift": 0}},
         ValueError, "params do not fit TransformerBlock: missing keys ['norm2.shift']; "
         "unexpected keys ['norm3.shift']"),
        ({"params": lambda p: p | {"ff.layers.2.bias": np.zeros(31, np.float32)}}, ValueError,
         "params do not fit TransformerBlock: mis-shaped keys: 'ff.layers.2.bias' has shape (31,), "
         "expected (32,)"),
        ({"params": lambda p: p | {"norm1.scale": p["norm1.scale"].astype(np.float16)}}, TypeError,
         "params['norm1.scale'] has dtype float16 but x has dtype float32"),
        ({"num_heads": 3}, ValueError, "emb_dim=32 is not divisible by num_heads=3"),
        ({"num_heads": 2.0}, TypeError, "num_heads must be a positive int, got 2.0 (float)"),
        ({"context_length": 4}, ValueError, "x has 5 tokens (shape (2, 5, 32)) but context_length is 4"),
        ({"dropout_rate": 1.0}, ValueError, "dropout_rate must be in [0, 1), got 1.0"),
    ],
    ids=["x_int", "x_rank_2", "keys", "width", "dtype", "heads", "heads_float", "context", "rate"],
)  # fmt: skip
def test_transformer_block_checks_its_call(package, change, error, message):
    """numpy_attn's block named a weight's dtype against float64 for an integer x (which
    jax_attn's ran), missing weights were KeyErrors: the block's checks, in both packages."""
    kwargs = {"num_heads": 2, "context_length": 16}
    params, x = block_params(), embeddings()
    for name, value in change.items():
        if name == "params":
            params = value(params)
        elif name == "x":
            x = value
        else:
            kwargs[name] = value
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        package.transformer_block(params, x, **kwargs)


# --------------------------------------------------------------------------- jax_attn's key

KEY_MESSAGE = "key must be a jax.random key (jax.random.key(seed)) or None, got "


def gpt_call(key):
    params = torch_ref.to_params(torch_model())
    return jax_attn.gpt_model(params, token_ids(1, 3), TINY | {"drop_rate": 0.1}, key=key)


def block_call(key):
    return jax_attn.transformer_block(
        block_params(), embeddings(), num_heads=2, context_length=16, dropout_rate=0.1, key=key
    )


@pytest.mark.parametrize("call", [gpt_call, block_call], ids=["gpt_model", "transformer_block"])
def test_the_jax_gpt_and_block_check_their_key(call):
    """key=0 gave JAX's "invalid PRNG key data", a NumPy Generator "Error interpreting argument
    ... as an abstract array" or "unexpected PRNG key type": now check_key's TypeError, as the
    layers and numpy_attn's rng."""
    with pytest.raises(TypeError, match=f"^{re.escape(KEY_MESSAGE)}0 \\(int\\)$"):
        call(0)
    generator = f"^{re.escape(KEY_MESSAGE)}Generator\\(PCG64\\) at 0x\\w+ \\(Generator\\)$"
    with pytest.raises(TypeError, match=generator):
        call(np.random.default_rng(0))
    assert np.isfinite(call(jax.random.key(0))).all()


@pytest.mark.parametrize(
    "call",
    [gpt_call, block_call, lambda key: jax_attn.dropout(jnp.ones(3), 0.5, key=key)],
    ids=["gpt_model", "transformer_block", "dropout"],
)
@pytest.mark.parametrize(
    "keys", [jax.random.split(jax.random.key(0), 2), jax.random.split(jax.random.PRNGKey(0), 2)],
    ids=["typed", "raw"],
)  # fmt: skip
def test_a_batch_of_keys_is_refused_naming_its_shape(call, keys):
    """check_key took jax.random.split(key, 2) as a key: dropout then raised JAX's "bernoulli
    accepts a single key"."""
    message = "key must be one jax.random key, got a batch of keys of shape (2,): pass one of them (key[0])"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        call(keys)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}"):  # JAX adds a note
        jax.jit(call)(keys)


def test_torch_token_ids_are_refused_as_the_layers_refuse_a_torch_tensor(params):
    """Before: NumPy's "Cannot interpret 'torch.int64' as a data type" from every GPT entry point."""
    ids = torch.tensor(token_ids(1, 3))
    message = (
        "token_ids is a torch.Tensor with dtype torch.int64, which NumPy cannot read: pass a NumPy or "
        "JAX array (a torch tensor t: t.detach().cpu().numpy(), bfloat16 after .float(); a torch "
        "module's weights: torch_ref.to_params(module))"
    )
    model = jax_attn.GPTModel.from_params(params, TINY)
    calls = {
        "numpy gpt_model": lambda: numpy_attn.gpt_model(params, ids, TINY),
        "jax gpt_model": lambda: jax_attn.gpt_model(params, ids, TINY),
        "nnx GPTModel": lambda: model(ids),
        "numpy decode": lambda: numpy_attn.gpt_model_decode(
            params, ids, numpy_attn.init_gpt_cache(TINY, 1), TINY
        ),
        "jax decode": lambda: jax_attn.gpt_model_decode(params, ids, jax_attn.init_gpt_cache(TINY, 1), TINY),
        "numpy generate": lambda: numpy_attn.generate(params, ids, TINY, 1),
        "jax generate": lambda: jax_attn.generate(model, ids, 1),
    }
    for call in calls.values():
        with pytest.raises(TypeError, match=f"^{re.escape(message)}$"):
            call()
    with pytest.raises(TypeError) as layer:  # the layers' text, but for the name
        numpy_attn.gelu(ids.float())
    assert str(layer.value) == message.replace("token_ids", "x").replace("int64", "float32")


def test_finite_weights_that_overflow_a_float16_jax_model_raise_torch_refs_error(params):
    """1e5 is finite in float32, inf in float16: torch_ref's ValueError, not a model holding inf."""
    model = jax_attn.GPTModel.from_params({k: v.astype(np.float16) for k, v in params.items()}, TINY)
    before = model.to_params()
    bad = dict(params) | {"final_norm.shift": np.full(TINY["emb_dim"], 1e5, np.float32)}
    message = (
        "params['final_norm.shift'] has values too large for the module's dtype float16 "
        "(largest finite 65504)"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        torch_ref.load_params(torch_model().half(), bad)
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model.load_params(bad)
    assert all(np.array_equal(value, before[name]) for name, value in model.to_params().items())
