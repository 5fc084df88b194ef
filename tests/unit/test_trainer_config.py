"""TrainConfig.validate / OptimConfig.validate: every impossible value is one line in the one
style `option=value: what is wrong; what to do`, before anything is built or written."""

from __future__ import annotations

import re
from dataclasses import fields, replace

import pytest

from nmt import runtime
from nmt.errors import NmtError
from nmt.model.config import ModelConfig
from nmt.training import build_training
from nmt.training.config import PRECISIONS, OptimConfig, TrainConfig

STYLE = re.compile(r"^[\w.]+=[^ :]*: [^;]+; \S.*$")  # option=value: what is wrong; what to do


def _message(cfg) -> str:
    with pytest.raises(NmtError) as info:
        cfg.validate()
    message = str(info.value)
    assert STYLE.match(message), message
    return message


@pytest.mark.parametrize(
    "overrides, start",
    [
        ({"precision": "fp8"}, "precision=fp8: unknown; use one of fp32, bf16, fp16, auto"),
        ({"best_metric": "acc"}, "best_metric=acc: unknown; use one of loss, nll, bleu"),
        ({"best_metric": "bleu"}, "best_metric=bleu: needs the validation BLEU; set eval_bleu"),
        ({"train_split": ""}, "train_split='': empty; name one"),
        ({"max_tokens": 0}, "max_tokens=0: must be 1 or more; use e.g. 4096"),
        ({"update_freq": 0}, "update_freq=0: must be 1 or more; use 1"),
        ({"max_update": -1}, "max_update=-1: must be 0 or more; use 0 for no limit"),
        ({"clip_norm": -0.5}, "clip_norm=-0.5: must be 0 or more; use 0 for no clipping"),
        ({"seed": -1}, "seed=-1: must be 0 or more"),
        ({"label_smoothing": 1.5}, "label_smoothing=1.5: must be in [0, 1); use 0.1"),
        ({"keep_last": -2}, "keep_last=-2: must be -1 or more; use -1 to keep every"),
        ({"ddp_timeout": 0.0}, "ddp_timeout=0.0: must be positive"),
        ({"optim": OptimConfig(lr=-1e-3)}, "optim.lr=-0.001: must be positive"),
        ({"optim": OptimConfig(betas=[0.9])}, "optim.betas=[0.9]: need two values in [0, 1)"),
        ({"optim": OptimConfig(scheduler="linear")}, "optim.scheduler=linear: unknown; use one"),
        ({"optim": OptimConfig(warmup_updates=-1)}, "optim.warmup_updates=-1: must be 0 or more"),
        (
            {"optim": OptimConfig(scheduler="cosine", warmup_updates=10), "max_update": 5},
            "optim.decay_updates=0: the cosine decay then ends at max_update=5, not after "
            "optim.warmup_updates=10; set optim.decay_updates or max_update",
        ),
        ({"src_subword_alpha": 1.5}, "src_subword_alpha=1.5: must be in [0, 1]; use e.g. 0.1"),
        ({"tgt_subword_alpha": -0.1}, "tgt_subword_alpha=-0.1: must be in [0, 1]"),
        ({"subword_nbest_size": 1}, "subword_nbest_size=1: must be -1 or 2 or more; use -1"),
        (
            {"subword_nbest_size": 64},
            "subword_nbest_size=64: used only by subword sampling, which is off; set "
            "src_subword_alpha",
        ),
        ({"rdrop_alpha": -1.0}, "rdrop_alpha=-1.0: must be 0 or more"),
        (
            {"rdrop_alpha": 5.0, "model": ModelConfig(dropout=0.0)},
            "rdrop_alpha=5.0: R-Drop compares two passes that differ only by dropout, but "
            "model.dropout, model.attention_dropout and model.activation_dropout are 0; set "
            "model.dropout",
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
    message = _message(replace(TrainConfig(), **overrides))
    assert message.startswith(start), message


def test_every_negative_number_is_refused_naming_its_key():
    """No numeric option takes a negative value (keep_last's -1 is the one exception)."""
    numeric = [
        f.name for f in fields(TrainConfig) if f.type in ("int", "float") and f.name != "keep_last"
    ]
    assert len(numeric) > 20
    for key in numeric:
        message = _message(replace(TrainConfig(), **{key: -2}))
        assert message.startswith(f"{key}=-2: "), message
    for key in [f.name for f in fields(OptimConfig) if f.type in ("int", "float")]:
        message = _message(replace(TrainConfig(), optim=replace(OptimConfig(), **{key: -2})))
        assert message.startswith(f"optim.{key}=-2: "), message


def test_the_defaults_and_the_configs_files_are_valid():
    TrainConfig().validate()
    for scheduler in ("inverse_sqrt", "fixed"):
        replace(TrainConfig(), optim=OptimConfig(scheduler=scheduler)).validate()
    assert PRECISIONS == runtime.PRECISIONS  # the copy that spares configs a torch import


def test_build_training_validates_before_writing_anything(tmp_path):
    cfg = replace(
        TrainConfig(data=str(tmp_path / "data"), save_dir=str(tmp_path / "run")), update_freq=0
    )
    with pytest.raises(NmtError, match=r"^update_freq=0: "):
        build_training(cfg)
    assert not (tmp_path / "run").exists()
