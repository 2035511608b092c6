"""Data- and tensor-parallel placement of the NNX modules on a ("data", "model") mesh, and the mesh
checks. Tensor parallelism as in Megatron-LM: the layers that open a block are split by their output
units over "model" (column parallel: each device computes its own heads or MLP hidden units), those
that close it by their input units (row parallel: an all-reduce sums the partial products); the rules
go by parameter path (the torch attributes' names), the rest is replicated, and the batch is split
over "data". Grouped-query attention (``Llama3Model``, ``Qwen3Model``) keeps whole key/value heads on
each device, and with them the query heads that share them. ``jax.jit`` inserts the collectives:
results equal the single-device ones up to float summation order."""

from __future__ import annotations

import re
from typing import Any

import jax
from flax import nnx
from jax.sharding import AbstractMesh, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from numpy_attn.checks import check_numpy_dtype

# parameter paths ("trf_blocks.0.att.W_query.kernel", ...) of the layers split over "model": the GPT's
# and the attention modules' (ff.layers.0 and 2: the GPT's MLP), and the Llama 3 and Qwen3 decoders'
# (ff.fc1 and fc2: SwiGLU's gate and up, ff.fc3: its down)
COLUMN_PARALLEL = re.compile(
    r"(^|\.)(W_query|W_key|W_value|Wqkv|ff\.layers\.0|ff\.fc1|ff\.fc2)(\.kernel|\.bias)?$"
)
ROW_PARALLEL = re.compile(r"(^|\.)(out_proj|Wo|ff\.layers\.2|ff\.fc3)\.kernel$")


def param_spec(
    path: str,
    shape: tuple[int, ...],
    mesh: Mesh,
    model_axis: str | None = "model",
    *,
    kv_heads: int | None = None,
) -> P:
    """Where the parameter at ``path`` lives on ``mesh``: the ``COLUMN_PARALLEL`` layers split their
    kernel's out axis and their bias over ``model_axis``, the ``ROW_PARALLEL`` layers their kernel's in
    axis; anything else (embeddings, norms, ``out_head``, the row parallel biases) is replicated.

    Args: path, the parameter's dotted path (``"trf_blocks.0.att.W_key.kernel"``), Flax's layout
        (kernels ``(in, out)``); shape, its shape; mesh, a ``Mesh`` or ``AbstractMesh``;
        model_axis, the mesh axis of tensor parallelism, or None (everything replicated); kv_heads,
        for a grouped-query attention's ``W_key`` and ``W_value`` its key/value heads
        (``n_kv_groups``, which ``shard_model`` reads off the module): split whole, so the size of
        ``model_axis`` must divide them.
    Returns: ``P(None, model_axis)``, ``P(model_axis)``, ``P(model_axis, None)`` or ``P()``.

    TypeError or ValueError for a mesh that is none, an axis not in it, key/value heads or a split
    dimension that do not divide by the axis size (naming the path and shape).
    """
    check_mesh(mesh)
    check_axis(mesh, "model_axis", model_axis)
    if model_axis is None:
        return P()
    if COLUMN_PARALLEL.search(path):
        split = len(shape) - 1  # kernel (in, out): out; bias (out,)
    elif ROW_PARALLEL.search(path):
        split = 0  # kernel (in, out): in
    else:
        return P()
    if kv_heads is not None:
        what = f"{path} of shape {shape}: n_kv_groups = {kv_heads} (its key/value heads)"
        check_divisible_by_axis(what, kv_heads, mesh, model_axis)
    what = f"{path} of shape {shape}: dimension {split} ({shape[split]})"
    check_divisible_by_axis(what, shape[split], mesh, model_axis)
    return P(*(model_axis if axis == split else None for axis in range(len(shape))))


