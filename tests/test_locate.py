"""locate: captures in each framework, the report's fields, causes, heatmap and ecosystem references."""

import functools
import pathlib
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import torch

import numpy_attn
from parity_tests.locate import capture, locate
from parity_tests.locate.run import framework_of
from tests.ports.catalogue import BUGS, HERE, NUM_HEADS, PORTS, Bug, inputs, load, plant, reference
from torch_ref import MultiHeadAttention, to_params

PORTS_DIR = pathlib.Path(__file__).parent / "ports"


def planted(name, tmp_path):
    """The report for catalogue bug ``name`` and the planted line's location."""
    bug = next(b for b in BUGS if b.name == name)
    source, line = plant(bug)
    kind, build = PORTS[bug.port]
    ref = reference(kind)
    params = to_params(ref)
    report = locate(ref, build(load(bug.port, source, tmp_path), params), inputs(), params=params)
    return report, f"{tmp_path / bug.port}.py:{line}"


# --- the report -----------------------------------------------------------------------------------


def test_report_names_the_step_both_lines_the_worst_entry_and_the_cause(tmp_path):
    report, line = planted("np_queries_keys_swapped", tmp_path)
    assert not report.ok
    assert report.first_divergence == "attn_scores"
    assert report.candidate_location == line
    assert report.reference_location.endswith("torch_ref/multi_head.py:64")  # attn_scores = queries @ ...
    assert report.axes == ("batch", "head", "query", "key")
    assert report.expected_dtype == report.actual_dtype == "float32"
    expected, actual = report.expected_value, report.actual_value
    assert expected[report.worst_index] == pytest.approx(report.expected)
    assert actual[report.worst_index] == pytest.approx(report.actual)
    np.testing.assert_allclose(actual, np.swapaxes(expected, -1, -2), rtol=1e-5, atol=1e-5)
    assert any("transposed over (query, key)" in cause for cause in report.causes)
    verified_lines = [
        int(v.split()[0].rsplit(":", 1)[1]) for v in report.verified if v.startswith(str(tmp_path))
    ]
    assert verified_lines and max(verified_lines) < int(line.rsplit(":", 1)[1])


@pytest.mark.parametrize(
    "bug, step, cause",
    [
        ("np_scale_by_d_out", "attn_weights", "smaller by sqrt(num_heads)"),
        ("np_mask_inverted", "masked_scores", "mask inverted"),
        ("nnx_mask_inverted", "masked_scores", "mask inverted"),
        ("jit_mask_strict", "masked_scores", "mask off by one"),
        ("jit_softmax_wrong_axis", "attn_weights", "softmax over the wrong axis"),
        ("scan_softmax_over_queries", "attn_weights", "softmax over the wrong axis"),
        ("loop_softmax_over_queries", "attn_weights", "softmax over the wrong axis"),
        ("np_query_bias_missing", "queries", "a bias missing"),
        ("np_heads_merged_without_transpose", "context_vec", "reshape without the transpose"),
        ("np_mult_mask_heads_merged_without_transpose", "context_vec", "reshape without the transpose"),
        ("np_inline_softmax_heads_merged_without_transpose", "context_vec", "reshape without the transpose"),
        ("np_values_from_key_weights", "values", "equals the reference's keys"),
        ("jax_keys_from_query_projection", "keys", "equals the reference's queries"),
        ("np_buffer_same_value_head_each_time", "context_vec", "equals head 0 of the reference's values"),
        (
            "np_inplace_scale_by_head_dim",
            "masked_scores",
            "scale differs: yours is smaller by sqrt(head_dim)",
        ),
        ("np_inplace_scale_by_d", "masked_scores", "scale differs: yours is smaller by sqrt(num_heads)"),
        ("np_mask_keeps_next_token", "masked_scores", "causal mask off by one: the next token"),
        ("np_loop_queries_keys_swapped", "attn_scores", "transposed over (query, key)"),
        ("nnx_softmax_of_exp", "attn_weights", "scale differs: yours is larger by sqrt(head_dim)"),
        ("nnx_dropout_not_deterministic", "attn_weights", "a dropout left on"),
        ("np_batch_head_loop_scale_by_head_dim", "attn_scores", "smaller by sqrt(head_dim)"),
        ("np_batch_loop_scale_by_head_dim", "attn_scores", "smaller by sqrt(head_dim)"),
        ("np_mult_mask_scale_by_head_dim", "masked_scores", "smaller by sqrt(head_dim)"),
    ],
)
def test_causes_are_read_from_the_data(bug, step, cause, tmp_path):
    report, line = planted(bug, tmp_path)
    assert (report.first_divergence, report.candidate_location) == (step, line)
    assert any(cause in c for c in report.causes), report.causes
    assert not any(c.startswith("no mask applied") for c in report.causes), report.causes


