"""Generation at GPT-2-small shape: jax_attn and numpy_attn against transformers, in one process.

    python -m parity_tests.bench.gpt [--prompt 8] [--decode 64] [--prefill 512] [--rounds 5] [--out DIR]

The weights: transformers' ``GPT2LMHeadModel(GPT2Config())`` (GPT-2 small, 124M parameters, drawn
by transformers under ``torch.manual_seed(0)``), saved by ``save_pretrained``, read by
``numpy_attn.load_hf_gpt2`` and written again by ``numpy_attn.save_hf_gpt2``: transformers (eager
and SDPA attention), numpy_attn and jax_attn (``GPTModel.from_hf_gpt2``) all load that folder.
Nothing is downloaded. Batch 1, the CPU.

Each timing is the median of ``--rounds`` rounds; a round runs every row once, in turn, after a
warm-up round that compiles. Rows:
- decode: ``--decode`` greedy tokens after a ``--prompt``-token prompt, tokens/s = new tokens / the
  call's time: transformers' ``generate(do_sample=False)``, ``numpy_attn.generate``,
  ``jax_attn.generate`` in float32 and bfloat16 (the model cast once, as ``model.to(bfloat16)``);
- the weight-read limit: one pass of GEMVs (a ``(1, in)`` row times each matrix) over the weights
  a token reads (every block's matrices and the output head), as transformers holds them (torch)
  and as ``GPTModel`` does (one XLA program); tokens/s = 1 / the faster pass's time;
- prefill: a ``--prefill``-token prompt: transformers' SDPA forward (every position's logits, and
  with ``logits_to_keep=1``, as its ``generate`` runs the prompt) against ``jax_attn.generate(model,
  prompt, 1)`` (the prompt's pass in the program that decodes: the last position's logits, then one
  argmax);
- bytes accessed per token: XLA's cost analysis of the decoding step ``jax_attn.generate`` loops
  over (same caches, same compiler options), against the weights' bytes (transformers' count: the
  tied head once) and the KV cache's; the copies of a cache in the compiled program.
The targets are issue 31's, each with its verdict. The results go to ``results.json`` and
``results.md`` in ``--out``, or in a new temporary folder: committed results change only when
``--out`` names their folder.
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parity_tests.usage import integer

__all__ = ["GPT2_SMALL", "TARGETS", "kv_cache_bytes", "markdown_table", "run_gpt_benchmark"]

GPT2_SMALL = {
    "vocab_size": 50257,
    "context_length": 1024,
    "emb_dim": 768,
    "n_heads": 12,
    "n_layers": 12,
    "drop_rate": 0.0,
    "qkv_bias": True,
}
# issue 31's targets: (name, what is compared, threshold)
TARGETS = [
    ("jax_attn greedy decode >= 1.2x transformers' generate", "decode_vs_transformers", 1.2),
    ("jax_attn greedy decode >= 85 % of the weight-read limit", "decode_vs_limit", 0.85),
    ("bytes accessed per token <= 1.15x the weights' bytes", "bytes_vs_weights", 1.15),
    ("bfloat16 decode >= 1.7x float32 decode", "bfloat16_vs_float32", 1.7),
    ("prefill T=512 >= 1.1x transformers' SDPA forward", "prefill_vs_sdpa", 1.1),
    ("numpy_attn.generate >= 1.0x transformers' generate", "numpy_vs_transformers", 1.0),
]


def kv_cache_bytes(
    config: dict[str, Any], batch: int = 1, length: int | None = None, itemsize: int = 4
) -> int:
    """Bytes of the per-block KV caches (keys, values and padding flags) for ``length`` tokens
    (the context by default) of ``itemsize``-byte keys and values."""
    length = config["context_length"] if length is None else length
    head_dim = config["emb_dim"] // config["n_heads"]
    per_block = 2 * batch * config["n_heads"] * length * head_dim * itemsize + batch * length
    return config["n_layers"] * per_block


def hf_config(config: dict[str, Any]) -> Any:
    """transformers' ``GPT2Config`` for the book's ``config`` (GELU tanh, eps 1e-5, no dropout)."""
    from transformers import GPT2Config

    return GPT2Config(
        vocab_size=config["vocab_size"], n_positions=config["context_length"], n_embd=config["emb_dim"],
        n_layer=config["n_layers"], n_head=config["n_heads"], resid_pdrop=0.0, embd_pdrop=0.0,
        attn_pdrop=0.0, bos_token_id=None, eos_token_id=None,
    )  # fmt: skip


def build_models(config: dict[str, Any], folder: str) -> dict[str, Any]:
    """transformers' model drawn under seed 0, written by transformers, then by numpy_attn, and
    loaded from that folder by every framework (jax_attn's bfloat16 model: the float32 one cast)."""
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
    jax_model = jax_attn.GPTModel.from_hf_gpt2(ours)
    half = {name: jnp.asarray(value, jnp.bfloat16) for name, value in params.items()}
    load = GPT2LMHeadModel.from_pretrained
    return {
        "config": config,
        "params": params,
        "eager": load(ours, attn_implementation="eager").eval(),
        "sdpa": load(ours, attn_implementation="sdpa").eval(),
        "jax": jax_model,
        "jax_bfloat16": jax_attn.GPTModel.from_params(half, config),
    }


def _median_rounds(
    runs: dict[str, Callable[[], Any]], rounds: int
) -> tuple[dict[str, float], dict[str, Any]]:
    """Every run once (the warm-up: compiles), then ``rounds`` rounds, each running every run in
    turn, the order rotated from round to round: each run's median seconds and its last result."""
    results = {name: run() for name, run in runs.items()}
    times: dict[str, list[float]] = {name: [] for name in runs}
    names = list(runs)
    for round_ in range(rounds):
        for name in names[round_ % len(names) :] + names[: round_ % len(names)]:
            start = time.perf_counter()
            results[name] = runs[name]()
            times[name].append(time.perf_counter() - start)
    return {name: statistics.median(values) for name, values in times.items()}, results


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
    weights ``(in, out)`` and the output head ``(V, D)``."""
    import torch

    matrices = [module.weight for name, module in model.named_modules() if type(module).__name__ == "Conv1D"]
    head = model.lm_head.weight
    rows = [torch.ones(1, weight.shape[0], dtype=weight.dtype) for weight in matrices]

    def run() -> Any:
        with torch.no_grad():
            return [row @ weight for row, weight in zip(rows, matrices, strict=True)] + [
                torch.nn.functional.linear(torch.ones(1, head.shape[1], dtype=head.dtype), head)
            ]

    return run


def xla_weight_pass(model: Any) -> Callable[[], Any]:
    """One GEMV over each matrix a token reads, in the layout ``jax_attn.generate`` reads them in
    (``generation_params``): one jitted program."""
    import jax
    import jax.numpy as jnp

    from jax_attn.generation import generation_params

    stored, transposed = generation_params(model)
    names = [name for name, value in stored.items() if value.ndim == 2 and "_emb." not in name]
    widths = [stored[name].shape[0 if name in transposed else 1] for name in names]  # each matrix's input
    rows = [jnp.ones((1, width), stored[name].dtype) for width, name in zip(widths, names, strict=True)]
    program = jax.jit(
        lambda rows, stored: [
            row @ (stored[name] if name in transposed else stored[name].T)
            for row, name in zip(rows, names, strict=True)
        ]
    )
    kept = {name: stored[name] for name in names}
    return lambda: jax.block_until_ready(program(rows, kept))


def step_cost(model: Any, cache_length: int) -> dict[str, Any]:
    """XLA's cost analysis of one decoding step of ``jax_attn.generate`` (one token, batch 1, caches
    of ``cache_length`` donated, its compiler options): bytes accessed, and the copies the
    optimised program makes of a cache-shaped array."""
    import jax
    import jax.numpy as jnp

    from jax_attn.generation import IN_PLACE, generation_params
    from jax_attn.gpt import decode
    from jax_attn.kv_cache import init_kv_cache

    config = model.config
    stored, transposed = generation_params(model)
    dtype = stored["tok_emb.weight"].dtype
    shape = (1, config["n_heads"], cache_length, config["emb_dim"] // config["n_heads"])
    caches = tuple(init_kv_cache(*shape, dtype) for _ in range(config["n_layers"]))

    def step(stored: dict[str, Any], token: Any, caches: Any) -> Any:
        params = {name: value.T if name in transposed else value for name, value in stored.items()}
        logits, caches = decode(params, token, caches, config, last_only=True)
        return jnp.argmax(logits[:, -1], axis=-1), caches

    program = jax.jit(step, donate_argnums=2, compiler_options=IN_PLACE)
    compiled = program.lower(stored, jnp.zeros((1, 1), jnp.int32), caches).compile()
    cost = compiled.cost_analysis()
    cost = cost[0] if isinstance(cost, list) else cost
    cache_type = (
        f"{jnp.dtype(dtype).name.replace('float', 'f').replace('bf16', 'bf16')}[{','.join(map(str, shape))}]"
    )
    copies = sum(
        " copy(" in line and cache_type.split("[")[1] in line for line in compiled.as_text().splitlines()
    )
    return {"bytes_accessed": float(cost["bytes accessed"]), "cache_copies": copies}


def run_gpt_benchmark(
    config: dict[str, Any] = GPT2_SMALL,
    prompt_tokens: int = 8,
    decode_tokens: int = 64,
    prefill_tokens: int = 512,
    rounds: int = 5,
    log: Callable[[str], None] = lambda line: print(line, file=sys.stderr, flush=True),
) -> dict[str, Any]:
    """The benchmark's results (see the module's docstring): ``{"decode": {row: seconds}, "prefill":
    {row: seconds}, "bytes": ..., "same_tokens": ..., "ratios": ..., "targets": [...], ...}``."""
    import jax
    import jax.numpy as jnp

    import jax_attn
    import numpy_attn
    from jax_attn.generation import CACHE_STEP

    load_before = os.getloadavg()
    with tempfile.TemporaryDirectory(prefix="attn-parity-gpt-") as folder:
        log("building transformers' GPT-2 and loading it through numpy_attn's folder")
        models = build_models(config, folder)
    config, params = models["config"], models["params"]
    rng = np.random.default_rng(0)
    prompt = rng.integers(0, config["vocab_size"], (1, prompt_tokens))
    long_prompt = rng.integers(0, config["vocab_size"], (1, prefill_tokens))
    jax_prompt, jax_long_prompt = jnp.asarray(prompt), jnp.asarray(long_prompt)
    decode_runs = {
        "transformers generate (eager)": lambda: hf_generate(models["eager"], prompt, decode_tokens),
        "transformers generate (SDPA)": lambda: hf_generate(models["sdpa"], prompt, decode_tokens),
        "numpy_attn.generate": lambda: numpy_attn.generate(params, prompt, config, decode_tokens),
        "jax_attn.generate float32": lambda: np.asarray(
            jax_attn.generate(models["jax"], jax_prompt, decode_tokens)
        ),
        "jax_attn.generate bfloat16": lambda: np.asarray(
            jax_attn.generate(models["jax_bfloat16"], jax_prompt, decode_tokens)
        ),
        "weight-read pass, torch float32": torch_weight_pass(models["sdpa"]),
        "weight-read pass, XLA float32": xla_weight_pass(models["jax"]),
        "weight-read pass, XLA bfloat16": xla_weight_pass(models["jax_bfloat16"]),
    }
    log(f"decode: {decode_tokens} greedy tokens after {prompt_tokens}, {rounds} rounds")
    decode_s, outputs = _median_rounds(decode_runs, rounds)
    prefill_runs = {
        "transformers SDPA forward": lambda: hf_forward(models["sdpa"], long_prompt),
        "transformers SDPA forward, logits_to_keep=1": lambda: hf_forward(
            models["sdpa"], long_prompt, logits_to_keep=1
        ),
        "transformers eager forward": lambda: hf_forward(models["eager"], long_prompt),
        "jax_attn.generate(prompt, 1)": lambda: jax.block_until_ready(
            jax_attn.generate(models["jax"], jax_long_prompt, 1)
        ),
    }
    log(f"prefill: {prefill_tokens} tokens, {rounds} rounds")
    prefill_s, _ = _median_rounds(prefill_runs, rounds)
    cache_length = min(
        config["context_length"], -(-(prompt_tokens + decode_tokens) // CACHE_STEP) * CACHE_STEP
    )
    log("cost analysis of the decoding step")
    weight_bytes = sum(p.numel() * p.element_size() for p in models["sdpa"].parameters())  # tied head once
    costs = {
        dtype: step_cost(models[name], cache_length)
        for dtype, name in (("float32", "jax"), ("bfloat16", "jax_bfloat16"))
    }
    expected = outputs["transformers generate (eager)"]
    results = {
        "config": config, "prompt_tokens": prompt_tokens, "decode_tokens": decode_tokens,
        "prefill_tokens": prefill_tokens, "rounds": rounds, "cache_length": cache_length,
        "decode_s": decode_s, "prefill_s": prefill_s,
        "same_tokens_as_transformers": {
            name: bool(np.array_equal(outputs[name], expected)) for name in decode_runs if "pass" not in name
        },
        "weight_bytes": {"float32": weight_bytes, "bfloat16": weight_bytes // 2},
        "kv_cache_bytes": {
            "float32": kv_cache_bytes(config, length=cache_length), "bfloat16": kv_cache_bytes(config, length=cache_length, itemsize=2),
            "float32, full context": kv_cache_bytes(config),
        },
        "step_cost": costs,
        "load_average": {"before": load_before, "after": os.getloadavg()},
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, Python {platform.python_version()}",
        "versions": _versions(),
    }  # fmt: skip
    results["ratios"] = ratios(results)
    results["targets"] = [
        {"target": name, "value": results["ratios"][key], "threshold": threshold,
         "met": (results["ratios"][key] <= threshold) if key == "bytes_vs_weights" else (results["ratios"][key] >= threshold)}
        for name, key, threshold in TARGETS
    ]  # fmt: skip
    return results


def ratios(results: dict[str, Any]) -> dict[str, float]:
    """The targets' ratios from the medians (speeds: tokens/s over tokens/s)."""
    decode, prefill = results["decode_s"], results["prefill_s"]
    transformers = min(decode["transformers generate (eager)"], decode["transformers generate (SDPA)"])
    limit = min(decode["weight-read pass, torch float32"], decode["weight-read pass, XLA float32"])
    tokens = results["decode_tokens"]
    return {
        "decode_vs_transformers": transformers / decode["jax_attn.generate float32"],
        "decode_vs_limit": (tokens / decode["jax_attn.generate float32"]) * limit,
        "bytes_vs_weights": results["step_cost"]["float32"]["bytes_accessed"]
        / results["weight_bytes"]["float32"],
        "bfloat16_vs_float32": decode["jax_attn.generate float32"] / decode["jax_attn.generate bfloat16"],
        "prefill_vs_sdpa": prefill["transformers SDPA forward"] / prefill["jax_attn.generate(prompt, 1)"],
        "numpy_vs_transformers": transformers / decode["numpy_attn.generate"],
    }


