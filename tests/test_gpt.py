"""The book's GPT in three frameworks: the book's own weights load, every step matches torch_ref."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch
from flax import nnx
from llms_from_scratch import ch04

import jax_attn
import numpy_attn
import torch_ref
from parity_tests.compare import compare_arrays, compare_steps
from tests.gpt_cases import TINY, token_ids, torch_model
from tests.test_jax_modules import refuse_draws

NO_BIAS = TINY | {"qkv_bias": False}


def test_the_books_state_dict_loads_strictly_and_gives_the_books_logits():
    torch.manual_seed(3)
    book = ch04.GPTModel(TINY).eval()
    model = torch_ref.GPTModel(TINY).eval()
    model.load_state_dict(book.state_dict(), strict=True)
    ids = torch.tensor(token_ids())
    with torch.no_grad():
        expected, actual = book(ids), model(ids)
    assert torch.equal(expected, actual)


@pytest.mark.parametrize("config", [TINY, NO_BIAS], ids=["qkv_bias", "no_qkv_bias"])
def test_the_books_weights_in_numpy_and_jax_give_the_books_logits(config):
    torch.manual_seed(4)
    book = ch04.GPTModel(config).eval()
    params = {k: v.numpy() for k, v in book.state_dict().items() if not k.endswith(".att.mask")}
    ids = token_ids(config=config)
    with torch.no_grad():
        expected = book(torch.tensor(ids)).numpy()
    for actual in (
        numpy_attn.gpt_model(params, ids, config),
        jax_attn.gpt_model({k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(ids), config),
        jax_attn.GPTModel.from_params(params, config)(jnp.asarray(ids)),
    ):
        assert compare_arrays("logits", expected, actual).ok


@pytest.mark.parametrize("source", [ch04.GPTModel, torch_ref.GPTModel], ids=["book", "torch_ref"])
def test_a_state_dict_as_it_is_gives_the_logits_of_its_weights_at_every_entry_point(source):
    """The blocks' causal-mask buffers are ignored, as the attention modules' ``from_params``
    ignores theirs. Before: "params do not fit GPTModel: unexpected keys ['trf_blocks.0.att.mask',
    'trf_blocks.1.att.mask']" from each of these calls."""
    torch.manual_seed(6)
    model = source(TINY).eval()
    state_dict = model.state_dict()
    assert [name for name in state_dict if "mask" in name] == [
        "trf_blocks.0.att.mask",
        "trf_blocks.1.att.mask",
    ]
    as_is = {name: value.numpy() for name, value in state_dict.items()}
    weights = torch_ref.to_params(model)
    ids = token_ids()
    loaded = jax_attn.GPTModel.from_params(weights, TINY)
    calls = {
        "numpy gpt_model": lambda p: numpy_attn.gpt_model(p, ids, TINY),
        "numpy decode": lambda p: numpy_attn.gpt_model_decode(
            p, ids, numpy_attn.init_gpt_cache(TINY, 2), TINY
        ),
        "numpy generate": lambda p: numpy_attn.generate(p, ids[:, :3], TINY, 2),
        "jax gpt_model": lambda p: jax_attn.gpt_model(p, jnp.asarray(ids), TINY),
        # traced, not run (its eager ops compile for a second): the weights' check is what refused
        "jax decode": lambda p: jax.eval_shape(
            lambda p: jax_attn.gpt_model_decode(p, jnp.asarray(ids), jax_attn.init_gpt_cache(TINY, 2), TINY),
            p,
        ),
        "nnx from_params": lambda p: jax_attn.GPTModel.from_params(p, TINY).to_params(),
        "nnx load_params": lambda p: loaded.load_params(p).to_params(),
    }
    for name, call in calls.items():
        expected, actual = call(weights), call(as_is)
        assert jax.tree.all(jax.tree.map(np.array_equal, expected, actual)), name
    from_tensors = jax_attn.GPTModel.from_params(state_dict, TINY)  # torch tensors, as they are
    assert jax.tree.all(jax.tree.map(np.array_equal, from_tensors.to_params(), weights))


