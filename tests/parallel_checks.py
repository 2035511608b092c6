"""The multi-device half of tests/test_parallel.py, run as ``python -m tests.parallel_checks OUT``.

XLA's host device count is fixed when jax is imported, so these checks run in a process of
their own with 8 CPU devices; one process runs them all (jax's start-up costs seconds). Each
check computes the single-device result (``expected``) and the sharded one (``actual``) and
saves both to ``OUT/arrays.npz`` as ``<check>/expected`` and ``<check>/actual``; the tests
compare them with the tolerance table. Shardings, compiled memory and HLO shapes go to
``OUT/measures.json``. The checks run in ``SECTIONS``, each on its own: a section that fails
leaves its traceback in ``measures["errors"]`` (its tests fail with it) and the others run. The
tables below are all the tests need to know: importing this module imports no jax.
"""

from __future__ import annotations

import fcntl
import functools
import json
import os
import pathlib
import re
import subprocess
import sys
import traceback
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

DEVICES = 8
# mesh name -> (shape, axis names, ring_attention's batch_axis/head_axis, variants checked on it)
RING_MESHES = {
    "seq8": ((8,), ("seq",), {}, ("causal", "causal_padded_zigzag", "bidirectional_padded")),
    "data2_seq4": ((2, 4), ("data", "seq"), {"batch_axis": "data"}, ("causal_padded_zigzag",)),
    "seq4_model2": ((4, 2), ("seq", "model"), {"head_axis": "model"}, ("causal_padded_zigzag",)),
}
# meshes of Explicit axes (jax.make_mesh's default; the others are Auto); gradients under jax.set_mesh
EXPLICIT_RING_MESHES = {"data2_seq4": ("causal_padded_zigzag",)}
# variant -> (causal, padding mask, load_balance)
RING_VARIANTS = {
    "causal": (True, False, False),
    "causal_padded_zigzag": (True, True, True),
    "bidirectional_padded": (False, True, False),
}
RING_PARTS = ("forward", "d_queries", "d_keys", "d_values")
# eager jax.grad on one mesh after another (the second once raised a sharding error naming the first)
EAGER_RING_MESHES = ("seq8", "data2_seq4")
# mesh name -> ("data", "model") sizes
MODEL_MESHES = {"data8": (8, 1), "data2_model4": (2, 4), "data4_model2": (4, 2)}
# model -> (meshes, parts checked); every parameter's placement is recorded on each mesh
MODELS = {
    "gpt": (tuple(MODEL_MESHES), ("logits", "loss", "grads", "sgd_step")),
    "multi_head_attention": (("data2_model4",), ("output", "grads")),
    "fused_causal_attention": (("data2_model4",), ("output", "grads")),
}
RING_SIZES = (1, 2, 4, 8)  # the memory measurements: T fixed, the ring grows
MEMORY_SHAPE = (1, 2, 1024, 16)  # (B, N, T, H)
DATA_SIZES = (1, 2, 4, 8)  # the data-parallel GPT forward: B fixed, the "data" axis grows
KEEP_MASK_SHAPE = (8, 4, 8, 8)  # (B, N, T, S): a dropout keep-mask drawn with B and N sharded
KEEP_MASK_MESH = "data2_model4"

CHECKS = [
    *(
        f"ring/{mesh}/{variant}/{part}"
        for mesh, (*_, variants) in RING_MESHES.items()
        for variant in variants
        for part in RING_PARTS
    ),
    *(
        f"ring_explicit/{mesh}/{variant}/{part}"
        for mesh, variants in EXPLICIT_RING_MESHES.items()
        for variant in variants
        for part in RING_PARTS
    ),
    *(
        f"{model}/{mesh}/{part}"
        for model, (meshes, parts) in MODELS.items()
        for mesh in meshes
        for part in parts
    ),
    *(f"ring_eager/{mesh}/d_queries" for mesh in EAGER_RING_MESHES),
    f"keep_mask/{KEEP_MASK_MESH}/mask",
]

# the sections of the checks, run one after another; a check belongs to the first whose prefix it has
SECTIONS = {
    "ring": ("ring/", "ring_explicit/", "ring_eager/"),
    "ring_memory": ("ring_memory/", "ring_dims/", "reference_dims"),
    "keep_mask": ("keep_mask/",),
    "models": (*(f"{model}/" for model in MODELS), "gpt_memory/"),
}


def section_of(name: str) -> str:
    """The section that computes the check or measure ``name``."""
    return next(section for section, prefixes in SECTIONS.items() if name.startswith(prefixes))