def shard_model(
    model: nnx.Module, mesh: Mesh, *, data_axis: str | None = "data", model_axis: str | None = "model"
) -> nnx.Module:
    """Place ``model``'s variables on ``mesh``, in place: parameters as ``param_spec`` says, every
    other variable (dropout streams...) replicated. Then run the model under ``nnx.jit`` (or
    ``jax.jit`` of ``nnx.split``/``nnx.merge``) on a batch placed by ``shard_batch``.

    Args: model, an ``nnx.Module`` whose submodules carry the torch attributes' names (the
        attention modules, ``GPTModel``, ``Llama3Model``, ``Qwen3Model``); mesh, a ``Mesh`` of
        devices; data_axis (only checked here) and model_axis, the batch's and tensor parallelism's
        mesh axes, or None (not used).
    Returns: ``model`` itself.

    TypeError or ValueError, before anything is placed, naming the argument or the parameter
    (``param_spec``'s refusals) that does not fit.
    """
    if not isinstance(model, nnx.Module):
        raise TypeError(f"model must be an nnx.Module, got {type(model).__name__}")
    check_mesh(mesh)
    check_axis(mesh, "data_axis", data_axis)
    check_axis(mesh, "model_axis", model_axis)
    check_devices("shard_model", mesh)
    nodes = dict(nnx.iter_graph(model))
    specs = {}  # every split checked before any variable is placed
    for path, node in nodes.items():
        if isinstance(node, nnx.Param):
            kv_heads = _kv_heads(path, nodes)
            shape = node.get_value().shape
            specs[path] = param_spec(".".join(map(str, path)), shape, mesh, model_axis, kv_heads=kv_heads)
    for path, node in nodes.items():
        if isinstance(node, nnx.Variable):
            node.set_value(_place(node.get_value(), NamedSharding(mesh, specs.get(path, P()))))
    return model


def _kv_heads(path: tuple, nodes: dict[tuple, Any]) -> int | None:
    """The key/value heads (``num_kv_groups``) of the grouped-query attention whose ``W_key`` or
    ``W_value`` holds the parameter at ``path``; None for any other parameter."""
    if len(path) < 2 or path[-2] not in ("W_key", "W_value"):
        return None
    return getattr(nodes.get(path[:-2]), "num_kv_groups", None)


def _place(value: jax.Array, sharding: NamedSharding) -> jax.Array:
    """``value`` laid out by ``sharding``; on a mesh over processes (``jax.distributed``), filled
    from each process's own copy of ``value`` (every process built the same model)."""
    if sharding.is_fully_addressable:
        return jax.device_put(value, sharding)
    return jax.make_array_from_callback(value.shape, sharding, lambda index: value[index])


def shard_batch(x: jax.Array, mesh: Mesh, *, data_axis: str = "data") -> jax.Array:
    """A batch placed for data parallelism.

    Args: x ``(B, ...)``, NumPy or JAX, any dtype (token ids too), B divisible by the size of
        ``data_axis``; mesh, a ``Mesh`` of devices with that axis.
    Returns: ``x`` as a JAX array with its first axis split over ``data_axis``.

    TypeError or ValueError naming the argument otherwise.
    """
    shape = check_numpy_dtype("x", x)
    if not shape:
        raise ValueError("x must have a batch axis (B, ...), got shape ()")
    check_mesh(mesh)
    check_axis(mesh, "data_axis", data_axis, optional=False)
    check_divisible_by_axis(f"batch of shape {shape}: B = {shape[0]}", shape[0], mesh, data_axis)
    check_devices("shard_batch", mesh)
    return jax.device_put(x, NamedSharding(mesh, P(data_axis)))


def check_mesh(mesh: Any) -> None:
    """TypeError unless ``mesh`` is a ``Mesh`` or an ``AbstractMesh`` (its axes are all a check reads)."""
    if not isinstance(mesh, (Mesh, AbstractMesh)):
        raise TypeError(f"mesh must be a jax.sharding.Mesh, got {type(mesh).__name__}")


def check_devices(function: str, mesh: Mesh | AbstractMesh) -> None:
    """TypeError for an ``AbstractMesh`` where ``function`` places arrays on the mesh's devices."""
    if isinstance(mesh, AbstractMesh):
        raise TypeError(
            f"{function} places arrays on devices: mesh must be a jax.sharding.Mesh of devices "
            "(jax.make_mesh), got an AbstractMesh"
        )


def check_axis(mesh: Mesh | AbstractMesh, argument: str, axis: Any, *, optional: bool = True) -> None:
    """ValueError naming ``argument`` and the mesh's axes unless ``axis`` is one of them (or, where
    ``optional``, None: that sharding is not used)."""
    if (axis is not None or not optional) and axis not in mesh.axis_names:
        raise ValueError(f"{argument} {axis!r} is not an axis of the mesh; its axes are {mesh.axis_names}")


def check_divisible_by_axis(
    what: str, size: int, mesh: Mesh | AbstractMesh, axis: str, *, twice: bool = False
) -> None:
    """ValueError unless ``size`` (``what``: ``"T = 12 (queries.shape[2])"``) splits evenly over mesh
    axis ``axis`` (into two chunks a device where ``twice``)."""
    axis_size = mesh.shape[axis]
    if size % (axis_size * (2 if twice else 1)):
        times = "twice " if twice else ""
        raise ValueError(f"{what} is not divisible by {times}the size {axis_size} of mesh axis {axis!r}")