@pytest.mark.parametrize(
    ("axis", "head", "jit"),
    [
        ("-2", 0, False),  # every head wrong
        ("-1 if h == 0 else -2", 1, False),  # the second head alone wrong
        ("-1 if h == 0 else -2", 1, True),  # jitted, its cache warm: the Python still followed
    ],
)
def test_a_jax_ports_python_loop_iteration_is_part_of_the_location(axis, head, jit, tmp_path):
    """A JAX port's loop over heads is unrolled into the traced program; each value still says
    which head it was computed for, as a NumPy port's do."""
    bug = Bug(
        "loop_bug", "jax_loop_heads", "w = jax.nn.softmax(s, axis=-1)", f"w = jax.nn.softmax(s, axis={axis})"
    )
    source, line = plant(bug)
    ref = reference("torch_ref")
    params = to_params(ref)
    port = load(bug.port, source, tmp_path).mha
    if jit:
        port = jax.jit(port, static_argnames="num_heads")
        port(params, inputs())  # traced and cached before locate runs it
    report = locate(ref, port, inputs(), params=params)
    assert report.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"
    number = next(i for i, s in enumerate(source.splitlines()) if "for h in range(num_heads):" in s) + 1
    assert report.candidate_loops == f"h = {head} (line {number})", f"\n{report}"
    assert f"    in loop: h = {head} (line {number})" in str(report).splitlines()
    assert any("softmax over the wrong axis" in c for c in report.causes), report.causes


def test_a_scale_left_out_is_the_cause_not_a_mask_the_port_applies(tmp_path):
    """The scores are masked but never scaled: the exp of the masked scores is compared with the
    reference's scaled masked scores; it has no -inf (exp made them 0), yet the mask was applied."""
    bug = Bug("np_scale_left_out", "numpy_scale_first", "s[...] = s / np.sqrt(hd)", "pass")
    source, _ = plant(bug)
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(ref, load(bug.port, source, tmp_path).mha, inputs(), params=params)
    assert report.candidate_location == f"{tmp_path / bug.port}.py:16"  # w = np.exp(s - s.max(...))
    assert report.causes == [
        "scale left out: this is computed from the reference's masked_scores as it is, where the "
        "reference scales it by 1/sqrt(head_dim) first"
    ]


def test_a_softmax_over_the_wrong_axis_written_over_two_lines_is_named(tmp_path):
    """The exp line is blamed (its value is no reference value); the cause is read from what the
    next line, ending the reference's one softmax, computes."""
    source = (
        (HERE / "numpy_scale_first.py").read_text().replace("max(-1", "max(-2").replace("sum(-1", "sum(-2")
    )
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(ref, load("numpy_scale_first", source, tmp_path).mha, inputs(), params=params)
    assert (report.first_divergence, report.candidate_location) == (
        "attn_weights",
        f"{tmp_path / 'numpy_scale_first.py'}:16",
    )
    assert any("softmax over the wrong axis" in c for c in report.causes), report.causes


def test_no_mask_applied_is_said_of_a_port_masking_nowhere(tmp_path):
    bug = Bug(
        "np_no_mask",
        "numpy_scale_first",
        "s = np.where(np.triu(np.ones((t, t), dtype=bool), k=1), -np.inf, s)",
        "pass",
    )
    source, _ = plant(bug)
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(ref, load(bug.port, source, tmp_path).mha, inputs(), params=params)
    assert NO_CAUSAL_MASK in report.causes, f"\n{report}"


NO_CAUSAL_MASK = (
    "no mask applied: the reference has -inf entries here, every key after its query: the causal mask "
    "is missing (pass is_causal=True or a mask)"
)


def test_dot_product_attention_without_is_causal_is_named_on_its_line(tmp_path):
    """The line computes the masked scores, the weights and the context in one call: its scores,
    where the reference masks them, hide nothing."""
    report, line = planted("dpa_not_causal", tmp_path)
    assert (report.first_divergence, report.candidate_location) == ("masked_scores", line)
    assert report.causes == [NO_CAUSAL_MASK], f"\n{report}"