ROOT = pathlib.Path(__file__).resolve().parents[1]
GPT_CONFIG = {
    "vocab_size": 64, "context_length": 8, "emb_dim": 32, "n_heads": 4, "n_layers": 1,
    "drop_rate": 0.0, "qkv_bias": True,
}  # fmt: skip


@dataclass
class Results:
    """What the checks saved: both sides of each check (``record``), and the measures."""

    arrays: dict[str, np.ndarray] = field(default_factory=dict)
    measures: dict[str, object] = field(default_factory=dict)

    def record(self, name: str, expected, actual) -> None:
        self.arrays[f"{name}/expected"] = np.asarray(expected)
        self.arrays[f"{name}/actual"] = np.asarray(actual)


def auto_mesh(shape, names, devices=None):
    """A mesh of ``AxisType.Auto`` axes (shardings are hints XLA propagates)."""
    import jax
    from jax.sharding import AxisType

    return jax.make_mesh(shape, names, axis_types=(AxisType.Auto,) * len(shape), devices=devices)


def mesh_axes(x) -> list[str | None]:
    """The mesh axis of each axis of ``x`` (None: not split)."""
    spec = x.sharding.spec
    return [*spec, *[None] * (x.ndim - len(spec))]


def ring(results: Results) -> None:
    """Ring attention: forward and gradients of a weighted sum, sharded against one device."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import AxisType

    from jax_attn import Masking, attend
    from jax_attn.parallel import ring_attention

    rng = np.random.default_rng(0)
    shape = (2, 2, 32, 4)  # (B, N, T, H)
    queries, keys, values = (jnp.asarray(rng.normal(size=shape), jnp.float32) for _ in range(3))
    padding_mask = rng.random((2, 32)) < 0.3  # True = padding
    padding_mask[1] = True
    padding_mask[1, 5] = False  # batch row 1 sees only key 5: causal queries 0..4 see nothing
    padding_mask = jnp.asarray(padding_mask)
    weights = jnp.asarray(rng.normal(size=shape), jnp.float32)

    # first, before any other gradient: eager jax.grad on one mesh, then another (the second raised a
    # sharding error naming the first mesh; computed after the reference's gradient, it did not)
    eager = {}
    for mesh_name in EAGER_RING_MESHES:
        mesh_shape, names, axes, _ = RING_MESHES[mesh_name]
        mesh = auto_mesh(mesh_shape, names)
        loss = lambda q, mesh=mesh, axes=axes: (ring_attention(q, keys, values, mesh, **axes) * weights).sum()  # noqa: E731
        eager[mesh_name] = jax.grad(loss)(queries)
    expected = jax.grad(lambda q: (attend(q, keys, values, Masking(True))[0] * weights).sum())(queries)
    for mesh_name, actual in eager.items():
        results.record(f"ring_eager/{mesh_name}/d_queries", expected, actual)

    @functools.partial(jax.jit, static_argnums=0)
    def forward_and_grads(fn, q, k, v):
        """``fn``'s output and the gradients of a weighted sum of it, in one program."""
        output, pullback = jax.vjp(fn, q, k, v)
        return output, *pullback(weights)  # d (output * weights).sum() / d (q, k, v)

    ring_cases = [
        (name, auto_mesh(shape, names), axes, variants)
        for name, (shape, names, axes, variants) in RING_MESHES.items()
    ]
    ring_cases += [
        (name, jax.make_mesh(*RING_MESHES[name][:2]), RING_MESHES[name][2], variants)
        for name, variants in EXPLICIT_RING_MESHES.items()
    ]
    for mesh_name, mesh, axes, variants in ring_cases:
        for variant in variants:
            causal, padded, load_balance = RING_VARIANTS[variant]
            mask = padding_mask if padded else None

            def single(q, k, v, causal=causal, mask=mask):
                return attend(q, k, v, Masking(causal, mask))[0]

            def sharded(q, k, v, causal=causal, mask=mask, mesh=mesh, load_balance=load_balance, axes=axes):
                return ring_attention(
                    q, k, v, mesh, causal=causal, padding_mask=mask, load_balance=load_balance, **axes
                )

            explicit = AxisType.Explicit in mesh.axis_types
            name = f"ring{'_explicit' if explicit else ''}/{mesh_name}/{variant}"
            results.measures[f"{name}/spec"] = str(sharded(queries, keys, values).sharding.spec)
            expected = forward_and_grads(single, queries, keys, values)
            with jax.set_mesh(mesh):  # needed by Explicit axes (the sum's output sharding)
                actual = forward_and_grads(sharded, queries, keys, values)
            for part, expected_part, actual_part in zip(RING_PARTS, expected, actual, strict=True):
                results.record(f"{name}/{part}", expected_part, actual_part)


