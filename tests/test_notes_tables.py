"""The notes' printed tables, reproduced by torch_ref and by numpy_attn from the same weights.

Every expected value is copied from the notes (``../shared/notes``), never computed by this
project: below, or in ``parity_tests.lesson.printed``, the walkthrough's table of the notes'
numbers (tests/test_walkthrough.py finds each of them in the note it names). Printed values are
rounded to four decimals, so agreement means an absolute difference of at most 5e-5.
"""

import numpy as np
import pytest
import torch

import jax_attn
import numpy_attn
import torch_ref
from parity_tests.lesson.printed import CAUSAL_ROWS, PRINTED
from parity_tests.notes import INPUTS, batch, notes_module, notes_steps
from torch_ref import to_params

FRAMEWORKS = ["torch", "numpy", "jax"]
PACKAGES = {"numpy": numpy_attn, "jax": jax_attn}
FOUR_DECIMALS = 5e-5 + 1e-7


def assert_printed(actual, printed):
    actual = actual.detach().numpy() if isinstance(actual, torch.Tensor) else np.asarray(actual)
    np.testing.assert_allclose(actual, np.array(printed), rtol=0, atol=FOUR_DECIMALS)


# --- Simplified self-attention (notes 002 and 004) --------------------------------------------

SIMPLE_SCORES = PRINTED["attn_scores"].values
SIMPLE_WEIGHTS = PRINTED["attn_weights"].values
SIMPLE_CONTEXT = PRINTED["all_context_vecs"].values


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_simplified_self_attention_tables(framework):
    if framework == "torch":
        output, steps = torch_ref.simplified_self_attention(torch.from_numpy(INPUTS), return_steps=True)
    else:
        output, steps = PACKAGES[framework].simplified_self_attention(INPUTS, return_steps=True)
    assert_printed(steps["attn_scores"], SIMPLE_SCORES)
    assert_printed(steps["attn_weights"], SIMPLE_WEIGHTS)
    assert_printed(output, SIMPLE_CONTEXT)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_single_query_normalisations(framework):
    """Query x^2 ("journey"): divide-by-sum, the naive softmax and the library softmax."""
    scores_2 = np.array(SIMPLE_SCORES[1], dtype=np.float32)
    if framework == "torch":
        naive = torch_ref.softmax_naive(torch.from_numpy(scores_2))
        stable = torch.softmax(torch.from_numpy(scores_2), dim=0)
    else:
        naive = PACKAGES[framework].softmax_naive(scores_2)
        stable = PACKAGES[framework].softmax(scores_2)
    assert_printed(scores_2 / scores_2.sum(), [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656])
    assert_printed(naive, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581])
    assert_printed(stable, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581])


# --- Trainable weights, one query and the V1/V2 classes ----------------------------------------


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note002_randn_weights_single_query_and_v1(framework):
    """Note 002: W_q, W_k, W_v = torch.randn(3, 2) under seed 123; query x^2 is row 1."""
    steps = notes_steps(framework, "002/SelfAttentionV1", INPUTS)
    assert_printed(steps["queries"][1], [-1.1729, -0.0048])
    assert_printed(steps["attn_scores"][1], [0.2172, 0.1376, 0.1730, -0.0491, 0.7616, -0.3809])
    assert_printed(steps["attn_weights"][1], [0.1704, 0.1611, 0.1652, 0.1412, 0.2505, 0.1117])
    assert_printed(steps["output"][1], [0.2854, 0.4081])
    assert_printed(
        steps["output"],
        [
            [0.2845, 0.4071],
            [0.2854, 0.4081],
            [0.2854, 0.4075],
            [0.2864, 0.3974],
            [0.2863, 0.3910],
            [0.2860, 0.4039],
        ],
    )


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note002_v2_table(framework):
    steps = notes_steps(framework, "002/SelfAttentionV2", INPUTS)
    assert_printed(
        steps["output"],
        [
            [0.5322, 0.2491],
            [0.5316, 0.2488],
            [0.5316, 0.2488],
            [0.5340, 0.2501],
            [0.5331, 0.2497],
            [0.5337, 0.2499],
        ],
    )


def test_note004_rand_weights_as_printed():
    params = to_params(notes_module("004/SelfAttentionV1"))
    assert_printed(params["W_query"], [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]])
    assert_printed(params["W_key"], [[0.1366, 0.1025], [0.1841, 0.7264], [0.3153, 0.6871]])
    assert_printed(params["W_value"], [[0.0756, 0.1966], [0.3164, 0.4017], [0.1186, 0.8274]])


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note004_rand_weights_single_query_and_v1(framework):
    steps = notes_steps(framework, "004/SelfAttentionV1", INPUTS)
    assert_printed(steps["queries"][1], [0.4306, 1.4551])
    assert_printed(steps["keys"][1], [0.4433, 1.1419])
    assert_printed(steps["values"][1], [0.3951, 1.0037])
    assert_printed(steps["attn_scores"][1, 1], 1.8524)
    assert_printed(steps["attn_scores"][1], [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440])
    assert_printed(steps["attn_weights"][1], [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820])
    assert_printed(steps["output"][1], [0.3061, 0.8210])
    assert_printed(
        steps["output"],
        [
            [0.2996, 0.8053],
            [0.3061, 0.8210],
            [0.3058, 0.8203],
            [0.2948, 0.7939],
            [0.2927, 0.7891],
            [0.2990, 0.8040],
        ],
    )