def test_every_step_of_every_block_matches_torch_ref():
    model = torch_model()
    ids = token_ids()
    with torch.no_grad():
        _, expected = model(torch.tensor(ids), return_steps=True)
    expected = {name: value.numpy() for name, value in expected.items()}
    params = torch_ref.to_params(model)
    _, actual_numpy = numpy_attn.gpt_model(params, ids, TINY, return_steps=True)
    _, actual_jax = jax_attn.GPTModel.from_params(params, TINY)(jnp.asarray(ids), return_steps=True)
    assert list(expected)[:7] == [
        "embeddings",
        *(f"trf_blocks.0.{s}" for s in numpy_attn.gpt_spec.BLOCK_STEPS),
    ]
    assert compare_steps(expected, actual_numpy).ok
    assert compare_steps(expected, actual_jax).ok


def test_the_jax_model_round_trips_the_weights_format_in_torch_order():
    expected = torch_ref.to_params(torch_model())
    actual = jax_attn.GPTModel.from_params(expected, TINY).to_params()
    assert list(actual) == list(expected) == list(numpy_attn.gpt_param_shapes(TINY))
    assert all(np.array_equal(actual[name], expected[name]) for name in expected)


def test_a_randomly_built_jax_model_loads_into_torch_and_agrees():
    model = jax_attn.GPTModel(NO_BIAS, rngs=nnx.Rngs(5))
    model.eval()
    params = model.to_params()
    ids = token_ids(config=NO_BIAS)
    expected_model = torch_ref.load_params(torch_ref.GPTModel(NO_BIAS).eval(), params)
    with torch.no_grad():
        expected = expected_model(torch.tensor(ids)).numpy()
    assert compare_arrays("logits", expected, model(jnp.asarray(ids))).ok
    # torch's initialisation: embeddings N(0, 1), LayerNorm ones, Linear within ±1/sqrt(in)
    assert 0.8 < params["tok_emb.weight"].std() < 1.2
    assert np.array_equal(params["final_norm.scale"], np.ones(NO_BIAS["emb_dim"], np.float32))
    assert np.abs(params["trf_blocks.0.ff.layers.2.weight"]).max() <= 1 / np.sqrt(4 * NO_BIAS["emb_dim"])


def test_the_jax_model_jits_and_its_gradient_matches_torch():
    model = torch_model()
    ids = token_ids()
    logits = model(torch.tensor(ids))
    logits.square().mean().backward()
    expected = {name: p.grad.numpy() for name, p in model.named_parameters()}

    jax_model = jax_attn.GPTModel.from_params(torch_ref.to_params(model), TINY)
    grads = nnx.jit(nnx.grad(lambda m, x: jnp.mean(jnp.square(m(x)))))(jax_model, jnp.asarray(ids))
    nnx.update(jax_model, grads)
    actual = jax_model.to_params()
    for name in expected:
        assert compare_arrays(name, expected[name], actual[name]).ok, name


def test_dropout_is_off_in_eval_mode_and_on_in_train_mode():
    config = TINY | {"drop_rate": 0.5, "n_layers": 1}  # each block's dropouts compile their own draws
    model = jax_attn.GPTModel(config, rngs=nnx.Rngs(params=0, dropout=1))
    forward = nnx.jit(lambda m, x: m(x))
    ids = jnp.asarray(token_ids())
    first, second = forward(model, ids), forward(model, ids)  # train mode: two different draws
    assert not np.allclose(first, second)
    model.eval()
    assert np.array_equal(forward(model, ids), forward(model, ids))
    params = model.to_params()
    expected = numpy_attn.gpt_model(params, np.asarray(ids), config)  # no rng: no dropout
    assert compare_arrays("logits", expected, forward(model, ids)).ok
    with_rng = numpy_attn.gpt_model(params, np.asarray(ids), config, rng=np.random.default_rng(0))
    keyed = jax_attn.gpt_model(params, ids, config, key=jax.random.key(0))
    assert not np.allclose(with_rng, expected) and not np.allclose(keyed, expected)


