"""The figures' content: the data drawn, the fixed scales, the labels (not their pixels)."""

import json
import pathlib

import matplotlib
import numpy as np
import pytest

from parity_tests import maps
from parity_tests.png import pyplot

matplotlib.use("Agg")
ROOT = pathlib.Path(__file__).resolve().parents[1]


@pytest.fixture
def axis():
    figure, axis = pyplot().subplots()
    yield axis
    pyplot().close(figure)


def test_differences_are_in_tolerance_units_and_equal_infinities_differ_by_zero():
    """-inf against -inf was NaN and drawn hot; a NaN against a number is infinitely far."""
    expected = np.array([[0.5, -np.inf], [1.0, np.nan]])
    actual = np.array([[0.5 + 1.1e-5, -np.inf], [1.0, 0.0]])
    units = maps.difference_units(expected, actual, rtol=1e-5, atol=1e-6)  # tolerance 1e-6 + 1e-5 * 1
    np.testing.assert_allclose(units, [[1.0, 0.0], [0.0, np.inf]], rtol=1e-6)


def test_an_infinity_against_a_number_is_infinitely_far_without_an_overflow():
    """nan_to_num made the infinite difference the largest float, and dividing it by a tolerance
    below 1 overflowed (a RuntimeWarning from ``diff --heatmap`` of scores masked the other way)."""
    expected, actual = np.array([[-np.inf, 0.5]]), np.array([[0.25, -np.inf]])
    with np.errstate(all="raise"):
        units = maps.difference_units(expected, actual, rtol=1e-5, atol=1e-6)
    assert units.tolist() == [[np.inf, np.inf]]


def test_weights_are_drawn_on_a_fixed_0_to_1_scale_with_values_hidden_cells_and_labels(axis):
    weights = np.array([[1.0, 0.0], [0.157, 0.185]])  # near-uniform weights stay near the middle
    hidden = np.array([[False, True], [False, False]])
    image = maps.draw_weights(axis, weights, hidden, ("Your", "journey"), "head 0")
    assert image.get_clim() == (0.0, 1.0)
    drawn = image.get_array()
    assert drawn.mask.tolist() == hidden.tolist() and drawn[1, 0] == 0.157
    assert tuple(image.cmap.get_bad()[:3]) == matplotlib.colors.to_rgb(maps.HIDDEN_COLOUR)
    assert sorted(t.get_text() for t in axis.texts) == ["0.16", "0.18", "1.00"]  # not the hidden cell
    assert (axis.get_ylabel(), axis.get_xlabel()) == ("query", "key")
    assert [t.get_text() for t in axis.get_xticklabels()] == ["Your", "journey"]


def test_large_maps_show_no_values_in_their_cells(axis):
    maps.draw_weights(axis, np.full((9, 9), 1 / 9))
    assert len(axis.texts) == 0


def test_every_difference_panel_has_the_same_log_scale_and_rounding_noise_is_its_bottom(axis):
    """The |difference| panel rescaled per head: one-ulp noise (1.5e-8) was drawn bright."""
    expected = np.full((2, 2), 0.5)
    image, units = maps.draw_difference(axis, expected, expected + 1.5e-8, rtol=1e-5, atol=1e-6)
    assert (image.norm.vmin, image.norm.vmax) == maps.UNITS_RANGE
    assert isinstance(image.norm, matplotlib.colors.LogNorm)
    np.testing.assert_allclose(units, 1.5e-8 / 6e-6)
    assert np.all(image.get_array() == maps.UNITS_RANGE[0])  # clipped to the darkest colour


