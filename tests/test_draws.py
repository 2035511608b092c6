"""jax_attn's random draws (dropout keep-masks, the modules' initial weights) have the bits of the
jax.random call they stand for, made with fewer axes so that XLA:CPU compiles them faster."""

import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from jax_attn.module_base import torch_normal, torch_uniform
from jax_attn.ops import draw_keep_mask

SHAPES = [(), (7,), (3, 5), (2, 3, 4)]
# (impl, threefry_partitionable): the generators jax.random offers
GENERATORS = [("threefry2x32", True), ("threefry2x32", False), ("rbg", True)]
# name -> (the project's draw, the jax.random call it stands for), each (key, shape)
DRAWS = {
    "keep_mask": (lambda key, shape: draw_keep_mask(key, 0.3, shape),
                  lambda key, shape: jax.random.bernoulli(key, 0.7, shape)),
    "torch_uniform": (lambda key, shape: torch_uniform(-0.5, 0.5)(key, shape, jnp.float32),
                      lambda key, shape: jax.random.uniform(key, shape, jnp.float32, -0.5, 0.5)),
    "torch_normal": (lambda key, shape: torch_normal(key, shape, jnp.float32),
                     lambda key, shape: jax.random.normal(key, shape, jnp.float32)),
}  # fmt: skip


@pytest.mark.parametrize("draw", DRAWS)
@pytest.mark.parametrize(("impl", "partitionable"), GENERATORS)
def test_a_draw_has_the_bits_of_its_jax_random_call(draw, impl, partitionable):
    ours, theirs = DRAWS[draw]
    with jax.threefry_partitionable(partitionable):
        keys = [jax.random.key(seed, impl=impl) for seed in range(len(SHAPES))]
        # every shape's two draws in one program (one compile where eight took 1.7x as long)
        draws = jax.jit(lambda keys: [(ours(k, s), theirs(k, s)) for k, s in zip(keys, SHAPES, strict=True)])
        for shape, (actual, expected) in zip(SHAPES, draws(keys), strict=True):
            assert actual.shape == shape and actual.dtype == expected.dtype
            np.testing.assert_array_equal(actual, expected)


@pytest.mark.parametrize(
    ("shape", "drawn"), [((2, 3, 4, 5), "2, 3, 20"), ((2, 6, 4), "2, 24"), ((3, 5), "15"), ((7,), "7")]
)
def test_a_draw_merges_its_last_two_axes_and_keeps_the_others(shape, drawn):
    """A (B, N, T, S) mask is drawn as (B, N, T * S): the batch and heads, which a mesh may shard,
    stay axes (tests/test_parallel.py checks that each device then draws its own shard); without
    the merge this fails."""
    jaxpr = jax.make_jaxpr(lambda key: draw_keep_mask(key, 0.5, shape))(jax.random.key(0))
    assert re.findall(r"random_bits\[bit_width=32 shape=\(([0-9, ]*?),?\)", str(jaxpr)) == [drawn]
