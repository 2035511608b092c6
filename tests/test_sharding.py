"""jax_attn.parallel's sharding of the modules: every parameter of GPTModel and of each attention
module gets the split its layer calls for (column parallel: W_query, W_key, W_value, Wqkv and the
MLP's first layer on their output units; row parallel: out_proj, Wo and the MLP's second layer on
their input units; the rest replicated), written out below parameter by parameter; shard_model
places them so, and a sharded GPT computes what one device does.
"""

from __future__ import annotations

import os
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh, AxisType

import jax_attn
from jax_attn.parallel import param_spec, shard_batch, shard_model
from parity_tests.cases import Case
from parity_tests.tolerances import tolerance_for
from tests import parallel_checks
from tests.parallel_checks import measure
from torch_ref import to_params

pytestmark = pytest.mark.xdist_group("multi_device")  # as tests/test_parallel.py

COLUMN, COLUMN_BIAS = (None, "model"), ("model",)  # (in, out) kernels split on out, and their biases
ROW = ("model", None)  # (in, out) kernels split on in
REPLICATED = ()
QKV_TABLE = {f"{name}.{part}": split for name in ("W_query", "W_key", "W_value")
             for part, split in (("kernel", COLUMN), ("bias", COLUMN_BIAS))}  # fmt: skip
FUSED_TABLE = {"Wqkv.kernel": COLUMN, "Wqkv.bias": COLUMN_BIAS, "Wo.kernel": ROW, "Wo.bias": REPLICATED}
# layer (with biases, 2 heads) -> parameter path -> its split over the mesh's "model" axis
MODULE_TABLES = {
    "SelfAttentionV1": {"W_query": COLUMN, "W_key": COLUMN, "W_value": COLUMN},  # plain (in, out) Params
    "SelfAttentionV2": QKV_TABLE,
    "CausalAttention": QKV_TABLE,
    "MultiHeadAttentionWrapper": {
        f"heads.{i}.{path}": split for i in range(2) for path, split in QKV_TABLE.items()
    },
    "MultiHeadAttention": {**QKV_TABLE, "out_proj.kernel": ROW, "out_proj.bias": REPLICATED},
    "FusedSingleHeadAttention": FUSED_TABLE,
    "FusedMultiHeadAttention": FUSED_TABLE,
    "FusedCausalAttention": FUSED_TABLE,
}
BLOCK_TABLE = {
    **{f"att.{path}": split for path, split in QKV_TABLE.items()},
    "att.out_proj.kernel": ROW,
    "att.out_proj.bias": REPLICATED,  # added once, after the all-reduce
    "ff.layers.0.kernel": COLUMN,
    "ff.layers.0.bias": COLUMN_BIAS,
    "ff.layers.2.kernel": ROW,
    "ff.layers.2.bias": REPLICATED,
    **{f"{norm}.{part}": REPLICATED for norm in ("norm1", "norm2") for part in ("scale", "shift")},
}
# parallel_checks.GPT_CONFIG: one block, biases on the attention's projections
GPT_TABLE = {
    "tok_emb.embedding": REPLICATED,
    "pos_emb.embedding": REPLICATED,
    **{f"trf_blocks.0.{path}": split for path, split in BLOCK_TABLE.items()},
    "final_norm.scale": REPLICATED,
    "final_norm.shift": REPLICATED,
    "out_head.kernel": REPLICATED,
}
MEASURED_TABLES = {"gpt": GPT_TABLE, "multi_head_attention": MODULE_TABLES["MultiHeadAttention"],
                   "fused_causal_attention": MODULE_TABLES["FusedCausalAttention"]}  # fmt: skip


def trimmed(split) -> tuple:
    """A split without its trailing Nones: ``P(None, "model")`` and ``[None, "model"]`` alike, ``P()`` and
    ``[None, None]`` alike."""
    split = list(split)
    while split and split[-1] is None:
        split.pop()
    return tuple(split)


def params_of(model: nnx.Module) -> dict[str, nnx.Param]:
    """Every parameter of ``model`` by its dotted path."""
    return {
        ".".join(map(str, path)): node for path, node in nnx.iter_graph(model) if isinstance(node, nnx.Param)
    }


