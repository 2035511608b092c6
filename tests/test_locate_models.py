"""Whole models: every bug planted in the whole-model ports (``model_bugs.MODEL_BUGS``: a functional
NumPy GPT-2, a JAX GPT-2 on a pytree with and without ``jax.jit``, a Flax NNX GPT-2, a Flax linen
block with nested ``vmap`` and a chunked ``scan`` path, a minGPT-style torch GPT) is located on the
planted statement, with the cause the data shows (every bug has one), and the ports without bugs
pass (no false alarm). The references are transformers' ``GPT2LMHeadModel`` and a user's
minGPT-style torch GPT (``models.MODEL_PORTS``)."""

import functools

import pytest

from parity_tests.locate import locate
from tests.ports.catalogue import HERE, Bug, load, plant
from tests.ports.model_bugs import MODEL_BUGS
from tests.ports.models import MODEL_PORTS, SOURCES


def source_file(port: str) -> str:
    return SOURCES.get(port, port)


@functools.cache
def built(make_reference):
    """``make_reference()``, built once for the module: locate and the ports' builders only read it
    (its weights, its state dict), so every test is given the same model."""
    return make_reference()


def run_model(port, source, directory=None, seed=0):
    make_reference, make_inputs, build = MODEL_PORTS[port]
    reference = built(make_reference)
    candidate, weights = build(load(source_file(port), source, directory), reference)
    return locate(reference, candidate, make_inputs(seed), params=weights)


def planted(bug):
    """The port file's source with ``bug`` planted, and the planted line's number."""
    return plant(Bug(bug.name, source_file(bug.port), bug.line, bug.planted))


def test_every_model_bug_has_a_cause():
    assert [bug.name for bug in MODEL_BUGS if not bug.cause] == []


SEEDS = [0, *(pytest.param(seed, marks=pytest.mark.slow) for seed in (1, 2))]  # other inputs: slow


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("bug", MODEL_BUGS, ids=[bug.name for bug in MODEL_BUGS])
def test_planted_model_bug_is_located_on_its_line(bug, seed, tmp_path):
    source, line = planted(bug)
    report = run_model(bug.port, source, tmp_path, seed)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / source_file(bug.port)}.py:{line}", f"\n{report}"
    assert any(bug.cause in cause for cause in report.causes), f"no cause with {bug.cause!r}:\n{report}"
    if bug.port == "numpy_gpt2":  # the statement blamed, as written (not a helper's line it calls)
        assert report.candidate_op == bug.planted, f"\n{report}"
    if report.worst_index is not None:  # never a float value's entry set against a mask's
        assert (report.expected_dtype == "bool") == (report.actual_dtype == "bool"), f"\n{report}"


@pytest.mark.parametrize("seed", SEEDS)
@pytest.mark.parametrize("port", list(MODEL_PORTS))
def test_the_model_ports_without_bugs_pass(port, seed):
    report = run_model(port, (HERE / f"{source_file(port)}.py").read_text(), seed=seed)
    assert report.ok, f"\n{report}"
    assert report.verified


def test_the_report_names_the_loops_and_the_reference_module(tmp_path):
    """A bug in a helper called per head, per block and per sequence: the report gives the
    iterations it went wrong in (the first sequence, the first block, the first head) and the
    transformers module computing the reference value."""
    bug = next(b for b in MODEL_BUGS if b.name == "np_scale_left_out")
    source, line = planted(bug)
    report = run_model(bug.port, source, tmp_path)
    number = lambda text: next(i for i, s in enumerate(source.splitlines()) if text in s) + 1  # noqa: E731
    loops = [
        f"ids #0 (line {number('for ids in token_ids])')})",  # the batch glue's comprehension
        f"params #0 (line {number('for params in blocks:')})",  # the first block
        f"(qh, kh, vh) #0 (line {number('out_heads = [attention(')})",  # the first head
    ]
    assert report.candidate_loops == ", ".join(loops), f"\n{report}"
    assert report.reference_module == "transformer.h.0.attn", f"\n{report}"
    text = str(report).splitlines()
    at = text.index(f"    in loop: {report.candidate_loops}")
    assert text[at - 1] == f"  candidate: {report.candidate_location}  ({report.candidate_op})"
    assert text[at + 1].startswith("  reference: ") and text[at + 1].endswith(" in transformer.h.0.attn)")


@pytest.mark.parametrize(
    ("name", "first", "module"),
    [
        ("np_softmax_over_queries_in_helper", "softmax", "transformer.h.0.attn"),  # not the bool mask
        ("np_norm_std_for_variance", "layer_norm", "transformer.h.0.ln_1"),  # not the positions' arange
        ("np_projection_weight_transposed", "view", "transformer.h.0.attn.c_proj"),  # nor the ids' view
        ("chunk_softmax_over_queries", "softmax", "attn"),  # not the mask buffer's slice
    ],
)
def test_the_first_divergence_is_a_value_not_a_mask_nor_token_ids(name, first, module, tmp_path):
    """The reference side of the report: the value the port's numbers part from, not a mask the
    port holds in another form nor the token ids and positions it indexes with."""
    bug = next(b for b in MODEL_BUGS if b.name == name)
    source, _ = planted(bug)
    report = run_model(bug.port, source, tmp_path)
    assert (report.first_divergence, report.reference_module) == (first, module), f"\n{report}"


def test_a_mask_with_the_references_meaning_used_the_other_way_names_the_line_making_it(tmp_path):
    """A mask made equal to the reference's (True = hidden) and used by a where as True = kept: either
    line may be the wrong one, and fixing either fixes the port. Made by a negation
    (linen_mask_inverted: ``~jnp.tril(...)``), the negation's line is blamed, naming the where (the
    same program is a correct negated mask whose where has its branches swapped: dropping the
    negation fixes that too); made otherwise (``jnp.triu(..., k=1)``), the where is blamed, naming
    the mask's line; a mask of the other meaning used the other way (nnx_mask_inverted, a library's
    mask) names no other line."""
    bugs = {bug.name: bug for bug in MODEL_BUGS}
    path = tmp_path / source_file("linen_block")
    source, line = planted(bugs["linen_mask_inverted"])
    report = run_model("linen_block", source, tmp_path)
    assert report.candidate_location == f"{path}.py:{line}", f"\n{report}"
    negation = "the mask made here by a negation (not) is the reference's as it is, True = hidden, but "
    negation += f"{path}.py:{line + 1}"
    assert any(cause.startswith(negation) for cause in report.causes), f"\n{report}"
    triu = Bug(
        "",
        "linen_block",
        bugs["linen_mask_inverted"].line,
        "causal = jnp.triu(jnp.ones((t, t), dtype=bool), k=1)",
    )
    source, line = planted(triu)
    report = run_model("linen_block", source, tmp_path)
    assert report.candidate_location == f"{path}.py:{line + 1}", f"\n{report}"
    assert any(cause.startswith(f"the mask it takes ({path}.py:{line}, ") for cause in report.causes), (
        f"\n{report}"
    )
    source, line = planted(bugs["nnx_mask_inverted"])
    report = run_model("nnx_gpt2", source, tmp_path)
    assert report.candidate_location.endswith(f".py:{line}"), f"\n{report}"
    assert not any("the mask it takes" in c or "negation" in c for c in report.causes), f"\n{report}"
