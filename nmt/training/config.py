"""Configuration of nmt-train (TrainConfig, in sections) and of nmt-average (AverageConfig).

Plain dataclasses, checked by Hydra against configs/train.yaml and its groups
(configs/model/*.yaml fill `model`, configs/optim/*.yaml fill `optim`) and against
configs/average.yaml. Vocabulary sizes, special ids and tokenizers are not configured here:
they come from the data dir's meta.json, so nothing is configured twice.

TrainConfig keeps at its top the keys most runs set (data, save_dir, model, optim, batch
size, stopping, device, precision); the rest sits in sections named as fairseq's and
OpenNMT's users know them: `validation` (with its `bleu`), `checkpoint`, `resume`, `loss`,
`subword`, `fp16`, `logging`, `distributed`. The flat keys of release 0.1
(valid_split, eval_bleu_beam, ...) still work on the command line for one release
(nmt.config.DEPRECATED_KEYS).

Each config checks itself in `validate()`; every message reads
`option=value: what is wrong; what to do` (nmt.errors.option_error). What a config alone
cannot tell (a device that is not there, a split the data dir lacks, the model against the
vocabulary) is checked where it is used. This module imports no torch, so that composing a
config stays cheap.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Optional

from nmt.data.languages import TAG_STYLES, parse_direction
from nmt.errors import NmtError, choice_error, option_error, setting
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
# max_time counts hours: a budget above this many is more likely minutes or seconds typed
# as hours, and the run starts with a note that says so (TrainConfig.notes)
LIKELY_HOURS = 48


def _at_least(key: str, value: float, low: float, fix: str) -> None:
    if value < low:
        raise option_error(key, value, f"must be {low:g} or more", fix)


def _check_direction(key: str, value: Any, item: Any = None) -> None:
    """Option `key`'s `value` (or its `item`, of a list) must read source-target ("en-de")."""
    direction = value if item is None else item
    try:
        parse_direction(direction, key)
    except NmtError:
        raise option_error(
            key,
            value,
            "not a direction" if item is None else f"{item!r} is not a direction",
            "write source-target with two different language codes, e.g. en-de",
        ) from None


def _in_unit_range(key: str, value: float, fix: str, *, closed: bool = False) -> None:
    """value in [0, 1) (or [0, 1] when `closed`)."""
    if not (0.0 <= value <= 1.0 if closed else 0.0 <= value < 1.0):
        raise option_error(key, value, f"must be in [0, 1{']' if closed else ')'}", fix)


