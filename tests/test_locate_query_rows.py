"""Ports computing attention one query at a time (a NumPy loop over the tokens, ``jax.lax.scan``
over them): ``check_port`` reports each planted bug on its line, with its cause, where reading the
causes of a (B, N, S) row against the reference's (B, N, T, S) scores raised a ValueError."""

import importlib

import numpy as np
import pytest

from parity_tests import check_port
from parity_tests.cli import main
from parity_tests.locate.causes import mask_causes, read_causes
from parity_tests.tolerances import tolerance_for
from tests.ports.catalogue import HERE, PORTS, ROW_BUGS, inputs, load, plant, reference
from torch_ref import to_params

ROW_PORTS = ["numpy_query_rows", "jax_scan_tokens"]


def check(port, source, directory):
    kind, build = PORTS[port]
    ref = reference(kind)
    params = to_params(ref)
    return check_port(ref, build(load(port, source, directory), params), inputs(), params=params)


@pytest.mark.filterwarnings("ignore:invalid value encountered:RuntimeWarning")  # 0/0: a softmax over heads
@pytest.mark.parametrize("bug", ROW_BUGS, ids=[b.name for b in ROW_BUGS])
def test_a_bug_planted_in_a_port_computing_one_query_at_a_time_is_reported_on_its_line(bug, tmp_path):
    source, line = plant(bug)
    report = check(bug.port, source, tmp_path)  # a report, not a ValueError
    assert not report.ok
    assert report.located.candidate_location == f"{tmp_path / bug.port}.py:{line}", f"\n{report}"
    assert any(bug.cause in cause for cause in report.causes), f"no cause with {bug.cause!r}:\n{report}"


@pytest.mark.parametrize("port", ROW_PORTS)
def test_a_correct_port_computing_one_query_at_a_time_passes(port, tmp_path):
    report = check(port, (HERE / f"{port}.py").read_text(), tmp_path)
    assert report.ok, f"\n{report}"


# Worked by hand: one batch entry, one head, four keys; query 1 of a causal mask hides keys 2 and 3.
ROW = np.array([[[0.5, -1.0, -np.inf, -np.inf]]])  # (B, N, S) = (1, 1, 4), the reference's row 1
TOLS = tolerance_for("float32")
SIZES = {"tokens": 4, "batch": 1}
AXES = ("batch", "head", "key")


@pytest.mark.parametrize(
    "hidden, cause",
    [  # True: hidden
        ([False, False, False, True], "causal mask off by one: the next token (key = query + 1) is not "
                                      "hidden"),
        ([False, True, True, True], "causal mask off by one: the diagonal (each token itself) is hidden too"),
    ],
)  # fmt: skip
def test_a_query_row_masked_one_key_off_names_the_diagonal_of_its_own_query(hidden, cause):
    actual = np.where(hidden, -np.inf, np.array([0.5, -1.0, 0.25, 2.0]))[None, None]
    with np.errstate(all="ignore"):  # -inf - -inf: as compare_traces reads them
        assert read_causes(ROW, actual, AXES, SIZES, *TOLS, row=1) == [cause]
    assert mask_causes(np.isinf(ROW), np.isinf(actual), row=1) == [cause]  # the masks themselves


def test_a_value_whose_last_two_axes_differ_in_size_reads_its_causes_without_raising():
    """3 queries against 6 keys: the diagonal is the 3 x 6 one, not the 6 x 6 one (this raised
    ``operands could not be broadcast together ... (6,6) and requested shape (2,3,6)``)."""
    expected = np.where(np.triu(np.ones((3, 6), bool), 1), -np.inf, 1.0)[None].repeat(2, 0)  # (2, 3, 6)
    actual = np.where(np.triu(np.ones((3, 6), bool), 0), -np.inf, 1.0)[None].repeat(2, 0)
    with np.errstate(all="ignore"):
        causes = read_causes(expected, actual, ("batch", "query", "key"), {"tokens": 6}, *TOLS)
    assert causes == ["causal mask off by one: the diagonal (each token itself) is hidden too"]


REFERENCE_FILE = (
    "import torch\nfrom torch_ref import MultiHeadAttention\n\ntorch.manual_seed(0)\n"
    "reference = MultiHeadAttention(8, 8, 16, 0.0, num_heads=2, qkv_bias=True)\n"
)


def diff(tmp_path, bug):
    """``attn-parity diff`` of the catalogue's reference and ``bug`` planted: its exit code."""
    (tmp_path / "ref.py").write_text(REFERENCE_FILE)
    (tmp_path / "port.py").write_text(plant(bug)[0])
    files = [f"{tmp_path / 'ref.py'}:reference", f"{tmp_path / 'port.py'}:mha"]
    return main(["diff", *files, "--shape", "3,5,8", "--width", "300"])


def test_diff_reports_the_planted_line_of_a_per_query_port_and_exits_1(tmp_path, capsys):
    bug = ROW_BUGS[1]  # the mask keeping the next token
    assert diff(tmp_path, bug) == 1
    out = capsys.readouterr().out
    assert f"candidate         {tmp_path / 'port.py'}:{plant(bug)[1]}  s[:, :, i + 2 :] = -np.inf" in out
    assert bug.cause in out


def test_diff_an_exception_of_the_checker_itself_is_one_line_and_exit_code_2(tmp_path, capsys, monkeypatch):
    """A fault of the checker's own code is no finding about the port: exit 2 (1 says the port
    diverges) and one line naming the exception and the checker's line, not a traceback."""
    check_module = importlib.import_module("parity_tests.locate.check")  # the package exports check()
    monkeypatch.setattr(check_module, "sizes_of", lambda *args: None)  # causes.axis_names then raises
    code = diff(tmp_path, ROW_BUGS[1])
    err = capsys.readouterr().err
    assert code == 2
    assert err.count("\n") == 1
    assert err.startswith("attn-parity diff: error: internal error of the checker (shape (3, 5, 8), seed 0)")
    assert "AttributeError: 'NoneType' object has no attribute 'get'" in err
    assert "(at parity_tests/locate/causes.py:" in err and err.endswith("please report it\n")
