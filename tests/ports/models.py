"""Whole models for the checker: a Hugging Face GPT-2 and a user's minGPT-style GPT (random weights,
built from a config: nothing is downloaded), and the ports of them in each style with the
reference's weights mapped in (``map_weights``).

Sizes are distinct so that no two axes are taken for each other: vocabulary 61, context 16, width 24,
3 heads of 8, 2 blocks; inputs of 2 sequences of 5 tokens (a block gets ``(2, 5, 24)`` floats).
"""

from __future__ import annotations

import functools

import numpy as np

from parity_tests.locate import map_weights
from tests.ports.catalogue import HERE, load

VOCAB, CONTEXT, WIDTH, HEADS, LAYERS = 61, 16, 24, 3, 2
BATCH, TOKENS = 2, 5


def hf_gpt2(layers: int = LAYERS):
    """transformers' ``GPT2LMHeadModel`` from a ``GPT2Config``: GPT-2's own code (``Conv1D``
    weights, ``gelu_new``), its eager attention so that every step is seen, no dropout."""
    import torch
    from transformers import GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=VOCAB, n_positions=CONTEXT, n_embd=WIDTH, n_layer=layers, n_head=HEADS, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, bos_token_id=0, eos_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    config._attn_implementation = "eager"
    return _drawn(GPT2LMHeadModel(config).eval())


def _drawn(model):
    """``model`` with biases and norms drawn too (initialised to zeros and ones, a bias left out or
    two norms swapped would change nothing)."""
    import torch

    generator = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if name.endswith("bias"):
                parameter.copy_(0.2 * torch.randn(parameter.shape, generator=generator))
            elif parameter.ndim == 1:  # a norm's weight
                parameter.copy_(1 + 0.3 * torch.randn(parameter.shape, generator=generator))
    return model


def mingpt():
    """The user's minGPT-style torch GPT (``torch_mingpt.GPT``)."""
    import torch

    torch.manual_seed(0)
    module = load("torch_mingpt", (HERE / "torch_mingpt.py").read_text())
    return _drawn(module.GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS))


def mingpt_block():
    """One block of the minGPT-style GPT: the reference of a block port."""
    import torch

    torch.manual_seed(0)
    return _drawn(load("torch_mingpt", (HERE / "torch_mingpt.py").read_text()).Block(WIDTH, HEADS, CONTEXT))


def token_ids(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, VOCAB, (BATCH, TOKENS))


def hidden_states(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, TOKENS, WIDTH)).astype(np.float32)


def _zeros(*shape: int) -> np.ndarray:
    return np.zeros(shape, np.float32)


def numpy_gpt2_template() -> dict:
    """The functional NumPy GPT-2's weights, GPT-2's names in its ``Conv1D`` layout."""
    linear = lambda i, o: {"w": _zeros(i, o), "b": _zeros(o)}  # noqa: E731
    norm = lambda: {"g": _zeros(WIDTH), "b": _zeros(WIDTH)}  # noqa: E731
    block = lambda: {  # noqa: E731
        "ln_1": norm(),
        "attn": {"c_attn": linear(WIDTH, 3 * WIDTH), "c_proj": linear(WIDTH, WIDTH)},
        "ln_2": norm(),
        "mlp": {"c_fc": linear(WIDTH, 4 * WIDTH), "c_proj": linear(4 * WIDTH, WIDTH)},
    }
    return {
        "wte": _zeros(VOCAB, WIDTH),
        "wpe": _zeros(CONTEXT, WIDTH),
        "blocks": [block() for _ in range(LAYERS)],
        "ln_f": norm(),
    }


def jax_gpt2_template() -> dict:
    """The JAX GPT-2's weights: its own names, Flax's (in, out) kernels."""
    import jax.numpy as jnp

    dense = lambda i, o: {"kernel": jnp.zeros((i, o)), "bias": jnp.zeros(o)}  # noqa: E731
    norm = lambda: {"scale": jnp.ones(WIDTH), "bias": jnp.zeros(WIDTH)}  # noqa: E731
    layer = lambda: {  # noqa: E731
        "norm1": norm(),
        "attn": {"qkv": dense(WIDTH, 3 * WIDTH), "out": dense(WIDTH, WIDTH)},
        "norm2": norm(),
        "mlp": {"fc1": dense(WIDTH, 4 * WIDTH), "fc2": dense(4 * WIDTH, WIDTH)},
    }
    embed = {"tokens": jnp.zeros((VOCAB, WIDTH)), "positions": jnp.zeros((CONTEXT, WIDTH))}
    return {"embed": embed, "layers": [layer() for _ in range(LAYERS)], "norm_f": norm()}


