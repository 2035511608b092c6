"""The book's chapter-4 example: GPT_CONFIG_124M, its token ids, its model under seed 123.

The ids are what the book's tokenizer (tiktoken's GPT-2 encoding) gives for its example texts,
written here so that nothing is downloaded. The model is torch_ref's ``GPTModel`` (the book's)
drawn under ``torch.manual_seed(123)``, in evaluation mode: 163 million weights, 2 s to draw.
"""

from __future__ import annotations

from typing import Any

import numpy as np

__all__ = [
    "BATCH_TEXTS",
    "CONFIG",
    "HELLO_IDS",
    "HELLO_TEXT",
    "TOKENS",
    "batch_ids",
    "book_model",
    "model_params",
]

CONFIG = {
    "vocab_size": 50257,
    "context_length": 1024,
    "emb_dim": 768,
    "n_heads": 12,
    "n_layers": 12,
    "drop_rate": 0.1,
    "qkv_bias": False,
}
BATCH_TEXTS = ("Every effort moves you", "Every day holds a")
TOKENS = ("Every", " effort", " moves", " you")  # the first text's tokens
HELLO_TEXT = "Hello, I am"
HELLO_IDS = np.array([[15496, 11, 314, 716]])


def batch_ids() -> np.ndarray:
    """The book's batch of the two texts: ``(2, 4)`` token ids."""
    return np.array([[6109, 3626, 6100, 345], [6109, 1110, 6622, 257]])


def book_model() -> Any:
    """torch_ref's ``GPTModel(CONFIG)`` drawn under seed 123, in evaluation mode (no dropout)."""
    import torch

    import torch_ref

    torch.manual_seed(123)
    return torch_ref.GPTModel(CONFIG).eval()


def model_params(model: Any) -> dict[str, np.ndarray]:
    """The model's weights in the project's format, sharing torch's memory (no 650 MB copy)."""
    buffers = {name for name, _ in model.named_buffers()}
    return {name: value.detach().numpy() for name, value in model.state_dict().items() if name not in buffers}
