"""GPT-2's weights (transformers' ``GPT2LMHeadModel``, or its ``state_dict``) onto a torch GPT with
the book's names (``torch_ref.GPTModel``: ``nn.Linear`` weights ``(out, in)``, separate
``W_query``/``W_key``/``W_value``), by the one table of names and layouts the project loads GPT-2
checkpoints with (``numpy_attn.hf_gpt2.HF_NAMES``): ``Conv1D`` weights transposed, ``c_attn`` split
into thirds, ``out_head`` tied to ``tok_emb`` where GPT-2's ``lm_head`` is."""

from __future__ import annotations

import re
from typing import Any

import numpy as np

from numpy_attn.hf_gpt2 import HF_BUFFERS, book_params, hf_names

__all__ = ["book_rows", "gpt2_arrays"]


def gpt2_arrays(state: Any) -> dict[str, np.ndarray]:
    """The tensors of ``state`` (a torch module or a ``state_dict``) as arrays, by GPT-2's names
    (buffers left out); ValueError where it holds no GPT-2 block."""
    items = state.state_dict().items() if hasattr(state, "state_dict") else state.items()
    arrays = {
        name: np.asarray(value.detach().cpu().numpy() if hasattr(value, "detach") else value)
        for name, value in items
        if not name.endswith(HF_BUFFERS)
    }
    if not any(re.fullmatch(r"transformer\.h\.\d+\.ln_1\.weight", name) for name in arrays):
        raise ValueError(
            "map_weights onto a torch module maps GPT-2's weights (transformers' names: "
            "transformer.h.0.ln_1.weight ...) onto the book's GPTModel; no GPT-2 block found"
        )
    return arrays


def book_rows(hf: dict[str, np.ndarray]) -> tuple[list[tuple[str, str, str]], dict[str, np.ndarray]]:
    """``(rows, values)``: ``(GPTModel name, GPT-2 name, how)`` for each weight, and its value."""
    n_layers = sum(bool(re.fullmatch(r"transformer\.h\.\d+\.ln_1\.weight", name)) for name in hf)
    lm_head = "lm_head.weight" in hf
    rows = []
    for hf_name, (names, transposed) in hf_names(n_layers, lm_head).items():
        how = "transposed" if transposed else "as is"
        for part, name in enumerate(names):
            third = f", {'qkv'[part]} third of the output axis" if len(names) == 3 else ""
            rows.append((name, hf_name, how + third))
    if not lm_head:
        rows.append(("out_head.weight", "transformer.wte.weight", "as is (tied)"))
    missing = [hf_name for hf_name in dict.fromkeys(r[1] for r in rows) if hf_name not in hf]
    if missing:
        raise ValueError(f"map_weights: GPT-2 tensors missing: {', '.join(missing)}")
    return rows, book_params(hf, n_layers, lm_head)