@dataclass
class OptimConfig:
    """Adam, its learning-rate schedule and gradient clipping (configs/optim/*.yaml)."""

    lr: float = 5e-4  # peak learning rate, reached at the end of warmup
    betas: list[float] = field(default_factory=lambda: [0.9, 0.98])  # Adam (beta1, beta2)
    eps: float = 1e-8  # Adam epsilon
    weight_decay: float = 0.0  # weight decay; L2 added to the gradient unless decoupled
    decoupled_weight_decay: bool = False  # true = AdamW (decay applied to weights, times lr)
    clip_norm: float = 0.0  # clip the gradient norm to this; 0 = no clipping (gnorm still logged)
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
            raise option_error("optim.lr", self.lr, "must be positive", "use e.g. 5e-4")
        if len(self.betas) != 2 or not all(0.0 <= b < 1.0 for b in self.betas):
            raise option_error(
                "optim.betas", list(self.betas), "need two values in [0, 1)", "use e.g. [0.9,0.98]"
            )
        if self.scheduler not in SCHEDULERS:
            raise choice_error("optim.scheduler", self.scheduler, SCHEDULERS)
        _at_least("optim.eps", self.eps, 0, "use e.g. 1e-8")
        _at_least("optim.weight_decay", self.weight_decay, 0, "use 0 for none")
        _at_least("optim.clip_norm", self.clip_norm, 0, "use 0 for no clipping")
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
            raise choice_error("optim.schedule_unit", self.schedule_unit, SCHEDULE_UNITS)
        if not 0.0 <= self.warmup_fraction < 1.0:
            raise option_error(
                "optim.warmup_fraction",
                self.warmup_fraction,
                "must be in [0, 1) (a share of max_time)",
                "use e.g. 0.1",
            )
        if not 0.0 < self.decay_fraction <= 1.0:
            raise option_error(
                "optim.decay_fraction",
                self.decay_fraction,
                "must be in (0, 1] (a share of max_time)",
                "use 1 for the end",
            )
        if self.schedule_unit == "updates":
            for key, default in (("warmup_fraction", 0.0), ("decay_fraction", 1.0)):
                value = getattr(self, key)
                if value != default:
                    counted = "warmup_updates" if key == "warmup_fraction" else "decay_updates"
                    raise option_error(
                        "optim." + key,
                        value,
                        f"a share of the time budget, but {unit} counts updates",
                        f"set optim.schedule_unit=time (with max_time), or give optim.{counted}",
                    )
            return
        for key in ("warmup_updates", "decay_updates"):
            value = getattr(self, key)
            if value:
                share = "warmup_fraction" if key == "warmup_updates" else "decay_fraction"
                raise option_error(
                    "optim." + key,
                    value,
                    f"counts updates, but {unit} counts shares of max_time",
                    f"set optim.{key}=0 and give optim.{share}, or use optim.schedule_unit=updates",
                )
        if self.scheduler == "inverse_sqrt" and not self.warmup_fraction:
            raise option_error(
                "optim.warmup_fraction",
                self.warmup_fraction,
                f"inverse_sqrt decays as lr * sqrt(warmup / position), so with {unit} it "
                "needs a warmup",
                "use e.g. optim.warmup_fraction=0.1",
            )
        if self.scheduler == "cosine" and self.decay_fraction <= self.warmup_fraction:
            raise option_error(
                "optim.decay_fraction",
                self.decay_fraction,
                "the cosine decay must end after the warmup "
                f"(optim.warmup_fraction={self.warmup_fraction:g})",
                "raise it",
            )

    def decay_end(self, max_update: int) -> int:
        """The update at which the cosine schedule reaches min_lr (after the warmup)."""
        after = f"after optim.warmup_updates={self.warmup_updates}"
        if self.decay_updates and self.decay_updates <= self.warmup_updates:
            raise option_error(
                "optim.decay_updates",
                self.decay_updates,
                f"the cosine decay must end {after}",
                "raise it",
            )
        if not self.decay_updates and max_update <= self.warmup_updates:
            raise option_error(
                "optim.decay_updates",
                self.decay_updates,
                f"the cosine decay then ends at max_update={max_update}, not {after}",
                "set optim.decay_updates or max_update",
            )
        return self.decay_updates or max_update


@dataclass
class BleuConfig:
    """validation.bleu: decode the valid set and score it with sacrebleu (detokenized)."""

    enabled: bool = False  # decode the valid set at each validation and report BLEU
    max_sentences: int = 0  # decode only the first N valid sentences; 0 = all
    beam: int = 1  # beam size of the decode (nmt-generate's search); 1 = greedy
    len_a: float = 1.2  # decode at most len_a * source length + len_b target tokens
    len_b: int = 10  # (see len_a)

    def validate(self) -> None:
        _at_least("validation.bleu.beam", self.beam, 1, "use 1 for greedy decoding")
        _at_least("validation.bleu.max_sentences", self.max_sentences, 0, "use 0 for all")
        _at_least(
            "validation.bleu.len_a",
            self.len_a,
            0,
            "use 0 for a fixed length limit of validation.bleu.len_b",
        )
        _at_least("validation.bleu.len_b", self.len_b, 0, "use 0 for no constant term")


