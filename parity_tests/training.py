"""Training parity: the same GPT trained in torch (``torch.optim.AdamW``) and JAX (optax's ``adamw``).

Both start from the same weights, see the same batches of a character-level toy corpus, minimise
next-token cross-entropy with the same hyper-parameters, dropout off. The two AdamW updates are
the same formula: torch multiplies the weights by ``1 - lr * weight_decay`` and then subtracts
``lr * m_hat / (sqrt(v_hat) + eps)``; optax subtracts ``lr * (m_hat / (sqrt(v_hat + eps_root) +
eps) + weight_decay * w)``: equal with ``eps_root=0`` (eps outside the square root in both), both
decaying every weight (no mask, torch's single parameter group). ``train_parity`` returns the
per-step losses of both and the final weights, compared with the tolerance table.

Both sides run in one dtype, float32 or float64 (``dtype``). In float32 the final weights of a
correct port can leave float32's bound: where a gradient entry is near ``eps`` (1e-8), AdamW's
update ``m_hat / (sqrt(v_hat) + eps)`` turns its rounding error, large next to so small a value,
into a change of the weight near ``lr / (4 eps)`` times it. Measured on the toy GPT: torch against
itself, its starting weights moved by one ulp, leaves the bound on ``trf_blocks.0.ff.layers.2.weight``
after one step (1.27 times it), and XLA's code at another LLVM optimisation level moves JAX's
final weights from 0.45 to 1.7 times it. In float64 the same 20 steps agree within 2.1e-14
(the bound is above 1e-12): float64 decides whether the two trainings are one; float32's losses agree too.
"""

from __future__ import annotations

from collections.abc import Mapping
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import numpy as np

from numpy_attn.gpt_spec import check_config
from parity_tests.compare import StepReport, compare_steps

__all__ = [
    "CORPUS",
    "TRAIN_DTYPES",
    "CharVocabulary",
    "Hyperparameters",
    "TrainParity",
    "TrainingRun",
    "make_batches",
    "train_jax",
    "train_parity",
    "train_torch",
]

TRAIN_DTYPES = ("float32", "float64")  # the dtypes both sides train in

CORPUS = (
    "Your journey starts with one step. Attention lets every token look back at the tokens "
    "before it; a causal mask hides the ones after it. Queries meet keys, the softmax turns "
    "their scores into weights, and the weights mix the values. Many heads look at once, a "
    "projection joins them, and a stack of such blocks, each with a feed-forward layer, "
    "layer norms and residual paths, is a GPT. Trained on next-token prediction, it learns "
    "to continue a text one character at a time."
)


class CharVocabulary:
    """A character-level vocabulary: the sorted distinct characters of a text."""

    def __init__(self, text: str):
        self.chars = sorted(set(text))
        self.ids = {char: index for index, char in enumerate(self.chars)}

    def __len__(self) -> int:
        return len(self.chars)

    def encode(self, text: str) -> np.ndarray:
        return np.array([self.ids[char] for char in text], np.int64)

    def decode(self, ids: Any) -> str:
        return "".join(self.chars[int(i)] for i in np.asarray(ids).ravel())


@dataclass(frozen=True)
class Hyperparameters:
    """AdamW's and the run's settings, passed identically to torch and optax."""

    steps: int = 20
    batch_size: int = 4
    learning_rate: float = 3e-3
    betas: tuple[float, float] = (0.9, 0.999)
    eps: float = 1e-8
    weight_decay: float = 0.1
    seed: int = 0


def make_batches(
    ids: np.ndarray, context_length: int, hp: Hyperparameters
) -> list[tuple[np.ndarray, np.ndarray]]:
    """``hp.steps`` batches of ``(inputs, targets)``, each ``(batch_size, context_length)``:
    windows at random offsets (seeded), targets shifted by one token. ValueError unless ``ids``
    holds at least ``context_length + 1`` tokens (a window and its shifted targets)."""
    if len(ids) <= context_length:
        raise ValueError(
            f"the text has {len(ids)} tokens; a training window needs at least context_length + 1 = "
            f"{context_length + 1}"
        )
    rng = np.random.default_rng(hp.seed)
    batches = []
    for _ in range(hp.steps):
        starts = rng.integers(0, len(ids) - context_length, hp.batch_size)
        inputs = np.stack([ids[s : s + context_length] for s in starts])  # (B, T)
        targets = np.stack([ids[s + 1 : s + context_length + 1] for s in starts])  # (B, T)
        batches.append((inputs, targets))
    return batches


@dataclass
class TrainingRun:
    losses: list[float]
    params: dict[str, np.ndarray]


