"""Tiny Llama 3 and Qwen3 cfgs and weights shared by the tests/test_decoder*.py files."""

from __future__ import annotations

import numpy as np
import torch

import torch_ref

# small enough for a fast suite; two layers, four query heads in two key/value groups exercise
# every loop; the Qwen's head_dim is not emb_dim // n_heads. The Llama's RoPE scaling meets each of
# its three cases at head size 8 and base 500000: wavelengths 6.3 (below 1024 / 32: kept), 170
# (between: interpolated), 4400 and 120000 (above 1024 / 1: divided by 8)
ROPE_FREQ = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 32.0, "original_context_length": 1024}
LLAMA = {
    "vocab_size": 61, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 48,
    "n_kv_groups": 2, "rope_base": 500_000.0, "dtype": "float32",
    "rope_freq": ROPE_FREQ,
}  # fmt: skip
QWEN = {
    "vocab_size": 61, "context_length": 16, "emb_dim": 32, "n_heads": 4, "n_layers": 2, "hidden_dim": 48,
    "n_kv_groups": 2, "rope_base": 1_000_000.0, "dtype": "float32", "head_dim": 12, "qk_norm": True,
}  # fmt: skip
CFGS = {"Llama3Model": LLAMA, "Qwen3Model": QWEN}
FUNCTIONS = {"Llama3Model": "llama3_model", "Qwen3Model": "qwen3_model"}


def randomize_norms(module: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """The RMSNorms' weights (ones at first) drawn from U[0.5, 1.5), so that a mix-up shows."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, param in module.named_parameters():
            if "norm" in name:
                param.copy_(torch.rand(param.shape, generator=generator, dtype=param.dtype) + 0.5)
    return module


def torch_decoder(
    model: str, cfg: dict | None = None, seed: int = 0, dtype: str = "float32"
) -> torch.nn.Module:
    """torch_ref's ``model`` with the weights torch draws under ``seed``, random norms, in eval mode."""
    torch.manual_seed(seed)
    cfg = (cfg or CFGS[model]) | {"dtype": dtype}
    return randomize_norms(getattr(torch_ref.decoders, model)(cfg).eval(), seed)


def token_ids(batch: int = 2, num_tokens: int = 11, vocab_size: int = 61, seed: int = 1) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, vocab_size, (batch, num_tokens))