@dataclass
class ValidationConfig:
    """validation: when the run validates, on what, and what its best checkpoint means."""

    split: Optional[str] = "valid"  # split of the data dir to validate on; null (or '') = none
    max_pairs: int = 0  # validate on the first N pairs of the split; 0 = all
    max_tokens: int = 0  # batch size of validation; 0 = the training max_tokens
    interval_updates: int = 0  # also validate every N updates; 0 = only at epoch ends
    every_epoch: bool = True  # validate at the end of each epoch
    best_metric: str = "loss"  # loss | nll (lower is better) | bleu (higher; needs bleu.enabled)
    patience: int = 0  # stop after this many validations without a new best; 0 = off
    # a multilingual run: the direction ("en-de") whose figure picks the best checkpoint and
    # drives patience; null = the mean over the directions validated
    direction: Optional[str] = None
    bleu: BleuConfig = field(default_factory=BleuConfig)

    def validate(self) -> None:
        if self.direction is not None:
            _check_direction("validation.direction", self.direction)
        if self.best_metric not in BEST_METRICS:
            raise choice_error("validation.best_metric", self.best_metric, BEST_METRICS)
        if self.best_metric == "bleu" and not self.bleu.enabled:
            raise option_error(
                "validation.best_metric",
                "bleu",
                "needs the validation BLEU",
                "set validation.bleu.enabled=true, or use validation.best_metric=loss",
            )
        zero_means = {
            "max_pairs": "the whole split",
            "max_tokens": "the training max_tokens",
            "interval_updates": "only at epoch ends",
            "patience": "off",
        }
        for key, meaning in zero_means.items():
            _at_least(f"validation.{key}", getattr(self, key), 0, f"use 0 for {meaning}")
        self.bleu.validate()


@dataclass
class CheckpointConfig:
    """checkpoint: which checkpoints a run writes and keeps in save_dir."""

    save_interval_updates: int = 0  # also save every N updates; 0 = only at epoch ends
    keep_last: int = 5  # numbered checkpoint_<epoch>_<update>.pt kept; -1 = all
    keep_best: int = 1  # checkpoint.best_<metric>_<value>.pt files kept; 0 = none
    # an exponential moving average of the weights, updated after every update with this
    # decay (nmt.training.ema), saved in each checkpoint's train_state and read by
    # nmt-average weights=ema; 0 = off. 1 / (1 - decay) updates is its memory (0.999: ~1,000)
    ema_decay: float = 0.0
    no_save: bool = False  # write no checkpoints at all (benchmarks)

    def validate(self) -> None:
        _at_least(
            "checkpoint.save_interval_updates",
            self.save_interval_updates,
            0,
            "use 0 for only at epoch ends",
        )
        _at_least(
            "checkpoint.keep_last", self.keep_last, -1, "use -1 to keep every numbered checkpoint"
        )
        _at_least("checkpoint.keep_best", self.keep_best, 0, "use 0 for none")
        _in_unit_range(
            "checkpoint.ema_decay",
            self.ema_decay,
            "use e.g. 0.999 (an average over about the last 1,000 updates), or 0 for off",
        )


@dataclass
class ResumeConfig:
    """resume: what a run takes over from checkpoint_last.pt, or from another run's weights.

    A run resumes from <save_dir>/checkpoint_last.pt whenever it exists: weights, optimizer,
    schedule, data position and RNGs, minus what the reset_* keys restart."""

    finetune_from: Optional[str] = None  # a checkpoint whose weights start a new run
    reset_optimizer: bool = False  # resume weights and counters, but a fresh optimizer
    reset_lr_scheduler: bool = False  # restart the lr schedule from its first step
    reset_dataloader: bool = False  # restart the data from epoch 1, position 0
    # train on a data dir that differs from its meta.json (a swapped SentencePiece model) or
    # from the data the checkpoint was trained on (resume, finetune_from), with a note
    reset_data_check: bool = False

    def validate(self) -> None:
        if self.finetune_from == "":
            raise option_error(
                "resume.finetune_from",
                "",
                "empty",
                "name a checkpoint, or leave it null to start from fresh weights",
            )


@dataclass
class LossConfig:
    """loss: the training objective."""

    label_smoothing: float = 0.1  # epsilon of label-smoothed cross-entropy (0 = plain CE)
    # R-Drop (Liang et al. 2021; fairseq's --rdrop-alpha): every batch runs twice under
    # different dropout, and alpha x the symmetric KL between the two passes' output
    # distributions joins the loss; 0 = off. An update then costs about twice as much.
    rdrop_alpha: float = 0.0

    def validate(self) -> None:
        _in_unit_range(
            "loss.label_smoothing",
            self.label_smoothing,
            "use 0.1 (fairseq's) or 0 for plain cross-entropy",
        )
        _at_least(
            "loss.rdrop_alpha", self.rdrop_alpha, 0, "use e.g. 5 (the R-Drop paper's), or 0 for off"
        )


