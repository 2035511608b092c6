"""What the notes (and, for chapter 4, the book) print for the book's code, copied by hand.

Every number here is read from ``shared/notes`` (note files ``002`` and ``004``), from the book's
chapter 4 or from the outputs of a bonus notebook of the book's repository (LLMs-from-scratch,
ch05/07_gpt_to_llama), never computed by this project; ``tests/test_walkthrough.py`` finds each
notes value in the note it names, and recomputes the book's with the book's own package. Printed tensors have
four decimals, so a value agrees with its print when it is within 5e-5 of it.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

__all__ = ["FOUR_DECIMALS", "PRINTED", "Printed"]

FOUR_DECIMALS = 5e-5 + 1e-7  # half the last printed digit, and float32's rounding of it


@dataclass(frozen=True)
class Printed:
    """Numbers a source prints (``values``, nested lists), or only the shape it prints (``shape``).

    ``source`` names where: ``"note 004, In [196]"``, ``"the book, section 4.2"``, or a notebook of
    the book's repository (``"LLMs-from-scratch ch05/07_gpt_to_llama/...ipynb, In [10]"``)."""

    source: str
    values: object = None
    shape: tuple[int, ...] | None = None
    integers: bool = False  # token ids and counts: printed without decimals

    @property
    def from_notes(self) -> bool:
        return self.source.startswith("note ")

    @property
    def where(self) -> str:
        """Who prints it: the notes, the book, or one of the notebooks of the book's repository."""
        if self.from_notes:
            return "the notes print"
        return "the book prints" if self.source.startswith("the book") else "the book's notebook prints"

    def agrees(self, value: np.ndarray) -> bool:
        """``value`` prints as this: the same shape, and within ``FOUR_DECIMALS`` of each number."""
        value = np.asarray(value, dtype=np.float64)
        if self.values is None:
            return value.shape == self.shape
        expected = np.array(self.values, dtype=np.float64)
        return value.shape == expected.shape and bool(np.all(np.abs(value - expected) <= FOUR_DECIMALS))

    def text(self) -> str:
        """The print in one short line: the numbers when they are few, else what they are."""
        if self.values is None:
            return f"shape {self.shape}"
        expected = np.array(self.values, dtype=np.float64)
        if expected.size > (16 if self.integers else 8):
            return f"this {'x'.join(map(str, expected.shape))} table"
        if self.integers:
            return " ".join(np.array2string(expected.astype(np.int64), separator=", ").split())
        with np.printoptions(precision=4, floatmode="fixed", suppress=True):
            return " ".join(np.array2string(expected, separator=", ").split())


def _n004(cell: int, values: object) -> Printed:
    return Printed(f"note 004, In [{cell}]", values)


SCORES = [
    [0.9995, 0.9544, 0.9422, 0.4753, 0.4576, 0.6310],
    [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865],
    [0.9422, 1.4754, 1.4570, 0.8296, 0.7154, 1.0605],
    [0.4753, 0.8434, 0.8296, 0.4937, 0.3474, 0.6565],
    [0.4576, 0.7070, 0.7154, 0.3474, 0.6654, 0.2935],
    [0.6310, 1.0865, 1.0605, 0.6565, 0.2935, 0.9450],
]
WEIGHTS = [
    [0.2098, 0.2006, 0.1981, 0.1242, 0.1220, 0.1452],
    [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581],
    [0.1390, 0.2369, 0.2326, 0.1242, 0.1108, 0.1565],
    [0.1435, 0.2074, 0.2046, 0.1462, 0.1263, 0.1720],
    [0.1526, 0.1958, 0.1975, 0.1367, 0.1879, 0.1295],
    [0.1385, 0.2184, 0.2128, 0.1420, 0.0988, 0.1896],
]
CONTEXT = [
    [0.4421, 0.5931, 0.5790],
    [0.4419, 0.6515, 0.5683],
    [0.4431, 0.6496, 0.5671],
    [0.4304, 0.6298, 0.5510],
    [0.4671, 0.5910, 0.5266],
    [0.4177, 0.6503, 0.5645],
]
CAUSAL_ROWS = [
    [-0.4519, 0.2216, 0.4772, 0.1063],
    [-0.5874, 0.0058, 0.5891, 0.3257],
    [-0.6300, -0.0632, 0.6202, 0.3860],
    [-0.5675, -0.0843, 0.5478, 0.3589],
    [-0.5526, -0.0981, 0.5321, 0.3428],
    [-0.5299, -0.1081, 0.5077, 0.3493],
]
MULTI_HEAD_ROWS = [
    [0.3190, 0.4858],
    [0.2943, 0.3897],
    [0.2856, 0.3593],
    [0.2693, 0.3873],
    [0.2639, 0.3928],
    [0.2575, 0.4028],
]

