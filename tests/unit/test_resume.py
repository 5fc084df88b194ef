"""Resuming: bitwise equal to an uninterrupted run (CPU, fp32), signals, resets, finetuning."""

from __future__ import annotations

import os
import shutil
import signal
from typing import Any

import pytest
import torch
from helpers import assert_bitwise_equal, last_params, run_training, tiny_config

from nmt.checkpoint import load_checkpoint, save_checkpoint
from nmt.config import DEPRECATED_KEYS
from nmt.training import build_training
from nmt.training import step as step_module
from nmt.training.averaging import average
from nmt.training.config import AverageConfig

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")

TOTAL = 16  # the demo valid split at max_tokens=500, update_freq=2: ~10 updates per epoch


def _epoch_length(demo_data_dir, tmp_path) -> int:
    t = build_training(tiny_config(demo_data_dir, tmp_path / "probe", update_freq=2))
    from nmt.data.batching import epoch_batches

    batches = epoch_batches(
        t.data.train_indices,
        t.data.train.src_sizes,
        t.data.train.tgt_sizes,
        max_tokens=500,
        max_sentences=0,
        seed=1,
        epoch=1,
    )
    assert [b.tolist() for b in t.data.epoch_batches(1)] == [b.tolist() for b in batches]
    return -(-len(batches) // 2)


@pytest.fixture(scope="module")
def uninterrupted(demo_data_dir, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("straight")
    run_training(tiny_config(demo_data_dir, save_dir, update_freq=2, max_update=TOTAL))
    return save_dir


@pytest.mark.parametrize("stop_at", ["mid_epoch", "epoch_end"])
def test_resume_is_bitwise_equal_to_an_uninterrupted_run(
    demo_data_dir, tmp_path, uninterrupted, stop_at
):
    per_epoch = _epoch_length(demo_data_dir, tmp_path)
    assert per_epoch < TOTAL  # the run crosses an epoch boundary
    first = 5 if stop_at == "mid_epoch" else per_epoch
    run_training(tiny_config(demo_data_dir, tmp_path / "run", update_freq=2, max_update=first))
    state = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]
    assert state["num_updates"] == first
    assert (state["epoch"], state["position"] == 0) == (
        (1, False) if stop_at == "mid_epoch" else (2, True)
    )
    run_training(tiny_config(demo_data_dir, tmp_path / "run", update_freq=2, max_update=TOTAL))
    assert_bitwise_equal(last_params(tmp_path / "run"), last_params(uninterrupted))
    a = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")["train_state"]["optimizer"][
        "state"
    ]
    b = load_checkpoint(uninterrupted / "checkpoint_last.pt")["train_state"]["optimizer"]["state"]
    assert all(torch.equal(a[k]["exp_avg_sq"], b[k]["exp_avg_sq"]) for k in a)