def weights_for(reference, template):
    """The reference's weights mapped onto ``template`` (a pytree, or an NNX module filled in place)."""
    return map_weights(reference, template).apply(template)


def numpy_gpt2(module, reference):
    return module.run, weights_for(reference, numpy_gpt2_template())


def jax_gpt2(module, reference, jit: bool = False):
    return (module.gpt2_jit if jit else module.gpt2), weights_for(reference, jax_gpt2_template())


def nnx_gpt2(module, reference):
    from flax import nnx

    model = module.GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS, rngs=nnx.Rngs(0))
    return weights_for(reference, model), None


def linen_block(module, reference, chunk: int = 0):
    import jax

    block = module.Block(num_heads=HEADS, chunk=chunk)
    variables = block.init(jax.random.key(0), hidden_states())
    return block, weights_for(reference, variables)


# port -> (reference, inputs, how to build (candidate, weights) from the loaded port and the reference)
MODEL_PORTS = {
    "numpy_gpt2": (hf_gpt2, token_ids, numpy_gpt2),
    "jax_gpt2": (hf_gpt2, token_ids, jax_gpt2),
    "jax_gpt2_jit": (hf_gpt2, token_ids, functools.partial(jax_gpt2, jit=True)),
    "nnx_gpt2": (mingpt, token_ids, nnx_gpt2),
    "linen_block": (mingpt_block, hidden_states, linen_block),
    "linen_block_chunked": (mingpt_block, hidden_states, functools.partial(linen_block, chunk=1)),
}
SOURCES = {"jax_gpt2_jit": "jax_gpt2", "linen_block_chunked": "linen_block"}  # ports sharing a file


def torch_gpt(module, reference):
    """The minGPT-style torch GPT as a port of transformers' GPT-2: its ``nn.Linear`` weights are
    the transposes of GPT-2's ``Conv1D`` ones, the other names GPT-2's less ``transformer.``."""
    import torch

    model = module.GPT(VOCAB, CONTEXT, WIDTH, HEADS, LAYERS).eval()
    conv1d = ("attn.c_attn.weight", "attn.c_proj.weight", "mlp.c_fc.weight", "mlp.c_proj.weight")
    state = {}
    for name, value in reference.state_dict().items():
        if name.startswith("transformer."):
            state[name.removeprefix("transformer.")] = value.T if name.endswith(conv1d) else value
    state["lm_head.weight"] = state["wte.weight"]
    with torch.no_grad():
        missing, unexpected = model.load_state_dict(state, strict=False)
    assert not unexpected and set(missing) <= {n for n, _ in model.named_buffers()}, (missing, unexpected)
    return model, None


MODEL_PORTS["torch_mingpt"] = (hf_gpt2, token_ids, torch_gpt)

BOOK_WIDTH, BOOK_HEADS = 12, 3  # heads of 4: the scores' scale 1/sqrt(4) is GELU's 0.5


def book_block():
    """The book's GPT-2 block (``torch_ref.gpt.TransformerBlock``, its layer norm written out
    operation by operation), width 12 in 3 heads, with the query, key and value biases."""
    import torch

    from torch_ref.gpt import TransformerBlock

    torch.manual_seed(0)
    config = {
        "vocab_size": VOCAB, "context_length": CONTEXT, "emb_dim": BOOK_WIDTH, "n_heads": BOOK_HEADS,
        "n_layers": 1, "drop_rate": 0.0, "qkv_bias": True,
    }  # fmt: skip
    return _drawn(TransformerBlock(config).eval())


def book_states(seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal((BATCH, TOKENS, BOOK_WIDTH)).astype(np.float32)


def numpy_block(module, reference):
    from torch_ref import to_params

    return module.block, to_params(reference)


MODEL_PORTS["numpy_block"] = (book_block, book_states, numpy_block)
