"""What ``generate`` checks at its door in numpy_attn and jax_attn, for every model: the config of
its kind (``decoder_spec.model_kind``), the weights against it, the token ids, the random source and
the options (``gpt_checks.check_generate_args``); one text for one mistake."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from numpy_attn import finite
from numpy_attn.decoder_spec import model_kind, without_buffers
from numpy_attn.gpt_checks import check_generate_args, check_model_params, check_token_ids


def check_generate_call(fw: Any, a: Mapping[str, Any], config: Mapping[str, Any]) -> None:
    """The token ids for ``config``, ``rng`` the framework's random source, the options."""
    check_token_ids(a["token_ids"], config)
    fw.check_random(a["rng"], "rng")
    check_generate_args(a, a["token_ids"].shape, config)


def generate(fw: Any, a: dict[str, Any]) -> None:
    """numpy_attn's ``generate(params, token_ids, config, max_new_tokens, ...)``, ``config`` a GPT's
    or a Llama 3 or Qwen3 cfg: the weights' values tested once per array (a tied head,
    ``out_head.weight`` the very ``tok_emb.weight``, once)."""
    kind = model_kind(a["config"])
    a["params"] = without_buffers(kind, a["params"], a["config"])
    check_model_params(fw, kind, a["params"], a["config"], values=False)
    arrays: dict[int, str] = {}  # id -> the first name holding that array
    for name, value in a["params"].items():
        arrays.setdefault(id(value), name)
    finite.check_finite({name: a["params"][name] for name in arrays.values()})
    check_generate_call(fw, a, a["config"])
