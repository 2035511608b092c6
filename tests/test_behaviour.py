"""Behaviour, not only values: causality, dropout, padding and fully masked rows."""

import numpy as np
import pytest
import torch

import numpy_attn
from parity_tests.cases import CAUSAL_LAYERS, DROPOUT_LAYERS, Case
from parity_tests.compare import compare_steps
from parity_tests.frameworks import run_case, run_torch
from torch_ref import to_params


def causal_case(layer, dtype="float64"):
    return Case(layer, batch=2, tokens=7, d_in=5, d_out=6, num_heads=3, bias=True, dtype=dtype, seed=7)


@pytest.mark.parametrize("layer", CAUSAL_LAYERS)
@pytest.mark.parametrize("t", [0, 3, 6])
def test_later_tokens_do_not_change_earlier_outputs(layer, t):
    case = causal_case(layer)
    module = case.build_torch()
    params = to_params(module)
    x = case.make_input()
    x_changed = x.copy()
    x_changed[:, t + 1 :] = np.random.default_rng(1).standard_normal(x[:, t + 1 :].shape)
    outputs = {
        "numpy": [run_case("numpy", case, params, xs)[0] for xs in (x, x_changed)],
        "torch": [run_torch(module, xs)[0].detach().numpy() for xs in (x, x_changed)],
    }
    for before, after in outputs.values():
        np.testing.assert_array_equal(before[:, : t + 1], after[:, : t + 1])
        if t < 6:  # the later outputs do see the change
            assert not np.allclose(before[:, t + 1 :], after[:, t + 1 :])


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_training_mode_matches_torch_with_injected_keep_masks(layer, dtype):
    p = 0.3
    case = causal_case(layer, dtype)
    module = case.build_torch(dropout=p).train()
    x = case.make_input()
    rng = np.random.default_rng(42)
    masks = {"attn_keep_mask": rng.random(case.attn_shape) >= p}
    if layer == "FusedCausalAttention":
        masks["out_keep_mask"] = rng.random(x.shape) >= p
    expected_output, expected = run_torch(module, x, **masks)
    actual_output, actual = run_case("numpy", case, to_params(module), x, dropout=p, **masks)
    actual_output_eval = run_case("numpy", case, to_params(module), x)[0]

    report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    assert any(step.endswith("attn_weights_dropped") for step in actual)
    assert not np.allclose(actual_output, actual_output_eval)  # the masks did drop something


@pytest.mark.parametrize("layer", DROPOUT_LAYERS)
def test_dropout_happens_only_when_asked(layer):
    case = causal_case(layer)
    params = to_params(case.build_torch())
    x = case.make_input()
    kwargs = {**case.kwargs(dropout=0.5)}
    fn = getattr(numpy_attn, case.function_name)
    deterministic = [fn(params, x, **kwargs) for _ in range(2)]
    np.testing.assert_array_equal(*deterministic)  # no rng, no mask: eval mode
    np.testing.assert_array_equal(deterministic[0], fn(params, x, **case.kwargs(dropout=0.0)))
    same_seed = [fn(params, x, **kwargs, rng=np.random.default_rng(3)) for _ in range(2)]
    other_seed = fn(params, x, **kwargs, rng=np.random.default_rng(4))
    np.testing.assert_array_equal(*same_seed)
    assert not np.allclose(same_seed[0], other_seed)
    assert not np.allclose(same_seed[0], deterministic[0])


def test_numpy_dropout_statistics():
    x = np.ones((1000, 1000))
    for p in (0.1, 0.5, 0.9):
        dropped = numpy_attn.dropout(x, p, rng=np.random.default_rng(0))
        kept = dropped != 0
        assert abs(kept.mean() - (1 - p)) < 0.005  # keeps about 1 - p of the entries
        np.testing.assert_allclose(dropped[kept], 1 / (1 - p), rtol=1e-15)  # scales the rest
    np.testing.assert_array_equal(numpy_attn.dropout(x, 0.0, rng=np.random.default_rng(0)), x)
    assert numpy_attn.dropout(x, 0.5) is x  # no rng and no mask: the identity


def test_dropout_keep_mask_in_float32_stays_float32():
    x = np.full((2, 3), 0.25, np.float32)
    keep = np.array([[True, False, True], [False, True, True]])
    out = numpy_attn.dropout(x, 0.5, keep_mask=keep)
    assert out.dtype == np.float32
    np.testing.assert_array_equal(out, np.where(keep, np.float32(0.5), np.float32(0)))


def padded_case(dtype="float64"):
    return Case(
        "FusedCausalAttention", batch=2, tokens=5, d_out=8, num_heads=2, bias=True, dtype=dtype, seed=3
    )


@pytest.mark.parametrize("dtype", ["float32", "float64"])
def test_padding_matches_torch_where_rows_see_a_key(dtype):
    case = padded_case(dtype)
    module = case.build_torch()
    x = case.make_input()
    padding_mask = np.array([[False, False, False, True, True], [False] * 5])  # right padding
    expected = run_torch(module, x, padding_mask)[1]
    actual = run_case("numpy", case, to_params(module), x, padding_mask)[1]
    report = compare_steps(expected, actual)
    assert report.ok, f"\n{report}"
    # padded keys get no weight from any query
    assert (actual["attn_weights"][0, :, :, 3:] == 0).all()


def test_no_padding_equals_an_all_false_padding_mask():
    case = padded_case()
    params = to_params(case.build_torch())
    x = case.make_input()
    none = run_case("numpy", case, params, x)[0]
    all_false = run_case("numpy", case, params, x, np.zeros((2, 5), bool))[0]
    np.testing.assert_array_equal(none, all_false)


def test_fully_masked_rows_give_zeros_in_numpy_and_nan_in_torch():
    """Left padding hides every key from the first queries of sequence 0."""
    case = padded_case()
    module = case.build_torch()
    params = to_params(module)
    x = case.make_input()
    padding_mask = np.array([[True, True, False, False, False], [False] * 5])
    torch_output, torch_steps = run_torch(module, x, padding_mask)
    output, steps = run_case("numpy", case, params, x, padding_mask)

    # torch_ref (the notes' class): softmax over all -inf is NaN, and it reaches the output row
    assert torch.isnan(torch_steps["attn_weights"][0, :, :2]).all()
    assert torch.isnan(torch_output[0, :2]).all()
    assert not torch.isnan(torch_output[0, 2:]).any() and not torch.isnan(torch_output[1]).any()
    # numpy_attn: zero weights, zero context, so the output is Wo's bias
    assert (steps["attn_weights"][0, :, :2] == 0).all()
    assert (steps["context_vec"][0, :2] == 0).all()
    np.testing.assert_array_equal(output[0, :2], np.broadcast_to(params["Wo.bias"], (2, 8)))
    # every other row is the torch value
    np.testing.assert_allclose(output[0, 2:], torch_output[0, 2:].detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(output[1], torch_output[1].detach().numpy(), rtol=1e-12, atol=1e-12)
