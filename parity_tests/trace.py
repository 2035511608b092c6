"""``attn-parity trace``: one class (or the book's GPT), every step, torch_ref beside each other framework."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any

from numpy_attn import spec
from parity_tests.cases import SHAPES, Case
from parity_tests.compare import StepReport, compare_steps
from parity_tests.frameworks import DTYPES, RUNNERS, run_torch
from parity_tests.usage import check_sizes

__all__ = ["GPT", "Trace", "parse_shape", "trace_case", "trace_gpt"]

GPT = "GPTModel"  # the book's chapter-4 model: ``trace_gpt``


@dataclass(frozen=True)
class Trace:
    title: str  # what ran: the case's id, or the book's GPT
    expected: Mapping[str, Any]  # torch_ref's steps
    reports: dict[str, StepReport]  # framework -> comparison with torch_ref

    @property
    def ok(self) -> bool:
        return all(report.ok for report in self.reports.values())


def parse_shape(layer: str, shape: str, dtype: str) -> Case:
    """A named shape of the parity table (``full_context``, ...) or ``B,T,D_IN,D_OUT,N``;
    ValueError for a size below 1, an array past ``MAX_ENTRIES`` entries (the input, a weight, the
    scores) and sizes the class refuses (heads that do not divide the width)."""
    if shape in SHAPES:
        batch, tokens, ctx, d_in, d_out, heads = SHAPES[shape]
    else:
        try:
            batch, tokens, d_in, d_out, heads = (int(n) for n in shape.split(","))
        except ValueError:
            raise ValueError(
                f"--shape must be one of {list(SHAPES)} or B,T,D_IN,D_OUT,N (five integers), got {shape!r}"
            ) from None
        arrays = [(batch, tokens, d_in), (d_in, d_out), (batch, heads, tokens, tokens)]  # x, W, scores
        check_sizes("--shape", shape, (batch, tokens, d_in, d_out, heads), arrays)
        ctx = tokens
    case = Case(layer, batch, tokens, d_in, d_out, heads, True, True, ctx, dtype)
    spec.check_sizes(spec.SPECS[layer], case.constructor_arguments())
    return case


def trace_case(case: Case, frameworks: tuple[str, ...] | None = None) -> Trace:
    """Run the case in torch_ref and in each framework (default: every one of ``RUNNERS`` that
    computes in the case's dtype); compare every step."""
    from torch_ref import to_params

    module = case.build_torch()
    params, x = to_params(module), case.make_input()
    expected = run_torch(module, x)[1]
    if frameworks is None:
        frameworks = tuple(f for f in RUNNERS if case.dtype in DTYPES[f])
    reports = {f: compare_steps(expected, RUNNERS[f](case, params, x)) for f in frameworks}
    return Trace(case.id, expected, reports)


def _gpt_runners(params: Mapping[str, Any], ids: Any) -> dict[str, Any]:
    """framework -> the book's GPT's steps on ``ids`` (the columns of ``RUNNERS``)."""
    import jax
    import jax.numpy as jnp

    import jax_attn
    import numpy_attn
    from parity_tests.book_gpt import CONFIG

    def flax() -> Mapping[str, Any]:
        return jax_attn.GPTModel.from_params(params, CONFIG)(jnp.asarray(ids), return_steps=True)[1]

    jitted = jax.jit(lambda p, i: jax_attn.gpt_model(p, i, CONFIG, return_steps=True)[1])
    return {
        "numpy": lambda: numpy_attn.gpt_model(params, ids, CONFIG, return_steps=True)[1],
        "jax": lambda: jax_attn.gpt_model(params, jnp.asarray(ids), CONFIG, return_steps=True)[1],
        "jax-jit": lambda: jitted(params, jnp.asarray(ids)),
        "flax": flax,
    }


def trace_gpt(frameworks: tuple[str, ...] | None = None) -> Trace:
    """The book's GPT (GPT_CONFIG_124M, seed 123, float32) on the book's token ids in torch_ref and
    in each framework (default: every one of ``RUNNERS``); every step compared (embeddings, each
    block's six steps, the final LayerNorm, the logits)."""
    import torch

    from parity_tests.book_gpt import batch_ids, book_model, model_params
    from parity_tests.frameworks import jax_context

    model, ids = book_model(), batch_ids()
    params = model_params(model)
    with torch.no_grad():
        expected = model(torch.from_numpy(ids), return_steps=True)[1]
    runners = _gpt_runners(params, ids)
    with jax_context("float32"):
        reports = {f: compare_steps(expected, runners[f]()) for f in frameworks or RUNNERS}
    return Trace(f"GPTModel (GPT_CONFIG_124M, seed 123) on ids {ids.tolist()}", expected, reports)
