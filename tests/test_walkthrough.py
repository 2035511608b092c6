"""The walkthrough: each stage shows what the notes print, the reference files' own lines, in 100 columns.

The stages of chapter 3, 4.1-4.3 and the two bonus stages (RoPE, grouped-query attention) run once
per worker (``shown``, 5 s); the GPT's stage (163 million weights,
about 20 s) runs once, in ``test_the_gpt_stage_and_the_whole_command``, which checks it as the
others are checked (xdist_group does not keep a module's tests on one worker with pytest-xdist 3.8).
"""

import json
import math
import pathlib
import re

import numpy as np
import pytest
from rich.console import Console

from parity_tests.cli import main
from parity_tests.lesson.code import ROOT
from parity_tests.lesson.panel import shown_panel
from parity_tests.lesson.printed import PRINTED
from parity_tests.walkthrough import FRAMEWORKS, STAGES

NOTES = pathlib.Path(ROOT).parent / "shared" / "notes"
NOTE_NUMBERS = pathlib.Path(ROOT) / "tests" / "data" / "note_numbers.json"  # the notes' numbers, for CI
NUMBER = re.compile(r"-?\d+\.\d{4}\b")


GPT = "gpt"


@pytest.fixture(scope="module")
def shown():
    """Every stage's steps but the GPT's."""
    return {stage.name: stage.run() for stage in STAGES if stage.name != GPT}


def check_steps(steps):
    """Each step matches torch_ref and what the notes print, shows its frameworks' own source lines,
    and its panel fits 100 columns."""
    console = Console(width=100, record=True, color_system=None)
    for step in steps:
        assert step.ok, (step.label, step.rows, step.printed)
        for code in step.code.values():
            assert code.path.split("/")[0] in ("torch_ref", "numpy_attn", "jax_attn", "parity_tests")
            text = "".join((pathlib.Path(ROOT) / path).read_text() for path in code.path.split(" + "))
            for line in code.text.splitlines():
                assert line.strip() in text, (code.path, line)
        console.print(shown_panel(step))
    assert max(len(line) for line in console.export_text().splitlines()) <= 100


def test_the_gpt_stage_and_the_whole_command(shown, capsys, monkeypatch):
    """The GPT's stage checked as the others; then the command on every stage, in order (moved from
    tests/test_cli.py: the stages computed once)."""
    from parity_tests.walkthrough import Stage

    gpt = next(stage for stage in STAGES if stage.name == GPT).run()
    check_steps(gpt)
    generated = by_label({GPT: gpt}, GPT, "'Hello, I am'")
    assert generated.values["numpy"].tolist() == [
        [15496, 11, 314, 716, 27018, 24086, 47843, 30961, 42348, 7267]
    ]
    assert all(s.printed_agrees() for s in gpt if s.printed)
    monkeypatch.setattr(Stage, "function", lambda self: lambda: gpt if self.name == GPT else shown[self.name])
    assert main(["walkthrough"]) == 0
    out = capsys.readouterr().out
    positions = [out.index(f"{number}. {stage.section}") for number, stage in enumerate(STAGES, start=1)]
    assert positions == sorted(positions)
    assert "[0.4419 0.6515 0.5683]" in out  # z^2, the notes' first context vector
    assert "[-0.4519  0.2216  0.4772  0.1063]" in out  # the wrapper's first row
    assert "[[15496    11   314   716 27018 24086 47843 30961 42348  7267]]" in out  # the book's next tokens
    assert "the book prints shape (2, 4, 50257) ✓" in out and "✗" not in out
    assert "the book's notebook prints [[1024, 4096], [1024, 4096], [4096, 4096]] ✓" in out  # GQA's
    assert "the notes print" not in out[out.index(". Bonus ch05/07") :]  # the notes stop at chapter 4


def by_label(shown, stage, start):
    return next(s for s in shown[stage] if s.label.startswith(start))


def test_every_step_matches_torch_ref_and_the_notes_with_its_own_lines_in_100_columns(shown):
    for steps in shown.values():
        check_steps(steps)