def test_scaled_dot_product_attention_without_is_causal_is_named_on_its_line(tmp_path):
    """torch computes the scores inside the one captured call: what attention hiding nothing gives
    from the call's query, key and value equals its output, so its scores are set against the
    reference's masked ones (its inputs, right, are not blamed)."""
    report, line = planted("sdpa_not_causal", tmp_path)
    assert (report.first_divergence, report.candidate_location) == ("masked_scores", line), f"\n{report}"
    assert report.reference_location.endswith("torch_ref/multi_head.py:67")  # masked_fill_
    assert report.axes == ("batch", "head", "query", "key")
    assert report.causes == [NO_CAUSAL_MASK_SDPA], f"\n{report}"
    assert [v.rsplit(":", 1)[1] for v in report.verified] == ["12  unbind"]  # q, k, v = qkv.permute(...)


NO_CAUSAL_MASK_SDPA = (
    "no mask applied: the reference has -inf entries here, every key after its query: the causal mask "
    "is missing (pass is_causal=True or attn_mask)"
)


@pytest.mark.parametrize(
    "name, step, reference_line, verified",
    [
        # q scaled by 1/sqrt(hd) on its own line, then scale=1.0: recomputed with that scale, not 1/sqrt(E)
        ("sdpa_scale_not_causal", "masked_scores", "torch_ref/multi_head.py:67", ["14  unbind", "15  div"]),
        # keys and values (b, 1, t, h) broadcast over the query heads (b, n, t, h); its attn_mask dropped
        (
            "sdpa_mqa_mask_missing",
            "masked_fill",
            "tests/ports/torch_user_mqa.py:23",
            ["10  linear", "10  view", "11  linear", "11  __getitem__", "12  linear", "12  __getitem__"],
        ),
    ],
)
def test_scaled_dot_product_attention_with_scale_or_broadcast_heads_unmasked_is_named_on_its_line(
    name, step, reference_line, verified, tmp_path
):
    """The recomputation uses the call's ``scale=`` and broadcasts its batch dimensions as torch does."""
    report, line = planted(name, tmp_path)
    assert (report.first_divergence, report.candidate_location) == (step, line), f"\n{report}"
    assert report.reference_location.endswith(reference_line)
    assert report.axes == ("batch", "head", "query", "key")
    assert report.causes == [NO_CAUSAL_MASK_SDPA], f"\n{report}"
    assert [v.rsplit(":", 1)[1] for v in report.verified] == verified


def test_the_torch_capture_records_a_calls_numeric_keyword_arguments(tmp_path):
    """``scale=`` (and ``is_causal=``) of a fused attention call, which the checker recomputes it with."""
    ref = reference("torch_ref")
    params = to_params(ref)
    port = load("torch_sdpa_scale", (PORTS_DIR / "torch_sdpa_scale.py").read_text(), tmp_path).mha
    trace = capture(port, (inputs(),), params)
    (call,) = [r for r in trace.records if r.op == "scaled_dot_product_attention"]
    assert call.keywords == {"is_causal": True, "scale": 1.0}


def test_a_dropout_left_on_is_named_on_its_line_against_the_values_it_drops(tmp_path):
    """The NNX model is never put in eval mode: its dropout line is set against the reference's
    attention weights (not its mask buffer), of which it zeroes some and scales the others."""
    source = (HERE / "nnx_dropout_mha.py").read_text().replace("    model.eval()\n", "")
    module = load("nnx_dropout_mha", source, tmp_path)
    ref = reference("torch_ref")
    report = locate(ref, module.build(to_params(ref), 2), inputs())
    line = source.splitlines().index("        weights = self.dropout(weights)") + 1
    assert (report.first_divergence, report.candidate_location) == (
        "attn_weights",
        f"{tmp_path / 'nnx_dropout_mha.py'}:{line}",
    )
    assert report.reference_location.endswith("torch_ref/multi_head.py:69")  # the softmax
    dropped = (report.actual_value == 0) & (report.expected_value != 0)
    np.testing.assert_allclose(
        report.actual_value, np.where(dropped, 0, report.expected_value / 0.9), rtol=1e-5, atol=1e-6
    )
    assert report.causes == [
        f"entries dropped: yours equals the reference's value with {dropped.sum()} of 90 nonzero entries "
        "zeroed and the others scaled by 1/(1 - p), p = 0.1: a dropout left on where the reference drops "
        "none (call model.eval() or pass deterministic=True)"
    ], f"\n{report}"


