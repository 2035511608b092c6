"""Locate the first diverging line of any port, with no instrumentation in it.

``locate(reference, candidate, inputs, params=...)`` captures every intermediate value of both
runs (torch: a function mode and module hooks; JAX: the jaxpr evaluated equation by equation;
NumPy: the arrays each of the user's lines produces), aligns them by value across legitimate
differences (layouts, where the scale is applied, finite or infinite fills, dtypes), and returns a
``LocateReport`` naming the first divergence, the candidate's and the reference's ``path:line``,
the worst entry and the causes the numbers show. ``locate_shapes`` runs it over several shapes
and seeds, ``locate_gradients`` names the first backward operation whose gradients diverge (the
cotangent of every captured value compared), ``map_weights`` maps a torch ``state_dict`` onto an
NNX module or a JAX pytree, or GPT-2's onto a torch GPT with the book's names.
"""

from parity_tests.locate.check import compare_traces, locate, locate_shapes
from parity_tests.locate.gradients import locate_gradients
from parity_tests.locate.report import LocateReport
from parity_tests.locate.run import capture
from parity_tests.locate.trace import Raised
from parity_tests.locate.weights import WeightMap, map_weights

__all__ = [
    "LocateReport",
    "Raised",
    "WeightMap",
    "capture",
    "compare_traces",
    "locate",
    "locate_gradients",
    "locate_shapes",
    "map_weights",
]
