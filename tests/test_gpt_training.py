"""Training parity: 20 AdamW steps in torch and JAX give the same losses and final weights."""

import numpy as np
import pytest

from parity_tests.cli import main
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
    return train_parity(TOY_CONFIG, Hyperparameters(steps=20))


def test_twenty_steps_give_the_same_losses_and_final_weights(parity):
    assert len(parity.torch.losses) == len(parity.jax.losses) == 20
    assert parity.losses.ok, str(parity.losses)
    assert parity.weights.ok, str(parity.weights)
    assert parity.torch.losses[-1] < parity.torch.losses[0] - 0.5  # it does learn
    assert [row.step for row in parity.weights.rows][:2] == ["tok_emb.weight", "pos_emb.weight"]


def test_the_cli_prints_the_step_table_and_writes_the_loss_curves(tmp_path, capsys, monkeypatch, parity):
    out = tmp_path / "curves.png"
    monkeypatch.setattr("parity_tests.training.train_parity", lambda config, hp: parity)  # trained above
    assert main(["--width", "150", "train-parity", "--steps", "20", "--out", str(out)]) == 0
    printed = capsys.readouterr().out
    assert f"{parity.torch.losses[0]:.6f}" in printed and f"{parity.torch.losses[-1]:.6f}" in printed
    assert "final weights match" in printed
    assert out.read_bytes().startswith(b"\x89PNG")