def test_a_mask_computed_but_not_used_reproduces_nothing(tmp_path):
    """The masked scores are computed into a name the port never reads again: that dead value does
    not count as reproducing the reference's masked_scores (the step was attn_weights, no cause)."""
    bug = Bug(
        "np_mask_unused",
        "numpy_mha",
        "scores = np.where(mask, -np.inf, scores)",
        "masked = np.where(mask, -np.inf, scores)",
    )
    source, line = plant(bug)
    ref = reference("torch_ref")
    report = locate(ref, load(bug.port, source, tmp_path).mha, inputs(), params=to_params(ref))
    assert report.first_divergence == "masked_scores", f"\n{report}"
    assert report.causes[0] == (
        f"computed but not used: {tmp_path / bug.port}.py:{line} (masked = np.where(mask, -np.inf, "
        "scores)) equals the reference's masked_scores, but the output is not computed from it"
    )


@pytest.mark.parametrize(
    "port, loop, short, step, unwritten",
    [
        (
            "numpy_head_buffer",
            "for h in range(num_heads):",
            "for h in range(num_heads - 1):",
            "context_vec",
            "60 of 120 entries (head 1)",
        ),
        (
            "numpy_batch_loop",
            "for i in range(b):",
            "for i in range(b - 1):",
            "linear",
            "40 of 120 entries (batch 2)",
        ),
    ],
)
def test_a_buffer_its_loop_leaves_part_unwritten_is_said_so(port, loop, short, step, unwritten, tmp_path):
    """A loop one short leaves part of the np.zeros buffer unwritten: the buffer is blamed, compared
    with the value it should hold (not the scores), and no "0 times the reference" scale is read; the
    lines its loop computed right are verified, though they come after the buffer's line."""
    source, _ = plant(Bug("short_loop", port, loop, short))
    ref = reference("torch_ref")
    report = locate(ref, load(port, source, tmp_path).mha, inputs(), params=to_params(ref))
    buffer = next(i for i, text in enumerate(source.splitlines(), 1) if "np.zeros" in text)
    location = f"{tmp_path / port}.py:{buffer}"
    assert (report.first_divergence, report.candidate_location) == (step, location), f"\n{report}"
    assert report.causes == [
        f"never written: {unwritten} keep the value the buffer of {location} started with: the loop "
        "filling it stops short"
    ], f"\n{report}"
    lines = {v.split("  ", 1)[1] for v in report.verified}  # the loop's lines, after the buffer's
    assert "w /= w.sum(-1, keepdims=True)" in lines, report.verified


def test_a_port_filling_a_zeros_buffer_head_by_head_is_verified_line_by_line(tmp_path):
    """Each head's values are matched to one head of the reference's; the ``np.zeros`` buffer the
    loop overwrites is never compared (it was blamed as scores "0 times the reference")."""
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(
        ref,
        load("numpy_head_buffer", (HERE / "numpy_head_buffer.py").read_text()).mha,
        inputs(),
        params=params,
    )
    assert report.ok
    lines = {v.split("  ", 1)[1] for v in report.verified}
    assert {
        "qh = q[:, :, h * hd : (h + 1) * hd]",
        "s = s / np.sqrt(hd)",
        "s[:, np.triu(np.ones((t, t), bool), 1)] = -np.inf",
        "w /= w.sum(-1, keepdims=True)",
        "ctx[:, :, h * hd : (h + 1) * hd] = w @ vh",
    } <= lines, report.verified


def test_a_wrong_last_line_is_the_first_divergence_not_the_reference_mask(tmp_path):
    """Every value before the output is right: the reference's mask buffer (16 x 16, no candidate
    value of its size) is not the divergence, the output is, and it has a heatmap."""
    source = (PORTS_DIR / "numpy_mha.py").read_text().replace("    return out\n", "    return out * 1.01\n")
    line = source.splitlines().index("    return out * 1.01") + 1
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(ref, load("scaled_out", source, tmp_path).mha, inputs(), params=params)
    assert (report.first_divergence, report.candidate_location) == (
        "linear",
        f"{tmp_path / 'scaled_out.py'}:{line}",
    )
    assert report.reference_location.endswith("torch_ref/multi_head.py:78")  # the output projection
    np.testing.assert_allclose(report.actual_value, 1.01 * report.expected_value, rtol=1e-5)
    assert any("1.01 times the reference" in cause for cause in report.causes), report.causes
    assert report.write_heatmap(tmp_path / "out.png").max() >= 0


