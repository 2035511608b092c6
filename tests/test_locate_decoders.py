"""The modern decoders' bug catalogue: RoPE, grouped-query heads and RMSNorm bugs planted one line at
a time in a NumPy and a JAX port of torch_ref's GroupedQueryAttention (``tests/ports/
decoder_catalogue.py``) are located on their line with the cause the numbers show, and the ports
without bugs pass."""

import numpy as np
import pytest

from parity_tests.locate import locate
from tests.ports.catalogue import plant
from tests.ports.decoder_catalogue import BUGS, PORTS, candidate, inputs, reference
from torch_ref import to_params

INTERLEAVED = "RoPE pairs interleaved: yours takes the odd entries of each head"
BASE = (
    "RoPE base differs: yours are the inverse frequencies base ** (-2i/H) of base 10000, the reference's of "
    "base 500000"
)
POSITIONS = "positions off by +1: yours start at 1, the reference's at 0"
ON_VALUES = "RoPE applied where the reference applies none"
MISSING = "RoPE missing: yours is the reference's value rotated back"
TILED = "key/value heads in tile order: your head n holds group n % 2 (np.tile / jnp.tile)"
ONE_PLUS = "(1 + weight) offset"
EPS = "eps differs: yours is 1/sqrt(mean square + eps) with eps larger by 9e-06 than the reference's"

# bug -> (the located line's offset from the planted line, first divergence, the cause it starts with)
EXPECTED = {
    "np_rope_interleaved_pairs": (0, "__getitem__", INTERLEAVED),
    "np_rope_base_10000": (0, "tensor", BASE),
    "np_rope_query_positions_from_one": (0, "cat", POSITIONS),
    "np_rope_on_values_too": (0, "__getitem__", ON_VALUES),
    "np_rope_missing_on_keys": (1, "cat", MISSING),
    "np_kv_heads_tiled": (0, "repeat_interleave", TILED),
    "np_rms_norm_eps": (0, "rsqrt", EPS),
    "np_rms_norm_one_plus_weight": (0, "mul", "yours is the reference's normalised value times one factor"),
    "jax_rope_interleaved_pairs": (0, "__getitem__", INTERLEAVED),
    "jax_rope_base_10000": (0, "tensor", BASE),
    "jax_rope_on_values_too": (0, "repeat_interleave", ON_VALUES),
    "jax_rope_missing_on_keys": (1, "__getitem__", MISSING),
    "jax_kv_heads_tiled": (0, "repeat_interleave", TILED),
    "jax_rms_norm_eps": (0, "rsqrt", EPS),
    "jax_rms_norm_one_plus_weight": (0, "mul", ONE_PLUS),
}
# Where the step compared does not tell the bug, the line's other values do:
# - np_rope_on_values_too: the values' halves are set against the keys' halves inside rope(); the
#   rotation the statement returns for the values is the reference's values rotated;
# - np_rope_missing_on_keys: the unrotated keys are repeated and set against the reference's
#   rotate_half of the rotated ones; the keys the line takes are the reference's rotated keys
#   rotated back.
# (*_rms_norm_eps, 1e-5 for 1e-6: the line's value is the reference's times one factor per row,
# and that factor times the reference's rsqrt(mean square + eps) is the same with eps + 9e-6.)
# A rotation left out is located on the first line using the unrotated keys (the planted line is a
# `pass`): the line after it.


def run(port, source, directory, qk_norm):
    ref = reference(qk_norm)
    return locate(ref, candidate(port, source, directory), inputs(), params=to_params(ref))


def test_the_catalogue_is_expected_in_full():
    assert sorted(EXPECTED) == sorted(b.name for b, _ in BUGS if b.name in EXPECTED)
    assert [name for name, (_, _, cause) in EXPECTED.items() if cause is None] == []


@pytest.mark.parametrize(
    "bug, qk_norm", [b for b in BUGS if b[0].name in EXPECTED], ids=lambda b: getattr(b, "name", "")
)
def test_planted_decoder_bug_is_located_with_its_cause(bug, qk_norm, tmp_path):
    offset, step, cause = EXPECTED[bug.name]
    source, line = plant(bug)
    report = run(bug.port, source, tmp_path, qk_norm)
    assert not report.ok
    assert report.candidate_location == f"{tmp_path / bug.port}.py:{line + offset}", f"\n{report}"
    assert report.first_divergence == step, f"\n{report}"
    assert any(c.startswith(cause) for c in report.causes), f"\n{report}"


