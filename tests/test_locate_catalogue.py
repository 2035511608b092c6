"""The bug catalogue: every bug planted in an uninstrumented user-style port is caught on its line
with the cause the numbers show, and the ports without bugs pass."""

import numpy as np
import pytest

from parity_tests.locate import locate
from tests.ports.catalogue import BUGS, HERE, PORTS, WITHOUT_PARAMS, Bug, inputs, load, plant, reference
from torch_ref import to_params


def run_port(port, source, directory, x=None):
    kind, build = PORTS[port]
    ref = reference(kind)
    params = to_params(ref)
    candidate = build(load(port, source, directory), params)
    x = inputs() if x is None else x
    return locate(ref, candidate, x, params=None if port in WITHOUT_PARAMS else params)


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_planted_bug_is_located_on_its_line(bug, tmp_path):
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path)
    assert not report.ok
    expected, actual = f"{tmp_path / bug.port}.py:{line}", report.candidate_location
    assert actual == expected, f"\n{report}"
    assert any(bug.cause in cause for cause in report.causes), f"no cause with {bug.cause!r}:\n{report}"


def test_every_bug_in_the_catalogue_has_a_cause():
    assert [bug.name for bug in BUGS if not bug.cause] == []


# Causes once said of these bugs that the numbers do not reproduce: a scale read from the few
# entries both masks keep (the mask transposed), "scale left out" of a port scaling before its mask
# (then normalising over the wrong axis) or by another factor.
NOT_SAID = {
    "loop_mask_transposed": "scale differs",
    "loop_softmax_over_queries": "scale left out",
    "scan_softmax_over_queries": "scale left out",
    "np_scale_by_d_out": "scale left out",
    "jaxfused_scale_by_heads": "scale left out",
    "jax_scale_not_square_root": "scale left out",
}


@pytest.mark.parametrize("name", list(NOT_SAID))
def test_a_cause_is_named_only_where_it_reproduces_the_value(name, tmp_path):
    bug = next(b for b in BUGS if b.name == name)
    source, _ = plant(bug)
    report = run_port(bug.port, source, tmp_path)
    assert not any(NOT_SAID[name] in cause for cause in report.causes), f"\n{report}"


@pytest.mark.parametrize("port", list(PORTS))
def test_the_ports_without_bugs_pass(port, tmp_path):
    report = run_port(port, (HERE / f"{port}.py").read_text(), tmp_path)
    assert report.ok, f"\n{report}"
    assert report.verified  # the lines found equal to the reference's values


COLLIDING = (2, 4, 8)  # B == N == 2 and T == H == 4: axes of equal size


def colliding_inputs():
    return np.random.default_rng(0).standard_normal(COLLIDING).astype(np.float32)


@pytest.mark.parametrize("port", list(PORTS))
def test_the_ports_without_bugs_pass_when_axis_sizes_collide(port, tmp_path):
    report = run_port(port, (HERE / f"{port}.py").read_text(), tmp_path, colliding_inputs())
    assert report.ok, f"\n{report}"


@pytest.mark.parametrize(
    "name",
    [
        "np_heads_merged_without_transpose",  # (T, N) merged as (N, T), N == B
        "np_mult_mask_heads_merged_without_transpose",  # the same, merged where the product is taken
        "np_inline_softmax_heads_merged_without_transpose",  # ... and the softmax normalised
        "jax_values_split_without_transpose",  # (T, N, H) read as (N, T, H)
        "jax_weights_transposed_in_context",  # (T, S) used as (S, T)
    ],
)
def test_a_bug_swapping_axes_of_equal_size_is_located_on_its_line(name, tmp_path):
    bug = next(b for b in BUGS if b.name == name)
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path, colliding_inputs())
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"


