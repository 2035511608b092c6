"""A weight mapping from a torch model (or its ``state_dict``) onto a JAX port's weights, for the
user to confirm: an NNX module, a JAX or NumPy pytree (nested dicts and lists of arrays), a Flax
linen variables tree; or from GPT-2 onto a torch GPT with the book's names (``book_weights``).

Every torch tensor is first put in the ``x @ W`` layout a JAX port computes with: ``nn.Linear``
weights (``(out, in)``) transposed, GPT-2's ``Conv1D`` weights (already ``(in, out)``) and
embeddings as they are; a fused query|key|value projection (``in_proj_weight``, GPT-2's
``c_attn``, ``qkv``) is also offered as its three thirds. Each target weight, in definition order,
then takes the unused tensor that fits it best: one of the same role (kernel, embedding, scale,
bias) and the same layer index (``h.3`` for ``blocks.3`` or ``layers_3``), the most alike by name
(``ln_1`` for ``ln_1``, ``c_attn`` for ``qkv``), the first in the model's order on ties; reshaped
where the target splits heads (``LinearGeneral``/``DenseGeneral``: ``(in, heads, head_dim)``),
transposed back where a target kernel is kept in torch's ``(out, in)`` (a ``weight`` of that shape).
A fused target kernel takes three consecutive separate ones, concatenated. Tied copies (GPT-2's
``lm_head``) and buffers are not weights to map.
"""

from __future__ import annotations

import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from typing import Any

import numpy as np

from parity_tests.locate.book_weights import book_rows, gpt2_arrays

__all__ = ["WeightMap", "map_weights"]

_ALIASES = {  # name tokens that mean the same thing in torch and JAX code
    **dict.fromkeys(("weight", "w", "kernel", "scale", "g", "gamma"), "w"),
    **dict.fromkeys(("bias", "b", "beta"), "b"),
    **dict.fromkeys(("wte", "tokens", "token", "tok", "embed_tokens"), "wte"),
    **dict.fromkeys(("wpe", "positions", "position", "pos"), "wpe"),
    **dict.fromkeys(("ln", "norm", "layernorm", "layer_norm"), "norm"),
    **dict.fromkeys(("attn", "attention", "self_attn", "att"), "attn"),
    **dict.fromkeys(("mlp", "ffn", "ff", "feed_forward"), "mlp"),
    **dict.fromkeys(("c_attn", "qkv", "in_proj", "wqkv"), "qkv"),
    **dict.fromkeys(("c_proj", "out", "out_proj", "o_proj", "proj", "wo"), "proj"),
    **dict.fromkeys(("c_fc", "fc1", "up", "fc", "w1"), "up"),
    **dict.fromkeys(("q", "query", "w_query", "q_proj"), "q"),
    **dict.fromkeys(("k", "key", "w_key", "k_proj"), "k"),
    **dict.fromkeys(("v", "value", "w_value", "v_proj"), "v"),
}
_BIASES = ("bias", "b", "beta")
_EMBEDDINGS = ("wte", "wpe", "embedding", "embed", "tokens", "positions", "embeddings", "tok_emb", "pos_emb")
_FUSED = ("in_proj_weight", "in_proj_bias", "c_attn", "qkv", "wqkv")


@dataclass(frozen=True)
class _Tensor:
    """A torch tensor as offered: ``array`` in the ``x @ W`` layout, ``how`` it got there, its
    ``role``, its layer ``index`` and name ``tokens``; ``fused`` the whole tensor's name for a
    third of a fused one (``c_attn.weight[q]``)."""

    name: str
    array: np.ndarray
    how: str
    role: str
    index: tuple[int, ...]
    tokens: frozenset[str]
    fused: str | None = None
    torch_layout: bool = False  # a Linear weight: its transpose is torch's own layout


