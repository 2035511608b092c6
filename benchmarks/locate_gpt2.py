"""Time for ``locate`` to find a bug in a 12-layer GPT-2-small-shaped port (d=768, 12 heads,
vocabulary 50257): transformers' ``GPT2LMHeadModel`` (random weights, eager attention) as the
reference, the functional NumPy GPT-2 of the bug catalogue (``tests/ports/numpy_gpt2.py``) with the
scale left out of its attention as the candidate. One run, in seconds, with the load average
before and after (the issue's goal: under 60 s on a 2-core CPU).

    PYTHONPATH=$PWD python benchmarks/locate_gpt2.py [--tokens 128] [--layers 12]
"""

from __future__ import annotations

import argparse
import pathlib
import tempfile
import time

import numpy as np
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from parity_tests.locate import locate
from tests.ports.catalogue import Bug, load, plant

SCALE_LEFT_OUT = Bug(
    "np_scale_left_out",
    "numpy_gpt2",
    "return softmax(q @ k.T / np.sqrt(q.shape[-1]) + mask) @ v",
    "return softmax(q @ k.T + mask) @ v",
)


def numpy_params(model: GPT2LMHeadModel, layers: int) -> dict:
    """The NumPy port's weights: GPT-2's own, in its ``Conv1D`` layout."""
    state = {name: value.detach().numpy() for name, value in model.state_dict().items()}

    def pair(prefix: str, first: str) -> dict:
        return {first: state[f"{prefix}.weight"], "b": state[f"{prefix}.bias"]}

    blocks = [
        {
            "ln_1": pair(f"transformer.h.{i}.ln_1", "g"),
            "ln_2": pair(f"transformer.h.{i}.ln_2", "g"),
            "attn": {part: pair(f"transformer.h.{i}.attn.{part}", "w") for part in ("c_attn", "c_proj")},
            "mlp": {part: pair(f"transformer.h.{i}.mlp.{part}", "w") for part in ("c_fc", "c_proj")},
        }
        for i in range(layers)
    ]
    embeddings = {"wte": state["transformer.wte.weight"], "wpe": state["transformer.wpe.weight"]}
    return {**embeddings, "blocks": blocks, "ln_f": pair("transformer.ln_f", "g")}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--layers", type=int, default=12)
    args = parser.parse_args()
    print("load average before:", pathlib.Path("/proc/loadavg").read_text().strip())
    torch.manual_seed(0)
    config = GPT2Config(n_layer=args.layers, resid_pdrop=0.0, embd_pdrop=0.0, attn_pdrop=0.0)
    config._attn_implementation = "eager"
    model = GPT2LMHeadModel(config).eval()
    source, line = plant(SCALE_LEFT_OUT)
    port = load("numpy_gpt2", source, pathlib.Path(tempfile.mkdtemp()))
    ids = np.random.default_rng(0).integers(0, config.vocab_size, (1, args.tokens))
    start = time.perf_counter()
    report = locate(
        model,
        lambda params, ids: port.run(params, ids, config.n_head),
        ids,
        params=numpy_params(model, args.layers),
    )
    elapsed = time.perf_counter() - start
    assert report.candidate_location.endswith(f"numpy_gpt2.py:{line}"), report
    print(f"located {report.candidate_location} ({report.first_divergence}): {report.causes[0]}")
    print(f"locate: {elapsed:.1f} s ({args.layers} layers, 1 x {args.tokens} tokens, d=768, 12 heads)")
    print("load average after:", pathlib.Path("/proc/loadavg").read_text().strip())


if __name__ == "__main__":
    main()
