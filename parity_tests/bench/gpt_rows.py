"""The rows ``parity_tests.bench.gpt`` times and the costs it reads: the models from one folder (the
GPT-2 and the Llama-shaped one), transformers' calls, the weight-read passes and XLA's cost
analysis of a decoding step."""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

import numpy as np

__all__ = [
    "build_llama_models",
    "build_models",
    "hf_forward",
    "hf_generate",
    "step_cost",
    "torch_weight_pass",
    "xla_weight_pass",
]


def hf_config(config: dict[str, Any]) -> Any:
    """transformers' ``GPT2Config`` for the book's ``config`` (GELU tanh, eps 1e-5, no dropout)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config["vocab_size"], n_positions=config["context_length"], n_embd=config["emb_dim"],
        n_layer=config["n_layers"], n_head=config["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def build_models(config: dict[str, Any], folder: str) -> dict[str, Any]:
    """transformers' GPT-2 drawn under seed 0 and saved by transformers, read and written again by
    numpy_attn, and loaded from that folder by every framework: ``{"config", "params", "eager",
    "sdpa", "jax", "jax_bfloat16"}`` (jax_attn's bfloat16 model: the weights cast once)."""
    import jax.numpy as jnp
    import torch
    from transformers import GPT2LMHeadModel

    import jax_attn
    import numpy_attn

    torch.manual_seed(0)
    drawn = os.path.join(folder, "transformers")
    GPT2LMHeadModel(hf_config(config)).save_pretrained(drawn)
    ours = os.path.join(folder, "numpy_attn")
    numpy_attn.save_hf_gpt2(ours, *numpy_attn.load_hf_gpt2(drawn))
    params, config = numpy_attn.load_hf_gpt2(ours)
    half = {name: jnp.asarray(value, jnp.bfloat16) for name, value in params.items()}
    load = GPT2LMHeadModel.from_pretrained
    return {
        "config": config,
        "params": params,
        "eager": load(ours, attn_implementation="eager").eval(),
        "sdpa": load(ours, attn_implementation="sdpa").eval(),
        "jax": jax_attn.GPTModel.from_hf_gpt2(ours),
        "jax_bfloat16": jax_attn.GPTModel.from_params(half, config),
    }


def llama_hf_config(cfg: dict[str, Any]) -> Any:
    """transformers' ``LlamaConfig`` for a Llama 3 ``cfg``: its RoPE scaling, tied embeddings (as
    Llama 3.2's), eps 1e-5, no token that ends a greedy run."""
    from transformers import LlamaConfig

    freq = cfg["rope_freq"]
    scaling = {
        "rope_type": "llama3", "factor": freq["factor"], "low_freq_factor": freq["low_freq_factor"],
        "high_freq_factor": freq["high_freq_factor"],
        "original_max_position_embeddings": freq["original_context_length"],
    }  # fmt: skip
    return LlamaConfig(
        vocab_size=cfg["vocab_size"], hidden_size=cfg["emb_dim"], intermediate_size=cfg["hidden_dim"],
        num_hidden_layers=cfg["n_layers"], num_attention_heads=cfg["n_heads"],
        num_key_value_heads=cfg["n_kv_groups"], max_position_embeddings=cfg["context_length"],
        rope_theta=cfg["rope_base"], rope_scaling=scaling, tie_word_embeddings=True, rms_norm_eps=1e-5,
        bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def build_llama_models(cfg: dict[str, Any], folder: str) -> dict[str, Any]:
    """transformers' ``LlamaForCausalLM`` drawn under seed 0 and saved by transformers, read and
    written again by numpy_attn (``load_hf``, ``save_hf``), and loaded from that folder:
    ``{"cfg", "params", "sdpa", "jax"}`` (``jax_attn.from_hf``: a ``Llama3Model``)."""
    import torch
    from transformers import LlamaForCausalLM

    import jax_attn
    import numpy_attn

    torch.manual_seed(0)
    drawn = os.path.join(folder, "transformers-llama")
    LlamaForCausalLM(llama_hf_config(cfg)).save_pretrained(drawn)
    ours = os.path.join(folder, "numpy_attn-llama")
    numpy_attn.save_hf(ours, *numpy_attn.load_hf(drawn))
    params, cfg = numpy_attn.load_hf(ours)
    return {
        "cfg": cfg,
        "params": params,
        "sdpa": LlamaForCausalLM.from_pretrained(ours, attn_implementation="sdpa").eval(),
        "jax": jax_attn.from_hf(ours),
    }


def hf_generate(model: Any, prompt: np.ndarray, new_tokens: int) -> np.ndarray:
    """transformers' greedy ``generate`` of ``new_tokens`` tokens after ``prompt`` ``(1, T)``."""
    import torch

    ids = torch.from_numpy(prompt)
    with torch.no_grad():
        return model.generate(
            ids,
            attention_mask=torch.ones_like(ids),
            max_new_tokens=new_tokens,
            do_sample=False,
            pad_token_id=0,
        ).numpy()


def hf_forward(model: Any, prompt: np.ndarray, **options: Any) -> Any:
    """transformers' logits for ``prompt``; ``options``: ``logits_to_keep=1`` for the last one only."""
    import torch

    with torch.no_grad():
        return model(torch.from_numpy(prompt), **options).logits


def torch_weight_pass(model: Any) -> Callable[[], Any]:
    """One GEMV over each matrix a token reads, as transformers holds them: every block's ``Conv1D``
    weight ``(in, out)`` and the output head ``(V, D)``."""
    import torch

    matrices = [module.weight for module in model.modules() if type(module).__name__ == "Conv1D"]
    rows = [torch.ones(1, weight.shape[0], dtype=weight.dtype) for weight in matrices]
    head = model.lm_head.weight
    head_row = torch.ones(1, head.shape[1], dtype=head.dtype)

    def run() -> Any:
        with torch.no_grad():
            products = [row @ weight for row, weight in zip(rows, matrices, strict=True)]
            return [*products, torch.nn.functional.linear(head_row, head)]

    return run


def xla_weight_pass(model: Any) -> Callable[[], Any]:
    """One GEMV over each matrix a token reads, in the layout ``jax_attn.generate`` reads them
    (``generation_params``: kernels ``(in, out)``, or 16-bit weights ``(out, in)``): one program."""
    import jax
    import jax.numpy as jnp

    from jax_attn.generation import accumulating_linear, generation_params

    stored, transposed = generation_params(model)
    dtype = stored["tok_emb.weight"].dtype
    names = [name for name in stored if name.endswith(".weight") and "_emb." not in name]
    matrices = {name: stored[name] for name in names if stored[name].ndim == 2}
    names = list(matrices)

    def width(name: str) -> int:  # the matrix's input
        return matrices[name].shape[0 if name in transposed else 1]

    rows = {name: jnp.ones((1, width(name)), dtype) for name in names}

    def run_pass(rows: dict[str, Any], matrices: dict[str, Any]) -> list[Any]:
        return [
            accumulating_linear(rows[name], matrices[name].T if name in transposed else matrices[name])
            for name in names
        ]

    program = jax.jit(run_pass)
    return lambda: jax.block_until_ready(program(rows, matrices))


def step_cost(model: Any, cache_length: int) -> dict[str, Any]:
    """XLA's cost analysis of one decoding step of ``jax_attn.generate`` (one token, batch 1, its
    weights' layout and products, caches of ``cache_length`` donated, its compiler options), for
    any model it takes (``DECODING``): the bytes accessed, and the copies of a cache the optimised
    program makes."""
    import jax
    import jax.numpy as jnp

    from jax_attn.generation import (
        DECODING,
        IN_PLACE,
        accumulating_linear,
        cache_dtype,
        generation_params,
        torch_layout,
    )
    from numpy_attn.decoder_spec import model_kind

    config = model.model_config
    init_cache, decode = DECODING[model_kind(config)]
    stored, transposed = generation_params(model)
    caches = init_cache({**config, "context_length": cache_length}, 1, cache_dtype(stored["tok_emb.weight"]))

    def step(stored: dict[str, Any], token: Any, caches: Any) -> Any:
        params = torch_layout(stored, transposed)
        logits, caches = decode(params, token, caches, config, last_only=True, linear=accumulating_linear)
        return jnp.argmax(logits[:, -1], axis=-1), caches

    program = jax.jit(step, donate_argnums=2, compiler_options=IN_PLACE)
    compiled = program.lower(stored, jnp.zeros((1, 1), jnp.int32), caches).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    cache_shape = f"[{','.join(map(str, caches[0].keys.shape))}]"
    copies = sum(" copy(" in line and cache_shape in line for line in compiled.as_text().splitlines())
    return {"bytes_accessed": float(cost["bytes accessed"]), "cache_copies": copies}
