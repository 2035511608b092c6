"""The GPT generation benchmark: its ratios and verdicts from its medians, its table, and a tiny run."""

import json

import pytest

from parity_tests.bench.gpt import (
    LLAMA,
    TARGETS,
    kv_cache_bytes,
    markdown_table,
    ratios,
    run_gpt_benchmark,
    write_results,
)
from tests.decoder_cases import LLAMA as TINY_LLAMA
from tests.gpt_cases import TINY

DECODE = {
    "transformers generate (eager)": 4.0,
    "transformers generate (SDPA)": 2.0,  # transformers' faster: the one compared with
    "numpy_attn.generate": 2.5,
    "jax_attn.generate float32": 1.6,
    "jax_attn.generate bfloat16": 1.0,
    "weight-read pass, torch float32": 0.030,
    "weight-read pass, XLA float32": 0.024,  # the faster pass: the limit, 1 / 0.024 tokens/s
    "weight-read pass, XLA bfloat16": 0.012,
}
PREFILL = {
    "transformers SDPA forward": 0.9,
    "transformers SDPA forward, logits_to_keep=1": 0.7,
    "transformers eager forward": 1.0,
    "jax_attn.generate(prompt, 1)": 0.75,
}


def test_the_ratios_compare_speeds_and_bytes_as_the_targets_say():
    results = {
        "decode_s": DECODE, "prefill_s": PREFILL, "decode_tokens": 64,
        "step_cost": {"float32": {"bytes_accessed": 510e6}}, "weight_bytes": {"float32": 500e6},
    }  # fmt: skip
    assert ratios(results) == pytest.approx(
        {
            "decode_vs_transformers": 2.0 / 1.6,  # 40 tokens/s against transformers' 32
            "decode_vs_limit": (64 / 1.6) / (1 / 0.024),  # 40 tokens/s of 41.7
            "bytes_vs_weights": 1.02,
            "bfloat16_vs_float32": 1.6,
            "prefill_vs_sdpa": 0.9 / 0.75,
            "numpy_vs_transformers": 2.0 / 2.5,
        }
    )
    assert {key for _, key, _, _ in TARGETS} == set(ratios(results))


def test_the_table_says_each_verdict():
    ratios_ = {"decode_vs_transformers": 1.25, "decode_vs_limit": 0.96, "bytes_vs_weights": 1.02,
               "bfloat16_vs_float32": 1.6, "prefill_vs_sdpa": 1.2, "numpy_vs_transformers": 0.8}  # fmt: skip
    results = {
        "config": TINY, "prompt_tokens": 8, "decode_tokens": 64, "prefill_tokens": 512, "rounds": 5,
        "cache_length": 128, "decode_s": DECODE, "prefill_s": PREFILL,
        "same_tokens_as_transformers": {"jax_attn.generate float32": True,
                                        "jax_attn.generate bfloat16": False},
        "weight_bytes": {"float32": 500e6, "bfloat16": 250e6},
        "kv_cache_bytes": {"float32": 4.7e6, "bfloat16": 2.4e6, "float32, whole context": 75e6},
        "step_cost": {"float32": {"bytes_accessed": 510e6, "cache_copies": 0},
                      "bfloat16": {"bytes_accessed": 260e6, "cache_copies": 0}},
        "load_average": {"before": [0.4, 0.5, 0.6], "after": [0.7, 0.6, 0.6]},
        "machine": "x86_64, 2 CPU cores", "versions": {"jax": "0"},
        "targets": [{"target": name, "value": ratios_[key], "threshold": threshold,
                     "met": ratios_[key] <= threshold if at_most else ratios_[key] >= threshold}
                    for name, key, threshold, at_most in TARGETS],
    }  # fmt: skip
    table = markdown_table(results)
    assert "Load average (1, 5, 15 min) before: 0.40, 0.50, 0.60; after: 0.70, 0.60, 0.60." in table
    assert "| jax_attn.generate float32 | 1600.0 ms | 40.0 | yes |" in table
    assert "| jax_attn.generate bfloat16 | 1000.0 ms | 64.0 | no |" in table
    assert "| weight-read pass, XLA float32 | 24.0 ms | 41.7 |  |" in table  # passes per second
    assert "| jax_attn.generate(prompt, 1) | 750.0 ms | 683 |" in table
    assert "| float32 | 510.0 MB | 500.0 MB | 1.020x | 4.7 MB | 0 |" in table
    assert "| bfloat16 decode >= 1.7x float32 decode | 1.60 | **no** |" in table
    assert "| bytes accessed per token <= 1.15x the weights' bytes (float32) | 1.02 | yes |" in table
    assert "| numpy_attn.generate >= 1.0x transformers' generate | 0.80 | **no** |" in table


def test_the_kv_cache_holds_keys_and_values_of_every_block():
    # 2 (keys, values) x 2 blocks x 2 heads x 16 positions x 16 head dims x 4 bytes + 16 padding flags x 2
    assert kv_cache_bytes(TINY) == 2 * 2 * 2 * 16 * 16 * 4 + 2 * 16
    assert kv_cache_bytes(TINY, length=8, itemsize=2) == 2 * 2 * 2 * 8 * 16 * 2 + 2 * 8
    # a grouped cache: 2 (keys, values) x 2 blocks x 2 key/value heads (of 4 query heads) x 16 x 8 x 4
    assert kv_cache_bytes(TINY_LLAMA) == 2 * 2 * 2 * 16 * 8 * 4 + 2 * 16


@pytest.mark.xdist_group("transformers")  # on the worker that runs tests/test_gpt_hf.py: one import
def test_a_tiny_benchmark_runs_every_row_and_agrees_with_transformers(tmp_path):
    """The whole module on tiny configs (transformers' GPT-2 built and loaded twice, its Llama once,
    eight programs compiled): every row runs and is tabled; no timing is asserted."""
    results = run_gpt_benchmark(
        TINY, prompt_tokens=3, decode_tokens=4, prefill_tokens=6, rounds=1, pause_s=0, log=print,
        llama_cfg=TINY_LLAMA,
    )  # fmt: skip
    assert len(results["decode_s"]) == 11 and len(results["prefill_s"]) == 4
    assert all(seconds > 0 for seconds in [*results["decode_s"].values(), *results["prefill_s"].values()])
    same = results["same_tokens_as_transformers"]
    assert same["transformers generate (SDPA)"] and same["numpy_attn.generate"]
    assert same["jax_attn.generate float32"]
    assert same[f"numpy_attn.generate, {LLAMA}"] and same[f"jax_attn.generate float32, {LLAMA}"]
    assert results["step_cost"]["float32"]["cache_copies"] == 0
    assert results["step_cost"][f"float32, {LLAMA}"]["cache_copies"] == 0
    assert results["llama_cfg"]["n_kv_groups"] == TINY_LLAMA["n_kv_groups"]
    assert len(results["targets"]) == len(TARGETS)
    results["command"] = "python -m parity_tests.bench.gpt (tiny)"
    write_results(str(tmp_path), results, markdown_table(results))
    assert json.loads((tmp_path / "results.json").read_text())["cache_length"] == 16
    assert (tmp_path / "results.md").read_text().startswith("# Generation at GPT-2-small shape")
    assert f"| jax_attn.generate float32, {LLAMA} |" in (tmp_path / "results.md").read_text()
