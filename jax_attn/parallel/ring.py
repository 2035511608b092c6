"""Ring attention: attention with the tokens T sharded over a mesh axis (XLA SPMD).

Each of the P devices of the ring holds T/P queries, keys and values. In P steps every device
attends its queries to the key/value block it holds (an online softmax, as jax_attn's blockwise
path), then passes the block on with ``lax.ppermute``: no device holds more than one block or a
score matrix larger than (T/P, T/P). The backward pass (``jax.custom_vjp``) runs the ring again,
the key/value gradients travelling with their blocks. With ``load_balance=True`` the tokens are
dealt out in zigzag order (T in 2P chunks; device d holds chunks d and 2P-1-d), so that causal
attention gives every device the same share of visible blocks; inputs and output stay in order."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp
from jax import lax
from jax.sharding import AbstractMesh, AxisType, Mesh, NamedSharding
from jax.sharding import PartitionSpec as P

from jax_attn.fast.blockwise import online_softmax_step
from jax_attn.framework import JaxFramework
from jax_attn.ops import rounded
from jax_attn.parallel.sharding import check_axis, check_divisible_by_axis, check_mesh
from numpy_attn.checks import check_attention_shapes, check_flag, check_mask_operands, check_padding_mask

_CHECKS = JaxFramework()  # jax_attn's checks of floating operands (float64 needs 64-bit mode)


def ring_attention(
    queries: jax.Array, keys: jax.Array, values: jax.Array, mesh: Mesh, *, axis_name: str = "seq",
    causal: bool = True, padding_mask: jax.Array | None = None, load_balance: bool = False,
    batch_axis: str | None = None, head_axis: str | None = None,
) -> jax.Array:  # fmt: skip
    """``softmax(queries @ keys^T / sqrt(H), hidden keys at -inf) @ values`` with T sharded over
    ``mesh``'s axis ``axis_name``: ``jax_attn.attend`` on one device, forward and gradients.

    Args: queries, keys, values ``(B, N, T, H)``, one shape, sharded or not; mesh, a ``Mesh`` (or an
        ``AbstractMesh`` of at most ``jax.device_count()`` devices); axis_name, the mesh axis T is
        split over; causal: hide key s from query t when s > t; padding_mask bool ``(B, T)``, True
        = padding, or None; load_balance: zigzag order (T divisible by twice the axis size), even
        causal work; batch_axis, head_axis: mesh axes that split B and N too, or None (a mesh axis
        splits one of B, N and T).
    Returns: ``(B, N, T, H)`` in the queries' dtype (half precision accumulated in float32), sharded
        over T on ``axis_name`` (B and N on theirs); zeros for a query whose every key is hidden.

    TypeError or ValueError naming the argument for arrays ``scaled_dot_product_attention``
    refuses, non-bool flags, or axes that are not the mesh's or do not divide their sizes.
    """
    _check_ring_args(
        queries, keys, values, mesh, padding_mask, causal, load_balance, axis_name, batch_axis, head_axis
    )
    hidden = jnp.zeros(queries.shape[:1] + queries.shape[2:3], bool) if padding_mask is None else padding_mask
    ring = _Ring(axis_name, mesh.shape[axis_name], causal, load_balance)
    return _ring_program(mesh, ring, batch_axis, head_axis)(queries, keys, values, hidden)


def _check_ring_args(queries, keys, values, mesh, padding_mask, causal, load_balance, *axes):
    """The building blocks' checks of the operands, flags and padding mask, then the ring's: one
    ``(B, N, T, H)`` shape, T >= 1, the mesh's axes, one array axis each, sizes that divide."""
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
    names = dict(zip(("axis_name", "batch_axis", "head_axis"), axes, strict=True))
    for name, axis in names.items():
        check_axis(mesh, name, axis, optional=name != "axis_name")
        first = next(other for other, named in names.items() if named == axis)  # the first to name it
        if axis is not None and first != name:
            raise ValueError(f"{name} {axis!r} is {first} too: a mesh axis can split only one of B, N and T")
    for (letter, dim), axis in zip((("T", 2), ("B", 0), ("N", 1)), axes, strict=True):
        if axis is not None:
            what, twice = f"{letter} = {shape[dim]} (queries.shape[{dim}])", letter == "T" and load_balance
            check_divisible_by_axis(what, shape[dim], mesh, axis, twice=twice)  # twice: two zigzag chunks
    if isinstance(mesh, AbstractMesh) and mesh.size > jax.device_count():  # XLA would fail at run time
        raise ValueError(
            f"mesh is an AbstractMesh of {mesh.size} devices ({dict(mesh.shape)}), but JAX has "
            f"{jax.device_count()}: pass a mesh of devices (jax.make_mesh) or one that fits"
        )