def ring_memory(results: Results) -> None:
    """Memory and shapes of the compiled per-device ring program as the ring grows, T fixed."""
    import jax
    import jax.numpy as jnp
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_attn import Masking, attend
    from jax_attn.parallel import ring_attention

    def largest_dims(compiled) -> list[int]:
        dims = re.findall(r"[a-z]+[0-9]*\[([0-9,]+)\]", compiled.as_text())
        return sorted({int(d) for group in dims for d in group.split(",")})[-3:]

    for size in RING_SIZES:
        mesh = auto_mesh((size,), ("seq",), devices=jax.devices()[:size])
        spec = jax.ShapeDtypeStruct(
            MEMORY_SHAPE, jnp.float32, sharding=NamedSharding(mesh, P(None, None, "seq"))
        )
        forward = (
            jax.jit(lambda q, k, v, mesh=mesh: ring_attention(q, k, v, mesh))
            .lower(spec, spec, spec)
            .compile()
        )
        backward = jax.jit(
            jax.grad(lambda q, k, v, mesh=mesh: ring_attention(q, k, v, mesh).sum(), argnums=(0, 1, 2))
        ).lower(spec, spec, spec).compile()  # fmt: skip
        results.measures[f"ring_memory/{size}/forward"] = forward.memory_analysis().temp_size_in_bytes
        results.measures[f"ring_memory/{size}/backward"] = backward.memory_analysis().temp_size_in_bytes
        results.measures[f"ring_dims/{size}"] = largest_dims(forward) + largest_dims(backward)
    reference = jax.ShapeDtypeStruct(MEMORY_SHAPE, jnp.float32)
    single_program = jax.jit(lambda q, k, v: attend(q, k, v, Masking(causal=True))[0]).lower(
        reference, reference, reference
    )
    results.measures["reference_dims"] = largest_dims(single_program.compile())


def keep_mask(results: Results) -> None:
    """A dropout keep-mask with its batch and heads sharded: the same bits, each device drawing its own."""
    import jax
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_attn.ops import draw_keep_mask

    mesh = auto_mesh(MODEL_MESHES[KEEP_MASK_MESH], ("data", "model"))
    key = jax.random.key(0)
    draw = (
        jax.jit(
            lambda key: draw_keep_mask(key, 0.5, KEEP_MASK_SHAPE),
            out_shardings=NamedSharding(mesh, P("data", "model")),
        )
        .lower(key)
        .compile()
    )
    expected, actual = (
        np.asarray(mask, np.uint8) for mask in (draw_keep_mask(key, 0.5, KEEP_MASK_SHAPE), draw(key))
    )
    results.record(f"keep_mask/{KEEP_MASK_MESH}/mask", expected, actual)
    bits = re.findall(r"u32\[([0-9,]+)\]", draw.as_text())  # the random bits' arrays
    results.measures["keep_mask/bits_shapes"] = sorted({tuple(map(int, dims.split(","))) for dims in bits})


