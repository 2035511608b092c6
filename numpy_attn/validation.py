"""Input validation shared by numpy_attn and jax_attn.

Every check looks at shapes, dtypes and Python numbers only, so it runs the same way on NumPy
arrays, JAX arrays and JAX tracers (under ``jax.jit`` shapes and dtypes are static, so the checks
run once, at trace time). Both packages call these functions, which is what makes their error
types and messages identical. Values (non-finite weights) are checked by ``check_finite`` only
where they are concrete.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np

__all__ = [
    "JAX_FLOATS",
    "MAX_ELEMENTS",
    "MAX_POSITION",
    "NUMPY_FLOATS",
    "QKV",
    "check_array",
    "check_array_kind",
    "check_array_size",
    "check_attend_options",
    "check_attention_shapes",
    "check_axis",
    "check_blockwise_args",
    "check_cache_room",
    "check_cast_finite",
    "check_causal_lengths",
    "check_causal_mask_args",
    "check_context_length",
    "check_count",
    "check_decode_room",
    "check_divisible",
    "check_dropout",
    "check_dtype_argument",
    "check_finite",
    "check_flag",
    "check_floating",
    "check_input",
    "check_keep_mask",
    "check_kv_cache",
    "check_kv_cache_sizes",
    "check_linear_shapes",
    "check_mapping",
    "check_mask_operands",
    "check_native_byte_order",
    "check_numpy_dtype",
    "check_operands",
    "check_padding_mask",
    "check_param_dtypes",
    "check_params",
    "check_parts",
    "check_qkv_pair",
    "check_qkv_params",
    "check_rng",
    "check_scores_mask",
    "check_self_attention_args",
    "check_size",
    "padding_batch",
]

# The three projections of the notes' attention layers (``nn.Linear`` modules), by their names
QKV = ("W_query", "W_key", "W_value")
# The dtypes NumPy computes in. JAX adds bfloat16 (NumPy has no bfloat16 arithmetic: ml_dtypes'
# bfloat16 matmul returns float32).
NUMPY_FLOATS = ("float16", "float32", "float64")
JAX_FLOATS = ("bfloat16", *NUMPY_FLOATS)
# how every refusal of a non-floating dtype names the accepted ones: one text in both packages
FLOATS_ACCEPTED = "float16, float32, float64; bfloat16 in jax_attn"
# dtype -> name for NumPy's floats: ``dtype.name`` costs microseconds, a dict lookup a tenth
_FLOAT_NAMES = {np.dtype(name): name for name in NUMPY_FLOATS}
# The most elements an array that a function builds from sizes may have. XLA computes an array's
# byte count as an int64 and, when it overflows, aborts the whole process ("overflow in static
# extent product": no exception, SIGABRT); its intermediates of 8-byte elements (int64
# positions, random bits) overflow from 2**60 elements, and NumPy refuses arrays past 2**63
# bytes. (2**63 - 1) // 16 = 2**59 - 1 keeps 16-byte elements within int64, and no machine holds
# such an array (512 PiB at one byte an element), so no size that could run is refused.
MAX_ELEMENTS = (2**63 - 1) // 16
# The largest position (a query's offset + t, a key's index) a causal mask computes with: jax_attn
# computes positions in int32 (JAX's ints without 64-bit mode), so past it a sum would wrap.
MAX_POSITION = 2**31 - 1


def check_blockwise_args(
    *,
    num_queries: int,
    num_keys: int,
    causal: bool,
    block_size: Any,
    dropout: Any,
    attn_keep_mask: Any,
    keep_shape: tuple[int, ...],
) -> None:
    """The arguments of a blockwise core that no layer check has seen on a direct call. Causal
    blocks are skipped by their index, which needs as many queries as keys."""
    check_flag("causal", causal)
    if causal:
        check_causal_lengths(num_queries, num_keys)
    check_size("block_size", block_size)
    if dropout is not None:
        check_dropout("dropout", dropout)
    if attn_keep_mask is not None:
        check_keep_mask("attn_keep_mask", attn_keep_mask, keep_shape)


def check_causal_lengths(num_queries: int, num_keys: int) -> None:
    """Causal attention is self-attention: query t sees keys 0..t, which needs as many queries as
    keys (T = S); ValueError naming both otherwise, on every path (``attend``'s and the blockwise
    functions'), pointing to ``causal_mask(T, S, offset)`` for queries at other positions."""
    if num_queries != num_keys:
        raise ValueError(
            f"causal attention needs T = S (self-attention), got T={num_queries}, S={num_keys}; for "
            "queries at other positions pass causal_mask(T, S, offset) to scaled_dot_product_attention"
        )


def check_self_attention_args(
    x: Any, weight: Any, bias: Any, *, num_heads: Any, padding_mask: Any, floating: tuple[str, ...]
) -> None:
    """``blockwise_self_attention``'s input ``(B, T, D)``, stacked ``(3E, D)`` QKV weight,
    ``(3E,)`` bias or None, ``num_heads`` dividing E and ``(B, T)`` padding mask: the shapes. The
    arrays' dtypes (one floating dtype, the machine's byte order) are ``check_operands``'."""
    shape = check_input(x, layout="(B, T, D)", floating=floating)
    weight_shape = check_array("weight", weight)
    if len(weight_shape) != 2 or weight_shape[1] != shape[-1]:
        raise ValueError(
            f"weight must have shape (3E, D) with D={shape[-1]} (x has shape {shape}), "
            f"got shape {weight_shape}"
        )
    check_divisible("weight rows (3E)", weight_shape[0], num_heads)
    if weight_shape[0] % (3 * num_heads) != 0:
        raise ValueError(
            f"weight must stack 3 projections of num_heads={num_heads} equal heads, got shape {weight_shape}"
        )
    if bias is not None and check_array("bias", bias) != weight_shape[:1]:
        raise ValueError(
            f"bias must have shape ({weight_shape[0]},) for weight of shape {weight_shape}, "
            f"got shape {check_array('bias', bias)}"
        )
    if padding_mask is not None:
        check_padding_mask(padding_mask, shape[0], shape[1])


def _shape(value: Any) -> tuple[int, ...] | None:
    shape = getattr(value, "shape", None)
    return None if shape is None else tuple(shape)


def check_array(name: str, value: Any) -> tuple[int, ...]:
    """Return ``value.shape``; raise TypeError if ``value`` is not an array, or is one of the
    NumPy subclasses that compute otherwise (``check_array_kind``). Only the shape is read:
    weights of any framework (a torch ``state_dict()``) pass; ``check_numpy_dtype`` is for
    values that NumPy or JAX compute with."""
    if type(value) is np.ndarray:  # the common case, in one test
        return value.shape
    shape = _shape(value)
    if shape is None or not hasattr(value, "dtype"):
        raise TypeError(f"{name} must be an array, got {type(value).__name__}")
    check_array_kind(name, value)
    return shape


# NumPy subclasses refused as arrays, with how to pass their data: a matrix's ``*`` is a matrix
# product and its results stay 2-D; a masked array's mask would be ignored (JAX reads the data).
_REFUSED_SUBCLASSES = (
    (np.matrix, "numpy.matrix (always 2-D, * a matrix product)", "np.asarray({name})"),
    (np.ma.MaskedArray, "numpy.ma.MaskedArray, whose mask would be ignored", "{name}.filled(value)"),
)


def check_array_kind(name: str, value: Any) -> None:
    """TypeError for an ``np.matrix`` or an ``np.ma.MaskedArray`` (subclasses too) named
    ``name``, saying what to pass instead: NumPy would compute matrix algebra or ignore the mask
    where JAX computes on the data. Other ndarray subclasses behave as ndarrays and pass."""
    for kind, label, instead in _REFUSED_SUBCLASSES:
        if isinstance(value, kind):
            raise TypeError(f"{name} must be an array, got {label}: pass {instead.format(name=name)}")


def check_numpy_dtype(name: str, value: Any) -> None:
    """TypeError unless NumPy understands ``value.dtype``: a torch tensor (or another framework's
    array) is refused with how to convert it, instead of NumPy's "Cannot interpret" error."""
    try:
        np.dtype(value.dtype)
    except TypeError:
        kind = f"{type(value).__module__}.{type(value).__qualname__}"
        raise TypeError(
            f"{name} is a {kind} with dtype {value.dtype}, which NumPy cannot read: pass a NumPy or "
            f"JAX array (a torch tensor t: t.detach().cpu().numpy(), bfloat16 after .float(); "
            "a torch module's weights: torch_ref.to_params(module))"
        ) from None


def check_native_byte_order(name: str, value: Any) -> None:
    """TypeError for a big-endian NumPy array: its dtype would compare unequal to the machine's
    own (``>f4`` is not ``float32``) and JAX cannot read it. Other arrays pass."""
    if isinstance(value, np.ndarray) and value.dtype.byteorder == ">":
        raise TypeError(
            f"{name} has dtype {value.dtype.str}, big-endian; give it in the machine's byte order: "
            f".astype(np.{value.dtype.name})"
        )


def check_floating(x: Any, floating: tuple[str, ...] = NUMPY_FLOATS, name: str = "x") -> tuple[int, ...]:
    """Return ``x.shape``; TypeError unless ``x`` is an array in the machine's byte order with a
    dtype in ``floating``. The message names the dtypes both packages accept, whatever
    ``floating`` is, so that its text is the same in numpy_attn and jax_attn."""
    shape = check_array(name, x)
    check_numpy_dtype(name, x)
    check_native_byte_order(name, x)
    dtype = np.dtype(x.dtype)
    if (_FLOAT_NAMES.get(dtype) or dtype.name) not in floating:
        raise TypeError(
            f"{name} must have a floating dtype ({FLOATS_ACCEPTED}), "
            f"got {np.dtype(x.dtype).name} with shape {shape}"
        )
    return shape


def check_operands(floating: tuple[str, ...], /, *, optional: tuple[str, ...] = (), **arrays: Any) -> None:
    """A building block's array arguments, by name, the first one required: each a floating
    array NumPy can read in the machine's byte order (``check_floating``; None is refused as any
    other non-array, except for the names in ``optional``, a bias not given), all of the first
    one's dtype: otherwise a TypeError naming the first that differs and the first (``keys has
    dtype float16 but queries has dtype float32``), as the layers name a weight."""
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
    """TypeError unless each mask given (by name; None: not given) is an array NumPy can read (a
    torch tensor is refused with how to convert it). Their shapes and dtypes are checked where
    they are used."""
    for name, mask in masks.items():
        if mask is not None:
            check_array(name, mask)
            check_numpy_dtype(name, mask)


def check_attend_options(
    masking: Any, dropout: Any, path: Any, *, batch: int, num_queries: int, num_keys: int
) -> None:
    """``attend``'s and ``attend_heads``' ``Masking``, ``AttnDropout`` and ``ComputePath``, for
    ``batch`` sequences of ``num_queries`` queries and ``num_keys`` keys: ``causal`` a bool, and
    with causal T = S, on every path (ValueError: causal attention is self-attention, query t
    sees keys 0..t. The blockwise path cuts its blocks on that diagonal and cannot do otherwise;
    for T != S the reference path's top-left (T, S) corner is one alignment of several, a KV
    cache's new queries need the bottom rows, so ``"auto"`` accepted or refused one call by its
    length. No layer or decode path attends causally with T != S: the decode functions build
    their mask at the cache's offset, as ``causal_mask(T, S, offset)`` does for
    ``scaled_dot_product_attention``); the padding mask, if any, bool ``(B, S)``
    (``check_padding_mask``, whatever the implementation); the keep-mask an array NumPy can
    read (its shape is checked where it is used); the rate, if any, in [0, 1) (named
    ``dropout.rate``); ``path.fused_qkv`` a bool; the implementation and block size
    ``check_implementation``'s."""
    # here, not at the top: numpy_attn.implementation imports this module
    from numpy_attn.implementation import check_implementation

    check_flag("causal", masking.causal)
    if masking.causal:
        check_causal_lengths(num_queries, num_keys)
    if masking.padding_mask is not None:
        check_padding_mask(masking.padding_mask, batch, num_keys)
    check_mask_operands(attn_keep_mask=dropout.keep_mask)
    if dropout.rate is not None:
        check_dropout("dropout.rate", dropout.rate)
    check_flag("path.fused_qkv", path.fused_qkv)
    check_implementation(path.implementation, path.block_size)


def padding_batch(queries_shape: Sequence[int]) -> int:
    """The B of the ``(B, S)`` padding mask of ``(..., T, H)`` queries: their first axis (1 for
    ``(T, H)`` queries), on every path."""
    return queries_shape[0] if len(queries_shape) > 2 else 1


def check_flag(name: str, value: Any) -> None:
    """A yes/no argument (``causal``, ``qkv_bias``, ``bias``...): a bool (a NumPy bool too);
    TypeError naming ``name`` otherwise, where any truthy value (the string ``"no"``, 1) would
    have meant yes."""
    if not isinstance(value, (bool, np.bool_)):
        raise TypeError(f"{name} must be a bool, got {value!r} ({type(value).__name__})")


def check_scores_mask(mask: Any, queries: Any, keys: Any) -> None:
    """``scaled_dot_product_attention``'s mask: None, or a bool array (True = hidden) NumPy can
    read that broadcasts to the scores' shape ``(..., T, S)``: TypeError for a non-array,
    ValueError naming the shapes for another dtype (a float mask, where Flax's 1 means attend,
    would hide every key) or a shape that does not broadcast to the scores'."""
    if mask is None:
        return
    shape = check_array("mask", mask)
    check_numpy_dtype("mask", mask)
    leading = np.broadcast_shapes(tuple(queries.shape[:-2]), tuple(keys.shape[:-2]))
    scores_shape = (*leading, queries.shape[-2], keys.shape[-2])
    fits = len(shape) <= len(scores_shape) and all(
        n in (1, m) for n, m in zip(shape[::-1], scores_shape[::-1], strict=False)
    )
    if np.dtype(mask.dtype) != np.bool_ or not fits:
        raise ValueError(
            f"mask must be a bool array broadcastable to the scores' shape (..., T, S) = {scores_shape}, "
            f"got {np.dtype(mask.dtype).name} array of shape {shape}"
        )


def check_qkv_pair(qkv: Any) -> None:
    """``attend_heads``' ``qkv``: a ``(weight, bias)`` pair (a tuple or a list; bias None for
    none), TypeError otherwise. The arrays are ``check_operands``'."""
    pair = isinstance(qkv, (tuple, list))
    if not pair or len(qkv) != 2:
        got = f"{type(qkv).__name__} of length {len(qkv)}" if pair else type(qkv).__name__
        raise TypeError(f"qkv must be a (weight, bias) pair, bias None for none, got {got}")


def check_linear_shapes(x: Any, weight: Any, bias: Any, weight_name: str = "weight") -> None:
    """``linear``'s ``(..., D)`` input, ``(out_features, D)`` weight (torch's layout; named
    ``weight_name``) and ``(out_features,)`` bias or None: a ValueError naming the shapes
    otherwise (NumPy would raise its own matmul error, JAX would broadcast a width of 1)."""
    x_shape, weight_shape = tuple(x.shape), tuple(weight.shape)
    if len(x_shape) < 1 or len(weight_shape) != 2 or weight_shape[1] != x_shape[-1]:
        width = x_shape[-1] if x_shape else None
        raise ValueError(
            f"{weight_name} must have shape (out_features, in_features) with in_features={width} "
            f"(x has shape {x_shape}), got shape {weight_shape}"
        )
    if bias is not None and tuple(bias.shape) != weight_shape[:1]:
        raise ValueError(
            f"bias must have shape ({weight_shape[0]},) for weight of shape {weight_shape}, "
            f"got shape {tuple(bias.shape)}"
        )


def check_qkv_params(params: Any, function: str) -> dict[str, Any]:
    """``qkv_projections``' and ``qkv_weights``' ``params`` (``function``, as messages name it):
    a mapping of str (``check_mapping``) holding ``W_query.weight``, ``W_key.weight`` and
    ``W_value.weight``, and the three biases or none (otherwise the biases given would be
    ignored or half used): one ValueError naming the missing keys, as ``check_params`` does for
    a layer. Each an array (``check_array``), the weights of one ``(E, D)`` shape and the biases
    ``(E,)``: one ValueError naming every mis-shaped key. Other keys (a bigger layer's weights)
    are ignored. Returns the weights and biases by the names that messages give them
    (``params['W_query.weight']``), for the caller's ``check_operands``."""
    check_mapping(params)
    weights, biases = ([f"{name}.{kind}" for name in QKV] for kind in ("weight", "bias"))
    given = [key for key in biases if key in params]
    keys = weights + biases if given else weights
    missing = [key for key in keys if key not in params]
    if missing:
        some = given and given != biases  # a bias of some projections only
        partial = f" (biases for the three projections or none, got {given})" if some else ""
        raise ValueError(f"params do not fit {function}: missing keys {missing}{partial}")
    shapes = {key: check_array(f"params[{key!r}]", params[key]) for key in keys}
    query = shapes[weights[0]]
    if len(query) != 2:
        expected = {weights[0]: "(E, D)"}
    else:
        expected = dict.fromkeys(weights, query) | dict.fromkeys(given, query[:1])
    misshaped = [
        f"{key!r} has shape {shapes[key]}, expected {want}"
        for key, want in expected.items()
        if shapes[key] != want
    ]
    if misshaped:
        raise ValueError(f"params do not fit {function}: mis-shaped keys: " + "; ".join(misshaped))
    return {f"params[{key!r}]": params[key] for key in keys}


def check_attention_shapes(queries: Any, keys: Any, values: Any) -> None:
    """Queries ``(..., T, H)``, keys ``(..., S, H)`` and values ``(..., S, Hv)`` whose leading
    axes ``...`` broadcast together, H at least 1: a ValueError naming the shapes otherwise (JAX
    would broadcast a head size or a key count of 1; NumPy and JAX raised their own broadcast
    errors, and H = 0 gave NaN or a ZeroDivisionError)."""
    q_shape, k_shape, v_shape = tuple(queries.shape), tuple(keys.shape), tuple(values.shape)
    for name, shape, layout in (
        ("queries", q_shape, "(..., T, H)"),
        ("keys", k_shape, "(..., S, H)"),
        ("values", v_shape, "(..., S, Hv)"),
    ):
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
    if q_shape[-1] == 0:  # the scores' scale 1 / sqrt(H) would divide by zero
        raise ValueError(f"queries must have a head size H of at least 1, got shape {q_shape}")
    leading = q_shape[:-2]
    for name, shape in (("keys", k_shape), ("values", v_shape)):
        if shape[:-2] == leading:
            continue
        try:
            leading = np.broadcast_shapes(leading, shape[:-2])
        except ValueError:
            raise ValueError(
                f"{name} must have leading axes that broadcast with {leading} (queries have shape "
                f"{q_shape}), got shape {shape}"
            ) from None


def check_mapping(params: Any) -> None:
    """TypeError unless ``params`` is a mapping (the weights format: name -> array) whose keys
    are str (the first other one named: JAX cannot sort mixed keys into a pytree)."""
    if not isinstance(params, Mapping):
        raise TypeError(f"params must be a mapping of str to arrays, got {type(params).__name__}")
    for key in params:
        if not isinstance(key, str):
            raise TypeError(
                f"params must be a mapping of str to arrays, got key {key!r} ({type(key).__name__})"
            )


def check_input(
    x: Any,
    *,
    layout: str,
    d_in: int | None = None,
    name: str = "x",
    floating: tuple[str, ...] = NUMPY_FLOATS,
) -> tuple[int, ...]:
    """Check a layer input against ``layout`` (e.g. ``"(B, T, D)"``) and the weights' width.

    Raises TypeError for a dtype not in ``floating``, ValueError for a wrong rank, an empty axis
    or a feature width other than ``d_in``. Returns the shape.
    """
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
    """The reference classes slice a (context_length, context_length) mask: T may not exceed it,
    nor, for a KV-cache decode (``cached``: the tokens its cache holds), may ``cached + T``."""
    num_tokens = shape[-2]
    if cached + num_tokens > context_length:
        after = f" after the cache's {cached}, {cached + num_tokens} in all," if cached else ""
        raise ValueError(
            f"x has {num_tokens} tokens (shape {tuple(shape)}){after} but {name} is {context_length}"
        )


def check_rng(rng: Any) -> None:
    """``rng`` is None (no random dropout) or a ``numpy.random.Generator``."""
    if rng is not None and not isinstance(rng, np.random.Generator):
        raise TypeError(
            f"rng must be a numpy.random.Generator (numpy.random.default_rng(seed)) or None, "
            f"got {rng!r} ({type(rng).__name__})"
        )


def check_divisible(width_name: str, width: int, num_heads: int, *, heads_name: str = "num_heads") -> None:
    """``width`` cut into ``num_heads`` equal heads (``heads_name``: the head count's name where
    it has another, config.json's ``n_head``)."""
    check_size(heads_name, num_heads)
    if width % num_heads != 0:
        raise ValueError(f"{width_name}={width} is not divisible by {heads_name}={num_heads}")


def check_parts(weight_shape: tuple[int, ...], parts: Any) -> None:
    """``split_projection``'s weight, ``(parts * E, D)``: its rows cut into ``parts`` equal parts."""
    check_size("parts", parts)
    if weight_shape[0] % parts:
        raise ValueError(f"weight of shape {weight_shape} does not cut into parts={parts!r} equal row blocks")


def _check_int(name: str, value: Any, low: int, what: str) -> None:
    """``value`` must be an int (a NumPy int too) of at least ``low``, ``what`` in the messages:
    TypeError naming ``name`` for another type (a bool, a float, NaN, inf, None, a str),
    ValueError for an int below ``low``."""
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise TypeError(f"{name} must be {what}, got {value!r} ({type(value).__name__})")
    if value < low:
        raise ValueError(f"{name} must be {what}, got {value!r}")


def check_size(name: str, value: Any) -> None:
    """A size (``d_in``, ``num_heads``, ``context_length``, ``block_size``...): a positive int, a
    NumPy int too; TypeError naming ``name`` for another type (a bool, a float, NaN, inf, None),
    ValueError for an int below 1. The one rule of every size in both packages."""
    _check_int(name, value, 1, "a positive int")


def check_count(name: str, value: Any) -> None:
    """A count that may be 0 (``max_new_tokens``, ``parallel_heads``' ``min_scores``): a
    non-negative int, a NumPy int too; TypeError naming ``name`` for another type, ValueError
    for a negative int (``check_size``'s rule, from 0)."""
    _check_int(name, value, 0, "a non-negative integer")


def check_array_size(what: str, shape: Sequence[int]) -> None:
    """An array about to be built from sizes already checked (positive ints): ValueError naming
    ``what`` and its shape if it would have more than ``MAX_ELEMENTS`` elements, before NumPy or
    JAX allocates (where XLA would abort the process, NumPy raise its own error)."""
    shape = tuple(int(size) for size in shape)  # Python ints: a NumPy int product would wrap
    count = math.prod(shape)
    if count > MAX_ELEMENTS:
        raise ValueError(
            f"{what} of shape {shape} would have {count} elements, more than an array may hold "
            f"({MAX_ELEMENTS} = 2**59 - 1)"
        )


def check_dtype_argument(dtype: Any, floating: tuple[str, ...]) -> np.dtype:
    """A constructor's ``dtype`` argument: one of ``floating`` in the machine's byte order,
    returned as a NumPy dtype; TypeError otherwise, named as an array's dtype is
    (``check_floating``), before any weight is drawn in it."""
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
    """Dropout probabilities lie in [0, 1): p = 1 would divide by zero when rescaling. The
    comparison is exact (``float(p)`` overflows for a huge int); an int beyond 64 bits is named
    by its size (Python refuses to print one of over 4300 digits)."""
    if isinstance(p, bool) or not isinstance(p, (int, float, np.floating, np.integer)):
        raise TypeError(f"{name} must be a float in [0, 1), got {type(p).__name__}")
    if not 0.0 <= p < 1.0:
        huge = isinstance(p, int) and p.bit_length() > 64
        raise ValueError(f"{name} must be in [0, 1), got {f'an int of {p.bit_length()} bits' if huge else p}")


def _check_bool_mask(name: str, mask: Any, expected: tuple[int, ...], what: str) -> None:
    shape = check_array(name, mask)
    check_numpy_dtype(name, mask)
    if np.dtype(mask.dtype) != np.bool_ or shape != expected:
        raise ValueError(
            f"{name} must be a bool array of shape {what} = {expected}, "
            f"got {np.dtype(mask.dtype).name} array of shape {shape}"
        )


def check_keep_mask(name: str, mask: Any, expected: tuple[int, ...]) -> None:
    """A dropout keep-mask: bool, True = keep (and rescale), exactly the dropped array's shape."""
    _check_bool_mask(name, mask, tuple(expected), "the dropped array's shape")


def check_padding_mask(mask: Any, batch: int, num_keys: int) -> None:
    """The notes' padding mask: bool ``(B, S)``, True = padding (hidden)."""
    _check_bool_mask("padding_mask", mask, (batch, num_keys), "(B, S)")


def check_params(
    params: Mapping[str, Any],
    expected: Mapping[str, tuple[int, ...]],
    *,
    layer: str,
    dtype: Any | None = None,
    dtype_of: str = "x",
) -> None:
    """Check that ``params`` holds exactly the ``expected`` keys with the expected shapes.

    One ValueError names every missing, unexpected and mis-shaped key at once. With ``dtype``,
    every weight must have that dtype, that of ``dtype_of`` (the input, or the model's first
    weight), TypeError otherwise (``check_param_dtypes``): so that the input and the weights
    never silently promote to another precision.
    """
    check_mapping(params)
    missing = [k for k in expected if k not in params]
    unexpected = sorted(k for k in params if k not in expected)
    misshaped = []
    for key, want in expected.items():
        if key in params:
            got = check_array(f"params[{key!r}]", params[key])
            if got != tuple(want):
                misshaped.append(f"{key!r} has shape {got}, expected {tuple(want)}")
    problems = []
    if missing:
        problems.append(f"missing keys {missing}")
    if unexpected:
        problems.append(f"unexpected keys {unexpected}")
    if misshaped:
        problems.append("mis-shaped keys: " + "; ".join(misshaped))
    if problems:
        raise ValueError(f"params do not fit {layer}: " + "; ".join(problems))
    if dtype is not None:
        check_param_dtypes(params, expected, dtype, dtype_of)


def check_param_dtypes(params: Mapping[str, Any], names: Iterable[str], dtype: Any, dtype_of: str) -> None:
    """Each of the weights ``names`` (arrays, as ``check_params`` found them) readable by NumPy, in
    the machine's byte order and of ``dtype``, that of ``dtype_of``: TypeError naming the first
    that is not."""
    for key in names:
        check_numpy_dtype(f"params[{key!r}]", params[key])
        check_native_byte_order(f"params[{key!r}]", params[key])
        got = np.dtype(params[key].dtype)
        if got != np.dtype(dtype):
            raise TypeError(
                f"params[{key!r}] has dtype {got.name} but {dtype_of} has dtype {np.dtype(dtype).name}"
            )


def check_finite(params: Mapping[str, Any]) -> None:
    """Reject NaN or infinite weights (called where the values are concrete), naming the first
    such key. Small weights (a layer's, up to ``_JOINED_ELEMENTS`` values in all) are tested in
    one pass, flattened into one array whose finite entries are counted (a per-key test costs
    microseconds apiece, much of a small call); larger ones key by key, ``_FINITE_CHUNK`` values
    at a time, so that no copy of the weights is made (a 4 GiB file loads in 4 GiB, not 9)."""
    flat = [np.asarray(value).ravel() for value in params.values()]  # views of contiguous arrays
    if sum(map(len, flat)) <= _JOINED_ELEMENTS:
        joined = np.concatenate(flat or [np.empty(0)])
        if np.count_nonzero(np.isfinite(joined)) == joined.size:
            return
    for key, values in zip(params, flat, strict=True):
        if not _all_finite(values):
            raise ValueError(f"params[{key!r}] has non-finite values (NaN or inf)")


_JOINED_ELEMENTS = 1 << 16
_FINITE_CHUNK = 1 << 20


def _all_finite(flat: np.ndarray) -> bool:
    """Whether every entry of the 1-D ``flat`` is finite, ``_FINITE_CHUNK`` entries at a time."""
    return all(
        np.isfinite(flat[start : start + _FINITE_CHUNK]).all() for start in range(0, flat.size, _FINITE_CHUNK)
    )


def check_kv_cache_sizes(batch: Any, num_heads: Any, max_length: Any, head_dim: Any) -> None:
    """``init_kv_cache``'s sizes: positive ints (NumPy ints too, bools refused); ``max_length``,
    each with ``check_size``'s errors; keys and values of at most ``MAX_ELEMENTS`` elements."""
    check_size("batch", batch)
    check_size("num_heads", num_heads)
    check_size("max_length", max_length)
    check_size("head_dim", head_dim)
    check_array_size(
        "the cache's keys (batch, num_heads, max_length, head_dim)", (batch, num_heads, max_length, head_dim)
    )


def check_kv_cache(
    cache: Any,
    cache_type: type,
    array_type: type | tuple[type, ...],
    x: Any,
    num_heads: int,
    head_dim: int,
    name: str = "cache",
    x_name: str = "x",
) -> None:
    """A decode function's ``cache``: the ``KVCache`` of its own package's ``init_kv_cache(...)``
    (``cache_type``, whose arrays are ``array_type``; another package's cache is refused with a
    TypeError naming both), with keys and values ``(B, N, L, H)`` and padding ``(B, L)`` matching
    x's batch ``B``, ``num_heads`` ``N`` and the layer's ``head_dim`` ``H`` (ValueError naming
    the shapes otherwise), keys and values in the machine's byte order and in x's dtype (that of
    the weights too, once ``check_params`` has run: another one would round them silently;
    TypeError), a bool padding and a ``length`` that is an int or a 0-d integer array
    (TypeError; its value is ``check_cache_room``'s). The messages call the cache ``name`` and x
    ``x_name`` (the GPT's decode: ``caches[i]`` and the blocks' input)."""
    package = cache_type.__module__.split(".")[0]
    if type(cache) is not cache_type or not all(
        isinstance(field, array_type) for field in (cache.keys, cache.values, cache.padding)
    ):
        given = type(cache)
        raise TypeError(
            f"{name} must be the KVCache of {package}.init_kv_cache(...), "
            f"got {given.__module__}.{given.__qualname__}"
        )
    batch = x.shape[0]
    for field in ("keys", "values"):
        shape = tuple(getattr(cache, field).shape)
        if len(shape) != 4 or shape[:2] != (batch, num_heads) or shape[3] != head_dim:
            raise ValueError(
                f"{name}.{field} has shape {shape}, but {x_name} of shape {tuple(x.shape)} with "
                f"num_heads={num_heads} needs (B, N, L, H) = ({batch}, {num_heads}, L, {head_dim})"
            )
    expected = (batch, cache.keys.shape[2])
    if tuple(cache.padding.shape) != expected or tuple(cache.values.shape) != tuple(cache.keys.shape):
        raise ValueError(
            f"{name}.padding has shape {tuple(cache.padding.shape)} and {name}.values "
            f"{tuple(cache.values.shape)}, but {name}.keys {tuple(cache.keys.shape)} needs "
            f"{expected} and {tuple(cache.keys.shape)}"
        )
    for field in ("keys", "values"):
        stored = getattr(cache, field)
        check_native_byte_order(f"{name}.{field}", stored)
        if np.dtype(stored.dtype) != np.dtype(x.dtype):
            raise TypeError(
                f"{name} has dtype {np.dtype(stored.dtype).name} but {x_name} has dtype "
                f"{np.dtype(x.dtype).name}"
            )
    padding = np.dtype(cache.padding.dtype)
    if padding != np.bool_:
        raise TypeError(f"{name}.padding must be bool (True = padding), got {padding.name}")
    length = cache.length
    if not _is_int_scalar(length, array_type):
        raise TypeError(
            f"{name}.length must be an int or a 0-d integer array (the tokens cached so far), "
            f"got {length!r} ({type(length).__name__})"
        )


def check_cache_room(length: int | None, max_length: int, num_tokens: int, name: str = "cache") -> None:
    """A cache (``name``) of ``max_length`` tokens holding ``length`` (None where it is not
    concrete: under jax.jit the caller keeps within the cache) has room for ``num_tokens`` more:
    ValueError naming the numbers otherwise, or for a length outside [0, max_length]."""
    if length is None:
        return
    if not 0 <= length <= max_length:
        raise ValueError(f"{name}.length is {length}, outside [0, {max_length}]: not a cache's length")
    if length + num_tokens > max_length:
        raise ValueError(f"{name} holds {length} of {max_length} tokens; {num_tokens} more do not fit")


def check_decode_room(
    length: int | None,
    max_length: int,
    shape: Sequence[int],
    context_length: int,
    context_name: str = "context_length",
    name: str = "cache",
) -> None:
    """A layer's decode of x of ``shape`` (B, t, D) into a cache (``name``; the GPT's decode
    names its block's, ``caches[i]``) of ``max_length`` tokens holding ``length`` (None where
    it is not concrete: under jax.jit the caller keeps within the cache and the context): room
    for t more in the cache (``check_cache_room``), and ``length + t`` within the layer's
    ``context_length`` (named ``context_name``; ``check_context_length``'s error: the full
    causal pass refuses that many tokens). ValueError otherwise."""
    if length is None:
        return
    check_cache_room(length, max_length, shape[-2], name)
    check_context_length(shape, context_length, context_name, cached=length)


def check_causal_mask_args(
    num_queries: Any, num_keys: Any, offset: Any, array_offsets: type | tuple[type, ...] = ()
) -> None:
    """``causal_mask``'s arguments: the sizes positive ints (NumPy ints too, bools refused;
    ``num_keys`` may be None), with ``check_size``'s errors; ``offset`` an int of either sign
    (a negative one puts the queries before the first key, as a blockwise tile does), or a 0-d
    integer array of ``array_offsets`` (jax_attn: a KV cache's length, traced under jit); the
    mask of at most ``MAX_ELEMENTS`` elements. An offset whose value is known (not traced) must
    keep every position within ``MAX_POSITION``, ``|offset| + max(num_queries, num_keys) <=
    2**31 - 1`` (jax_attn computes positions in int32; past it NumPy's or JAX's sums wrap
    silently): ValueError naming the bound otherwise, in both packages, so that every offset
    accepted gives one mask. An offset that far from the keys hides every key or none:
    ``-num_queries`` and ``num_keys`` give those masks."""
    check_size("num_queries", num_queries)
    if num_keys is not None:
        check_size("num_keys", num_keys)
    shape = (num_queries, num_queries if num_keys is None else num_keys)
    check_array_size("the mask (num_queries, num_keys)", shape)
    if not _is_int_scalar(offset, array_offsets):
        raise TypeError(f"offset must be an int, got {offset!r} ({type(offset).__name__})")
    try:
        value = operator.index(offset)
    except TypeError:  # a traced offset (jax_attn under jit): int32, its range the caller's
        return
    sizes = tuple(int(size) for size in shape)  # Python ints: a NumPy int sum would wrap
    if abs(value) + max(sizes) > MAX_POSITION:
        given = f"an int of {value.bit_length()} bits" if value.bit_length() > 64 else value
        raise ValueError(
            "offset must satisfy |offset| + max(num_queries, num_keys) <= 2**31 - 1 (positions are "
            f"int32 in jax_attn), got offset={given} with (num_queries, num_keys) = {sizes}"
        )


def _is_int_scalar(value: Any, array_types: type | tuple[type, ...]) -> bool:
    """An int (a NumPy int too, not a bool) or a 0-d integer array of ``array_types`` (jax_attn: a
    cache length or offset, traced under jit)."""
    if isinstance(value, array_types) and value.shape == () and np.issubdtype(value.dtype, np.integer):
        return True
    return isinstance(value, (int, np.integer)) and not isinstance(value, bool)


def check_axis(shape: tuple[int, ...], axis: Any, name: str = "x") -> None:
    """``axis`` of the array ``name`` of ``shape``: an int (NumPy ints too, bools refused:
    TypeError) within ``-ndim <= axis < ndim`` (ValueError naming the shape and the axis; a 0-d
    array has no axis)."""
    if isinstance(axis, bool) or not isinstance(axis, (int, np.integer)):
        raise TypeError(f"axis must be an int, got {axis!r} ({type(axis).__name__})")
    if not -len(shape) <= axis < len(shape):
        raise ValueError(f"axis {axis} is out of bounds for {name} of shape {tuple(shape)}")


def check_cast_finite(params: Mapping[str, Any], dtypes: Mapping[str, Any]) -> None:
    """Reject finite weights that a cast to the module's dtypes (``dtypes``: key -> dtype of the
    variable the weight is copied into) would turn into inf: 1e300 into float32, 1e5 into
    float16. The ValueError names the first such key, the dtype and its largest finite value, in
    torch_ref's words (its ``load_params``). Call after ``check_finite``. A weight of its
    variable's dtype, or of a smaller float (float16 into float32), cannot overflow and is
    skipped; others are cast ``_FINITE_CHUNK`` values at a time (no copy of the weights)."""
    for key, value in params.items():
        flat, dtype = np.asarray(value).ravel(), np.dtype(dtypes[key])
        if flat.dtype == dtype or flat.dtype.itemsize < dtype.itemsize:
            continue
        with np.errstate(over="ignore"):  # the overflow is what is looked for
            fits = all(
                np.isfinite(flat[start : start + _FINITE_CHUNK].astype(dtype)).all()
                for start in range(0, flat.size, _FINITE_CHUNK)
            )
        if not fits:
            raise ValueError(
                f"params[{key!r}] has values too large for the module's dtype {dtype.name} "
                f"(largest finite {_largest_finite(dtype):.6g})"
            )


def _largest_finite(dtype: np.dtype) -> float:
    """The largest finite value of the IEEE float ``dtype`` (bfloat16 too, which ``np.finfo``
    does not know): the bits of inf less one."""
    inf_bits = np.array(np.inf, dtype).view(f"u{dtype.itemsize}")
    return float((inf_bits - 1).view(dtype))
