"""check_port on code as users bring it (issue 13, item 7): each of these failed before."""

import functools

import jax
import numpy as np
import pytest
import torch
from flax import nnx

import jax_attn
import numpy_attn
from parity_tests import check_port
from parity_tests.cases import Case
from parity_tests.locate import Raised
from parity_tests.locate.cli import load_object
from parity_tests.locate.gradients import FORWARD_DIVERGES
from parity_tests.locate.run import NoGradients
from tests.ports.catalogue import BUGS, D_MODEL, HERE, NUM_HEADS, PORTS, inputs, load, plant, reference
from torch_ref import MultiHeadAttention, to_params

ROOT = HERE.parents[1]


def test_a_users_nnx_module_holds_its_weights():
    ref = reference("torch_ref")
    params = to_params(ref)
    module = load("nnx_mha", (HERE / "nnx_mha.py").read_text())
    candidate = module.MHA(8, 8, 2, rngs=nnx.Rngs(0)).load_torch(params)
    assert check_port(ref, candidate, inputs(), params=params).ok


def test_torch_multihead_attention_reference_with_its_tuple_output():
    torch.manual_seed(0)
    mha = torch.nn.MultiheadAttention(8, 2, batch_first=True)
    params = {k: v.detach().numpy() for k, v in mha.state_dict().items()}

    def port(p, query, key, value):
        b, t, d = query.shape
        q, k, v = np.split(query @ p["in_proj_weight"].T + p["in_proj_bias"], 3, axis=-1)
        q, k, v = (m.reshape(b, t, 2, -1).transpose(0, 2, 1, 3) for m in (q, k, v))
        w = numpy_attn.softmax(q @ k.transpose(0, 1, 3, 2) / 2.0, axis=-1)
        return (w @ v).transpose(0, 2, 1, 3).reshape(b, t, d) @ p["out_proj.weight"].T + p["out_proj.bias"]

    x = inputs()
    report = check_port(functools.partial(mha, need_weights=False), port, (x, x, x), params=params)
    assert report.ok, f"\n{report}"


def test_a_parameter_free_torch_reference_and_bfloat16_inputs_that_require_grad():
    class Softmax(torch.nn.Module):
        def forward(self, x):
            return torch.softmax(x, dim=-1)

    x = torch.tensor(inputs(), dtype=torch.bfloat16, requires_grad=True)
    report = check_port(Softmax(), lambda x: numpy_attn.softmax(x, axis=-1), x)
    assert report.ok, f"\n{report}"
    assert report.rows[-1].rtol == 2e-2  # compared at bfloat16's tolerance


def test_a_jitted_callable_gets_return_steps_as_a_static_value():
    case = Case("MultiHeadAttention", batch=2, tokens=5, d_in=4, d_out=6, num_heads=3, bias=True, seed=1)
    params = to_params(case.build_torch())
    jitted = jax.jit(functools.partial(jax_attn.multi_head_attention, **case.kwargs()))  # no static_argnames
    report = check_port(case.build_torch(), jitted, case.make_input(), params=params)
    assert report.ok and "attn_weights" in [row.step for row in report.rows]


def test_a_partial_of_a_torch_module():
    case = Case("MultiHeadAttention", batch=2, tokens=5, d_in=4, d_out=6, num_heads=3, bias=True, seed=1)
    module = case.build_torch()
    assert check_port(functools.partial(module), module, case.make_input()).ok


def test_a_misspelt_step_name_warns_with_the_nearest_name():
    case = Case("MultiHeadAttention", d_in=4, d_out=4, bias=True)
    params = to_params(case.build_torch())

    def port(params, x):
        output, steps = numpy_attn.multi_head_attention(
            params, x, num_heads=2, context_length=6, return_steps=True
        )
        return output, {"atn_scores": steps["attn_scores"]}

    with pytest.warns(
        UserWarning, match="'atn_scores' is not one of the project's step names; did you mean 'attn_scores'"
    ):
        check_port(case.build_torch(), port, case.make_input(), params=params)