def test_rich_rendering_keeps_brackets_of_the_index_and_the_source():
    from rich.console import Console

    from parity_tests.locate.report import LocateReport

    report = LocateReport(
        False, "attn_scores", "port.py:3", "ref.py:4", "s = q[b] @ k[i].T", "matmul",
        worst_index=(1, 2), axes=("query", "key"), expected=1.0, actual=2.0,
        expected_dtype="float32", actual_dtype="float32", causes=["x[b] is wrong"],
    )  # fmt: skip
    console = Console(width=300, record=True)
    console.print(report)
    text = console.export_text()
    assert "s = q[b] @ k[i].T" in text and "[query=1, key=2] expected 1" in text and "x[b] is wrong" in text


def test_text_and_rich_renderings_name_both_lines(tmp_path):
    from rich.console import Console

    report, line = planted("np_mask_off_by_one", tmp_path)
    text = str(report)
    assert f"candidate: {line}" in text and "first divergence: masked_scores" in text
    console = Console(width=300, record=True)
    console.print(report)
    assert line in console.export_text()


def test_heatmap_puts_noise_below_the_tolerance_and_the_bug_above(tmp_path):
    report, _ = planted("np_queries_keys_swapped", tmp_path)
    units = report.write_heatmap(tmp_path / "first.png")
    assert (tmp_path / "first.png").stat().st_size > 0
    assert units.shape == (5, 5) and units.max() >= 2  # hot where the transposed scores differ
    assert np.isclose(np.diag(units), -2).all()  # the diagonal of a transpose is exact: coldest
    noise = report.expected_value * (1 + 1e-7)  # rounding-sized differences look cold
    report.actual_value = noise
    assert report.write_heatmap(tmp_path / "noise.png").max() < 0


def test_a_correct_port_reports_ok_and_refuses_a_heatmap(tmp_path):
    ref = reference("torch_ref")
    params = to_params(ref)
    report = locate(
        ref,
        load("numpy_mha", (PORTS_DIR / "numpy_mha.py").read_text(), tmp_path).mha,
        inputs(),
        params=params,
    )
    assert report.ok and report.first_divergence is None and report.candidate_location is None
    assert "ok: the outputs match" in str(report)
    with pytest.raises(ValueError, match="outputs match"):
        report.write_heatmap(tmp_path / "x.png")


def test_a_diverging_value_without_the_reference_layout_refuses_a_heatmap(tmp_path):
    from parity_tests.locate.report import NO_HEATMAP, LocateReport

    with pytest.raises(ValueError, match=f"^{re.escape(f'write_heatmap: {NO_HEATMAP}')}$"):
        LocateReport(False, "linear").write_heatmap(tmp_path / "x.png")
    assert not (tmp_path / "x.png").exists()


# --- captures -------------------------------------------------------------------------------------


def test_torch_capture_names_steps_parameters_buffers_and_module_paths():
    ref = reference("torch_ref")
    trace = capture(ref, (inputs(),))
    leaves = {r.leaf for r in trace.records if r.leaf}
    assert {"W_query.weight", "W_query.bias", "out_proj.weight", "mask", "input0"} <= leaves
    steps = {r.step: r for r in trace.records if r.step}
    assert {
        "queries",
        "keys",
        "values",
        "attn_scores",
        "masked_scores",
        "attn_weights",
        "context_vec",
    } <= set(steps)
    assert steps["queries"].module == "W_query" and steps["queries"].op == "linear"
    assert steps["attn_scores"].location.endswith("torch_ref/multi_head.py:64")


