"""A user's Flax NNX module with attention dropout and a fused query-key-value layer, put in eval mode
once it holds the torch weights."""

import jax.numpy as jnp
from flax import nnx

NAMES = ("W_query", "W_key", "W_value")


class MHA(nnx.Module):
    def __init__(self, d_model, num_heads, dropout, *, rngs):
        self.num_heads = num_heads
        self.qkv = nnx.Linear(d_model, 3 * d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)
        self.dropout = nnx.Dropout(dropout, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        n = self.num_heads
        q, k, v = (
            y.reshape(b, t, n, d // n).transpose(0, 2, 1, 3) for y in jnp.split(self.qkv(x), 3, axis=-1)
        )
        scores = q @ k.transpose(0, 1, 3, 2) / jnp.sqrt(d // n)
        scores = jnp.where(jnp.tril(jnp.ones((t, t), bool)), scores, -jnp.inf)
        weights = nnx.softmax(scores, axis=-1)
        weights = self.dropout(weights)
        context = (weights @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        return self.out(context)


def build(state, num_heads, dropout=0.1):
    """The module holding the torch weights, in eval mode: its dropout off."""
    model = MHA(state["out_proj.weight"].shape[0], num_heads, dropout, rngs=nnx.Rngs(0))
    model.qkv.kernel[...] = jnp.concatenate([jnp.asarray(state[f"{n}.weight"]).T for n in NAMES], axis=1)
    model.qkv.bias[...] = jnp.concatenate([jnp.asarray(state[f"{n}.bias"]) for n in NAMES])
    model.out.kernel[...] = jnp.asarray(state["out_proj.weight"]).T
    model.out.bias[...] = jnp.asarray(state["out_proj.bias"])
    model.eval()
    return model