# what the issue and the notes name, copied from the notes (not from parity_tests.lesson.printed)
PINNED = [
    ("trainable-one-query", "query_2 =", [0.4306, 1.4551]),
    ("trainable-one-query", "context_vec_2", [0.3061, 0.8210]),
    ("trainable-one-query", "query_2 with note 002", [-1.1729, -0.0048]),
    ("self-attention-classes", "SelfAttention_v1", [0.2996, 0.8053]),  # first row
    ("self-attention-classes", "SelfAttention_v2", [0.5322, 0.2491]),
    ("one-query", "context vector z^2", [0.4419, 0.6515, 0.5683]),
    ("causal-attention", "the context vectors", [-0.4519, 0.2216]),
    ("wrapper", "the heads' outputs", [-0.4519, 0.2216, 0.4772, 0.1063]),
    ("multi-head", "output projection", [0.3190, 0.4858]),
]


@pytest.mark.parametrize("stage, label, first_row", PINNED, ids=[p[1] for p in PINNED])
def test_the_stages_compute_the_notes_numbers(shown, stage, label, first_row):
    step = by_label(shown, stage, label)
    for values in step.values.values():
        first = values.reshape(-1, values.shape[-1])[0] if values.ndim > 1 else values
        np.testing.assert_allclose(first, first_row, atol=5e-5 + 1e-7)
    assert step.printed_agrees() is True


def test_every_stage_but_three_has_a_printed_pin(shown):
    """Each stage checks at least one value the notes, the book or its notebooks print (the GPT's:
    above); RoPE's values are pinned by hand below."""
    without = {name for name, steps in shown.items() if all(s.printed is None for s in steps)}
    assert without == {"softmax", "fused", "rope"}  # nothing prints a number of these


def read_note_numbers(notes: pathlib.Path) -> dict[str, dict[str, list]]:
    """Per note (``"002"``): the numbers its text prints to four decimals, as written, and the flat
    values of each 2-D tensor it prints (the masks' 0. and 1.)."""
    found = {}
    for note in sorted(notes.glob("*_*.txt")):
        text = note.read_text()
        tensors = re.findall(r"tensor\(\[\[([\d.,\s\[\]]+)\]\]\)", text)
        found[note.name.split("_")[0]] = {
            "numbers": NUMBER.findall(text),
            "tensors": [[float(v) for v in re.findall(r"\d+\.?\d*", t)] for t in tensors],
        }
    return found


@pytest.mark.skipif(
    not NOTES.is_dir(), reason="the study notes (../shared/notes) are not beside this checkout"
)
def test_the_note_numbers_file_holds_what_the_notes_print():
    """tests/data/note_numbers.json, read by the test below on machines without the notes, is the notes'."""
    assert read_note_numbers(NOTES) == json.loads(NOTE_NUMBERS.read_text())


@pytest.mark.parametrize("name", [n for n, p in PRINTED.items() if p.from_notes and p.values is not None])
def test_each_printed_value_is_in_the_note_it_names(name):
    """The numbers, in order, among the numbers the note prints (its text, four decimals)."""
    printed = PRINTED[name]
    note = json.loads(NOTE_NUMBERS.read_text())[printed.source.split(",")[0].removeprefix("note ")]
    in_note = [float(n) for n in note["numbers"]]
    wanted = np.array(printed.values, dtype=float).ravel().tolist()
    if not any(
        np.allclose(in_note[i : i + len(wanted)], wanted) for i in range(len(in_note) - len(wanted) + 1)
    ):
        if max(map(abs, wanted)) <= 2 and all(float(v).is_integer() for v in wanted):  # masks print 0./1.
            assert wanted in note["tensors"], name
        else:
            pytest.fail(f"{name}: {wanted} not in note {printed.source}")


def test_the_books_chapter_4_numbers_come_from_the_books_code():
    """The book's own package computes the LayerNorm example and pins the generated ids."""
    import torch
    from llms_from_scratch import ch04

    torch.manual_seed(123)
    batch_example = torch.randn(2, 5)
    out_ln = ch04.LayerNorm(emb_dim=5)(batch_example)
    assert PRINTED["layer_norm_mean"].agrees(out_ln.mean(dim=-1, keepdim=True).detach().numpy())
    assert PRINTED["layer_norm_var"].agrees(out_ln.var(dim=-1, keepdim=True, unbiased=False).detach().numpy())
    tests = pathlib.Path(ch04.__file__).parent / "tests" / "test_ch04.py"
    ids = ", ".join(str(i) for i in PRINTED["generated"].values[0])
    assert ids.replace(" ", "") in re.sub(r"\s", "", tests.read_text())


