"""``attn-parity heatmap``: attention weights per head, and how far NumPy and JAX are from torch.

For a class of the notes: one row per head, torch_ref's weights on the notes' sentence (seed 123)
and numpy_attn's and jax_attn's differences from them in tolerance units (``parity_tests.maps``).
For ``GPTModel``: the book's GPT (GPT_CONFIG_124M, seed 123) on "Every effort moves you", a grid
of layers x heads of torch_ref's weights and of the larger of the two differences. Hidden keys are
grey. ``difference_figure`` draws one already aligned pair of arrays (``diff --heatmap``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

import numpy as np

from parity_tests.arrays import to_float64
from parity_tests.cases import Case
from parity_tests.maps import difference_units, draw_difference, draw_units, draw_weights
from parity_tests.notes import INPUTS, TOKENS
from parity_tests.png import pyplot, save_png
from parity_tests.tolerances import tolerance_for

__all__ = [
    "GPT",
    "attention_maps",
    "difference_figure",
    "gpt_figure",
    "gpt_maps",
    "heatmap_figure",
    "notes_case",
    "write_heatmap",
]

GPT = "GPTModel"
NAMES = {"torch": "torch_ref", "numpy": "numpy_attn", "jax": "jax_attn"}


def notes_case(layer: str) -> tuple[Case, np.ndarray]:
    """The notes' sentence through ``layer`` (seed 123, two heads where the class has heads).

    The fused classes take ``hidden_size``-wide input: the sentence gets a fourth feature, 0.
    """
    width = 4 if layer.startswith("Fused") else 3
    x = np.zeros((6, width), np.float32)
    x[:, :3] = INPUTS
    case = Case(layer, batch=1, tokens=6, d_in=3, d_out=4, num_heads=2, bias=False, seed=123)
    return case, (x if layer in ("SelfAttentionV1", "SelfAttentionV2") else x[None])


def _first_sequence(steps: Any, name: str, batched: bool) -> np.ndarray:
    """The steps ending in ``name`` (each head's, for the wrapper), ``(N, T, S)`` of the one sequence."""
    values = [to_float64(v) for k, v in steps.items() if k.endswith(name)]
    values = [v[0] if batched else v for v in values]
    return np.concatenate([v.reshape(-1, *v.shape[-2:]) for v in values])


def attention_maps(case: Case, x: np.ndarray) -> dict[str, np.ndarray]:
    """``(N, T, S)`` attention weights of the first sequence per framework (the wrapper: its heads),
    and ``hidden``: the keys torch_ref hides (its masked scores' -inf)."""
    from parity_tests.frameworks import jax_context, run_case, run_jax, run_torch
    from torch_ref import to_params

    module = case.build_torch()
    params = to_params(module)
    with jax_context(case.dtype):
        traces = {
            "torch": run_torch(module, x)[1],
            "numpy": run_case("numpy", case, params, x)[1],
            "jax": run_jax(case, params, x)[1],
        }
    maps = {f: _first_sequence(steps, "attn_weights", x.ndim == 3) for f, steps in traces.items()}
    masked = any(k.endswith("masked_scores") for k in traces["torch"])
    scores = _first_sequence(traces["torch"], "masked_scores" if masked else "attn_scores", x.ndim == 3)
    return {**maps, "hidden": np.isneginf(scores)}


def heatmap_figure(
    maps: dict[str, np.ndarray], tokens: Sequence[str], title: str
) -> tuple[Any, dict[str, Any]]:
    """One row per head: torch_ref's weights, then numpy_attn's and jax_attn's difference from them.
    Returns the figure and the units drawn (framework -> ``(N, T, S)``)."""
    rtol, atol = tolerance_for("float32")
    heads = maps["torch"].shape[0]
    figure, axes = pyplot().subplots(heads, 3, figsize=(14, 4.2 * heads), squeeze=False, layout="constrained")
    units: dict[str, list[np.ndarray]] = {"numpy": [], "jax": []}
    for head in range(heads):
        suffix = f", head {head}" if heads > 1 else ""
        hidden = maps["hidden"][head]
        weights = draw_weights(
            axes[head, 0], maps["torch"][head], hidden, tokens, f"torch_ref weights{suffix}"
        )
        for column, framework in enumerate(("numpy", "jax"), start=1):
            image, drawn = draw_difference(
                axes[head, column], maps["torch"][head], maps[framework][head], rtol, atol, hidden, tokens,
                f"|{NAMES[framework]} - torch_ref| / tolerance{suffix}",
            )  # fmt: skip
            units[framework].append(np.where(hidden, 0.0, drawn))
        figure.colorbar(weights, ax=axes[head, 0], label="weight (0 to 1)")
        figure.colorbar(image, ax=list(axes[head, 1:]), label="|difference| / tolerance")
    figure.suptitle(f"{title}\ngrey: hidden keys; tolerance = {atol:g} + {rtol:g} x max|weight| (float32)")
    return figure, {f: np.stack(u) for f, u in units.items()}


def gpt_maps(model: Any = None) -> dict[str, np.ndarray]:
    """The book's GPT (``model``, default ``book_model()``) on "Every effort moves you": ``(L, N, T, S)``
    weights per framework (each block's attention run on that block's norm1 output) and ``hidden``
    (the causal mask)."""
    import jax.numpy as jnp
    import torch

    import jax_attn
    import numpy_attn
    from numpy_attn.gpt_spec import sub_params
    from parity_tests.book_gpt import CONFIG, batch_ids, book_model, model_params

    model = book_model() if model is None else model
    params = model_params(model)
    ids = batch_ids()[:1]
    heads = {"num_heads": CONFIG["n_heads"], "context_length": CONFIG["context_length"], "return_steps": True}
    with torch.no_grad():
        steps = model(torch.from_numpy(ids), return_steps=True)[1]
        maps = {"torch": [], "numpy": [], "jax": []}
        for index, block in enumerate(model.trf_blocks):
            norm1 = steps[f"trf_blocks.{index}.norm1"]
            att = sub_params(params, f"trf_blocks.{index}.att.")
            maps["torch"].append(block.att(norm1, return_steps=True)[1]["attn_weights"][0])
            maps["numpy"].append(
                numpy_attn.multi_head_attention(att, norm1.numpy(), **heads)[1]["attn_weights"][0]
            )
            jax_att = {k: jnp.asarray(v) for k, v in att.items()}
            jax_steps = jax_attn.multi_head_attention(jax_att, jnp.asarray(norm1.numpy()), **heads)[1]
            maps["jax"].append(jax_steps["attn_weights"][0])
    stacked = {f: np.stack([to_float64(m) for m in ms]) for f, ms in maps.items()}
    causal = numpy_attn.causal_mask(ids.shape[1])
    return {**stacked, "hidden": np.broadcast_to(causal, stacked["torch"].shape)}


def _mosaic(maps: np.ndarray) -> np.ndarray:
    """``(L, N, T, S)`` -> one ``(L * (T + 1) - 1, N * (S + 1) - 1)`` picture, NaN between the maps."""
    layers, heads, t, s = maps.shape
    padded = np.full((layers, heads, t + 1, s + 1), np.nan)
    padded[:, :, :t, :s] = maps
    return padded.transpose(0, 2, 1, 3).reshape(layers * (t + 1), heads * (s + 1))[:-1, :-1]


def gpt_figure(maps: dict[str, np.ndarray], tokens: Sequence[str]) -> tuple[Any, np.ndarray]:
    """Two grids of layers x heads: torch_ref's weights, and the larger of numpy_attn's and
    jax_attn's differences from them in tolerance units. Returns the figure and those units."""
    rtol, atol = tolerance_for("float32")
    layers, heads, t, s = maps["torch"].shape
    hidden = np.asarray(maps["hidden"])
    differences = [difference_units(maps["torch"], maps[f], rtol, atol) for f in ("numpy", "jax")]
    worst = np.where(hidden, 0.0, np.maximum(*differences))
    grey = _mosaic(hidden.astype(float)) != 0
    figure, (left, right) = pyplot().subplots(1, 2, figsize=(16, 8), layout="constrained")
    weights = draw_weights(left, _mosaic(maps["torch"]), grey, axis_names=("layer", "head"))
    image = draw_units(right, _mosaic(worst), grey, axis_names=("layer", "head"))
    titles = ("torch_ref weights", "max(|numpy_attn - torch_ref|, |jax_attn - torch_ref|) / tolerance")
    for axis, title in zip((left, right), titles, strict=True):
        axis.set_title(title, fontsize=10)
        axis.set_xticks([h * (s + 1) + (s - 1) / 2 for h in range(heads)], [str(h) for h in range(heads)])
        axis.set_yticks([i * (t + 1) + (t - 1) / 2 for i in range(layers)], [str(i) for i in range(layers)])
    figure.colorbar(weights, ax=left, label="weight (0 to 1)")
    figure.colorbar(image, ax=right, label="|difference| / tolerance")
    figure.suptitle(
        f"GPT_CONFIG_124M (seed 123) on {''.join(tokens)!r}: each block is one head's {t}x{s} map, query "
        f"tokens down, key tokens across; grey: hidden keys; tolerance {atol:g} + {rtol:g} x max|weight|"
    )
    return figure, worst


def write_heatmap(layer: str, path: str | os.PathLike) -> dict[str, np.ndarray]:
    """Draw ``layer``'s maps (a class of the notes, or ``GPT``) to a PNG (``save_png``); returns the
    weights per framework, ``hidden`` and ``units`` (the largest difference per map, in tolerance units)."""
    if layer == GPT:
        from parity_tests.book_gpt import TOKENS as GPT_TOKENS

        maps = gpt_maps()
        figure, worst = gpt_figure(maps, GPT_TOKENS)
        save_png(figure, path)
        return {**maps, "units": worst}
    case, x = notes_case(layer)
    maps = attention_maps(case, x)
    figure, units = heatmap_figure(
        maps, TOKENS, f"{layer}: attention weights on the notes' sentence (seed 123)"
    )
    save_png(figure, path)
    return {**maps, "units": np.maximum(units["numpy"], units["jax"])}


def difference_figure(
    units: np.ndarray, axis_names: tuple[str, str], slice_label: str, title: str, tolerance: str
) -> Any:
    """One ``(rows, columns)`` map of differences already in tolerance units (``difference_units`` of
    aligned arrays) on the fixed log scale, its axes named, ``slice_label`` (which slice of a larger
    tensor it is) and ``tolerance`` (how the unit is made) on the picture. Returns the figure."""
    figure, axis = pyplot().subplots(figsize=(6.5, 5.5), layout="constrained")
    image = draw_units(axis, units, axis_names=axis_names)
    axis.set_title(f"{title}\n|actual - expected| / tolerance, {slice_label}", fontsize=9)
    figure.colorbar(image, ax=axis, label=f"|error| / ({tolerance})")
    return figure
