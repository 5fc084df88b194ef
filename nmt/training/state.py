"""The run's state in checkpoints: what train_state holds, how a run restores it (resume
from checkpoint_last.pt, or start from resume.finetune_from's weights), and when the loop saves.

Resuming restores weights, optimizer, schedule offset, loss scaler, every RNG, the epoch
and the batch position inside it, counters, best metric and patience: on CPU in fp32 a
resumed run is bitwise equal to an uninterrupted one.
"""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch

from nmt import distributed
from nmt.checkpoint import build_checkpoint, load_checkpoint
from nmt.errors import NmtError
from nmt.training.checkpointing import (
    COPIES,
    BestTracker,
    rng_state,
    seed_rank_stream,
    set_rng_state,
)
from nmt.training.config import TrainConfig
from nmt.training.data import TrainData
from nmt.training.ema import WeightEMA
from nmt.training.identity import check_checkpoint_data
from nmt.training.optim import LRScheduler
from nmt.training.scaler import LossScaler
from nmt.training.trainer import Progress, Trainer, training_seconds

# Model settings that may change between a checkpoint and the run resuming from it.
RESUMABLE_MODEL_CHANGES = ("dropout", "attention_dropout", "activation_dropout")


def checkpoint(t: Trainer) -> dict[str, Any]:
    """The checkpoint of the current state (see docs/ARCHITECTURE.md). A collective: the
    RNG states of all ranks are gathered, so every rank calls it."""
    cfg = t.cfg
    train_state = {
        "num_updates": t.progress.num_updates,
        "epoch": t.progress.epoch,  # the epoch the next batch belongs to
        "position": t.progress.position,  # batches of that epoch's list already consumed
        "seed": cfg.seed,
        "optimizer": t.optimizer.state_dict(),
        "lr_scheduler": t.scheduler.state_dict(),
        "scaler": t.scaler.state_dict(),
        "rng": distributed.all_gather_objects(rng_state(t.device)),  # one entry per rank
        "best": t.best.state_dict(),
        "elapsed": training_seconds(t),
        "world_size": t.env.world_size,
        "update_freq": cfg.update_freq,
    }
    if t.ema is not None:
        train_state["ema"] = t.ema.state_dict()
    return build_checkpoint(
        model_state=t.model.state_dict(),
        model_config=asdict(cfg.model),
        data=t.data.checkpoint_info(),
        src_tokenizer=t.data.tokenizer_bytes["src"],
        tgt_tokenizer=t.data.tokenizer_bytes["tgt"],
        train_state=train_state,
        config=asdict(cfg),
    )


def check_compatible(
    ckpt: dict[str, Any],
    path: Path,
    what: str,
    cfg: TrainConfig,
    data: TrainData,
    resuming: bool = True,
) -> None:
    """The checkpoint's model and data must be the ones configured now (nmt.training.
    identity); `what` says what to do otherwise."""
    saved, current = ckpt["model_config"], asdict(cfg.model)
    for key in sorted(set(saved) | set(current)):
        if key not in RESUMABLE_MODEL_CHANGES and saved.get(key) != current.get(key):
            raise NmtError(
                f"{path}: was trained with model.{key}={saved.get(key)!r} but the config "
                f"says {current.get(key)!r}; {what}"
            )
    check_checkpoint_data(
        ckpt,
        path,
        cfg,
        data.meta,
        data.tokenizer_bytes,
        resuming=resuming,
        remedy=what,
        notes=data.notes,
    )


def restore(
    cfg: TrainConfig,
    data: TrainData,
    last: Path,
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    scaler: LossScaler,
    best: BestTracker,
    progress: Progress,
    ema: WeightEMA | None,
    rank: int,
    device: torch.device,
) -> tuple[str | None, list[str]]:
    """Resume from `last` (checkpoint_last.pt) when it exists, else start from
    resume.finetune_from's weights when set. Returns a line for the log (None for a fresh run) and
    the names `last`'s save copied it to (CheckpointManager.complete_copies). `ema`
    continues its saved average, or starts from the weights loaded (a checkpoint without
    one: checkpoint.ema_decay was 0 before)."""
    # Loaded to the CPU whatever the device: load_state_dict copies the weights (and the
    # optimizer its state) to the parameters' device, and RNG states must be CPU tensors.
    if last.exists():
        ckpt = load_checkpoint(last, map_location="cpu")
        check_compatible(
            ckpt,
            last,
            "resume with the same model settings and data dir, or use another save_dir",
            cfg,
            data,
        )
        train_state = ckpt.get("train_state")
        if train_state is None:
            raise NmtError(
                f"{last}: holds weights only (averaged or imported); start a new "
                f"save_dir with resume.finetune_from={last}"
            )
        model.load_state_dict(ckpt["model"])
        load_train_state(
            train_state, cfg, optimizer, scheduler, scaler, best, progress, rank, device
        )
        if ema is not None:
            if "ema" in train_state:
                ema.load_state_dict(train_state["ema"])
            else:
                ema.restart()
        line = (
            f"resumed from {last} at update {progress.num_updates} "
            f"(epoch {progress.epoch}, batch {progress.position})"
        )
        return line, list(train_state.get(COPIES, []))
    if cfg.resume.finetune_from:
        path = Path(cfg.resume.finetune_from)
        ckpt = load_checkpoint(path, map_location="cpu")
        check_compatible(
            ckpt, path, "finetune with the same model and vocabulary", cfg, data, resuming=False
        )
        model.load_state_dict(ckpt["model"])
        if ema is not None:
            ema.restart()
        return f"starting from the weights of {path} (fresh optimizer and counters)", []
    return None, []