NOTE004_LINEAR_WEIGHTS = PRINTED["linear_attn_weights"].values


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note004_linear_class_and_its_scope_bug(framework):
    """Note 004's Linear ``SelfAttention_v1`` reads ``values`` from the notebook's global scope
    (the rand-weights values), so its printed table is ``attn_weights @ old values``."""
    steps = notes_steps(framework, "004/SelfAttentionV2", INPUTS)
    old_values = notes_steps(framework, "004/SelfAttentionV1", INPUTS)["values"]
    assert_printed(steps["attn_weights"], NOTE004_LINEAR_WEIGHTS)
    assert_printed(
        steps["attn_weights"] @ old_values,
        [
            [0.2821, 0.7652],
            [0.2829, 0.7635],
            [0.2829, 0.7635],
            [0.2815, 0.7595],
            [0.2816, 0.7613],
            [0.2818, 0.7599],
        ],
    )


# --- Causal masking, both ways, and dropout ------------------------------------------------------

CAUSAL_MASK_PRINTED = PRINTED["mask"].values


def test_causal_mask_is_the_notes_triu():
    np.testing.assert_array_equal(numpy_attn.causal_mask(6), np.array(CAUSAL_MASK_PRINTED, bool))
    np.testing.assert_array_equal(~numpy_attn.causal_mask(6), np.tril(np.ones((6, 6), bool)))


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note002_masking_the_weights_and_renormalising(framework):
    """Note 002 masks the *weights* of its V2 with -inf and applies softmax again (dim=1)."""
    weights = notes_steps(framework, "002/SelfAttentionV2", INPUTS)["attn_weights"]
    assert_printed(
        weights,
        [
            [0.1825, 0.1568, 0.1576, 0.1657, 0.1796, 0.1577],
            [0.1852, 0.1554, 0.1562, 0.1655, 0.1814, 0.1563],
            [0.1852, 0.1554, 0.1562, 0.1654, 0.1814, 0.1563],
            [0.1756, 0.1611, 0.1615, 0.1662, 0.1740, 0.1616],
            [0.1804, 0.1589, 0.1594, 0.1655, 0.1765, 0.1593],
            [0.1760, 0.1605, 0.1610, 0.1664, 0.1749, 0.1612],
        ],
    )
    assert_printed(note002_masked_normalised(framework), NOTE002_MASKED_NORMALISED)


def note002_masked_normalised(framework):
    weights = notes_steps(framework, "002/SelfAttentionV2", INPUTS)["attn_weights"]
    if framework == "torch":
        masked = weights.masked_fill(torch.tensor(numpy_attn.causal_mask(6)), -torch.inf)
        return torch.softmax(masked / 2**0.5, dim=1)
    package = PACKAGES[framework]
    masked = np.where(package.causal_mask(6), -np.inf, weights)
    return package.softmax(masked / 2**0.5, axis=1)


NOTE002_MASKED_NORMALISED = PRINTED["softmax_twice"].values


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note004_tril_then_renormalise(framework):
    """Note 004 multiplies the raw scores by ``tril`` and divides by the row sums."""
    scores = notes_steps(framework, "004/SelfAttentionV2", INPUTS)["attn_scores"]
    scores = np.asarray(scores.detach() if framework == "torch" else scores)
    masked_simple = scores * ~numpy_attn.causal_mask(6)
    assert_printed(
        masked_simple,
        [
            [0.3111, 0, 0, 0, 0, 0],
            [0.1655, 0.2602, 0, 0, 0, 0],
            [0.1667, 0.2602, 0.2577, 0, 0, 0],
            [0.0510, 0.1080, 0.1064, 0.0643, 0, 0],
            [0.1415, 0.1875, 0.1863, 0.0987, 0.1121, 0],
            [0.0476, 0.1192, 0.1171, 0.0731, 0.0477, 0.0966],
        ],
    )
    assert_printed(
        masked_simple / masked_simple.sum(axis=-1, keepdims=True),
        [
            [1.0000, 0, 0, 0, 0, 0],
            [0.3888, 0.6112, 0, 0, 0, 0],
            [0.2435, 0.3801, 0.3764, 0, 0, 0],
            [0.1547, 0.3275, 0.3227, 0.1950, 0, 0],
            [0.1949, 0.2582, 0.2565, 0.1360, 0.1544, 0],
            [0.0950, 0.2377, 0.2337, 0.1458, 0.0952, 0.1927],
        ],
    )


