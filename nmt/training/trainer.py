"""The Trainer: everything one training run holds, built by `build_training(cfg)`.

The work is done elsewhere, one job per module:
    build.py       build_training: data, model, optimizer, schedule, scaler, resume
    step.py        one optimizer update (AMP, accumulation, DDP, clipping, OOM, fp16 overflow)
    loop.py        epochs, stopping rules, signals, logging cadence, validation cadence
    validation.py  valid loss and BLEU
    state.py       the checkpoint's train_state, restoring it, and when the loop saves
The methods below are the seams tests and benchmarks use (and may patch).
"""

from __future__ import annotations

import time
from contextlib import ExitStack
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nmt.distributed import DistEnv
from nmt.model.transformer import Transformer
from nmt.runtime import Runtime
from nmt.training import loop, state, step, validation
from nmt.training.checkpointing import BestTracker, CheckpointManager
from nmt.training.config import TrainConfig
from nmt.training.data import TrainData
from nmt.training.ema import WeightEMA
from nmt.training.logging import TrainLogger
from nmt.training.loop import TrainResult
from nmt.training.meter import TrainMeter
from nmt.training.optim import LRScheduler
from nmt.training.scaler import LossScaler


@dataclass
class Progress:
    """Where the run stands; saved in the checkpoint's train_state."""

    num_updates: int = 0  # optimizer updates made
    epoch: int = 1  # the epoch the next batch belongs to
    position: int = 0  # batches of that epoch's seeded list already consumed (all ranks)
    elapsed: float = 0.0  # training seconds of earlier runs of this save_dir (max_time)


@dataclass(eq=False)
class Trainer:
    """One training run of `cfg` on this process (one rank of a torchrun job, or alone)."""

    cfg: TrainConfig
    env: DistEnv
    runtime: Runtime  # device, precision, autocast
    data: TrainData
    model: Transformer
    ddp: torch.nn.parallel.DistributedDataParallel | None  # wraps `model` under torchrun
    optimizer: torch.optim.Optimizer
    scheduler: LRScheduler
    scaler: LossScaler  # fp16's loss scale; a constant 1 otherwise
    best: BestTracker
    checkpoints: CheckpointManager
    progress: Progress
    logger: TrainLogger
    meter: TrainMeter
    ema: WeightEMA | None = None  # the moving average of the weights (ema_decay > 0)
    oom_skips: int = 0  # updates dropped because a batch ran out of memory
    ooms_in_a_row: int = 0
    last_saved_update: int = -1  # num_updates of the latest checkpoint_last.pt
    # the names checkpoint_last.pt's save copied it to (completed at the start of run())
    copies_of_last: list[str] = field(default_factory=list)
    # save_dir's lock (nmt.training.run_dir), held from build_training to the end of run()
    run_lock: ExitStack = field(default_factory=ExitStack)

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    def run(self) -> TrainResult:
        """Train until a stopping rule fires; always leaves a resumable checkpoint_last.pt."""
        return loop.run(self)

    def close(self) -> None:
        """Release save_dir's lock without running (run() releases it when it ends)."""
        self.run_lock.close()

    def train_step(self, group: list[np.ndarray]) -> None:
        """One optimizer update from `group` (all ranks' batches of this update)."""
        step.train_step(self, group)

    def validate(self) -> dict[str, Any]:
        """Valid loss (and BLEU) of the current weights, over all ranks."""
        self.meter.check_finite()
        start = time.monotonic()
        metrics = validation.evaluate(self.model, self.data, self.cfg, self.runtime, self.env)
        metrics["seconds"] = round(time.monotonic() - start, 2)
        self.meter.exclude(time.monotonic() - start)  # validation is not training time
        return metrics

    def state_dict(self) -> dict[str, Any]:
        """The checkpoint of the current state (a collective: every rank calls it)."""
        return state.checkpoint(self)

    def training_seconds(self) -> float:
        """Training time of this save_dir: earlier runs and this one (max_time counts it)."""
        return self.progress.elapsed + self.meter.run_seconds()