def test_changing_later_tokens_leaves_earlier_logits_unchanged():
    params = torch_ref.to_params(torch_model())
    ids = token_ids(1, 12)
    changed = ids.copy()
    changed[:, 8:] = (changed[:, 8:] + 1) % TINY["vocab_size"]
    expected = numpy_attn.gpt_model(params, ids, TINY)
    actual = numpy_attn.gpt_model(params, changed, TINY)
    assert compare_arrays("first 8 positions", expected[:, :8], actual[:, :8]).ok  # causal
    assert not np.allclose(actual[:, 8:], expected[:, 8:])


def test_numpy_weights_load_and_leave_without_compiling_a_program(caplog):
    """NumPy weights enter by ``jax.device_put`` and Linear kernels are transposed in NumPy, both
    ways: ``jnp.asarray`` and a JAX transpose would each compile a program per shape and dtype."""
    params = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0)).to_params()
    jax.clear_caches()  # no program of these shapes left from other tests
    with jax.log_compiles(True), caplog.at_level("WARNING"):
        model = jax_attn.GPTModel.from_params(params, TINY)
        loaded = model.to_params()
    assert [r.getMessage() for r in caplog.records if r.getMessage().startswith("Compiling")] == []
    for name, value in loaded.items():
        np.testing.assert_array_equal(value, params[name])


def test_from_params_draws_no_weight_and_has_no_dropout_stream_without_rngs(monkeypatch):
    params = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0)).to_params()
    refuse_draws(monkeypatch)
    model = jax_attn.GPTModel.from_params(params, TINY)
    assert model.to_params().keys() == params.keys()
    for name, value in model.to_params().items():
        np.testing.assert_array_equal(value, params[name])
    model.train()  # no stream to draw masks from
    with pytest.raises(ValueError, match=r"has no dropout stream|no `rngs` argument was provided"):
        model(jnp.asarray(token_ids()))


def test_the_jax_gpt_with_numpy_weights_jits_and_vmaps_over_the_ids():
    """NumPy weights, as load_weights returns them, closed over: the ids traced by ``jax.jit`` or
    ``jax.vmap`` used to index the NumPy embedding table (TracerArrayConversionError)."""
    params = torch_ref.to_params(torch_model())  # NumPy arrays
    ids = token_ids(2, 5)
    expected = numpy_attn.gpt_model(params, ids, TINY)  # (B, T, V)
    for actual in (
        jax.jit(lambda i: jax_attn.gpt_model(params, i, TINY))(ids),
        jax.vmap(lambda i: jax_attn.gpt_model(params, i[None], TINY)[0])(ids),
    ):
        assert compare_arrays("logits", expected, np.asarray(actual)).ok
    caches = jax_attn.init_gpt_cache(TINY, 2)
    logits, _ = jax.jit(lambda i, c: jax_attn.gpt_model_decode(params, i, c, TINY))(ids, caches)
    assert compare_arrays("decode logits", expected, np.asarray(logits)).ok


def test_a_config_with_an_unhashable_extra_key_works_at_every_entry_point():
    """Extra keys are allowed (a config read from config.json may hold a list): jax_attn.gpt_model
    and generate passed every item as a static jit argument and failed with JAX's "Non-hashable
    static arguments" error where numpy_attn and the module took the config."""
    config = TINY | {"architectures": ["GPT2LMHeadModel"]}
    params = torch_ref.to_params(torch_model())
    ids = token_ids(2, 5)
    expected = numpy_attn.gpt_model(params, ids, TINY)  # (B, T, V)
    caches = jax_attn.init_gpt_cache(config, 2)
    for label, actual in [
        ("numpy", numpy_attn.gpt_model(params, ids, config)),
        ("jax", jax_attn.gpt_model(params, ids, config)),
        ("jax under jit", jax.jit(lambda i: jax_attn.gpt_model(params, i, config))(ids)),
        ("module", jax_attn.GPTModel.from_params(params, config)(jnp.asarray(ids))),
        ("decode", jax_attn.gpt_model_decode(params, ids, caches, config)[0]),
        (
            "decode under jit",
            jax.jit(lambda i, c: jax_attn.gpt_model_decode(params, i, c, config))(ids, caches)[0],
        ),
    ]:
        assert compare_arrays(label, expected, np.asarray(actual)).ok
    generated = numpy_attn.generate(params, ids, TINY, 3)
    np.testing.assert_array_equal(numpy_attn.generate(params, ids, config, 3), generated)
    model = jax_attn.GPTModel.from_params(params, config)
    np.testing.assert_array_equal(jax_attn.generate(model, jnp.asarray(ids), 3), generated)