@dataclass(frozen=True)
class WeightMap:
    """``rows``: ``(target path, torch name, how)``; ``values``: the target path's new value."""

    rows: tuple[tuple[str, str, str], ...]
    values: dict[str, np.ndarray]
    target: str = "NNX"

    def __str__(self) -> str:
        width = max(len(r[0]) for r in self.rows)
        return "\n".join(f"{path:<{width}}  <-  {name}  ({how})" for path, name, how in self.rows)

    def __rich__(self) -> Any:
        from rich.table import Table

        table = Table(title=f"torch -> {self.target} weight mapping: please confirm", title_justify="left")
        for column in (f"{self.target} parameter", "torch tensor", "how"):
            table.add_column(column)
        for row in self.rows:
            table.add_row(*row)
        return table

    def apply(self, target: Any) -> Any:
        """The mapped values in ``target``: an NNX module's parameters are written (the module is
        returned), and a torch module's (returned); a pytree comes back as a new pytree of the same
        structure, each leaf of its leaf's array type and dtype."""
        if _is_torch(target):
            import torch

            with torch.no_grad():
                for path, param in target.named_parameters():
                    param.copy_(torch.from_numpy(self.values[path]))
            return target
        if _is_nnx(target):
            params = dict(_nnx_params(target))
            for path, value in self.values.items():
                params[path][...] = value
            return target
        return _replaced(target, self.values, "")


def _is_nnx(value: Any) -> bool:
    import sys

    nnx = sys.modules.get("flax.nnx")
    return nnx is not None and isinstance(value, nnx.Module)


def _is_torch(value: Any) -> bool:
    import sys

    torch = sys.modules.get("torch")
    return torch is not None and isinstance(value, torch.nn.Module)


def _nnx_params(module: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, Param)`` in definition order (attribute assignment order, depth first)."""
    from flax import nnx

    for name, value in vars(module).items():
        path = f"{prefix}{name}"
        if isinstance(value, nnx.Param):
            yield path, value
        elif isinstance(value, nnx.Module):
            yield from _nnx_params(value, f"{path}.")


def _pytree_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(path, array)`` of a nested mapping, list or tuple, in its own order."""
    items = (
        tree.items()
        if isinstance(tree, Mapping)
        else enumerate(tree)
        if isinstance(tree, (list, tuple))
        else None
    )
    if items is None:
        if hasattr(tree, "shape") and hasattr(tree, "dtype"):
            yield prefix, tree
        return
    for key, value in items:
        yield from _pytree_leaves(value, f"{prefix}.{key}" if prefix else str(key))


def _replaced(tree: Any, values: dict[str, np.ndarray], prefix: str) -> Any:
    if isinstance(tree, Mapping):
        return {k: _replaced(v, values, f"{prefix}.{k}" if prefix else str(k)) for k, v in tree.items()}
    if isinstance(tree, (list, tuple)):
        return type(tree)(
            _replaced(v, values, f"{prefix}.{i}" if prefix else str(i)) for i, v in enumerate(tree)
        )
    if prefix not in values:
        return tree
    value = values[prefix].astype(np.asarray(tree).dtype)
    if type(tree).__module__.split(".")[0] in ("jax", "jaxlib"):
        import jax.numpy as jnp

        return jnp.asarray(value)
    return value


def _tokens(path: str) -> frozenset[str]:
    tokens = set()
    for part in re.split(r"[.\[\]]+", path.lower()):
        if not part or part.isdigit():
            continue
        tokens.add(_ALIASES.get(part, part))
        tokens.update(_ALIASES.get(p, p) for p in part.split("_") if p)
    return frozenset(tokens)


def _indices(path: str, indexed: frozenset[str] = frozenset()) -> tuple[int, ...]:
    """The layer indices of a path: its integer parts (``h.3``), and the ``_3`` of its parts among
    ``indexed`` (linen's ``layers_3``)."""
    found = []
    for part in path.split("."):
        if part.isdigit():
            found.append(int(part))
        elif part in indexed:
            found.append(int(part.rsplit("_", 1)[1]))
    return tuple(found)


def _role(path: str, ndim: int, embedding: bool = False) -> str:
    """``bias``, ``scale`` (a norm's), ``embedding`` or ``kernel``, by name first (a bias reshaped
    to ``(heads, head_dim)`` is a bias), then by rank."""
    parts = re.sub(r"\[.*\]$", "", path.lower()).split(".")
    if parts[-1] in _BIASES or parts[-1].endswith("_bias"):
        return "bias"
    if ndim == 1 or parts[-1] in ("scale", "g", "gamma"):
        return "scale"
    if embedding or any(p in _EMBEDDINGS for p in parts[-2:]):
        return "embedding"
    return "kernel"


