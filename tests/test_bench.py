"""The benchmark suite's machinery on its tiny shape (no timing is asserted: timings are noisy)."""

import json
import re
import subprocess
import sys

import numpy as np
import pytest

from parity_tests.bench.implementations import IMPLEMENTATIONS, SHAPES, layer_flops, make_call, make_inputs
from parity_tests.bench.output import README_END, README_START, markdown_table, update_readme, write_chart
from parity_tests.bench.run import run_benchmark
from parity_tests.compare import compare_arrays
from parity_tests.tolerances import TOLERANCES


@pytest.mark.parametrize("name", list(IMPLEMENTATIONS))
def test_every_implementation_computes_the_same_layer(name):
    shape = SHAPES["B2_T6_d3to4"]
    params, x = make_inputs(shape)
    expected = make_call("torch_ref", shape, params, x)()
    row = compare_arrays("output", expected, make_call(name, shape, params, x)())
    assert row.ok, row


def test_flop_count_by_hand():
    # B=2, T=6, D=E=4: projections 2*2*6*4*12 + 2*2*6*4*4 = 1152 + 384; attention 2*2*36*4 = 576
    assert layer_flops(SHAPES["B2_T6_d3to4"].__class__("s", 2, 6, 4, 4, 2)) == 1152 + 384 + 576


def test_gemm_peak_is_the_median_throughput_of_a_square_float32_product():
    from parity_tests.bench.run import gemm_peak

    assert 0.01 < gemm_peak(size=128, rounds=3) < 10_000  # GFLOP/s of a 128^3 product


def test_benchmark_results_table_chart_and_readme(tmp_path, monkeypatch):
    monkeypatch.setattr("parity_tests.bench.run.gemm_peak", lambda: 100.0)  # skip the 4096^3 GEMMs
    results = run_benchmark(["B2_T6_d3to4"], ["torch_sdpa", "numpy_reference", "jax_blockwise"], rounds=2,
                            memory=False, decode=False)  # fmt: skip
    json.dumps(results)  # JSON-ready
    rows = results["results"]
    assert [r["implementation"] for r in rows] == ["torch_sdpa", "numpy_reference", "jax_blockwise"]
    for row in rows:
        assert len(row["samples_s"]) == 2 and row["median_s"] > 0
        assert row["gflops"] == pytest.approx(layer_flops(SHAPES["B2_T6_d3to4"]) / row["median_s"] / 1e9)
    assert rows[0]["ratio_to_torch_sdpa"] == 1.0
    assert results["gemm_peak_gflops"] == 100.0
    assert rows[1]["pct_of_gemm_peak"] == pytest.approx(rows[1]["gflops"])  # a peak of 100 GFLOP/s
    table = markdown_table(results)
    assert table.count("| B2_T6_d3to4 |") == 3 and "1.00x" in table
    write_chart(results, tmp_path / "chart.png")
    assert (tmp_path / "chart.png").read_bytes()[:4] == b"\x89PNG"
    readme = tmp_path / "README.md"
    readme.write_text(f"before\n{README_START}\nold table\n{README_END}\nafter\n")
    update_readme(results, readme)
    text = readme.read_text()
    assert (
        "old table" not in text and table in text and text.startswith("before") and text.endswith("after\n")
    )


def test_too_big_and_repeated_implementations_are_skipped_not_run():
    from parity_tests.bench.run import skip_reason

    assert "24 GiB" in skip_reason("numpy_reference", SHAPES["B1_T16384"])
    assert skip_reason("numpy_blockwise", SHAPES["B1_T16384"]) is None
    assert skip_reason("torch_ref", SHAPES["B8_T1024"]) is None
    assert "blockwise path from 512" in skip_reason("jax_auto", SHAPES["B8_T1024"])  # same as jax_blockwise
    assert skip_reason("jax_auto", SHAPES["B2_T6_d3to4"]) is None
    assert skip_reason("numpy_auto", SHAPES["B2_T6_d3to4"]) is None


def test_memory_is_measured_in_a_fresh_process():
    command = [sys.executable, "-m", "parity_tests.bench.memory", "numpy_blockwise", "B2_T6_d3to4"]
    out = subprocess.run(command, capture_output=True, text=True, check=True)
    result = json.loads(out.stdout)
    assert result["implementation"] == "numpy_blockwise" and isinstance(result["extra_bytes"], int)
    assert 0 <= result["extra_bytes"] < 50 * 2**20  # a tiny call allocates next to nothing


def test_decode_speed_reports_both_paths():
    from parity_tests.bench.run import decode_speed

    result = decode_speed("numpy", tokens=32, steps=2, rounds=1)
    assert result["cached_tokens_per_s"] > 0 and result["recompute_tokens_per_s"] > 0
    assert np.isclose(result["speedup"], result["cached_tokens_per_s"] / result["recompute_tokens_per_s"])