@pytest.mark.parametrize("sigterms", [1, 2])
def test_sigterm_finishes_the_update_saves_and_resumes_bitwise(
    demo_data_dir, tmp_path, uninterrupted, monkeypatch, sigterms
):
    """A second SIGTERM (Slurm signals the job step, torchrun forwards its own) must not
    cut the save short: the run still stops after update 3 with checkpoint_last saved."""
    real_step = step_module.train_step

    def step_then_signal(t, group):
        real_step(t, group)
        if t.progress.num_updates == 3:
            for _ in range(sigterms):  # arrives mid-loop, like a scheduler's kill
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(step_module, "train_step", step_then_signal)
    result = run_training(
        tiny_config(demo_data_dir, tmp_path / "run", update_freq=2, max_update=TOTAL)
    )
    assert (
        result.stop_reason == "signal"
        and result.signal == signal.SIGTERM
        and result.num_updates == 3
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.setattr(step_module, "train_step", real_step)
    run_training(tiny_config(demo_data_dir, tmp_path / "run", update_freq=2, max_update=TOTAL))
    assert_bitwise_equal(last_params(tmp_path / "run"), last_params(uninterrupted))


def test_rerunning_a_finished_run_changes_nothing(demo_data_dir, tmp_path):
    cfg = tiny_config(demo_data_dir, tmp_path / "run", max_update=3)
    run_training(cfg)
    before = last_params(tmp_path / "run")
    result = run_training(cfg)
    assert result.num_updates == 3
    assert_bitwise_equal(before, last_params(tmp_path / "run"))


def test_resets_and_finetune(demo_data_dir, tmp_path):
    run_training(tiny_config(demo_data_dir, tmp_path / "run", max_update=5))
    t = build_training(
        tiny_config(
            demo_data_dir,
            tmp_path / "run",
            max_update=8,
            resume={"reset_lr_scheduler": True, "reset_dataloader": True, "reset_optimizer": True},
        )
    )
    assert t.progress.num_updates == 5 and (t.progress.epoch, t.progress.position) == (1, 0)
    # the schedule restarts
    assert t.scheduler.lr_at(t.progress.num_updates) == t.cfg.optim.warmup_init_lr
    assert not t.optimizer.state  # fresh Adam moments
    t.run_lock.close()  # a built Trainer holds save_dir's lock until it runs or this
    kept = build_training(tiny_config(demo_data_dir, tmp_path / "run", max_update=8))
    assert kept.progress.position > 0 and kept.optimizer.state

    ft = build_training(
        tiny_config(
            demo_data_dir,
            tmp_path / "ft",
            resume={"finetune_from": str(tmp_path / "run" / "checkpoint_last.pt")},
        )
    )
    assert ft.progress.num_updates == 0 and not ft.optimizer.state
    assert_bitwise_equal(ft.model.state_dict(), last_params(tmp_path / "run"))


@pytest.mark.parametrize(
    "option",
    [dict(subword={"src_alpha": 0.2, "tgt_alpha": 0.2}), dict(loss={"rdrop_alpha": 5.0})],
    ids=["subword_sampling", "rdrop"],
)
def test_resume_with_regularization_is_bitwise_equal_too(demo_data_dir, tmp_path, option):
    """Subword sampling draws a batch's segmentations from (seed, epoch, its sentences), and
    R-Drop's second pass draws its dropout from the checkpointed RNG: a run stopped mid-epoch
    resumes to the bit, across the next epoch's fresh draws too."""
    probe = build_training(tiny_config(demo_data_dir, tmp_path / "probe", update_freq=2, **option))
    total = -(-len(probe.data.epoch_batches(1)) // 2) + 3  # into epoch 2
    straight, run = tmp_path / "straight", tmp_path / "run"
    run_training(tiny_config(demo_data_dir, straight, update_freq=2, max_update=total, **option))
    run_training(tiny_config(demo_data_dir, run, update_freq=2, max_update=5, **option))
    assert load_checkpoint(run / "checkpoint_last.pt")["train_state"]["position"] > 0
    run_training(tiny_config(demo_data_dir, run, update_freq=2, max_update=total, **option))
    assert_bitwise_equal(last_params(run), last_params(straight))
    plain = tmp_path / "plain"
    run_training(tiny_config(demo_data_dir, plain, update_freq=2, max_update=total))
    assert not torch.equal(
        last_params(plain)["encoder.embed_tokens.weight"],
        last_params(run)["encoder.embed_tokens.weight"],
    )


def flat_layout(config: dict[str, Any]) -> dict[str, Any]:
    """A checkpoint's `config` as release 0.1 wrote it: TrainConfig's keys flat
    (valid_split, eval_bleu_beam, clip_norm, ...), with no sections."""
    flat = {k: v for k, v in config.items() if not isinstance(v, dict) or k in ("model", "optim")}
    flat["optim"] = dict(config["optim"])
    for old, (new, _) in DEPRECATED_KEYS["train"].items():
        node = config
        *path, leaf = new.split(".")
        for key in path:
            node = node[key]
        flat[old] = node[leaf]
    del flat["optim"]["clip_norm"]
    return flat


def test_a_checkpoint_with_0_1s_flat_config_resumes_bitwise_and_averages(
    demo_data_dir, tmp_path, uninterrupted
):
    """Checkpoints of 0.1 hold their training config flat: a run resumes from one as from
    its own (bitwise), and nmt-average keeps that config as the record it is."""
    run = tmp_path / "run"
    run_training(tiny_config(demo_data_dir, run, update_freq=2, max_update=5))
    last = run / "checkpoint_last.pt"
    ckpt = load_checkpoint(last)
    assert "validation" in ckpt["config"] and "valid_split" not in ckpt["config"]
    ckpt["config"] = flat_layout(ckpt["config"])
    assert ckpt["config"]["valid_split"] == "" and "validation" not in ckpt["config"]
    save_checkpoint(ckpt, last)
    old = tmp_path / "old.pt"
    shutil.copyfile(last, old)

    run_training(tiny_config(demo_data_dir, run, update_freq=2, max_update=TOTAL))
    assert_bitwise_equal(last_params(run), last_params(uninterrupted))
    assert "validation" in load_checkpoint(last)["config"]  # written in the new layout

    averaged = average(AverageConfig(inputs=[str(old)], output=str(tmp_path / "avg.pt")))
    record = load_checkpoint(averaged.output)["config"]
    assert record["training_config"] == ckpt["config"]  # the flat config, as it was
