"""The training loop on the demo data dir with a tiny model: outputs, numerics, errors."""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, run_training, tiny_config, with_overrides

from nmt import runtime
from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.generation.loading import load_for_inference
from nmt.training import build_training
from nmt.training import step as step_module
from nmt.training import validation as validation_module
from nmt.training.config import OptimConfig

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")


def _events(save_dir: Path) -> list[dict]:
    lines = (save_dir / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_run_writes_checkpoints_logs_and_config(demo_data_dir, tmp_path):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_update=6,
        validation={"split": "test", "interval_updates": 3},
        checkpoint={"save_interval_updates": 2, "keep_last": 2},
        logging={"tensorboard": True},
    )
    result = run_training(cfg)
    assert result.num_updates == 6 and result.stop_reason == "max_update"
    run = tmp_path / "run"
    names = {p.name for p in run.glob("checkpoint*.pt")}
    assert {
        "checkpoint_last.pt",
        "checkpoint_best.pt",
        "checkpoint_1_4.pt",
        "checkpoint_1_6.pt",
    } <= names
    assert "checkpoint_1_2.pt" not in names  # pruned by checkpoint.keep_last=2
    assert (run / "config.yaml").read_text().startswith("data: ")
    assert list((run / "tensorboard").glob("events.out.tfevents.*"))

    events = _events(run)
    kinds = [e["type"] for e in events]
    assert kinds[0] == "start" and kinds[-1] == "stop"
    train = [e for e in events if e["type"] == "train"]
    assert [e["update"] for e in train] == [2, 4, 6]
    for e in train:
        assert math.isclose(e["ppl"], 2 ** e["nll"], rel_tol=1e-9)
        assert e["tok_s"] > 0 and e["gnorm"] > 0 and e["lr"] > 0
    valid = [e for e in events if e["type"] == "valid"]
    assert [e["update"] for e in valid] == [3, 6]

    ckpt = load_checkpoint(run / "checkpoint_last.pt")  # weights_only=True inside
    state = ckpt["train_state"]
    assert state["num_updates"] == 6 and state["epoch"] == 1 and state["position"] > 0
    assert ckpt["config"]["max_update"] == 6 and ckpt["data"]["src_lang"] == "en"
    bundle = load_for_inference(run / "checkpoint_best.pt")  # what nmt-generate needs, alone
    assert bundle.tgt_tokenizer.decode(bundle.tgt_tokenizer.encode("ein Hund")) == "ein Hund"


@pytest.mark.parametrize(
    "option",
    [{}, dict(subword={"src_alpha": 0.2, "tgt_alpha": 0.2}), dict(loss={"rdrop_alpha": 5.0})],
    ids=["plain", "subword_sampling", "rdrop"],
)
def test_training_lowers_the_loss(demo_data_dir, tmp_path, option):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_update=40,
        optim=OptimConfig(lr=3e-3, scheduler="fixed", warmup_updates=0),
        **option,
        logging={"interval": 20},
        checkpoint={"no_save": True},
    )
    run_training(cfg)
    train = [e for e in _events(tmp_path / "run") if e["type"] == "train"]
    assert train[-1]["loss"] < train[0]["loss"] - 0.5
    if "loss" in option:  # the two passes' KL is logged, and small next to the loss
        assert all(0 < e["kl"] < e["loss"] for e in train)
    else:
        assert "kl" not in train[-1]


def test_bf16_follows_the_fp32_loss_curve(demo_data_dir, tmp_path):
    losses = {}
    for precision in ("fp32", "bf16"):
        cfg = tiny_config(
            demo_data_dir,
            tmp_path / precision,
            precision=precision,
            max_update=8,
            logging={"interval": 4},
            checkpoint={"no_save": True},
        )
        run_training(cfg)
        losses[precision] = [
            e["loss"] for e in _events(tmp_path / precision) if e["type"] == "train"
        ]
    assert losses["fp32"] != losses["bf16"]  # autocast really ran
    assert losses["bf16"] == pytest.approx(losses["fp32"], rel=0.02)


