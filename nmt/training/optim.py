"""Adam and learning-rate schedules.

Each schedule is a pure function of the schedule's position: the number of updates already
done (fairseq's convention: the first update uses `lr_at(0)` = warmup_init_lr), or, with
`optim.schedule_unit=time`, the fraction of the time budget (max_time) used so far, in
[0, 1]. Warmup and decay are given in the same unit (updates, or fractions of the budget).
`LRScheduler` turns a run's counters into that position: it adds the offset that lets
`resume.reset_lr_scheduler` restart a schedule in the middle of a run, and has
state_dict/load_state_dict for checkpoints.

Resuming: a position in updates is restored exactly, so the resumed run is bitwise equal to
an uninterrupted one. A position in time is the training time saved in the checkpoint plus
the time since the resumed run started: it continues the same curve, but the clock of the
updates done again after a kill differs from the first attempt's, so their learning rates
(and hence the weights) differ slightly from an uninterrupted run's.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from functools import partial

import torch

from nmt.training.config import OptimConfig


def _warmup(position: float, lr: float, warmup: float, warmup_init_lr: float) -> float:
    """Linear warmup from warmup_init_lr (position 0) to lr (position `warmup`)."""
    return warmup_init_lr + position * (lr - warmup_init_lr) / warmup


def inverse_sqrt_lr(position: float, *, lr: float, warmup: float, warmup_init_lr: float) -> float:
    """fairseq's inverse_sqrt: linear warmup, then lr * sqrt(warmup / position)."""
    if position < warmup:
        return _warmup(position, lr, warmup, warmup_init_lr)
    if warmup > 0:
        return lr * math.sqrt(warmup / position)
    return lr * math.sqrt(1 / max(position, 1))  # no warmup (updates only): lr / sqrt(update)


def cosine_lr(
    position: float,
    *,
    lr: float,
    warmup: float,
    warmup_init_lr: float,
    decay_end: float,
    min_lr: float,
) -> float:
    """Linear warmup, then half a cosine from lr down to min_lr at `decay_end`, then flat."""
    if position < warmup:
        return _warmup(position, lr, warmup, warmup_init_lr)
    span = decay_end - warmup
    progress = min(1.0, (position - warmup) / span) if span > 0 else 1.0
    return min_lr + 0.5 * (lr - min_lr) * (1.0 + math.cos(math.pi * progress))


def fixed_lr(position: float, *, lr: float, warmup: float, warmup_init_lr: float) -> float:
    """Linear warmup (if any), then constant lr."""
    if position < warmup:
        return _warmup(position, lr, warmup, warmup_init_lr)
    return lr


def schedule_function(cfg: OptimConfig, max_update: int) -> Callable[[float], float]:
    """The configured schedule as a function of its position (updates done, or with
    schedule_unit=time the fraction of the time budget used)."""
    cfg.validate()
    lr, init = cfg.lr, cfg.warmup_init_lr
    by_time = cfg.schedule_unit == "time"
    warmup = cfg.warmup_fraction if by_time else cfg.warmup_updates
    if cfg.scheduler == "inverse_sqrt":
        return partial(inverse_sqrt_lr, lr=lr, warmup=warmup, warmup_init_lr=init)
    if cfg.scheduler == "fixed":
        return partial(fixed_lr, lr=lr, warmup=warmup, warmup_init_lr=init)
    return partial(
        cosine_lr,
        lr=lr,
        warmup=warmup,
        warmup_init_lr=init,
        decay_end=cfg.decay_fraction if by_time else cfg.decay_end(max_update),
        min_lr=cfg.min_lr,
    )


def build_scheduler(
    optimizer: torch.optim.Optimizer, cfg: OptimConfig, *, max_update: int, max_time: float
) -> LRScheduler:
    """The LRScheduler of `cfg`: over updates, or over `max_time` hours of training."""
    budget = max_time * 3600.0 if cfg.schedule_unit == "time" else 0.0
    return LRScheduler(optimizer, schedule_function(cfg, max_update), budget_seconds=budget)


class LRScheduler:
    """Sets the optimizer's learning rate from a pure schedule before each update.

    `budget_seconds` > 0: the schedule's position is the fraction of that many training
    seconds used (schedule_unit=time); 0: the number of updates done.
    """

    def __init__(
        self,
        optimizer: torch.optim.Optimizer,
        fn: Callable[[float], float],
        *,
        budget_seconds: float = 0.0,
    ) -> None:
        self.optimizer = optimizer
        self.fn = fn
        self.budget_seconds = budget_seconds
        self.offset = 0  # updates done before the schedule (re)started
        self.offset_seconds = 0.0  # training seconds before the schedule (re)started

    @property
    def by_time(self) -> bool:
        return self.budget_seconds > 0

    def position(self, num_updates: int, elapsed: float = 0.0) -> float:
        """Where the schedule stands after `num_updates` updates and `elapsed` training
        seconds. By time: the share of the budget used since the schedule started, of what
        was left of the budget then (a restarted schedule spans the rest of the budget);
        1 once the budget is spent."""
        if not self.by_time:
            return max(num_updates - self.offset, 0)
        span = self.budget_seconds - self.offset_seconds
        if span <= 0:
            return 1.0
        return min(max(elapsed - self.offset_seconds, 0.0) / span, 1.0)

    def lr_at(self, num_updates: int, elapsed: float = 0.0) -> float:
        return self.fn(self.position(num_updates, elapsed))

    def step(self, num_updates: int, elapsed: float = 0.0) -> float:
        """Set the learning rate of the update that follows `num_updates` done updates,
        made at `elapsed` training seconds (read only by a time-based schedule)."""
        lr = self.lr_at(num_updates, elapsed)
        for group in self.optimizer.param_groups:
            group["lr"] = lr
        return lr

    def restart(self, num_updates: int, elapsed: float = 0.0) -> None:
        """resume.reset_lr_scheduler: the next update is the schedule's first."""
        self.offset = num_updates
        self.offset_seconds = elapsed

    def state_dict(self) -> dict:
        return {"offset": self.offset, "offset_seconds": self.offset_seconds}

    def load_state_dict(self, state: dict) -> None:
        self.offset = int(state["offset"])
        self.offset_seconds = float(state.get("offset_seconds", 0.0))  # older checkpoints


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
