"""Configuration of nmt-train: TrainConfig (configs/train.yaml) and its optim group.

Plain dataclasses, checked by Hydra against configs/train.yaml and its groups
(configs/model/*.yaml fill `model`, configs/optim/*.yaml fill `optim`). Vocabulary sizes,
special ids and tokenizers are not configured here: they come from the data dir's
meta.json, so nothing is configured twice.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from nmt.model.config import ModelConfig

SCHEDULERS = ("inverse_sqrt", "cosine", "fixed")
PRECISIONS = ("fp32", "bf16", "fp16")
BEST_METRICS = ("loss", "nll", "bleu")


@dataclass
class OptimConfig:
    """Adam and its learning-rate schedule (configs/optim/*.yaml)."""

    lr: float = 5e-4  # peak learning rate, reached at the end of warmup
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam (beta1, beta2)
    eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 0.0  # weight decay; L2 added to the gradient unless decoupled
    decoupled_weight_decay: bool = False  # true = AdamW (decay applied to weights, times lr)
    scheduler: str = "inverse_sqrt"  # inverse_sqrt | cosine | fixed
    warmup_updates: int = 4000  # linear warmup from warmup_init_lr to lr over this many updates
    warmup_init_lr: float = 1e-7  # learning rate of the first update
    min_lr: float = 0.0  # cosine: the learning rate at the end of the decay
    decay_updates: int = 0  # cosine: update at which min_lr is reached; 0 = max_update


@dataclass
class TrainConfig:
    """nmt-train: every field is documented in configs/train.yaml as well."""

    # --- where ---
    data: str = "data-bin/demo"  # data dir written by nmt-preprocess (meta.json inside)
    save_dir: str = "runs/demo"  # run dir: checkpoints, config.yaml, train.jsonl, tensorboard/
    train_split: str = "train"  # split of the data dir to train on
    valid_split: str = "valid"  # split to validate on; "" = no validation

    # --- model and optimizer (config groups) ---
    model: ModelConfig = field(default_factory=ModelConfig)  # configs/model/<preset>.yaml
    optim: OptimConfig = field(default_factory=OptimConfig)  # configs/optim/<recipe>.yaml

    # --- loss ---
    label_smoothing: float = 0.1  # epsilon of label-smoothed cross-entropy (0 = plain CE)

    # --- batching ---
    max_tokens: int = 4096  # per batch: sentences x longest side (padding included)
    max_sentences: int = 0  # per batch sentence cap; 0 = no cap
    valid_max_tokens: int = 0  # max_tokens for validation; 0 = same as max_tokens
    update_freq: int = 1  # batches accumulated per rank before each optimizer step
    seed: int = 1  # seeds initialisation, dropout and the per-epoch batch shuffle

    # --- numerics and device ---
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    precision: str = "fp32"  # fp32 | bf16 (autocast, CPU or CUDA) | fp16 (CUDA, loss scaling)
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    max_oom_skips: int = 3  # out-of-memory updates skipped in a row before the run stops
    clip_norm: float = 0.0  # clip the gradient norm to this; 0 = no clipping (gnorm still logged)
    fp16_init_scale: float = 128.0  # fp16: initial loss scale
    fp16_min_scale: float = 1e-4  # fp16: stop with an error if the scale falls below this

    # --- stopping ---
    max_epoch: int = 0  # stop after this many epochs; 0 = no limit
    max_update: int = 0  # stop after this many updates; 0 = no limit
    max_time: float = 0.0  # stop after this many hours of training; 0 = no limit
    patience: int = 0  # stop after this many validations without a new best; 0 = off

    # --- validation ---
    validate_interval_updates: int = 0  # also validate every N updates; 0 = only at epoch end
    validate_every_epoch: bool = True  # validate at the end of each epoch
    best_metric: str = "loss"  # loss | nll (lower is better) | bleu (needs eval_bleu)
    eval_bleu: bool = False  # decode the valid set greedily and report sacrebleu BLEU
    eval_bleu_max_sentences: int = 0  # decode only the first N valid sentences; 0 = all
    eval_bleu_beam: int = 1  # beam size of the validation decode; 1 = greedy
    eval_bleu_len_a: float = 1.2  # decode at most a * source length + b target tokens
    eval_bleu_len_b: int = 10  # (see eval_bleu_len_a)

    # --- checkpoints ---
    save_interval_updates: int = 0  # also save every N updates; 0 = only at epoch end
    keep_last: int = 5  # numbered checkpoints kept; -1 = all
    keep_best: int = 1  # checkpoint.best_<metric>_<value>.pt files kept; 0 = none
    no_save: bool = False  # write no checkpoints at all (benchmarks)
    reset_optimizer: bool = False  # resume weights and counters, but a fresh optimizer
    reset_lr_scheduler: bool = False  # restart the lr schedule from its first step
    reset_dataloader: bool = False  # restart the data from epoch 1, position 0
    finetune_from: Optional[str] = None  # a checkpoint whose weights start a new run

    # --- logging ---
    log_interval: int = 50  # log training figures every N updates
    progress_bar: bool = True  # tqdm progress bar on stderr (rank 0)
    tensorboard: bool = True  # TensorBoard scalars under <save_dir>/tensorboard

    # --- distributed (under torchrun) ---
    ddp_timeout: float = 600.0  # seconds a rank waits for the others before failing

    debug: bool = False  # full tracebacks instead of one-line errors
