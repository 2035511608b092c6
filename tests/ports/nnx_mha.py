"""A user's Flax NNX module with its own loader for the torch weights."""

import jax
import jax.numpy as jnp
from flax import nnx


class MHA(nnx.Module):
    def __init__(self, d_in, d_out, num_heads, *, rngs):
        self.num_heads = num_heads
        self.query = nnx.Linear(d_in, d_out, rngs=rngs)
        self.key = nnx.Linear(d_in, d_out, rngs=rngs)
        self.value = nnx.Linear(d_in, d_out, rngs=rngs)
        self.out = nnx.Linear(d_out, d_out, rngs=rngs)

    def load_torch(self, state):
        for mine, theirs in [
            ("query", "W_query"),
            ("key", "W_key"),
            ("value", "W_value"),
            ("out", "out_proj"),
        ]:
            layer = getattr(self, mine)
            layer.kernel[...] = jnp.asarray(state[f"{theirs}.weight"]).T
            layer.bias[...] = jnp.asarray(state[f"{theirs}.bias"])
        return self

    def __call__(self, x):
        b, t, _ = x.shape
        q = self.query(x)
        k = self.key(x)
        v = self.value(x)
        n = self.num_heads
        h = q.shape[-1] // n
        q = q.reshape(b, t, n, h).transpose(0, 2, 1, 3)
        k = k.reshape(b, t, n, h).transpose(0, 2, 1, 3)
        v = v.reshape(b, t, n, h).transpose(0, 2, 1, 3)
        scores = jnp.matmul(q, k.transpose(0, 1, 3, 2)) / h**0.5
        mask = jnp.triu(jnp.ones((t, t)), k=1).astype(bool)
        scores = jnp.where(mask, -1e9, scores)
        weights = jax.nn.softmax(scores, axis=-1)
        context = jnp.matmul(weights, v)
        context = context.transpose(0, 2, 1, 3).reshape(b, t, n * h)
        return self.out(context)
