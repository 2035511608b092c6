"""``attn-parity diff`` on a user's files, and ``locate_shapes`` for bugs that show only at some shapes."""

from parity_tests.cli import main
from parity_tests.locate import locate_shapes
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