def models(results: Results) -> None:
    """The same weights and batch on one device and on ("data", "model") meshes: outputs,
    gradients, an SGD step, and where every parameter was placed; then the data-parallel GPT
    forward's per-device memory as the "data" axis grows, B fixed."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx
    from jax.sharding import NamedSharding
    from jax.sharding import PartitionSpec as P

    from jax_attn import FusedCausalAttention, GPTModel, MultiHeadAttention
    from jax_attn.parallel import shard_batch, shard_model

    sys.path.insert(0, str(ROOT / "examples"))
    from distributed_train import loss_fn, train_step

    rng = np.random.default_rng(1)
    token_ids = jnp.asarray(rng.integers(0, 64, (8, 8)))
    targets = jnp.asarray(rng.integers(0, 64, (8, 8)))
    x = jnp.asarray(rng.normal(size=(8, 8, 32)), jnp.float32)
    builders: dict[str, Callable[[], nnx.Module]] = {
        "gpt": lambda: GPTModel(GPT_CONFIG, rngs=nnx.Rngs(0)),
        "multi_head_attention": lambda: MultiHeadAttention(
            32, 32, 8, 0.0, 4, qkv_bias=True, rngs=nnx.Rngs(0)
        ),
        "fused_causal_attention": lambda: FusedCausalAttention(32, 4, 8, 0.0, 0.0, rngs=nnx.Rngs(0)),
    }

    def flat(state) -> np.ndarray:
        return np.concatenate([np.ravel(leaf) for leaf in jax.tree.leaves(state)])

    def attention_loss(model, x):
        return (model(x) ** 2).mean()

    # one program per model and mesh for the output and the gradients (each compile costs seconds)
    @nnx.jit
    def gpt_output_and_grads(model, inputs, labels):
        return model(inputs), nnx.grad(loss_fn)(model, inputs, labels)

    @nnx.jit
    def attention_output_and_grads(model, inputs):
        return model(inputs), nnx.grad(attention_loss)(model, inputs)

    for model_name, build in builders.items():
        single = {}
        for mesh_name in (None, *MODELS[model_name][0]):
            model = build()
            model.eval()
            inputs, labels = (token_ids, targets) if model_name == "gpt" else (x, None)
            if mesh_name is not None:
                mesh = auto_mesh(MODEL_MESHES[mesh_name], ("data", "model"))
                shard_model(model, mesh)
                inputs = shard_batch(inputs, mesh)
                labels = None if labels is None else shard_batch(labels, mesh)
                results.measures[f"{model_name}/{mesh_name}/specs"] = {
                    ".".join(map(str, path)): mesh_axes(node.get_value())
                    for path, node in nnx.iter_graph(model)
                    if isinstance(node, nnx.Param)
                }
            if model_name == "gpt":
                output, grads = gpt_output_and_grads(model, inputs, labels)
                optimizer = nnx.Optimizer(model, optax.sgd(0.1), wrt=nnx.Param)
                loss = train_step(model, optimizer, inputs, labels)
                parts = {
                    "logits": output,
                    "loss": loss,
                    "grads": flat(grads),
                    "sgd_step": flat(nnx.state(model, nnx.Param)),
                }
            else:
                output, grads = attention_output_and_grads(model, inputs)
                parts = {"output": output, "grads": flat(grads)}
            if mesh_name is None:
                single = parts
                continue
            for part, actual in parts.items():
                results.record(f"{model_name}/{mesh_name}/{part}", single[part], actual)

    ids = jax.ShapeDtypeStruct((8, 8), jnp.int32)
    for size in DATA_SIZES:
        mesh = auto_mesh((size, 1), ("data", "model"), devices=jax.devices()[:size])
        model = shard_model(builders["gpt"](), mesh)
        model.eval()
        graphdef, state = nnx.split(model)
        batch = jax.ShapeDtypeStruct(ids.shape, ids.dtype, sharding=NamedSharding(mesh, P("data")))
        compiled = jax.jit(lambda state, ids, graphdef=graphdef: nnx.merge(graphdef, state)(ids)).lower(
            state, batch
        )
        results.measures[f"gpt_memory/{size}"] = compiled.compile().memory_analysis().temp_size_in_bytes


def load(folder: pathlib.Path, checks: str = "parallel_checks") -> tuple[object, dict]:
    """The results, computed once a run: the test modules and xdist workers of a run pass the run's
    folder; the first to take the lock runs the subprocess (``python -m tests.<checks> OUT``), the
    others wait for it and read its files. Returns ``(arrays, measures)`` (an ``NpzFile`` and a dict)."""

    out = folder / checks
    with open(folder / f"{checks}.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if not (out / "measures.json").exists():  # written last
            out.mkdir(exist_ok=True)
            env = {**os.environ, "PYTHONPATH": str(ROOT)}
            subprocess.run(
                [sys.executable, "-m", f"tests.{checks}", str(out)],
                cwd=ROOT,
                env=env,
                check=True,
                timeout=600,
            )
    return np.load(out / "arrays.npz"), json.loads((out / "measures.json").read_text())


def _section_ok(measures: dict, name: str) -> None:
    error = measures["errors"].get(section_of(name))
    assert error is None, f"section {section_of(name)!r} of the subprocess failed:\n{error}"


def measure(results: tuple[object, dict], name: str) -> object:
    """``measures[name]`` of ``load``'s results; AssertionError with the traceback of its section
    if that failed in the subprocess."""
    _section_ok(results[1], name)
    return results[1][name]


def sides(results: tuple[object, dict], check: str) -> tuple[object, object]:
    """``(expected, actual)`` of ``check``, as ``measure`` gives a measure."""
    arrays, measures = results
    _section_ok(measures, check)
    return arrays[f"{check}/expected"], arrays[f"{check}/actual"]


def main(out: pathlib.Path) -> None:
    flags = os.environ.get("XLA_FLAGS", "")  # the test run's own flags (tests/conftest.py) kept
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}"

    results, errors = Results(), {}
    for name, section in (("ring", ring), ("ring_memory", ring_memory), ("keep_mask", keep_mask),
                          ("models", models)):  # fmt: skip
        try:
            section(results)
        except Exception:  # its tests fail with the traceback; the others run
            errors[name] = traceback.format_exc()
    results.measures["errors"] = errors
    np.savez(out / "arrays.npz", **results.arrays)
    (out / "measures.json").write_text(json.dumps(results.measures, indent=1))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
