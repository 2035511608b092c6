"""The checks of bad input, shared by numpy_attn and jax_attn: one text for one mistake.

Each looks at types, shapes, dtypes and Python numbers, so it runs the same on NumPy arrays and JAX
tracers (``numpy_attn.finite`` checks the weights' values where they are known). TypeError for a
value of the wrong kind, ValueError for one out of range, naming the argument and the shapes.
"""

from __future__ import annotations

import operator
from collections.abc import Callable, Iterable, Mapping, Sequence
from typing import Any

import numpy as np

from numpy_attn.memory import check_array_size

# The dtypes NumPy computes in; JAX adds bfloat16 (NumPy has no bfloat16 arithmetic).
NUMPY_FLOATS = ("float16", "float32", "float64")
JAX_FLOATS = ("bfloat16", *NUMPY_FLOATS)
FLOATS_ACCEPTED = "float16, float32, float64; bfloat16 in jax_attn"  # one text in both packages
# The largest position a causal mask computes with: jax_attn's positions are int32.
MAX_POSITION = 2**31 - 1
INTS = (int, np.integer)
NUMBERS = (int, float, np.integer, np.floating)
_FLOAT_NAMES = {np.dtype(name): name for name in NUMPY_FLOATS}  # a dict lookup, not dtype.name's µs


