"""shard_model's tensor parallelism for the Llama 3 and Qwen3 decoders (grouped-query attention):
W_query, W_key, W_value, ff.fc1 and ff.fc2 split by output units (heads, SwiGLU's hidden units),
out_proj and ff.fc3 by input units, norms (QK-norm's too), embeddings and out_head replicated (a
tied head's one embedding once), written out below parameter by parameter; a model axis that does
not divide the key/value heads (n_kv_groups) is refused. The 8-device half (logits against one
device, where every parameter went, the refusals) runs once in a subprocess,
``tests/decoder_sharding_checks.py``.
"""

from __future__ import annotations

import os
import re

import numpy as np
import pytest
from flax import nnx
from jax.sharding import AbstractMesh

import jax_attn
from jax_attn.parallel import param_spec
from parity_tests.tolerances import tolerance_for
from tests import decoder_sharding_checks as checks_module
from tests import parallel_checks
from tests.decoder_cases import LLAMA, QWEN
from tests.test_sharding import COLUMN, REPLICATED, ROW, params_of, trimmed

pytestmark = pytest.mark.xdist_group("multi_device")  # as tests/test_parallel.py

NORM_WEIGHT = {"Llama3Model": "weight", "Qwen3Model": "scale"}  # RMSNorm's weight, as torch_ref names it


def decoder_table(model: str, n_layers: int, tied: bool = False) -> dict[str, tuple]:
    """Parameter path -> its split over "model", for every parameter of ``model`` (QK-norm: Qwen3);
    ``tied``: with ``tie_embeddings``, whose one embedding ``nnx.iter_graph`` gives under the first of
    its paths, ``out_head.embedding``, replicated (right for the lookup and for the head)."""
    weight = NORM_WEIGHT[model]
    block = {
        "att.W_query.kernel": COLUMN,  # query heads
        "att.W_key.kernel": COLUMN,  # key/value heads
        "att.W_value.kernel": COLUMN,
        "att.out_proj.kernel": ROW,
        **{f"att.{norm}.{weight}": REPLICATED for norm in ("q_norm", "k_norm") if model == "Qwen3Model"},
        "ff.fc1.kernel": COLUMN,  # gate
        "ff.fc2.kernel": COLUMN,  # up
        "ff.fc3.kernel": ROW,  # down
        f"norm1.{weight}": REPLICATED,
        f"norm2.{weight}": REPLICATED,
    }
    return {
        "out_head.embedding" if tied else "tok_emb.embedding": REPLICATED,
        **{f"trf_blocks.{i}.{path}": split for i in range(n_layers) for path, split in block.items()},
        f"final_norm.{weight}": REPLICATED,
        **({} if tied else {"out_head.kernel": REPLICATED}),
    }


@pytest.mark.parametrize(
    "model, cfg, tied",
    [("Llama3Model", LLAMA, False), ("Qwen3Model", QWEN, False), ("Qwen3Model", QWEN, True)],
)
def test_param_spec_splits_every_decoder_parameter_as_the_table_says(model, cfg, tied):
    mesh = AbstractMesh((4, 2), ("data", "model"))
    params = params_of(getattr(jax_attn, model)(cfg, tie_embeddings=tied, rngs=nnx.Rngs(0)))
    table = decoder_table(model, cfg["n_layers"], tied)
    assert sorted(params) == sorted(table)
    actual = {
        path: trimmed(param_spec(path, param.get_value().shape, mesh)) for path, param in params.items()
    }
    assert actual == {path: trimmed(split) for path, split in table.items()}


