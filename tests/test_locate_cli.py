"""``attn-parity diff`` on a user's files, and ``locate_shapes`` for bugs that show only at some shapes."""

import functools
import io

import numpy as np
import pytest
from rich.console import Console

from parity_tests import check_port
from parity_tests.cli import main
from parity_tests.locate import locate, locate_shapes
from parity_tests.locate.cli import build, load_object
from parity_tests.locate.trace import Raised
from tests.ports.catalogue import HERE, load, reference
from torch_ref import to_params

REFERENCE = f"{HERE / 'torch_user_block.py'}:Attention"
INIT = ["--init", "d_model=8", "--init", "n_head=2"]


def test_diff_passes_a_correct_port(capsys):
    code = main(["diff", REFERENCE, f"{HERE / 'numpy_fused.py'}:attention", *INIT, "--shape", "2,5,8"])
    assert code == 0
    assert "ok: the outputs match" in capsys.readouterr().out


def test_diff_names_the_planted_line_and_draws_the_heatmap(tmp_path, capsys):
    source = (HERE / "numpy_fused.py").read_text().replace("/ np.sqrt(hs)", "/ np.sqrt(C)")
    (tmp_path / "port.py").write_text(source)
    line = source.splitlines().index("    att = q @ k.transpose(0, 1, 3, 2) / np.sqrt(C)") + 1
    heatmap = tmp_path / "first.png"
    args = ["diff", REFERENCE, f"{tmp_path / 'port.py'}:attention", *INIT, "--shape", "2,5,8"]
    code = main([*args, "--heatmap", str(heatmap), "--width", "400"])
    assert code == 1
    assert f"{tmp_path / 'port.py'}:{line}" in capsys.readouterr().out
    assert heatmap.stat().st_size > 0


def test_diff_turns_a_heatmap_file_replaced_by_a_fifo_after_the_check_into_one_line(
    tmp_path, capsys, monkeypatch
):
    """The --heatmap file became a FIFO between png_path's check and the save: savefig opened it
    and blocked until a reader came; now the save refuses it, one line, exit code 2."""
    import os

    from parity_tests import usage

    source = (HERE / "numpy_fused.py").read_text().replace("/ np.sqrt(hs)", "/ np.sqrt(C)")
    (tmp_path / "port.py").write_text(source)
    heatmap = tmp_path / "first.png"
    check_writable = usage.check_writable
    monkeypatch.setattr(usage, "check_writable", lambda path: (check_writable(path), os.mkfifo(path)))
    args = ["diff", REFERENCE, f"{tmp_path / 'port.py'}:attention", *INIT, "--shape", "2,5,8"]
    assert main([*args, "--heatmap", str(heatmap), "--width", "400"]) == 2
    why = f"{heatmap} is not a regular file (a FIFO, device, directory or a link to one)"
    assert capsys.readouterr().err == f"attn-parity diff: error: cannot write {heatmap}: {why}\n"


def test_diff_refuses_a_missing_name(capsys):
    assert main(["diff", f"{HERE / 'numpy_fused.py'}:nothing", REFERENCE, "--shape", "2,5,8"]) == 2
    assert "has no 'nothing'" in capsys.readouterr().err


def test_a_bug_past_a_block_size_shows_only_at_longer_inputs(tmp_path):
    source = (HERE / "numpy_mha.py").read_text()
    # keys past the eighth stay visible: right at 5 tokens, wrong at 12
    planted = "    mask = np.triu(np.ones((t, t), dtype=bool), k=1) & (np.arange(t) < 8)"
    source = source.replace("    mask = np.triu(np.ones((t, t), dtype=bool), k=1)", planted)
    port = load("blocked", source, tmp_path)
    ref = reference("torch_ref")
    reports = locate_shapes(ref, port.mha, [(2, 5, 8), (2, 12, 8)], seeds=[0, 1], params=to_params(ref))
    assert [r.ok for r in reports.values()] == [True, True, False, False]
    line = source.splitlines().index(planted) + 1
    assert {r.candidate_location for r in reports.values() if not r.ok} == {
        f"{tmp_path / 'blocked.py'}:{line}"
    }


