"""Locate the first diverging line of any port, with no instrumentation in it.

``locate(reference, candidate, inputs, params=...)`` captures every intermediate value of both
runs (torch: a function mode and module hooks; JAX: the jaxpr evaluated equation by equation;
NumPy: the arrays each of the user's lines produces), aligns them by value across legitimate
differences (layouts, where the scale is applied, finite or infinite fills, dtypes), and returns a
``LocateReport`` naming the first divergence, the candidate's and the reference's ``path:line``,
the worst entry and the causes the numbers show.
"""

from parity_tests.locate.check import compare_traces, locate, locate_shapes
from parity_tests.locate.report import LocateReport
from parity_tests.locate.run import capture

__all__ = ["LocateReport", "capture", "compare_traces", "locate", "locate_shapes"]