def build(layer: str) -> nnx.Module:
    """The Flax module of ``layer`` with biases and 2 heads (the GPT: ``parallel_checks.GPT_CONFIG``)."""
    if layer == "GPTModel":
        return jax_attn.GPTModel(parallel_checks.GPT_CONFIG, rngs=nnx.Rngs(0))
    case = Case(layer, tokens=4, d_in=8, d_out=16, num_heads=2, bias=True)
    return getattr(jax_attn, layer).from_params(to_params(case.build_torch()), **case.kwargs())


TABLES = {**MODULE_TABLES, "GPTModel": GPT_TABLE}


@pytest.mark.parametrize("layer", list(TABLES))
def test_param_spec_splits_every_parameter_as_the_table_says(layer):
    """Every parameter is in the table (W_key and W_value too) and gets its split on a (2, 2) mesh."""
    mesh = AbstractMesh((2, 2), ("data", "model"))
    params = params_of(build(layer))
    assert sorted(params) == sorted(TABLES[layer])
    actual = {
        path: trimmed(param_spec(path, param.get_value().shape, mesh)) for path, param in params.items()
    }
    assert actual == {path: trimmed(split) for path, split in TABLES[layer].items()}


@pytest.mark.parametrize("layer", list(TABLES))
def test_shard_model_places_every_parameter_as_the_table_says(layer):
    mesh = jax.make_mesh((1, 1), ("data", "model"), axis_types=(AxisType.Auto,) * 2)
    params = params_of(shard_model(build(layer), mesh))
    actual = {path: trimmed(param.get_value().sharding.spec) for path, param in params.items()}
    assert actual == {path: trimmed(split) for path, split in TABLES[layer].items()}


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> tuple[np.lib.npyio.NpzFile, dict]:
    """The 8-device subprocess's results (``parallel_checks.load``), computed once a run."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent
    return parallel_checks.load(root)


@pytest.mark.parametrize(
    "model, mesh", [(model, mesh) for model, (meshes, _) in parallel_checks.MODELS.items() for mesh in meshes]
)
def test_sharded_models_hold_every_parameter_as_the_table_says(checks, model, mesh):
    """Placed by shard_model on 8 devices: the split each parameter's array has."""
    actual = {path: trimmed(split) for path, split in measure(checks, f"{model}/{mesh}/specs").items()}
    assert actual == {path: trimmed(split) for path, split in MEASURED_TABLES[model].items()}


def test_data_parallel_gpt_memory_falls_with_devices(checks):
    one = measure(checks, "gpt_memory/1")
    for size in parallel_checks.DATA_SIZES[1:]:
        assert measure(checks, f"gpt_memory/{size}") <= 1.5 * one / size


def assert_close(expected: np.ndarray, actual: np.ndarray) -> None:
    rtol, atol = tolerance_for(expected.dtype, actual.dtype)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol + rtol * np.abs(expected).max())


def one_device_mesh(*names: str) -> jax.sharding.Mesh:
    return jax.make_mesh((1,) * len(names), names, axis_types=(AxisType.Auto,) * len(names))


def test_mesh_of_one_runs_the_gpt_unchanged():
    config = {
        "vocab_size": 32, "context_length": 4, "emb_dim": 8, "n_heads": 2, "n_layers": 1,
        "drop_rate": 0.0, "qkv_bias": False,
    }  # fmt: skip
    token_ids = jnp.asarray(np.random.default_rng(2).integers(0, 32, (2, 4)))
    model = jax_attn.GPTModel(config, rngs=nnx.Rngs(0))
    model.eval()
    expected = model(token_ids)
    mesh = one_device_mesh("data", "model")
    actual = nnx.jit(lambda model, ids: model(ids))(shard_model(model, mesh), shard_batch(token_ids, mesh))
    assert_close(np.asarray(expected), np.asarray(actual))


# bad input


