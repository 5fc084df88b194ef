"""Training as a library: `train(cfg)` runs nmt-train's work in-process.

    from nmt.training import train
    from nmt.training.config import TrainConfig
    result = train(TrainConfig(data="data-bin/demo", save_dir="runs/demo"))

`build_training(cfg)` returns the Trainer (the run's plain state) without running it, and
`run(trainer)` trains it (tests, benchmarks). The modules are imported on first call, so
that `import nmt.training.config` stays cheap.

config.py         TrainConfig and its optim group; AverageConfig
build.py          build_training: everything a run needs, ready to train or to resume
trainer.py        the Trainer: the plain state of one run
loop.py           epochs, stopping rules, and the logging, validation and checkpoint cadence
step.py           one optimizer update: forward/backward, loss scaling, clipping, OOM skips
state.py          train_state in checkpoints; resuming and fine-tuning from one
checkpointing.py  which checkpoint files a run writes and keeps; RNG state capture
run_dir.py        where save_dir may be, and its lock (one run per save_dir)
data.py           the training data and its batches; the valid split
identity.py       the data dir against its meta.json and the checkpoint's record
multilingual.py   a multilingual run's directions, tags and temperature sampling
validation.py     valid loss and BLEU
loss.py           label-smoothed cross-entropy, fused with the output layer
optim.py          Adam and learning-rate schedules, as pure functions
scaler.py         fp16's dynamic loss scale
ema.py            the moving average of the weights (ema_decay)
meter.py          the running figures between log lines, kept on the device
logging.py        tqdm, train.jsonl, TensorBoard (rank 0)
averaging.py      nmt-average: the mean of several checkpoints' weights
"""

from __future__ import annotations

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from nmt.distributed import DistEnv
    from nmt.training.config import TrainConfig
    from nmt.training.loop import TrainResult
    from nmt.training.trainer import Trainer


def build_training(cfg: TrainConfig, env: DistEnv | None = None) -> Trainer:
    """The Trainer of `cfg` (see nmt.training.build), resumed when save_dir has a run."""
    from nmt.training.build import build_training as build

    return build(cfg, env)


def run(trainer: Trainer) -> TrainResult:
    """Train `trainer` until a stopping rule fires (nmt.training.loop.run); it always
    leaves a resumable checkpoint_last.pt."""
    from nmt.training.loop import run as run_loop

    return run_loop(trainer)


def train(cfg: TrainConfig, env: DistEnv | None = None) -> TrainResult:
    """Train, or resume from <save_dir>/checkpoint_last.pt, until a stopping rule fires.

    Under torchrun `env` comes from the environment. SIGINT/SIGTERM end the run after the
    update in progress, with checkpoint_last.pt saved: the result says so (stop_reason
    "signal", and the signal's number).
    """
    return run(build_training(cfg, env))