def test_the_heatmap_of_a_class_draws_torch_weights_and_both_differences_per_head():
    from parity_tests.heatmap import attention_maps, heatmap_figure, notes_case
    from parity_tests.notes import TOKENS

    case, x = notes_case("MultiHeadAttention")
    drawn = attention_maps(case, x)
    assert drawn["torch"].shape == (2, 6, 6)
    np.testing.assert_array_equal(drawn["hidden"][0], np.triu(np.ones((6, 6), bool), 1))
    figure, units = heatmap_figure(drawn, TOKENS, "MultiHeadAttention")
    axes = figure.axes[:9]
    titles = [a.get_title() for a in figure.axes if a.get_title()]
    assert titles[:3] == [
        "torch_ref weights, head 0",
        "|numpy_attn - torch_ref| / tolerance, head 0",
        "|jax_attn - torch_ref| / tolerance, head 0",
    ]
    first = axes[0].images[0]
    np.testing.assert_array_equal(first.get_array().data, drawn["torch"][0])
    assert first.get_clim() == (0.0, 1.0)
    norms = {
        (a.images[0].norm.vmin, a.images[0].norm.vmax) for a in figure.axes if "tolerance" in a.get_title()
    }
    assert norms == {maps.UNITS_RANGE}  # one scale for every head and framework
    assert units["numpy"].shape == (2, 6, 6) and units["numpy"].max() < 1  # within the tolerance
    pyplot().close(figure)


def test_heatmap_and_trace_know_the_gpt(tmp_path, capsys):
    """``heatmap GPTModel``: a grid of 12 layers x 12 heads (it was refused)."""
    from parity_tests.cli import main

    path = tmp_path / "gpt.png"
    assert main(["heatmap", "GPTModel", "--out", str(path)]) == 0
    out = capsys.readouterr().out
    assert out.startswith(f"wrote {path}: GPTModel, 12 layers x 12 heads, max |difference| ")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert main(["--width", "120", "trace", "GPTModel", "--framework", "numpy", "--framework", "jax"]) == 0
    out = capsys.readouterr().out
    assert "trf_blocks.11.output" in out and "(2, 4, 50257)" in out
    assert "numpy: every step matches" in out and "jax: every step matches" in out


def test_the_gpt_grid_holds_each_layers_heads():
    from parity_tests.heatmap import _mosaic

    grid = np.arange(2 * 3 * 2 * 2, dtype=float).reshape(2, 3, 2, 2)  # 2 layers, 3 heads, 2x2 maps
    mosaic = _mosaic(grid)
    assert mosaic.shape == (2 * 3 - 1, 3 * 3 - 1)
    np.testing.assert_array_equal(mosaic[3:5, 6:8], grid[1, 2])  # layer 1, head 2
    assert np.isnan(mosaic[2]).all() and np.isnan(mosaic[:, 2]).all()


def test_the_train_parity_plot_has_integer_steps_and_a_difference_panel():
    from parity_tests.train_parity_cli import ZERO, loss_figure

    figure = loss_figure([3.7, 3.5, 3.2], [3.7, 3.5 + 2e-12, 3.2], [3.7e-12, 3.5e-12, 3.2e-12])
    curves, differences = figure.axes
    torch_line, jax_line = curves.get_lines()
    assert torch_line.get_linewidth() > jax_line.get_linewidth()  # the wide curve shows under the thin one
    gaps = differences.get_lines()[0]
    assert list(gaps.get_xdata()) == [1, 2, 3]
    np.testing.assert_allclose(gaps.get_ydata(), [ZERO, 2e-12, ZERO], rtol=1e-3)
    assert differences.get_yscale() == "log" and differences.get_xlabel() == "step"
    ticks = differences.xaxis.get_major_locator().tick_values(1, 3)
    assert all(float(t).is_integer() for t in ticks)
    pyplot().close(figure)


