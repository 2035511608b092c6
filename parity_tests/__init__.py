"""parity_tests: compare attention implementations step by step, across frameworks.

``check_port(reference, candidate, inputs)``, the entry point, runs two implementations from any
frameworks and compares their step traces, naming the first divergence and its likely causes; where
the steps do not pinpoint it (a port recording none), its report carries ``locate``'s, naming the
port's first diverging line (``locate``, the lower level, aligns every value two uninstrumented
runs compute);
``compare_steps(expected, actual)`` compares two step traces (see ``numpy_attn.steps``) with the
per-dtype tolerances of ``parity_tests.tolerances`` and returns a ``StepReport`` naming the first
diverging step. The test suite lives in ``tests/`` (not shipped in the wheel);
``python -m parity_tests report`` prints the all-classes parity table.
"""

from parity_tests.compare import StepReport, StepRow, compare_arrays, compare_steps
from parity_tests.locate import LocateReport, locate, locate_shapes
from parity_tests.port import check_port
from parity_tests.tolerances import TOLERANCES, tolerance_for

__all__ = [
    "TOLERANCES",
    "LocateReport",
    "StepReport",
    "StepRow",
    "check_port",
    "compare_arrays",
    "compare_steps",
    "locate",
    "locate_shapes",
    "tolerance_for",
]