@functools.lru_cache(maxsize=64)
def _ring_program(mesh, ring, batch_axis, head_axis):
    """The ring on every device of ``mesh``, jitted once per mesh and arguments (compiled once per
    shapes), its output's sharding declared: without it, an eager ``jax.grad`` through the ring on a
    second mesh raised a sharding error naming the first mesh (JAX 0.10, recovering the output's
    sharding when it compiled the backward pass)."""
    program = functools.partial(_ring, mesh=mesh, ring=ring, batch_axis=batch_axis, head_axis=head_axis)
    if not isinstance(mesh, jax.sharding.Mesh):  # an AbstractMesh places nothing
        return jax.jit(program)
    return jax.jit(program, out_shardings=NamedSharding(mesh, P(batch_axis, head_axis, ring.axis_name)))


def _ring(queries, keys, values, hidden, *, mesh, ring, batch_axis, head_axis):
    """The ring's program: each device's shard of the queries, keys and values around the ring."""
    spec, hidden_spec = P(batch_axis, head_axis, ring.axis_name, None), P(batch_axis, ring.axis_name)
    if AxisType.Explicit in mesh.axis_types:  # shardings are types there: reshard, explicitly
        queries, keys, values = jax.sharding.reshard((queries, keys, values), NamedSharding(mesh, spec))
        hidden = jax.sharding.reshard(hidden, NamedSharding(mesh, hidden_spec))

    def shard(queries, keys, values, hidden):  # one device's (B, N, T/P, H) and (B, T/P), natural order
        if ring.load_balance:
            arrays = (queries, 2), (keys, 2), (values, 2), (hidden, 1)
            queries, keys, values, hidden = (ring.to_zigzag(x, axis) for x, axis in arrays)
        context_vec = _ring_core(queries, keys, values, hidden, ring)
        return ring.from_zigzag(context_vec, 2) if ring.load_balance else context_vec

    sharded = jax.shard_map(shard, mesh=mesh, in_specs=(spec, spec, spec, hidden_spec), out_specs=spec)
    return sharded(queries, keys, values, hidden)