def test_diff_gradients_names_the_line_stopping_them(tmp_path, capsys):
    line = "    att = jax.nn.softmax(att, axis=-1)"
    planted = "    att = jax.lax.stop_gradient(jax.nn.softmax(att, axis=-1))"
    source = (HERE / "jax_fused.py").read_text().replace(line, planted)
    (tmp_path / "port.py").write_text(source)
    number = source.splitlines().index(planted) + 1
    port = f"{tmp_path / 'port.py'}:attention"
    args = ["diff", REFERENCE, port, *INIT, "--shape", "2,5,8", "--width", "400"]
    assert main(args) == 0  # the forward pass is right
    assert main([*args, "--gradients"]) == 1
    assert f"{tmp_path / 'port.py'}:{number}" in capsys.readouterr().out
    numpy_port = ["diff", REFERENCE, f"{HERE / 'numpy_fused.py'}:attention", *INIT, "--shape", "2,5,8"]
    assert main([*numpy_port, "--gradients"]) == 2
    assert "no gradients" in capsys.readouterr().err


def book_reference(tmp_path):
    """A reference file building the book's MultiHeadAttention (context 16, two heads)."""
    (tmp_path / "ref.py").write_text(
        "from torch_ref import MultiHeadAttention\n"
        "import torch\n"
        "torch.manual_seed(0)\n"
        "ref = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, qkv_bias=True)\n"
    )
    return f"{tmp_path / 'ref.py'}:ref"


def test_diff_names_a_wrong_last_line_and_draws_its_heatmap(tmp_path, capsys):
    source = (HERE / "numpy_mha.py").read_text().replace("    return out\n", "    return out * 1.01\n")
    (tmp_path / "port.py").write_text(source)
    line = source.splitlines().index("    return out * 1.01") + 1
    args = [
        "diff",
        book_reference(tmp_path),
        f"{tmp_path / 'port.py'}:mha",
        "--shape",
        "2,5,8",
        "--width",
        "400",
    ]
    assert main([*args, "--heatmap", str(tmp_path)]) == 1
    out = capsys.readouterr().out
    assert f"{tmp_path / 'port.py'}:{line}" in out and "first divergence  linear" in out
    assert "masked_scores" not in out
    assert f"heatmap of the first diverging tensor: {tmp_path / 'first_divergence.png'}" in out
    assert (tmp_path / "first_divergence.png").read_bytes()[:4] == b"\x89PNG"


def test_diff_without_a_diverging_layout_says_there_is_no_heatmap(tmp_path, capsys):
    from parity_tests.locate.report import NO_HEATMAP

    source = (HERE / "numpy_mha.py").read_text().replace("    return out\n", "    return out[..., :4]\n")
    (tmp_path / "port.py").write_text(source)
    args = ["diff", book_reference(tmp_path), f"{tmp_path / 'port.py'}:mha", "--shape", "2,5,8"]
    assert main([*args, "--heatmap", str(tmp_path / "h.png"), "--width", "400"]) == 1
    captured = capsys.readouterr()
    assert f"no heatmap: {NO_HEATMAP}" in captured.out and captured.err == ""
    assert not (tmp_path / "h.png").exists()


def diff_usage_error(capsys, *argv):
    try:
        code = main(["diff", *argv])
    except SystemExit as exit:
        code = exit.code
    return code, capsys.readouterr().err


PORT = f"{HERE / 'numpy_fused.py'}:attention"