# The notes' dropout draws come from torch's generator (seed 123): torch reproduces them; NumPy
# reproduces them given the same keep-mask (each framework's generator draws different masks).
NOTE002_DROPOUT_ONES = [
    [2, 2, 2, 2, 2, 2],
    [0, 2, 0, 0, 0, 0],
    [0, 0, 2, 0, 2, 0],
    [2, 2, 0, 0, 0, 2],
    [2, 0, 0, 0, 0, 2],
    [0, 2, 0, 0, 0, 0],
]
NOTE002_DROPOUT_WEIGHTS = [
    [2.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
    [0.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
    [0.0000, 0.0000, 0.6622, 0.0000, 0.0000, 0.0000],
    [0.0000, 0.4982, 0.0000, 0.5000, 0.0000, 0.0000],
    [0.0000, 0.3974, 0.3975, 0.3993, 0.4024, 0.0000],
    [0.3355, 0.3319, 0.0000, 0.0000, 0.3353, 0.3320],
]
NOTE004_DROPOUT_ONES = PRINTED["dropout_ones"].values
NOTE004_DROPOUT_WEIGHTS = [
    [0.3433, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
    [0.0000, 0.0000, 0.3492, 0.0000, 0.3210, 0.3303],
    [0.0000, 0.3498, 0.3492, 0.3223, 0.3211, 0.3302],
    [0.0000, 0.0000, 0.3403, 0.3304, 0.0000, 0.3349],
    [0.0000, 0.0000, 0.0000, 0.0000, 0.3266, 0.3278],
    [0.3249, 0.3418, 0.0000, 0.3308, 0.3249, 0.3363],
]


def test_note004_dropout_draws_in_torch():
    """``torch.manual_seed(123); Dropout(0.5)`` on ones, then on note 004's attention weights.

    Note 002 printed other draws for the same seed (another torch build's generator): its tables
    are reproduced below from their keep-masks only.
    """
    weights = notes_steps("torch", "004/SelfAttentionV2", INPUTS)["attn_weights"]
    torch.manual_seed(123)
    layer = torch.nn.Dropout(0.5)
    assert_printed(layer(torch.ones(6, 6)), NOTE004_DROPOUT_ONES)
    assert_printed(layer(weights), NOTE004_DROPOUT_WEIGHTS)


@pytest.mark.parametrize(
    "weights_of, printed_ones, printed_weights",
    [
        (lambda: note002_masked_normalised("numpy"), NOTE002_DROPOUT_ONES, NOTE002_DROPOUT_WEIGHTS),
        (
            lambda: notes_steps("numpy", "004/SelfAttentionV2", INPUTS)["attn_weights"],
            NOTE004_DROPOUT_ONES,
            NOTE004_DROPOUT_WEIGHTS,
        ),
    ],
    ids=["note002", "note004"],
)
def test_dropout_tables_from_their_keep_masks(weights_of, printed_ones, printed_weights):
    """Given the keep-mask a table shows (its non-zero entries), numpy_attn's dropout keeps
    those entries and scales them by 1 / (1 - 0.5) = 2, as the notes print."""
    ones = np.ones((6, 6), np.float32)
    keep = np.array(printed_ones) != 0
    np.testing.assert_array_equal(numpy_attn.dropout(ones, 0.5, keep_mask=keep), printed_ones)
    keep = np.array(printed_weights) != 0
    assert_printed(numpy_attn.dropout(weights_of(), 0.5, keep_mask=keep), printed_weights)


# --- The layer classes on the batch --------------------------------------------------------------

WRAPPER_ROWS = CAUSAL_ROWS


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_causal_attention_table(framework):
    """Note 004's ``ca_v2``: the wrapper's first head, seen alone."""
    steps = notes_steps(framework, "CausalAttention", batch(), context_length=6, dropout=0.0)
    assert_printed(steps["output"], [[row[:2] for row in WRAPPER_ROWS]] * 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_multi_head_attention_wrapper_table(framework):
    steps = notes_steps(
        framework, "MultiHeadAttentionWrapper", batch(), num_heads=2, context_length=6, dropout=0.0
    )
    assert_printed(steps["output"], [WRAPPER_ROWS] * 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_multi_head_attention_table(framework):
    steps = notes_steps(framework, "MultiHeadAttention", batch(), num_heads=2, context_length=6, dropout=0.0)
    rows = [
        [0.3190, 0.4858],
        [0.2943, 0.3897],
        [0.2856, 0.3593],
        [0.2693, 0.3873],
        [0.2639, 0.3928],
        [0.2575, 0.4028],
    ]
    assert_printed(steps["output"], [rows] * 2)
    assert steps["attn_scores"].shape == (2, 2, 6, 6)  # the notes' printed shapes
    assert steps["context_vec"].shape == (2, 6, 2)


@pytest.mark.parametrize("framework", FRAMEWORKS)
def test_note004_multi_head_attention_class_shape(framework):
    """Note 004 prints only the shape of ``MultiHeadAttentionClass``'s output."""
    module = notes_module("004/MultiHeadAttentionClass")
    assert "out_proj.bias" not in to_params(module)
    steps = notes_steps(
        framework, "004/MultiHeadAttentionClass", batch(), num_heads=2, context_length=6, dropout=0.0
    )
    assert tuple(steps["output"].shape) == (2, 6, 4)