def test_the_projects_block_model_and_decoder_step_names_warn_of_nothing():
    """A GPT and a Llama 3 checked against numpy_attn's functions: every step name they record
    (norm1, att, shortcut1, embeddings, final_norm, queries_rope...) is the project's."""
    import warnings

    from torch_ref import GPTModel, Llama3Model

    sizes = {"vocab_size": 50, "context_length": 8, "emb_dim": 8, "n_heads": 2, "n_layers": 1}
    gpt = {**sizes, "drop_rate": 0.0, "qkv_bias": False}
    llama = {**sizes, "hidden_dim": 16, "n_kv_groups": 1, "rope_base": 10_000.0, "rope_freq": None}
    torch.manual_seed(0)
    runs = {
        "GPTModel": (GPTModel(gpt), functools.partial(numpy_attn.gpt_model, config=gpt)),
        "Llama3Model": (
            Llama3Model({**llama, "dtype": torch.float32}),
            functools.partial(numpy_attn.llama3_model, cfg={**llama, "dtype": "float32"}),
        ),
    }
    for name, (model, port) in runs.items():
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            report = check_port(model, port, np.array([[1, 2, 3, 4]]), params=to_params(model))
        steps = [row.step for row in report.rows]
        assert report.ok and "trf_blocks.0.norm1" in steps and "final_norm" in steps, name


def test_steps_that_still_match_are_those_before_the_divergence():
    case = Case("MultiHeadAttention", d_in=4, d_out=4, bias=True)
    params = to_params(case.build_torch())

    def port(params, x):  # attn_scores wrong, the projections and the output right
        output, steps = numpy_attn.multi_head_attention(
            params, x, num_heads=2, context_length=6, return_steps=True
        )
        return output, {**steps, "attn_scores": steps["attn_scores"] + 1.0}

    report = check_port(case.build_torch(), port, case.make_input(), params=params)
    assert report.first_divergence == "attn_scores"
    assert report.causes[-1] == "steps that still match: queries, keys, values"


def test_a_candidate_raising_is_locates_report_and_a_reference_raising_raises(tmp_path):
    """check_port let a candidate's exception through, where locate and ``attn-parity diff`` report
    it: now its ``located`` is locate's report (the exception, the line, the lines verified before it)."""
    planted = '    raise ValueError("no y")'
    source = (HERE / "numpy_fused.py").read_text().replace("    y = att @ v", planted)
    candidate = load("port", source, tmp_path).attention
    port, line = tmp_path / "port.py", source.splitlines().index(planted) + 1
    ref = reference("user_torch")
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    report = check_port(ref, candidate, inputs(), params=params)
    assert not report.ok and report.rows == ()
    assert report.first_divergence == "the candidate raised ValueError: no y"
    located = report.located
    assert located.raised == "ValueError: no y"
    assert (located.candidate_location, located.candidate_op) == (f"{port}:{line}", planted.strip())
    assert len(located.verified) == 9 and located.verified[-1].startswith(f"{port}:18  ")
    assert report.causes == (
        f"the last value equal to the reference's is softmax ({HERE / 'torch_user_block.py'}:23), "
        f"computed at {port}:18",
    )
    assert str(report) == str(located)
    with pytest.raises(Raised, match=r"^ValueError: no y$") as raised:
        check_port(candidate, ref, inputs(), params=params)
    assert type(raised.value.error) is ValueError


def test_a_candidate_raising_only_as_check_port_first_calls_it_raises_its_own_exception():
    """locate runs it again to see what it computed; one that then does not raise is not reported."""
    calls = []

    def candidate(x):
        calls.append(x)
        if len(calls) == 1:
            raise ValueError("first call")
        return numpy_attn.softmax(x, axis=-1)

    with pytest.raises(ValueError, match=r"^first call$"):
        check_port(lambda x: numpy_attn.softmax(x, axis=-1), candidate, inputs())
    assert len(calls) == 2


def test_an_uninstrumented_numpy_port_is_located_to_its_line():
    """examples/my_port.py records no steps: the table compares only the output; check_port then
    runs locate, whose report names line 14 (the heads merged without moving the head axis back)."""
    port = ROOT / "examples" / "my_port.py"
    torch.manual_seed(123)
    ref = MultiHeadAttention(d_in=8, d_out=8, context_length=16, dropout=0.0, num_heads=2)
    x = np.random.default_rng(0).standard_normal((3, 5, 8)).astype(np.float32)
    report = check_port(ref, load_object(f"{port}:mha"), x, params=to_params(ref))
    located = report.located
    assert not report.ok and not located.ok
    assert (report.first_divergence, located.candidate_location) == ("context_vec", f"{port}:14")
    assert [(row.step, row.ok) for row in report.rows if row.note == ""] == [("output", False)]
    assert report.causes == tuple(located.causes)
    assert report.causes[0].startswith("the reference's numbers in another order: a reshape without")
    table, text = str(report).split("\nverified equal: ")
    assert table.startswith("step ") and table.endswith("NO")  # the output's row, last
    assert f"verified equal: {text}" == str(located)


