"""fp16's dynamic loss scale, kept on the host.

fp16 has five exponent bits, so small gradients underflow to zero: the loss is multiplied by
a large scale before backward and the gradients divided by it afterwards. The scale is
halved whenever the gradients overflow (that update is skipped) and doubled after
`growth_interval` updates in a row without overflow, as torch's GradScaler and fairseq's
DynamicLossScaler do.

torch's GradScaler keeps its scale and its overflow flag on the GPU, so a trainer that must
know whether an update was skipped (to count updates, schedule the learning rate, log the
scale) reads the device two or three times per update. Here the one read is the caller's:
whether the unscaled gradient norm is finite, which is also how fairseq detects an
overflow. Everything else is a Python float. The state dict has GradScaler's keys, so
checkpoints written with either load into either.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import torch


class LossScaler:
    """The loss scale of one run; with enabled=False (fp32, bf16) a scale of 1 that never
    changes."""

    def __init__(
        self,
        init_scale: float = 128.0,
        *,
        enabled: bool = True,
        growth_interval: int = 2000,
        growth_factor: float = 2.0,
        backoff_factor: float = 0.5,
    ) -> None:
        self.enabled = enabled
        self.scale = float(init_scale) if enabled else 1.0
        self.growth_interval = growth_interval
        self.growth_factor = growth_factor
        self.backoff_factor = backoff_factor
        self.good_updates = 0  # updates without overflow since the scale last changed

    def unscale_(self, grads: Iterable[torch.Tensor], factor: float = 1.0) -> None:
        """Divide the gradients by the scale, and multiply them by `factor`, in one pass."""
        grads = list(grads)
        multiplier = factor / self.scale
        if grads and multiplier != 1.0:
            torch._foreach_mul_(grads, multiplier)

    def update(self, overflow: bool) -> None:
        """After an update's overflow check: back off on overflow, grow after a good run."""
        if not self.enabled:
            return
        if overflow:
            self.scale *= self.backoff_factor
            self.good_updates = 0
            return
        self.good_updates += 1
        if self.good_updates >= self.growth_interval:
            self.scale *= self.growth_factor
            self.good_updates = 0

    def state_dict(self) -> dict[str, Any]:
        """torch.amp.GradScaler's keys and meanings; empty when disabled, as GradScaler's."""
        if not self.enabled:
            return {}
        return {
            "scale": self.scale,
            "growth_factor": self.growth_factor,
            "backoff_factor": self.backoff_factor,
            "growth_interval": self.growth_interval,
            "_growth_tracker": self.good_updates,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        if not self.enabled or not state:
            return
        self.scale = float(state["scale"])
        self.growth_factor = float(state.get("growth_factor", self.growth_factor))
        self.backoff_factor = float(state.get("backoff_factor", self.backoff_factor))
        self.growth_interval = int(state.get("growth_interval", self.growth_interval))
        self.good_updates = int(state.get("_growth_tracker", 0))
