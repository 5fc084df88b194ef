"""The linear-layer kinds' one protocol: nn.Linear, and the inference-only layers swapped
in for it (Int8Linear in quantize.py, PackedLinear in packed.py, through swap.py).

The model reads a linear layer through this protocol only, so transformer.py does not
know which kinds exist: a new kind implements `rows` and goes through swap.py.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import Protocol, runtime_checkable

import torch.nn.functional as F
from torch import Tensor, nn


@runtime_checkable
class SelectsRows(Protocol):
    """An inference-only linear layer [..,K] -> [..,N] that can compute a subset of its
    outputs: the output projection over a shortlist of the vocabulary."""

    def rows(self, index: Tensor) -> nn.Module:
        """The layer computing only outputs `index` [N']: [..,K] -> [..,N']."""
        ...


def linear_rows(layer: nn.Module, index: Tensor) -> Callable[[Tensor], Tensor]:
    """`layer` (an nn.Linear, or a kind that SelectsRows) computing only its outputs
    `index` [N']: [..,K] -> [..,N']."""
    if isinstance(layer, SelectsRows):
        return layer.rows(index)
    if not isinstance(layer, nn.Linear):
        raise TypeError(f"{type(layer).__name__} is not a linear layer with rows()")
    weight = layer.weight.detach()[index]  # [N',K]
    bias = None if layer.bias is None else layer.bias.detach()[index]
    return partial(F.linear, weight=weight, bias=bias)
