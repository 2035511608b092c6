"""Tiny GPT configs and weights shared by the tests/test_gpt*.py files."""

from __future__ import annotations

import numpy as np
import torch

import torch_ref

# small enough for a fast suite; two layers and two heads exercise every loop
TINY = {
    "vocab_size": 61,
    "context_length": 16,
    "emb_dim": 32,
    "n_heads": 2,
    "n_layers": 2,
    "drop_rate": 0.0,
    "qkv_bias": True,
}


def torch_model(config: dict = TINY, seed: int = 0) -> torch_ref.GPTModel:
    """torch_ref's GPTModel with the weights torch draws under ``seed``, in eval mode."""
    torch.manual_seed(seed)
    return torch_ref.GPTModel(config).eval()


def token_ids(batch: int = 2, num_tokens: int = 11, config: dict = TINY, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, config["vocab_size"], (batch, num_tokens))
