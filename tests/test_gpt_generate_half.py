"""Generation in bfloat16 and float16: the decoding path against torch_ref in that dtype (the tolerance
table's half-precision rows), and jax_attn.generate's program (16-bit weights in torch's layout)
against the public decoding functions."""

import functools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
import torch_ref
from jax_attn import generation as jax_generation
from parity_tests.compare import compare_arrays
from parity_tests.tolerances import tolerance_for
from tests.gpt_cases import TINY, token_ids, torch_model

TORCH_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16}


def torch_logits(dtype, ids):
    """torch_ref's GPTModel (seed 7) in ``dtype``: its logits for ``ids``, as float32 NumPy."""
    model = torch_model(seed=7).to(TORCH_DTYPES[dtype])
    with torch.no_grad():
        return model(torch.tensor(ids)).float().numpy()


# jax_attn's decoding step, jitted once for the module: the weights are an argument, so that the tests
# that decode the same shapes in the same dtype run the programs the first of them compiled
jitted_decode = jax.jit(functools.partial(jax_attn.gpt_model_decode, config=TINY))


def decoded_logits(package, weights, ids, prefill):
    """``prefill`` tokens at once, then one at a time, through the public gpt_model_decode (jitted in
    jax_attn): the logits of every position ``(B, T, V)``."""
    step, convert = functools.partial(numpy_attn.gpt_model_decode, config=TINY), np.asarray
    if package is jax_attn:
        step, convert = jitted_decode, jnp.asarray
    dtype = weights["tok_emb.weight"].dtype
    caches = package.init_gpt_cache(TINY, ids.shape[0], dtype)
    logits, caches = step(weights, convert(ids[:, :prefill]), caches)
    actual = [np.asarray(logits, np.float32)]
    for position in range(prefill, ids.shape[1]):
        logits, caches = step(weights, convert(ids[:, position : position + 1]), caches)
        actual.append(np.asarray(logits, np.float32))
    return np.concatenate(actual, axis=1)


@pytest.mark.parametrize(
    "package, dtype",
    [(jax_attn, "bfloat16"), (jax_attn, "float16"), (numpy_attn, "float16")],
    ids=["jax-bfloat16", "jax-float16", "numpy-float16"],
)
def test_half_precision_decoding_matches_torch_in_that_dtype(package, dtype):
    """The logits of a prompt's pass and the tokens decoded after it, against torch_ref's full pass
    in the same dtype, within the tolerance table's row for it (float32 accumulation in the products
    and the attention, as torch's CPU kernels)."""
    ids = token_ids(2, 12, seed=8)
    params = torch_ref.to_params(torch_model(seed=7))
    cast = (
        (lambda v: jnp.asarray(v, jnp.bfloat16)) if dtype == "bfloat16" else (lambda v: v.astype(np.float16))
    )
    weights = {name: cast(value) for name, value in params.items()}
    expected = torch_logits(dtype, ids)  # (B, T, V), computed in dtype
    actual = decoded_logits(package, weights, ids, prefill=4)  # the next test's prompt length
    rtol, atol = tolerance_for(dtype)  # both sides computed in dtype, compared as float32
    report = compare_arrays(f"{package.__name__} {dtype} logits", expected, actual, rtol=rtol, atol=atol)
    assert report.ok, report


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_the_generation_program_picks_the_argmax_of_the_public_decoding(dtype):
    """jax_attn.generate reads 16-bit weights in torch's layout (generation_params), accumulates a
    prompt's products in float32 and skips the empty cache on the prompt's pass: along the
    tokens it picks, the public gpt_model_decode's logits put each at their maximum, within the
    tolerance table's bound for the dtype (another summation order may round a near tie apart)."""
    params = torch_ref.to_params(torch_model(seed=7))
    weights = {name: jnp.asarray(value, dtype) for name, value in params.items()}
    model = jax_attn.GPTModel.from_params(weights, TINY)
    prompt = token_ids(2, 4, seed=9)
    actual = np.asarray(jax_attn.generate(model, jnp.asarray(prompt), 6))  # (2, 10)
    logits = decoded_logits(jax_attn, weights, actual, prefill=4)[:, 3:-1]  # (2, 6, V): each new token's
    picked = np.take_along_axis(logits, actual[:, 4:, None], axis=-1)[..., 0]  # (2, 6)
    rtol, atol = tolerance_for(dtype)
    assert (picked >= logits.max(axis=-1) - (atol + rtol * np.abs(logits).max())).all()
    assert (picked == logits.max(axis=-1)).mean() > 0.8  # mostly the very argmax


