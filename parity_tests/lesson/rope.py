"""RoPE, as the book's bonus notebooks (ch05/07_gpt_to_llama) build it for Llama 2 and Llama 3.

A head's vector is cut into halves x1, x2 and pair i, ``(x1[i], x2[i])``, turns by ``p * inv_freq[i]``
at position p. Shown: a unit vector turned by its position (hand-worked), the frequencies and the
cos table, the book's random queries rotated (converting-gpt-to-llama2.ipynb: seed 123, queries and
keys ``torch.randn(2, 4, 5, 16)``, base 10 000; the notebook prints no values of them), the scores
of one query and one key placed at every position (one number per diagonal: the distance alone
counts) and Llama 3.1's frequency scaling (the book's ``LLAMA31_CONFIG_8B``: head_dim 128, base
500 000).
"""

from __future__ import annotations

import importlib
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
import torch_ref
from numpy_attn import decoder_spec, ops
from parity_tests.lesson.code import excerpt, joined, three
from parity_tests.lesson.shown import shown
from parity_tests.walkthrough import Shown
from torch_ref import decoders as torch_decoders
from torch_ref import rope as torch_rope

__all__ = ["BOOK_ROPE", "LLAMA31_ROPE_FREQ", "book_queries_keys", "everywhere", "rope"]

# converting-gpt-to-llama2.ipynb's RoPE example: batch_size, num_heads, context_len, head_dim
BOOK_ROPE = {"batch_size": 2, "num_heads": 4, "context_len": 5, "head_dim": 16}
BASE = 10_000.0  # Llama 2's theta_base, the example's
# the book's LLAMA31_CONFIG_8B (converting-llama2-to-llama3.ipynb): emb_dim 4096 / 32 heads = 128
LLAMA31_ROPE_FREQ = {
    "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0, "original_context_length": 8192
}  # fmt: skip
LLAMA31 = {"head_dim": 128, "rope_base": 500_000.0}
GQA = torch_decoders.GroupedQueryAttention.forward
# the modules (numpy_attn.rope and jax_attn.rope, the attributes, are the public functions)
numpy_rope, jax_rope = (importlib.import_module(f"{package}.rope") for package in ("numpy_attn", "jax_attn"))


def book_queries_keys() -> tuple[torch.Tensor, torch.Tensor]:
    """The book's dummy queries and keys, each ``(2, 4, 5, 16)``: ``torch.randn`` under seed 123."""
    torch.manual_seed(123)
    shape = tuple(BOOK_ROPE.values())
    return torch.randn(shape), torch.randn(shape)


def everywhere(vectors: np.ndarray, num_tokens: int) -> np.ndarray:
    """Each of N vectors ``(N, H)`` as the token at every position 0..T-1 of a head: ``(1, N, T, H)``."""
    num_heads, head_size = vectors.shape
    return np.ascontiguousarray(np.broadcast_to(vectors[:, None], (1, num_heads, num_tokens, head_size)))


# jax_attn's rope and scaled_dot_product_attention compiled as one program each: called eagerly,
# JAX compiles each of their operations for each new shape (about half a second a shape here)
_jax_rope = jax.jit(jax_attn.rope)
_jax_cos = jax.jit(lambda positions, inv_freq: jax_rope.rope_cos_sin(positions, inv_freq, jnp.float32)[0])
_jax_scores = jax.jit(lambda q, k: jax_attn.ops.scaled_dot_product_attention(q, k, k)[1]["attn_scores"])


def _rotated(x: np.ndarray) -> dict[str, Any]:
    """``x`` ``(B, N, T, H)`` rotated for positions 0..T-1 (base 10 000) in each framework (torch:
    the model's ``compute_rope_params`` tables and ``apply_rope``; NumPy and JAX: their ``rope``)."""
    cos, sin = torch_ref.compute_rope_params(x.shape[-1], BASE, x.shape[-2])
    return {
        "torch": torch_ref.apply_rope(torch.from_numpy(x), cos, sin),
        "numpy": numpy_attn.rope(x),
        "jax": _jax_rope(jnp.asarray(x)),
    }


def _scores(rotated: dict[str, Any]) -> dict[str, Any]:
    """Head 0's rows (the query) against head 1's (the key), ``queries @ keys^T`` ``(B, 1, T, S)``:
    GroupedQueryAttention's product in torch, the ``attn_scores`` step of
    ``scaled_dot_product_attention`` in NumPy and JAX."""
    q, k = ({f: value[:, head : head + 1] for f, value in rotated.items()} for head in (0, 1))
    return {
        "torch": q["torch"] @ k["torch"].transpose(2, 3),
        "numpy": ops.scaled_dot_product_attention(q["numpy"], k["numpy"], k["numpy"])[1]["attn_scores"],
        "jax": _jax_scores(q["jax"], k["jax"]),
    }


