"""What the Flax NNX modules share: torch's initialisation; the weights format in and out
(``TorchWeights``: the layout changes once, as weights enter or leave); the attention modules'
door (``AttentionModule``: the constructor checked by the layer's ``LayerSpec``, a call by the layer
function's own checks, word for word) and the one attention core they call
(``numpy_attn.fast.attend.attend`` on jax_attn's framework).
"""

from __future__ import annotations

import inspect
import math
from collections.abc import Callable, Iterator, Mapping
from typing import Any, ClassVar, Self, TypeVar

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import jax_attn  # jax_attn.FRAMEWORK is read at call time: this module is imported while jax_attn starts
from jax_attn.convert import LAYOUT, Path, as_jax, flax_path, to_flax, torch_name, torch_value
from jax_attn.ops import merge_heads, split_heads
from numpy_attn import checks, finite, memory
from numpy_attn.door import check_masks
from numpy_attn.fast.attend import attend
from numpy_attn.fast.options import AttnDropout, ComputePath, Masking, check_implementation
from numpy_attn.spec import SPECS, check_sizes, constructor_arguments, without_buffers
from numpy_attn.steps import Steps

M = TypeVar("M", bound=nnx.Module)
Rngs = nnx.Rngs | nnx.RngStream | None
Variables = dict[str, tuple[Path, nnx.Param]]  # torch name -> (Flax path, parameter)
OPTIONS = ("dtype", "implementation", "block_size")  # a constructor's keywords beside torch's (and rngs)