class _Ring(NamedTuple):
    """The ring as one device sees it: its mesh axis, its ``size`` P, the mask and the token order."""

    axis_name: str
    size: int
    causal: bool
    load_balance: bool

    @property
    def num_chunks(self) -> int:
        """The chunks of T a device holds: 2 in zigzag order (d and 2P-1-d), else 1."""
        return 2 if self.load_balance else 1

    def chunk_starts(self, chunk_size: int, step: int | jax.Array = 0) -> list[jax.Array]:
        """The global position of each chunk of the block here at ring step ``step`` (0: our own)."""
        device = (lax.axis_index(self.axis_name) - step) % self.size  # whose keys are here now
        if self.load_balance:
            return [device * chunk_size, (2 * self.size - 1 - device) * chunk_size]
        return [device * chunk_size]

    def permute(self, x, pairs):
        """``x`` (a pytree) sent from device i to device j for each ``(i, j)`` of ``pairs``."""
        return jax.tree.map(lambda a: lax.ppermute(a, self.axis_name, pairs), x)

    def pass_on(self, x):
        """``x`` (a pytree) passed to the next device of the ring."""
        return self.permute(x, [(i, (i + 1) % self.size) for i in range(self.size)])

    def around(self, ring_step, state):
        """P steps of ``ring_step(step, (accumulators, block))``, the block passed on between steps."""

        def step_and_pass(step, state):
            accumulators, block = ring_step(step, state)
            return accumulators, self.pass_on(block)

        return ring_step(self.size - 1, lax.fori_loop(0, self.size - 1, step_and_pass, state))

    def chunk_pairs(self, query_starts, step, block):
        """The (query chunk a, key chunk b) pairs of ring step ``step`` as ``(a, b, visible, mask)``
        (visible: False when causality hides all of b from a; mask ``(B, 1, Tc, Sc)``, True = hidden),
        and the block's arrays (keys, values, hidden keys, ...) cut into chunks along T."""
        chunk_size = block[0].shape[2] // self.num_chunks
        chunks = [jnp.split(x, self.num_chunks, axis=2 if x.ndim == 4 else 1) for x in block]
        positions, pairs = jnp.arange(chunk_size), []
        for a, query_start in enumerate(query_starts):
            for b, key_start in enumerate(self.chunk_starts(chunk_size, step)):
                mask = chunks[2][b][:, None, None, :]  # (B, 1, 1, Sc): padding
                if self.causal:  # (B, 1, Tc, Sc): and the keys after the query
                    mask = mask | (key_start + positions[None, :] > query_start + positions[:, None])
                visible = jnp.logical_or(not self.causal, key_start <= query_start + chunk_size - 1)
                pairs.append((a, b, visible, mask))
        return pairs, chunks

    def _zigzag_moves(self) -> list[list[tuple[int, int]]]:
        """``(i, d)`` for natural chunk 2i, then 2i+1, d the device that holds it in zigzag order."""
        owner = [min(chunk, 2 * self.size - 1 - chunk) for chunk in range(2 * self.size)]  # d: d, 2P-1-d
        return [[(i, owner[2 * i + odd]) for i in range(self.size)] for odd in (0, 1)]

    def to_zigzag(self, x: jax.Array, axis: int) -> jax.Array:
        """Device i's natural chunks 2i, 2i+1 along ``axis`` -> its zigzag chunks i, 2P-1-i: each
        device owns one even and one odd zigzag chunk, so two permutations move them."""
        halves = jnp.split(x, 2, axis=axis)
        even, odd = (
            self.permute(half, moves) for half, moves in zip(halves, self._zigzag_moves(), strict=True)
        )
        even_first = lax.axis_index(self.axis_name) % 2 == 0  # device d's chunks d < 2P-1-d
        return jnp.where(even_first, jnp.concatenate([even, odd], axis), jnp.concatenate([odd, even], axis))

    def from_zigzag(self, x: jax.Array, axis: int) -> jax.Array:
        """The inverse of ``to_zigzag``."""
        first, second = jnp.split(x, 2, axis=axis)
        even_first = lax.axis_index(self.axis_name) % 2 == 0
        halves = jnp.where(even_first, first, second), jnp.where(even_first, second, first)
        even, odd = (
            self.permute(half, [(j, i) for i, j in moves])
            for half, moves in zip(halves, self._zigzag_moves(), strict=True)
        )
        return jnp.concatenate([even, odd], axis)


@functools.partial(jax.custom_vjp, nondiff_argnums=(4,))
def _ring_core(queries, keys, values, hidden, ring: _Ring):
    return _ring_forward(queries, keys, values, hidden, ring)[0]