def _torch_tensors(state: Any) -> list[_Tensor]:
    """The tensors of a torch module (its layers' kinds known: ``Linear``, ``Conv1D``,
    ``Embedding``; buffers and tied copies left out) or of a ``state_dict`` (2-D weights taken for
    ``nn.Linear``'s, but embeddings by name), each in the ``x @ W`` layout, fused ones also split."""
    kinds: dict[str, str] = {}
    if hasattr(state, "named_modules"):
        for prefix, module in state.named_modules():
            kind = type(module).__name__
            for name, _ in module.named_parameters(recurse=False):
                kinds[f"{prefix}.{name}" if prefix else name] = kind
        items, seen = [], set()
        for name, tensor in state.named_parameters():  # each tied tensor once, no buffers
            if id(tensor) not in seen:
                seen.add(id(tensor))
                items.append((name, tensor))
    else:
        items = list(state.items())
    tensors = []
    for name, value in items:
        array = np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        kind = kinds.get(name, "")
        embedding = kind == "Embedding" or (not kinds and _role(name, array.ndim) == "embedding")
        role = _role(name, array.ndim, embedding)
        torch_layout = array.ndim == 2 and role == "kernel" and kind != "Conv1D"
        how = "transposed" if torch_layout else "as is"
        if torch_layout:
            array = array.T
        tensor = _Tensor(name, array, how, role, _indices(name), _tokens(name), torch_layout=torch_layout)
        tensors.append(tensor)
        fused = any(part in _FUSED for part in name.lower().split(".")) and array.shape[-1] % 3 == 0
        if fused and (array.ndim == 1 or array.shape[-1] == 3 * array.shape[0]):
            for part, chunk in zip("qkv", np.split(array, 3, axis=-1), strict=True):
                tokens = tensor.tokens - {"qkv"} | {part}
                third = _Tensor(f"{name}[{part}]", chunk, how, role, tensor.index, tokens, name, torch_layout)
                tensors.append(third)
    return tensors


def _fit(tensor: _Tensor, path: str, shape: tuple[int, ...]) -> tuple[np.ndarray, str] | None:
    """``tensor`` laid out as a target of ``shape`` (named ``path``), and how; None when it does not fit."""
    array, how = tensor.array, tensor.how
    if array.size != int(np.prod(shape)):
        return None
    torch_named = path.lower().split(".")[-1] == "weight"
    if tensor.torch_layout and torch_named and array.T.shape == shape:  # kept as torch keeps it
        return array.T, "as is"
    if array.shape == shape:
        return array, how
    if array.ndim == 2 and array.T.shape == shape and tensor.role == "kernel":
        return array.T, "as is" if tensor.torch_layout else "transposed"
    if array.ndim == 1 or shape[:1] == array.shape[:1] or shape[-1:] == array.shape[-1:]:
        reshaped = f"reshaped to {shape}"
        return array.reshape(shape), reshaped if how == "as is" else f"{how}, {reshaped}"
    return None


def _targets(target: Any) -> tuple[list[tuple[str, tuple[int, ...], Any]], str]:
    """``(path, shape, dtype)`` of every weight of ``target`` in definition order, and its kind."""
    if _is_nnx(target):
        return [(p, tuple(v.shape), np.asarray(v[...]).dtype) for p, v in _nnx_params(target)], "NNX"
    leaves = [(p, tuple(v.shape), np.asarray(v).dtype) for p, v in _pytree_leaves(target)]
    kind = "linen" if isinstance(target, Mapping) and set(target) >= {"params"} else "pytree"
    return leaves, kind


def _indexed_parts(paths: list[str]) -> frozenset[str]:
    """The ``name_N`` parts of ``paths`` that are layer indices: siblings ``name_0``, ``name_1``...
    that hold weights of their own below them (a linen ``layers_0``, not a ``ln_1`` layer)."""
    found: dict[tuple[str, str], set[str]] = {}
    for path in paths:
        parts = path.split(".")
        for depth, part in enumerate(parts[:-2]):
            match = re.fullmatch(r"(.*[A-Za-z])_(\d+)", part)
            if match:
                found.setdefault((".".join(parts[:depth]), match.group(1)), set()).add(part)
    return frozenset(part for parts in found.values() if len(parts) > 1 for part in parts)