@pytest.mark.parametrize(
    "argv, line",
    [
        (["--shape", "2,-5,8"], "argument --shape: --shape '2,-5,8': every size must be at least 1"),
        (["--shape", "0,5,8"], "argument --shape: --shape '0,5,8': every size must be at least 1"),
        (["--shape", "2,100000,8"],
         "argument --shape: --shape '2,100000,8': an array of shape (2, 100000, 100000) would hold "
         "20000000000 entries, more than the 134217728 a command line may ask for"),
        (["--shape", "2,100000", "--tokens", "61"],  # token ids (B, T): the scores (B, T, T)
         "argument --shape: --shape '2,100000': an array of shape (2, 100000, 100000) would hold "
         "20000000000 entries, more than the 134217728 a command line may ask for (token ids, --tokens 61)"),
        (["--shape", "4,1024", "--tokens", "50257"],  # ... and the logits (B, T, VOCAB)
         "argument --shape: --shape '4,1024': an array of shape (4, 1024, 50257) would hold "
         "205852672 entries, more than the 134217728 a command line may ask for (token ids, --tokens 50257)"),
        (["--shape", "2,5,8", "--seeds", "-1"],
         "argument --seeds: --seeds '-1': expected an integer from 0 to 4294967295"),
        (["--shape", "2,5"], f"the reference {REFERENCE} raises on an input of shape (2, 5): "
         "ValueError: not enough values to unpack (expected 3, got 2)"),
        (["--shape", "2,5,8", "--tokens", "0"],
         "argument --tokens: --tokens '0': expected an integer from 1 to 2147483647"),
        (["--shape", "2,5,8", "--tokens", "2.5"],
         "argument --tokens: --tokens '2.5': expected an integer from 1 to 2147483647"),
        (["--shape", "2,5,8", "--tokens", str(2**31)],
         "argument --tokens: --tokens '2147483648': expected an integer from 1 to 2147483647"),
        (["--shape", "2,5,8", "--framework", "tf"],
         "argument --framework: invalid choice: 'tf' (choose from 'torch', 'numpy', 'jax')"),
    ],
)  # fmt: skip
def test_diff_bad_sizes_and_seeds_are_one_line_and_exit_code_2(capsys, argv, line):
    code, err = diff_usage_error(capsys, REFERENCE, PORT, *INIT, *argv)
    assert code == 2
    assert err == f"attn-parity diff: error: {line}\n"


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_diff_a_file_that_does_not_load_is_one_line_and_exit_code_2(tmp_path, capsys, side):
    (tmp_path / "bad.py").write_text("def f(:\n")
    bad = f"{tmp_path / 'bad.py'}:f"
    files = [bad, PORT] if side == "reference" else [REFERENCE, bad]
    code, err = diff_usage_error(capsys, *files, *INIT, "--shape", "2,5,8")
    assert code == 2
    assert err == (
        f"attn-parity diff: error: {bad!r}: {tmp_path / 'bad.py'} does not load: "
        "SyntaxError: invalid syntax (bad.py, line 1)\n"
    )


def test_diff_a_reference_class_refusing_its_init_is_one_line_and_exit_code_2(capsys):
    code, err = diff_usage_error(capsys, REFERENCE, PORT, "--init", "d_model=8", "--shape", "2,5,8")
    assert code == 2
    assert err.startswith(f"attn-parity diff: error: {REFERENCE} d_model=8: ") and "n_head" in err
    assert len(err.splitlines()) == 1


FUSED = (HERE / "numpy_fused.py").read_text()
MATMUL = (
    "ValueError: matmul: Input operand 1 has a mismatch in its core dimension 0, with gufunc signature "
    "(n?,k),(k,m?)->(n?,m?) (size 24 is different from 8)"
)
RAISING = {  # a planted line -> (what it raises, the last value equal to the reference's)
    '    qkv = x @ params["qkv.weight"] + params["qkv.bias"]': (
        MATMUL, "no value the candidate computed before it equals a reference value"
    ),
    '    raise ValueError("no y")': (
        "ValueError: no y",
        f"the last value equal to the reference's is softmax ({HERE / 'torch_user_block.py'}:23), "
        "computed at {port}:18",
    ),
}  # fmt: skip
ORIGINAL = {0: '    qkv = x @ params["qkv.weight"].T + params["qkv.bias"]', 1: "    y = att @ v"}


def raising_port(tmp_path, planted):
    original = ORIGINAL[list(RAISING).index(planted)]
    source = FUSED.replace(original, planted)
    (tmp_path / "port.py").write_text(source)
    return tmp_path / "port.py", source.splitlines().index(planted) + 1


@pytest.mark.parametrize("planted", list(RAISING))
def test_diff_a_candidate_raising_is_a_divergence_at_its_line(tmp_path, capsys, planted):
    port, line = raising_port(tmp_path, planted)
    code = main(["diff", REFERENCE, f"{port}:attention", *INIT, "--shape", "2,5,8", "--width", "400"])
    out, err = capsys.readouterr()
    raised, cause = RAISING[planted]
    assert code == 1 and err == ""
    rows = [row.strip("│ ").rstrip() for row in out.splitlines()]
    assert f"first divergence  the candidate raised {raised}" in rows
    assert f"candidate         {port}:{line}  {planted.strip()}" in rows
    assert f"likely cause      {cause.format(port=port)}" in rows


def test_locate_reports_a_candidate_raising_and_raises_for_a_reference_raising(tmp_path):
    port, line = raising_port(tmp_path, '    raise ValueError("no y")')
    candidate = load("port", port.read_text(), tmp_path).attention
    ref = reference("fused")
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    report = locate(ref, candidate, x, params=params)
    assert not report.ok and report.raised == "ValueError: no y"
    assert (report.candidate_location, report.candidate_op) == (f"{port}:{line}", 'raise ValueError("no y")')
    assert len(report.verified) == 9 and report.verified[-1].startswith(f"{port}:18  ")
    with pytest.raises(Raised, match=r"^ValueError: no y$"):
        locate(candidate, ref, x, params=params)


