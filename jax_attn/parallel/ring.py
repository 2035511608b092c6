"""Ring attention: attention with the sequence axis T sharded over a mesh axis (XLA SPMD).

Each of the P devices of the ring holds T/P queries, keys and values. In P steps every device
attends its queries to the key/value block it holds (an online softmax: a running maximum, sum
and output per query, as on jax_attn's blockwise path), then passes that block to the next device
with ``lax.ppermute``; after P steps every query has seen every key, and no device ever held
more than one key/value block or a score matrix larger than (T/P, T/P). The backward pass
(``jax.custom_vjp``) runs the ring again, the key/value gradients travelling with their blocks,
so it stores nothing of size T either.

Causal attention hides about half the blocks. With the tokens in their natural order, device 0
has one visible block and the last device all P: the ring waits for the slowest. With
``load_balance=True`` the tokens are dealt out in zigzag order (T split in 2P chunks; device d
holds chunks d and 2P-1-d), so every device skips the same share of the work; the reordering
is two ``ppermute``s of half a shard each way, inside this function: inputs and output stay in
natural order.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_attn.framework import JaxFramework
from jax_attn.ops import rounded
from jax_attn.parallel.checks import check_axis, check_divisible_by_axis, check_mesh, check_mesh_fits
from numpy_attn.checks import check_attention_shapes, check_flag, check_mask_operands, check_padding_mask

__all__ = ["ring_attention"]

_CHECKS = JaxFramework()  # jax_attn's checks of floating operands (float64 needs 64-bit mode)


def ring_attention(
    queries: jax.Array,
    keys: jax.Array,
    values: jax.Array,
    mesh: Mesh,
    *,
    axis_name: str = "seq",
    causal: bool = True,
    padding_mask: jax.Array | None = None,
    load_balance: bool = False,
    batch_axis: str | None = None,
    head_axis: str | None = None,
) -> jax.Array:
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values`` with T sharded over
    ``mesh``'s axis ``axis_name``: equal to ``jax_attn.attend`` on one device, forward and
    gradients.

    Args:
        queries, keys, values: ``(B, N, T, H)``, one shape, unsharded or sharded.
        mesh: a ``jax.sharding.Mesh`` (an ``AbstractMesh`` of at most ``jax.device_count()``
            devices too).
        axis_name: the mesh axis T is split over (its size divides T).
        causal: hide key s from query t when s > t.
        padding_mask: bool ``(B, T)``, True = padding (a hidden key), or None.
        load_balance: deal the tokens out in zigzag order (T divisible by twice the axis size),
            so that causal work is even across the ring.
        batch_axis, head_axis: mesh axes that split B and N too (None: not split); each mesh
            axis splits one of B, N and T.
    Returns:
        ``(B, N, T, H)`` in the queries' dtype (float16 and bfloat16 accumulate in float32; keys
        and values travel at their own precision), sharded over T on ``axis_name`` (B and N on
        their axes; the mesh's other axes hold copies). A query whose every key is hidden gets
        zeros.

    TypeError or ValueError naming the argument for arrays ``scaled_dot_product_attention``
    refuses, non-bool flags, or axes that are not the mesh's or do not divide their sizes.
    """
    _check_ring_args(
        queries, keys, values, mesh, axis_name, causal, padding_mask, load_balance, batch_axis, head_axis
    )
    hidden = jnp.zeros(queries.shape[:1] + queries.shape[2:3], bool) if padding_mask is None else padding_mask
    return _sharded_ring(
        queries, keys, values, hidden, mesh=mesh, axis_name=axis_name, causal=causal,
        load_balance=load_balance, batch_axis=batch_axis, head_axis=head_axis,
    )  # fmt: skip