@pytest.mark.parametrize(
    "call, error, message",
    [
        (lambda mesh: shard_batch([1.0, 2.0], mesh), TypeError, "x must be an array, got list"),
        (
            lambda mesh: shard_batch(np.float32(1), mesh),
            ValueError,
            "x must have a batch axis (B, ...), got shape ()",
        ),
        (
            lambda mesh: shard_batch(np.ones(2), None),
            TypeError,
            "mesh must be a jax.sharding.Mesh, got NoneType",
        ),
        (
            lambda mesh: shard_batch(np.ones(2), mesh, data_axis=None),
            ValueError,
            "data_axis None is not an axis of the mesh; its axes are ('data', 'model')",
        ),
        (
            lambda mesh: shard_batch(np.ones(2), AbstractMesh((1, 1), ("data", "model"))),
            TypeError,
            "shard_batch places arrays on devices: mesh must be a jax.sharding.Mesh of devices "
            "(jax.make_mesh), got an AbstractMesh",
        ),
        (
            lambda mesh: shard_model(None, mesh, model_axis=None),
            TypeError,
            "model must be an nnx.Module, got NoneType",
        ),
        (
            lambda mesh: shard_model(
                jax_attn.MultiHeadAttention(6, 6, 4, 0.0, num_heads=2, rngs=nnx.Rngs(0)),
                AbstractMesh((1, 1), ("data", "model")),
            ),
            TypeError,
            "shard_model places arrays on devices: mesh must be a jax.sharding.Mesh of devices "
            "(jax.make_mesh), got an AbstractMesh",
        ),
        (
            lambda mesh: param_spec("Wo.kernel", (4, 4), None),
            TypeError,
            "mesh must be a jax.sharding.Mesh, got NoneType",
        ),
    ],
    ids=[
        "list",
        "0-d",
        "mesh None",
        "data_axis None",
        "abstract batch",
        "model None",
        "abstract model",
        "spec",
    ],
)
def test_sharding_refuses_bad_arguments(call, error, message):
    """Before: AttributeError, IndexError, JAX's raw ValueError, or None returned silently."""
    with pytest.raises(error, match=f"^{re.escape(message)}$"):
        call(one_device_mesh("data", "model"))


def test_sharding_refuses_axes_not_in_the_mesh_and_uneven_splits():
    mesh = AbstractMesh((2, 4), ("data", "model"))
    model = jax_attn.MultiHeadAttention(6, 6, 4, 0.0, num_heads=2, rngs=nnx.Rngs(0))
    with pytest.raises(
        ValueError,
        match=re.escape("model_axis 'heads' is not an axis of the mesh; its axes are ('data', 'model')"),
    ):
        shard_model(model, mesh, model_axis="heads")
    with pytest.raises(
        ValueError,
        match=re.escape(
            "W_query.kernel of shape (6, 6): dimension 1 (6) is not divisible by the size 4 "
            "of mesh axis 'model'"
        ),
    ):
        param_spec("W_query.kernel", (6, 6), mesh)
    with pytest.raises(
        ValueError, match=re.escape("batch of shape (3, 4): B = 3 is not divisible by the size 2")
    ):
        shard_batch(jnp.zeros((3, 4)), mesh)


@pytest.mark.parametrize(
    "path, shape, expected",
    [
        ("trf_blocks.0.att.W_query.kernel", (8, 8), (None, "model")),  # column parallel: out axis
        ("trf_blocks.0.att.W_value.bias", (8,), ("model",)),
        ("Wqkv.kernel", (8, 24), (None, "model")),
        ("trf_blocks.0.ff.layers.0.kernel", (8, 32), (None, "model")),
        ("trf_blocks.0.att.out_proj.kernel", (8, 8), ("model", None)),  # row parallel: in axis
        ("trf_blocks.0.att.out_proj.bias", (8,), ()),  # added after the all-reduce: replicated
        ("Wo.kernel", (8, 8), ("model", None)),
        ("trf_blocks.0.ff.layers.2.kernel", (32, 8), ("model", None)),
        ("tok_emb.embedding", (32, 8), ()),
        ("trf_blocks.0.norm1.scale", (8,), ()),
        ("out_head.kernel", (8, 32), ()),
    ],
)
def test_param_spec_by_path(path, shape, expected):
    mesh = AbstractMesh((2, 2), ("data", "model"))
    assert tuple(param_spec(path, shape, mesh)) == expected
