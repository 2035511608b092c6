"""Sections 4.4-4.7: the book's GPT (GPT_CONFIG_124M, seed 123) from token ids to the next tokens."""

from __future__ import annotations

from types import ModuleType
from typing import Any

import jax.numpy as jnp
import numpy as np
import torch

import jax_attn
import numpy_attn
from jax_attn import gpt as jax_gpt
from numpy_attn import gpt as numpy_gpt
from numpy_attn import gpt_spec
from parity_tests.book_gpt import CONFIG, HELLO_IDS, batch_ids, book_model, model_params
from parity_tests.lesson.code import excerpt, joined, three
from parity_tests.lesson.printed import PRINTED
from parity_tests.lesson.shown import shown
from parity_tests.walkthrough import FRAMEWORKS, Shown
from torch_ref import gpt as torch_gpt

__all__ = ["generate_cached", "generate_text_simple", "gpt", "parameter_count"]

NEW_TOKENS = 6  # the book's max_new_tokens


def generate_text_simple(
    model: Any, idx: torch.Tensor, max_new_tokens: int, context_size: int
) -> torch.Tensor:
    """The book's greedy generation (section 4.7): the whole text through the model for each new token."""
    for _ in range(max_new_tokens):
        idx_cond = idx[:, -context_size:]
        with torch.no_grad():
            logits = model(idx_cond)
        logits = logits[:, -1, :]  # (B, V): the last position's
        idx_next = torch.argmax(logits, dim=-1, keepdim=True)  # (B, 1): the likeliest token
        idx = torch.cat((idx, idx_next), dim=1)
    return idx


def generate_cached(package: ModuleType, params: Any, idx: Any, max_new_tokens: int) -> Any:
    """The same greedy tokens with a KV cache: each step feeds only the newest token, the keys and
    values of the earlier ones kept in ``package``'s caches (numpy_attn or jax_attn)."""
    caches = package.init_gpt_cache(CONFIG, idx.shape[0])
    generated, step_input = [idx], idx
    for _ in range(max_new_tokens):
        logits, caches = package.gpt_model_decode(params, step_input, caches, CONFIG)  # (B, t, V)
        step_input = logits[:, -1].argmax(axis=-1)[:, None].astype(idx.dtype)  # (B, 1)
        generated.append(step_input)
    return package.FRAMEWORK.xp.concatenate(generated, axis=1)  # (B, T + max_new_tokens)


def parameter_count(params: Any) -> int:
    """The number of weights (section 4.6 counts them with ``sum(p.numel() ...)``)."""
    return sum(int(np.prod(value.shape)) for value in params.values())


def _traces(model: Any, params: dict[str, np.ndarray], jax_params: dict[str, Any]) -> dict[str, Any]:
    ids = batch_ids()
    with torch.no_grad():
        torch_steps = model(torch.from_numpy(ids), return_steps=True)[1]
    return {
        "torch": torch_steps,
        "numpy": numpy_attn.gpt_model(params, ids, CONFIG, return_steps=True)[1],
        "jax": jax_attn.gpt_model(jax_params, jnp.asarray(ids), CONFIG, return_steps=True)[1],
    }