NNX_MHA = f"{HERE / 'nnx_mha.py'}:MHA"
NNX_INIT = ["--init", "d_in=8", "--init", "d_out=8", "--init", "num_heads=2"]


@pytest.mark.parametrize(
    "reference, candidate, init",
    [(REFERENCE, REFERENCE, INIT), (NNX_MHA, NNX_MHA, NNX_INIT)],
    ids=["torch", "nnx"],
)
def test_diff_builds_a_candidate_class_as_it_builds_the_reference(capsys, reference, candidate, init):
    """The same class on both sides, built after the same seed (an NNX class with
    ``rngs=nnx.Rngs(--seed)``), holds the same weights: before, a candidate class was called as a
    function on the input and reported as a port raising TypeError, and an NNX class was not built
    without its rngs."""
    assert main(["diff", reference, candidate, *init, "--shape", "2,5,8", "--seed", "3"]) == 0
    assert "ok: the outputs match" in capsys.readouterr().out


def test_diff_a_candidate_class_refusing_its_init_is_one_line_and_exit_code_2(capsys):
    code, err = diff_usage_error(capsys, REFERENCE, NNX_MHA, *INIT, "--shape", "2,5,8")
    assert (code, err) == (
        2,
        f"attn-parity diff: error: {NNX_MHA} d_model=8 n_head=2: TypeError: MHA.__init__() got an "
        "unexpected keyword argument 'd_model'\n",
    )


@pytest.mark.parametrize("side", ["reference", "candidate"])
def test_diff_a_name_that_is_not_callable_is_one_line_and_exit_code_2(tmp_path, capsys, side):
    """Before, ``x = 3`` as the candidate was a port raising TypeError (exit 1, ``candidate None
    None``)."""
    (tmp_path / "misc.py").write_text("x = 3\n")
    bad = f"{tmp_path / 'misc.py'}:x"
    files = [bad, PORT] if side == "reference" else [REFERENCE, bad]
    code, err = diff_usage_error(capsys, *files, *INIT, "--shape", "2,5,8")
    assert (code, err) == (
        2,
        f"attn-parity diff: error: {bad!r}: 'x' in {tmp_path / 'misc.py'} is of type int, not callable: "
        "expected a function, a module or a class\n",
    )


OBJECT_PORT = """
import torch


class Port:
    \"\"\"A NumPy port as a callable object holding its own weights (torch's Linear layers built
    in the reference's order, so the same seed gives the same weights).\"\"\"

    def __init__(self, d_model, n_head):
        layers = {"qkv": torch.nn.Linear(d_model, 3 * d_model), "proj": torch.nn.Linear(d_model, d_model)}
        self.params = {
            f"{name}.{key}": value.detach().numpy()
            for name, layer in layers.items()
            for key, value in layer.state_dict().items()
        }
        self.n_head = n_head

    def __call__(self, x):
        return attention(self.params, x, self.n_head)


torch.manual_seed(0)
port = Port(8, 2)
"""


@pytest.mark.parametrize("name, init", [("port", []), ("Port", INIT)], ids=["instance", "class"])
def test_diff_calls_a_callable_object_on_the_input_alone(tmp_path, capsys, name, init):
    """A NumPy port written as a class, an instance the file builds or one diff builds from
    ``--init``, holds its weights: before, it was given the reference's weights first and reported
    as a port raising TypeError (exit 1, ``candidate None None``)."""
    (tmp_path / "port.py").write_text(FUSED + OBJECT_PORT)
    code = main(["diff", REFERENCE, f"{tmp_path / 'port.py'}:{name}", *INIT, *init, "--shape", "2,5,8"])
    assert code == 0
    assert "ok: the outputs match" in capsys.readouterr().out


NNX_OPTION_PORT = """
import torch
from flax import nnx

from tests.ports.nnx_mha import MHA
from torch_ref import MultiHeadAttention, to_params

torch.manual_seed(0)
reference = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, qkv_bias=True)


class Scaled(MHA):
    def __call__(self, x, scale=2.0):
        return super().__call__(x) * scale


port = Scaled(8, 8, 2, rngs=nnx.Rngs(0)).load_torch(to_params(reference))
"""


