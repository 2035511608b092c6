"""The bug catalogue: every bug planted in an uninstrumented user-style port is caught, on its line."""

import pytest
from torch_ref import to_params

from parity_tests.locate import locate
from tests.ports.catalogue import BUGS, PORTS, inputs, load, plant, reference


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_planted_bug_is_located_on_its_line(bug, tmp_path):
    source, line = plant(bug)
    kind, build = PORTS[bug.port]
    ref = reference(kind)
    params = to_params(ref)
    candidate = build(load(bug.port, source, tmp_path), params)
    report = locate(ref, candidate, inputs(), params=params)
    assert not report.ok
    expected, actual = f"{tmp_path / bug.port}.py:{line}", report.candidate_location
    assert actual == expected, f"\n{report}"


@pytest.mark.parametrize("port", list(PORTS))
def test_the_ports_without_bugs_pass(port, tmp_path):
    kind, build = PORTS[port]
    ref = reference(kind)
    params = to_params(ref)
    candidate = build(load(port, (tmp_path.parent / "x").parent.joinpath().as_posix() and
                           __import__("pathlib").Path(__file__).parent.joinpath("ports", f"{port}.py").read_text(),
                           tmp_path), params)
    report = locate(ref, candidate, inputs(), params=params)
    assert report.ok, f"\n{report}"
