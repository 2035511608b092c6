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
from tests.ports.catalogue import HERE, inputs, load, reference
from torch_ref import to_params


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
    it: now its report is locate's (the exception, the line, the lines verified before it)."""
    planted = '    raise ValueError("no y")'
    source = (HERE / "numpy_fused.py").read_text().replace("    y = att @ v", planted)
    candidate = load("port", source, tmp_path).attention
    port, line = tmp_path / "port.py", source.splitlines().index(planted) + 1
    ref = reference("user_torch")
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    report = check_port(ref, candidate, inputs(), params=params)
    assert not report.ok and report.rows == ()
    assert report.first_divergence == "the candidate raised ValueError: no y"
    located = report.raised
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