def test_a_model_with_shared_blocks_gives_and_takes_every_torch_name():
    """Block 1 is block 0 (weight sharing across layers, kept by nnx.split/merge): to_params
    raised a KeyError, as nnx.iter_graph gives a shared node under one path only. Different
    values for the two names of one variable are refused, naming both keys."""
    model = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0))
    model.trf_blocks[1] = model.trf_blocks[0]
    params = model.to_params()
    assert list(params) == list(numpy_attn.gpt_param_shapes(TINY))
    for name in params:
        if name.startswith("trf_blocks.1."):
            np.testing.assert_array_equal(params[name], params[name.replace(".1.", ".0.", 1)])
    other = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(1)).to_params()
    tied = {name: other[name.replace("trf_blocks.1.", "trf_blocks.0.")] for name in other}
    assert jax.tree.all(jax.tree.map(np.array_equal, model.load_params(tied).to_params(), tied))
    message = (
        "params['trf_blocks.0.att.W_key.bias'] and params['trf_blocks.1.att.W_key.bias'] share one variable "
        "in this module (tied weights) but differ: give them equal values"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model.load_params(other)
    assert jax.tree.all(jax.tree.map(np.array_equal, model.to_params(), tied))


def test_a_models_alias_attribute_is_no_torch_name_and_a_stray_parameter_is_refused():
    """``model.first_att = model.trf_blocks[0].att`` (a second reference to a submodule, under no
    torch name): load_params(to_params()) raised a bare KeyError ('first_att.W_key.bias'). A
    parameter under no torch name at all was left out of to_params without a word."""
    model = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0))
    before = model.to_params()
    model.first_att = model.trf_blocks[0].att
    params = model.to_params()
    assert list(params) == list(numpy_attn.gpt_param_shapes(TINY))
    assert jax.tree.all(jax.tree.map(np.array_equal, params, before))
    other = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(1)).to_params()
    assert jax.tree.all(jax.tree.map(np.array_equal, model.load_params(other).to_params(), other))
    assert model.first_att is model.trf_blocks[0].att
    model.stray = nnx.Param(jnp.zeros(2))
    message = "GPTModel has parameters that its weights format has no name for: ['stray']"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model.to_params()
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        model.load_params(other)


def test_the_models_return_steps_must_be_a_bool():
    model = jax_attn.GPTModel(TINY, rngs=nnx.Rngs(0))
    with pytest.raises(TypeError, match=r"^return_steps must be a bool, got 'no' \(str\)$"):
        model(token_ids(1, 4), return_steps="no")


def test_every_step_matches_torch_in_float64_in_numpy_jax_and_flax():
    """float64 parity, where a constant off in its 5th digit (GELU's 0.044715, LayerNorm's eps) shows:
    float32's tolerance would hide it."""
    model = torch_model(seed=9).double()
    ids = token_ids(seed=5)
    with torch.no_grad():
        _, expected = model(torch.tensor(ids), return_steps=True)
    expected = {name: value.numpy() for name, value in expected.items()}
    params = torch_ref.to_params(model)
    assert params["tok_emb.weight"].dtype == np.float64
    _, actual_numpy = numpy_attn.gpt_model(params, ids, TINY, return_steps=True)
    assert compare_steps(expected, actual_numpy).ok
    with jax.enable_x64(True):
        _, actual_jax = jax_attn.gpt_model(params, jnp.asarray(ids), TINY, return_steps=True)
        _, actual_flax = jax_attn.GPTModel.from_params(params, TINY)(jnp.asarray(ids), return_steps=True)
        assert compare_steps(expected, actual_jax).ok
        assert compare_steps(expected, actual_flax).ok
        report = compare_steps(expected, {"output": actual_jax["output"] * (1 + 1e-10)})
    assert not report.ok  # float64's bound is tight enough to see a relative error of 1e-10