def test_auto_precision_trains_as_the_precision_it_names(demo_data_dir, tmp_path, capsys):
    """precision=auto is this machine's choice (bf16 with native bf16, else fp32): the same
    losses, to the bit, as that precision given by name, and the log says which it was."""
    named = "bf16" if runtime.native_bf16(torch.device("cpu")) else "fp32"
    losses = {}
    for precision in ("auto", named):
        cfg = tiny_config(
            demo_data_dir,
            tmp_path / precision,
            precision=precision,
            max_update=4,
            logging={"interval": 2},
            checkpoint={"no_save": True},
        )
        run_training(cfg)
        losses[precision] = [
            e["loss"] for e in _events(tmp_path / precision) if e["type"] == "train"
        ]
    assert losses["auto"] == losses[named]
    assert f"precision=auto: {named} (this CPU " in capsys.readouterr().err


def test_clip_norm_logs_the_unclipped_norm(demo_data_dir, tmp_path):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_update=2,
        optim={"clip_norm": 1e-3},
        checkpoint={"no_save": True},
    )
    run_training(cfg)
    gnorm = [e["gnorm"] for e in _events(tmp_path / "run") if e["type"] == "train"]
    assert gnorm[0] > 1e-2


def test_max_epoch_and_eval_bleu(demo_data_dir, tmp_path):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_update=0,
        max_epoch=1,
        validation={
            "split": "test",
            "bleu": {"enabled": True, "max_sentences": 8, "len_b": 3},
            "best_metric": "bleu",
        },
    )
    result = run_training(cfg)
    assert result.stop_reason == "max_epoch" and result.epoch == 2
    valid = [e for e in _events(tmp_path / "run") if e["type"] == "valid"]
    assert len(valid) == 1 and 0.0 <= valid[0]["bleu"] <= 100.0
    assert (tmp_path / "run" / f"checkpoint_1_{result.num_updates}.pt").exists()


def test_max_time_stops_after_the_update_in_progress(demo_data_dir, tmp_path):
    result = run_training(
        tiny_config(demo_data_dir, tmp_path / "run", max_update=50, max_time=1e-9)
    )
    assert result.stop_reason == "max_time" and result.num_updates == 1
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]
    assert state["num_updates"] == 1 and state["elapsed"] > 0


@pytest.mark.parametrize("budget", ["max_update", "max_time"])
def test_a_budget_stop_mid_epoch_saves_the_final_weights_as_a_numbered_checkpoint(
    demo_data_dir, tmp_path, budget
):
    """The last numbered checkpoints are what averaging takes (nmt-average num_last=K);
    a run stopped by its budget between epoch ends must count its final weights among
    them, not only the last epoch end's."""
    limits = {"max_update": 3} if budget == "max_update" else {"max_update": 50, "max_time": 1e-9}
    run = tmp_path / "run"
    result = run_training(
        tiny_config(demo_data_dir, run, **limits, checkpoint={"save_interval_updates": 0})
    )
    assert result.stop_reason == budget and result.epoch == 1  # mid-epoch
    final = run / f"checkpoint_1_{result.num_updates}.pt"
    assert final.exists()
    last_weights = load_checkpoint(run / "checkpoint_last.pt")["model"]
    final_weights = load_checkpoint(final)["model"]
    assert all(torch.equal(final_weights[k], v) for k, v in last_weights.items())


def test_patience_stops_the_run(demo_data_dir, tmp_path, monkeypatch):
    values = iter([5.0, 4.0, 4.5, 4.6, 4.7])
    monkeypatch.setattr(validation_module, "validate", lambda t: {"loss": next(values), "nll": 0.0})
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_update=20,
        validation={"split": "test", "interval_updates": 1, "patience": 2},
    )
    result = run_training(cfg)
    assert result.stop_reason == "patience" and result.num_updates == 4 and result.best == 4.0
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]
    assert state["best"]["bad_validations"] == 2