def test_profile_times_every_stage_of_every_framework(monkeypatch):
    from parity_tests.bench import profile

    monkeypatch.setattr(profile, "gemm_peak", lambda: 100.0)  # skip the 4096^3 GEMMs
    rows = profile.profile_stages("B2_T6_d3to4", rounds=2)
    assert [(r["framework"], r["stage"]) for r in rows] == [
        (framework, stage) for framework in ("torch", "numpy", "jax") for stage in profile.STAGES
    ]
    # B=2, T=6, D=3, E=4: QKV 2*2*6*3*12 = 864 FLOP, the core 2*2*36*4 = 576, the output 2*2*6*4*4 = 384
    expected_flops = {
        "QKV projection": 864,
        "attention core": 576,
        "output projection": 384,
        "whole layer": 1824,
    }
    for row in rows:
        assert row["median_s"] > 0 and row["cores_used"] >= 0
        assert row["gflops"] == pytest.approx(expected_flops[row["stage"]] / row["median_s"] / 1e9)
        assert row["pct_of_gemm_peak"] == pytest.approx(row["gflops"])  # a peak of 100 GFLOP/s
    table = profile.markdown_profile(rows)
    assert table.count("\n| B2_T6_d3to4 |") == 12 and "| numpy | attention core |" in table


HLO = """HloModule jit_f, entry_computation_layout={(f32[4,8]{1,0})->f32[8,4]{1,0}}

%fused_computation (param_0: f32[4,8]) -> f32[4,8] {
  ROOT %dot.1 = f32[4,4]{1,0} dot(%param_0, %param_0), lhs_contracting_dims={1}, rhs_contracting_dims={1}
}

ENTRY %main.2 (w.1: f32[8,8], x.1: f32[4,8]) -> f32[8,4] {
  %w.1 = f32[8,8]{1,0} parameter(0), metadata={op_name="w"}
  %x.1 = f32[4,8]{1,0} parameter(1), metadata={op_name="x"}
  %constant.3 = f32[] constant(0)
  %bitcast = f32[8,4]{1,0} bitcast(%x.1)
  %dot = f32[8,4]{1,0} dot(%w.1, %x.1), lhs_contracting_dims={0}, rhs_contracting_dims={1}
  %ynn_fusion = f32[4,8]{1,0} fusion(%x.1, %w.1), kind=kCustom, calls=%fused_computation, YNN
  ROOT %exp_fusion = f32[8,4]{1,0} fusion(%dot), kind=kLoop, calls=%fused_computation.1
}
"""
YNN = 'backend_config={"fusion_config":{"kind":"__ynn_fusion"}}'
HLO = HLO.replace("YNN", YNN)


def test_kernels_of_a_compiled_program_by_kind_and_shape():
    from parity_tests.bench.hlo import kernel_difference, kernels

    expected = {"dot f32[8,4]": 1, "__ynn_fusion f32[4,8]": 1, "kLoop f32[8,4]": 1}
    actual = kernels(HLO)
    assert actual == expected  # parameters, constants, bitcasts and fused computations' insides left out
    assert kernel_difference(actual, actual) == "same"
    ynn_only = re.sub(r"%dot = .*", f"%dot = f32[8,4]{{1,0}} fusion(%w.1), kind=kCustom, {YNN}", HLO)
    assert kernel_difference(kernels(ynn_only), actual) == "+1x dot f32[8,4]; -1x __ynn_fusion f32[8,4]"


def test_a_flax_module_compiles_to_the_kernels_of_its_function():
    # SelfAttentionV2's (in, out) key kernel: scores written as queries @ keys.T let XLA fold the
    # transpose into the keys' projection, a dot on the kernel's first axis that XLA:CPU ran with
    # its generic kernel where the function's (out, in) weight got YNNPACK's
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_attn
    from parity_tests.bench.hlo import kernel_difference, kernels

    module = jax_attn.SelfAttentionV2(16, 16, rngs=nnx.Rngs(0))
    x = jnp.asarray(np.random.default_rng(0).standard_normal((8, 16)), jnp.float32)
    params = {name: jnp.asarray(value) for name, value in module.to_params().items()}
    graphdef, state = nnx.split(module)
    module_program = jax.jit(lambda state, x: nnx.merge(graphdef, state)(x)).lower(state, x).compile()
    function_program = jax.jit(jax_attn.self_attention_v2).lower(params, x).compile()
    expected, actual = kernels(function_program.as_text()), kernels(module_program.as_text())
    assert kernel_difference(expected, actual) == "same"