def test_the_multi_head_stage_shows_the_head_split_with_its_shapes(shown):
    shapes = [tuple(s.values["torch"].shape) for s in shown["multi-head"]]
    assert shapes[:4] == [(2, 6, 2), (2, 6, 2, 1), (2, 2, 6, 1), (2, 2, 6, 6)]
    assert [s.label.split(":")[0] for s in shown["multi-head"]][4:6] == ["head 0", "head 1"]
    split = by_label(shown, "multi-head", "heads before tokens")
    assert "keys.transpose(1, 2)" in split.code["torch"].text and "swapaxes(1, 2)" in split.code["numpy"].text


def test_causal_masking_way_1_is_way_2_and_the_notes_variants_are_not(shown):
    """Way 1 is softmax, then tril, then renormalise; it was scores * tril with no softmax."""
    way_1 = by_label(shown, "causal-masking", "way 1").values["torch"]
    way_2 = by_label(shown, "causal-masking", "way 2").values["torch"]
    np.testing.assert_allclose(way_1, way_2, atol=1e-6)
    np.testing.assert_allclose(way_1[1, :2], [0.4833, 0.5167], atol=5e-5)
    assert np.triu(way_1, 1).max() == 0 and np.allclose(way_1.sum(-1), 1)
    raw = by_label(shown, "causal-masking", "note 004's way 1").values["torch"]
    np.testing.assert_allclose(raw[1, :2], [0.3888, 0.6112], atol=5e-5)


def test_a_nan_row_is_printed_not_swallowed_as_markup(capsys):
    """rich read ``[nan nan nan]`` as a markup tag and printed nothing."""
    assert main(["walkthrough", "--stage", "softmax"]) == 0
    out = capsys.readouterr().out
    assert "[nan nan nan]" in out and "[0.0900 0.2447 0.6652]" in out


def test_the_stages_are_the_books_sections_in_order():
    numbered = [stage.section.split()[0] for stage in STAGES if stage.section[0].isdigit()]
    assert numbered == sorted(numbered) and numbered[0] == "3.3.1" and numbered[-1] == "4.4-4.7"
    assert not any("note 002" in stage.section or "note 004" in stage.section for stage in STAGES)


def test_each_stage_is_announced_into_a_pipe_before_it_computes(monkeypatch):
    """Into a pipe (block-buffered) the walkthrough printed nothing until the end."""
    import os
    import sys

    from parity_tests import walkthrough
    from parity_tests.walkthrough import Stage

    read, write = os.pipe()
    os.set_blocking(read, False)
    seen = []

    def probe():
        try:
            seen.append(os.read(read, 1 << 16).decode())
        except BlockingIOError:
            seen.append("")
        return []

    monkeypatch.setattr(
        walkthrough, "STAGES", [Stage("probe", "9.9 A probe", "Its text.", "simple:one_query")]
    )
    monkeypatch.setattr(Stage, "function", lambda self: probe)
    with os.fdopen(write, "w", buffering=1 << 16) as pipe:
        monkeypatch.setattr(sys, "stdout", pipe)
        assert main(["walkthrough"]) == 0
    os.close(read)
    assert "1. 9.9 A probe  (probe)" in seen[0] and "Its text." in seen[0]


# The bonus stages (the book's ch05/07_gpt_to_llama and ch05/11_qwen3 notebooks): nothing prints
# their values but the GQA example's shapes, so they are pinned by hand and by the book's own code.


def test_rope_turns_a_unit_vector_by_its_position(shown):
    """Head size 2: one pair at inv_freq 10000^0 = 1, so (1, 0) at position p is (cos p, sin p)."""
    step = by_label(shown, "rope", "a unit vector")
    expected = [[math.cos(p), math.sin(p)] for p in range(4)]
    for values in step.values.values():
        np.testing.assert_allclose(values, expected, atol=1e-6)