def load_train_state(
    state: dict[str, Any],
    cfg: TrainConfig,
    optimizer: torch.optim.Optimizer,
    scheduler: LRScheduler,
    scaler: LossScaler,
    best: BestTracker,
    progress: Progress,
    rank: int,
    device: torch.device,
) -> None:
    """Counters, optimizer, schedule, scaler, patience and RNGs, minus what cfg resets;
    `device` is this rank's (its CUDA generator is restored)."""
    progress.num_updates = int(state["num_updates"])
    progress.elapsed = float(state.get("elapsed", 0.0))
    if not cfg.resume.reset_optimizer:
        optimizer.load_state_dict(state["optimizer"])
        for group in optimizer.param_groups:  # the config's settings win, as in fairseq
            group.update(
                betas=tuple(cfg.optim.betas), eps=cfg.optim.eps, weight_decay=cfg.optim.weight_decay
            )
        if state.get("scaler"):
            scaler.load_state_dict(state["scaler"])
    if cfg.resume.reset_lr_scheduler:
        scheduler.restart(progress.num_updates, progress.elapsed)
    else:
        scheduler.load_state_dict(state["lr_scheduler"])
    if not cfg.resume.reset_dataloader:
        progress.epoch = int(state["epoch"])
        progress.position = int(state["position"])
    best.load_state_dict(state["best"])
    rngs = state["rng"]  # one per rank of the saved run
    if rank < len(rngs):
        set_rng_state(rngs[rank], device)
    else:  # resumed with more ranks: rank 0's state again would repeat its dropout masks
        seed_rank_stream(cfg.seed, rank, progress.num_updates)


# Stops that end a run's budget: its final weights, trained longest and (with a decaying
# schedule) at the lowest learning rate, are the ones checkpoint averaging wants most.
BUDGET_STOPS = ("max_update", "max_time")


def numbered_due(cfg: TrainConfig, update: int, end_of_epoch: bool, stop: str | None) -> bool:
    """A numbered checkpoint_<epoch>_<update>.pt is written at epoch ends, every
    checkpoint.save_interval_updates, and when max_update or max_time ends the run mid-epoch (as
    OpenNMT-py and Marian save their last step), so that averaging the newest ones
    includes the final weights."""
    return (
        end_of_epoch
        or stop in BUDGET_STOPS
        or bool(
            cfg.checkpoint.save_interval_updates
            and update % cfg.checkpoint.save_interval_updates == 0
        )
    )


def save_after_update(
    t: Trainer, *, end_of_epoch: bool, epoch: int, best_value: float | None, stop: str | None
) -> None:
    """After an update: save when a numbered checkpoint is due, a new best was found
    (`best_value`), or the run stops (`stop`: why); checkpoint_last.pt is part of every
    save."""
    numbered = numbered_due(t.cfg, t.progress.num_updates, end_of_epoch, stop)
    if numbered or best_value is not None or stop is not None:
        save(t, numbered=numbered, best_value=best_value, epoch=epoch)


def save(t: Trainer, *, numbered: bool, best_value: float | None, epoch: int | None = None) -> None:
    """Write checkpoint_last.pt (and a numbered / best one); a collective, rank 0 writes."""
    if t.cfg.checkpoint.no_save:
        return
    t.meter.check_finite()  # never overwrite a good checkpoint with NaN weights
    ckpt = checkpoint(t)
    if t.env.is_main:
        written = t.checkpoints.save(
            ckpt,
            epoch=t.progress.epoch if epoch is None else epoch,
            update=t.progress.num_updates,
            numbered=numbered,
            best_value=best_value,
        )
        t.logger.event("save", update=t.progress.num_updates, files=[p.name for p in written])
    t.last_saved_update = t.progress.num_updates
