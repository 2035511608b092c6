"""Prefill and decode speed of the GPT at GPT-2-small shape, and the KV cache's memory.

    python -m parity_tests.bench.gpt [--prefill 256] [--decode 32] [--rounds 1] [--out benchmarks/gpt]

Random weights (torch's initialisation of torch_ref's ``GPTModel``), batch 1, float32, CPU.
Prefill: logits for a ``--prefill``-token prompt, tokens/s = prompt tokens / time. Decode:
``--decode`` greedy tokens after that prompt, tokens/s = new tokens / time. Implementations:
torch_ref eager (no cache: each token recomputes the whole sequence, as the book's
``generate_text_simple``), the same model with ``torch.nn.functional.scaled_dot_product_attention``
in every block, numpy_attn (``gpt_model``; decode with the KV cache), jax_attn (jitted
``gpt_model``; decode by recomputing a fixed ``(1, prefill + decode)`` buffer: one compile)
and jax_attn's jitted KV-cache decode step (``jax_attn.generate``). Each timing is the median
of ``--rounds`` runs (jax's after a warm-up that compiles). Writes ``results.json`` and
``results.md`` to ``--out`` after each implementation.
"""

from __future__ import annotations

import argparse
import functools
import json
import os
import platform
import statistics
import sys
import time
from collections.abc import Callable
from typing import Any

import numpy as np

from parity_tests.usage import integer

__all__ = ["GPT2_SMALL", "kv_cache_bytes", "markdown_table", "run_gpt_benchmark"]

GPT2_SMALL = {
    "vocab_size": 50257,
    "context_length": 1024,
    "emb_dim": 768,
    "n_heads": 12,
    "n_layers": 12,
    "drop_rate": 0.0,
    "qkv_bias": True,
}


def kv_cache_bytes(config: dict[str, Any], batch: int = 1) -> int:
    """Bytes of numpy_attn's per-block KV caches (keys, values, padding flags) for ``config``."""
    from numpy_attn.gpt import init_gpt_cache

    caches = init_gpt_cache(config, batch)
    return sum(cache.keys.nbytes + cache.values.nbytes + cache.padding.nbytes for cache in caches)


def _median_seconds(run: Callable[[], Any], rounds: int) -> tuple[float, Any]:
    """The median time of ``rounds`` calls of ``run`` and the last call's result."""
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        result = run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), result


def _sdpa_attention(module: Any) -> Callable[[Any], Any]:
    """A forward for torch_ref's ``MultiHeadAttention`` ``module`` computing its attention with
    ``scaled_dot_product_attention`` (causal, same weights, evaluation mode)."""
    import torch.nn.functional as F

    def forward(x: Any) -> Any:
        b, num_tokens, _ = x.shape
        queries, keys, values = (
            w(x).view(b, num_tokens, module.num_heads, module.head_dim).transpose(1, 2)
            for w in (module.W_query, module.W_key, module.W_value)
        )  # 3 x (B, N, T, H)
        context_vec = F.scaled_dot_product_attention(queries, keys, values, is_causal=True)  # (B, N, T, H)
        return module.out_proj(context_vec.transpose(1, 2).reshape(b, num_tokens, module.d_out))

    return forward


def _greedy_by_recomputation(logits_of: Callable[[np.ndarray], np.ndarray], ids: np.ndarray, new: int):
    for _ in range(new):
        next_id = np.asarray(logits_of(ids))[:, -1].argmax(-1)[:, None]
        ids = np.concatenate([ids, next_id.astype(ids.dtype)], axis=1)
    return ids


def _greedy_in_fixed_buffer(logits_of: Callable[[np.ndarray], np.ndarray], ids: np.ndarray, new: int):
    """Greedy decoding by recomputation on one ``(B, T + new)`` buffer (later slots are zeros the
    causal mask hides from earlier positions): a single shape, so ``jax.jit`` compiles once."""
    buffer = np.zeros((ids.shape[0], ids.shape[1] + new), ids.dtype)
    buffer[:, : ids.shape[1]] = ids
    for position in range(ids.shape[1], buffer.shape[1]):
        buffer[:, position] = np.asarray(logits_of(buffer))[:, position - 1].argmax(-1)
    return buffer