def check_array(name: str, value: Any) -> tuple[int, ...]:
    """``value.shape``; TypeError for a non-array, an ``np.matrix`` or an ``np.ma.MaskedArray``."""
    if type(value) is np.ndarray:  # the common case, in one test
        return value.shape
    shape = getattr(value, "shape", None)
    if shape is None or not hasattr(value, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    for kind, label, instead in _REFUSED:  # NumPy subclasses that compute otherwise
        if isinstance(value, kind):
            raise TypeError(f"{name} must be an array, got {label}: pass {instead.format(name=name)}")
    return tuple(shape)


_REFUSED = (
    (np.matrix, "numpy.matrix (always 2-D, * a matrix product)", "np.asarray({name})"),
    (np.ma.MaskedArray, "numpy.ma.MaskedArray, whose mask would be ignored", "{name}.filled(value)"),
)


def check_numpy_dtype(name: str, value: Any) -> tuple[int, ...]:
    """``check_array``, then TypeError unless NumPy reads ``value.dtype``: a torch tensor is refused
    with how to convert it. Returns the shape."""
    shape = check_array(name, value)
    try:
        np.dtype(value.dtype)
    except TypeError:
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise TypeError(
            f"{name} is a {kind} with dtype {value.dtype}, which NumPy cannot read: pass a NumPy or "
            f"JAX array (a torch tensor t: t.detach().cpu().numpy(), bfloat16 after .float(); "
            "a torch module's weights: torch_ref.to_params(module))"
        ) from None
    return shape


def check_native_byte_order(name: str, value: Any) -> None:
    """TypeError for a big-endian NumPy array (``>f4`` is not ``float32``; JAX cannot read it)."""
    if isinstance(value, np.ndarray) and value.dtype.byteorder == ">":
        raise TypeError(
            f"{name} has dtype {value.dtype.str}, big-endian; give it in the machine's byte order: "
            f".astype(np.{value.dtype.name})"
        )


def check_floating(x: Any, floating: tuple[str, ...] = NUMPY_FLOATS, name: str = "x") -> tuple[int, ...]:
    """``x.shape``; TypeError unless ``x`` is an array in the machine's byte order with a dtype in
    ``floating`` (the message names what both packages accept)."""
    shape = check_numpy_dtype(name, x)
    check_native_byte_order(name, x)
    dtype = np.dtype(x.dtype)
    if (_FLOAT_NAMES.get(dtype) or dtype.name) not in floating:
        raise TypeError(
            f"{name} must have a floating dtype ({FLOATS_ACCEPTED}), got {dtype.name} with shape {shape}"
        )
    return shape


def check_operands(floating: tuple[str, ...], /, *, optional: tuple[str, ...] = (), **arrays: Any) -> None:
    """Floating arrays (``check_floating``), all of the first one's dtype (TypeError naming the first
    that differs); None only for the names in ``optional`` (a bias not given)."""
    first_name, first = next(iter(arrays.items()))
    for name, value in arrays.items():
        if value is None and name in optional:
            continue
        check_floating(value, floating, name)
        if np.dtype(value.dtype) != np.dtype(first.dtype):
            raise TypeError(
                f"{name} has dtype {np.dtype(value.dtype).name} but {first_name} has dtype "
                f"{np.dtype(first.dtype).name}"
            )


def check_mask_operands(**masks: Any) -> None:
    """Each mask given (None: not given) an array NumPy can read; shapes are checked where used."""
    for name, mask in ((name, mask) for name, mask in masks.items() if mask is not None):
        check_numpy_dtype(name, mask)


def check_flag(name: str, value: Any) -> None:
    """A yes/no argument: a bool (a NumPy bool too); TypeError otherwise ("no" would mean yes)."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def check_number(
    name: str, value: Any, what: str, ok: Callable[[Any], bool], kinds: tuple[type, ...] = NUMBERS
) -> None:
    """A number of ``kinds`` (TypeError for a bool or another type) for which ``ok`` holds (ValueError);
    both messages say it must be ``what``."""
    if isinstance(value, bool) or not isinstance(value, kinds):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    if not ok(value):
        raise ValueError(f"{name} must be {what}, got {value!r}")


def check_size(name: str, value: Any) -> None:
    """A size (``num_heads``, ``context_length``, ``block_size``...): a positive int (NumPy's too);
    TypeError for another type (a bool, a float, None), ValueError below 1."""
    check_number(name, value, "a positive int", lambda v: v >= 1, INTS)


def check_count(name: str, value: Any) -> None:
    """A count that may be 0 (``max_new_tokens``): ``check_size``'s rule from 0."""
    check_number(name, value, "a non-negative integer", lambda v: v >= 0, INTS)


def check_divisible(width_name: str, width: int, num_heads: int, *, heads_name: str = "num_heads") -> None:
    """``width`` cut into ``num_heads`` equal heads."""
    check_size(heads_name, num_heads)
    if width % num_heads != 0:
        raise ValueError(f"{width_name}={width} is not divisible by {heads_name}={num_heads}")


def check_dtype_argument(dtype: Any, floating: tuple[str, ...]) -> np.dtype:
    """A ``dtype`` argument: one of ``floating`` in the machine's byte order, as a NumPy dtype."""
    try:
        resolved = None if dtype is None else np.dtype(dtype)
    except TypeError:
        resolved = None
    if resolved is None:
        raise TypeError(f"dtype must be a floating dtype ({FLOATS_ACCEPTED}), got {dtype!r}")
    if resolved.byteorder == ">":
        raise TypeError(
            f"dtype is {resolved.str}, big-endian; give it in the machine's byte order: np.{resolved.name}"
        )
    if (_FLOAT_NAMES.get(resolved) or resolved.name) not in floating:
        raise TypeError(f"dtype must be a floating dtype ({FLOATS_ACCEPTED}), got {resolved.name}")
    return resolved


def check_dropout(name: str, p: Any) -> None:
    """A dropout probability in [0, 1) (p = 1 would divide by zero when rescaling), compared exactly."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__}")
    if not 0.0 <= p < 1.0:
        huge = isinstance(p, int) and p.bit_length() > 64  # Python prints no int of 4300 digits
        raise ValueError(f"{name} must be in [0, 1), got {f'an int of {p.bit_length()} bits' if huge else p}")


def _check_bool_mask(name: str, mask: Any, expected: tuple[int, ...], what: str) -> None:
    shape = check_numpy_dtype(name, mask)
    if np.dtype(mask.dtype) != np.bool_ or shape != expected:
        raise ValueError(
            f"{name} must be a bool array of shape {what} = {expected}, "
            f"got {np.dtype(mask.dtype).name} array of shape {shape}"
        )


def check_keep_mask(name: str, mask: Any, expected: tuple[int, ...]) -> None:
    """A dropout keep-mask: bool, True = keep, exactly the dropped array's shape."""
    _check_bool_mask(name, mask, tuple(expected), "the dropped array's shape")


def check_padding_mask(mask: Any, batch: int, num_keys: int) -> None:
    """The notes' padding mask: bool ``(B, S)``, True = padding (hidden)."""
    _check_bool_mask("padding_mask", mask, (batch, num_keys), "(B, S)")


def scores_shape(queries: Any, keys: Any) -> tuple[int, ...]:
    """The attention scores' shape ``(..., T, S)``: the queries' and keys' leading axes broadcast."""
    leading = np.broadcast_shapes(tuple(queries.shape[:-2]), tuple(keys.shape[:-2]))
    return (*leading, queries.shape[-2], keys.shape[-2])


def check_scores_mask(mask: Any, queries: Any, keys: Any) -> None:
    """An attention mask: None, or bool (True = hidden) broadcastable to the scores' ``(..., T, S)``
    (a float mask, where Flax's 1 means attend, would hide every key)."""
    if mask is None:
        return
    shape, scores = check_numpy_dtype("mask", mask), scores_shape(queries, keys)
    fits = len(shape) <= len(scores) and all(
        n in (1, m) for n, m in zip(shape[::-1], scores[::-1], strict=False)
    )
    if np.dtype(mask.dtype) != np.bool_ or not fits:
        raise ValueError(
            f"mask must be a bool array broadcastable to the scores' shape (..., T, S) = {scores}, "
            f"got {np.dtype(mask.dtype).name} array of shape {shape}"
        )


def check_linear_shapes(x: Any, weight: Any, bias: Any, weight_name: str = "weight") -> None:
    """``linear``'s ``(..., D)`` input, ``(F, D)`` weight (torch's layout) and ``(F,)`` bias or None."""
    x_shape, weight_shape = tuple(x.shape), tuple(weight.shape)
    if len(x_shape) < 1 or len(weight_shape) != 2 or weight_shape[1] != x_shape[-1]:
        width = x_shape[-1] if x_shape else None
        raise ValueError(
            f"{weight_name} must have shape (out_features, in_features) with in_features={width} "
            f"(x has shape {x_shape}), got shape {weight_shape}"
        )
    check_bias(bias, weight_shape)


def check_bias(bias: Any, weight_shape: tuple[int, ...]) -> None:
    """None, or a ``(F,)`` bias for an ``(F, D)`` weight."""
    if bias is not None and tuple(bias.shape) != weight_shape[:1]:
        raise ValueError(
            f"bias must have shape ({weight_shape[0]},) for weight of shape {weight_shape}, "
            f"got shape {tuple(bias.shape)}"
        )


def check_attention_shapes(queries: Any, keys: Any, values: Any) -> None:
    """Queries ``(..., T, H)``, keys ``(..., S, H)``, values ``(..., S, Hv)``, H >= 1, leading axes
    that broadcast together."""
    q_shape, k_shape, v_shape = tuple(queries.shape), tuple(keys.shape), tuple(values.shape)
    for name, shape, layout in (("queries", q_shape, "(..., T, H)"), ("keys", k_shape, "(..., S, H)"),
                                ("values", v_shape, "(..., S, Hv)")):  # fmt: skip
        if len(shape) < 2:
            raise ValueError(f"{name} must have shape {layout}, got shape {shape} (rank {len(shape)})")
    if k_shape[-1] != q_shape[-1]:
        raise ValueError(
            f"keys must have shape (..., S, H) with H={q_shape[-1]} (queries have shape {q_shape}), "
            f"got shape {k_shape}"
        )
    if v_shape[-2] != k_shape[-2]:
        raise ValueError(
            f"values must have shape (..., S, Hv) with S={k_shape[-2]} (keys have shape {k_shape}), "
            f"got shape {v_shape}"
        )
    if q_shape[-1] == 0:  # the scale 1 / sqrt(H) would divide by zero
        raise ValueError(f"queries must have a head size H of at least 1, got shape {q_shape}")
    leading = q_shape[:-2]
    for name, shape in (("keys", k_shape), ("values", v_shape)):
        try:
            leading = np.broadcast_shapes(leading, shape[:-2])
        except ValueError:
            raise ValueError(
                f"{name} must have leading axes that broadcast with {leading} (queries have shape "
                f"{q_shape}), got shape {shape}"
            ) from None


def check_mapping(params: Any) -> None:
    """TypeError unless ``params`` is a mapping whose keys are str (the weights format)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str to arrays, got {type(params).__name__}")
    for key in params:
        if not isinstance(key, str):
            raise TypeError(
                f"params must be a mapping of str to arrays, got key {key!r} ({type(key).__name__})"
            )


def check_input(
    x: Any, *, layout: str, d_in: int | None = None, name: str = "x", floating: tuple[str, ...] = NUMPY_FLOATS
) -> tuple[int, ...]:
    """A layer's input: floating (TypeError), of ``layout``'s rank (``"(B, T, D)"``), no empty axis,
    ``d_in`` features (ValueError). Returns its shape."""
    shape = check_floating(x, floating, name)
    rank = layout.count(",") + 1
    if len(shape) != rank:
        raise ValueError(f"{name} must have shape {layout}, got shape {shape} (rank {len(shape)})")
    if 0 in shape:
        raise ValueError(f"{name} must not have an empty axis, got shape {shape} for {layout}")
    if d_in is not None and shape[-1] != d_in:
        raise ValueError(
            f"{name} has {shape[-1]} features (shape {shape}) but the weights expect d_in={d_in}"
        )
    return shape


def check_context_length(
    shape: Sequence[int], context_length: int, name: str = "context_length", cached: int = 0
) -> None:
    """T (and the ``cached`` tokens of a KV cache before it) within the class's mask buffer."""
    num_tokens = shape[-2]
    if cached + num_tokens > context_length:
        after = f" after the cache's {cached}, {cached + num_tokens} in all," if cached else ""
        raise ValueError(
            f"x has {num_tokens} tokens (shape {tuple(shape)}){after} but {name} is {context_length}"
        )


def check_rng(rng: Any, name: str = "rng") -> None:
    """numpy_attn's random source: None (no random dropout) or a ``numpy.random.Generator``."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"{name} must be a numpy.random.Generator (numpy.random.default_rng(seed)) or None, "
            f"got {rng!r} ({type(rng).__name__})"
        )


def check_params(
    params: Mapping[str, Any], expected: Mapping[str, tuple[int, ...]], *, layer: str, dtype: Any = None,
    dtype_of: str = "x",
) -> None:  # fmt: skip
    """``params`` holds exactly the ``expected`` keys and shapes: one ValueError names every missing,
    unexpected and mis-shaped key. With ``dtype``, each weight of that dtype (``dtype_of``'s)."""
    check_mapping(params)
    missing = [k for k in expected if k not in params]
    unexpected = sorted(k for k in params if k not in expected)
    misshaped = [
        f"{key!r} has shape {got}, expected {tuple(want)}"
        for key, want in expected.items()
        if key in params and (got := check_array(f"params[{key!r}]", params[key])) != tuple(want)
    ]
    problems = [f"missing keys {missing}"] * bool(missing) + [f"unexpected keys {unexpected}"] * bool(
        unexpected
    )
    problems += ["mis-shaped keys: " + "; ".join(misshaped)] * bool(misshaped)
    if problems:
        raise ValueError(f"params do not fit {layer}: " + "; ".join(problems))
    if dtype is not None:
        check_param_dtypes(params, expected, dtype, dtype_of)


def check_param_dtypes(params: Mapping[str, Any], names: Iterable[str], dtype: Any, dtype_of: str) -> None:
    """Each weight of ``names`` readable, in the machine's byte order and of ``dtype`` (TypeError
    naming the first that is not), so that nothing promotes silently."""
    for key in names:
        check_numpy_dtype(f"params[{key!r}]", params[key])
        check_native_byte_order(f"params[{key!r}]", params[key])
        got = np.dtype(params[key].dtype)
        if got != np.dtype(dtype):
            raise TypeError(
                f"params[{key!r}] has dtype {got.name} but {dtype_of} has dtype {np.dtype(dtype).name}"
            )


def is_int_scalar(value: Any, array_types: type | tuple[type, ...] = ()) -> bool:
    """An int (NumPy's too, not a bool) or a 0-d integer array of ``array_types`` (a traced length)."""
    if isinstance(value, array_types) and value.shape == () and np.issubdtype(value.dtype, np.integer):
        return True
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_causal_mask_args(num_queries: Any, num_keys: Any, offset: Any, array_offsets: Any = ()) -> None:
    """``causal_mask``'s sizes (positive ints; ``num_keys`` may be None) and ``offset`` (an int of
    either sign, or a 0-d integer array of ``array_offsets``: a traced cache length), with
    ``|offset| + max(T, S) <= 2**31 - 1`` where known (positions are int32 in jax_attn)."""
    check_size("num_queries", num_queries)
    if num_keys is not None:
        check_size("num_keys", num_keys)
    shape = (num_queries, num_queries if num_keys is None else num_keys)
    check_array_size("the mask (num_queries, num_keys)", shape)
    if not is_int_scalar(offset, array_offsets):
        raise TypeError(f"offset must be an int, got {offset!r} ({type(offset).__name__})")
    try:
        value = operator.index(offset)
    except TypeError:  # a traced offset: int32, its range the caller's
        return
    sizes = tuple(int(size) for size in shape)  # Python ints: a NumPy int sum would wrap
    if abs(value) + max(sizes) > MAX_POSITION:
        given = f"an int of {value.bit_length()} bits" if value.bit_length() > 64 else value
        raise ValueError(
            "offset must satisfy |offset| + max(num_queries, num_keys) <= 2**31 - 1 (positions are "
            f"int32 in jax_attn), got offset={given} with (num_queries, num_keys) = {sizes}"
        )


def check_axis(shape: tuple[int, ...], axis: Any, name: str = "x") -> None:
    """``axis`` an int (TypeError) within ``-ndim <= axis < ndim`` (ValueError)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r} ({type(axis).__name__})")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of bounds for {name} of shape {tuple(shape)}")
