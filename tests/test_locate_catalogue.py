"""The bug catalogue: every bug planted in an uninstrumented user-style port is caught on its line,
and the ports without bugs pass."""

import pytest

from parity_tests.locate import locate
from tests.ports.catalogue import BUGS, HERE, PORTS, WITHOUT_PARAMS, inputs, load, plant, reference
from torch_ref import to_params


def run_port(port, source, directory):
    kind, build = PORTS[port]
    ref = reference(kind)
    params = to_params(ref)
    candidate = build(load(port, source, directory), params)
    return locate(ref, candidate, inputs(), params=None if port in WITHOUT_PARAMS else params)


@pytest.mark.parametrize("bug", BUGS, ids=[b.name for b in BUGS])
def test_planted_bug_is_located_on_its_line(bug, tmp_path):
    source, line = plant(bug)
    report = run_port(bug.port, source, tmp_path)
    assert not report.ok
    expected, actual = f"{tmp_path / bug.port}.py:{line}", report.candidate_location
    assert actual == expected, f"\n{report}"


@pytest.mark.parametrize("port", list(PORTS))
def test_the_ports_without_bugs_pass(port, tmp_path):
    report = run_port(port, (HERE / f"{port}.py").read_text(), tmp_path)
    assert report.ok, f"\n{report}"
    assert report.verified  # the lines found equal to the reference's values
