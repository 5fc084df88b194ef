"""Configuration of nmt-train (TrainConfig and its optim group) and of nmt-average.

Plain dataclasses, checked by Hydra against configs/train.yaml and its groups
(configs/model/*.yaml fill `model`, configs/optim/*.yaml fill `optim`) and against
configs/average.yaml. Vocabulary sizes, special ids and tokenizers are not configured here:
they come from the data dir's meta.json, so nothing is configured twice.

Each config checks itself in `validate()`; every message reads
`option=value: what is wrong; what to do`. What a config alone cannot tell (a device that
is not there, a split the data dir lacks, the model against the vocabulary) is checked
where it is used. This module imports no torch, so that composing a config stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from nmt.errors import NmtError, setting
from nmt.model.config import ModelConfig

SCHEDULERS = ("inverse_sqrt", "cosine", "fixed")
SCHEDULE_UNITS = ("updates", "time")
PRECISIONS = (
    "fp32",
    "bf16",
    "fp16",
    "auto",
)  # nmt.runtime.PRECISIONS (not imported: it needs torch)
BEST_METRICS = ("loss", "nll", "bleu")
AVERAGED_WEIGHTS = ("model", "ema")  # nmt-average weights=


def _at_least(key: str, value: float, low: float, hint: str) -> None:
    if value < low:
        raise NmtError(f"{setting(key, value)}: must be {low:g} or more; {hint}")


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
    # What warmup and decay count: "updates" (warmup_updates, decay_updates), or "time":
    # the fraction of the time budget (max_time) used, so that the schedule ends with the
    # budget whatever the machine's speed (warmup_fraction, decay_fraction).
    schedule_unit: str = "updates"
    warmup_fraction: float = 0.0  # time: the warmup's share of max_time
    decay_fraction: float = 1.0  # time, cosine: the share of max_time at which min_lr is reached

    def validate(self) -> None:
        """Raise NmtError naming the first `optim.<key>` that cannot work."""
        if not self.lr > 0:
            raise NmtError(f"{setting('optim.lr', self.lr)}: must be positive; use e.g. 5e-4")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise NmtError(
                f"{setting('optim.betas', list(self.betas))}: need two values in [0, 1); "
                "use e.g. [0.9,0.98]"
            )
        if self.scheduler not in SCHEDULERS:
            raise NmtError(
                f"{setting('optim.scheduler', self.scheduler)}: unknown; use one of "
                f"{', '.join(SCHEDULERS)}"
            )
        _at_least("optim.eps", self.eps, 0, "use e.g. 1e-8")
        _at_least("optim.weight_decay", self.weight_decay, 0, "use 0 for none")
        _at_least("optim.warmup_updates", self.warmup_updates, 0, "use 0 for no warmup")
        _at_least("optim.warmup_init_lr", self.warmup_init_lr, 0, "use e.g. 1e-7")
        _at_least("optim.min_lr", self.min_lr, 0, "use 0 to decay to zero")
        _at_least("optim.decay_updates", self.decay_updates, 0, "use 0 for max_update")
        self._validate_unit()

    def _validate_unit(self) -> None:
        """The schedule's unit against the keys that count in it: fractions of the time
        budget mean nothing to an update-based schedule, and update counts nothing to a
        time-based one."""
        unit = setting("optim.schedule_unit", self.schedule_unit)
        if self.schedule_unit not in SCHEDULE_UNITS:
            raise NmtError(f"{unit}: unknown; use one of {', '.join(SCHEDULE_UNITS)}")
        warmup = setting("optim.warmup_fraction", self.warmup_fraction)
        decay = setting("optim.decay_fraction", self.decay_fraction)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise NmtError(f"{warmup}: must be in [0, 1) (a share of max_time); use e.g. 0.1")
        if not 0.0 < self.decay_fraction <= 1.0:
            raise NmtError(f"{decay}: must be in (0, 1] (a share of max_time); use 1 for the end")
        if self.schedule_unit == "updates":
            for key, default in (("warmup_fraction", 0.0), ("decay_fraction", 1.0)):
                value = getattr(self, key)
                if value != default:
                    counted = "warmup_updates" if key == "warmup_fraction" else "decay_updates"
                    raise NmtError(
                        f"{setting('optim.' + key, value)}: a share of the time budget, but "
                        f"{unit} counts updates; set optim.schedule_unit=time (with "
                        f"max_time), or give optim.{counted}"
                    )
            return
        for key in ("warmup_updates", "decay_updates"):
            value = getattr(self, key)
            if value:
                share = "warmup_fraction" if key == "warmup_updates" else "decay_fraction"
                raise NmtError(
                    f"{setting('optim.' + key, value)}: counts updates, but {unit} counts "
                    f"shares of max_time; set optim.{key}=0 and give optim.{share}, or use "
                    "optim.schedule_unit=updates"
                )
        if self.scheduler == "inverse_sqrt" and not self.warmup_fraction:
            raise NmtError(
                f"{warmup}: inverse_sqrt decays as lr * sqrt(warmup / position), so with "
                f"{unit} it needs a warmup; use e.g. optim.warmup_fraction=0.1"
            )
        if self.scheduler == "cosine" and self.decay_fraction <= self.warmup_fraction:
            raise NmtError(
                f"{decay}: the cosine decay must end after the warmup "
                f"(optim.warmup_fraction={self.warmup_fraction:g}); raise it"
            )

    def decay_end(self, max_update: int) -> int:
        """The update at which the cosine schedule reaches min_lr (after the warmup)."""
        key = setting("optim.decay_updates", self.decay_updates)
        after = f"after optim.warmup_updates={self.warmup_updates}"
        if self.decay_updates and self.decay_updates <= self.warmup_updates:
            raise NmtError(f"{key}: the cosine decay must end {after}; raise it")
        if not self.decay_updates and max_update <= self.warmup_updates:
            raise NmtError(
                f"{key}: the cosine decay then ends at max_update={max_update}, not {after}; "
                "set optim.decay_updates or max_update"
            )
        return self.decay_updates or max_update


@dataclass
class TrainConfig:
    """nmt-train: every field is documented in configs/train.yaml as well."""

    # --- where ---
    data: str = "data-bin/demo"  # data dir written by nmt-preprocess (meta.json inside)
    save_dir: str = "runs/demo"  # run dir: checkpoints, config.yaml, train.jsonl, tensorboard/
    # split of the data dir to train on, or several mixed with weights, {split: weight}:
    # each epoch takes weight x size pairs of each (2 = every pair twice, 0.5 = a random half)
    train_split: Any = "train"
    valid_split: Optional[str] = "valid"  # split to validate on; null (or "") = no validation
    valid_max_pairs: int = 0  # validate on the first N pairs of valid_split; 0 = all

    # --- model and optimizer (config groups) ---
    model: ModelConfig = field(default_factory=ModelConfig)  # configs/model/<preset>.yaml
    optim: OptimConfig = field(default_factory=OptimConfig)  # configs/optim/<recipe>.yaml

    # --- loss ---
    label_smoothing: float = 0.1  # epsilon of label-smoothed cross-entropy (0 = plain CE)
    # R-Drop (Liang et al. 2021; fairseq's --rdrop-alpha): every batch runs twice under
    # different dropout, and alpha x the symmetric KL between the two passes' output
    # distributions joins the loss; 0 = off. An update then costs about twice as much.
    rdrop_alpha: float = 0.0

    # --- subword regularization (Kudo 2018; OpenNMT-py's src/tgt_subword_alpha) ---
    # Each batch in SentencePiece segmentations drawn afresh every epoch, on the source,
    # the target or both: alpha smooths a unigram model's sampling (lower = more varied
    # and longer segmentations; 0.1-0.5 are usual), or is a BPE model's merge-dropout
    # probability; 0 = the stored segmentation (off). Validation never samples.
    src_subword_alpha: float = 0.0
    tgt_subword_alpha: float = 0.0
    subword_nbest_size: int = -1  # unigram: sample among the k best segmentations; -1 = all

    # --- batching ---
    max_tokens: int = 4096  # per batch: sentences x longest side (padding included)
    max_sentences: int = 0  # per batch sentence cap; 0 = no cap
    valid_max_tokens: int = 0  # max_tokens for validation; 0 = same as max_tokens
    update_freq: int = 1  # batches accumulated per rank before each optimizer step
    seed: int = 1  # seeds initialisation, dropout and the per-epoch batch shuffle

    # --- numerics and device ---
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    precision: str = (
        "fp32"  # fp32 | bf16 (autocast) | fp16 (CUDA, loss scaling) | auto (bf16 if native)
    )
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
    # an exponential moving average of the weights, updated after every update with this
    # decay (nmt.training.ema), saved in each checkpoint's train_state and read by
    # nmt-average weights=ema; 0 = off. 1 / (1 - decay) updates is its memory (0.999: ~1,000)
    ema_decay: float = 0.0
    no_save: bool = False  # write no checkpoints at all (benchmarks)
    reset_optimizer: bool = False  # resume weights and counters, but a fresh optimizer
    reset_lr_scheduler: bool = False  # restart the lr schedule from its first step
    reset_dataloader: bool = False  # restart the data from epoch 1, position 0
    # train on a data dir that differs from its meta.json (a swapped SentencePiece model) or
    # from the data the checkpoint was trained on (resume, finetune_from), with a note
    reset_data_check: bool = False
    finetune_from: Optional[str] = None  # a checkpoint whose weights start a new run

    # --- logging ---
    log_interval: int = 50  # log training figures every N updates
    progress_bar: bool = True  # tqdm progress bar on stderr (rank 0)
    tensorboard: bool = True  # TensorBoard scalars under <save_dir>/tensorboard

    # --- distributed (under torchrun) ---
    ddp_timeout: float = 600.0  # seconds a rank waits for the others before failing

    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first key that cannot work (optim's included)."""
        if self.precision == "int8":
            raise NmtError(
                "precision=int8: for translation only (nmt-generate, nmt-serve, Translator); "
                "train with precision=fp32 or bf16, then translate with precision=int8"
            )
        for key, allowed in (("precision", PRECISIONS), ("best_metric", BEST_METRICS)):
            value = getattr(self, key)
            if value not in allowed:
                raise NmtError(f"{setting(key, value)}: unknown; use one of {', '.join(allowed)}")
        if self.best_metric == "bleu" and not self.eval_bleu:
            raise NmtError(
                "best_metric=bleu: needs the validation BLEU; set eval_bleu=true, or use "
                "best_metric=loss"
            )
        for key in ("data", "save_dir"):
            if not getattr(self, key):
                raise NmtError(f"{setting(key, getattr(self, key))}: empty; name one")
        self.train_weights()  # checks train_split
        at_least_one = {
            "max_tokens": "use e.g. 4096 (tokens per batch, padding included)",
            "update_freq": "use 1 for an update per batch",
            "log_interval": "use 1 to log every update",
            "eval_bleu_beam": "use 1 for greedy decoding",
        }
        for key, hint in at_least_one.items():
            _at_least(key, getattr(self, key), 1, hint)
        zero_means = {
            "max_sentences": "no cap",
            "valid_max_tokens": "max_tokens",
            "valid_max_pairs": "the whole valid split",
            "max_epoch": "no limit",
            "max_update": "no limit",
            "max_time": "no limit",
            "patience": "off",
            "clip_norm": "no clipping",
            "threads": "torch's default",
            "validate_interval_updates": "only at epoch ends",
            "save_interval_updates": "only at epoch ends",
            "keep_best": "none",
            "eval_bleu_max_sentences": "all",
            "eval_bleu_len_a": "a fixed length limit of eval_bleu_len_b",
            "eval_bleu_len_b": "no constant term",
            "max_oom_skips": "stop at the first out-of-memory batch",
            "fp16_min_scale": "no limit",
        }
        for key, meaning in zero_means.items():
            _at_least(key, getattr(self, key), 0, f"use 0 for {meaning}")
        _at_least("seed", self.seed, 0, "use e.g. 1")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise NmtError(
                f"{setting('label_smoothing', self.label_smoothing)}: must be in [0, 1); "
                "use 0.1 (fairseq's) or 0 for plain cross-entropy"
            )
        self._validate_subword_sampling()
        if not 0.0 <= self.ema_decay < 1.0:
            raise NmtError(
                f"{setting('ema_decay', self.ema_decay)}: must be in [0, 1); use e.g. 0.999 "
                "(an average over about the last 1,000 updates), or 0 for off"
            )
        _at_least(
            "rdrop_alpha", self.rdrop_alpha, 0, "use e.g. 5 (the R-Drop paper's), or 0 for off"
        )
        m = self.model
        if self.rdrop_alpha > 0 and not (m.dropout or m.attention_dropout or m.activation_dropout):
            raise NmtError(
                f"{setting('rdrop_alpha', self.rdrop_alpha)}: R-Drop compares two passes that "
                "differ only by dropout, but model.dropout, model.attention_dropout and "
                "model.activation_dropout are 0; set model.dropout (e.g. 0.3), or rdrop_alpha=0"
            )
        if self.keep_last < -1:
            raise NmtError(
                f"{setting('keep_last', self.keep_last)}: must be -1 or more; use -1 to keep "
                "every numbered checkpoint"
            )
        for key in ("fp16_init_scale", "ddp_timeout"):
            if not getattr(self, key) > 0:
                raise NmtError(
                    f"{setting(key, getattr(self, key))}: must be positive; see "
                    "configs/train.yaml for the default"
                )
        self.optim.validate()
        if self.optim.schedule_unit == "time" and not self.max_time:
            raise NmtError(
                "optim.schedule_unit=time: the schedule runs over the time budget, but "
                "max_time=0 sets none; set max_time (hours), or use optim.schedule_unit=updates"
            )
        if self.optim.scheduler == "cosine" and self.optim.schedule_unit == "updates":
            self.optim.decay_end(self.max_update)

    def _validate_subword_sampling(self) -> None:
        for key in ("src_subword_alpha", "tgt_subword_alpha"):
            value = getattr(self, key)
            if not 0.0 <= value <= 1.0:
                raise NmtError(
                    f"{setting(key, value)}: must be in [0, 1]; use e.g. 0.1 (SentencePiece "
                    "sampling's smoothing, or BPE-dropout's probability), or 0 for off"
                )
        nbest = self.subword_nbest_size
        if nbest == 0 or nbest == 1 or nbest < -1:
            raise NmtError(
                f"{setting('subword_nbest_size', nbest)}: must be -1 or 2 or more; use -1 "
                "(sample from every segmentation) or k (from the k best)"
            )
        if nbest != -1 and not self.subword_sampling():
            raise NmtError(
                f"{setting('subword_nbest_size', nbest)}: used only by subword sampling, "
                "which is off; set src_subword_alpha and/or tgt_subword_alpha, or leave it -1"
            )

    def subword_sampling(self) -> bool:
        """Whether training batches are in sampled segmentations on either side."""
        return self.src_subword_alpha > 0 or self.tgt_subword_alpha > 0

    def train_weights(self) -> dict[str, float]:
        """`train_split` as {split: weight}; NmtError naming train_split if it cannot work."""
        value = self.train_split
        example = "give a split name (train_split=train) or splits with weights (train_split={train:1,clean:2})"
        if isinstance(value, str):
            if not value:
                raise NmtError(
                    "train_split='': empty; name one (train_split=train), or several with "
                    "weights (train_split={train:1,clean:2})"
                )
            return {value: 1.0}
        if not isinstance(value, Mapping) or not value:
            raise NmtError(f"train_split={_shown(value)}: not a split name; {example}")
        weights = {}
        for split, weight in value.items():
            if not isinstance(split, str) or not split:
                raise NmtError(
                    f"train_split={_shown(value)}: {split!r} is not a split name; {example}"
                )
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise NmtError(
                    f"train_split={_shown(value)}: the weight of {split} is not a number; {example}"
                )
            if not (math.isfinite(weight) and weight > 0):
                raise NmtError(
                    f"train_split={_shown(value)}: the weight of {split} must be positive; "
                    "drop the split to leave it out"
                )
            weights[split] = float(weight)
        return weights


