"""An exponential moving average of the weights (`checkpoint.ema_decay`; fairseq's --ema-decay,
Marian's --exponential-smoothing, OpenNMT-py's -average_decay).

After every update the average moves toward the weights: ema = d * ema + (1 - d) * w. The
decay d starts small and grows to `ema_decay` (TensorFlow's ExponentialMovingAverage with
num_updates: d = min(ema_decay, (1 + n) / (10 + n)) after n updates), so the random initial
weights are forgotten within the first hundred updates instead of weighing on the average
for 1 / (1 - ema_decay) of them.

The average is kept in fp32 beside the parameters (training keeps fp32 parameters in every
precision), is part of the checkpoint's train_state (a resumed run continues it) and is
read back by `nmt-average weights=ema`. Every rank keeps its own copy: the ranks' weights
are equal after each update, so their averages are too, and no collective is needed.
"""

from __future__ import annotations

from typing import Any

import torch


def effective_decay(decay: float, updates: int) -> float:
    """The decay applied by the `updates`-th update (1-based)."""
    return min(decay, (1.0 + updates) / (10.0 + updates))


class WeightEMA:
    """The moving average of `model`'s parameters; `weights()` gives a full state dict
    (buffers, which training never changes, as the model holds them)."""

    def __init__(self, model: torch.nn.Module, decay: float) -> None:
        self.model = model
        self.decay = decay
        self.updates = 0
        # Tied weights (shared embeddings) are one Parameter under several names: average
        # each tensor once, then give every name its tensor's average.
        self._params: list[torch.nn.Parameter] = []
        self._index: dict[str, int] = {}  # state_dict name -> position in _params
        seen: dict[int, int] = {}
        for name, value in model.state_dict(keep_vars=True).items():
            if isinstance(value, torch.nn.Parameter) and value.requires_grad:
                if id(value) not in seen:
                    seen[id(value)] = len(self._params)
                    self._params.append(value)
                self._index[name] = seen[id(value)]
        self._average = [p.detach().float().clone() for p in self._params]

    @torch.no_grad()
    def update(self) -> None:
        """Move the average toward the current weights (after an optimizer step)."""
        self.updates += 1
        weight = 1.0 - effective_decay(self.decay, self.updates)
        current = [p.detach().float() for p in self._params]
        torch._foreach_lerp_(self._average, current, weight)

    def restart(self) -> None:
        """Start the average again from the model's current weights."""
        self.updates = 0
        for average, param in zip(self._average, self._params):
            average.copy_(param.detach())

    def weights(self) -> dict[str, torch.Tensor]:
        """The model's state dict with the averaged weights in place of the parameters."""
        state = self.model.state_dict()
        copies: dict[int, torch.Tensor] = {}  # one per tensor: tied names share it, as saved
        for name, i in self._index.items():
            if i not in copies:
                copies[i] = self._average[i].to(state[name].dtype).clone()
            state[name] = copies[i]
        return state

    def state_dict(self) -> dict[str, Any]:
        """What train_state["ema"] holds: {decay, updates, weights (a full state dict)}."""
        on_cpu: dict[int, torch.Tensor] = {}  # tied names keep sharing one tensor
        weights = {k: on_cpu.setdefault(id(v), v.cpu()) for k, v in self.weights().items()}
        return {"decay": self.decay, "updates": self.updates, "weights": weights}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue a saved average; the decay stays the configured one (as Adam's betas)."""
        self.updates = int(state["updates"])
        saved = state["weights"]
        for name, i in self._index.items():
            self._average[i].copy_(saved[name])