@pytest.mark.parametrize("option, code", [([], 1), (["--option", "scale=1.0"], 0)], ids=["default", "option"])
def test_diff_gives_options_to_an_nnx_module_without_the_weights(tmp_path, capsys, option, code):
    """``--option`` wraps the candidate in a ``functools.partial``: before, an NNX module inside it
    was no longer seen as holding its weights, and was given the torch reference's first (a
    TypeError, ``takes 2 positional arguments but 3 were given``)."""
    (tmp_path / "port.py").write_text(NNX_OPTION_PORT)
    argv = ["diff", f"{tmp_path / 'port.py'}:reference", f"{tmp_path / 'port.py'}:port", *option]
    assert main([*argv, "--shape", "2,5,8", "--width", "400"]) == code
    out = capsys.readouterr().out
    assert "the candidate raised" not in out and ("ok: the outputs match" in out) == (code == 0)


REFUSING = """
class Refusing:
    def __init__(self, d_model, n_head):
        assert d_model % n_head == 0, "d_model must be divisible by n_head"
"""


def test_diff_a_class_refusing_its_init_with_any_exception_is_one_line_and_exit_code_2(tmp_path, capsys):
    """Before, only TypeError and ValueError were usage errors: an ``assert`` in the constructor (the
    book's MultiHeadAttention has one) or torch's RuntimeError for a negative size was a traceback
    with exit 1, the status of a port that diverges."""
    (tmp_path / "refusing.py").write_text(REFUSING)
    refusing = f"{tmp_path / 'refusing.py'}:Refusing"
    init = ["--init", "d_model=9", "--init", "n_head=2"]
    code, err = diff_usage_error(capsys, refusing, PORT, *init, "--shape", "2,5,9")
    assert (code, err) == (
        2,
        f"attn-parity diff: error: {refusing} d_model=9 n_head=2: AssertionError: d_model must be divisible "
        "by n_head\n",
    )
    code, err = diff_usage_error(
        capsys, REFERENCE, PORT, "--init", "d_model=-8", *INIT[2:], "--shape", "2,5,8"
    )
    assert code == 2 and len(err.splitlines()) == 1
    assert err.startswith(f"attn-parity diff: error: {REFERENCE} d_model=-8 n_head=2: RuntimeError: ")


JAX_FUSED = (HERE / "jax_fused.py").read_text()
JAX_RAISING = {  # a planted line -> the cause
    '    y = jnp.einsum("bnqk,bknh->bqnh", att, v.reshape(B, T, C))': (
        f"the last value equal to the reference's is softmax ({HERE / 'torch_user_block.py'}:23), "
        "computed at {port}:14"
    ),
    "    keep = jnp.tril(jnp.ones((T, T), dtype=bool)) if float(att.sum()) else None": (
        "JAX raised while tracing, so no value was evaluated to compare (run without jit, the port does "
        "not raise this)"
    ),
}  # fmt: skip
JAX_ORIGINAL = [
    '    y = jnp.einsum("bnqk,bknh->bqnh", att, v)',
    "    keep = jnp.tril(jnp.ones((T, T), dtype=bool))",
]


@pytest.mark.parametrize("jit", [False, True], ids=["plain", "jit"])
@pytest.mark.parametrize("planted", list(JAX_RAISING), ids=["after-softmax", "tracing-only"])
def test_locate_a_jax_candidate_raising_while_traced_lists_the_values_before(tmp_path, planted, jit):
    """JAX raises while tracing, before it evaluates anything: before, the report said "no value the
    candidate computed before it equals a reference value" with no line verified, although the
    lines before the raise were right. Now the port is run again eagerly (``jax.disable_jit``) up to
    the same exception, as a NumPy port is; an error of tracing alone (``float`` of a traced value)
    is said to be one."""
    source = JAX_FUSED.replace(JAX_ORIGINAL[list(JAX_RAISING).index(planted)], planted)
    source += '\nattention = jax.jit(attention, static_argnames="n_head")\n' if jit else ""
    (tmp_path / "port.py").write_text(source)
    port, line = tmp_path / "port.py", source.splitlines().index(planted) + 1
    candidate = load("port", source, tmp_path).attention
    ref = reference("fused")
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    params = {k: v.detach().numpy() for k, v in ref.named_parameters()}
    report = locate(ref, candidate, x, params=params)
    assert not report.ok and report.raised is not None
    assert (report.candidate_location, report.candidate_op) == (f"{port}:{line}", planted.strip())
    cause = JAX_RAISING[planted].format(port=port)
    assert report.causes == [cause]
    assert [row.split("  ")[0] for row in report.verified[-1:]] == ([f"{port}:14"] if "14" in cause else [])


