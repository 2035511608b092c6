"""A tiny run of the GPT benchmark: every implementation runs, agrees with torch_ref, and is tabled."""

import pytest

from parity_tests.bench.gpt import kv_cache_bytes, markdown_table, run_gpt_benchmark
from tests.gpt_cases import TINY


@pytest.mark.slow  # builds and compiles five implementations
def test_a_tiny_benchmark_runs_every_implementation():
    results = run_gpt_benchmark(TINY, prefill=6, decode=3, rounds=1)
    names = [row["implementation"] for row in results["rows"]]
    assert len(names) == 5 and names[0] == "torch_ref eager (no KV cache)"
    assert all(row["same_tokens_as_torch_ref"] for row in results["rows"])
    assert all(row["decode_tokens_per_s"] > 0 for row in results["rows"])
    table = markdown_table(results)
    assert table.count("\n| ") == 2 + 5  # the header, its rule, one row per implementation


def test_the_kv_cache_holds_keys_and_values_of_every_block_for_the_whole_context():
    # 2 (keys, values) x 2 blocks x 2 heads x 16 positions x 16 head dims x 4 bytes + 16 padding flags x 2
    assert kv_cache_bytes(TINY) == 2 * 2 * 2 * 16 * 16 * 4 + 2 * 16
