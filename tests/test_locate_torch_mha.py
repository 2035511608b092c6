"""torch.nn.MultiheadAttention as the reference is decomposed into its steps (in-projection,
scores, softmax, context, out-projection), so a bug inside a port of it is located on its line,
whether or not the reference is asked for its attention weights."""

import functools

import numpy as np
import pytest
import torch

from parity_tests.locate import locate, locate_gradients
from parity_tests.locate.run import capture
from parity_tests.tolerances import tolerance_for
from tests.ports.catalogue import HERE, inputs, load

SOURCE = (HERE / "jax_torch_mha.py").read_text()


def torch_mha(need_weights):
    torch.manual_seed(0)
    module = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    params = {name: value.detach().numpy() for name, value in module.state_dict().items()}
    return functools.partial(module, need_weights=need_weights), params


def test_its_steps_are_captured_and_its_output_kept():
    reference, params = torch_mha(need_weights=False)
    x = inputs()
    trace = capture(reference, (x, x, x), params)
    ops = [record.op for record in trace.records if record.leaf is None]
    assert "multi_head_attention_forward" not in ops
    assert {"linear", "mul", "bmm", "softmax"} <= set(ops)  # in-projection, scale, scores, softmax
    expected, _ = reference(*(torch.from_numpy(v) for v in (x, x, x)))  # its fused path
    rtol, atol = tolerance_for("float32")
    np.testing.assert_allclose(trace.records[trace.output].value, expected.detach().numpy(), rtol, atol)
    assert reference(*(torch.from_numpy(v) for v in (x, x, x)))[1] is None  # as asked


@pytest.mark.parametrize("need_weights", [False, True])
def test_a_correct_port_matches(need_weights, tmp_path):
    reference, params = torch_mha(need_weights)
    x = inputs()
    report = locate(reference, load("jax_torch_mha", SOURCE, tmp_path).mha, (x, x, x), params=params)
    assert report.ok, f"\n{report}"


@pytest.mark.parametrize(
    ("line", "planted"),
    [
        ("weights = jax.nn.softmax(scores, axis=-1)", "weights = jax.nn.softmax(scores, axis=-2)"),
        (
            "v = (value @ w_v.T + b_v).reshape(b, -1, num_heads, d // num_heads).transpose(0, 2, 1, 3)",
            "v = (value @ w_k.T + b_v).reshape(b, -1, num_heads, d // num_heads).transpose(0, 2, 1, 3)",
        ),
        (
            "context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)",
            "context = (weights @ v).reshape(b, t, d)",
        ),
        (  # the reference scales its queries: scores scaled once more are no legitimate layout
            "scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // num_heads)",
            "scores = q @ k.transpose(0, 1, 3, 2) / (d // num_heads)",
        ),
    ],
    ids=["softmax_over_queries", "values_from_key_weights", "merged_without_transpose", "scale_not_root"],
)
def test_a_bug_inside_is_located_on_its_line(line, planted, tmp_path):
    reference, params = torch_mha(need_weights=False)
    lines = SOURCE.splitlines()
    number = next(i for i, text in enumerate(lines) if text.strip() == line) + 1
    port = load("jax_torch_mha", SOURCE.replace(line, planted), tmp_path)
    x = inputs()
    report = locate(reference, port.mha, (x, x, x), params=params)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / 'jax_torch_mha.py'}:{number}", f"\n{report}"


def test_its_gradients_are_compared_step_by_step(tmp_path):
    reference, params = torch_mha(need_weights=False)
    x = inputs()
    port = load("jax_torch_mha", SOURCE, tmp_path)
    assert locate_gradients(reference, port.mha, (x, x, x), params=params).ok
    line = "weights = jax.nn.softmax(scores, axis=-1)"
    stopped = SOURCE.replace(line, "weights = jax.lax.stop_gradient(jax.nn.softmax(scores, axis=-1))")
    stopped_port = load("jax_torch_mha", stopped, tmp_path)
    report = locate_gradients(reference, stopped_port.mha, (x, x, x), params=params)
    number = SOURCE.splitlines().index(f"    {line}") + 1
    assert report.candidate_location == f"{tmp_path / 'jax_torch_mha.py'}:{number}", f"\n{report}"
