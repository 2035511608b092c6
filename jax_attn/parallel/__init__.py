"""Scale out on XLA SPMD: ring attention with the tokens sharded over a mesh axis, and the data- and
tensor-parallel sharding of the NNX modules. Axis letters as in ``jax_attn``; default mesh axes:
"data" (batch), "model" (heads and MLP hidden units), "seq" (tokens)."""

from jax_attn.parallel.ring import ring_attention
from jax_attn.parallel.sharding import COLUMN_PARALLEL, ROW_PARALLEL, param_spec, shard_batch, shard_model

__all__ = ["COLUMN_PARALLEL", "ROW_PARALLEL", "param_spec", "ring_attention", "shard_batch", "shard_model"]
