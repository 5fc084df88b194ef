"""build_training(cfg): everything a run needs, ready to train or to resume.

In order: the config's own checks, the place of save_dir, device and precision
(nmt.runtime), the process group under torchrun, save_dir's lock (nmt.training.run_dir),
the data (checked against its meta.json), the model (the same initial weights on every
rank), optimizer, schedule and loss scaler, then the restore from checkpoint_last.pt (or
resume.finetune_from) with its compatibility checks, and last the DDP wrapper and the logs.
"""

from __future__ import annotations

from contextlib import ExitStack

import torch

from nmt import distributed, runtime
from nmt.data.meta import DataMeta
from nmt.distributed import DistEnv
from nmt.errors import NmtError
from nmt.model.transformer import Transformer
from nmt.training.checkpointing import BestTracker, CheckpointManager, seed_rank_stream
from nmt.training.config import TrainConfig
from nmt.training.data import load_train_data
from nmt.training.ema import WeightEMA
from nmt.training.logging import TrainLogger
from nmt.training.meter import TrainMeter
from nmt.training.optim import build_optimizer, build_scheduler
from nmt.training.run_dir import check_place, lock_run_dir
from nmt.training.scaler import LossScaler
from nmt.training.state import restore
from nmt.training.trainer import Progress, Trainer
from nmt.vocab import PAD


def build_training(cfg: TrainConfig, env: DistEnv | None = None) -> Trainer:
    """The Trainer of `cfg` on this process (`env`: torchrun's, read from the environment
    when None). Resumes from <save_dir>/checkpoint_last.pt when it exists."""
    cfg.validate()
    env = env or distributed.env_from_environ()
    check_place(cfg)
    rt = runtime.setup(
        cfg.device,
        cfg.precision,
        threads=cfg.threads,
        local_rank=env.local_rank,
        distributed=env.is_distributed,
    )
    distributed.init_process_group(env, rt.device, cfg.distributed.timeout)
    try:
        run_lock, notes = lock_run_dir(cfg, env)  # before anything is written or deleted
        try:
            return _build(cfg, env, rt, run_lock, notes)
        except BaseException:
            run_lock.close()
            raise
    except BaseException:
        # Leave the job here, as training.loop.run does after a failure: a group left to
        # interpreter exit was torn down with the process's other threads, and a rank
        # died of SIGABRT ("terminate called without an active exception") after its
        # one-line error, 2 of 28 runs on a loaded 2-vCPU machine (docs/reliability.md, 12b).
        distributed.destroy_process_group(wait_for_peers=False)
        raise


def _build(
    cfg: TrainConfig, env: DistEnv, rt: runtime.Runtime, run_lock: ExitStack, notes: list[str]
) -> Trainer:
    data = load_train_data(cfg)
    model = build_model(cfg, data.meta, rt.device, env.rank)
    optimizer = build_optimizer(model.parameters(), cfg.optim)
    scheduler = build_scheduler(
        optimizer, cfg.optim, max_update=cfg.max_update, max_time=cfg.max_time
    )
    scaler = LossScaler(cfg.fp16.init_scale, enabled=rt.precision == "fp16")
    maximize = cfg.validation.best_metric == "bleu"
    # a best of another direction (validation.direction) is another figure: it starts afresh
    tracked = cfg.validation.best_metric
    if cfg.validation.direction:
        tracked += f"@{cfg.validation.direction}"
    best = BestTracker(tracked, maximize)
    checkpoints = CheckpointManager(
        cfg.run_dir(),
        keep_last=cfg.checkpoint.keep_last,
        keep_best=cfg.checkpoint.keep_best,
        metric=cfg.validation.best_metric,
        maximize=maximize,
    )
    progress = Progress()
    ema = WeightEMA(model, cfg.checkpoint.ema_decay) if cfg.checkpoint.ema_decay > 0 else None
    if env.is_distributed:  # every rank resumes, or none: save_dir must be shared
        distributed.check_shared(checkpoints.last_path, env)
    restored, copies_of_last = restore(
        cfg,
        data,
        checkpoints.last_path,
        model=model,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        best=best,
        progress=progress,
        ema=ema,
        rank=env.rank,
        device=rt.device,
    )
    ddp = None
    if env.is_distributed:
        ddp = torch.nn.parallel.DistributedDataParallel(
            model,
            device_ids=[rt.device] if rt.device.type == "cuda" else None,
            # Buffers (position tables) are constants: no need to sync them every forward.
            forward_sync_buffers=False,
            gradient_as_bucket_view=True,
        )
    logger = TrainLogger(
        cfg.run_dir(),
        enabled=env.is_main,
        progress_bar=cfg.logging.progress_bar,
        tensorboard=cfg.logging.tensorboard,
        start_update=progress.num_updates,
    )
    notes = [*cfg.notes(), *notes]  # e.g. a max_time that reads like minutes
    if rt.note:  # what precision=auto chose, or that bf16 is emulated here
        notes = [rt.note, *notes]
    for line in notes + data.notes + ([restored] if restored else []):
        logger.message(line)
    return Trainer(
        cfg=cfg,
        env=env,
        runtime=rt,
        data=data,
        model=model,
        ddp=ddp,
        optimizer=optimizer,
        scheduler=scheduler,
        scaler=scaler,
        best=best,
        checkpoints=checkpoints,
        progress=progress,
        logger=logger,
        meter=TrainMeter(rt.device, rt.precision, report_kl=cfg.loss.rdrop_alpha > 0),
        ema=ema,
        last_saved_update=progress.num_updates if checkpoints.last_path.exists() else -1,
        copies_of_last=copies_of_last,
        run_lock=run_lock,
    )


def build_model(cfg: TrainConfig, meta: DataMeta, device: torch.device, rank: int) -> Transformer:
    """The model of cfg.model for the data dir's vocabularies, with the same initial weights
    on every rank; then each rank's dropout stream is seeded apart."""
    if cfg.model.share_all_embeddings and not meta.joint_vocab:
        # equal sizes are not enough: id i is a different piece on each side
        raise NmtError(
            f"model.share_all_embeddings=true: {cfg.data} has separate source and "
            "target vocabularies; set it to false or preprocess with spm.joint=true"
        )
    cfg.model.validate(meta.src_vocab_size, meta.tgt_vocab_size, PAD)
    torch.manual_seed(cfg.seed)
    model = Transformer(
        cfg.model,
        src_vocab_size=meta.src_vocab_size,
        tgt_vocab_size=meta.tgt_vocab_size,
        pad_id=PAD,
    ).to(device)
    seed_rank_stream(cfg.seed, rank)  # rank 0 of a job draws as a lone process does
    return model
