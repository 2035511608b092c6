"""Train mode: the torch reference's dropout keep-masks are injected into a JAX candidate (or drawn
by a NumPy candidate's Generator), so both drop the same entries; a dropout bug is then located on
its line."""

import functools

import jax
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
from parity_tests.locate import locate, locate_gradients
from parity_tests.locate.run import capture
from tests.ports.catalogue import D_MODEL, HERE, NUM_HEADS, inputs, load
from torch_ref import MultiHeadAttention, to_params

DROPOUT = 0.2
SOURCE = (HERE / "jax_dropout_mha.py").read_text()
KEEP_LINE = "weights = jnp.where(keep, weights / (1.0 - dropout), 0.0)"


def dropping_reference():
    torch.manual_seed(0)
    return MultiHeadAttention(D_MODEL, D_MODEL, 16, DROPOUT, num_heads=NUM_HEADS, qkv_bias=True)


def user_port(source, directory):
    return functools.partial(load("jax_dropout_mha", source, directory).mha, key=jax.random.PRNGKey(0))


def test_the_reference_records_its_keep_masks_in_train_mode_only():
    ref = dropping_reference()
    masks = capture(ref, (inputs(),), train=True).keep_masks
    assert [m.shape for m in masks] == [(3, NUM_HEADS, 5, 5)]
    assert 0.6 < masks[0].mean() < 0.95  # about 1 - DROPOUT kept
    assert capture(ref, (inputs(),)).keep_masks == []


def test_the_project_class_agrees_with_injected_masks():
    ref = dropping_reference()
    port = functools.partial(
        jax_attn.multi_head_attention, num_heads=NUM_HEADS, context_length=16, dropout=DROPOUT,
        key=jax.random.PRNGKey(1),
    )  # fmt: skip
    assert locate(ref, port, inputs(), params=to_params(ref), train=True).ok


def test_a_user_port_agrees_with_injected_masks_and_not_without(tmp_path):
    ref = dropping_reference()
    port = user_port(SOURCE, tmp_path)
    assert locate(ref, port, inputs(), params=to_params(ref), train=True).ok
    report = locate(ref, port, inputs(), params=to_params(ref))  # eval reference: nothing dropped
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / 'jax_dropout_mha.py'}:14"  # its random draw


@pytest.mark.parametrize(
    "planted",
    [
        "weights = jnp.where(keep, weights * dropout, 0.0)",  # scaled by p instead of 1 / (1 - p)
        "weights = jnp.where(keep, 0.0, weights / (1.0 - dropout))",  # the mask inverted
    ],
    ids=["scaled_by_p", "mask_inverted"],
)
def test_a_dropout_bug_is_located_on_its_line(planted, tmp_path):
    lines = SOURCE.splitlines()
    line = next(i for i, text in enumerate(lines) if text.strip() == KEEP_LINE) + 1
    source = SOURCE.replace(KEEP_LINE, planted)
    ref = dropping_reference()
    report = locate(ref, user_port(source, tmp_path), inputs(), params=to_params(ref), train=True)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / 'jax_dropout_mha.py'}:{line}", f"\n{report}"


def test_gradients_in_train_mode_use_the_same_masks(tmp_path):
    ref = dropping_reference()
    port = user_port(SOURCE, tmp_path)
    assert locate_gradients(ref, port, inputs(), params=to_params(ref), train=True).ok
    stopped = "weights = jnp.where(keep, jax.lax.stop_gradient(weights) / (1.0 - dropout), 0.0)"
    source = SOURCE.replace(KEEP_LINE, stopped)
    report = locate_gradients(ref, user_port(source, tmp_path), inputs(), params=to_params(ref), train=True)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / 'jax_dropout_mha.py'}:15", f"\n{report}"


NUMPY_SOURCE = (HERE / "numpy_dropout_mha.py").read_text()
NUMPY_KEEP_LINE = "weights = weights * keep / (1.0 - dropout)"


def numpy_port(source, directory):
    return functools.partial(load("numpy_dropout_mha", source, directory).mha, rng=np.random.default_rng(1))


def test_the_project_numpy_class_draws_the_reference_masks():
    ref = dropping_reference()
    port = functools.partial(
        numpy_attn.multi_head_attention, num_heads=NUM_HEADS, context_length=16, dropout=DROPOUT,
        rng=np.random.default_rng(1),
    )  # fmt: skip
    assert locate(ref, port, inputs(), params=to_params(ref), train=True).ok  # it keeps u >= p


def test_a_numpy_port_keeping_low_draws_agrees_and_its_scale_bug_is_located(tmp_path):
    ref = dropping_reference()
    assert locate(ref, numpy_port(NUMPY_SOURCE, tmp_path), inputs(), params=to_params(ref), train=True).ok
    source = NUMPY_SOURCE.replace(NUMPY_KEEP_LINE, "weights = weights * keep * dropout")
    report = locate(ref, numpy_port(source, tmp_path), inputs(), params=to_params(ref), train=True)
    line = NUMPY_SOURCE.splitlines().index(f"    {NUMPY_KEEP_LINE}") + 1
    assert report.candidate_location == f"{tmp_path / 'numpy_dropout_mha.py'}:{line}", f"\n{report}"
