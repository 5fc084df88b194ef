"""TrainConfig.validate / OptimConfig.validate: every impossible value is one line in the one
style `option=value: what is wrong; what to do`, before anything is built or written; the
config's sections, and its notes for values that read like a mistake."""

from __future__ import annotations

import re
from dataclasses import fields, is_dataclass, replace
from typing import Any

import pytest
from helpers import with_overrides

from nmt import runtime
from nmt.errors import NmtError
from nmt.model.config import ModelConfig
from nmt.training import build_training
from nmt.training.config import LIKELY_HOURS, PRECISIONS, OptimConfig, TrainConfig

STYLE = re.compile(r"^[\w.]+=\S*?: [^;]+; \S.*$")  # option=value: what is wrong; what to do


def _valid() -> TrainConfig:
    return TrainConfig(data="data-bin/x", save_dir="runs/x")


def _message(cfg) -> str:
    with pytest.raises(NmtError) as info:
        cfg.validate()
    message = str(info.value)
    assert STYLE.match(message), message
    return message


@pytest.mark.parametrize(
    "overrides, start",
    [
        ({"data": None}, "data=null: required; give the data dir nmt-preprocess wrote"),
        ({"save_dir": ""}, "save_dir='': required; give the run dir"),
        ({"precision": "fp8"}, "precision=fp8: unknown; use one of fp32, bf16, fp16, auto"),
        (
            {"validation": {"best_metric": "acc"}},
            "validation.best_metric=acc: unknown; use one of loss, nll, bleu",
        ),
        (
            {"validation": {"best_metric": "bleu"}},
            "validation.best_metric=bleu: needs the validation BLEU; set "
            "validation.bleu.enabled=true",
        ),
        ({"train_split": ""}, "train_split='': empty; name one"),
        ({"train_split": {"train": 0}}, "train_split={train:0}: the weight of train must be"),
        ({"max_tokens": 0}, "max_tokens=0: must be 1 or more; use e.g. 4096"),
        ({"update_freq": 0}, "update_freq=0: must be 1 or more; use 1"),
        ({"max_update": -1}, "max_update=-1: must be 0 or more; use 0 for no limit"),
        ({"max_time": -1}, "max_time=-1: must be 0 or more; use 0 for no limit (it counts hours)"),
        (
            {"optim": {"clip_norm": -0.5}},
            "optim.clip_norm=-0.5: must be 0 or more; use 0 for no clipping",
        ),
        ({"seed": -1}, "seed=-1: must be 0 or more"),
        (
            {"loss": {"label_smoothing": 1.5}},
            "loss.label_smoothing=1.5: must be in [0, 1); use 0.1",
        ),
        (
            {"checkpoint": {"keep_last": -2}},
            "checkpoint.keep_last=-2: must be -1 or more; use -1 to keep every",
        ),
        ({"checkpoint": {"ema_decay": 1.0}}, "checkpoint.ema_decay=1.0: must be in [0, 1)"),
        ({"resume": {"finetune_from": ""}}, "resume.finetune_from='': empty; name a checkpoint"),
        ({"distributed": {"timeout": 0.0}}, "distributed.timeout=0.0: must be positive"),
        ({"fp16": {"init_scale": 0.0}}, "fp16.init_scale=0.0: must be positive"),
        ({"logging": {"interval": 0}}, "logging.interval=0: must be 1 or more"),
        ({"validation": {"bleu": {"beam": 0}}}, "validation.bleu.beam=0: must be 1 or more"),
        ({"optim": OptimConfig(lr=-1e-3)}, "optim.lr=-0.001: must be positive"),
        ({"optim": OptimConfig(betas=[0.9])}, "optim.betas=[0.9]: need two values in [0, 1)"),
        ({"optim": OptimConfig(scheduler="linear")}, "optim.scheduler=linear: unknown; use one"),
        ({"optim": OptimConfig(warmup_updates=-1)}, "optim.warmup_updates=-1: must be 0 or more"),
        (
            {"optim": OptimConfig(scheduler="cosine", warmup_updates=10), "max_update": 5},
            "optim.decay_updates=0: the cosine decay then ends at max_update=5, not after "
            "optim.warmup_updates=10; set optim.decay_updates or max_update",
        ),
        (
            {"subword": {"src_alpha": 1.5}},
            "subword.src_alpha=1.5: must be in [0, 1]; use e.g. 0.1",
        ),
        ({"subword": {"tgt_alpha": -0.1}}, "subword.tgt_alpha=-0.1: must be in [0, 1]"),
        ({"subword": {"nbest_size": 1}}, "subword.nbest_size=1: must be -1 or 2 or more; use -1"),
        (
            {"subword": {"nbest_size": 64}},
            "subword.nbest_size=64: used only by subword sampling, which is off; set "
            "subword.src_alpha",
        ),
        ({"loss": {"rdrop_alpha": -1.0}}, "loss.rdrop_alpha=-1.0: must be 0 or more"),
        (
            {"loss": {"rdrop_alpha": 5.0}, "model": ModelConfig(dropout=0.0)},
            "loss.rdrop_alpha=5.0: R-Drop compares two passes that differ only by dropout, "
            "but model.dropout, model.attention_dropout and model.activation_dropout are 0; "
            "set model.dropout",
        ),
        (
            {"optim": OptimConfig(schedule_unit="time", warmup_updates=0, warmup_fraction=0.1)},
            "optim.schedule_unit=time: the schedule runs over the time budget, but max_time=0 "
            "sets none; set max_time (hours)",
        ),
        (
            {"optim": OptimConfig(scheduler="cosine", warmup_updates=10, decay_updates=10)},
            "optim.decay_updates=10: the cosine decay must end after optim.warmup_updates=10; "
            "raise it",
        ),
    ],
)
def test_mistakes_are_one_line_in_the_one_style(overrides, start):
    message = _message(with_overrides(_valid(), **overrides))
    assert message.startswith(start), message


