"""Gradient parity of uninstrumented ports: the first backward operation that goes wrong is located
on its line (a stop_gradient, an integer cast, a detached value, a custom_vjp/custom_jvp rule), and
the correct ports in every style (plain, jitted, NNX, nnx.jit, torch, custom rules) pass."""

import jax
import numpy as np
import pytest

from parity_tests.locate import locate, locate_gradients
from tests.ports.catalogue import (
    GRADIENT_BUGS,
    GRADIENT_PORTS,
    HERE,
    INTEGER_INPUTS,
    WITHOUT_PARAMS,
    Bug,
    inputs,
    integer_inputs,
    load,
    plant,
    reference,
)
from torch_ref import to_params


def run_port(port, source, directory, x, check=locate_gradients):
    kind, build = GRADIENT_PORTS[port]
    ref = reference(kind)
    params = to_params(ref)
    candidate = build(load(port, source, directory), params)
    return check(ref, candidate, x, params=None if port in WITHOUT_PARAMS else params)


@pytest.mark.parametrize("bug", GRADIENT_BUGS, ids=[b.name for b in GRADIENT_BUGS])
def test_planted_backward_bug_is_located_on_its_line(bug, tmp_path):
    source, line = plant(bug)
    x = integer_inputs() if bug.name in INTEGER_INPUTS else inputs()
    assert run_port(bug.port, source, tmp_path, x, check=locate).ok  # the forward pass is right
    report = run_port(bug.port, source, tmp_path, x)
    assert not report.ok
    expected, actual = f"{tmp_path / bug.port}.py:{line}", report.candidate_location
    assert actual == expected, f"\n{report}"
    assert report.first_divergence.startswith("gradient of")
    assert report.expected != report.actual
    assert any(bug.cause in cause for cause in report.causes), f"no cause with {bug.cause!r}:\n{report}"


def test_every_backward_bug_has_a_cause():
    assert [bug.name for bug in GRADIENT_BUGS if not bug.cause] == []


def test_an_integer_cast_on_one_use_of_the_input_names_the_cast_and_its_dtype(tmp_path):
    """The input also feeds the query and key projections: its gradient is not zero, only short of
    what the values' projection gives it. Before, the report named the cast's line with no cause."""
    bug = next(b for b in GRADIENT_BUGS if b.name == "grad_integer_cast_of_the_input")
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path, integer_inputs())
    assert report.actual != 0.0
    assert report.causes == [
        f"part of the gradient of input1 is lost: {tmp_path / bug.port}.py:{line} turns it into int32 "
        "(convert_element_type), and integers carry no gradient, so nothing comes back through that use; "
        "the gradient it has comes from its other uses"
    ]


def test_a_monitoring_listener_in_user_code_is_not_blamed_for_a_backward_rule(tmp_path):
    """jax calls jax.monitoring listeners while it traces the backward rule; one written in a
    user's file (here, this test file) returns None, not the rule's tuple of cotangents."""
    calls = []

    def listener(*args, **kwargs):
        calls.append(args)

    bug = next(b for b in GRADIENT_BUGS if b.name == "grad_custom_vjp_bwd_without_the_sum")
    source, line = plant(bug)
    jax.monitoring.register_event_duration_secs_listener(listener)
    try:
        report = run_port(bug.port, source, tmp_path, inputs())
    finally:
        jax.monitoring.unregister_event_duration_listener(listener)
    assert calls  # it ran while the gradients were located
    assert report.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"


@pytest.mark.parametrize("port", list(GRADIENT_PORTS))
def test_the_ports_without_bugs_have_the_reference_gradients(port, tmp_path):
    report = run_port(port, (HERE / f"{port}.py").read_text(), tmp_path, inputs())
    assert report.ok, f"\n{report}"


def test_a_stopped_gradient_is_explained_and_its_entry_shown(tmp_path):
    bug = GRADIENT_BUGS[0]
    source, _ = plant(bug)
    report = run_port(bug.port, source, tmp_path, inputs())
    assert report.first_divergence == "gradient of values"  # the reference's step name
    assert report.reference_location.endswith("torch_ref/multi_head.py:53")
    assert report.actual == 0.0 and report.expected != 0.0
    assert "stops the gradient" in report.causes[0]
    worst = np.unravel_index(np.argmax(np.abs(report.expected_value)), report.expected_value.shape)
    assert report.worst_index == tuple(int(i) for i in worst)


def test_a_custom_rule_off_by_a_factor_reads_the_factor(tmp_path):
    bug = next(b for b in GRADIENT_BUGS if b.name == "grad_custom_jvp_scale_not_square_root")
    source, _ = plant(bug)
    report = run_port(bug.port, source, tmp_path, inputs())
    assert "custom_jvp_call rule" in report.causes[0]
    assert report.causes[1] == "the cotangent is the reference's times 0.5"  # 1/4 for 1/sqrt(4)


def test_a_forward_divergence_is_reported_first(tmp_path):
    source = (HERE / "jax_mha.py").read_text().replace("/ jnp.sqrt(head_dim)", "/ head_dim")
    report = run_port("jax_mha", source, tmp_path, inputs())
    assert not report.ok
    assert report.causes[0].startswith("the forward pass already diverges")
    assert not report.first_divergence.startswith("gradient of")


def test_numpy_has_no_gradients(tmp_path):
    ref = reference("torch_ref")
    port = load("numpy_mha", (HERE / "numpy_mha.py").read_text(), tmp_path)
    with pytest.raises(TypeError, match="NumPy, which has no gradients"):
        locate_gradients(ref, port.mha, inputs(), params=to_params(ref))


def test_a_jax_model_whose_own_code_names_no_jax_has_its_gradients_checked_on_token_ids(tmp_path):
    """``jax_gpt2.gpt2`` calls its own helpers (one under ``jax.checkpoint``) and names no JAX global:
    its framework is a guess until it returns a JAX array. Gradient parity refused it as NumPy; it
    runs forward first, then in JAX with the gradients: correct on GPT-2's token ids, and a
    stop_gradient planted in a block is located on its line."""
    from tests.ports.models import MODEL_PORTS, token_ids

    make_reference, _, build = MODEL_PORTS["jax_gpt2"]
    ref = make_reference()
    candidate, weights = build(load("jax_gpt2", (HERE / "jax_gpt2.py").read_text(), tmp_path), ref)
    assert locate_gradients(ref, candidate, token_ids(), params=weights).ok
    bug = Bug(
        "grad_block_input_stopped",
        "jax_gpt2",
        'x = x + mlp(p["mlp"], norm(p["norm2"], x))',
        'x = x + mlp(p["mlp"], norm(p["norm2"], jax.lax.stop_gradient(x)))',
    )
    source, line = plant(bug)
    candidate, weights = build(load("jax_gpt2", source, tmp_path), ref)
    report = locate_gradients(ref, candidate, token_ids(), params=weights)
    assert report.candidate_location == f"{tmp_path / 'jax_gpt2'}.py:{line}", f"\n{report}"
    assert report.first_divergence.startswith("gradient of")
