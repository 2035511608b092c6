"""jax_attn.parallel's ring attention: sharded results equal single-device ones.

The multi-device checks run once, in a subprocess with 8 host CPU devices
(``tests/parallel_checks.py``); the tests here compare what it saved. The one-device cases (a
ring of one) and the bad-input errors run in this process. The sharding of the modules:
``tests/test_sharding.py``.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from jax.sharding import AbstractMesh, AxisType
from jax.sharding import PartitionSpec as P

from jax_attn import Masking, attend, scaled_dot_product_attention
from jax_attn.parallel import ring_attention
from parity_tests.tolerances import tolerance_for
from tests import parallel_checks
from tests.parallel_checks import measure, sides

# every test here on one pytest-xdist worker (pytest-xdist 3.8 under pytest 9.2 ignores the group:
# pytest-dev/pytest-xdist#1386; parallel_checks.load then still runs the subprocess once a run)
pytestmark = pytest.mark.xdist_group("multi_device")


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> tuple[np.lib.npyio.NpzFile, dict]:
    """The 8-device subprocess's results (``parallel_checks.load``), computed once a run."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent  # the run's folder, not the user's folder of all runs
    return parallel_checks.load(root)


def assert_close(expected: np.ndarray, actual: np.ndarray, dtype=None) -> None:
    rtol, atol = tolerance_for(dtype or expected.dtype, actual.dtype)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol + rtol * np.abs(expected).max())


@pytest.mark.subprocess  # collected first: the tests below read what it saved
def test_the_subprocess_saves_both_sides_of_every_check(checks):
    arrays, measures = checks
    assert measures["errors"] == {}, "\n".join(measures["errors"].values())
    expected = [f"{check}/{side}" for check in parallel_checks.CHECKS for side in ("expected", "actual")]
    assert sorted(arrays.files) == sorted(expected)


@pytest.mark.parametrize("check", parallel_checks.CHECKS)
def test_sharded_equals_single_device(checks, check):
    expected, actual = sides(checks, check)
    assert expected.shape == actual.shape
    assert_close(expected, actual)


@pytest.mark.parametrize("mesh", parallel_checks.RING_MESHES)
def test_ring_output_is_sharded_over_tokens(checks, mesh):
    _, _, axes, variants = parallel_checks.RING_MESHES[mesh]
    expected = str(P(axes.get("batch_axis"), axes.get("head_axis"), "seq"))
    for variant in variants:
        assert measure(checks, f"ring/{mesh}/{variant}/spec") == expected


def test_ring_memory_falls_with_the_ring(checks):
    """Per-device temporaries, forward and backward, fall at least as 1/devices (the score block
    is (T/P, T/P): they fall as 1/P^2)."""
    for direction in ("forward", "backward"):
        one = measure(checks, f"ring_memory/1/{direction}")
        for size in parallel_checks.RING_SIZES[1:]:
            assert measure(checks, f"ring_memory/{size}/{direction}") <= one / size


def test_ring_never_holds_the_whole_sequence(checks):
    """No array of the per-device program, forward or backward, has a T-long axis; the
    single-device program does (the (T, T) scores)."""
    num_tokens = parallel_checks.MEMORY_SHAPE[2]
    assert num_tokens in measure(checks, "reference_dims")
    for size in parallel_checks.RING_SIZES[1:]:
        assert max(measure(checks, f"ring_dims/{size}")) == num_tokens // size


def test_a_sharded_keep_mask_is_drawn_shard_by_shard(checks):
    """``draw_keep_mask`` merges only the last two axes: with the batch and the heads sharded,
    each device computes the random bits of its own (B/2, N/4, T * S) shard, no more."""
    b, n, t, s = parallel_checks.KEEP_MASK_SHAPE
    data, model = parallel_checks.MODEL_MESHES[parallel_checks.KEEP_MASK_MESH]
    shard = [b // data, n // model, t * s]
    bits_shapes = measure(checks, "keep_mask/bits_shapes")
    assert shard in bits_shapes
    assert max(np.prod(dims) for dims in bits_shapes) == np.prod(shard)


# one device, in this process


def one_device_mesh(*names: str) -> jax.sharding.Mesh:
    return jax.make_mesh((1,) * len(names), names, axis_types=(AxisType.Auto,) * len(names))


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16])
@pytest.mark.parametrize(
    "causal, padded, load_balance",
    [(True, False, False), (True, True, True), (False, True, False)],  # as parallel_checks' variants
)
def test_ring_of_one_equals_attend(causal, padded, load_balance, dtype):
    """Forward and gradients; half precision accumulates in float32 and comes back in its dtype."""
    rng = np.random.default_rng(1)
    queries, keys, values, weights = (jnp.asarray(rng.normal(size=(2, 3, 6, 4)), dtype) for _ in range(4))
    padding_mask = jnp.asarray(rng.random((2, 6)) < 0.4) if padded else None
    mesh = one_device_mesh("seq")

    def single(q, k, v):
        return attend(q, k, v, Masking(causal, padding_mask))[0]

    def ring(q, k, v):
        return ring_attention(
            q, k, v, mesh, causal=causal, padding_mask=padding_mask, load_balance=load_balance
        )

    def forward_and_grads(f):
        """``f``'s output and the gradients of ``(output * weights).sum()``, in one program (op by
        op, the two sides compiled 176)."""

        @jax.jit
        def both(q, k, v):
            output, pullback = jax.vjp(f, q, k, v)
            return output, *pullback(weights)

        return both(queries, keys, values)

    for expected, actual in zip(forward_and_grads(single), forward_and_grads(ring), strict=True):
        assert actual.dtype == dtype
        assert_close(np.asarray(expected, np.float32), np.asarray(actual, np.float32), dtype)