def test_jax_capture_descends_into_jit_cond_and_scan(tmp_path):
    source = """import jax
import jax.numpy as jnp


@jax.jit
def f(x):
    def body(carry, row):
        y = jnp.tanh(row) * 2.0
        return carry + y.sum(), y

    total, ys = jax.lax.scan(body, 0.0, x)
    return jax.lax.cond(total > -1e9, lambda v: v * 3.0, lambda v: v - 1.0, ys)
"""
    module = load("scanned", source, tmp_path)
    x = np.random.default_rng(0).standard_normal((4, 3)).astype(np.float32)
    trace = capture(module.f, (x,))
    lines = {r.location.rsplit(":", 1)[1] for r in trace.records if r.location.startswith(str(tmp_path))}
    assert {"8", "12"} <= lines  # the scan body's line and the taken branch's
    assert sum(r.op == "tanh" for r in trace.records) == 4  # one per iteration
    np.testing.assert_allclose(trace.records[trace.output].value, np.tanh(x) * 6.0, rtol=1e-6)
    bugged = load("scanned_bug", source.replace("jnp.tanh(row) * 2.0", "jnp.tanh(row) * 2.5"), tmp_path)
    report = locate(module.f, bugged.f, x)
    assert report.candidate_location == f"{tmp_path / 'scanned_bug.py'}:8"
    assert any("scale differs" in c for c in report.causes)


def test_jax_capture_descends_into_custom_jvp_custom_vjp_and_remat(tmp_path):
    source = """import jax
import jax.numpy as jnp


@jax.custom_vjp
def double(x):
    return x * 2.0


double.defvjp(lambda x: (x * 2.0, None), lambda _, g: (g * 2.0,))


@jax.checkpoint
def inner(x):
    return jnp.sin(x) + 1.0


def f(x):
    return double(inner(jax.nn.relu(x)))
"""
    module = load("custom", source, tmp_path)
    trace = capture(module.f, (np.linspace(-1, 1, 6).astype(np.float32),))
    ops = [(r.op, int(r.location.rsplit(":", 1)[1])) for r in trace.records if r.leaf is None]
    assert ops == [
        ("max", 19),
        ("sin", 15),
        ("add", 15),
        ("mul", 7),
    ]  # relu, the remat body, the custom_vjp body


def test_numpy_capture_records_in_place_updates_with_their_lines(tmp_path):
    source = """import numpy as np


def f(x):
    y = x * 2
    y[0] = -1.0
    y += 1
    return y
"""
    module = load("inplace", source, tmp_path)
    trace = capture(module.f, (np.ones((2, 2)),))
    by_line = {r.location.rsplit(":", 1)[1]: r.value for r in trace.records if r.leaf is None}
    np.testing.assert_array_equal(by_line["5"], np.full((2, 2), 2.0))
    np.testing.assert_array_equal(by_line["6"], [[-1.0, -1.0], [2.0, 2.0]])
    np.testing.assert_array_equal(by_line["7"], [[0.0, 0.0], [3.0, 3.0]])


def test_framework_is_read_from_the_code_each_callable_reads():
    def numpy_fn(x):
        return np.exp(x)

    def jax_fn(x):
        return jnp.exp(x)

    def torch_fn(x):
        return torch.exp(x)

    assert framework_of(numpy_fn) == "numpy"
    assert framework_of(jax_fn) == "jax"
    assert framework_of(jax.jit(numpy_fn)) == "jax"
    assert framework_of(torch_fn) == "torch"
    assert framework_of(functools.partial(reference("torch_ref"))) == "torch"


# --- references from the ecosystem and inputs from anywhere -------------------------------------


def _mha_port(p, query, key, value, num_heads=2, scale=0.5):
    b, t, d = query.shape
    q, k, v = np.split(query @ p["in_proj_weight"].T + p["in_proj_bias"], 3, axis=-1)
    q, k, v = (m.reshape(b, t, num_heads, -1).transpose(0, 2, 1, 3) for m in (q, k, v))
    s = q @ k.transpose(0, 1, 3, 2) * scale
    w = np.exp(s - s.max(-1, keepdims=True))
    w = w / w.sum(-1, keepdims=True)
    return (w @ v).transpose(0, 2, 1, 3).reshape(b, t, d) @ p["out_proj.weight"].T + p["out_proj.bias"]


def test_torch_multihead_attention_is_a_reference_despite_its_tuple_output():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    params = {k: v.detach().numpy() for k, v in mha.state_dict().items()}
    x = inputs()
    assert locate(functools.partial(mha, need_weights=False), _mha_port, (x, x, x), params=params).ok
    wrong = functools.partial(_mha_port, scale=1.0)
    report = locate(functools.partial(mha, need_weights=False), wrong, (x, x, x), params=params)
    assert not report.ok