@functools.partial(
    jax.jit, static_argnames=("mesh", "axis_name", "causal", "load_balance", "batch_axis", "head_axis")
)
def _sharded_ring(
    queries, keys, values, hidden, *, mesh, axis_name, causal, load_balance, batch_axis, head_axis
):
    """``_ring_shard`` on every device of ``mesh``, compiled once per shapes and arguments."""
    spec = P(batch_axis, head_axis, axis_name, None)
    ring = functools.partial(
        _ring_shard, axis_name=axis_name, ring_size=mesh.shape[axis_name], causal=causal,
        load_balance=load_balance,
    )  # fmt: skip
    hidden_spec = P(batch_axis, axis_name)
    if AxisType.Explicit in mesh.axis_types:  # shardings are types there: reshard, explicitly
        queries, keys, values = jax.sharding.reshard((queries, keys, values), NamedSharding(mesh, spec))
        hidden = jax.sharding.reshard(hidden, NamedSharding(mesh, hidden_spec))
    sharded = jax.shard_map(ring, mesh=mesh, in_specs=(spec, spec, spec, hidden_spec), out_specs=spec)
    return sharded(queries, keys, values, hidden)


def _check_ring_args(
    queries, keys, values, mesh, axis_name, causal, padding_mask, load_balance, batch_axis, head_axis
):
    """The building blocks' checks of the arrays (floating operands of one dtype,
    ``check_attention_shapes``), flags and padding mask, then the ring's own: one ``(B, N, T, H)``
    shape with T at least 1, a mesh with the named axes, one array axis per mesh axis, and B, N
    and T divisible by their axes' sizes."""
    _CHECKS.check_operands(queries=queries, keys=keys, values=values)
    check_attention_shapes(queries, keys, values)
    shape = tuple(queries.shape)
    if len(shape) != 4 or tuple(keys.shape) != shape or tuple(values.shape) != shape:
        raise ValueError(
            "queries, keys and values must have one (B, N, T, H) shape, got "
            f"{shape}, {tuple(keys.shape)}, {tuple(values.shape)}"
        )
    if shape[2] == 0:
        raise ValueError(f"queries must have at least one token, got shape {shape} for (B, N, T, H)")
    check_flag("causal", causal)
    check_flag("load_balance", load_balance)
    if padding_mask is not None:
        check_mask_operands(padding_mask=padding_mask)
        check_padding_mask(padding_mask, shape[0], shape[2])
    check_mesh(mesh)
    axes = {"axis_name": axis_name, "batch_axis": batch_axis, "head_axis": head_axis}
    splitting = {}  # mesh axis -> the argument that names it
    for name, axis in axes.items():
        check_axis(mesh, name, axis, optional=name != "axis_name")
        if axis in splitting:
            raise ValueError(
                f"{name} {axis!r} is {splitting[axis]} too: a mesh axis can split only one of B, N and T"
            )
        if axis is not None:
            splitting[axis] = name
    check_divisible_by_axis(
        f"T = {shape[2]} (queries.shape[2])", shape[2], mesh, axis_name, twice=load_balance
    )
    for letter, dim, axis in (("B", 0, batch_axis), ("N", 1, head_axis)):
        if axis is not None:
            check_divisible_by_axis(f"{letter} = {shape[dim]} (queries.shape[{dim}])", shape[dim], mesh, axis)
    check_mesh_fits(mesh)


def _ring_shard(queries, keys, values, hidden, *, axis_name, ring_size, causal, load_balance):
    """One device's part: its (B, N, T/P, H) shards (and (B, T/P) hidden keys) in natural order."""
    if load_balance:
        queries, keys, values, hidden = (
            _to_zigzag(x, axis, axis_name, ring_size)
            for x, axis in ((queries, 2), (keys, 2), (values, 2), (hidden, 1))
        )
    context_vec = _ring_core(queries, keys, values, hidden, axis_name, ring_size, causal, load_balance)
    if load_balance:
        context_vec = _from_zigzag(context_vec, 2, axis_name, ring_size)
    return context_vec


def _zigzag_owner(chunk: int, ring_size: int) -> int:
    """The device that holds natural chunk ``chunk`` (of 2P) in zigzag order: d holds d, 2P-1-d."""
    return chunk if chunk < ring_size else 2 * ring_size - 1 - chunk