def test_ring_gives_zeros_for_a_fully_hidden_query():
    """Query 0 of a causal ring sees only key 0; padding hides it: a zero row, zero gradients."""
    queries = keys = values = jnp.ones((1, 1, 4, 2), jnp.float32)
    padding_mask = jnp.asarray([[True, False, False, False]])
    mesh = one_device_mesh("seq")
    actual = ring_attention(queries, keys, values, mesh, padding_mask=padding_mask)
    np.testing.assert_array_equal(np.asarray(actual[0, 0, 0]), [0.0, 0.0])
    grad = jax.grad(lambda q: ring_attention(q, keys, values, mesh, padding_mask=padding_mask).sum())(queries)
    assert np.isfinite(np.asarray(grad)).all()
    np.testing.assert_array_equal(np.asarray(grad[0, 0, 0]), [0.0, 0.0])


# bad input

SHAPE = (1, 2, 12, 4)  # (B, N, T, H)


def test_ring_refuses_tokens_not_divisible_by_the_ring():
    x = jnp.zeros(SHAPE)
    with pytest.raises(
        ValueError, match=r"T = 12 \(queries.shape\[2\]\) is not divisible by the size 8 of mesh axis 'seq'"
    ):
        ring_attention(x, x, x, AbstractMesh((8,), ("seq",)))
    with pytest.raises(ValueError, match=r"T = 12 .* not divisible by twice the size 4 of mesh axis 'seq'"):
        ring_attention(x, x, x, AbstractMesh((4,), ("seq",)), load_balance=True)


@pytest.mark.parametrize("argument", ["axis_name", "batch_axis", "head_axis"])
def test_ring_refuses_an_axis_not_in_the_mesh(argument):
    x = jnp.zeros(SHAPE)
    with pytest.raises(
        ValueError,
        match=re.escape(f"{argument} 'tokens' is not an axis of the mesh; its axes are ('data', 'seq')"),
    ):
        ring_attention(x, x, x, AbstractMesh((1, 2), ("data", "seq")), **{argument: "tokens"})


def test_ring_refuses_mismatched_shapes():
    x = jnp.zeros(SHAPE)
    mesh = AbstractMesh((2,), ("seq",))
    with pytest.raises(ValueError, match=r"one \(B, N, T, H\) shape, got \(1, 2, 12, 4\), \(1, 2, 10, 4\)"):
        ring_attention(x, jnp.zeros((1, 2, 10, 4)), jnp.zeros((1, 2, 10, 4)), mesh)
    with pytest.raises(
        ValueError,
        match=re.escape(
            "padding_mask must be a bool array of shape (B, S) = (1, 12), got bool array of shape (1, 10)"
        ),
    ):
        ring_attention(x, x, x, mesh, padding_mask=jnp.zeros((1, 10), bool))


def test_ring_refuses_an_abstract_mesh_of_more_devices_than_jax_has():
    """XLA failed at run time (JaxRuntimeError: no implementation of xla.sdy.GlobalToLocalShape);
    an AbstractMesh that fits runs as a Mesh of devices does."""
    x = jnp.asarray(np.random.default_rng(6).standard_normal(SHAPE), jnp.float32)
    message = (
        f"mesh is an AbstractMesh of 2 devices ({{'seq': 2}}), but JAX has {jax.device_count()}: "
        "pass a mesh of devices (jax.make_mesh) or one that fits"
    )
    assert jax.device_count() == 1  # the in-process tests see one device
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        ring_attention(x, x, x, AbstractMesh((2,), ("seq",)))
    np.testing.assert_array_equal(
        ring_attention(x, x, x, AbstractMesh((1,), ("seq",))), ring_attention(x, x, x, one_device_mesh("seq"))
    )