def test_jax_function_reference_and_torch_bfloat16_inputs_that_require_grad():
    rng = np.random.default_rng(0)
    q, k, v = (rng.standard_normal((2, 5, 2, 4)).astype(np.float32) for _ in range(3))

    def port(q, k, v):
        s = np.einsum("btnh,bsnh->bnts", q, k) / np.sqrt(q.shape[-1])
        w = np.exp(s - s.max(-1, keepdims=True))
        return np.einsum("bnts,bsnh->btnh", w / w.sum(-1, keepdims=True), v)

    assert locate(jax.nn.dot_product_attention, port, (q, k, v)).ok
    tensors = tuple(torch.tensor(a, dtype=torch.bfloat16, requires_grad=True) for a in (q, k, v))
    report = locate(jax.nn.dot_product_attention, port, tensors)
    assert report.ok, f"\n{report}"


def test_a_parameter_free_torch_reference_and_a_partial_of_a_torch_module():
    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)

    x = inputs()
    report = locate(Softmax(), lambda x: np.exp(x) / np.exp(x).sum(-1, keepdims=True), x)
    assert report.ok
    module = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2)
    assert locate(functools.partial(module), module, x).ok


def test_project_steps_and_captured_values_agree():
    import numpy_attn

    ref = reference("torch_ref")
    params = to_params(ref)
    candidate = functools.partial(numpy_attn.multi_head_attention, num_heads=2, context_length=16)
    trace = capture(candidate, (inputs(),), params)
    named = {r.step for r in trace.records if r.step}
    assert {"queries", "attn_scores", "attn_weights", "context_vec"} <= named  # return_steps, found by value
    assert locate(ref, candidate, inputs(), params=params).ok


def test_the_reference_runs_in_eval_mode_and_keeps_its_mode(tmp_path):
    ref = MultiHeadAttention(8, 8, 16, 0.5, num_heads=2, qkv_bias=True)  # dropout 0.5, training mode
    params = to_params(ref)
    port = load("numpy_mha", (PORTS_DIR / "numpy_mha.py").read_text(), tmp_path).mha
    assert locate(ref, port, inputs(), params=params).ok  # dropout off: no random draw to match
    assert ref.training


def test_a_bug_inside_lines_the_reference_computes_in_one_op_is_blamed_on_its_own_line(tmp_path):
    """The port's softmax helper spans three lines where torch_ref computes one ``softmax``: its
    steps (row maximum, exponent, row sum) are compared line by line, so the wrong sum's line is
    blamed, not the helper's first line; a bug the steps cannot tell apart still names the lines."""
    source = (HERE / "numpy_mha.py").read_text()
    planted_source = source.replace(
        "    return e / e.sum(axis=axis, keepdims=True)", "    return e / e.sum(axis=-2, keepdims=True)"
    )
    ref = reference("torch_ref")
    port = load("numpy_mha", planted_source, tmp_path)
    report = locate(ref, port.mha, inputs(), params=to_params(ref))
    assert report.candidate_location == f"{tmp_path / 'numpy_mha.py'}:9", f"\n{report}"  # the sum's line
    assert any("softmax over the wrong axis" in cause for cause in report.causes), report.causes
    assert not any("in one operation" in cause for cause in report.causes)
    single, _ = planted("np_scale_by_d_out", tmp_path)  # a bug in one line: no such cause
    assert not any("in one operation" in cause for cause in single.causes)


def test_all_zeros_is_not_read_as_a_scale():
    """Zeros where the reference has numbers (entries never written) are no "0 times the reference"."""
    from parity_tests.locate.causes import read_causes

    expected = np.random.default_rng(0).standard_normal((2, 5, 4))
    causes = read_causes(expected, np.zeros_like(expected), ["head", "token", "head_dim"], {}, 1e-5, 1e-6)
    assert not any("times the reference" in c for c in causes), causes


@pytest.mark.parametrize("error, ok", [(1e-4, False), (3e-5, False), (1e-7, True)])
def test_a_relative_error_just_past_float32s_tolerance_is_found_and_one_below_it_is_not(error, ok):
    """The locator compares with the project's tolerance table (float32: rtol 1e-5): a port off by
    1e-4 or 3e-5 of its output diverges; one off by rounding-sized 1e-7 does not."""
    ref = reference("torch_ref")
    params = to_params(ref)

    def port(params, x):  # the book's class in NumPy, its output off by a relative ``error``
        out = numpy_attn.multi_head_attention(params, x, num_heads=NUM_HEADS, context_length=16)
        return out * np.float32(1 + error)

    report = locate(ref, port, inputs(), params=params)
    assert report.ok is ok