def _to_zigzag(x: jax.Array, axis: int, axis_name: str, ring_size: int) -> jax.Array:
    """Device i's natural chunks 2i, 2i+1 -> its zigzag chunks i, 2P-1-i (along ``axis``).

    Each device owns one even and one odd zigzag chunk, so two permutations move them; the one
    with the smaller number goes first."""
    even, odd = jnp.split(x, 2, axis=axis)  # natural chunks 2i and 2i+1
    even = lax.ppermute(even, axis_name, [(i, _zigzag_owner(2 * i, ring_size)) for i in range(ring_size)])
    odd = lax.ppermute(odd, axis_name, [(i, _zigzag_owner(2 * i + 1, ring_size)) for i in range(ring_size)])
    even_first = lax.axis_index(axis_name) % 2 == 0  # device d's chunks d < 2P-1-d: d's parity first
    return jnp.where(even_first, jnp.concatenate([even, odd], axis), jnp.concatenate([odd, even], axis))


def _from_zigzag(x: jax.Array, axis: int, axis_name: str, ring_size: int) -> jax.Array:
    """The inverse of ``_to_zigzag``."""
    first, second = jnp.split(x, 2, axis=axis)
    even_first = lax.axis_index(axis_name) % 2 == 0
    even, odd = jnp.where(even_first, first, second), jnp.where(even_first, second, first)
    even = lax.ppermute(even, axis_name, [(_zigzag_owner(2 * i, ring_size), i) for i in range(ring_size)])
    odd = lax.ppermute(odd, axis_name, [(_zigzag_owner(2 * i + 1, ring_size), i) for i in range(ring_size)])
    return jnp.concatenate([even, odd], axis)


def _chunk_starts(device: jax.Array, chunk_size: int, ring_size: int, load_balance: bool) -> list[jax.Array]:
    """Global position of the first token of each chunk a device holds (1 chunk, or 2 in zigzag)."""
    if load_balance:
        return [device * chunk_size, (2 * ring_size - 1 - device) * chunk_size]
    return [device * chunk_size]


def _shift(x, axis_name: str, ring_size: int):
    """Pass ``x`` (a pytree) to the next device of the ring."""
    perm = [(i, (i + 1) % ring_size) for i in range(ring_size)]
    return jax.tree.map(lambda a: lax.ppermute(a, axis_name, perm), x)


def _passing_on(ring_step, axis_name: str, ring_size: int):
    """``ring_step`` (``(step, (accumulators, block)) -> (accumulators, block)``), then the
    block passed to the next device."""

    def step_and_pass(step, state):
        accumulators, block = ring_step(step, state)
        return accumulators, _shift(block, axis_name, ring_size)

    return step_and_pass


def _block_hidden(hidden_keys, query_start, key_start, num_queries, num_keys, causal):
    """(B, 1, Tc, Sc) bool, True = hidden: padding keys, and (causal) keys after the query."""
    mask = hidden_keys[:, None, None, :]  # (B, 1, 1, Sc)
    if causal:
        query_positions = query_start + jnp.arange(num_queries)[:, None]  # (Tc, 1)
        key_positions = key_start + jnp.arange(num_keys)[None, :]  # (1, Sc)
        mask = mask | (key_positions > query_positions)  # (B, 1, Tc, Sc)
    return mask


def _visible(query_start, key_start, chunk_size, causal):
    """False when causality hides every key of the key chunk from every query of the query chunk."""
    return jnp.logical_or(not causal, key_start <= query_start + chunk_size - 1)


def _accumulator_dtype(x: jax.Array) -> jnp.dtype:
    """float32 for half-precision inputs (the online softmax accumulates in at least float32)."""
    return jnp.promote_types(x.dtype, jnp.float32)


def _chunk_pairs(query_starts, source, block, ring_size, causal, load_balance):
    """The (query chunk a, key chunk b) pairs of one ring step, with the key block from device
    ``source``: ``(a, b, visible, mask)``; the block's keys, values, ... chunked along T."""
    num_chunks = len(query_starts)
    chunk_size = block[0].shape[2] // num_chunks
    key_starts = _chunk_starts(source, chunk_size, ring_size, load_balance)
    chunks = [jnp.split(x, num_chunks, axis=2 if x.ndim == 4 else 1) for x in block]
    pairs = []
    for a in range(num_chunks):
        for b in range(num_chunks):
            visible = _visible(query_starts[a], key_starts[b], chunk_size, causal)
            mask = _block_hidden(chunks[2][b], query_starts[a], key_starts[b], chunk_size, chunk_size, causal)
            pairs.append((a, b, visible, mask))
    return pairs, chunks


