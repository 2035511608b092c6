"""Gradients of ``sum(output * cotangent)`` in torch and JAX, keyed like a step trace."""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Mapping
from typing import Any

import numpy as np

from parity_tests.cases import Case
from parity_tests.frameworks import layer_function

__all__ = ["jax_gradients", "torch_gradients"]


def torch_gradients(module: Any, x: np.ndarray, cotangent: np.ndarray, **kwargs: Any) -> OrderedDict:
    """d sum(module(x) * cotangent) / d (x, every parameter) by torch autograd: ``x`` first,
    then the parameters under their state_dict names. Array ``kwargs`` become tensors."""
    from torch_ref import from_numpy, to_numpy

    kwargs = {k: from_numpy(v) if isinstance(v, np.ndarray) else v for k, v in kwargs.items()}
    x_tensor = from_numpy(x).requires_grad_(True)
    output = module(x_tensor, **kwargs)
    (output * from_numpy(cotangent)).sum().backward()
    grads = OrderedDict(x=to_numpy(x_tensor.grad))
    grads.update((name, to_numpy(param.grad)) for name, param in module.named_parameters())
    return grads


def jax_gradients(
    case: Case,
    params: Mapping[str, Any],
    x: np.ndarray,
    cotangent: np.ndarray,
    *,
    dropout: float = 0.0,
    **kwargs: Any,
) -> OrderedDict:
    """The same gradients by ``jax.jit(jax.grad(...))`` of the case's jax_attn function."""
    import jax
    import jax.numpy as jnp

    fn = layer_function("jax", case.layer)

    def loss(params: Mapping[str, Any], x: Any) -> Any:
        return jnp.sum(fn(params, x, **case.kwargs(dropout), **kwargs) * cotangent)

    grad_params, grad_x = jax.jit(jax.grad(loss, argnums=(0, 1)))(params, x)
    return OrderedDict(x=grad_x, **grad_params)