def _numeric_keys(node: Any, prefix: str = "") -> list[str]:
    """The dotted names of every int and float option below `node` (sections included)."""
    keys = []
    for f in fields(node):
        value = getattr(node, f.name)
        if is_dataclass(value) and f.name != "model":  # the model is checked against the vocab
            keys += _numeric_keys(value, f"{prefix}{f.name}.")
        elif f.type in ("int", "float"):
            keys.append(prefix + f.name)
    return keys


def _set(cfg: Any, dotted: str, value: Any) -> Any:
    head, _, rest = dotted.partition(".")
    return replace(cfg, **{head: _set(getattr(cfg, head), rest, value) if rest else value})


def test_every_negative_number_is_refused_naming_its_key():
    """No numeric option takes a negative value (-1 means something to two of them: every
    numbered checkpoint, every segmentation): -2 is refused for all, naming the key."""
    numeric = _numeric_keys(_valid())
    assert len(numeric) > 30 and "validation.bleu.len_b" in numeric and "optim.lr" in numeric
    for key in numeric:
        message = _message(_set(_valid(), key, -2))
        assert message.startswith(f"{key}=-2: "), message


def test_the_defaults_and_the_configs_files_are_valid():
    _valid().validate()
    for scheduler in ("inverse_sqrt", "fixed"):
        replace(_valid(), optim=OptimConfig(scheduler=scheduler)).validate()
    assert PRECISIONS == runtime.PRECISIONS  # the copy that spares configs a torch import


def test_the_library_names_no_demo_paths():
    """TrainConfig() reads and writes nowhere until told: data and save_dir are required."""
    assert (TrainConfig().data, TrainConfig().save_dir) == (None, None)
    assert _message(TrainConfig()).startswith("data=null: required; ")
    assert _message(TrainConfig(data="d")).startswith("save_dir=null: required; ")


@pytest.mark.parametrize("hours", [LIKELY_HOURS + 1, 480, 3600])
def test_a_max_time_that_reads_like_minutes_gets_a_note_naming_the_unit(hours):
    cfg = replace(_valid(), max_time=hours)
    cfg.validate()  # a long budget is allowed: a note, not an error
    (note,) = cfg.notes()
    assert note.startswith(f"max_time={hours}: counts hours ({hours} h is ")
    minutes = hours / 60
    assert f"for {hours} minutes write max_time={minutes:.3g}" in note
    assert (f"for {hours} seconds max_time={hours / 3600:.3g}" in note) == (hours >= 600)


def test_a_max_time_of_hours_gets_no_note():
    assert replace(_valid(), max_time=LIKELY_HOURS).notes() == []
    assert replace(_valid(), max_time=0.25).notes() == []


def test_build_training_validates_before_writing_anything(tmp_path):
    cfg = replace(
        TrainConfig(data=str(tmp_path / "data"), save_dir=str(tmp_path / "run")), update_freq=0
    )
    with pytest.raises(NmtError, match=r"^update_freq=0: "):
        build_training(cfg)
    assert not (tmp_path / "run").exists()