def test_floor_of_the_small_call_computes_the_layer_and_is_timed_against_torch_sdpa():
    from parity_tests.bench.floor import markdown_floor, measure_floor, numpy_small_floor

    shape = SHAPES["B2_T6_d3to4"]
    params, x = make_inputs(shape)
    expected = make_call("numpy_reference", shape, params, x)()
    actual = numpy_small_floor(shape, params, x)()
    rtol, atol = TOLERANCES["float32"]
    np.testing.assert_allclose(actual, expected, rtol=rtol, atol=atol)
    rows = measure_floor("B2_T6_d3to4", rounds=1)
    assert rows[0]["what"] == "torch SDPA layer" and rows[0]["ratio"] == 1.0
    assert all(row["median_s"] > 0 for row in rows)
    table = markdown_floor(rows)
    assert "| B2_T6_d3to4 | numpy layer (auto) |" in table and "<= 25 us" in table and "<= 40 us" in table


def test_the_small_call_is_timed_in_a_process_of_one_framework():
    command = ["-m", "parity_tests.bench.small", "--framework", "numpy", "--rounds", "2", "--calls", "3"]
    out = subprocess.run([sys.executable, *command], capture_output=True, text=True, check=True).stdout
    assert "| numpy layer (auto) |" in out and "<= 25 us" in out and "| numpy floor:" in out
    assert "| numpy checks: the layer's check_layer call |" in out
    assert out.splitlines()[-1] == "frameworks imported: numpy"
    from parity_tests.bench.small import main

    with pytest.raises(SystemExit):  # JAX's dispatch setting is refused for NumPy
        main(["--framework", "numpy", "--sync-dispatch"])


def test_the_small_jax_call_is_timed_against_its_dispatch():
    from parity_tests.bench.small import measure_small

    rows = measure_small("jax", rounds=2, calls=3)
    assert [row["what"].split()[:2] for row in rows] == [["jax", "layer"], ["jax", "dispatch:"]]
    assert all(0 < row["best_s"] <= row["median_s"] for row in rows)
    with pytest.raises(ValueError, match="framework must be one of"):
        measure_small("torch")


def test_the_small_jax_call_can_run_on_the_calling_thread():
    command = ["-m", "parity_tests.bench.small", "--framework", "jax", "--sync-dispatch", "--rounds", "1"]
    out = subprocess.run(
        [sys.executable, *command, "--calls", "2"], capture_output=True, text=True, check=True
    )
    assert "| jax layer (auto, jitted) |" in out.stdout
    assert "jax_cpu_enable_async_dispatch: False" in out.stdout.splitlines()


def test_weights_io_saves_and_loads_each_format_in_fresh_processes(tmp_path):
    from parity_tests.bench.weights_io import markdown_weights_io, measure_weights_io

    rows = measure_weights_io(1 / 64, (".safetensors", ".npz"), str(tmp_path))  # 16 MiB of weights
    assert [(row.suffix, row.operation) for row in rows] == [
        (".safetensors", "save"), (".safetensors", "load"), (".npz", "save"), (".npz", "load")
    ]  # fmt: skip
    assert all(row.seconds > 0 and row.weights_bytes == 2**24 for row in rows)
    loads = [row for row in rows if row.operation == "load"]
    assert all(row.extra_bytes >= row.weights_bytes for row in loads)  # the weights it returns
    assert list(tmp_path.iterdir()) == []  # the files are removed
    assert markdown_weights_io(rows).count("\n") == len(rows) + 1


def _out_of_range(flag: str, text: str, high: int) -> str:
    return f"argument {flag}: {flag} {text!r}: expected an integer from 1 to {high}"


@pytest.mark.parametrize(
    "module, argv, message",
    [
        ("dot_bound", ["--query-blocks", "0"], _out_of_range("--query-blocks", "0", 65536)),
        ("floor", ["--rounds", "-1"], _out_of_range("--rounds", "-1", 1000)),
        ("gpt", ["--decode", "1025"], _out_of_range("--decode", "1025", 1024)),
        (
            "gpt",
            ["--prompt", "1000", "--decode", "32"],
            "--prompt 1000 and --decode 32 exceed the context of 1024 tokens",
        ),
        ("profile", ["--rounds", "x"], _out_of_range("--rounds", "x", 1000)),
        ("small", ["--framework", "numpy", "--calls", "0"], _out_of_range("--calls", "0", 1_000_000)),
    ],
)
def test_the_bench_scripts_refuse_integer_options_out_of_range(module, argv, message, capsys):
    """They read their integer options with the CLI's parser (`usage.integer`): `--rounds 0` or a
    negative count ran no round and failed on an empty median, a huge prefill past the context."""
    import importlib

    main = importlib.import_module(f"parity_tests.bench.{module}").main
    with pytest.raises(SystemExit) as exit_info:
        main(argv)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1].endswith(f"error: {message}")