LLAMA3_NOTEBOOK = "LLMs-from-scratch ch05/07_gpt_to_llama/converting-llama2-to-llama3.ipynb"

PRINTED: dict[str, Printed] = {
    # 3.3.1, one query without weights
    "attn_scores_2": _n004(177, [0.9544, 1.4950, 1.4754, 0.8434, 0.7070, 1.0865]),
    "attn_weights_2_tmp": _n004(178, [0.1455, 0.2278, 0.2249, 0.1285, 0.1077, 0.1656]),
    "softmax_naive": _n004(180, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]),
    "attn_weights_2": _n004(181, [0.1385, 0.2379, 0.2333, 0.1240, 0.1082, 0.1581]),
    "context_vec_2": _n004(183, [0.4419, 0.6515, 0.5683]),
    # 3.3.2, every query
    "attn_scores": _n004(187, SCORES),
    "attn_weights": _n004(188, WEIGHTS),
    "all_context_vecs": _n004(190, CONTEXT),
    # 3.4.1, trainable weights (torch.rand under seed 123, as the book)
    "W_query": _n004(195, [[0.2961, 0.5166], [0.2517, 0.6886], [0.0740, 0.8665]]),
    "query_2": _n004(196, [0.4306, 1.4551]),
    "keys": Printed("note 004, In [198]", shape=(6, 2)),
    "key_2": _n004(196, [0.4433, 1.1419]),
    "value_2": _n004(196, [0.3951, 1.0037]),
    "attn_score_22": _n004(197, 1.8524),
    "trainable_attn_scores_2": _n004(199, [1.2705, 1.8524, 1.8111, 1.0795, 0.5577, 1.5440]),
    "trainable_attn_weights_2": _n004(200, [0.1500, 0.2264, 0.2199, 0.1311, 0.0906, 0.1820]),
    "trainable_context_vec_2": _n004(201, [0.3061, 0.8210]),
    "randn_query_2": Printed("note 002, trainable self-attention", [-1.1729, -0.0048]),
    # 3.4.2, the classes
    "sa_v1": _n004(
        202,
        [
            [0.2996, 0.8053],
            [0.3061, 0.8210],
            [0.3058, 0.8203],
            [0.2948, 0.7939],
            [0.2927, 0.7891],
            [0.2990, 0.8040],
        ],
    ),
    "sa_v2": Printed(
        "note 002, a self-attention class",
        [
            [0.5322, 0.2491],
            [0.5316, 0.2488],
            [0.5316, 0.2488],
            [0.5340, 0.2501],
            [0.5331, 0.2497],
            [0.5337, 0.2499],
        ],
    ),
    # 3.5.1, the causal mask (note 004's Linear SelfAttention_v1, seed 123)
    "linear_attn_weights": _n004(
        206,
        [
            [0.1717, 0.1762, 0.1761, 0.1555, 0.1627, 0.1579],
            [0.1636, 0.1749, 0.1746, 0.1612, 0.1605, 0.1652],
            [0.1637, 0.1749, 0.1746, 0.1611, 0.1606, 0.1651],
            [0.1636, 0.1704, 0.1702, 0.1652, 0.1632, 0.1674],
            [0.1667, 0.1722, 0.1721, 0.1618, 0.1633, 0.1639],
            [0.1624, 0.1709, 0.1706, 0.1654, 0.1625, 0.1682],
        ],
    ),
    "mask_simple": _n004(207, np.tril(np.ones((6, 6))).tolist()),
    "mask": _n004(222, np.triu(np.ones((6, 6)), 1).tolist()),
    "raw_scores_renormalised": _n004(
        209,
        [
            [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.3888, 0.6112, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.2435, 0.3801, 0.3764, 0.0000, 0.0000, 0.0000],
            [0.1547, 0.3275, 0.3227, 0.1950, 0.0000, 0.0000],
            [0.1949, 0.2582, 0.2565, 0.1360, 0.1544, 0.0000],
            [0.0950, 0.2377, 0.2337, 0.1458, 0.0952, 0.1927],
        ],
    ),
    "softmax_twice": Printed(
        "note 002, causal self-attention",
        [
            [1.0000, 0.0000, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.5053, 0.4947, 0.0000, 0.0000, 0.0000, 0.0000],
            [0.3380, 0.3309, 0.3311, 0.0000, 0.0000, 0.0000],
            [0.2517, 0.2491, 0.2492, 0.2500, 0.0000, 0.0000],
            [0.2017, 0.1987, 0.1988, 0.1996, 0.2012, 0.0000],
            [0.1678, 0.1659, 0.1660, 0.1666, 0.1676, 0.1660],
        ],
    ),
    # 3.5.2, dropout: torch's generator under seed 123 (note 002's torch build drew other masks)
    "dropout_ones": _n004(
        213,
        [
            [2, 2, 0, 2, 2, 0],
            [0, 0, 0, 2, 0, 2],
            [2, 2, 2, 2, 0, 2],
            [0, 2, 2, 0, 0, 2],
            [0, 2, 0, 2, 0, 2],
            [0, 2, 2, 2, 2, 0],
        ],
    ),
    # 3.5.3 and 3.6
    "ca_v2": _n004(218, [[row[:2] for row in CAUSAL_ROWS]] * 2),
    "wrapper": _n004(219, [CAUSAL_ROWS] * 2),
    "mha_projected_shape": Printed("note 002, multi-head self-attention (parallel)", shape=(2, 6, 2)),
    "mha_view_shape": Printed("note 002, multi-head self-attention (parallel)", shape=(2, 6, 2, 1)),
    "mha_heads_shape": Printed("note 002, multi-head self-attention (parallel)", shape=(2, 2, 6, 1)),
    "mha_scores_shape": Printed("note 002, multi-head self-attention (parallel)", shape=(2, 2, 6, 6)),
    "mha_merged_shape": Printed("note 002, multi-head self-attention (parallel)", shape=(2, 6, 2)),
    "mha": Printed("note 002, multi-head self-attention (parallel)", [MULTI_HEAD_ROWS] * 2),
    # chapter 4, the book (the notes stop at chapter 3)
    "layer_norm_mean": Printed("the book, section 4.2", [[-0.0000], [0.0000]]),
    "layer_norm_var": Printed("the book, section 4.2", [[1.0000], [1.0000]]),
    "batch_ids": Printed(
        "the book, section 4.1", [[6109, 3626, 6100, 345], [6109, 1110, 6622, 257]], integers=True
    ),
    "block_shape": Printed("the book, section 4.5", shape=(2, 4, 768)),
    "logits_shape": Printed("the book, section 4.6", shape=(2, 4, 50257)),
    "parameters": Printed("the book, section 4.6", 163_009_536, integers=True),
    "generated": Printed(
        "the book, section 4.7, and its tests (llms_from_scratch tests/test_ch04.py)",
        [[15496, 11, 314, 716, 27018, 24086, 47843, 30961, 42348, 7267]],
        integers=True,
    ),
    # the book's bonus notebooks (LLMs-from-scratch ch05/07_gpt_to_llama); the notes stop at chapter 4
    "gqa_shapes": Printed(
        f"{LLAMA3_NOTEBOOK}, In [10]", [[1024, 4096], [1024, 4096], [4096, 4096]], integers=True
    ),
    "gqa_parameters": Printed(f"{LLAMA3_NOTEBOOK}, In [11]", 41_943_040, integers=True),
}