def gpt() -> list[Shown]:
    model = book_model()
    params = model_params(model)
    jax_params = {name: jnp.asarray(value) for name, value in params.items()}
    steps = _traces(model, params, jax_params)
    block = torch_gpt.TransformerBlock.forward
    apply_block = (gpt_spec.apply_block,)
    hello = {
        "torch": generate_text_simple(
            model, torch.from_numpy(HELLO_IDS), NEW_TOKENS, CONFIG["context_length"]
        ),
        "numpy": generate_cached(numpy_attn, params, HELLO_IDS, NEW_TOKENS),
        "jax": generate_cached(jax_attn, jax_params, jnp.asarray(HELLO_IDS), NEW_TOKENS),
    }
    count = excerpt(parameter_count, "return")
    ff_code = three(
        (block, "x = self.ff"),
        (numpy_gpt.feed_forward, "hidden =", "return"),
        (
            jax_gpt._feed_forward,
            "hidden =",
            "return",
        ),  # jax_attn's feed_forward, its products by decode's linear
    )
    ff_code["torch"] = joined(ff_code["torch"], excerpt(torch_gpt.FeedForward.__init__, "self.layers ="))
    return [
        shown(
            "embeddings: token embedding + position embedding",
            three(
                (torch_gpt.GPTModel.forward, "tok_embeds =", "pos_embeds =", "x = self.drop_emb"),
                (numpy_gpt.gpt_model, "tok_embeds =", "pos_embeds =", "x = dropout"),
            ),
            {f: s["embeddings"] for f, s in steps.items()},
            note="(B, T, emb_dim): a learned vector per id plus one per position",
        ),
        shown(
            "block 0: LayerNorm before attention",
            three((block, "x = self.norm1"), (*apply_block, "x = norm1"), (*apply_block, "x = norm1")),
            {f: s["trf_blocks.0.norm1"] for f, s in steps.items()},
            note="every token's vector to mean 0, variance 1 (section 4.2)",
        ),
        shown(
            "block 0: causal multi-head attention, 12 heads of 64",
            three((block, "x = self.att"), (*apply_block, "x = att"), (*apply_block, "x = att")),
            {f: s["trf_blocks.0.att"] for f, s in steps.items()},
            note="the MultiHeadAttention of section 3.6.2 with d_in = d_out = 768",
        ),
        shown(
            "block 0: the shortcut adds the block's input back",
            three(
                (block, "shortcut = x", "x = self.drop_shortcut(x) + shortcut"),
                (*apply_block, "shortcut = x", "x = drop_shortcut(x) + shortcut"),
                (*apply_block, "shortcut = x", "x = drop_shortcut(x) + shortcut"),
            ),
            {f: s["trf_blocks.0.shortcut1"] for f, s in steps.items()},
            note="section 4.4: the gradient flows through the addition unchanged, however deep the model",
        ),
        shown(
            "block 0: feed-forward network, Linear(768, 3072), GELU, Linear(3072, 768)",
            ff_code,
            {f: s["trf_blocks.0.ff"] for f, s in steps.items()},
            note="section 4.3: widen by 4, GELU, narrow back",
        ),
        shown(
            "block 0's output, after the second shortcut",
            three(
                (block, "x = self.drop_shortcut(x) + shortcut"),
                (*apply_block, "x = drop_shortcut(x) + shortcut", "x = drop_shortcut(x) + shortcut"),
                (*apply_block, "x = drop_shortcut(x) + shortcut", "x = drop_shortcut(x) + shortcut"),
            ),
            {f: s["trf_blocks.0.output"] for f, s in steps.items()},
            PRINTED["block_shape"],
            "a block keeps the shape: 12 of them follow one another",
        ),
        shown(
            "logits: final LayerNorm, then the output head, after 12 blocks",
            three(
                (torch_gpt.GPTModel.forward, "x = self.final_norm", "logits = self.out_head"),
                (gpt_spec.model_head, "return"),
                (gpt_spec.model_head, "return"),
            ),
            {f: s["output"] for f, s in steps.items()},
            PRINTED["logits_shape"],
            "a score per vocabulary entry for the token after each position",
        ),
        shown(
            "the number of weights",
            dict.fromkeys(FRAMEWORKS, count),
            {
                "torch": torch.tensor(sum(p.numel() for p in model.parameters())),
                "numpy": np.array(parameter_count(params)),
                "jax": np.array(parameter_count(jax_params)),
            },
            PRINTED["parameters"],
            "124,412,160 once out_head shares tok_emb's weights, as GPT-2 does",
        ),
        shown(
            "'Hello, I am' and 6 greedy next tokens",
            {
                "torch": excerpt(generate_text_simple, "for _ in range"),
                "numpy": excerpt(generate_cached, "caches =", "for _ in range"),
                "jax": excerpt(generate_cached, "caches =", "for _ in range"),
            },
            hello,
            PRINTED["generated"],
            "the weights are untrained, so the text these ids decode to is gibberish",
        ),
    ]
