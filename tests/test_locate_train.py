"""Train mode: the torch reference's dropout keep-masks are injected into a JAX candidate (or drawn
by a NumPy candidate's Generator), so both drop the same entries; a dropout bug is then located on
its line."""

import functools
import re

import jax
import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
from parity_tests import check_port
from parity_tests.locate import locate, locate_gradients
from parity_tests.locate.dropout import share_bound, uniform_draws
from parity_tests.locate.run import capture
from tests.ports.catalogue import BATCH, D_MODEL, HERE, NUM_HEADS, TOKENS, inputs, load
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


# the causes of a dropout bug: 3 * 2 * 15 = 90 entries the dropout could drop, p = 0.2
INVERTED = (
    r"drops [6-9]\d% of the entries where p = 0\.2 \(\d+ of the 90 .*the keep-mask used the wrong way round"
)
SCALED_BY_P = "the kept entries are scaled by 0.2 = p where dropout scales them by 1/(1 - p) = 1.25, p = 0.2"


@pytest.mark.parametrize(
    "planted, cause",
    [
        ("weights = jnp.where(keep, weights * dropout, 0.0)", SCALED_BY_P),  # p instead of 1 / (1 - p)
        ("weights = jnp.where(keep, 0.0, weights / (1.0 - dropout))", INVERTED),  # the mask inverted
        ("weights = jnp.where(~keep, weights / (1.0 - dropout), 0.0)", INVERTED),  # negated
    ],
    ids=["scaled_by_p", "mask_inverted", "mask_negated"],
)
def test_a_dropout_bug_is_located_on_its_line(planted, cause, tmp_path):
    lines = SOURCE.splitlines()
    line = next(i for i, text in enumerate(lines) if text.strip() == KEEP_LINE) + 1
    source = SOURCE.replace(KEEP_LINE, planted)
    ref = dropping_reference()
    report = locate(ref, user_port(source, tmp_path), inputs(), params=to_params(ref), train=True)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / 'jax_dropout_mha.py'}:{line}", f"\n{report}"
    assert any(re.search(cause, c) for c in report.causes) or cause in report.causes, f"\n{report}"


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


WHERE_SOURCE = (HERE / "numpy_where_dropout.py").read_text()
WHERE_KEEP_LINE = "weights = np.where(keep, weights / (1.0 - dropout), 0.0)"


def where_port(source, directory, dropout=DROPOUT, seed=1):
    module = load("numpy_where_dropout", source, directory)
    return functools.partial(module.mha, rng=np.random.default_rng(seed), dropout=dropout)


@pytest.mark.parametrize(
    "planted, cause",
    [
        ("weights = np.where(~keep, weights / (1.0 - dropout), 0.0)", INVERTED),  # QA's: 80% dropped
        ("weights = np.where(keep, weights * dropout, 0.0)", SCALED_BY_P),
    ],
    ids=["mask_negated", "scaled_by_p"],
)
def test_a_numpy_dropout_bug_is_reported_on_its_line_with_its_cause(planted, cause, tmp_path):
    # the draws a NumPy port is given make the reference's mask only when compared with p as the
    # reference does: a mask used the wrong way round drops other entries, as with its own draws
    line = WHERE_SOURCE.splitlines().index(f"    {WHERE_KEEP_LINE}") + 1
    ref = dropping_reference()
    port = where_port(WHERE_SOURCE.replace(WHERE_KEEP_LINE, planted), tmp_path)
    report = check_port(ref, port, inputs(), params=to_params(ref), train=True)
    assert not report.ok
    assert report.located.candidate_location == f"{tmp_path / 'numpy_where_dropout.py'}:{line}", f"\n{report}"
    assert any(re.search(cause, c) for c in report.causes) or cause in report.causes, f"\n{report}"


def test_on_a_tiny_input_the_share_dropped_is_not_named_and_the_values_still_differ(tmp_path):
    # one sequence of 2 tokens: 2 heads * 3 entries the dropout could drop, too few to tell 80% from 20%
    planted = WHERE_SOURCE.replace(
        WHERE_KEEP_LINE, "weights = np.where(~keep, weights / (1.0 - dropout), 0.0)"
    )
    ref = dropping_reference()
    report = locate(ref, where_port(planted, tmp_path), inputs()[:1, :2], params=to_params(ref), train=True)
    assert not report.ok
    assert not any(c.startswith("drops") for c in report.causes), f"\n{report}"


@pytest.mark.parametrize("dropout", [0.1, 0.5])
@pytest.mark.parametrize("shape", [(BATCH, TOKENS, D_MODEL), (1, 9, D_MODEL)], ids=["3x5", "1x9"])
def test_correct_dropout_ports_pass_at_other_rates_and_shapes(dropout, shape, tmp_path):
    torch.manual_seed(0)
    ref = MultiHeadAttention(D_MODEL, D_MODEL, 16, dropout, num_heads=NUM_HEADS, qkv_bias=True)
    x = np.random.default_rng(2).standard_normal(shape).astype(np.float32)
    ports = {
        "numpy u >= p": where_port(WHERE_SOURCE, tmp_path, dropout),
        "numpy u < 1 - p": functools.partial(numpy_port(NUMPY_SOURCE, tmp_path), dropout=dropout),
        # keys 2 and 3 drew keep-masks read as drop-masks at p = 0.5 before both readings were tried
        **{
            f"jax key {key}": functools.partial(
                user_port(SOURCE, tmp_path), dropout=dropout, key=jax.random.key(key)
            )
            for key in (2, 3)
        },
    }
    for name, port in ports.items():
        report = locate(ref, port, x, params=to_params(ref), train=True)
        assert report.ok, f"{name}\n{report}"


@pytest.mark.parametrize("kept_high", [True, False], ids=["u>=p_keeps", "u<1-p_keeps"])
def test_the_draws_a_numpy_port_is_given_make_the_mask_and_are_uniform(kept_high):
    draw = np.random.default_rng(3)
    keep = draw.random(20_000) >= DROPOUT
    u = uniform_draws(keep, DROPOUT, kept_high, draw).astype(np.float32)  # a port may draw float32
    assert np.array_equal(u >= DROPOUT if kept_high else u < 1 - DROPOUT, keep)
    deciles = np.quantile(u, np.linspace(0.1, 0.9, 9))
    np.testing.assert_allclose(deciles, np.linspace(0.1, 0.9, 9), atol=0.02)  # as a true generator's


@pytest.mark.parametrize("p", [0.1, 0.2, 0.5])
def test_a_correct_dropout_drops_a_share_within_the_bound(p):
    # Hoeffding: outside p +- share_bound(n) with chance below FALSE_ALARM (1e-6), for every n and p
    n = 90
    shares = np.random.default_rng(4).binomial(n, p, 100_000) / n
    assert np.all(np.abs(shares - p) <= share_bound(n))
    assert share_bound(n) < 0.3  # tight enough to tell 80% dropped from 20% on 90 entries
