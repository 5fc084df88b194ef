"""The Trainer: the plain state of one training run, built by `build_training(cfg)`.

It holds what a run holds and does nothing itself: functions over it do the work, one job
per module, none of them imported here:
    build.py       build_training: data, model, optimizer, schedule, scaler, resume
    loop.py        run: epochs, stopping rules, signals, logging and validation cadence
    step.py        train_step: one optimizer update (AMP, accumulation, DDP, clipping, OOM,
                   fp16 overflow)
    validation.py  validate: valid loss and BLEU
    state.py       the checkpoint's train_state, restoring it, and when the loop saves
Tests and benchmarks call (and may patch) `loop.run`, `step.train_step` and
`validation.validate`.
"""

from __future__ import annotations

from contextlib import ExitStack
from dataclasses import dataclass, field

import torch

from nmt.distributed import DistEnv
from nmt.model.transformer import Transformer
from nmt.runtime import Runtime
from nmt.training.checkpointing import BestTracker, CheckpointManager
from nmt.training.config import TrainConfig
from nmt.training.data import TrainData
from nmt.training.ema import WeightEMA
from nmt.training.logging import TrainLogger
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
    ema: WeightEMA | None = None  # the moving average of the weights (checkpoint.ema_decay > 0)
    oom_skips: int = 0  # updates dropped because a batch ran out of memory
    ooms_in_a_row: int = 0
    last_saved_update: int = -1  # num_updates of the latest checkpoint_last.pt
    # the names checkpoint_last.pt's save copied it to (completed at the start of run())
    copies_of_last: list[str] = field(default_factory=list)
    # save_dir's lock (nmt.training.run_dir), held from build_training to the end of
    # loop.run(); close it to release save_dir without running
    run_lock: ExitStack = field(default_factory=ExitStack)

    @property
    def device(self) -> torch.device:
        return self.runtime.device


def training_seconds(t: Trainer) -> float:
    """Training time of t's save_dir: earlier runs and this one (max_time counts it)."""
    return t.progress.elapsed + t.meter.run_seconds()