def _versions() -> dict[str, str]:
    import jax
    import torch
    import transformers

    return {"numpy": np.__version__, "torch": torch.__version__, "jax": jax.__version__,
            "transformers": transformers.__version__}  # fmt: skip


def markdown_table(results: dict[str, Any]) -> str:
    """The results as Markdown: the decode and prefill rows, the bytes, the targets' verdicts."""
    tokens, prefill = results["decode_tokens"], results["prefill_tokens"]
    load = results["load_average"]
    lines = [
        f"GPT-2 small (transformers' random weights), batch 1, {results['machine']}; "
        f"{', '.join(f'{k} {v}' for k, v in results['versions'].items())}. Medians of "
        f"{results['rounds']} interleaved rounds. Load average (1, 5, 15 min) before: "
        f"{', '.join(f'{x:.2f}' for x in load['before'])}; after: {', '.join(f'{x:.2f}' for x in load['after'])}.",
        "",
        f"Decode: {tokens} greedy tokens after a {results['prompt_tokens']}-token prompt (caches of "
        f"{results['cache_length']} tokens in jax_attn); a weight-read pass is one GEMV per matrix a token reads.",
        "",
        "| row | time | tokens/s | greedy tokens = transformers' |",
        "| --- | ---: | ---: | :---: |",
    ]
    for name, seconds in results["decode_s"].items():
        per_s = 1 / seconds if "pass" in name else tokens / seconds
        same = results["same_tokens_as_transformers"].get(name)
        lines.append(
            f"| {name} | {seconds * 1e3:.1f} ms | {per_s:.1f} | {'' if same is None else 'yes' if same else 'no'} |"
        )
    lines += ["", f"Prefill: {prefill} tokens.", "", "| row | time | tokens/s |", "| --- | ---: | ---: |"]
    for name, seconds in results["prefill_s"].items():
        lines.append(f"| {name} | {seconds * 1e3:.1f} ms | {prefill / seconds:.0f} |")
    lines += ["", "| decoding step (XLA cost analysis) | bytes accessed | weights' bytes | ratio | KV cache | cache copies |",
              "| --- | ---: | ---: | ---: | ---: | ---: |"]  # fmt: skip
    for dtype, cost in results["step_cost"].items():
        weights = results["weight_bytes"][dtype]
        lines.append(
            f"| {dtype} | {cost['bytes_accessed'] / 1e6:.1f} MB | {weights / 1e6:.1f} MB | "
            f"{cost['bytes_accessed'] / weights:.3f}x | {results['kv_cache_bytes'][dtype] / 1e6:.1f} MB | "
            f"{cost['cache_copies']} |"
        )
    full = results["kv_cache_bytes"]["float32, full context"]
    lines += ["", f"KV cache for the whole context ({results['config']['context_length']} tokens, float32): "
              f"{full / 1e6:.1f} MB.", "", "| target (issue 31) | measured | met |", "| --- | ---: | :---: |"]  # fmt: skip
    for target in results["targets"]:
        lines.append(
            f"| {target['target']} | {target['value']:.2f} | {'yes' if target['met'] else '**no**'} |"
        )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    context = GPT2_SMALL["context_length"]
    parser.add_argument("--prompt", type=integer("--prompt", 1, context), default=8)
    parser.add_argument("--decode", type=integer("--decode", 1, context), default=64)
    parser.add_argument("--prefill", type=integer("--prefill", 1, context - 1), default=512)
    parser.add_argument("--rounds", type=integer("--rounds", 1, 1000), default=5)
    parser.add_argument(
        "--out", help="the folder for results.json and results.md (default: a new temporary one)"
    )
    args = parser.parse_args(argv)
    if args.prompt + args.decode > context:
        parser.error(
            f"--prompt {args.prompt} and --decode {args.decode} exceed the context of {context} tokens"
        )
    out = args.out or tempfile.mkdtemp(prefix="attn-parity-gpt-bench-")
    results = run_gpt_benchmark(GPT2_SMALL, args.prompt, args.decode, args.prefill, args.rounds)
    results["command"] = "python -m parity_tests.bench.gpt " + " ".join(
        argv if argv is not None else sys.argv[1:]
    )
    table = markdown_table(results)
    write_results(out, results, table)
    print(table)
    print(f"\nwritten to {out}", file=sys.stderr)


def write_results(out: str, results: dict[str, Any], table: str) -> None:
    """``results.json`` and ``results.md`` in ``out`` (made if missing), each replaced atomically."""
    import json

    from numpy_attn.files import atomic_write

    os.makedirs(out, exist_ok=True)
    with atomic_write(os.path.join(out, "results.json")) as file:
        file.write(json.dumps(results, indent=2).encode())
    with atomic_write(os.path.join(out, "results.md")) as file:
        file.write(f"# Generation at GPT-2-small shape\n\n`{results['command']}`\n\n{table}\n".encode())


if __name__ == "__main__":
    main()
