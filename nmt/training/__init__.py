"""Training as a library: `train(cfg)` runs nmt-train's work in-process.

    from nmt.training import train
    from nmt.training.config import TrainConfig
    result = train(TrainConfig(data="data-bin/demo", save_dir="runs/demo"))

`build_training(cfg)` returns the Trainer (the run's plain state) without running it, and
`run(trainer)` trains it (tests, benchmarks). The modules are imported on first call, so
that `import nmt.training.config` stays cheap.
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