def test_16_bit_weights_are_read_in_torch_layout_made_once_per_model():
    """Each 16-bit weight reaches the program in torch's layout ``(out, in)``, made again only when
    the model holds other weights (a load_params)."""
    params = torch_ref.to_params(torch_model(seed=7))
    model = jax_attn.GPTModel.from_params({k: jnp.asarray(v, jnp.bfloat16) for k, v in params.items()}, TINY)
    stored, transposed = jax_generation.generation_params(model)
    assert transposed == frozenset()
    weight = stored["trf_blocks.0.ff.layers.0.weight"]  # torch's (4D, D) = (128, 32)
    np.testing.assert_array_equal(
        np.asarray(weight, np.float32),
        np.asarray(jnp.asarray(params["trf_blocks.0.ff.layers.0.weight"], jnp.bfloat16), np.float32),
    )
    assert jax_generation.generation_params(model)[0]["trf_blocks.0.ff.layers.0.weight"] is weight  # kept
    model.load_params({k: v * 2 for k, v in params.items()})
    again = jax_generation.generation_params(model)[0]["trf_blocks.0.ff.layers.0.weight"]
    assert again is not weight
    np.testing.assert_array_equal(
        np.asarray(again, np.float32),
        np.asarray(jnp.asarray(params["trf_blocks.0.ff.layers.0.weight"] * 2, jnp.bfloat16), np.float32),
    )


def float32_weight_shapes(computation, weight_shapes):
    """The shapes, of ``weight_shapes`` (either layout), of the float32 matrices in an HLO computation:
    its parameters' (a loop body's: the loop's carry) and its own instructions' (not those of the
    fusions it calls, each its own computation: a fused conversion is read in place)."""
    made = {tuple(map(int, dims)) for dims in re.findall(r"\bf32\[(\d+),(\d+)\]", computation)}
    return made & {shape for weight in weight_shapes for shape in (weight, weight[::-1])}


@pytest.mark.parametrize(
    "dtype, batch",
    [("bfloat16", 2), ("bfloat16", 1), ("float16", 1)],
    ids=["bfloat16-gemm", "bfloat16-gemv", "float16-gemv"],
)
def test_the_generation_program_converts_no_16_bit_weight_to_float32(dtype, batch):
    """XLA:CPU converts a 16-bit weight to float32 for a product it has no 16-bit kernel for. Where
    the decoding step's products read the weights as they are (jax_attn.generation.reads_16_bit: a
    bfloat16 model, a float16 one at batch 1), the loop's weights pass an optimization barrier
    (without it XLA hoists each weight's conversion out of the loop, and every step reads the
    float32 copy): no float32 copy of a weight is made in the loop. In bfloat16 the prompt's
    products ask for float32 accumulation, and XLA:CPU's GEMM reads the blocks: none before it."""
    params = torch_ref.to_params(torch_model(seed=7))
    model = jax_attn.GPTModel.from_params({k: jnp.asarray(v, dtype) for k, v in params.items()}, TINY)
    ids = jnp.asarray(token_ids(batch, 4, seed=9))
    arguments, static = jax_generation.program_arguments(model, ids, 6)
    program = jax_generation._generate.lower(*arguments, **static).compile().as_text()
    weights = [v for value in arguments[0].values() for v in (value if isinstance(value, tuple) else [value])]
    shapes = [weight.shape for weight in weights if weight.ndim == 2]
    computations = {part.split(" ", 1)[0]: part for part in program.split("\n\n")}
    body = computations[re.search(r" while\(.*body=(%[\w.]+)", program)[1]]
    assert float32_weight_shapes(body, shapes) == set()
    if dtype == "bfloat16":
        assert float32_weight_shapes(computations["ENTRY"], shapes) == set()


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_a_16_bit_model_decodes_on_a_cpu_with_float32_caches_of_the_same_tokens(dtype):
    """On a CPU, jax_attn.generate keeps a 16-bit model's keys and values in float32 caches (XLA:CPU
    would convert a 16-bit cache to float32 for each product): the caches hold the 16-bit values
    exactly and the attention's results are rounded to the model's dtype, so that the tokens are
    those of the same program with caches in the model's dtype. A float32 model's caches stay float32."""
    params = torch_ref.to_params(torch_model(seed=7))
    model = jax_attn.GPTModel.from_params({k: jnp.asarray(v, dtype) for k, v in params.items()}, TINY)
    ids = jnp.asarray(token_ids(2, 4, seed=9))
    arguments, static = jax_generation.program_arguments(model, ids, 40)
    assert static["cache_dtype"] == np.float32
    widened = np.asarray(jax_generation._generate(*arguments, **static)[0])
    as_model = np.asarray(
        jax_generation._generate(*arguments, **static | {"cache_dtype": np.dtype(dtype)})[0]
    )
    np.testing.assert_array_equal(widened, as_model)
    float32_model = jax_attn.GPTModel.from_params(params, TINY)
    assert jax_generation.program_arguments(float32_model, ids, 4)[1]["cache_dtype"] == np.float32