def test_non_finite_loss_stops_naming_the_update(demo_data_dir, tmp_path, monkeypatch):
    real_loss = step_module.output_layer_loss
    calls = {"n": 0}

    def poisoned(features, weight, target, eps, pad, **options):
        calls["n"] += 1
        out = real_loss(features, weight, target, eps, pad, **options)
        if calls["n"] == 3:  # update 3 (update_freq 1)
            out.loss = out.loss * float("nan")
        return out

    monkeypatch.setattr(step_module, "output_layer_loss", poisoned)
    cfg = tiny_config(
        demo_data_dir, tmp_path / "run", max_update=10, checkpoint={"save_interval_updates": 2}
    )
    with pytest.raises(NmtError, match=r"update 3: the loss or gradient is not finite"):
        run_training(cfg)
    # the last good checkpoint is untouched
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert state["train_state"]["num_updates"] == 2
    assert all(torch.isfinite(t).all() for t in state["model"].values())


def test_long_sentences_are_skipped_on_train_and_an_error_on_valid(demo_data_dir, tmp_path, capsys):
    short = replace(TINY_MODEL, max_source_positions=12, max_target_positions=12)
    cfg = tiny_config(
        demo_data_dir, tmp_path / "run", model=short, max_update=1, checkpoint={"no_save": True}
    )
    run_training(cfg)
    err = capsys.readouterr().err
    assert "train: skipped" in err and "longer than the model's positions" in err
    with pytest.raises(NmtError, match=r"/test: \d+ pairs .* longer than the model's positions"):
        build_training(with_overrides(cfg, validation={"split": "test"}))


@pytest.mark.parametrize(
    "overrides, key",
    [
        ({"precision": "fp16"}, "precision=fp16"),
        ({"precision": "fp8"}, "precision=fp8"),
        ({"validation": {"best_metric": "bleu"}}, "validation.best_metric=bleu"),
        ({"update_freq": 0}, "update_freq=0"),
        ({"train_split": "nope"}, "train_split=nope"),
        ({"data": "/nonexistent/data-bin"}, "/nonexistent/data-bin"),
    ],
)
def test_config_mistakes_are_one_line_errors_naming_the_key(
    demo_data_dir, tmp_path, overrides, key
):
    cfg = tiny_config(demo_data_dir, tmp_path / "run", **overrides)
    with pytest.raises(NmtError) as info:
        build_training(cfg)
    assert key in str(info.value) and "\n" not in str(info.value)


def test_resuming_with_another_architecture_is_refused(demo_data_dir, tmp_path):
    run_training(tiny_config(demo_data_dir, tmp_path / "run", max_update=1))
    wider = replace(TINY_MODEL, embed_dim=32)
    with pytest.raises(NmtError, match="model.embed_dim=16 but the config says 32"):
        build_training(tiny_config(demo_data_dir, tmp_path / "run", model=wider, max_update=2))


def test_cli_composes_the_yaml_and_reports_errors_in_one_line(demo_data_dir, tmp_path, capsys):
    from nmt.cli import compose_config, main, to_dataclass

    cfg = to_dataclass(
        compose_config(
            "train",
            [
                f"data={demo_data_dir}",
                f"save_dir={tmp_path / 'composed'}",
                "model=transformer_small",
                "optim=adam_cosine",
                "max_update=2000",  # the cosine decay must end after the 1000 warmup updates
            ],
        )
    )
    assert cfg.model.encoder_layers == 3 and cfg.optim.scheduler == "cosine"
    with pytest.raises(SystemExit) as info:
        main("train", [f"data={tmp_path / 'missing'}", f"save_dir={tmp_path / 'run'}"])
    assert info.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nmt-train: error: ") and "missing" in err[0]
