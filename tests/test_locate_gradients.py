"""Gradient parity of an uninstrumented JAX port against the torch reference."""

from parity_tests.locate.gradients import locate_gradients
from tests.ports.catalogue import HERE, inputs, load, reference
from torch_ref import to_params

SOURCE = (HERE / "jax_mha.py").read_text()


def test_a_correct_port_has_the_reference_gradients(tmp_path):
    ref = reference("torch_ref")
    report = locate_gradients(ref, load("jax_mha", SOURCE, tmp_path).mha, inputs(), to_params(ref))
    assert report.ok, f"\n{report}"
    assert [row.step for row in report.rows][:2] == ["out_proj.bias", "out_proj.weight"]
    assert report.rows[-1].step == "x"


def test_a_port_right_forward_and_wrong_backward_is_caught_at_its_weight(tmp_path):
    ref = reference("torch_ref")
    line = '    values = linear(params, "W_value", x)'
    source = SOURCE.replace(line, '    values = jax.lax.stop_gradient(linear(params, "W_value", x))')
    report = locate_gradients(ref, load("jax_mha_stopped", source, tmp_path).mha, inputs(), to_params(ref))
    assert not report.ok
    assert report.first_divergence == "W_value.bias"  # backward order: the value projection first
