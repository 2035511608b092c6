"""numpy_attn and jax_attn mirror each other: the same public names, signatures and semantics.

The intended differences, and only these:
- randomness: numpy_attn takes ``rng`` (a ``numpy.random.Generator``), jax_attn ``key`` (a
  ``jax.random`` key), at the same position; the same seed gives different dropout masks;
- definitions that are framework-neutral live in numpy_attn alone and jax_attn reads them
  (``NUMPY_ONLY`` below): the layer specs and the checks built on them, the step-trace names,
  the implementations, and the weights files (which hold NumPy arrays for every framework);
- the GPT's framework-neutral definitions (its weight names and shapes, their check) and the
  Hugging Face GPT-2 folder reader/writer live in numpy_attn alone (jax_attn's ``GPTModel`` reads
  a folder with ``GPTModel.from_hf_gpt2``); so do the decoders' weight names and shapes and the
  Hugging Face folder reader/writer of every model (``load_hf``, ``save_hf``; jax_attn's ``from_hf``
  returns the folder's Flax model);
- ``attend``'s option groups (``Masking``, ``AttnDropout``, ``ComputePath``) and
  ``fuses_projections`` are framework-neutral and exported by both packages as the same objects
  (``AttnDropout.rng`` holds a ``jax.random`` key in jax_attn);
- ``parallel_heads`` (numpy_attn's blockwise heads on threads) is numpy_attn's alone: XLA spreads
  every operation of jax_attn over the cores itself;
- jax_attn adds the Flax NNX modules, one per layer spec, named as the torch classes, and the
  ``GPTModel``, ``Llama3Model`` and ``Qwen3Model`` NNX modules;
- ``generate``: jax_attn's takes the ``GPTModel`` (``generate(model, token_ids, max_new_tokens,
  ..., rng=key)``), numpy_attn's the weights and config (``generate(params, token_ids, config,
  max_new_tokens, ..., rng=generator)``); ``rng`` is a ``jax.random`` key in jax_attn's;
- ``KVCache.length`` is a Python int in numpy_attn and a JAX scalar in jax_attn (so that jitted
  decoding compiles once); both caches are values: a call returns a new one.
"""

import inspect

import jax
import numpy as np
import pytest

import jax_attn
import numpy_attn
from numpy_attn.spec import SPECS
from parity_tests.cases import Case
from parity_tests.frameworks import jax_context
from torch_ref import to_params

NUMPY_ONLY = {
    "IMPLEMENTATIONS", "LAYERS", "SPECS", "STEP_DOCS", "Steps", "check_layer",
    "constructor_arguments", "parameter_names", "parameter_shapes", "load_weights", "save_weights",
    "gpt_param_shapes", "check_gpt_params", "load_hf_gpt2", "save_hf_gpt2", "parallel_heads",
    "decoder_param_shapes", "load_hf", "save_hf",
}  # fmt: skip
JAX_ONLY = {*SPECS, "GPTModel", "Llama3Model", "Qwen3Model", "from_hf"}  # the Flax modules
OTHER_SIGNATURES = {"generate"}  # see the module's docstring
RANDOMNESS = {"rng": "key"}  # numpy_attn's argument -> jax_attn's
SHARED = sorted(set(numpy_attn.__all__) - NUMPY_ONLY)


def test_the_same_public_names_but_the_intended_differences():
    assert set(numpy_attn.__all__) - NUMPY_ONLY == set(jax_attn.__all__) - JAX_ONLY
    assert NUMPY_ONLY <= set(numpy_attn.__all__) and JAX_ONLY <= set(jax_attn.__all__)


def parameters(fn, renames=None):
    renames = renames or {}
    return [
        (renames.get(p.name, p.name), p.kind, p.default) for p in inspect.signature(fn).parameters.values()
    ]


SAME_OBJECTS = [n for n in SHARED if getattr(numpy_attn, n) is getattr(jax_attn, n)]


def test_the_framework_neutral_names_are_the_same_objects():
    assert sorted(SAME_OBJECTS) == ["AttnDropout", "ComputePath", "Masking", "fuses_projections"]


@pytest.mark.parametrize(
    "name",
    [
        n
        for n in SHARED
        if callable(getattr(numpy_attn, n)) and n not in OTHER_SIGNATURES and n not in SAME_OBJECTS
    ],
)
def test_the_same_signatures_but_rng_is_key(name):
    expected = parameters(getattr(numpy_attn, name), RANDOMNESS)
    actual = parameters(getattr(jax_attn, name))
    assert actual == expected


def test_the_same_kv_cache_fields():
    assert numpy_attn.KVCache._fields == jax_attn.KVCache._fields


DECODERS = {
    "MultiHeadAttention": "multi_head_attention_decode",
    "FusedCausalAttention": "fused_causal_attention_decode",
}


@pytest.mark.parametrize("layer", list(DECODERS))
@pytest.mark.parametrize("package", [numpy_attn, jax_attn], ids=["numpy", "jax"])
def test_kv_caches_are_values_the_callers_cache_is_never_changed(package, layer):
    case = Case(layer, batch=2, tokens=5, d_in=4, d_out=4, num_heads=2, dtype="float64", seed=3)
    params, x = to_params(case.build_torch()), case.make_input()
    context = {"context_length" if layer == "MultiHeadAttention" else "context_size": 5}
    decode = getattr(package, DECODERS[layer])
    with jax_context("float64"):
        empty = package.init_kv_cache(2, 2, 5, 2, np.float64)
        before = [np.array(field) for field in empty]
        first, prefilled = decode(params, x[:, :3], empty, num_heads=2, **context)
        after = [np.array(field) for field in empty]
        again, _ = decode(params, x[:, :3], empty, num_heads=2, **context)  # the same cache, reused
    for expected, actual in zip(before, after, strict=True):
        np.testing.assert_array_equal(actual, expected)
    np.testing.assert_array_equal(np.asarray(again), np.asarray(first))
    assert int(prefilled.length) == 3 and int(empty.length) == 0


@pytest.mark.parametrize("layer", list(DECODERS))
def test_kv_caches_hold_the_same_values_in_both(layer):
    case = Case(layer, batch=2, tokens=5, d_in=4, d_out=4, num_heads=2, dtype="float64", seed=4)
    params, x = to_params(case.build_torch()), case.make_input()
    context = {"context_length" if layer == "MultiHeadAttention" else "context_size": 5}
    caches = {}
    for package in (numpy_attn, jax_attn):
        with jax_context("float64"):
            cache = package.init_kv_cache(2, 2, 5, 2, np.float64)
            _, cache = getattr(package, DECODERS[layer])(params, x[:, :4], cache, num_heads=2, **context)
        caches[package.__name__] = cache
    expected, actual = caches["numpy_attn"], caches["jax_attn"]
    assert isinstance(expected.length, int) and isinstance(actual.length, jax.Array)
    for name in ("keys", "values", "padding"):
        np.testing.assert_allclose(np.asarray(getattr(actual, name)), getattr(expected, name), rtol=1e-12)
