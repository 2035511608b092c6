"""Property tests of the weight files: whatever the bytes, loading returns exactly what was saved
or raises ValueError/TypeError, and a file written by ``save_weights`` refuses any change.

The default run is small (about 10 s); ``-m slow`` runs many more hypothesis examples."""

import json
import struct

import numpy as np
import pytest
import safetensors.numpy
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from numpy_attn import load_weights, save_weights

FORMATS = [".safetensors", ".npz"]
FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
SLOW = settings(max_examples=2000, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


def small_params():
    rng = np.random.default_rng(0)
    return {
        "W_query.weight": rng.standard_normal((2, 3)).astype(np.float32),
        "W_query.bias": rng.standard_normal(2).astype(np.float32),
    }


def assert_same(actual, expected):
    assert list(actual) == list(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype and actual[name].shape == value.shape
        np.testing.assert_array_equal(actual[name].view(np.uint8), np.ascontiguousarray(value).view(np.uint8))


def load_or_refuse(path):
    """The arrays of ``path``, or None if loading raised ValueError/TypeError (anything else fails)."""
    try:
        return load_weights(path)
    except (ValueError, TypeError):
        return None


def flips_that_load(tmp_path, suffix, bits, params=None):
    """The ``bits`` of a saved file that, flipped alone, still let it load, each checked to load
    exactly what was saved. Each altered file is written over the one before, in place: a file
    truncated and written again is flushed to disk on some file systems (ext4), 3 ms a flip."""
    params = small_params() if params is None else params
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    blob = path.read_bytes()
    loaded = []
    for bit in bits(len(blob)):
        altered = bytearray(blob)
        altered[bit // 8] ^= 1 << (bit % 8)
        with open(path, "r+b") as file:
            file.write(altered)
        arrays = load_or_refuse(path)
        if arrays is not None:
            assert_same(arrays, params)
            loaded.append(bit)
    return loaded


@pytest.mark.parametrize("suffix", FORMATS)
def test_a_single_bit_flip_in_any_byte_is_refused(tmp_path, suffix):
    """Each byte of the file (header, names, offsets, zip records, padding, data, the integrity
    record itself) with one of its bits flipped (a seeded choice) makes loading raise."""
    rng = np.random.default_rng(0)
    bits = lambda size: [8 * i + b for i, b in enumerate(rng.integers(0, 8, size))]  # noqa: E731
    assert flips_that_load(tmp_path, suffix, bits) == []


@pytest.mark.parametrize("suffix", FORMATS)
def test_every_bit_flip_in_a_file_with_a_non_ascii_name_is_refused(tmp_path, suffix):
    """A non-ASCII name ("café", two bytes of UTF-8 in the safetensors header and the zip): every
    single bit flipped anywhere in the file is refused."""
    params = {"café": np.float32([1, 2])}
    assert flips_that_load(tmp_path, suffix, lambda size: range(8 * size), params) == []


def test_the_record_covers_what_the_header_says_not_how_its_json_spells_it(tmp_path):
    """The safetensors library writes "café" in UTF-8; the same header with the name spelled
    "caf\\u00E9" (a JSON escape: the same name) loads exactly what was saved."""
    params = {"café": np.float32([1, 2])}
    path = tmp_path / "w.safetensors"
    save_weights(path, params)
    blob = path.read_bytes()
    (size,) = struct.unpack("<Q", blob[:8])
    header = blob[8 : 8 + size].replace('"café"'.encode(), b'"caf\\u00E9"')
    assert header != blob[8 : 8 + size]
    path.write_bytes(struct.pack("<Q", len(header)) + header + blob[8 + size :])
    assert_same(load_weights(path), params)


@pytest.mark.slow
@pytest.mark.parametrize("suffix", FORMATS)
def test_every_single_bit_flip_is_refused(tmp_path, suffix):
    assert flips_that_load(tmp_path, suffix, lambda size: range(8 * size)) == []


names = st.text(st.characters(blacklist_categories=["Cs"], blacklist_characters="\0"), max_size=12).filter(
    lambda name: name not in ("__metadata__", "__attn_parity__")
)
# ">": big-endian, stored little-endian and loaded in native order
dtypes = st.sampled_from([np.float16, np.float32, np.float64, np.dtype(">f4"), np.dtype(">f8")])
shapes = st.lists(st.integers(0, 3), min_size=1, max_size=3)


@st.composite
def weight_dicts(draw):
    keys = draw(st.lists(names, min_size=1, max_size=4, unique=True))
    dtype = draw(dtypes)  # weights share one dtype
    rng = np.random.default_rng(draw(st.integers(0, 2**16)))
    return {key: rng.standard_normal(draw(shapes)).astype(dtype) for key in keys}


def native(params):
    return {k: v.astype(v.dtype.newbyteorder("=")) for k, v in params.items()}


def check_round_trip(tmp_path, suffix, params):
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    assert_same(load_weights(path), native(params))
    if suffix == ".safetensors":  # the library reads our files
        theirs = safetensors.numpy.load_file(path)
        assert_same({k: theirs[k] for k in params}, native(params))


@FAST
@given(params=weight_dicts(), suffix=st.sampled_from(FORMATS))
def test_any_weights_round_trip_exactly(tmp_path, params, suffix):
    check_round_trip(tmp_path, suffix, params)


@FAST
@given(params=weight_dicts(), data=st.data(), suffix=st.sampled_from(FORMATS))
def test_altered_files_are_refused_or_load_what_was_saved(tmp_path, params, data, suffix):
    """Overwrite, cut or insert bytes anywhere: a changed file written by ``save_weights`` is
    refused, except where the change keeps the file's meaning (e.g. JSON whitespace)."""
    path = tmp_path / f"w{suffix}"
    save_weights(path, params)
    blob = bytearray(path.read_bytes())
    start = data.draw(st.integers(0, len(blob)))
    cut = data.draw(st.integers(0, 8))
    blob[start : start + cut] = data.draw(st.binary(max_size=8))
    path.write_bytes(bytes(blob))
    loaded = load_or_refuse(path)
    if loaded is not None:
        assert_same(loaded, native(params))


json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=5), inner, max_size=4),
    max_leaves=20,
)
entries = st.fixed_dictionaries(
    {},
    optional={
        "dtype": st.sampled_from(["F32", "F16", "F64", "BF16", "I64", "BOOL"]) | json_values,
        "shape": st.lists(st.integers(-2, 2**40), max_size=3) | json_values,
        "data_offsets": st.lists(st.integers(-2, 2**40), max_size=3) | json_values,
    },
)
names_in_headers = st.sampled_from(["a", "b", "__metadata__"]) | st.text(max_size=4)
headers = st.dictionaries(names_in_headers, entries | json_values)


