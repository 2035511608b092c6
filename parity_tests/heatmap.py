"""``attn-parity heatmap``: attention weights per head in torch, NumPy and JAX, and the difference."""

from __future__ import annotations

import os

import numpy as np

from parity_tests.arrays import to_float64
from parity_tests.cases import Case
from parity_tests.frameworks import jax_context, run_case, run_jax, run_torch
from parity_tests.notes import INPUTS, TOKENS
from parity_tests.png import pyplot, save_png
from torch_ref import to_params

__all__ = ["attention_maps", "notes_case", "write_heatmap"]


def notes_case(layer: str) -> tuple[Case, np.ndarray]:
    """The notes' sentence through ``layer`` (seed 123, two heads where the class has heads).

    The fused classes take ``hidden_size``-wide input: the sentence gets a fourth feature, 0.
    """
    width = 4 if layer.startswith("Fused") else 3
    x = np.zeros((6, width), np.float32)
    x[:, :3] = INPUTS
    case = Case(layer, batch=1, tokens=6, d_in=3, d_out=4, num_heads=2, bias=False, seed=123)
    return case, (x if layer in ("SelfAttentionV1", "SelfAttentionV2") else x[None])


def attention_maps(case: Case, x: np.ndarray) -> dict[str, np.ndarray]:
    """``(N, T, S)`` attention weights of the first sequence, per framework (wrapper: its heads)."""
    module = case.build_torch()
    params = to_params(module)
    with jax_context(case.dtype):
        traces = {
            "torch": run_torch(module, x)[1],
            "numpy": run_case("numpy", case, params, x)[1],
            "jax": run_jax(case, params, x)[1],
        }
    maps = {}
    for framework, steps in traces.items():
        weights = [to_float64(v) for k, v in steps.items() if k.endswith("attn_weights")]
        if x.ndim == 3:
            weights = [w[0] for w in weights]  # the one sequence: (N, T, S) or (T, S)
        maps[framework] = np.concatenate([w.reshape(-1, *w.shape[-2:]) for w in weights])
    return maps


def write_heatmap(layer: str, path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Draw the maps (one row per head: torch, NumPy, JAX, max |difference|) to a PNG (``save_png``)."""
    case, x = notes_case(layer)
    maps = attention_maps(case, x)
    difference = np.maximum(np.abs(maps["numpy"] - maps["torch"]), np.abs(maps["jax"] - maps["torch"]))
    panels = {"torch_ref": maps["torch"], "numpy_attn": maps["numpy"], "jax_attn": maps["jax"]}
    heads = maps["torch"].shape[0]
    figure, axes = pyplot().subplots(heads, 4, figsize=(16, 3.8 * heads), squeeze=False)
    for head in range(heads):
        for column, (title, weights) in enumerate([*panels.items(), ("max |difference|", difference)]):
            axis = axes[head, column]
            image = axis.imshow(weights[head], cmap="magma" if column == 3 else "viridis")
            axis.set_title(f"{title}, head {head}" if heads > 1 else title, fontsize=10)
            axis.set_xticks(range(len(TOKENS)), TOKENS, rotation=45, fontsize=8)
            axis.set_yticks(range(len(TOKENS)), TOKENS, fontsize=8)
            figure.colorbar(image, ax=axis, fraction=0.046, format="%.1e" if column == 3 else "%.2f")
    figure.suptitle(f"{layer}: attention weights on the notes' sentence (seed 123)")
    figure.tight_layout()
    save_png(figure, path)
    return {**maps, "difference": difference}