def _ring_forward(queries, keys, values, hidden, axis_name, ring_size, causal, load_balance):
    """``(context_vec, logsumexp)`` of one device's queries: P steps of online softmax."""
    num_chunks = 2 if load_balance else 1
    device = lax.axis_index(axis_name)
    query_starts = _chunk_starts(device, queries.shape[2] // num_chunks, ring_size, load_balance)
    scale = jnp.asarray(queries.shape[-1] ** -0.5, _accumulator_dtype(queries))
    scaled_queries = jnp.split(queries.astype(scale.dtype) * scale, num_chunks, axis=2)  # (B, N, Tc, H) each
    # built from the queries, so that they vary over the mesh's axes as the queries do
    carries = [
        (
            jnp.full_like(chunk[..., :1], -jnp.inf),  # running max (B, N, Tc, 1)
            jnp.zeros_like(chunk[..., :1]),  # running sum (B, N, Tc, 1)
            jnp.zeros_like(chunk),  # running output (B, N, Tc, H)
        )
        for chunk in scaled_queries
    ]

    def update(carry, query_chunk, key_chunk, value_chunk, mask):
        running_max, running_sum, acc = carry
        key_chunk, value_chunk = key_chunk.astype(query_chunk.dtype), value_chunk.astype(query_chunk.dtype)
        attn_scores = rounded(query_chunk @ jnp.swapaxes(key_chunk, -1, -2))  # (B, N, Tc, Sc), see softmax
        attn_scores = jnp.where(mask, -jnp.inf, attn_scores)
        block_max = jnp.maximum(running_max, attn_scores.max(axis=-1, keepdims=True))
        safe_max = jnp.where(block_max == -jnp.inf, 0, block_max)
        correction = jnp.exp(running_max - safe_max)
        attn_weights = jnp.exp(attn_scores - safe_max)  # unnormalised weights of this block
        running_sum = running_sum * correction + attn_weights.sum(axis=-1, keepdims=True)
        acc = acc * correction + attn_weights @ value_chunk  # (B, N, Tc, H)
        return block_max, running_sum, acc

    def ring_step(step, state):
        carries, block = list(state[0]), state[1]
        source = (device - step) % ring_size  # the device whose keys and values are here now
        pairs, (key_chunks, value_chunks, _) = _chunk_pairs(
            query_starts, source, block, ring_size, causal, load_balance
        )
        for a, b, visible, mask in pairs:
            carries[a] = lax.cond(
                visible, update, lambda carry, *_: carry,
                carries[a], scaled_queries[a], key_chunks[b], value_chunks[b], mask,
            )  # fmt: skip
        return carries, block

    state = (carries, (keys, values, hidden))
    state = lax.fori_loop(0, ring_size - 1, _passing_on(ring_step, axis_name, ring_size), state)
    carries, _ = ring_step(ring_size - 1, state)  # the last step passes nothing on
    outputs, logsumexps = [], []
    for running_max, running_sum, acc in carries:
        outputs.append(acc * (1 / jnp.where(running_sum == 0, 1, running_sum)))  # (B, N, Tc, H)
        logsumexps.append(running_max + jnp.log(running_sum))  # (B, N, Tc, 1); -inf when all hidden
    return jnp.concatenate(outputs, axis=2).astype(queries.dtype), jnp.concatenate(logsumexps, axis=2)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4, 5, 6, 7))
def _ring_core(queries, keys, values, hidden, axis_name, ring_size, causal, load_balance):
    return _ring_forward(queries, keys, values, hidden, axis_name, ring_size, causal, load_balance)[0]


def _ring_core_fwd(queries, keys, values, hidden, axis_name, ring_size, causal, load_balance):
    context_vec, logsumexp = _ring_forward(
        queries, keys, values, hidden, axis_name, ring_size, causal, load_balance
    )
    return context_vec, (queries, keys, values, hidden, context_vec, logsumexp)


