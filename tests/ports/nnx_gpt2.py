"""A user's Flax NNX GPT-2: separate query, key and value layers, attention by einsum in
(B, T, N, H) layout, a causal mask from ``nnx.make_causal_mask``, GELU's tanh form."""

import jax
import jax.numpy as jnp
from flax import nnx


class Attention(nnx.Module):
    def __init__(self, d_model, num_heads, *, rngs):
        self.num_heads = num_heads
        self.query = nnx.Linear(d_model, d_model, rngs=rngs)
        self.key = nnx.Linear(d_model, d_model, rngs=rngs)
        self.value = nnx.Linear(d_model, d_model, rngs=rngs)
        self.out = nnx.Linear(d_model, d_model, rngs=rngs)

    def __call__(self, x):
        b, t, d = x.shape
        n, h = self.num_heads, d // self.num_heads
        q = self.query(x).reshape(b, t, n, h)
        k = self.key(x).reshape(b, t, n, h)
        v = self.value(x).reshape(b, t, n, h)
        scores = jnp.einsum("btnh,bsnh->bnts", q, k) / jnp.sqrt(h)  # (B, N, T, S)
        mask = nnx.make_causal_mask(jnp.ones((b, t)))  # (B, 1, T, S), True = may attend
        scores = jnp.where(mask, scores, jnp.finfo(scores.dtype).min)
        weights = jax.nn.softmax(scores, axis=-1)
        context = jnp.einsum("bnts,bsnh->btnh", weights, v).reshape(b, t, d)
        return self.out(context)


class Block(nnx.Module):
    def __init__(self, d_model, num_heads, *, rngs):
        self.norm1 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.attention = Attention(d_model, num_heads, rngs=rngs)
        self.norm2 = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)
        self.up = nnx.Linear(d_model, 4 * d_model, rngs=rngs)
        self.down = nnx.Linear(4 * d_model, d_model, rngs=rngs)

    def __call__(self, x):
        x = x + self.attention(self.norm1(x))
        h = nnx.gelu(self.up(self.norm2(x)), approximate=True)
        return x + self.down(h)


class GPT(nnx.Module):
    def __init__(self, vocab_size, context_length, d_model, num_heads, num_layers, *, rngs):
        self.tokens = nnx.Embed(vocab_size, d_model, rngs=rngs)
        self.positions = nnx.Embed(context_length, d_model, rngs=rngs)
        self.blocks = nnx.List([Block(d_model, num_heads, rngs=rngs) for _ in range(num_layers)])
        self.norm = nnx.LayerNorm(d_model, epsilon=1e-5, rngs=rngs)

    def __call__(self, token_ids):
        t = token_ids.shape[1]
        x = self.tokens(token_ids) + self.positions(jnp.arange(t))
        for block in self.blocks:
            x = block(x)
        return self.tokens.attend(self.norm(x))  # tied head: x @ embedding.T
