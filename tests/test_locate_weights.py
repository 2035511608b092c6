"""The automatic torch -> NNX weight mapping, checked by locate against the torch module itself."""

import functools

import numpy as np
import pytest
import torch
from flax import nnx

from parity_tests.locate import locate
from parity_tests.locate.weights import map_weights
from tests.ports.catalogue import inputs


def flax_mha():
    return nnx.MultiHeadAttention(num_heads=2, in_features=8, qkv_features=8, decode=False, rngs=nnx.Rngs(0))


def test_torch_multihead_attention_maps_onto_flax_multihead_attention():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    mapping = map_weights(mha.state_dict(), flax_mha())
    assert mapping.rows[:2] == (
        ("query.kernel", "in_proj_weight[q]", "transposed, reshaped to (8, 2, 4)"),
        ("query.bias", "in_proj_bias[q]", "reshaped to (2, 4)"),
    )
    assert mapping.rows[-2][:2] == ("out.kernel", "out_proj.weight")
    assert "key.kernel    <-  in_proj_weight[k]" in str(mapping)
    candidate = mapping.apply(flax_mha())
    x = inputs()
    report = locate(functools.partial(mha, need_weights=False), candidate, (x, x, x))
    assert report.ok, f"\n{report}"
    doubled = {**mha.state_dict(), "out_proj.weight": 2 * mha.state_dict()["out_proj.weight"]}
    wrong = map_weights(doubled, flax_mha()).apply(flax_mha())
    assert not locate(functools.partial(mha, need_weights=False), wrong, (x, x, x)).ok


def test_a_tensor_that_fits_nothing_is_named():
    state = {
        "in_proj_weight": np.zeros((24, 8)),
        "in_proj_bias": np.zeros(24),
        "out_proj.weight": np.zeros((8, 8)),
    }
    with pytest.raises(
        ValueError, match=r"no torch tensor left fits NNX parameter out\.bias of shape \(8,\)"
    ):
        map_weights(state, flax_mha())
    with pytest.raises(ValueError, match=r"left unmapped: extra\.weight"):
        map_weights({**state, "out_proj.bias": np.zeros(8), "extra.weight": np.zeros((3, 3))}, flax_mha())