@dataclass
class SubwordConfig:
    """subword: subword regularization (Kudo 2018; OpenNMT-py's src/tgt_subword_alpha).

    Each batch in SentencePiece segmentations drawn afresh every epoch, on the source,
    the target or both: alpha smooths a unigram model's sampling (lower = more varied
    and longer segmentations; 0.1-0.5 are usual), or is a BPE model's merge-dropout
    probability; 0 = the stored segmentation (off). Validation never samples."""

    src_alpha: float = 0.0
    tgt_alpha: float = 0.0
    nbest_size: int = -1  # unigram: sample among the k best segmentations; -1 = all

    def validate(self) -> None:
        for key in ("src_alpha", "tgt_alpha"):
            _in_unit_range(
                f"subword.{key}",
                getattr(self, key),
                "use e.g. 0.1 (SentencePiece sampling's smoothing, or BPE-dropout's "
                "probability), or 0 for off",
                closed=True,
            )
        nbest = self.nbest_size
        if nbest == 0 or nbest == 1 or nbest < -1:
            raise option_error(
                "subword.nbest_size",
                nbest,
                "must be -1 or 2 or more",
                "use -1 (sample from every segmentation) or k (from the k best)",
            )
        if nbest != -1 and not self.sampling():
            raise option_error(
                "subword.nbest_size",
                nbest,
                "used only by subword sampling, which is off",
                "set subword.src_alpha and/or subword.tgt_alpha, or leave it -1",
            )

    def sampling(self) -> bool:
        """Whether training batches are in sampled segmentations on either side."""
        return self.src_alpha > 0 or self.tgt_alpha > 0


@dataclass
class Fp16Config:
    """fp16: the dynamic loss scale of precision=fp16 (unused by fp32 and bf16)."""

    init_scale: float = 128.0  # the initial loss scale
    min_scale: float = 1e-4  # stop with an error when the scale falls below this

    def validate(self) -> None:
        if not self.init_scale > 0:
            raise option_error("fp16.init_scale", self.init_scale, "must be positive", "use 128")
        _at_least("fp16.min_scale", self.min_scale, 0, "use 0 for no limit")


@dataclass
class LoggingConfig:
    """logging: what rank 0 reports while training."""

    interval: int = 50  # log training figures every N updates
    progress_bar: bool = True  # tqdm progress bar on stderr
    tensorboard: bool = True  # TensorBoard scalars under <save_dir>/tensorboard

    def validate(self) -> None:
        _at_least("logging.interval", self.interval, 1, "use 1 to log every update")


@dataclass
class DistributedConfig:
    """distributed: a torchrun job's settings (the job itself comes from torchrun)."""

    timeout: float = 600.0  # seconds a rank waits for the others before failing

    def validate(self) -> None:
        if not self.timeout > 0:
            raise option_error(
                "distributed.timeout", self.timeout, "must be positive", "use e.g. 600 (seconds)"
            )


