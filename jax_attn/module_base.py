"""What every Flax NNX attention module shares: weights in and out, input checks, dropout
state, the call of the attention core, and the steps it sows."""

from __future__ import annotations

import functools
import inspect
import math
from collections.abc import Callable, Collection, Iterator, Mapping
from typing import Any, ClassVar, Self, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx
from numpy_attn.attend_options import AttnDropout, ComputePath, Masking
from numpy_attn.implementation import check_implementation
from numpy_attn.validation import (
    JAX_FLOATS,
    check_array_size,
    check_cast_finite,
    check_context_length,
    check_dropout,
    check_finite,
    check_flag,
    check_input,
    check_mapping,
    check_params,
    check_size,
)

from jax_attn.attend import attend
from jax_attn.checks import check_dtype, check_x64
from jax_attn.convert import as_jax, flax_path, flax_value, torch_name, torch_value
from jax_attn.draws import merged_draw
from jax_attn.heads import merge_heads, split_heads
from numpy_attn.spec import (
    check_masks,
    check_sizes,
    check_weights,
    constructor_arguments,
    layer_spec,
    parameter_names,
    parameter_shapes,
    without_buffers,
)
from numpy_attn.steps import Steps

__all__ = [
    "MODULE_OPTIONS", "AttentionModule", "build_to_load", "check_loaded", "check_rngs", "check_weight_dtypes",
    "check_weights_to_draw", "fill", "load_variables", "named_params", "param_paths", "readable_weights",
    "torch_linear", "torch_normal", "torch_qkv", "torch_uniform",
]  # fmt: skip

# the constructor arguments of a Flax module that its torch class does not have
MODULE_OPTIONS = ("dtype", "implementation", "block_size", "rngs")
M = TypeVar("M", bound=nnx.Module)
SIZES = ("d_in", "d_out", "hidden_size", "num_heads")  # constructor arguments that are positive sizes
FLAGS = ("qkv_bias", "out_bias", "bias")  # constructor arguments that are bools