def torch_uniform(low: float, high: float) -> Callable[..., jax.Array]:
    """An initializer drawing from U[low, high) (torch's ``uniform_``): ``jax.random.uniform``'s
    bits at ``shape``, drawn flat (XLA:CPU compiles the counters of one axis faster)."""

    def init(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
        return jax.random.uniform(key, (math.prod(shape),), dtype, low, high).reshape(shape)

    return init


def torch_normal(key: jax.Array, shape: tuple[int, ...], dtype: Any = jnp.float32) -> jax.Array:
    """An initializer drawing from N(0, 1) (``nn.Embedding``'s): ``jax.random.normal``'s bits, drawn flat."""
    return jax.random.normal(key, (math.prod(shape),), dtype).reshape(shape)


def torch_linear(d_in: int, d_out: int, bias: bool, dtype: Any, rngs: nnx.Rngs) -> nnx.Linear:
    """An ``nnx.Linear``, kernel ``(d_in, d_out)``, drawn as ``nn.Linear``: from U(±1/sqrt(d_in))."""
    init = torch_uniform(-1 / math.sqrt(d_in), 1 / math.sqrt(d_in))
    return nnx.Linear(d_in, d_out, use_bias=bias, dtype=dtype, param_dtype=dtype, kernel_init=init,
                      bias_init=init, rngs=rngs)  # fmt: skip


def check_rngs(rngs: Any, *, call: bool = False) -> None:
    """A constructor's ``rngs``: an ``nnx.Rngs``; a call's (``call``): also None or an ``nnx.RngStream``."""
    if not isinstance(rngs, (nnx.Rngs, nnx.RngStream, type(None)) if call else nnx.Rngs):
        or_none = " or None" if call else ""
        raise TypeError(
            f"rngs must be a flax.nnx.Rngs (nnx.Rngs(seed)){or_none}, got {rngs!r} ({type(rngs).__name__})"
        )


def check_weights_to_draw(
    dtype: Any, shapes: Mapping[str, tuple[int, ...]], what: str, count: int | None = None
) -> None:
    """A constructor's ``dtype`` (jax_attn's floats; float64 with x64), weights of ``shapes`` an array
    may hold (XLA would abort the process past ``memory.MAX_ELEMENTS``), and ``count`` weights in all
    (those of ``shapes`` by default) that fit in memory (``memory.check_memory``), before any is drawn."""
    dtype = jax_attn.FRAMEWORK.check_dtype(dtype)
    for name, shape in shapes.items():
        memory.check_array_size(f"weight {name!r}", shape)
    count = sum(math.prod(shape) for shape in shapes.values()) if count is None else count
    memory.check_memory(f"{what}'s {count} weights in {dtype.name}", count * dtype.itemsize,
                        jax_attn.FRAMEWORK.memory_bytes())  # fmt: skip


def readable_weights(params: Mapping[str, Any]) -> dict[str, Any]:
    """The weights as the checks read them: NumPy arrays as they are (their byte order checked), JAX
    and torch arrays as JAX arrays made in 64-bit mode (float64 kept, for the x64 check), others as
    they are (for the checks to name)."""
    checks.check_mapping(params)
    with jax.enable_x64(True):
        return {name: w if isinstance(w, np.ndarray) else as_jax(w) for name, w in params.items()}


def build_to_load(build: Callable[[nnx.Rngs], M], rngs: nnx.Rngs | None) -> M:
    """``build(rngs)``, the module ``from_params`` fills; without ``rngs``, built as shapes
    (``nnx.eval_shape``: no weight drawn to be thrown away), in eval mode with no dropout stream."""
    if rngs is not None:
        return build(rngs)
    module = nnx.eval_shape(lambda: build(nnx.Rngs(0)))
    for _, node in nnx.iter_graph(module):
        if isinstance(node, nnx.Dropout):
            node.rngs, node.deterministic = None, True
        elif isinstance(node, AttentionModule) and hasattr(node, "deterministic"):
            node._init_dropout(None)
    return module


def check_loaded(module: nnx.Module) -> None:
    """RuntimeError naming each variable of ``module`` that ``build_to_load`` left a shape."""
    leaves = jax.tree_util.tree_leaves_with_path(nnx.state(module))
    if shapes := [jax.tree_util.keystr(path) for path, v in leaves if isinstance(v, jax.ShapeDtypeStruct)]:
        raise RuntimeError(f"variables left without values after loading: {shapes}")


def param_paths(
    node: Any, path: Path = (), seen: frozenset = frozenset()
) -> Iterator[tuple[Path, nnx.Param]]:
    """``(path, parameter)`` for every path under ``node`` that reaches a parameter: a shared one
    (``m.W_key = m.W_query``) once per path, where ``nnx.iter_graph`` gives its first path only."""
    seen = seen | {id(node)}  # a cycle is not followed
    for key, child in nnx.iter_children(node):
        if isinstance(child, nnx.Param):
            yield (*path, key), child
        elif not isinstance(child, nnx.Variable) and id(child) not in seen:
            yield from param_paths(child, (*path, key), seen)


class _Signature:
    """``inspect.signature`` (so ``help``) of a module class: its constructor's, which nnx's metaclass
    would hide behind ``(*args, **kwargs)``; of a module: its ``__call__``'s."""

    def __get__(self, module: Any, cls: type) -> inspect.Signature:
        method = inspect.signature(cls.__init__ if module is None else cls.__call__)
        return method.replace(parameters=list(method.parameters.values())[1:])  # without self


class TorchWeights(nnx.Module):
    """A module whose weights go in and out in the weights format (torch's names, layout, order).
    A subclass defines ``_format()`` (torch name -> shape), ``_without_buffers(params)`` (a
    ``state_dict()``'s weights) and ``_check_load(weights, variables)``."""

    __signature__ = _Signature()

    def _variables(self) -> Variables:
        """Each format name's ``(path, parameter)``, in path order: tied weights under each of their
        names; an alias attribute's paths (no name of the format) left out. ValueError for a
        parameter under no name of the format, or a name with no parameter."""
        names = self._format()
        found = [(torch_name(path), path, param) for path, param in param_paths(self)]
        named = {name: (path, param) for name, path, param in found if name in names}
        kept, cls = {id(param) for _, param in named.values()}, type(self).__name__
        if extra := sorted(name for name, _, param in found if id(param) not in kept):
            raise ValueError(f"{cls} has parameters that its weights format has no name for: {extra}")
        if missing := [name for name in names if name not in named]:
            raise ValueError(f"{cls} has no parameters for {missing} of its weights format")
        return named

    def torch_params(self) -> dict[str, jax.Array]:
        """The weights as JAX arrays in the weights format: torch name -> array in torch's layout."""
        return self._in_torch_layout(lambda param: param[...])

    def _in_torch_layout(self, read: Callable[[nnx.Param], Any]) -> dict[str, Any]:
        """Torch name -> ``read(parameter)`` in torch's layout, in the weights format's order."""
        variables = self._variables()
        return {name: torch_value(variables[name][0], read(variables[name][1])) for name in self._format()}

    def stored_params(self) -> tuple[dict[str, jax.Array], frozenset[str]]:
        """The weights as the module holds them, under their torch names, with no copy, and the names
        held transposed from torch's layout (the Linear kernels, ``(in, out)``). ``jax_attn.generate``
        transposes them inside its compiled program, where XLA folds each transpose into its product
        (``torch_params()``, eager, copies every kernel)."""
        stored, transposed = {}, set()
        for name, (path, param) in self._variables().items():
            stored[name] = param[...]
            if LAYOUT.get(path[-1], (None, False))[1]:
                transposed.add(name)
        return stored, frozenset(transposed)

    def to_params(self) -> dict[str, np.ndarray]:
        """The weights as NumPy arrays in the weights format: torch name -> array in torch's layout,
        read-only and C-contiguous (transposed in NumPy: a JAX array's transpose compiles a program
        for each shape)."""
        params = {
            name: np.ascontiguousarray(value)
            for name, value in self._in_torch_layout(lambda param: np.asarray(param[...])).items()
        }
        for value in params.values():
            value.flags.writeable = False
        return params

    def load_params(self, params: Mapping[str, Any]) -> Self:
        """Copy the weights-format ``params`` (NumPy, JAX or torch arrays; a ``state_dict()`` as it
        is, buffers ignored) in, cast to the module's dtype, in place; returns the module.

        Nothing is written unless they pass ``_check_load`` (one error naming every missing,
        unexpected and mis-shaped key, then one floating dtype, then finite values), stay finite in
        the module's dtype (1e5 into float16: torch_ref's ValueError) and tied weights are equal.
        """
        weights = readable_weights(self._without_buffers(params))
        variables = self._variables()
        self._check_load(weights, variables)
        dtypes = {name: param.get_value().dtype for name, (_, param) in variables.items()}
        finite.check_cast_finite(weights, dtypes)
        first: dict[int, str] = {}  # parameter -> its first name
        for name, (_, param) in variables.items():
            other = first.setdefault(id(param), name)
            tied = [as_jax(weights[key]).astype(dtypes[name]) for key in (other, name) if other != name]
            if tied and not jnp.array_equal(*tied):
                raise ValueError(
                    f"params[{other!r}] and params[{name!r}] share one variable in this module (tied "
                    "weights) but differ: give them equal values"
                )
        for name, (path, param) in variables.items():
            if first[id(param)] != name:
                continue
            # transposed before as_jax: a NumPy array's (or a tensor's) transpose is a view, where
            # a JAX array's compiles a program for each shape
            value = as_jax(to_flax(path, weights[name])).astype(dtypes[name])
            if isinstance(param.get_value(), jax.ShapeDtypeStruct):  # a shape that build_to_load left
                param.set_value(value)
            else:
                param[...] = value  # in place: the array's placement (sharding) kept
        return self


class AttentionModule(TorchWeights):
    """Base of the attention modules: ``layer`` names the torch class and its ``LayerSpec``.

    Dropout follows ``nnx.Dropout``: ``.train()``/``.eval()`` switch ``deterministic``; masks come
    from the module's fork of its ``rngs``' ``dropout`` stream; a call's ``deterministic`` and
    ``rngs`` override them. A call with ``return_steps=True`` returns ``(output, steps)`` (the
    spec's step names) and, inside ``nnx.capture`` only, sows them as ``nnx.Intermediate``.
    """

    layer: ClassVar[str]  # the torch class's name
    num_heads: int = 1

    def _init_layer(self, given: Mapping[str, Any]) -> None:
        """Check a constructor's arguments (``given``: its ``locals()``) as the layer function does,
        the spec telling which are bias flags, dropout rates and sizes; keep them as attributes."""
        spec, rngs = SPECS[self.layer], given["rngs"]
        arguments = {name: given[name] for name in spec.constructor}
        check_rngs(rngs)
        kinds = {w.flag: checks.check_flag for w in spec.weights if w.flag}
        kinds |= dict.fromkeys(spec.dropouts, checks.check_dropout)
        for name, value in arguments.items():  # each argument is a bias flag, a dropout rate or a size
            kinds.get(name, checks.check_size)(name, value)
        check_sizes(spec, arguments)
        one = {**arguments, "num_heads": 1} if spec.heads else arguments  # a stack's weights: one head's
        check_weights_to_draw(given["dtype"], spec.shapes(**one), self.layer, spec.count(**arguments))
        check_implementation(given["implementation"], given["block_size"])
        for name in (*spec.constructor, "implementation", "block_size"):
            setattr(self, name, given[name])
        if spec.dropouts:
            self._init_dropout(rngs)

    def _init_dropout(self, rngs: nnx.Rngs | None) -> None:
        self.deterministic = rngs is None
        self.rngs = None if rngs is None else rngs["dropout"].fork()

    @classmethod
    def from_params(cls, params: Mapping[str, Any], /, **arguments: Any) -> Self:
        """A module holding ``params`` (NumPy, JAX or torch arrays; a ``state_dict()`` as it is).

        Args: ``arguments``, the constructor's by name: the sizes and bias flags are read from the
            weights; the others passed on, the torch class's defaults filling the rest (``dropout``
            0); ``dtype`` the weights' by default (float64 only with x64); with ``rngs``, train mode,
            without, built as shapes (``build_to_load``) in eval mode with no dropout stream.
        Returns: the module, loaded by ``load_params``.
        Raises what ``numpy_attn.constructor_arguments``, the constructor and ``load_params`` raise.
        """
        options, rngs = (
            {name: arguments.pop(name) for name in OPTIONS if name in arguments},
            arguments.pop("rngs", None),
        )
        weights = readable_weights(without_buffers(cls.layer, params))
        arguments = constructor_arguments(cls.layer, weights, **arguments)
        shapes = SPECS[cls.layer].shapes(**arguments)
        first = next(iter(shapes))
        if "dtype" in options:
            _one_dtype(weights, shapes, jax_attn.FRAMEWORK.check_dtype(options["dtype"]))
        else:  # the weights', float64 only with x64 (as the functions' x)
            options["dtype"] = _one_dtype(weights, shapes, jnp.float32)
            jax_attn.FRAMEWORK.check_float64(f"params[{first!r}]", weights[first])
        module = build_to_load(lambda rngs: cls(**arguments, **options, rngs=rngs), rngs)
        check_loaded(module.load_params(weights))
        return module

    def _format(self) -> dict[str, tuple[int, ...]]:
        spec = SPECS[self.layer]
        return spec.shapes(**{name: getattr(self, name) for name in spec.constructor})

    def _without_buffers(self, params: Mapping[str, Any]) -> dict[str, Any]:
        return without_buffers(self.layer, params)

    def _check_load(self, weights: Mapping[str, Any], variables: Variables) -> None:
        """The layer function's checks of its weights: keys and shapes, one dtype (the function's
        TypeError for an x of the module's dtype), finite values."""
        shapes = self._format()
        checks.check_params(weights, shapes, layer=self.layer)
        _one_dtype(weights, shapes, variables[next(iter(shapes))][1].get_value().dtype)
        finite.check_finite(weights)

    def _check_call(self, x: Any, return_steps: bool, **masks: Any) -> jax.Array:
        """The layer function's checks of a call, word for word: ``return_steps`` a bool; ``x`` a
        floating array of the layer's layout, as wide as the input weight and of its dtype (float64
        only with x64), T within the context; the masks' shapes (the door's ``check_masks``)."""
        checks.check_flag("return_steps", return_steps)
        spec, name, weight = SPECS[self.layer], next(iter(self._format())), self  # the input weight
        for part in flax_path(name):
            weight = weight[part] if isinstance(part, int) else getattr(weight, part)
        weight = weight[...]  # (D, ...)
        shape = checks.check_input(
            x, layout=spec.input_layout, d_in=weight.shape[0], floating=checks.JAX_FLOATS
        )
        jax_attn.FRAMEWORK.check_float64("x", x)
        checks.check_param_dtypes({name: weight}, [name], x.dtype, "x")
        if spec.context is not None:
            checks.check_context_length(shape, getattr(self, spec.context), spec.context)
        check_masks(spec, shape, self.num_heads, masks)
        return jnp.asarray(x)

    def _dropout_rngs(self, deterministic: bool | None, rngs: Rngs) -> Rngs:
        """The stream this call's dropout masks come from, as ``nnx.Dropout`` decides; None in eval mode."""
        check_rngs(rngs, call=True)
        if deterministic is not None:
            checks.check_flag("deterministic", deterministic)  # "no" would mean yes
        if self.deterministic if deterministic is None else deterministic:
            return None
        if rngs is None and self.rngs is None:
            raise ValueError(
                f"{type(self).__name__} is in train mode but has no dropout stream: "
                "build it with rngs=nnx.Rngs(...) or call .eval()"
            )
        return self.rngs if rngs is None else rngs

    def _dropout_key(self, deterministic: bool | None, rngs: Rngs) -> jax.Array | None:
        """A fresh key from ``_dropout_rngs``' stream; None in eval mode."""
        stream = self._dropout_rngs(deterministic, rngs)
        return None if stream is None else stream.dropout() if isinstance(stream, nnx.Rngs) else stream()

    def _attend(
        self, queries: jax.Array, keys: jax.Array, values: jax.Array, masking: Masking | None = None,
        dropout: AttnDropout | None = None, *, num_heads: int | None = None, return_steps: bool = False,
    ) -> tuple[jax.Array, Steps]:  # fmt: skip
        """``(context_vec (..., T, E), steps)``: the attention core on the module's compute path over
        the projections ``(..., T, E)`` (split into ``num_heads`` heads and merged back if given);
        the steps from ``queries`` to ``context_vec`` with ``return_steps``, else none."""
        heads = (lambda a: a) if num_heads is None else (lambda a: split_heads(a, num_heads))  # (B, N, T, H)
        context_vec, steps = attend(
            jax_attn.FRAMEWORK, heads(queries), heads(keys), heads(values), masking or Masking(),
            dropout or AttnDropout(), ComputePath(self.implementation, self.block_size), return_steps,
        )  # fmt: skip
        if num_heads is not None:
            context_vec = merge_heads(context_vec)  # (B, T, E)
        if return_steps:
            steps = Steps(queries=queries, keys=keys, values=values, **steps, context_vec=context_vec)
        return context_vec, steps

    def _finish(self, output: jax.Array, steps: Steps, return_steps: bool, sown: Steps | None = None) -> Any:
        """``output``, or ``(output, steps + output)``, sown inside ``nnx.capture`` (the one place
        Flax sows); ``sown``: steps that submodules sowed, listed first."""
        if not return_steps:
            return output
        steps = Steps(**steps, output=output)
        if hasattr(self, "__captures__"):
            for name, value in steps.items():
                self.sow(nnx.Intermediate, name, value)
        return output, Steps(**(sown or {}), **steps)


def _one_dtype(weights: Mapping[str, Any], shapes: Mapping[str, Any], default: Any) -> np.dtype:
    """The weights' one dtype: the first's if floating, else ``default``; for another, the layer
    function's TypeError (a weight named against x's dtype)."""
    first = np.dtype(weights[next(iter(shapes))].dtype)
    dtype = first if first.name in checks.JAX_FLOATS else np.dtype(default)
    checks.check_param_dtypes(weights, shapes, dtype, "x")
    return dtype