@pytest.mark.parametrize("qk_norm", [False, True])
@pytest.mark.parametrize("port", list(PORTS))
def test_the_decoder_ports_without_bugs_pass(port, qk_norm, tmp_path):
    report = run(port, None, None, qk_norm)
    assert report.ok, f"\n{report}"
    assert report.verified


def test_positions_shifted_for_queries_and_keys_alike_pass(tmp_path):
    """RoPE scores depend on the positions' differences only: positions 1..T for the queries and the
    keys alike give the reference's output, so locate reports no divergence (jax_rope_positions_from_one
    is no bug at the output; the NumPy port's shift of the queries alone is located)."""
    bug, qk_norm = next(b for b in BUGS if b[0].name == "jax_rope_positions_from_one")
    source, _ = plant(bug)
    assert run(bug.port, source, tmp_path, qk_norm).ok


# --- the causes read from the numbers, on values built for them -----------------------------------


def _rotate(x, angles):
    half = x.shape[-1] // 2
    c, s = np.cos(angles), np.sin(angles)
    return np.concatenate([x[..., :half] * c - x[..., half:] * s, x[..., :half] * s + x[..., half:] * c], -1)


def _tables(tokens=16, head_dim=8, base=10_000.0):
    freq = base ** (-np.arange(0, head_dim, 2) / head_dim)
    return freq, np.arange(tokens)[:, None] * freq[None, :]


@pytest.mark.parametrize(
    "make, cause",
    [
        (lambda x, angles, freq: _rotate(x, angles), "RoPE applied where the reference applies none"),
        (lambda x, angles, freq: _rotate(x, -angles), "RoPE missing"),
        (lambda x, angles, freq: _rotate(x, angles * (freq[None, :] ** -0.5 - 1)), "RoPE frequencies differ"),
        (lambda x, angles, freq: _rotate(x, np.broadcast_to(freq, angles.shape)), "RoPE positions off by +1"),
        (
            lambda x, angles, freq: _rotate(x, np.broadcast_to(-2 * freq, angles.shape)),
            "RoPE positions off by -2",
        ),
    ],
)
def test_rope_causes_read_the_rotation_between_the_values(make, cause):
    from parity_tests.locate.causes import rope_causes

    freq, angles = _tables()
    x = np.random.default_rng(0).standard_normal((2, 3, 16, 8))
    assert [c[: len(cause)] for c in rope_causes(x, make(x, angles, freq), 1e-5, 1e-6)] == [cause]
    assert rope_causes(x, x * 1.01, 1e-5, 1e-6) == []  # a scale is no rotation
    assert rope_causes(x, -x, 1e-5, 1e-6) == []  # nor a sign (each pair turned by pi)


def test_rope_causes_read_frequencies_and_positions():
    from parity_tests.locate.causes import rope_causes

    freq, _ = _tables(base=500_000.0)
    other, _ = _tables(base=10_000.0)
    assert rope_causes(freq, other, 1e-5, 1e-6)[0].startswith("RoPE base differs")
    scaled = freq.copy()
    scaled[2:] /= 8  # Llama 3's low frequencies divided by its factor
    assert rope_causes(scaled, freq, 1e-5, 1e-6)[0].startswith("RoPE frequencies not scaled")
    assert rope_causes(np.arange(16.0), np.arange(16.0) - 1, 1e-5, 1e-6)[0].startswith("positions off by -1")


def test_norm_causes_read_the_eps_and_the_weight_offset():
    from parity_tests.locate.causes import norm_causes

    x = np.random.default_rng(0).standard_normal((2, 4, 16, 8))
    mean_square = np.mean(x**2, axis=-1, keepdims=True)
    cause = norm_causes(1 / np.sqrt(mean_square + 1e-6), 1 / np.sqrt(mean_square + 1e-5))
    assert cause[0].startswith("eps differs: yours is 1/sqrt(mean square + eps) with eps larger by 9e-06")
    normalised, weight = x / np.sqrt(mean_square + 1e-6), np.linspace(0.5, 1.5, 8)
    assert norm_causes(normalised * weight, normalised * (1 + weight))[0].startswith("(1 + weight) offset")
