"""What every Flax NNX attention module shares: weights in and out, dropout state, init."""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Mapping
from typing import Any, ClassVar, Self

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from jax_attn.blockwise import DEFAULT_BLOCK_SIZE
from jax_attn.convert import flax_path, flax_value, torch_name, torch_value
from numpy_attn.spec import infer_dims, param_shapes
from numpy_attn.validation import check_finite, check_params

__all__ = ["FROM_WEIGHTS", "AttentionModule", "torch_linear", "torch_uniform"]

# constructor argument of a module -> the ``LayerDims`` field that ``from_params`` reads from the
# weights (the notes' classes name the same sizes differently: note 003's ``hidden_size``, ``bias``)
FROM_WEIGHTS = {
    "d_in": "d_in",
    "d_out": "d_out",
    "qkv_bias": "qkv_bias",
    "out_bias": "out_bias",
    "hidden_size": "d_in",
    "bias": "qkv_bias",
}


def torch_uniform(low: float, high: float) -> Callable[..., jax.Array]:
    """An initializer drawing uniformly from [low, high), like torch's ``uniform_``."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, shape, dtype, low, high)

    return init


def torch_linear(d_in: int, d_out: int, bias: bool, dtype: Any, rngs: nnx.Rngs) -> nnx.Linear:
    """An ``nnx.Linear`` initialised as torch's ``nn.Linear``: weight and bias uniform in
    ±1/sqrt(in_features) (what ``kaiming_uniform_(a=sqrt(5))`` amounts to)."""
    bound = 1.0 / math.sqrt(d_in)
    init = torch_uniform(-bound, bound)
    return nnx.Linear(
        d_in,
        d_out,
        use_bias=bias,
        dtype=dtype,
        param_dtype=dtype,
        kernel_init=init,
        bias_init=init,
        rngs=rngs,
    )


class AttentionModule(nnx.Module):
    """Base of the modules: ``layer`` names the torch class whose weights format is used.

    Dropout follows NNX conventions: ``deterministic`` is switched by ``.train()`` and
    ``.eval()``, and random masks come from the module's fork of the ``dropout`` stream of the
    ``nnx.Rngs`` it was built with. A module built by ``from_params`` without ``rngs`` starts in
    eval mode and has no stream.
    """

    layer: ClassVar[str]
    num_heads: int = 1

    @classmethod
    def from_params(
        cls,
        params: Mapping[str, Any],
        *,
        implementation: str = "reference",
        block_size: int = DEFAULT_BLOCK_SIZE,
        rngs: nnx.Rngs | None = None,
        **arguments: Any,
    ) -> Self:
        """A module holding ``params`` (the project's weights format, checked as ``load_params``
        does): sizes and bias flags are read from the weights' shapes, ``arguments`` are the
        constructor's other arguments by name (``context_length``, ``num_heads``, dropout rates:
        what the weights cannot tell; ``dropout`` defaults to 0). The dtype is the weights'.
        With ``rngs`` the module draws dropout masks from its ``dropout`` stream in train mode;
        without, it starts in eval mode and has no stream.
        """
        dims = infer_dims(cls.layer, params, arguments.get("num_heads", 1))  # a non-empty mapping of arrays
        constructor = inspect.signature(cls.__init__).parameters
        sizes = {name: getattr(dims, field) for name, field in FROM_WEIGHTS.items() if name in constructor}
        defaults = {"dropout": 0.0} if "dropout" in constructor else {}
        dtype = next(iter(params.values())).dtype
        module = cls(
            **sizes, **(defaults | arguments), dtype=dtype,
            implementation=implementation, block_size=block_size,
            rngs=nnx.Rngs(0) if rngs is None else rngs,  # weights are overwritten: any stream builds it
        )  # fmt: skip
        if hasattr(module, "deterministic"):  # a class with dropout: the caller's stream, or eval
            module._init_dropout(rngs)
        return module.load_params(params)

    def _init_dropout(self, rngs: nnx.Rngs | None) -> None:
        self.deterministic = rngs is None
        self.rngs = None if rngs is None else rngs["dropout"].fork()

    def dropout_key(self) -> jax.Array | None:
        """A fresh key in train mode, None in eval mode."""
        if self.deterministic:
            return None
        if self.rngs is None:
            raise ValueError(
                f"{type(self).__name__} is in train mode but has no dropout stream: "
                "build it with rngs=nnx.Rngs(...) or call .eval()"
            )
        return self.rngs()

    def _param_variables(self) -> dict[str, nnx.Param]:
        return {torch_name(path): node for path, node in nnx.iter_graph(self) if isinstance(node, nnx.Param)}

    def torch_params(self) -> dict[str, jax.Array]:
        """The weights as JAX arrays in the project's format (torch names, layout and order)."""
        params = {
            name: torch_value(flax_path(name), variable[...])
            for name, variable in self._param_variables().items()
        }
        dims = infer_dims(self.layer, params, self.num_heads)
        order = param_shapes(
            self.layer, d_in=dims.d_in, d_out=dims.d_out, num_heads=dims.num_heads,
            qkv_bias=dims.qkv_bias, out_bias=dims.out_bias,
        )  # fmt: skip
        return {name: params[name] for name in order}

    def to_params(self) -> dict[str, np.ndarray]:
        """The weights in the project's format, as NumPy arrays in torch's order."""
        return {name: np.asarray(value) for name, value in self.torch_params().items()}

    def load_params(self, params: Mapping[str, Any]) -> AttentionModule:
        """Copy torch-format weights in, in place, and return the module.

        Every key and shape is checked first (one error names every missing, unexpected and
        mis-shaped key), then every value must be finite; values are cast to the module's dtype
        (as torch's ``load_state_dict`` does).
        """
        variables = self._param_variables()
        expected = {name: torch_value(flax_path(name), v[...]).shape for name, v in variables.items()}
        check_params(params, expected, layer=self.layer)
        check_finite(params)
        for name, variable in variables.items():
            value = jnp.asarray(flax_value(name, params[name]))
            variable[...] = value.astype(variable[...].dtype)
        return self