def map_weights(state: Any, target: Any) -> WeightMap:
    """Map ``state`` (a torch module, such as a Hugging Face ``GPT2LMHeadModel``, or a ``state_dict``
    or the project's weights format) onto ``target``'s weights (an NNX module, a pytree, a linen
    variables tree; or, for GPT-2's weights, a torch GPT with the book's names, ``book_weights``);
    print the result to confirm it, ``apply`` it to get the weights in.
    ValueError naming a target weight no tensor fits, or the tensors left over."""
    if _is_torch(target):
        return _onto_torch(state, target)
    tensors = _torch_tensors(state)
    leaves, kind = _targets(target)
    indexed = _indexed_parts([p for p, _, _ in leaves])
    used: set[str] = set()
    rows, values = [], {}
    what = "NNX parameter" if kind == "NNX" else f"{kind} weight"
    for path, shape, dtype in leaves:
        role, index, tokens = _role(path, len(shape)), _indices(path, indexed), _tokens(path)
        best = None
        for order, tensor in enumerate(tensors):
            if (
                _taken(tensor, used, tensors)
                or tensor.role != role
                or (index and tensor.index and index != tensor.index)
            ):
                continue
            fitted = _fit(tensor, path, shape)
            if fitted is not None:
                score = len(tokens & tensor.tokens) + (index == tensor.index)
                if best is None or score > best[0]:
                    best = (score, order, tensor, fitted)
        if best is None:
            best = _concatenated(tensors, used, path, shape, role, index)
        if best is None:
            raise ValueError(f"map_weights: no torch tensor left fits {what} {path} of shape {shape}")
        _, _, tensor, (value, how) = best
        used.add(tensor.name)
        values[path] = value.astype(dtype)
        rows.append((path, tensor.name, how))
    left = [
        t.name
        for t in tensors
        if not _taken(t, used, tensors) and t.fused is None and not t.name.endswith("mask")
    ]
    if left:
        raise ValueError(f"map_weights: torch tensors left unmapped: {', '.join(left)}")
    return WeightMap(tuple(rows), values, kind)


def _taken(tensor: _Tensor, used: set[str], tensors: list[_Tensor]) -> bool:
    """Whether ``tensor`` is used: itself, its whole fused tensor, or (a whole one) any third of it."""
    if tensor.name in used or (tensor.fused is not None and tensor.fused in used):
        return True
    return any(t.fused == tensor.name and t.name in used for t in tensors)


def _concatenated(
    tensors: list[_Tensor], used: set[str], path: str, shape: tuple[int, ...], role: str, index
):
    """Three consecutive unused tensors of the role concatenated along their last axis (separate
    query, key and value weights for a fused target), as a candidate like ``map_weights``'; None
    when none fit."""
    free = [t for t in tensors if t.fused is None and not _taken(t, used, tensors) and t.role == role]
    free = [t for t in free if not (index and t.index and index != t.index)]
    for start in range(len(free) - 2):
        three = free[start : start + 3]
        if len({t.array.shape for t in three}) != 1:
            continue
        whole = np.concatenate([t.array for t in three], axis=-1)
        joined = _Tensor(
            "|".join(t.name for t in three), whole, three[0].how, role, three[0].index, frozenset()
        )
        fitted = _fit(joined, path, shape)
        if fitted is not None:
            used.update(t.name for t in three)
            return (0, start, joined, (fitted[0], f"concatenated, {fitted[1]}"))
    return None


def _onto_torch(state: Any, target: Any) -> WeightMap:
    """GPT-2's weights onto a torch module with the book's names, in the module's order."""
    found, values = book_rows(gpt2_arrays(state))
    rows = {row[0]: row for row in found}
    params = dict(target.named_parameters())
    for path, param in params.items():
        if path not in values or values[path].shape != tuple(param.shape):
            raise ValueError(
                f"map_weights: no torch tensor left fits torch parameter {path} of shape {tuple(param.shape)}"
            )
    left = list(dict.fromkeys(row[1] for row in found if row[0] not in params))
    if left:
        raise ValueError(f"map_weights: torch tensors left unmapped: {', '.join(left)}")
    dtypes = {path: str(param.dtype).removeprefix("torch.") for path, param in params.items()}
    mapped = {path: values[path].astype(dtypes[path]) for path in params}
    return WeightMap(tuple(rows[path] for path in params), mapped, "torch")