@pytest.mark.parametrize(
    "name",
    [
        "np_heads_merged_without_transpose",  # ctx = ctx.reshape(b, t, d_out), after ctx = weights @ v
        "np_mult_mask_heads_merged_without_transpose",  # ctx = (weights @ v).reshape(b, t, d)
        "np_inline_softmax_heads_merged_without_transpose",  # (weights / weights.sum(...) @ v).reshape(...)
    ],
)
def test_heads_merged_without_transpose_in_one_statement_is_reported_as_on_its_own_line(name, tmp_path):
    """The heads merged without the transpose on a line of their own, or in the statement computing
    the product with the values (and the softmax's normalisation): the same step, reference line and
    cause. In one statement the line takes the values, not the product: set against the values'
    transpose, it was reported at attn_scores (multi_head.py:62) with no cause."""
    bug = next(b for b in BUGS if b.name == name)
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path)
    assert (report.first_divergence, report.candidate_location) == (
        "context_vec",
        f"{tmp_path / bug.port}.py:{line}",
    ), f"\n{report}"
    assert report.reference_location.endswith("torch_ref/multi_head.py:76"), f"\n{report}"  # the view
    assert report.reference_op == "view"
    assert report.axes == ("batch", "token", "feature")
    assert report.causes == [
        "the reference's numbers in another order: a reshape without the transpose (heads split or "
        "merged in the wrong order) or axes permuted"
    ]


@pytest.mark.parametrize(
    ("name", "colliding"),
    [
        ("np_einsum_values_from_key_weights", True),  # B * T == D: the keys' view parts from their class
        ("np_buffer_values_from_key_weights", False),  # used one head at a time in a loop
        ("jax_loop_values_from_key_weights", False),  # computed one head at a time
        ("jax_scan_values_from_key_weights", False),  # a helper called twice for the keys: its call
    ],
)
def test_values_projected_with_the_key_weights_are_blamed_where_they_are_computed(name, colliding, tmp_path):
    """The values computed from the key weights on a line before they are used (QA): they equal the
    keys, held already by the line computing those, while the reference's values are held nowhere.
    The line computing them is blamed, with the reference's keys and the values due there; it was
    listed as verified and the blame fell on a later line using them (a reshape, the loop, the
    scan), with no cause."""
    bug = next(b for b in BUGS if b.name == name)
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path, colliding_inputs() if colliding else None)
    location = f"{tmp_path / bug.port}.py:{line}"
    assert (report.candidate_location, report.first_divergence) == (location, "values"), f"\n{report}"
    assert not any(v.startswith(f"{location}  ") for v in report.verified), f"\n{report}"
    reference = report.reference_location.rsplit(":", 1)[0]
    assert report.reference_location == f"{reference}:53", f"\n{report}"  # linear in W_value
    assert report.causes == [
        f"this value equals the reference's keys ({reference}:51), where its values ({reference}:53) "
        "are due: taken from the wrong variable or weights"
    ], f"\n{report}"


def test_the_report_names_the_loop_and_the_reference_module(tmp_path):
    """A wrong bias on the queries of one head, in a loop over heads: the report names the
    iteration (``i = 1``, the second head) and the torch module computing the reference value
    (``W_query``, not the keys computed before it, which the loop holds one head at a time)."""
    bug = Bug(
        "np_loop_query_bias_of_the_first_head_only",
        "numpy_loop_heads",
        "q = x @ wq[rows].T + bq[rows]",
        "q = x @ wq[rows].T + bq[rows] * (i == 0)",
    )
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path)
    assert report.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"
    loop = f"i = 1 (line {source.splitlines().index('    for i in range(num_heads):') + 1})"
    assert (report.candidate_loops, report.reference_module) == (loop, "W_query"), f"\n{report}"
    assert report.first_divergence == "queries"
    text = str(report).splitlines()
    at = text.index(f"    in loop: {loop}")
    assert text[at - 1].startswith(f"  candidate: {report.candidate_location}")
    assert text[at + 1].startswith("  reference: ") and text[at + 1].endswith("(linear in W_query)")

    from rich.console import Console

    console = Console(width=300, record=True)
    console.print(report)
    rendered = console.export_text()
    assert "in loop" in rendered and loop in rendered and "linear in W_query" in rendered
