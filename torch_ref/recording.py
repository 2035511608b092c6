"""What the notes' classes gained here: step traces and injectable dropout keep-masks."""

from __future__ import annotations

from collections import OrderedDict

import torch
from torch import nn

__all__ = ["Recorder", "dropout_or_keep"]


class Recorder:
    """Collects a step trace when enabled; does nothing (and copies nothing) otherwise.

    Values are cloned, so later in-place operations (the notes' ``masked_fill_``) do not reach
    the recorded copy; clones stay in the autograd graph.
    """

    def __init__(self, enabled: bool):
        self.enabled = enabled
        self.steps: OrderedDict[str, torch.Tensor] = OrderedDict()

    def __call__(self, **named: torch.Tensor) -> None:
        if self.enabled:
            self.steps.update((name, value.clone()) for name, value in named.items())

    def result(self, output: torch.Tensor, **named: torch.Tensor):
        """The layer's return value: ``output``, or ``(output, steps)`` when enabled."""
        self(**named, output=output)
        return (output, self.steps) if self.enabled else output


def dropout_or_keep(dropout: nn.Dropout, x: torch.Tensor, keep_mask: torch.Tensor | None) -> torch.Tensor:
    """``dropout(x)``, or, with an injected bool ``keep_mask`` (True = keep), the same inverted
    dropout with that mask instead of a random draw, in train and eval mode alike."""
    if keep_mask is None:
        return dropout(x)
    return x * keep_mask / (1 - dropout.p)