def _shown(value: Any) -> str:
    """A train_split value as written on the command line: {a:1,b:2}."""
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_number(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(str(v) for v in value) + "]"
    return str(value)


def _number(value: Any) -> str:
    return (
        f"{value:g}"
        if isinstance(value, (int, float)) and not isinstance(value, bool)
        else str(value)
    )


@dataclass
class AverageConfig:
    """nmt-average: the mean of several checkpoints' weights (configs/average.yaml)."""

    inputs: Any = None  # a run dir (with num_last, num_best or last_fraction), or checkpoint files
    num_last: int = 0  # average the newest K numbered checkpoints of the run dir; 0 = off
    num_best: int = 0  # average the K best checkpoint.best_*.pt of the run dir; 0 = off
    # average the numbered checkpoints of the run dir from the last F of its updates; 0 = off
    last_fraction: float = 0.0
    # which weights of each checkpoint: "model" (the trained weights) or "ema" (the moving
    # average a run with ema_decay > 0 keeps in its checkpoints' train_state)
    weights: str = "model"
    output: Optional[str] = None  # null: <run dir>/checkpoint_avg_{last,best}<K>.pt, or
    #                               checkpoint_avg.pt beside the first of the listed files
    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first key that cannot work."""
        paths = self.input_paths()
        if not paths or not all(paths):
            raise NmtError(
                f"{setting('inputs', self.inputs)}: no checkpoints to average; give a run dir "
                "(inputs=runs/demo num_last=5) or checkpoint files (inputs=[a.pt,b.pt])"
            )
        for key in ("num_last", "num_best"):
            _at_least(key, getattr(self, key), 0, "use 0 for off")
        if not 0 <= self.last_fraction <= 1:
            raise NmtError(
                f"{setting('last_fraction', self.last_fraction)}: must be within [0, 1] "
                "(e.g. 0.4: the last 40% of the run's updates); use 0 for off"
            )
        chosen = [k for k in self.selections() if getattr(self, k)]
        if len(chosen) > 1:
            both = ", ".join(f"{k}={getattr(self, k)}" for k in chosen)
            raise NmtError(
                f"{both}: {'both' if len(chosen) == 2 else 'all'} set; choose the newest K "
                "(num_last), the best K (num_best) or the last part of the run (last_fraction)"
            )
        if chosen and len(paths) != 1:
            key = chosen[0]
            raise NmtError(
                f"{setting(key, getattr(self, key))}: picks checkpoints of one run dir, but "
                f"inputs lists {len(paths)} paths; give inputs=<run dir>, or drop {key} to "
                "average the listed files"
            )
        if self.output == "":
            raise NmtError("output='': empty; name the output file, or leave it null")
        if self.weights not in AVERAGED_WEIGHTS:
            raise NmtError(
                f"{setting('weights', self.weights)}: use model (the trained weights) or ema "
                "(their moving average, from a run trained with ema_decay > 0)"
            )

    @staticmethod
    def selections() -> tuple[str, ...]:
        """The keys that pick checkpoints from a run dir (at most one may be set)."""
        return ("num_last", "num_best", "last_fraction")

    def input_paths(self) -> list[str]:
        """`inputs` as a list of paths (one string is a list of one)."""
        if self.inputs is None:
            return []
        if isinstance(self.inputs, (str, int, float)):
            return [str(self.inputs)]
        return [str(p) for p in self.inputs]