def train_torch(
    params: Mapping[str, np.ndarray],
    config: Mapping[str, Any],
    batches: list[tuple[np.ndarray, np.ndarray]],
    hp: Hyperparameters,
) -> TrainingRun:
    """torch_ref's GPTModel, in ``params``' dtype, trained with ``torch.optim.AdamW`` on ``batches``."""
    import torch

    import torch_ref

    dtype = getattr(torch, next(iter(params.values())).dtype.name)
    model = torch_ref.load_params(torch_ref.GPTModel(config).to(dtype), params).train()
    optimizer = torch.optim.AdamW(
        model.parameters(), lr=hp.learning_rate, betas=hp.betas, eps=hp.eps, weight_decay=hp.weight_decay
    )
    losses = []
    for inputs, targets in batches:
        optimizer.zero_grad()
        logits = model(torch.from_numpy(inputs))  # (B, T, V)
        loss = torch.nn.functional.cross_entropy(logits.flatten(0, 1), torch.from_numpy(targets).flatten())
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    return TrainingRun(losses, torch_ref.to_params(model))


def train_jax(
    params: Mapping[str, np.ndarray],
    config: Mapping[str, Any],
    batches: list[tuple[np.ndarray, np.ndarray]],
    hp: Hyperparameters,
) -> TrainingRun:
    """jax_attn's GPTModel, in ``params``' dtype, trained with optax's ``adamw`` on ``batches``
    (one jitted step); float64 ``params`` train in JAX's 64-bit mode, switched on for the run."""
    import jax
    import jax.numpy as jnp
    import optax
    from flax import nnx

    import jax_attn

    float64 = next(iter(params.values())).dtype == np.float64
    with jax.enable_x64(True) if float64 else nullcontext():  # float64 computes as such only there
        model = jax_attn.GPTModel.from_params(params, config)
        b1, b2 = hp.betas
        tx = optax.adamw(
            hp.learning_rate, b1=b1, b2=b2, eps=hp.eps, eps_root=0.0, weight_decay=hp.weight_decay
        )
        optimizer = nnx.Optimizer(model, tx, wrt=nnx.Param)

        def loss_fn(model: jax_attn.GPTModel, inputs: jax.Array, targets: jax.Array) -> jax.Array:
            logits = model(inputs)  # (B, T, V)
            return optax.softmax_cross_entropy_with_integer_labels(logits, targets).mean()

        @nnx.jit
        def step(model: jax_attn.GPTModel, optimizer: nnx.Optimizer, inputs: jax.Array, targets: jax.Array):
            loss, grads = nnx.value_and_grad(loss_fn)(model, inputs, targets)
            optimizer.update(model, grads)
            return loss

        losses = [float(step(model, optimizer, jnp.asarray(i), jnp.asarray(t))) for i, t in batches]
        return TrainingRun(losses, model.to_params())


@dataclass
class TrainParity:
    torch: TrainingRun
    jax: TrainingRun
    losses: StepReport  # one row per step: the loss of torch (expected) against jax (actual)
    weights: StepReport  # one row per weight: the final weights

    @property
    def ok(self) -> bool:
        return self.losses.ok and self.weights.ok


def train_parity(
    config: Mapping[str, Any],
    hp: Hyperparameters = Hyperparameters(),
    text: str = CORPUS,
    dtype: str = "float32",
) -> TrainParity:
    """Train torch_ref's and jax_attn's GPT from the same torch-initialised weights (seed
    ``hp.seed``, cast to ``dtype``: "float32" or "float64") on ``text``; ``config``'s
    ``vocab_size`` must be at least the text's alphabet and its ``drop_rate`` 0: the two runs
    are compared step by step, and torch and JAX would draw different dropout masks."""
    if dtype not in TRAIN_DTYPES:
        raise ValueError(f"dtype must be one of {TRAIN_DTYPES}, got {dtype!r}")
    check_config(config)
    if config["drop_rate"] != 0:
        raise ValueError(
            f"config['drop_rate'] must be 0 for training parity, got {config['drop_rate']!r}: torch and "
            "JAX would draw different dropout masks, so two correct ports would diverge"
        )
    import torch

    import torch_ref

    vocabulary = CharVocabulary(text)
    if len(vocabulary) > config["vocab_size"]:
        raise ValueError(
            f"the text has {len(vocabulary)} distinct characters, config['vocab_size'] is smaller"
        )
    torch.manual_seed(hp.seed)
    initial = torch_ref.to_params(torch_ref.GPTModel(config))  # float32, as torch draws them
    params = {name: value.astype(dtype) for name, value in initial.items()}
    batches = make_batches(vocabulary.encode(text), config["context_length"], hp)
    expected, actual = train_torch(params, config, batches, hp), train_jax(params, config, batches, hp)
    losses = compare_steps(_by_step(expected.losses, dtype), _by_step(actual.losses, dtype))
    return TrainParity(expected, actual, losses, compare_steps(expected.params, actual.params))


def _by_step(losses: list[float], dtype: str) -> dict[str, np.ndarray]:
    """The losses in the run's dtype (both sides computed them in it), named ``step 1``, ..."""
    return {f"step {n}": np.asarray(loss, dtype) for n, loss in enumerate(losses, 1)}