def _ring_forward(queries, keys, values, hidden, ring: _Ring):
    """One device's context ``(B, N, T/P, H)`` (and the backward's residuals): P steps of online softmax."""
    query_starts = ring.chunk_starts(queries.shape[2] // ring.num_chunks)
    scale = jnp.asarray(queries.shape[-1] ** -0.5, jnp.promote_types(queries.dtype, jnp.float32))
    scaled_queries = queries.astype(scale.dtype) * scale  # accumulated in at least float32
    scaled_queries = jnp.split(scaled_queries, ring.num_chunks, axis=2)  # (B, N, Tc, H) each
    # built from the queries, so that they vary over the mesh's axes as the queries do
    carries = [
        (jnp.full_like(q[..., :1], -jnp.inf), jnp.zeros_like(q[..., :1]), jnp.zeros_like(q))
        for q in scaled_queries
    ]

    def update(carry, query_chunk, key_chunk, value_chunk, mask):
        key_chunk, value_chunk = key_chunk.astype(query_chunk.dtype), value_chunk.astype(query_chunk.dtype)
        attn_scores = rounded(query_chunk @ jnp.swapaxes(key_chunk, -1, -2))  # (B, N, Tc, Sc), see softmax
        return online_softmax_step(carry, jnp.where(mask, -jnp.inf, attn_scores), value_chunk)

    def ring_step(step, state):
        carries, block = list(state[0]), state[1]
        pairs, (key_chunks, value_chunks, _) = ring.chunk_pairs(query_starts, step, block)
        for a, b, visible, mask in pairs:
            carries[a] = lax.cond(
                visible, update, lambda carry, *_: carry,
                carries[a], scaled_queries[a], key_chunks[b], value_chunks[b], mask,
            )  # fmt: skip
        return carries, block

    carries, _ = ring.around(ring_step, (carries, (keys, values, hidden)))
    running_max, running_sum, acc = (jnp.concatenate(parts, axis=2) for parts in zip(*carries, strict=True))
    context_vec = (acc * (1 / jnp.where(running_sum == 0, 1, running_sum))).astype(queries.dtype)
    logsumexp = running_max + jnp.log(running_sum)  # (B, N, T/P, 1); -inf when all hidden
    return context_vec, (queries, keys, values, hidden, context_vec, logsumexp)


def _ring_backward(ring: _Ring, residuals, d_context):
    """The flash-attention backward, around the ring: dK and dV travel with their blocks and are
    home after one more step."""
    queries, keys, values, hidden, context_vec, logsumexp = residuals
    dtypes, compute = (queries.dtype, keys.dtype, values.dtype), logsumexp.dtype
    # computed at the accumulators' precision; keys and values travel at their own
    queries, context_vec, d_context = (x.astype(compute) for x in (queries, context_vec, d_context))
    scale = jnp.asarray(queries.shape[-1] ** -0.5, compute)
    query_starts = ring.chunk_starts(queries.shape[2] // ring.num_chunks)
    safe_logsumexp = jnp.where(logsumexp == -jnp.inf, 0, logsumexp)  # fully hidden rows: weights 0
    row_dot = (d_context * context_vec).sum(axis=-1, keepdims=True)  # (B, N, T/P, 1)
    query_chunks, d_context_chunks, lse_chunks, row_dot_chunks = (
        jnp.split(x, ring.num_chunks, axis=2) for x in (queries, d_context, safe_logsumexp, row_dot)
    )

    def grads(query_chunk, key_chunk, value_chunk, d_context_chunk, lse, row, mask):
        key_chunk, value_chunk = key_chunk.astype(compute), value_chunk.astype(compute)
        attn_scores = rounded((query_chunk * scale) @ jnp.swapaxes(key_chunk, -1, -2))  # (B, N, Tc, Sc)
        # weights are at most 1: a score recomputed an ulp above the forward's cannot overflow exp
        attn_weights = jnp.where(mask, 0, jnp.exp(jnp.minimum(attn_scores - lse, 0)))  # (B, N, Tc, Sc)
        d_values = jnp.swapaxes(attn_weights, -1, -2) @ d_context_chunk  # (B, N, Sc, H)
        d_weights = d_context_chunk @ jnp.swapaxes(value_chunk, -1, -2)  # (B, N, Tc, Sc)
        d_scores = attn_weights * (d_weights - row) * scale
        return d_scores @ key_chunk, jnp.swapaxes(d_scores, -1, -2) @ query_chunk, d_values

    def no_grads(query_chunk, key_chunk, value_chunk, *_):
        return tuple(jnp.zeros_like(x, compute) for x in (query_chunk, key_chunk, value_chunk))

    def ring_step(step, state):
        d_queries, block = list(state[0]), state[1]
        pairs, chunks = ring.chunk_pairs(query_starts, step, block)
        key_chunks, value_chunks, _, d_key_chunks, d_value_chunks = chunks
        for a, b, visible, mask in pairs:
            d_q, d_k, d_v = lax.cond(
                visible, grads, no_grads, query_chunks[a], key_chunks[b], value_chunks[b],
                d_context_chunks[a], lse_chunks[a], row_dot_chunks[a], mask,
            )  # fmt: skip
            d_queries[a] = d_queries[a] + d_q
            d_key_chunks[b] = d_key_chunks[b] + d_k
            d_value_chunks[b] = d_value_chunks[b] + d_v
        d_keys, d_values = jnp.concatenate(d_key_chunks, axis=2), jnp.concatenate(d_value_chunks, axis=2)
        return d_queries, (*block[:3], d_keys, d_values)

    block = (keys, values, hidden, jnp.zeros_like(keys, compute), jnp.zeros_like(values, compute))
    d_queries, block = ring.around(ring_step, ([jnp.zeros_like(c) for c in query_chunks], block))
    # after the last step the key and value gradients sit one device short of home
    d_keys, d_values = ring.pass_on(block[3:])
    d_inputs = jnp.concatenate(d_queries, axis=2), d_keys, d_values
    return *(grad.astype(dtype) for grad, dtype in zip(d_inputs, dtypes, strict=True)), None


_ring_core.defvjp(_ring_forward, _ring_backward)