def _frequencies(head_dim: int, rope_base: float, rope_freq: Any = None) -> dict[str, Any]:
    """``inv_freq`` ``(H/2,)``: torch_ref's own, and numpy_attn's ``decoder_spec.rope_frequencies``,
    which jax_attn calls too (a function of the sizes: static under ``jax.jit``)."""
    numpy_freq = decoder_spec.rope_frequencies(head_dim, rope_base, rope_freq)
    return {
        "torch": torch_rope.rope_frequencies(head_dim, rope_base, rope_freq),
        "numpy": numpy_freq,
        "jax": jnp.asarray(numpy_freq),
    }


def _frequency_code(*torch_starts: str, numpy_starts: tuple[str, ...]) -> dict[str, Any]:
    numpy_code = excerpt(decoder_spec.rope_frequencies, *numpy_starts)
    return {
        "torch": excerpt(torch_rope.rope_frequencies, *torch_starts),
        "numpy": numpy_code,
        "jax": numpy_code,  # jax_attn's rope and grouped_query import it from numpy_attn
    }


def rope() -> list[Shown]:
    unit = everywhere(np.array([[1.0, 0.0]], np.float32), 4)  # (1, 1, 4, 2)
    queries, keys = book_queries_keys()
    rotated = _rotated(queries.numpy())
    inv_freq = _frequencies(16, BASE)
    torch_cos = torch_ref.compute_rope_params(16, BASE, BOOK_ROPE["context_len"])[0]
    positions = np.arange(BOOK_ROPE["context_len"])
    numpy_cos = numpy_rope.rope_cos_sin(positions, inv_freq["numpy"], np.float32)[0]
    jax_cos = _jax_cos(jnp.asarray(positions), inv_freq["numpy"])
    q_and_k = everywhere(torch.stack([queries[0, 0, 0], keys[0, 0, 0]]).numpy(), BOOK_ROPE["context_len"])
    scaled = _frequencies(LLAMA31["head_dim"], LLAMA31["rope_base"], LLAMA31_ROPE_FREQ)
    plain = _frequencies(LLAMA31["head_dim"], LLAMA31["rope_base"])
    halves = ("x1, x2 =", "rotated =", "return")
    return [
        shown(
            "a unit vector (1, 0) of head size 2 at positions 0-3: turned by p radians",
            three((torch_rope.apply_rope, *halves), (numpy_rope.apply_rope, *halves)),
            {f: value[0, 0] for f, value in _rotated(unit).items()},
            note="one pair (x1, x2) at inv_freq 1; rotate_half gives (-x2, x1), so (1, 0) -> (cos p, sin p)",
        ),
        shown(
            "inv_freq, head_dim 16, base 10 000: pair i turns 10000^(-2i/16) radians a position",
            _frequency_code("inv_freq = [1.0", numpy_starts=("inv_freq = 1.0",)),
            inv_freq,
            note="(H/2,): fast pairs first, slow last; jax_attn uses numpy_attn's decoder_spec",
        ),
        shown(
            "cos of positions 0-4: cos(p * inv_freq[i]), columns 0-7 (8-15 repeat them)",
            three(
                (torch_rope.compute_rope_params, "positions =", "angles =", "angles = torch.cat", "return"),
                (numpy_rope.rope_cos_sin, "angles =", "angles =", "return"),
            ),
            {"torch": torch_cos[:, :8], "numpy": numpy_cos[:, :8], "jax": jax_cos[:, :8]},
            note="(T, H): x[i] and x[i + 8] form pair i, so both halves use the same angles; sin alike",
        ),
        shown(
            "the book's queries[0, 0] rotated: the token at position 2, halves x1 and x2",
            {
                "torch": joined(
                    excerpt(torch_decoders._Decoder.__init__, "cos, sin = compute_rope_params"),
                    excerpt(GQA, "queries, keys = apply_rope"),
                ),
                **{
                    f: excerpt(module.rope, "positions =", "cos, sin =", "return")
                    for f, module in (("numpy", numpy_rope), ("jax", jax_rope))
                },
            },
            {f: value[0, 0, 2].reshape(2, 8) for f, value in rotated.items()},
            note="torch.randn(2, 4, 5, 16) under seed 123 (converting-gpt-to-llama2.ipynb); column i: "
            "pair (x[i], x[i + 8]) turned by 2 * inv_freq[i], its length kept",
        ),
        shown(
            "one query and one key at every position: the score depends on p - s alone",
            three(
                (GQA, "attn_scores = queries @"),
                (ops.scaled_dot_product_attention, "attn_scores ="),
            ),
            {f: value[0, 0] for f, value in _scores(_rotated(q_and_k)).items()},
            note="q = queries[0, 0, 0] at position p (row), k = keys[0, 0, 0] at s (column): each "
            "diagonal holds one number; the main one is q . k, unrotated",
        ),
        shown(
            "Llama 3.1's frequency scaling, head_dim 128, base 500 000: scaled / plain inv_freq",
            _frequency_code(
                "for freq in inv_freq",
                numpy_starts=("wavelength =", "smooth =", "smoothed =", "scaled =", "inv_freq = np.where"),
            ),
            {f: scaled[f] / plain[f] for f in scaled},
            note="the book's LLAMA31_CONFIG_8B rope_freq: wavelengths 2 pi / f under 8192 / 4 kept (1), "
            "over 8192 / 1 slowed by factor 8 (0.125), between interpolated",
        ),
    ]