def _ring_core_bwd(axis_name, ring_size, causal, load_balance, residuals, d_context):
    """The flash-attention backward, around the ring: dK and dV travel with their blocks and are
    home after one more step."""
    queries, keys, values, hidden, context_vec, logsumexp = residuals
    dtypes = queries.dtype, keys.dtype, values.dtype
    # computed at the accumulators' precision; keys and values travel at their own
    queries, context_vec, d_context = (x.astype(logsumexp.dtype) for x in (queries, context_vec, d_context))
    num_chunks = 2 if load_balance else 1
    scale = jnp.asarray(queries.shape[-1] ** -0.5, logsumexp.dtype)
    device = lax.axis_index(axis_name)
    query_starts = _chunk_starts(device, queries.shape[2] // num_chunks, ring_size, load_balance)
    safe_logsumexp = jnp.where(logsumexp == -jnp.inf, 0, logsumexp)  # fully hidden rows: weights 0
    row_dot = (d_context * context_vec).sum(axis=-1, keepdims=True)  # (B, N, T/P, 1)
    query_chunks, d_context_chunks, lse_chunks, row_dot_chunks = (
        jnp.split(x, num_chunks, axis=2) for x in (queries, d_context, safe_logsumexp, row_dot)
    )

    def grads(query_chunk, key_chunk, value_chunk, d_context_chunk, lse, row, mask):
        key_chunk, value_chunk = key_chunk.astype(query_chunk.dtype), value_chunk.astype(query_chunk.dtype)
        attn_scores = rounded((query_chunk * scale) @ jnp.swapaxes(key_chunk, -1, -2))  # (B, N, Tc, Sc)
        # weights are at most 1: a score recomputed an ulp above the forward's cannot overflow exp
        attn_weights = jnp.where(mask, 0, jnp.exp(jnp.minimum(attn_scores - lse, 0)))  # (B, N, Tc, Sc)
        d_values = jnp.swapaxes(attn_weights, -1, -2) @ d_context_chunk  # (B, N, Sc, H)
        d_weights = d_context_chunk @ jnp.swapaxes(value_chunk, -1, -2)  # (B, N, Tc, Sc)
        d_scores = attn_weights * (d_weights - row) * scale
        return d_scores @ key_chunk, jnp.swapaxes(d_scores, -1, -2) @ query_chunk, d_values

    def no_grads(query_chunk, key_chunk, value_chunk, *_):
        return (
            jnp.zeros_like(query_chunk),
            jnp.zeros_like(key_chunk, query_chunk.dtype),
            jnp.zeros_like(value_chunk, query_chunk.dtype),
        )

    def ring_step(step, state):
        d_queries, block = list(state[0]), state[1]
        source = (device - step) % ring_size
        pairs, (key_chunks, value_chunks, _, d_key_chunks, d_value_chunks) = _chunk_pairs(
            query_starts, source, block, ring_size, causal, load_balance
        )
        for a, b, visible, mask in pairs:
            d_q, d_k, d_v = lax.cond(
                visible, grads, no_grads,
                query_chunks[a], key_chunks[b], value_chunks[b], d_context_chunks[a], lse_chunks[a],
                row_dot_chunks[a], mask,
            )  # fmt: skip
            d_queries[a] = d_queries[a] + d_q
            d_key_chunks[b] = d_key_chunks[b] + d_k
            d_value_chunks[b] = d_value_chunks[b] + d_v
        return d_queries, (
            *block[:3],
            jnp.concatenate(d_key_chunks, axis=2),
            jnp.concatenate(d_value_chunks, axis=2),
        )

    state = (
        [jnp.zeros_like(c) for c in query_chunks],
        (
            keys,
            values,
            hidden,
            jnp.zeros_like(keys, logsumexp.dtype),
            jnp.zeros_like(values, logsumexp.dtype),
        ),
    )
    state = lax.fori_loop(0, ring_size - 1, _passing_on(ring_step, axis_name, ring_size), state)
    d_queries, block = ring_step(ring_size - 1, state)
    # after the last step the key and value gradients sit one device short of home
    d_keys, d_values = _shift(block[3:], axis_name, ring_size)
    d_queries = jnp.concatenate(d_queries, axis=2)
    return *(
        grad.astype(dtype) for grad, dtype in zip((d_queries, d_keys, d_values), dtypes, strict=True)
    ), None


_ring_core.defvjp(_ring_core_fwd, _ring_core_bwd)