@pytest.mark.parametrize("exit_call", ["sys.exit(0)", "raise KeyboardInterrupt"])
def test_diff_a_candidate_that_exits_fails_on_its_line(tmp_path, capsys, exit_call):
    """A port that ends the process or raises a BaseException is a failed check (exit code 1) that
    names its line, never a pass."""
    port = tmp_path / "exiting.py"
    port.write_text(f"import sys\n\n\ndef attention(params, x, n_head=2):\n    {exit_call}\n")
    code = main(["--width", "200", "diff", REFERENCE, f"{port}:attention", *INIT, "--shape", "2,5,8"])
    out = capsys.readouterr().out
    assert code == 1
    assert f"{port}:5" in out and exit_call.split("(")[0].split()[-1] in out


def test_diff_a_candidate_whose_signature_refuses_the_call_names_it_and_the_call(tmp_path, capsys):
    """Before: ``candidate None None`` (the TypeError came from the call, in no line of the port)."""
    port = tmp_path / "port.py"
    port.write_text("import numpy as np\n\n\ndef attention(params, x, mask):\n    return x\n")
    code = main(["--width", "400", "diff", REFERENCE, f"{port}:attention", *INIT, "--shape", "2,5,8"])
    rows = [row.strip("│ ").rstrip() for row in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert (
        "first divergence  the candidate raised TypeError: attention() missing 1 required positional "
        "argument: 'mask'"
    ) in rows
    assert f"candidate         {port}:4  def attention(params, x, mask)" in rows
    assert (
        "likely cause      the candidate cannot take the call attention(the weights (4 arrays), float32 "
        "(2, 5, 8)): its signature is attention(params, x, mask) (the weights go first to a function; a "
        "module or other callable object is called on the inputs alone)"
    ) in rows


GPT = f"{HERE / 'torch_mingpt.py'}:GPT"
GPT_SIZES = dict(vocab_size=61, block_size=16, n_embd=24, n_head=3, n_layer=2)
GPT_INIT = [f"--init={key}={value}" for key, value in GPT_SIZES.items()]


def test_diff_tokens_feeds_a_whole_gpt_its_token_ids(tmp_path, capsys):
    """A model taking token ids refused diff's float inputs (its embedding raises: a usage error);
    ``--tokens 61`` feeds it ids in [0, 61): the same model passes, a planted position off by one is
    named on its line."""
    assert main(["diff", GPT, GPT, *GPT_INIT, "--shape", "2,5"]) == 2
    assert "'indices' to have one of the following scalar types: Long, Int" in capsys.readouterr().err
    assert main(["diff", GPT, GPT, *GPT_INIT, "--shape", "2,5", "--tokens", "61"]) == 0
    planted = "        x = self.wte(idx) + self.wpe(pos + 1)"
    source = (
        (HERE / "torch_mingpt.py").read_text().replace("        x = self.wte(idx) + self.wpe(pos)", planted)
    )
    (tmp_path / "gpt.py").write_text(source)
    argv = ["diff", GPT, f"{tmp_path / 'gpt.py'}:GPT", *GPT_INIT, "--shape", "2,5", "--tokens", "61"]
    code = main(["--width", "400", *argv])
    rows = [row.strip("│ ").rstrip() for row in capsys.readouterr().out.splitlines()]
    assert code == 1
    assert f"candidate         {tmp_path / 'gpt.py'}:{source.splitlines().index(planted) + 1}  add" in rows


def test_diff_tokens_bound_the_arrays_token_ids_make_not_a_float_inputs():
    """Token ids ``(B, T)`` make scores ``(B, T, T)`` and logits ``(B, T, VOCAB)``; read as floats
    ``(T, D)`` the same sizes would make scores ``(B, B)``: 100000 sequences of 5 tokens are a
    command line's size as token ids (scores of 2.5 million entries), not as floats."""
    from parity_tests.locate.cli import _check_arrays
    from parity_tests.usage import UsageError

    _check_arrays([(100000, 5)], 61)
    with pytest.raises(UsageError, match=r"an array of shape \(100000, 100000\) would hold"):
        _check_arrays([(100000, 5)], None)


def test_diff_tokens_with_gradients_locates_a_backward_bug_in_a_whole_gpt(tmp_path, capsys):
    """``--tokens`` with ``--gradients``: the GPT against itself has the reference's gradients; a
    ``detach`` planted on the attention weights leaves the forward pass right and is named on its
    line, the first diverging value a gradient."""
    argv = ["diff", GPT, GPT, *GPT_INIT, "--shape", "2,5", "--tokens", "61", "--gradients"]
    assert main(argv) == 0
    assert "ok: the outputs match" in capsys.readouterr().out
    line = "        att = F.softmax(att, dim=-1)"
    planted = "        att = F.softmax(att, dim=-1).detach()"
    source = (HERE / "torch_mingpt.py").read_text()
    assert source.count(line) == 1
    source = source.replace(line, planted)
    (tmp_path / "gpt.py").write_text(source)
    argv[2] = f"{tmp_path / 'gpt.py'}:GPT"
    assert main(argv[:-1]) == 0  # the forward pass is right
    capsys.readouterr()
    assert main(["--width", "400", *argv]) == 1
    rows = [row.strip("│ ").rstrip() for row in capsys.readouterr().out.splitlines()]
    at = f"candidate         {tmp_path / 'gpt.py'}:{source.splitlines().index(planted) + 1}"
    assert any(row.startswith(at) for row in rows), "\n".join(rows)
    assert any(row.startswith("first divergence  gradient of") for row in rows), "\n".join(rows)


NUMPY_RETURNING_JAX = (
    "import jax.numpy as jnp\nimport numpy as np\n\n\ndef f(x):\n    return jnp.asarray(np.tanh(x){})\n"
)
NUMPY = "import numpy as np\n\n\ndef f(x):\n    return np.tanh(x){}\n"


@pytest.mark.parametrize("side", ["candidate", "reference"])
def test_diff_framework_overrides_the_framework_read_from_the_code(tmp_path, capsys, side):
    """A NumPy function returning a JAX array reads jax names: locate runs it as JAX, whose tracers
    NumPy refuses; ``--framework numpy`` (``--reference-framework numpy``) runs it as NumPy. The
    candidate returns twice the reference's output: the outputs differ, so locate runs (a direct
    call, all the check makes of a port that matches, needs no framework)."""
    jnp_file, np_file = tmp_path / "jnp.py", tmp_path / "np.py"
    jnp_file.write_text(NUMPY_RETURNING_JAX.format(" * 2" if side == "candidate" else ""))
    np_file.write_text(NUMPY.format(" * 2" if side == "reference" else ""))
    files = [f"{np_file}:f", f"{jnp_file}:f"]
    argv = ["diff", *(files if side == "candidate" else files[::-1]), "--shape", "2,3", "--width", "400"]
    flag = "--framework" if side == "candidate" else "--reference-framework"
    assert main(argv) == (1 if side == "candidate" else 2)  # the candidate raising is a report
    assert "TracerArrayConversionError" in "".join(capsys.readouterr())
    assert main([*argv, flag, "numpy"]) == 1
    out = capsys.readouterr().out
    assert "first divergence" in out and "TracerArrayConversionError" not in out


def rendered(report):
    """``report`` as ``attn-parity --width 200`` prints it to a file."""
    console = Console(width=200, file=io.StringIO(), highlight=False)
    console.print(report)
    return console.file.getvalue()


def diff_and_check_port(capsys, reference, candidate, params, init=None, **options):
    """``attn-parity diff`` of ``candidate`` (``FILE.py:NAME``, given ``options`` as ``--option``)
    against ``reference`` (a class built with ``init`` as ``--init``), and check_port's report on the
    input diff draws (seed 0) with the weights ``params`` gives of the reference: the command prints
    that report as it is and exits 0 exactly when it is ok."""
    init = init or {}
    argv = [f"--init={key}={value}" for key, value in init.items()]
    argv += [f"--option={key}={value}" for key, value in options.items()]
    code = main(["--width", "200", "diff", reference, candidate, *argv, "--shape", "2,5,8"])
    shown = capsys.readouterr().out
    x = np.random.default_rng(0).standard_normal((2, 5, 8)).astype(np.float32)
    ref = build(reference, load_object(reference), init, 0)
    report = check_port(ref, functools.partial(load_object(candidate), **options), x, params=params(ref))
    assert shown == f"shape (2, 5, 8), seed 0\n{rendered(report)}"
    assert code == (0 if report.ok else 1)
    return shown, report


STEPS_PORT = f"{HERE / 'numpy_steps_mha.py'}:mha"


def test_diff_shows_the_step_table_of_a_port_recording_steps_as_check_port_does(tmp_path, capsys):
    """Before, diff ran locate alone: a port recording its steps got check_port's step table from
    the API and not from the command line. The first diverging step is the API's, named by the
    table (the step before it matches), and locate does not run."""
    shown, report = diff_and_check_port(
        capsys, book_reference(tmp_path), STEPS_PORT, to_params, bug="inverted_mask"
    )
    assert (report.ok, report.first_divergence, report.located) == (False, "masked_scores", None)
    rows = [line.strip("│┃ ") for line in shown.splitlines()]
    marked = [row.split()[0] for row in rows if "<- first divergence" in row]
    assert marked == ["masked_scores"], shown
    assert "first divergence  masked_scores" in rows
    assert "likely cause      the mask meaning inverted" in shown and "verified" not in shown


def test_diff_names_the_line_of_an_uninstrumented_port_as_check_port_does(tmp_path, capsys):
    """A port recording no steps: no table (only the output is compared), locate's report of its
    first diverging line, the same as check_port's ``located``."""
    planted = "    scores = scores / hd"
    source = (HERE / "numpy_mha.py").read_text().replace("    scores = scores / np.sqrt(hd)", planted)
    (tmp_path / "port.py").write_text(source)
    line = source.splitlines().index(planted) + 1
    port = f"{tmp_path / 'port.py'}:mha"
    shown, report = diff_and_check_port(capsys, book_reference(tmp_path), port, to_params)
    assert not report.ok and report.located.candidate_location == f"{tmp_path / 'port.py'}:{line}"
    assert f"candidate         {tmp_path / 'port.py'}:{line}" in shown and "max abs" not in shown


@pytest.mark.parametrize(
    "candidate, result",
    [(STEPS_PORT, "ok: all steps match"), (f"{HERE / 'numpy_mha.py'}:mha", "ok: the outputs match")],
    ids=["steps", "uninstrumented"],
)
def test_diff_passes_a_correct_port_as_check_port_does(tmp_path, capsys, candidate, result):
    shown, report = diff_and_check_port(capsys, book_reference(tmp_path), candidate, to_params)
    assert report.ok and report.located is None
    assert result in shown and ("max abs" in shown) == (candidate == STEPS_PORT)


def test_diff_prints_the_report_check_port_gives_for_a_users_own_torch_module(tmp_path, capsys):
    """The reference records no steps: the report is check_port's ``located``, rendered alike."""
    (tmp_path / "port.py").write_text(FUSED.replace("/ np.sqrt(hs)", "/ np.sqrt(C)"))

    def weights(ref):
        return {k: v.detach().numpy() for k, v in ref.named_parameters()}

    port = f"{tmp_path / 'port.py'}:attention"
    shown, report = diff_and_check_port(capsys, REFERENCE, port, weights, {"d_model": 8, "n_head": 2})
    assert not report.ok and report.rows[-1].step == "output"
    assert shown == f"shape (2, 5, 8), seed 0\n{rendered(report.located)}"


SCORES_DOUBLED = """
import numpy_attn


def mha(params, x):
    output, steps = numpy_attn.multi_head_attention(
        params, x, num_heads=2, context_length=16, return_steps=True
    )
    return output, {**steps, "attn_scores": 2 * steps["attn_scores"]}
"""


def test_diff_draws_the_heatmap_of_a_divergence_the_steps_name_from_locate(tmp_path, capsys):
    """check_port does not run locate where the table names the divergence: diff runs it on that
    input for the heatmap, and says so where locate finds the outputs equal (only a step differs)."""
    (tmp_path / "scores.py").write_text(SCORES_DOUBLED)
    heatmap = tmp_path / "first.png"
    argv = ["diff", book_reference(tmp_path), STEPS_PORT, "--shape", "2,5,8", "--heatmap", str(heatmap)]
    assert main([*argv, "--option", "bug=inverted_mask"]) == 1
    assert f"heatmap of the first diverging tensor: {heatmap}" in capsys.readouterr().out
    assert heatmap.read_bytes()[:4] == b"\x89PNG"
    heatmap.unlink()
    argv[2] = f"{tmp_path / 'scores.py'}:mha"
    assert main(argv) == 1
    out = capsys.readouterr().out
    assert "first divergence  attn_scores" in out.replace("│", "")
    assert "no heatmap: the outputs match (locate), only the steps differ" in out and not heatmap.exists()