def test_rope_frequencies_and_cos_table_are_the_formula(shown):
    """inv_freq[i] = 10000^(-2i/16); cos[p, i] = cos(p * inv_freq[i]) for the book's head_dim 16."""
    inv_freq = [10_000.0 ** (-2 * i / 16) for i in range(8)]
    cos = [[math.cos(p * f) for f in inv_freq] for p in range(5)]
    for values in by_label(shown, "rope", "inv_freq").values.values():
        np.testing.assert_allclose(values, inv_freq, rtol=1e-6)
    for values in by_label(shown, "rope", "cos of positions").values.values():
        np.testing.assert_allclose(values, cos, atol=1e-6)


def book_queries_keys():
    """The book's RoPE example (converting-gpt-to-llama2.ipynb), drawn here as it draws them."""
    import torch

    torch.manual_seed(123)
    return torch.randn(2, 4, 5, 16).double().numpy(), torch.randn(2, 4, 5, 16).double().numpy()


def test_rope_turns_each_half_split_pair_of_the_books_query_by_its_angle(shown):
    """Position 2: pair i is (x[i], x[i + 8]), turned by 2 * 10000^(-2i/16); lengths are kept."""
    x = book_queries_keys()[0][0, 0, 2]
    x1, x2 = x[:8], x[8:]
    angle = 2 * 10_000.0 ** (-np.arange(0, 16, 2) / 16)
    expected = [x1 * np.cos(angle) - x2 * np.sin(angle), x2 * np.cos(angle) + x1 * np.sin(angle)]
    for values in by_label(shown, "rope", "the book's queries").values.values():
        np.testing.assert_allclose(values, expected, atol=2e-6)
        np.testing.assert_allclose((values**2).sum(0), x1**2 + x2**2, rtol=1e-5)


def test_rope_scores_depend_on_the_distance_alone(shown):
    """q at p against k at s: pair i contributes (q1 k1 + q2 k2) cos(phi) + (q2 k1 - q1 k2) sin(phi),
    phi = (s - p) * inv_freq[i]; every diagonal holds one number, the main one q . k unrotated."""
    queries, keys = book_queries_keys()
    q, k = queries[0, 0, 0], keys[0, 0, 0]
    inv_freq = 10_000.0 ** (-np.arange(0, 16, 2) / 16)
    (q1, q2), (k1, k2) = (q[:8], q[8:]), (k[:8], k[8:])
    phi = (np.arange(5)[None, :, None] - np.arange(5)[:, None, None]) * inv_freq  # (T, S, H/2)
    expected = ((q1 * k1 + q2 * k2) * np.cos(phi) + (q2 * k1 - q1 * k2) * np.sin(phi)).sum(-1)
    for values in by_label(shown, "rope", "one query and one key").values.values():
        np.testing.assert_allclose(values, expected, atol=1e-5)
        for distance in range(-4, 5):
            diagonal = np.diagonal(values, distance)
            np.testing.assert_allclose(diagonal, diagonal[0], atol=1e-5)
        np.testing.assert_allclose(np.diagonal(values), q @ k, atol=1e-5)
    assert not np.isclose(expected[1, 0], expected[0, 1])  # p - s, not |p - s|


def test_llama31_scaling_keeps_interpolates_and_divides_by_wavelength(shown):
    """Head size 128, base 500000: the wavelength 2 pi / f of pair i is 2 pi * 500000^(i/64); under
    8192 / 4 = 2048 for i <= 28 (kept), over 8192 for i >= 35 (divided by 8), between interpolated
    with s = (8192 / wavelength - 1) / (4 - 1): (1 - s) / 8 + s of the plain frequency."""
    wavelength = [2 * math.pi * 500_000.0 ** (i / 64) for i in range(64)]
    assert wavelength[28] < 2048 < wavelength[29] and wavelength[34] < 8192 < wavelength[35]
    smooth = [(8192 / w - 1) / 3 for w in wavelength[29:35]]
    expected = [1.0] * 29 + [(1 - s) / 8 + s for s in smooth] + [0.125] * 29
    for values in by_label(shown, "rope", "Llama 3.1's frequency scaling").values.values():
        np.testing.assert_allclose(values, expected, rtol=1e-6)