@dataclass
class TrainConfig:
    """nmt-train: every field is documented in configs/train.yaml as well."""

    # --- where (required: nothing is trained into a path the user did not name) ---
    data: Optional[str] = None  # data dir written by nmt-preprocess (meta.json inside)
    save_dir: Optional[str] = None  # run dir: checkpoints, config.yaml, train.jsonl, tensorboard/
    # split of the data dir to train on, or several mixed with weights, {split: weight}:
    # each epoch takes weight x size pairs of each (2 = every pair twice, 0.5 = a random half)
    train_split: Any = "train"

    # --- languages (a multilingual data dir; a single pair leaves them at their defaults) ---
    lang_tag: str = "tgt"  # where language tags go: tgt | src_tgt | decoder (nmt.data.languages)
    directions: list[str] = field(default_factory=list)  # directions to train; [] = all
    # each epoch draws direction d's pairs in proportion to size_d^(1/T), over as many pairs
    # in all as T=1 does: 1 = as they come, larger = closer to uniform over directions
    sampling_temperature: float = 1.0

    # --- model and optimizer (config groups) ---
    model: ModelConfig = field(default_factory=ModelConfig)  # configs/model/<preset>.yaml
    optim: OptimConfig = field(default_factory=OptimConfig)  # configs/optim/<recipe>.yaml

    # --- batching ---
    max_tokens: int = 4096  # per batch: sentences x longest side (padding included)
    max_sentences: int = 0  # per batch sentence cap; 0 = no cap
    update_freq: int = 1  # batches accumulated per rank before each optimizer step

    # --- stopping (whichever comes first) ---
    max_epoch: int = 0  # stop after this many epochs; 0 = no limit
    max_update: int = 0  # stop after this many updates; 0 = no limit
    max_time: float = 0.0  # stop after this many HOURS of training; 0 = no limit

    # --- numerics and device ---
    seed: int = 1  # seeds initialisation, dropout and the per-epoch batch shuffle
    device: str = "auto"  # auto (cuda if available) | cpu | cuda | cuda:N
    # fp32 | bf16 (autocast) | fp16 (CUDA, loss scaling) | auto (bf16 if native)
    precision: str = "fp32"
    threads: int = 0  # torch intra-op threads; 0 = torch's default
    max_oom_skips: int = 3  # out-of-memory updates skipped in a row before the run stops

    # --- sections ---
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    resume: ResumeConfig = field(default_factory=ResumeConfig)
    loss: LossConfig = field(default_factory=LossConfig)
    subword: SubwordConfig = field(default_factory=SubwordConfig)
    fp16: Fp16Config = field(default_factory=Fp16Config)
    logging: LoggingConfig = field(default_factory=LoggingConfig)
    distributed: DistributedConfig = field(default_factory=DistributedConfig)

    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first key that cannot work (the sections' included)."""
        self.data_dir()
        self.run_dir()
        if self.precision == "int8":
            raise option_error(
                "precision",
                "int8",
                "for translation only (nmt-generate, nmt-serve, Translator)",
                "train with precision=fp32 or bf16, then translate with precision=int8",
            )
        if self.precision not in PRECISIONS:
            raise choice_error("precision", self.precision, PRECISIONS)
        self.train_weights()  # checks train_split
        self._validate_languages()
        _at_least(
            "max_tokens", self.max_tokens, 1, "use e.g. 4096 (tokens per batch, padding included)"
        )
        _at_least("update_freq", self.update_freq, 1, "use 1 for an update per batch")
        zero_means = {
            "max_sentences": "no cap",
            "max_epoch": "no limit",
            "max_update": "no limit",
            "max_time": "no limit (it counts hours)",
            "threads": "torch's default",
            "max_oom_skips": "stop at the first out-of-memory batch",
        }
        for key, meaning in zero_means.items():
            _at_least(key, getattr(self, key), 0, f"use 0 for {meaning}")
        _at_least("seed", self.seed, 0, "use e.g. 1")
        for section in (
            self.validation,
            self.checkpoint,
            self.resume,
            self.loss,
            self.subword,
            self.fp16,
            self.logging,
            self.distributed,
        ):
            section.validate()
        m = self.model
        if self.loss.rdrop_alpha > 0 and not (
            m.dropout or m.attention_dropout or m.activation_dropout
        ):
            raise option_error(
                "loss.rdrop_alpha",
                self.loss.rdrop_alpha,
                "R-Drop compares two passes that differ only by dropout, but model.dropout, "
                "model.attention_dropout and model.activation_dropout are 0",
                "set model.dropout (e.g. 0.3), or loss.rdrop_alpha=0",
            )
        self.optim.validate()
        if self.optim.schedule_unit == "time" and not self.max_time:
            raise option_error(
                "optim.schedule_unit",
                "time",
                "the schedule runs over the time budget, but max_time=0 sets none",
                "set max_time (hours), or use optim.schedule_unit=updates",
            )
        if self.optim.scheduler == "cosine" and self.optim.schedule_unit == "updates":
            self.optim.decay_end(self.max_update)

    def _validate_languages(self) -> None:
        if self.lang_tag not in TAG_STYLES:
            raise choice_error("lang_tag", self.lang_tag, TAG_STYLES)
        for direction in self.directions:
            _check_direction("directions", list(self.directions), direction)
        if len(set(self.directions)) != len(self.directions):
            raise option_error(
                "directions", list(self.directions), "names a direction twice", "name each once"
            )
        if not (math.isfinite(self.sampling_temperature) and self.sampling_temperature > 0):
            raise option_error(
                "sampling_temperature",
                self.sampling_temperature,
                "must be positive",
                "use 1 (each direction as its size), 5 (closer to uniform) or more",
            )

    def data_dir(self) -> str:
        """`data`, which every run needs: NmtError when it is not given."""
        if not self.data:
            raise option_error(
                "data",
                self.data,
                "required",
                "give the data dir nmt-preprocess wrote, e.g. data=data-bin/demo",
            )
        return self.data

    def run_dir(self) -> str:
        """`save_dir`, which every run needs: NmtError when it is not given."""
        if not self.save_dir:
            raise option_error(
                "save_dir", self.save_dir, "required", "give the run dir, e.g. save_dir=runs/demo"
            )
        return self.save_dir

    def notes(self) -> list[str]:
        """What validate() lets pass but reads like a mistake: lines for the run's log."""
        notes = []
        if self.max_time > LIKELY_HOURS:
            notes.append(max_time_note(self.max_time))
        return notes

    def train_weights(self) -> dict[str, float]:
        """`train_split` as {split: weight}; NmtError naming train_split if it cannot work."""
        value = self.train_split
        example = "give a split name (train_split=train) or splits with weights (train_split={train:1,clean:2})"
        if isinstance(value, str):
            if not value:
                raise option_error(
                    "train_split",
                    value,
                    "empty",
                    "name one (train_split=train), or several with weights "
                    "(train_split={train:1,clean:2})",
                )
            return {value: 1.0}
        shown = value  # option_error writes it as the command line does: {a:1,b:2}
        if not isinstance(value, Mapping) or not value:
            raise option_error("train_split", shown, "not a split name", example)
        weights = {}
        for split, weight in value.items():
            if not isinstance(split, str) or not split:
                raise option_error("train_split", shown, f"{split!r} is not a split name", example)
            if isinstance(weight, bool) or not isinstance(weight, (int, float)):
                raise option_error(
                    "train_split", shown, f"the weight of {split} is not a number", example
                )
            if not (math.isfinite(weight) and weight > 0):
                raise option_error(
                    "train_split",
                    shown,
                    f"the weight of {split} must be positive",
                    "drop the split to leave it out",
                )
            weights[split] = float(weight)
        return weights


def max_time_note(hours: float) -> str:
    """The note for a max_time that reads like minutes or seconds typed as hours."""
    meant = [f"for {hours:g} minutes write max_time={hours / 60:.3g}"]
    if hours >= 600:  # 10 minutes or more, as seconds
        meant.append(f"for {hours:g} seconds max_time={hours / 3600:.3g}")
    return f"max_time={hours:g}: counts hours ({hours:g} h is {hours / 24:.3g} days); " + ", ".join(
        meant
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
    # average a run with checkpoint.ema_decay > 0 keeps in its checkpoints' train_state)
    weights: str = "model"
    output: Optional[str] = None  # null: <run dir>/checkpoint_avg_{last,best}<K>.pt, or
    #                               checkpoint_avg.pt beside the first of the listed files
    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first key that cannot work."""
        paths = self.input_paths()
        if not paths or not all(paths):
            raise option_error(
                "inputs",
                self.inputs,
                "no checkpoints to average",
                "give a run dir (inputs=runs/demo num_last=5) or checkpoint files "
                "(inputs=[a.pt,b.pt])",
            )
        for key in ("num_last", "num_best"):
            _at_least(key, getattr(self, key), 0, "use 0 for off")
        if not 0 <= self.last_fraction <= 1:
            raise option_error(
                "last_fraction",
                self.last_fraction,
                "must be within [0, 1] (e.g. 0.4: the last 40% of the run's updates)",
                "use 0 for off",
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
            raise option_error(
                key,
                getattr(self, key),
                f"picks checkpoints of one run dir, but inputs lists {len(paths)} paths",
                f"give inputs=<run dir>, or drop {key} to average the listed files",
            )
        if self.output == "":
            raise option_error("output", "", "empty", "name the output file, or leave it null")
        if self.weights not in AVERAGED_WEIGHTS:
            raise option_error(
                "weights",
                self.weights,
                "unknown",
                "use model (the trained weights) or ema (their moving average, from a run "
                "trained with checkpoint.ema_decay > 0)",
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
