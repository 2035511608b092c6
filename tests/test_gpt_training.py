"""Training parity: 20 AdamW steps in torch and JAX give the same losses and final weights."""

import os
import re
import shutil

import numpy as np
import pytest

from parity_tests.cli import main
from parity_tests.tolerances import tolerance_for
from parity_tests.train_parity_cli import TOY_CONFIG
from parity_tests.training import CORPUS, CharVocabulary, Hyperparameters, make_batches, train_parity


def test_the_vocabulary_round_trips_the_corpus_and_fits_the_toy_config():
    vocabulary = CharVocabulary(CORPUS)
    assert vocabulary.decode(vocabulary.encode(CORPUS)) == CORPUS
    assert len(vocabulary) <= TOY_CONFIG["vocab_size"]


def test_batches_are_seeded_windows_with_targets_shifted_by_one():
    ids = np.arange(100)
    hp = Hyperparameters(steps=3, batch_size=2, seed=4)
    batches = make_batches(ids, 8, hp)
    assert len(batches) == 3
    for inputs, targets in batches:
        assert inputs.shape == targets.shape == (2, 8)
        np.testing.assert_array_equal(targets, inputs + 1)  # ids are positions here
    again = make_batches(ids, 8, hp)
    assert all(np.array_equal(a[0], b[0]) for a, b in zip(batches, again, strict=True))


@pytest.fixture(scope="module")
def parity():
    return train_parity(TOY_CONFIG, Hyperparameters(steps=20), dtype="float64")


def test_twenty_steps_in_float64_give_the_same_losses_and_final_weights(parity):
    assert len(parity.torch.losses) == len(parity.jax.losses) == 20
    assert parity.losses.ok, str(parity.losses)
    assert parity.weights.ok, str(parity.weights)
    assert {(row.rtol, row.atol) for row in parity.weights.rows} == {tolerance_for("float64")}
    assert parity.torch.losses[-1] < parity.torch.losses[0] - 0.5  # it does learn
    assert [row.step for row in parity.weights.rows][:2] == ["tok_emb.weight", "pos_emb.weight"]


def test_twenty_steps_in_float32_give_the_same_losses():
    """The final weights are not asserted in float32: AdamW's update of a gradient entry near eps
    magnifies its rounding error past float32's bound (parity_tests.training's measurements)."""
    float32 = train_parity(TOY_CONFIG, Hyperparameters(steps=20), dtype="float32")
    assert {(row.rtol, row.atol) for row in float32.losses.rows} == {tolerance_for("float32")}
    assert float32.losses.ok, str(float32.losses)
    assert float32.torch.losses[-1] < float32.torch.losses[0] - 0.5


def test_a_dtype_other_than_float32_or_float64_is_refused():
    with pytest.raises(ValueError, match=r"dtype must be one of \('float32', 'float64'\), got 'float16'"):
        train_parity(TOY_CONFIG, Hyperparameters(steps=1), dtype="float16")


def test_a_config_with_dropout_is_refused_before_anything_is_built(monkeypatch):
    """With dropout on, torch (trained in .train()) and JAX (no dropout stream) took different
    steps and two correct ports were reported diverging at step 1."""
    monkeypatch.setattr("torch_ref.GPTModel", None)  # refused before a model is built
    message = (
        "config['drop_rate'] must be 0 for training parity, got 0.1: torch and JAX would draw "
        "different dropout masks, so two correct ports would diverge"
    )
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_parity({**TOY_CONFIG, "drop_rate": 0.1}, Hyperparameters(steps=1), dtype="float64")


def test_a_text_shorter_than_a_training_window_is_refused_naming_both_lengths():
    """It was NumPy's ``high <= 0`` from inside make_batches."""
    message = "the text has 13 tokens; a training window needs at least context_length + 1 = 17"
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        train_parity(TOY_CONFIG, Hyperparameters(steps=1), text="Your journey!")
    with pytest.raises(ValueError, match=f"^{re.escape(message)}$"):
        make_batches(np.arange(13), 16, Hyperparameters(steps=1))
    assert make_batches(np.arange(17), 16, Hyperparameters(steps=1, batch_size=2))[0][0].shape == (2, 16)


def test_the_cli_prints_the_step_table_and_writes_the_loss_curves(tmp_path, capsys, monkeypatch, parity):
    out = tmp_path / "curves.png"
    dtypes = []
    monkeypatch.setattr(  # trained above
        "parity_tests.training.train_parity", lambda config, hp, dtype: dtypes.append(dtype) or parity
    )
    assert main(["--width", "150", "train-parity", "--steps", "20", "--out", str(out)]) == 0
    assert dtypes == ["float64"]  # the default
    printed = capsys.readouterr().out
    assert "in float64" in " ".join(printed.split())
    assert f"{parity.torch.losses[0]:.6f}" in printed and f"{parity.torch.losses[-1]:.6f}" in printed
    assert "final weights match" in printed
    assert out.read_bytes().startswith(b"\x89PNG")


@pytest.mark.parametrize("change", ["fifo", "no folder"])
def test_the_cli_turns_a_failed_save_after_training_into_one_line_and_exit_code_2(
    tmp_path, capsys, monkeypatch, parity, change
):
    """The destination changed after png_path checked it (a FIFO came, never opened; the folder
    went): an OSError traceback and exit 1, which reads as "parity failed"."""
    out = tmp_path / "plots" / "curves.png"
    out.parent.mkdir()

    def train(config, hp, dtype):
        os.mkfifo(out) if change == "fifo" else shutil.rmtree(out.parent)
        return parity

    monkeypatch.setattr("parity_tests.training.train_parity", train)
    assert main(["train-parity", "--out", str(out)]) == 2
    why = (
        f"{out} is not a regular file (a FIFO, device, directory or a link to one)"
        if change == "fifo"
        else f"[Errno 2] No such file or directory: '{out}'"
    )
    assert capsys.readouterr().err == f"attn-parity train-parity: error: cannot write {out}: {why}\n"