def test_rms_norm_is_torch_nn_rms_norm_on_the_books_example(shown):
    """The book's notebook checks its RMSNorm against torch.nn.RMSNorm(4, eps=1e-5); the rows' mean
    square is mean(x^2) / (mean(x^2) + eps), just under 1."""
    import torch

    torch.manual_seed(123)
    example_batch = torch.randn(2, 3, 4)
    expected = torch.nn.RMSNorm(4, eps=1e-5)(example_batch).detach().numpy()
    for values in by_label(shown, "gqa", "RMSNorm").values.values():
        np.testing.assert_allclose(values, expected, atol=1e-6)
    x = example_batch.double().numpy()
    mean_square = (x**2).mean(-1, keepdims=True)
    for values in by_label(shown, "gqa", "its rows' mean of squares").values.values():
        np.testing.assert_allclose(values, mean_square / (mean_square + 1e-5), atol=1e-6)


def test_the_books_gqa_shapes_and_count_come_from_the_books_code():
    """The book's own GroupedQueryAttention (llms_from_scratch.llama3), built on the meta device,
    has the shapes and the weight count its notebook prints."""
    import torch
    from llms_from_scratch import llama3

    with torch.device("meta"):
        gqa = llama3.GroupedQueryAttention(d_in=4096, d_out=4096, num_heads=32, num_kv_groups=8)
    shapes = [list(getattr(gqa, name).weight.shape) for name in ("W_key", "W_value", "W_query")]
    assert shapes == PRINTED["gqa_shapes"].values
    assert sum(p.numel() for p in gqa.parameters()) == PRINTED["gqa_parameters"].values == 41_943_040


def test_the_gqa_stage_shows_its_shapes(shown):
    shapes = {s.label: tuple(s.values["torch"].shape) for s in shown["gqa"]}
    assert list(shapes.values()) == [
        (2, 3, 4), (2, 3, 1), (3, 2), (), (6, 4), (2, 6, 2), (6, 2), (4, 2), (2, 6, 6), (6, 3)
    ]  # fmt: skip
    assert all(s.printed_agrees() for s in shown["gqa"] if s.printed)


def test_qk_norm_then_rope_keep_each_key_head_at_mean_square_one(shown):
    """QK-norm: each key head's mean square is m / (m + 1e-6) of its mean square m before; RoPE then
    turns token t of head size 2 by t radians, by hand."""
    normed = by_label(shown, "gqa", "QK-norm").values
    rotated = by_label(shown, "gqa", "RoPE after the norm").values
    for framework in FRAMEWORKS:
        assert np.all(np.abs((normed[framework] ** 2).mean(-1) - 1) < 3e-4)
        x1, x2 = normed[framework][0].T  # key head 0, (S,) each
        t = np.arange(6)
        expected = np.stack([x1 * np.cos(t) - x2 * np.sin(t), x2 * np.cos(t) + x1 * np.sin(t)], axis=-1)
        np.testing.assert_allclose(rotated[framework], expected, atol=1e-6)


def test_query_heads_share_key_heads_in_repeat_interleave_order(shown):
    """[K1, K1, K2, K2]: query heads 0 and 1 read key head 0 (whose token 1 the RoPE step shows),
    2 and 3 key head 1; repeat's [K1, K2, K1, K2] would give heads 0 and 1 different keys."""
    shared = by_label(shown, "gqa", "key heads shared").values
    head_0 = by_label(shown, "gqa", "RoPE after the norm").values
    for framework in FRAMEWORKS:
        keys = shared[framework]  # (N, H): token 1 as each query head reads it
        np.testing.assert_array_equal(keys[0], keys[1])
        np.testing.assert_array_equal(keys[2], keys[3])
        assert not np.allclose(keys[0], keys[2])
        np.testing.assert_array_equal(keys[0], head_0[framework][1])


def test_gqa_weights_are_causal_rows_that_sum_to_one(shown):
    for values in by_label(shown, "gqa", "attention weights").values.values():
        assert values.shape == (2, 6, 6) and np.all(np.triu(values, 1) == 0)
        np.testing.assert_allclose(values.sum(-1), 1, atol=1e-6)