def test_the_benchmark_chart_keeps_colours_marks_skips_and_puts_the_legend_outside():
    from parity_tests.bench.output import chart_figure

    results = json.loads((ROOT / "benchmarks" / "results.json").read_text())
    figure = chart_figure(results)
    axis = figure.axes[0]
    assert "lower is better" in axis.get_ylabel()
    legend = axis.get_legend()
    assert legend.get_bbox_to_anchor().x0 > axis.get_window_extent().x1  # right of the bars
    colours = {
        t.get_text(): h.get_facecolor()
        for t, h in zip(legend.get_texts(), legend.legend_handles, strict=True)
    }
    results["results"] = [r for r in results["results"] if r["implementation"] != "torch_ref"]
    other = chart_figure(results).axes[0].get_legend()
    for text, handle in zip(other.get_texts(), other.legend_handles, strict=True):
        assert handle.get_facecolor() == colours[text.get_text()]  # the same colour without torch_ref
    skipped = sum("skipped" in r for r in results["results"])
    assert [t.get_text() for t in axis.texts].count("x") == skipped + 1  # torch_ref's skip too
    pyplot().close("all")


def test_locate_names_axes_once_when_there_are_as_many_heads_as_sequences():
    """With batch = heads the report read ``[batch=0, batch=0, query=3, key=1]``."""
    from parity_tests.locate.causes import axis_names

    sizes = {"batch": 2, "head": 2, "tokens": 5, "head_dim": 4}
    assert axis_names((2, 2, 5, 5), sizes) == ("batch", "head", "query", "key")


def test_locate_draws_its_aligned_slice_and_names_it(tmp_path, monkeypatch):
    """The map drew raw tensors (-inf - -inf = NaN, hot) and did not say which slice it showed."""
    from parity_tests.locate import report as report_module

    figures = []
    monkeypatch.setattr(report_module, "save_png", lambda figure, path: figures.append(figure))
    expected = np.zeros((2, 2, 3, 3))
    expected[..., 0, 1:] = -np.inf  # hidden keys, -inf on both sides
    actual = expected.copy()
    actual[1, 0, 2, 1] = 0.5  # the bug, in batch 1, head 0
    report = report_module.LocateReport(
        False, "masked_scores", "port.py:3", worst_index=(1, 0, 2, 1), axes=("batch", "head", "query", "key"),
        rtol=1e-5, atol=1e-6, expected_value=expected, actual_value=actual,
    )  # fmt: skip
    drawn = report.write_heatmap(tmp_path / "x.png")
    assert drawn.shape == (3, 3) and drawn[2, 1] == 2 and (np.delete(drawn.ravel(), 7) == -2).all()
    axis = figures[0].axes[0]
    assert "slice [batch 1, head 0], the worst entry's" in axis.get_title()
    assert (axis.get_ylabel(), axis.get_xlabel()) == ("query", "key")
    pyplot().close("all")


def test_train_parity_draws_each_steps_tolerance(tmp_path, monkeypatch, capsys):
    """The CLI's plot from a training result (here made up: tests/test_gpt_training.py trains)."""
    from types import SimpleNamespace

    from parity_tests import train_parity_cli
    from parity_tests.cli import main
    from parity_tests.compare import compare_steps

    losses = {"torch": [3.7, 3.5, 3.2], "jax": [3.7, 3.5, 3.2 + 1e-13]}
    steps = {f: {f"step {n}": np.float64(v) for n, v in enumerate(ls, 1)} for f, ls in losses.items()}
    result = SimpleNamespace(
        torch=SimpleNamespace(losses=losses["torch"]), jax=SimpleNamespace(losses=losses["jax"]),
        losses=compare_steps(steps["torch"], steps["jax"]), ok=True,
        weights=compare_steps({"w": np.ones(2)}, {"w": np.ones(2)}),
    )  # fmt: skip
    monkeypatch.setattr("parity_tests.training.train_parity", lambda config, hp, dtype: result)
    drawn = []
    monkeypatch.setattr(train_parity_cli, "save_png", lambda figure, path: drawn.append(figure))
    assert main(["train-parity", "--steps", "3", "--out", str(tmp_path / "losses.png")]) == 0
    tolerance = drawn[0].axes[1].get_lines()[1]
    np.testing.assert_allclose(tolerance.get_ydata(), [1e-12 + 1e-12 * loss for loss in losses["torch"]])
    pyplot().close("all")