def test_param_spec_keeps_key_value_heads_whole():
    """The key/value kernel's 16 units divide by 4, its 2 heads do not: refused by heads."""
    mesh = AbstractMesh((2, 4), ("data", "model"))
    path = "trf_blocks.0.att.W_key.kernel"
    assert tuple(param_spec(path, (32, 16), mesh)) == (None, "model")  # units only: no heads known
    assert tuple(param_spec(path, (32, 32), mesh, kv_heads=4)) == (None, "model")
    with pytest.raises(
        ValueError,
        match="^"
        + re.escape(
            "trf_blocks.0.att.W_key.kernel of shape (32, 16): n_kv_groups = 2 (its key/value heads) "
            "is not divisible by the size 4 of mesh axis 'model'"
        )
        + "$",
    ):
        param_spec(path, (32, 16), mesh, kv_heads=2)
    # no model axis: nothing split, nothing checked
    assert tuple(param_spec(path, (32, 16), mesh, model_axis=None, kv_heads=2)) == ()


# the 8-device subprocess


@pytest.fixture(scope="module")
def checks(tmp_path_factory) -> tuple[np.lib.npyio.NpzFile, dict]:
    """The subprocess's results (``parallel_checks.load``), computed once a run."""
    root = tmp_path_factory.getbasetemp()
    if "PYTEST_XDIST_WORKER" in os.environ:
        root = root.parent
    arrays, measures = parallel_checks.load(root, "decoder_sharding_checks")
    assert measures["errors"] == {}, "\n".join(measures["errors"].values())
    return arrays, measures


SHARDED = [(case, mesh) for case, (_, _, meshes, _) in checks_module.CASES.items() for mesh in meshes]
REFUSED = [(case, mesh) for case, (_, _, _, meshes) in checks_module.CASES.items() for mesh in meshes]


@pytest.mark.subprocess  # collected first: the tests below read what it saved
def test_the_subprocess_saves_both_sides_of_every_check(checks):
    arrays, _ = checks
    expected = [f"{check}/{side}" for check in checks_module.CHECKS for side in ("expected", "actual")]
    assert sorted(arrays.files) == sorted(expected)
    for mesh in checks_module.MESHES:  # both models on every mesh
        assert {checks_module.CASES[case][0] for case, on in SHARDED if on == mesh} == set(NORM_WEIGHT)


@pytest.mark.parametrize("case, mesh", SHARDED)
def test_sharded_decoder_logits_equal_one_device(checks, case, mesh):
    arrays, _ = checks
    expected, actual = arrays[f"{case}/{mesh}/logits/expected"], arrays[f"{case}/{mesh}/logits/actual"]
    assert expected.shape == actual.shape == (checks_module.BATCH, checks_module.NUM_TOKENS, 61)
    rtol, atol = tolerance_for(expected.dtype, actual.dtype)
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol + rtol * np.abs(expected).max())


@pytest.mark.parametrize("case, mesh", SHARDED)
def test_sharded_decoders_hold_every_parameter_as_the_table_says(checks, case, mesh):
    model, cfg, _, _ = checks_module.CASES[case]
    actual = {path: trimmed(split) for path, split in checks[1][f"{case}/{mesh}/specs"].items()}
    table = decoder_table(model, cfg["n_layers"], case in checks_module.TIED)
    assert actual == {path: trimmed(split) for path, split in table.items()}


@pytest.mark.parametrize("case, mesh", REFUSED)
def test_shard_model_refuses_a_model_axis_that_splits_key_value_heads(checks, case, mesh):
    """2 key/value heads on a model axis of 4: ValueError naming W_key, its shape and the axis size,
    raised before any variable was placed."""
    model, cfg, _, _ = checks_module.CASES[case]
    width = cfg["n_kv_groups"] * cfg.get("head_dim", cfg["emb_dim"] // cfg["n_heads"])
    refused = checks[1][f"{case}/{mesh}/refused"]
    assert refused == {
        "message": f"trf_blocks.0.att.W_key.kernel of shape ({cfg['emb_dim']}, {width}): n_kv_groups = "
        f"{cfg['n_kv_groups']} (its key/value heads) is not divisible by the size "
        f"{checks_module.MESHES[mesh][1]} of mesh axis 'model'",
        "moved": [],
    }
