"""Gradient parity of a port: ``d sum(output * cotangent)`` with respect to the input and every
weight, torch reference against a JAX candidate taking the weights format, compared weight by
weight in backward order (the output projection first, the input last)."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Callable, Mapping
from typing import Any

import numpy as np

from parity_tests.compare import StepReport, compare_steps
from parity_tests.gradients import torch_gradients

__all__ = ["locate_gradients"]


def locate_gradients(
    reference: Any,
    candidate: Callable[..., Any],
    x: np.ndarray,
    params: Mapping[str, np.ndarray],
    *,
    seed: int = 0,
) -> StepReport:
    """Compare the gradients of a torch module ``reference`` (in eval mode) with those of
    ``candidate(params, x)``, a JAX function of the weights format, for one seeded cotangent.

    Rows come in backward order (``x`` last) and ``first_divergence`` names the first weight whose
    gradient differs: the port's backward pass goes wrong at the layer using it. A forward pass
    that matches but a gradient that does not points at ``stop_gradient``, an integer cast, or a
    custom rule.
    """
    import jax
    import jax.numpy as jnp

    from parity_tests.locate.run import to_numpy

    was_training = reference.training
    reference.eval()
    try:
        x = np.asarray(to_numpy(x))
        output = np.asarray(jax.eval_shape(candidate, dict(params), x).shape)
        cotangent = np.random.default_rng(seed).standard_normal(tuple(output)).astype(x.dtype)
        expected = torch_gradients(reference, x, cotangent)
    finally:
        reference.train(was_training)

    def loss(weights, inputs):
        return jnp.sum(candidate(weights, inputs) * cotangent)

    weight_grads, input_grad = jax.grad(loss, argnums=(0, 1))(
        {k: jnp.asarray(v) for k, v in params.items()}, jnp.asarray(x)
    )
    actual = OrderedDict((name, np.asarray(weight_grads[name])) for name in params)
    actual["x"] = np.asarray(input_grad)
    backward = [name for name in reversed(expected) if name != "x"] + ["x"]
    return compare_steps(OrderedDict((n, expected[n]) for n in backward), actual)
