"""Adam and learning-rate schedules.

Each schedule is a pure function of the number of updates already done (fairseq's
convention: the first update uses `lr_at(0)` = warmup_init_lr). `LRScheduler` only adds
an offset, so that `reset_lr_scheduler` can restart a schedule in the middle of a run,
and state_dict/load_state_dict for checkpoints.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial

import torch

from nmt.training.config import OptimConfig


def _warmup(step: int, lr: float, warmup_updates: int, warmup_init_lr: float) -> float:
    """Linear warmup from warmup_init_lr (step 0) to lr (step warmup_updates)."""
    return warmup_init_lr + step * (lr - warmup_init_lr) / warmup_updates


def inverse_sqrt_lr(step: int, *, lr: float, warmup_updates: int, warmup_init_lr: float) -> float:
    """fairseq's inverse_sqrt: linear warmup, then lr * sqrt(warmup_updates / step)."""
    if step < warmup_updates:
        return _warmup(step, lr, warmup_updates, warmup_init_lr)
    return lr * math.sqrt(max(warmup_updates, 1) / max(step, 1))


def cosine_lr(
    step: int,
    *,
    lr: float,
    warmup_updates: int,
    warmup_init_lr: float,
    decay_updates: int,
    min_lr: float,
) -> float:
    """Linear warmup, then half a cosine from lr down to min_lr at `decay_updates`, then flat."""
    if step < warmup_updates:
        return _warmup(step, lr, warmup_updates, warmup_init_lr)
    progress = min(1.0, (step - warmup_updates) / max(decay_updates - warmup_updates, 1))
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def fixed_lr(step: int, *, lr: float, warmup_updates: int, warmup_init_lr: float) -> float:
    """Linear warmup (if any), then constant lr."""
    if step < warmup_updates:
        return _warmup(step, lr, warmup_updates, warmup_init_lr)
    return lr


def schedule_function(cfg: OptimConfig, max_update: int) -> Callable[[int], float]:
    """The configured schedule as a function of the number of updates done."""
    cfg.validate()
    lr, warmup, init = cfg.lr, cfg.warmup_updates, cfg.warmup_init_lr
    if cfg.scheduler == "inverse_sqrt":
        return partial(inverse_sqrt_lr, lr=lr, warmup_updates=warmup, warmup_init_lr=init)
    if cfg.scheduler == "fixed":
        return partial(fixed_lr, lr=lr, warmup_updates=warmup, warmup_init_lr=init)
    return partial(
        cosine_lr,
        lr=lr,
        warmup_updates=warmup,
        warmup_init_lr=init,
        decay_updates=cfg.decay_end(max_update),
        min_lr=cfg.min_lr,
    )


class LRScheduler:
    """Sets the optimizer's learning rate from a pure schedule before each update."""

    def __init__(self, optimizer: torch.optim.Optimizer, fn: Callable[[int], float]) -> None:
        self.optimizer = optimizer
        self.fn = fn
        self.offset = 0  # updates done before the schedule (re)started

    def lr_at(self, num_updates: int) -> float:
        return self.fn(max(num_updates - self.offset, 0))

    def step(self, num_updates: int) -> float:
        """Set the learning rate of the update that follows `num_updates` done updates."""
        lr = self.lr_at(num_updates)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def restart(self, num_updates: int) -> None:
        """reset_lr_scheduler: the next update is the schedule's first."""
        self.offset = num_updates

    def state_dict(self) -> dict:
        return {"offset": self.offset}

    def load_state_dict(self, state: dict) -> None:
        self.offset = int(state["offset"])


def build_optimizer(
    params: Iterable[torch.nn.Parameter], cfg: OptimConfig
) -> torch.optim.Optimizer:
    """Adam (L2 weight decay) or AdamW (decoupled), fused where torch supports it."""
    cfg.validate()
    params = [p for p in params if p.requires_grad]
    # fused kernels exist for CPU and CUDA float tensors; one kernel per step instead of
    # a chain of foreach ops is noticeably faster on CPU.
    fused = all(p.is_floating_point() and p.device.type in ("cpu", "cuda") for p in params)
    cls = torch.optim.AdamW if cfg.decoupled_weight_decay else torch.optim.Adam
    return cls(
        params,
        lr=cfg.warmup_init_lr,
        betas=(cfg.betas[0], cfg.betas[1]),
        eps=cfg.eps,
        weight_decay=cfg.weight_decay,
        fused=fused,
    )