@pytest.mark.parametrize(
    "name", ["jax_causal_mask_inverted", "jit_softmax_wrong_axis", "fused_scale_by_c"]
)  # a JAX function, a jitted one, and a NumPy port against a torch module recording no steps
def test_a_planted_bug_is_located_to_its_line_through_check_port(name, tmp_path):
    bug = next(b for b in BUGS if b.name == name)
    kind, build = PORTS[bug.port]
    ref = reference(kind)
    params = to_params(ref)
    source, line = plant(bug)
    report = check_port(ref, build(load(bug.port, source, tmp_path), params), inputs(), params=params)
    assert not report.ok
    assert report.located.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"
    assert report.first_divergence == report.located.first_divergence


def test_a_passing_check_and_a_divergence_its_steps_pinpoint_do_not_run_locate(monkeypatch):
    from parity_tests import port

    def no_locate(*args, **kwargs):
        raise AssertionError("locate ran")

    for name in ("locate", "locate_runs", "locate_gradients"):
        monkeypatch.setattr(port, name, no_locate)
    ref = reference("torch_ref")
    params = to_params(ref)
    steps = functools.partial(
        numpy_attn.multi_head_attention, num_heads=2, context_length=16, return_steps=True
    )
    assert check_port(ref, steps, inputs(), params=params).ok

    def scaled(params, x):  # every step recorded and right but the output
        output, recorded = steps(params, x)
        return 2 * output, recorded

    report = check_port(ref, scaled, inputs(), params=params)
    assert (report.ok, report.first_divergence, report.located) == (False, "output", None)


# --- the options check_port shares with locate ----------------------------------------------------

STEPS_PORT = functools.partial(jax_attn.multi_head_attention, num_heads=NUM_HEADS, context_length=16)


def test_train_mode_compares_the_steps_of_runs_dropping_the_same_entries():
    torch.manual_seed(0)
    dropping = MultiHeadAttention(D_MODEL, D_MODEL, 16, 0.2, num_heads=NUM_HEADS, qkv_bias=True)
    params = to_params(dropping)
    port = functools.partial(STEPS_PORT, dropout=0.2, key=jax.random.key(1))
    report = check_port(dropping, port, inputs(), params=params, train=True)
    assert report.ok, f"\n{report}"
    assert "attn_weights_dropped" in [row.step for row in report.rows if row.note == ""]
    # without train the reference runs in eval mode, as locate runs it, and is left in train mode
    assert check_port(dropping, port, inputs(), params=params).first_divergence == "attn_weights_dropped"
    assert check_port(dropping, STEPS_PORT, inputs(), params=params).ok and dropping.training


def test_gradients_are_compared_once_the_steps_match():
    ref = reference("torch_ref")
    params = to_params(ref)
    report = check_port(ref, STEPS_PORT, inputs(), params=params, gradients=True)
    assert report.ok and report.located.ok  # the gradient check's report, also when it passes

    def stopped(params, x, return_steps=False):  # the right forward pass
        params = {**params, "out_proj.weight": jax.lax.stop_gradient(params["out_proj.weight"])}
        return STEPS_PORT(params, x, return_steps=return_steps)

    assert check_port(ref, stopped, inputs(), params=params).ok
    report = check_port(ref, stopped, inputs(), params=params, gradients=True)
    assert not report.ok and all(row.ok for row in report.rows)
    assert report.first_divergence.startswith("gradient of"), f"\n{report}"
    assert "no gradient reaches the value of out_proj.weight" in report.causes[0]


def test_gradients_are_not_compared_past_a_forward_divergence_the_steps_name():
    ref = reference("torch_ref")

    def doubled_scores(params, x):
        output, steps = STEPS_PORT(params, x, return_steps=True)
        return output, {**steps, "attn_scores": 2 * steps["attn_scores"]}

    report = check_port(ref, doubled_scores, inputs(), params=to_params(ref), gradients=True)
    assert (report.first_divergence, report.located) == ("attn_scores", None)
    assert report.causes[0] == FORWARD_DIVERGES


def test_gradients_of_a_numpy_port_are_a_type_error():
    """``NoGradients``, a TypeError of its own: the CLI makes it a usage error, and no other."""
    ref = reference("torch_ref")
    port = functools.partial(numpy_attn.multi_head_attention, num_heads=NUM_HEADS, context_length=16)
    with pytest.raises(NoGradients, match="NumPy, which has no gradients"):
        check_port(ref, port, inputs(), params=to_params(ref), gradients=True)
