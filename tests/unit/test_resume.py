"""Resuming: bitwise equal to an uninterrupted run (CPU, fp32), signals, resets, finetuning."""

from __future__ import annotations

import os
import signal

import pytest
import torch
from helpers import assert_bitwise_equal, last_params, run_training, tiny_config

from nmt.checkpoint import load_checkpoint
from nmt.training import build_training
from nmt.training.trainer import Trainer

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
    real_step = Trainer.train_step

    def step_then_signal(self, group):
        real_step(self, group)
        if self.progress.num_updates == 3:
            for _ in range(sigterms):  # arrives mid-loop, like a scheduler's kill
                os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(Trainer, "train_step", step_then_signal)
    result = run_training(
        tiny_config(demo_data_dir, tmp_path / "run", update_freq=2, max_update=TOTAL)
    )
    assert (
        result.stop_reason == "signal"
        and result.signal == signal.SIGTERM
        and result.num_updates == 3
    )
    assert signal.getsignal(signal.SIGTERM) is signal.SIG_DFL  # handlers restored
    monkeypatch.setattr(Trainer, "train_step", real_step)
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
            reset_lr_scheduler=True,
            reset_dataloader=True,
            reset_optimizer=True,
        )
    )
    assert t.progress.num_updates == 5 and (t.progress.epoch, t.progress.position) == (1, 0)
    # the schedule restarts
    assert t.scheduler.lr_at(t.progress.num_updates) == t.cfg.optim.warmup_init_lr
    assert not t.optimizer.state  # fresh Adam moments
    t.close()  # a built Trainer holds save_dir's lock until it runs or is closed
    kept = build_training(tiny_config(demo_data_dir, tmp_path / "run", max_update=8))
    assert kept.progress.position > 0 and kept.optimizer.state

    ft = build_training(
        tiny_config(
            demo_data_dir,
            tmp_path / "ft",
            finetune_from=str(tmp_path / "run" / "checkpoint_last.pt"),
        )
    )
    assert ft.progress.num_updates == 0 and not ft.optimizer.state
    assert_bitwise_equal(ft.model.state_dict(), last_params(tmp_path / "run"))