@FAST
@given(header=headers | json_values, data=st.binary(max_size=64))
def test_any_safetensors_header_loads_or_raises_a_clear_error(tmp_path, header, data):
    """Whatever the header, loading raises nothing but ValueError/TypeError, and ends. The checks of
    the header are held against the safetensors library, which reads the data: they refuse every
    file the library refuses, with their own message, before the library is called, and a file
    they accept loads as the library loads it."""
    encoded = json.dumps(header).encode()
    path = tmp_path / "w.safetensors"
    path.write_bytes(struct.pack("<Q", len(encoded)) + encoded + data)
    try:
        actual = load_weights(path)
    except (ValueError, TypeError) as error:
        assert "is not a readable safetensors file" not in str(error)
        return
    expected = safetensors.numpy.load_file(path)
    assert_same(actual, {name: expected[name] for name in actual})


@pytest.mark.slow
@SLOW
@given(params=weight_dicts(), data=st.data())
def test_many_altered_safetensors_files(tmp_path, params, data):
    check_round_trip(tmp_path, ".safetensors", params)
    test_altered_files_are_refused_or_load_what_was_saved.hypothesis.inner_test(
        tmp_path, params, data, ".safetensors"
    )


@pytest.mark.slow
@SLOW
@given(params=weight_dicts(), data=st.data())
def test_many_altered_npz_files(tmp_path, params, data):
    check_round_trip(tmp_path, ".npz", params)
    altered = test_altered_files_are_refused_or_load_what_was_saved.hypothesis.inner_test
    altered(tmp_path, params, data, ".npz")


@pytest.mark.slow
@SLOW
@given(header=headers | json_values, data=st.binary(max_size=64))
def test_many_safetensors_headers(tmp_path, header, data):
    test_any_safetensors_header_loads_or_raises_a_clear_error.hypothesis.inner_test(tmp_path, header, data)