def run_gpt_benchmark(
    config: dict[str, Any],
    prefill: int,
    decode: int,
    rounds: int,
    on_row: Callable[[dict[str, Any]], None] | None = None,
) -> dict[str, Any]:
    """``{"config", "prefill", "decode", "rows": [{"implementation", "prefill_tokens_per_s",
    "decode_tokens_per_s", "same_tokens_as_torch_ref"}], "kv_cache_bytes", ...}``: whether each
    implementation's greedy tokens equal torch_ref's is recorded with its speed. ``on_row``
    receives the results so far after each implementation (to write partial results)."""
    import copy

    import jax
    import jax.numpy as jnp
    import torch

    import jax_attn
    import numpy_attn
    import torch_ref

    torch.manual_seed(0)
    model = torch_ref.GPTModel(config).eval()
    sdpa_model = copy.deepcopy(model)
    for block in sdpa_model.trf_blocks:
        block.att.forward = _sdpa_attention(block.att)
    params = torch_ref.to_params(model)
    jax_params = {name: jnp.asarray(value) for name, value in params.items()}
    jax_model = jax_attn.GPTModel.from_params(params, config)
    jitted = jax.jit(lambda p, ids: jax_attn.gpt_model(p, ids, config))
    prompt = np.random.default_rng(0).integers(0, config["vocab_size"], (1, prefill))

    def torch_logits(m: Any) -> Callable[[np.ndarray], np.ndarray]:
        def run(ids: np.ndarray) -> np.ndarray:
            with torch.no_grad():
                return m(torch.from_numpy(ids)).numpy()

        return run

    fixed_buffer = np.zeros((1, prefill + decode), prompt.dtype)
    # name -> (logits of a prompt or None, greedy decoding, warm-up that compiles what jit needs)
    implementations = {
        "torch_ref eager (no KV cache)": (
            torch_logits(model),
            functools.partial(_greedy_by_recomputation, torch_logits(model), prompt, decode),
            None,
        ),
        "torch_ref + SDPA (no KV cache)": (
            torch_logits(sdpa_model),
            functools.partial(_greedy_by_recomputation, torch_logits(sdpa_model), prompt, decode),
            None,
        ),
        "numpy_attn (KV cache)": (
            lambda ids: numpy_attn.gpt_model(params, ids, config),
            lambda: numpy_attn.generate(params, prompt, config, decode),
            None,
        ),
        "jax_attn jit (no KV cache)": (
            lambda ids: jitted(jax_params, jnp.asarray(ids)).block_until_ready(),
            functools.partial(
                _greedy_in_fixed_buffer, lambda ids: jitted(jax_params, jnp.asarray(ids)), prompt, decode
            ),
            lambda: (jitted(jax_params, jnp.asarray(prompt)), jitted(jax_params, jnp.asarray(fixed_buffer))),
        ),
        "jax_attn jitted decode step (KV cache)": (
            None,
            lambda: jax_attn.generate(jax_model, jnp.asarray(prompt), decode).block_until_ready(),
            lambda: jax_attn.generate(jax_model, jnp.asarray(prompt), 2),  # the prompt's step and one token's
        ),
    }
    rows, expected = [], None
    for name, (logits_of, generate, warm_up) in implementations.items():
        print(f"timing {name}", file=sys.stderr, flush=True)
        if warm_up is not None:
            warm_up()
        row: dict[str, Any] = {"implementation": name}
        if logits_of is not None:
            seconds, _ = _median_seconds(functools.partial(logits_of, prompt), rounds)
            row["prefill_tokens_per_s"] = prefill / seconds
        seconds, tokens = _median_seconds(generate, rounds)
        expected = np.asarray(tokens) if expected is None else expected  # torch_ref eager's, the first
        row["decode_tokens_per_s"] = decode / seconds
        row["same_tokens_as_torch_ref"] = bool(np.array_equal(np.asarray(tokens), expected))
        rows.append(row)
        if on_row is not None:
            on_row(_results(config, prefill, decode, rounds, rows))
    return _results(config, prefill, decode, rounds, rows)


def _results(config: dict[str, Any], prefill: int, decode: int, rounds: int, rows: list) -> dict[str, Any]:
    return {
        "config": config,
        "batch": 1,
        "prefill": prefill,
        "decode": decode,
        "rounds": rounds,
        "kv_cache_bytes": kv_cache_bytes(config),
        "machine": f"{platform.machine()}, {os.cpu_count()} CPU cores, {platform.python_version()}",
        "rows": rows,
    }


def markdown_table(results: dict[str, Any]) -> str:
    """The results as a Markdown table plus the KV-cache line."""
    lines = [
        f"Batch {results['batch']}, prefill {results['prefill']} tokens, decode {results['decode']} greedy "
        f"tokens after it; median of {results['rounds']} run(s) (jax: after compiling); "
        f"{results['machine']}.",
        "",
        "| implementation | prefill tokens/s | decode tokens/s | greedy tokens = torch_ref's |",
        "| --- | ---: | ---: | :---: |",
    ]
    for row in results["rows"]:
        prefill = row.get("prefill_tokens_per_s")
        cells = [
            f"{prefill:.3g}" if prefill is not None else "—",
            f"{row['decode_tokens_per_s']:.3g}",
            "yes" if row["same_tokens_as_torch_ref"] else "no",
        ]
        lines.append(f"| {row['implementation']} | {' | '.join(cells)} |")
    config = results["config"]
    lines += [
        "",
        f"KV cache for the full context ({config['context_length']} tokens, {config['n_layers']} blocks, "
        f"float32 keys and values): {results['kv_cache_bytes'] / 2**20:.1f} MiB per sequence.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    context = GPT2_SMALL["context_length"]
    parser.add_argument("--prefill", type=integer("--prefill", 1, context), default=256)
    parser.add_argument("--decode", type=integer("--decode", 1, context), default=32)
    parser.add_argument("--rounds", type=integer("--rounds", 1, 1000), default=1)
    parser.add_argument("--out", default=os.path.join("benchmarks", "gpt"))
    parser.add_argument("--note", default="", help="a line for results.md (the machine's load, say)")
    args = parser.parse_args(argv)
    if args.prefill + args.decode > context:
        parser.error(
            f"--prefill {args.prefill} and --decode {args.decode} exceed the context of {context} tokens"
        )
    os.makedirs(args.out, exist_ok=True)

    def write(results: dict[str, Any]) -> None:
        with open(os.path.join(args.out, "results.json"), "w") as file:
            json.dump(results, file, indent=2)
        note = f"{args.note}\n\n" if args.note else ""
        with open(os.path.join(args.out, "results.md"), "w") as file:
            file.write(
                f"# GPT at GPT-2-small shape\n\n`python -m parity_tests.bench.gpt`\n\n{note}"
                f"{markdown_table(results)}\n"
            )

    results = run_gpt_benchmark(GPT2_SMALL, args.prefill, args.decode, args.rounds, on_row=write)
    print(markdown_table(results))


if __name__ == "__main__":
    main()
