"""The multi-device half of tests/test_sharding_decoders.py, run as ``python -m
tests.decoder_sharding_checks OUT`` (``parallel_checks.load(folder, "decoder_sharding_checks")``).

As ``tests/parallel_checks.py``, whose helpers it uses: XLA's host device count is fixed when jax
is imported, so this process of its own has 8 CPU devices. Each Llama 3 and Qwen3 case is built
twice from one seed: its logits on one device (``expected``) and placed by ``shard_model`` on a
("data", "model") mesh, run under ``nnx.jit`` on a batch placed by ``shard_batch`` (``actual``),
saved as ``<case>/<mesh>/logits/{expected,actual}`` in ``OUT/arrays.npz``; every parameter's
placement goes to ``OUT/measures.json`` as ``<case>/<mesh>/specs``, and what a refused mesh
raised as ``<case>/<mesh>/refused`` (the message, and whether any parameter had moved). A failure
leaves its traceback in ``measures["errors"]``. Importing this module imports no jax.
"""

from __future__ import annotations

import json
import os
import pathlib
import sys
import traceback

import numpy as np

from tests.decoder_cases import LLAMA, QWEN
from tests.parallel_checks import DEVICES, Results, auto_mesh, mesh_axes

# mesh name -> ("data", "model") sizes
MESHES = {"data2_model4": (2, 4), "data4_model2": (4, 2)}
# decoder_cases' configs have 2 key/value groups (4 query heads): model axis 2 only; with 8 query
# heads in 4 groups, both meshes
WIDE = {"n_heads": 8, "n_kv_groups": 4}
# case -> (model class, cfg, meshes it runs on, meshes shard_model must refuse)
CASES = {
    "llama": ("Llama3Model", LLAMA, ("data4_model2",), ("data2_model4",)),
    "qwen": ("Qwen3Model", QWEN, ("data4_model2",), ("data2_model4",)),
    "llama_kv4": ("Llama3Model", LLAMA | WIDE, ("data2_model4", "data4_model2"), ()),
    "qwen_kv4": ("Qwen3Model", QWEN | WIDE, ("data2_model4", "data4_model2"), ()),
    "qwen_tied": ("Qwen3Model", QWEN, ("data4_model2",), ()),
}
TIED = {"qwen_tied"}  # built with tie_embeddings=True: out_head is tok_emb, one variable placed once
CHECKS = [f"{case}/{mesh}/logits" for case, (_, _, meshes, _) in CASES.items() for mesh in meshes]
BATCH, NUM_TOKENS = 4, 11


def decoders(results: Results) -> None:
    import jax
    import jax.numpy as jnp
    from flax import nnx

    import jax_attn
    from jax_attn.parallel import shard_batch, shard_model

    def build(model: str, cfg: dict, tied: bool) -> nnx.Module:
        """The model drawn from seed 0, its RMSNorms' weights (q_norm and k_norm too) from U[0.5, 1.5)."""
        module = getattr(jax_attn, model)(cfg, tie_embeddings=tied, rngs=nnx.Rngs(0))
        keys = iter(jax.random.split(jax.random.key(1), 1000))
        for path, node in nnx.iter_graph(module):
            if isinstance(node, nnx.Param) and any("norm" in str(part) for part in path):
                value = node.get_value()
                node.set_value(jax.random.uniform(next(keys), value.shape, value.dtype, 0.5, 1.5))
        return module

    logits = nnx.jit(lambda model, ids: model(ids))
    token_ids = jnp.asarray(np.random.default_rng(1).integers(0, 61, (BATCH, NUM_TOKENS)))
    for case, (model, cfg, meshes, refused) in CASES.items():
        expected = logits(build(model, cfg, case in TIED), token_ids)
        for mesh_name in meshes:
            mesh = auto_mesh(MESHES[mesh_name], ("data", "model"))
            sharded = shard_model(build(model, cfg, case in TIED), mesh)
            results.measures[f"{case}/{mesh_name}/specs"] = {
                ".".join(map(str, path)): mesh_axes(node.get_value())
                for path, node in nnx.iter_graph(sharded)
                if isinstance(node, nnx.Param)
            }
            actual = logits(sharded, shard_batch(token_ids, mesh))
            results.record(f"{case}/{mesh_name}/logits", expected, actual)
        for mesh_name in refused:
            mesh = auto_mesh(MESHES[mesh_name], ("data", "model"))
            module = build(model, cfg, case in TIED)
            try:
                shard_model(module, mesh)
                message = None
            except ValueError as error:
                message = str(error)
            moved = [
                ".".join(map(str, path))
                for path, node in nnx.iter_graph(module)
                if isinstance(node, nnx.Variable) and len(node.get_value().sharding.device_set) > 1
            ]
            results.measures[f"{case}/{mesh_name}/refused"] = {"message": message, "moved": moved}


def main(out: pathlib.Path) -> None:
    flags = os.environ.get("XLA_FLAGS", "")  # the test run's own flags (tests/conftest.py) kept
    os.environ["XLA_FLAGS"] = f"{flags} --xla_force_host_platform_device_count={DEVICES}"
    results, errors = Results(), {}
    try:
        decoders(results)
    except Exception:  # the tests fail with the traceback
        errors["decoders"] = traceback.format_exc()
    results.measures["errors"] = errors
    np.savez(out / "arrays.npz", **results.arrays)
    (out / "measures.json").write_text(json.dumps(results.measures, indent=1))


if __name__ == "__main__":
    main(pathlib.Path(sys.argv[1]))