def torch_uniform(low: float, high: float) -> Callable[..., jax.Array]:
    """An initializer drawing uniformly from [low, high), like torch's ``uniform_``: the bits of
    ``jax.random.uniform``, drawn by ``merged_draw`` (compiled faster)."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return merged_draw(jax.random.uniform, key, shape, dtype=dtype, minval=low, maxval=high)

    return init


def torch_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """An initializer drawing from N(0, 1), like torch's ``nn.Embedding``: the bits of
    ``jax.random.normal``, drawn by ``merged_draw`` (compiled faster)."""
    return merged_draw(jax.random.normal, key, shape, dtype=dtype)


def build_to_load(build: Callable[[nnx.Rngs], M], rngs: nnx.Rngs | None) -> M:
    """``build(rngs)``: the module ``from_params`` then fills with weights. With ``rngs`` it is
    built as it is (its dropout streams are forks of the caller's). Without, it is built as shapes
    only (``nnx.eval_shape``), so that no weight is drawn to be thrown away, and with no dropout
    stream: eval mode, as ``nnx.Dropout`` without ``rngs``. ``check_loaded`` checks the fill."""
    if rngs is not None:
        return build(rngs)
    module = nnx.eval_shape(lambda: build(nnx.Rngs(0)))
    for _, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Dropout):
            node.rngs, node.deterministic = None, True
        elif isinstance(node, AttentionModule) and hasattr(node, "deterministic"):
            node._init_dropout(None)
    return module


def fill(variable: nnx.Variable, value: jax.Array) -> None:
    """Write ``value``, cast to the variable's dtype, into ``variable``: over its array in place
    (keeping the array's placement, as ``variable[...] = value`` does) or over the shape that
    ``build_to_load`` left."""
    current = variable.get_value()
    value = value.astype(current.dtype)
    if isinstance(current, jax.ShapeDtypeStruct):
        variable.set_value(value)
    else:
        variable[...] = value


def param_paths(
    node: Any, path: tuple[str | int, ...] = (), ancestors: frozenset[int] = frozenset()
) -> Iterator[tuple[tuple[str | int, ...], nnx.Param]]:
    """``(Flax path, parameter)`` for every parameter under the graph node ``node``, under every
    path that reaches it: a submodule or parameter shared within the module (``m.W_key =
    m.W_query``, tied weights) comes once per path, where ``nnx.iter_graph`` gives it once, under
    its first path only. A node met again inside itself (a cycle) is not followed."""
    ancestors = ancestors | {id(node)}
    for key, child in nnx.iter_children(node):
        if isinstance(child, nnx.Param):
            yield (*path, key), child
        elif not isinstance(child, nnx.Variable) and id(child) not in ancestors:
            yield from param_paths(child, (*path, key), ancestors)


def named_params(
    node: Any, names: Collection[str], name_of: Callable[[tuple[str | int, ...]], str] = torch_name
) -> dict[str, tuple[tuple[str | int, ...], nnx.Param]]:
    """torch name (``name_of`` a path) -> ``(Flax path, parameter)``, for the paths of
    ``param_paths`` whose torch name is one of ``names`` (the weights format's): a submodule
    shared between two of them (``m.W_key = m.W_query``, tied weights) is under both names; an
    alias attribute (``m.alias = m.W_query``: a second path that is no torch name) is left out,
    as the parameters it reaches are under their torch names already. A parameter under none of
    ``names`` (one the format has no place for) is a ValueError naming its paths."""
    paths = [(name_of(path), path, param) for path, param in param_paths(node)]
    named = {name: (path, param) for name, path, param in paths if name in names}
    kept = {id(param) for _, param in named.values()}
    extra = sorted(name for name, _, param in paths if id(param) not in kept)
    if extra:
        raise ValueError(
            f"{type(node).__name__} has parameters that its weights format has no name for: {extra}"
        )
    return named


def load_variables(variables: Mapping[str, nnx.Variable], value_of: Callable[[str], jax.Array]) -> None:
    """``fill`` each of ``variables`` (torch name -> variable) with ``value_of(name)`` (its value
    in Flax's layout). The names of one shared variable (tied weights: ``named_params``) must get
    equal values, cast to its dtype: otherwise a ValueError names both keys, and nothing is
    written; the variable is then filled once."""
    first: dict[int, str] = {}
    for name, variable in variables.items():
        other = first.setdefault(id(variable), name)
        dtype = variable.get_value().dtype
        if other != name and not jnp.array_equal(value_of(other).astype(dtype), value_of(name).astype(dtype)):
            raise ValueError(
                f"params[{other!r}] and params[{name!r}] share one variable in this module (tied "
                "weights) but differ: give them equal values"
            )
    for name, variable in variables.items():
        if first[id(variable)] == name:
            fill(variable, value_of(name))


def check_rngs(rngs: Any, *, call: bool = False) -> None:
    """A constructor's ``rngs``: an ``nnx.Rngs`` (its streams draw the weights and dropout).
    With ``call``, a call's ``rngs``: None (the module's own stream), an ``nnx.Rngs`` or one of
    its streams (``nnx.RngStream``, as ``nnx.Dropout`` takes)."""
    if call and (rngs is None or isinstance(rngs, nnx.RngStream)):
        return
    if not isinstance(rngs, nnx.Rngs):
        raise TypeError(
            f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)){' or None' if call else ''}, "
            f"got {rngs!r} ({type(rngs).__name__})"
        )


def readable_weights(params: Mapping[str, Any]) -> dict[str, Any]:
    """Each weight of ``params`` with the dtype it was given, for the checks: NumPy arrays as
    they are (their byte order checked with their dtype, by ``check_params``), other arrays (JAX,
    torch) as JAX arrays converted in 64-bit mode, where ``as_jax`` keeps a float64 or int64
    dtype that it narrows without x64; anything else as it is, for the checks to name."""
    check_mapping(params)
    with jax.enable_x64(True):
        return {
            name: value if isinstance(value, np.ndarray) else as_jax(value) for name, value in params.items()
        }


def check_weight_dtypes(
    layer: str, weights: Mapping[str, Any], shapes: Mapping[str, Any], default: Any
) -> np.dtype:
    """The one dtype that ``weights`` (of keys and ``shapes`` already checked, in torch's order)
    share: that of the first, if it is floating, else ``default``. The layer function checks the
    weights against x's dtype; here, against that one, with its TypeError word for word (the
    first weight of another dtype named): what a call with an x of that dtype would raise."""
    first = np.dtype(weights[next(iter(shapes))].dtype)
    dtype = first if first.name in JAX_FLOATS else np.dtype(default)
    check_params(weights, shapes, layer=layer, dtype=dtype)
    return dtype


def check_weights_to_draw(shapes: Mapping[str, tuple[int, ...]], dtype: Any) -> None:
    """What a constructor checks before it draws weights of ``shapes`` (torch name -> shape) in
    ``dtype``: a floating dtype in the machine's byte order (``check_dtype_argument``), float64
    only with JAX's 64-bit mode (``check_dtype``), and no weight past ``MAX_ELEMENTS``
    elements (``check_array_size``: XLA would abort the process)."""
    check_dtype(dtype)
    for name, shape in shapes.items():
        check_array_size(f"weight {name!r}", shape)


def check_loaded(module: nnx.Module) -> None:
    """Every variable of ``module`` holds an array (none is a shape ``build_to_load`` left)."""
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(module))
    shapes = [jax.tree_util.keystr(path) for path, value in leaves if isinstance(value, jax.ShapeDtypeStruct)]
    if shapes:
        raise RuntimeError(f"variables left without values after loading: {shapes}")


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


def torch_qkv(
    d_in: int, d_out: int, bias: bool, dtype: Any, rngs: nnx.Rngs
) -> tuple[nnx.Linear, nnx.Linear, nnx.Linear]:
    """``W_query``, ``W_key``, ``W_value``: three ``torch_linear`` from d_in to d_out, drawn in
    that order (the torch classes' three ``nn.Linear``)."""
    return tuple(torch_linear(d_in, d_out, bias, dtype, rngs) for _ in range(3))


class _Signature:
    """What ``inspect.signature`` (and so ``help``) shows: for a class, its constructor's
    signature, which nnx's metaclass would hide behind ``(*args, **kwargs)``; for a module,
    its ``__call__``'s."""

    def __get__(self, module: Any, cls: type) -> inspect.Signature:
        method = inspect.signature(cls.__init__ if module is None else cls.__call__)
        return method.replace(parameters=list(method.parameters.values())[1:])  # without self


class AttentionModule(nnx.Module):
    """Base of the modules: ``layer`` names the torch class whose weights format is used.

    Dropout follows ``nnx.Dropout``: ``deterministic`` is switched by ``.train()`` and
    ``.eval()`` (or passed to a call), and random masks come from the module's fork of the
    ``dropout`` stream of the ``nnx.Rngs`` it was built with (or the ``rngs`` passed to a call).
    A module built by ``from_params`` without ``rngs`` starts in eval mode and has no stream.

    Steps: with ``return_steps=True`` a call returns ``(output, steps)``; inside ``nnx.capture``
    it also sows every step (``self.sow(nnx.Intermediate, name, value)``; the wrapper's heads sow
    theirs under ``heads.{i}``), so that ``nnx.capture(module, nnx.Intermediate)(x,
    return_steps=True)`` collects them. Outside ``nnx.capture`` nothing is sown (Flax 0.12
    deprecates sowing there): the module's state stays as it was.
    """

    layer: ClassVar[str]
    num_heads: int = 1

    __signature__ = _Signature()

    @classmethod
    def from_params(cls, params: Mapping[str, Any], /, **arguments: Any) -> Self:
        """A module holding ``params``: the project's weights format (NumPy, JAX or torch arrays;
        a torch ``state_dict()`` as it is, its causal-mask buffers ignored), checked as
        ``load_params`` does: they must share one floating dtype (``check_weight_dtypes``),
        float64 only in JAX's 64-bit mode.

        ``arguments`` are the constructor's, by name: the sizes and bias flags are read from the
        weights (one given that contradicts them raises ValueError naming both values); the
        others (``context_length``, ``num_heads``, dropout rates, ``implementation``...) are
        passed on; ``dropout`` defaults to 0. ``dtype`` defaults to the weights'. With ``rngs``
        the module draws dropout masks from its ``dropout`` stream in train mode; without, it
        starts in eval mode and has no stream, and is built as shapes (``build_to_load``): no
        weight is drawn to be overwritten.
        """
        options = {name: arguments.pop(name) for name in MODULE_OPTIONS if name in arguments}
        weights = readable_weights(without_buffers(cls.layer, params))
        arguments = constructor_arguments(cls.layer, weights, **arguments)  # the torch class's
        rngs = options.pop("rngs", None)
        shapes = parameter_shapes(cls.layer, **arguments)
        dtype = check_weight_dtypes(cls.layer, weights, shapes, options.get("dtype", jnp.float32))
        if "dtype" not in options:  # the weights': as the functions, float64 only with x64
            first = next(iter(shapes))
            check_x64(f"params[{first!r}]", weights[first])
            options["dtype"] = dtype
        module = build_to_load(lambda rngs: cls(**arguments, **options, rngs=rngs), rngs)
        module.load_params(weights)
        check_loaded(module)
        return module

    def _init_layer(
        self, arguments: Mapping[str, Any], dtype: Any, implementation: str, block_size: int, rngs: nnx.Rngs
    ) -> None:
        """Check the torch constructor's ``arguments`` as the torch class and the layer function
        do (sizes, heads, dropout rates, read from the spec; the context length with the
        function's ``check_size``), the bias flags (bools: ``check_flag``), ``rngs``, ``dtype``
        and the weights' sizes (``check_weights_to_draw``) and the compute path; keep what a call
        reads: the arguments the layer function takes (``context_length``, ``num_heads``, the
        dropout rates...), the torch name of the input weight and, with dropout, the train/eval
        state and a fork of the ``dropout`` stream of ``rngs``."""
        check_rngs(rngs)
        spec = layer_spec(self.layer)
        for name in (*SIZES, spec.context):
            if name in arguments:
                check_size(name, arguments[name])
        for name in FLAGS:
            if name in arguments:
                check_flag(name, arguments[name])
        check_sizes(self.layer, arguments)
        check_weights_to_draw(parameter_shapes(self.layer, **arguments), dtype)
        for name in spec.dropouts:
            check_dropout(name, arguments[name])
        check_implementation(implementation, block_size)
        self.implementation, self.block_size = implementation, block_size
        for name in spec.arguments:
            setattr(self, name, arguments[name])
        self.param_names = tuple(parameter_names(self.layer, **arguments))  # the first is the input weight
        if spec.dropouts:
            self._init_dropout(rngs)

    def _init_dropout(self, rngs: nnx.Rngs | None) -> None:
        self.deterministic = rngs is None
        self.rngs = None if rngs is None else rngs["dropout"].fork()

    def _dropout_rngs(
        self, deterministic: bool | None, rngs: nnx.Rngs | nnx.RngStream | None
    ) -> nnx.Rngs | nnx.RngStream | None:
        """Where this call's dropout masks come from: None in eval mode. ``deterministic`` and
        ``rngs`` given to the call override the module's, as in ``nnx.Dropout``; a call's
        ``rngs`` of another type is refused in either mode (``check_rngs``), and so is a
        ``deterministic`` that is neither None nor a bool (``check_flag``: ``"no"`` would have
        meant yes)."""
        check_rngs(rngs, call=True)
        if deterministic is not None:
            check_flag("deterministic", deterministic)
        if self.deterministic if deterministic is None else deterministic:
            return None
        stream = self.rngs if rngs is None else rngs
        if stream is None:
            raise ValueError(
                f"{type(self).__name__} is in train mode but has no dropout stream: "
                "build it with rngs=nnx.Rngs(...) or call .eval()"
            )
        return stream

    def _dropout_key(
        self, deterministic: bool | None, rngs: nnx.Rngs | nnx.RngStream | None
    ) -> jax.Array | None:
        """A fresh key in train mode, None in eval mode."""
        stream = self._dropout_rngs(deterministic, rngs)
        if stream is None:
            return None
        return stream.dropout() if isinstance(stream, nnx.Rngs) else stream()

    def _check_call(
        self,
        x: Any,
        *,
        return_steps: bool,
        attn_keep_mask: jax.Array | None = None,
        out_keep_mask: jax.Array | None = None,
        padding_mask: jax.Array | None = None,
    ) -> jax.Array:
        """The layer function's checks of a call, with its errors word for word: ``x`` a floating
        array of the layer's layout, as wide as the input weight's input features and of its
        dtype (the TypeError names the weight by its torch name), no longer than the context;
        the masks' shapes and dtypes (``check_masks``); ``return_steps`` a bool (``check_flag``:
        a string or 1 is a TypeError). Returns x as a JAX array."""
        check_flag("return_steps", return_steps)
        weight = self
        input_weight = self.param_names[0]
        for step in flax_path(input_weight):
            weight = weight[step] if isinstance(step, int) else getattr(weight, step)
        value = weight[...]  # (in, out)
        spec = layer_spec(self.layer)
        shape = check_input(x, layout=spec.input_layout, d_in=value.shape[0], floating=JAX_FLOATS)
        check_x64("x", x)  # a module holds float64 weights only in 64-bit mode
        expected = {input_weight: value.shape}
        check_params({input_weight: value}, expected, layer=self.layer, dtype=x.dtype)
        if spec.context is not None:
            check_context_length(shape, getattr(self, spec.context), spec.context)
        check_masks(self.layer, shape, self.num_heads, attn_keep_mask, out_keep_mask, padding_mask)
        return jnp.asarray(x)

    def _attention(
        self,
        queries: jax.Array,
        keys: jax.Array,
        values: jax.Array,
        masking: Masking = Masking(),
        dropout: AttnDropout = AttnDropout(),
        *,
        num_heads: int | None = None,
        return_steps: bool = False,
    ) -> tuple[jax.Array, Steps]:
        """``(context_vec, steps)``: ``jax_attn.attend`` of the projections (``(..., T, E)``;
        split into ``num_heads`` heads and merged back if given) on the module's compute path;
        steps are ``queries``, ``keys``, ``values``, attend's and ``context_vec``, when
        ``return_steps``."""
        heads = (lambda a: a) if num_heads is None else (lambda a: split_heads(a, num_heads))
        context_vec, attention_steps = attend(
            heads(queries), heads(keys), heads(values),  # (..., N, T, H) with num_heads
            masking, dropout, ComputePath(self.implementation, self.block_size), return_steps,
        )  # fmt: skip
        if num_heads is not None:
            context_vec = merge_heads(context_vec)  # (B, T, E)
        if not return_steps:
            return context_vec, Steps()
        steps = Steps(queries=queries, keys=keys, values=values, **attention_steps, context_vec=context_vec)
        return context_vec, steps

    def _finish(
        self, output: jax.Array, steps: Steps, return_steps: bool, sown: Steps | None = None
    ) -> jax.Array | tuple[jax.Array, Steps]:
        """``output``, or with ``return_steps`` ``(output, steps)`` once ``steps`` and
        ``output`` are sown; ``sown`` are steps that submodules already sowed (listed first)."""
        if not return_steps:
            return output
        steps = Steps(**steps, output=output)
        if hasattr(self, "__captures__"):  # inside nnx.capture: as Module.sow tells, the one place it sows
            for name, value in steps.items():
                self.sow(nnx.Intermediate, name, value)
        return output, Steps(**(sown or {}), **steps)

    def _param_variables(self) -> dict[str, tuple[tuple[Any, ...], nnx.Param]]:
        """torch name -> (Flax path, parameter), for each of the class's torch names that a path
        of the module has (a shared parameter under each of its names, an alias attribute left
        out: ``named_params``)."""
        return named_params(self, self.param_names)

    def to_params(self) -> dict[str, np.ndarray]:
        """The weights in the project's format, as NumPy arrays in torch's names, layout and order."""
        params = {
            name: np.asarray(torch_value(path, variable[...]))
            for name, (path, variable) in self._param_variables().items()
        }
        order = parameter_names(self.layer, **check_weights(self.layer, params, self.num_heads))
        return {name: params[name] for name in order}

    def load_params(self, params: Mapping[str, Any]) -> Self:
        """Copy torch-format weights in (NumPy, JAX or torch arrays; a torch ``state_dict()``'s
        causal-mask buffers ignored), in place, and return the module.

        Every key and shape is checked first (one error names every missing, unexpected and
        mis-shaped key), then the weights must share one floating dtype (``check_weight_dtypes``),
        then every value must be finite, and stay finite cast to the module's dtype
        (``check_cast_finite``: 1e5 into float16 is a ValueError, as in torch_ref); values are
        cast to the module's dtype (as torch's ``load_state_dict`` does). With ``to_params``,
        the only place where torch's layout becomes Flax's.
        """
        weights = readable_weights(without_buffers(self.layer, params))
        variables = self._param_variables()
        expected = {
            name: jax.eval_shape(functools.partial(torch_value, path), var.get_value()).shape
            for name, (path, var) in variables.items()
        }  # a value may be its shape alone (build_to_load)
        check_params(weights, expected, layer=self.layer)
        shapes = parameter_shapes(self.layer, **check_weights(self.layer, weights, self.num_heads))
        check_weight_dtypes(self.layer, weights, shapes, variables[next(iter(shapes))][1].get_value().dtype)
        check_finite(weights)
        check_cast_finite(weights, {name: var.get_value().dtype for name, (_, var) in variables.items()})
        load_variables(
            {name: variable for name, (_, variable) in variables.items()},
            lambda name: flax_value(name, as_jax(weights[name])),
        )
        return self