def _ring_arrays(case: str) -> tuple:
    """Bad (queries, keys, values) of SHAPE, seeded, and the error they get."""
    q = np.random.default_rng(3).standard_normal(SHAPE).astype(np.float32)
    return {
        "int32": (
            (q.astype(np.int32),) * 3,
            TypeError,
            "queries must have a floating dtype (float16, float32, float64; bfloat16 in jax_attn), "
            "got int32 with shape (1, 2, 12, 4)",
        ),
        "float64": (
            (q.astype(np.float64),) * 3,
            TypeError,
            "queries has dtype float64, which JAX computes in float32 unless 64-bit mode is on: call "
            "jax.config.update('jax_enable_x64', True) at start-up (or compute inside "
            "`with jax.enable_x64(True):`), or pass float32 arrays",
        ),
        "mixed": (
            (q, q.astype(np.float16), q),
            TypeError,
            "keys has dtype float16 but queries has dtype float32",
        ),
        "None": ((None, q, q), TypeError, "queries must be an array, got NoneType"),
        "list": ((q.tolist(), q, q), TypeError, "queries must be an array, got list"),
        "H=0": (
            (q[..., :0],) * 3,
            ValueError,
            "queries must have a head size H of at least 1, got shape (1, 2, 12, 0)",
        ),
    }[case]


@pytest.mark.parametrize("case", ["int32", "float64", "mixed", "None", "list", "H=0"])
def test_ring_checks_its_arrays_as_scaled_dot_product_attention(case):
    """The building blocks' shared checks, word for word (before: int32 attention, float64
    computed in float32, mixed dtypes run; AttributeError, ZeroDivisionError)."""
    arrays, error, message = _ring_arrays(case)
    mesh = one_device_mesh("seq")
    with jax.enable_x64(False):
        for call in (lambda: ring_attention(*arrays, mesh), lambda: scaled_dot_product_attention(*arrays)):
            with pytest.raises(error, match=f"^{re.escape(message)}$"):
                call()


def _bad_ring_call(case: str):
    x = jnp.asarray(np.random.default_rng(4).standard_normal(SHAPE), jnp.float32)
    empty = x[:, :, :0]
    seq, data_model_seq = one_device_mesh("seq"), AbstractMesh((2, 2, 2), ("data", "model", "seq"))
    uneven_batch, uneven_heads = jnp.zeros((3, 2, 8, 4)), jnp.zeros((2, 3, 8, 4))
    return {
        "T=0": lambda: ring_attention(empty, empty, empty, seq),
        "causal": lambda: ring_attention(x, x, x, seq, causal="no"),
        "load_balance": lambda: ring_attention(x, x, x, seq, load_balance=1),
        "float padding": lambda: ring_attention(x, x, x, seq, padding_mask=jnp.ones((1, 12))),
        "float padding, jit": lambda: jax.jit(lambda p: ring_attention(x, x, x, seq, padding_mask=p))(
            jnp.ones((1, 12))
        ),
        "mesh None": lambda: ring_attention(x, x, x, None),
        "axis_name None": lambda: ring_attention(x, x, x, seq, axis_name=None),
        "batch_axis = axis_name": lambda: ring_attention(x, x, x, seq, batch_axis="seq"),
        "head_axis = batch_axis": lambda: ring_attention(
            x, x, x, data_model_seq, batch_axis="data", head_axis="data"
        ),
        "B uneven": lambda: ring_attention(
            uneven_batch, uneven_batch, uneven_batch, data_model_seq, batch_axis="data"
        ),
        "N uneven": lambda: ring_attention(
            uneven_heads, uneven_heads, uneven_heads, data_model_seq, head_axis="model"
        ),
    }[case]


@pytest.mark.parametrize(
    "case, error, message",
    [
        ("T=0", ValueError, "queries must have at least one token, got shape (1, 2, 0, 4) for (B, N, T, H)"),
        ("causal", TypeError, "causal must be a bool, got 'no' (str)"),
        ("load_balance", TypeError, "load_balance must be a bool, got 1 (int)"),
        (
            "float padding",
            ValueError,
            "padding_mask must be a bool array of shape (B, S) = (1, 12), got float32 array of shape (1, 12)",
        ),
        (
            "float padding, jit",
            ValueError,
            "padding_mask must be a bool array of shape (B, S) = (1, 12), got float32 array of shape (1, 12)",
        ),
        ("mesh None", TypeError, "mesh must be a jax.sharding.Mesh, got NoneType"),
        ("axis_name None", ValueError, "axis_name None is not an axis of the mesh; its axes are ('seq',)"),
        (
            "batch_axis = axis_name",
            ValueError,
            "batch_axis 'seq' is axis_name too: a mesh axis can split only one of B, N and T",
        ),
        (
            "head_axis = batch_axis",
            ValueError,
            "head_axis 'data' is batch_axis too: a mesh axis can split only one of B, N and T",
        ),
        (
            "B uneven",
            ValueError,
            "B = 3 (queries.shape[0]) is not divisible by the size 2 of mesh axis 'data'",
        ),
        (
            "N uneven",
            ValueError,
            "N = 3 (queries.shape[1]) is not divisible by the size 2 of mesh axis 'model'",
        ),
    ],
)
def test_ring_refuses_bad_arguments(case, error, message):
    """Before: causal="no" ran causal, a float mask, T = 0, a repeated axis and mesh=None gave
    JAX's raw errors, and an uneven B or N shard_map's. (``str``: under ``jax.jit`` JAX adds a
    note on its traceback filtering, which ``match`` would read too.)"""
    with pytest.raises(error) as raised:
        _bad_ring_call(case)()
    assert str(raised.value) == message
