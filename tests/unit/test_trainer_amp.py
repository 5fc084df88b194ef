"""Loss scaling (the fp16 path) exercised on CPU, and the CUDA runs themselves (marked gpu).

fp16 needs CUDA, but its control flow (GradScaler: unscale before the norm, skip the step
and lower the scale on overflow, stop below fp16_min_scale) is the same code on CPU with a
CPU GradScaler, so the CPU tests swap one in.
"""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
import torch
from helpers import run_training, tiny_config

from nmt.errors import NmtError
from nmt.training import build_training
from nmt.training import step as step_module
from nmt.training.trainer import Trainer

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")

needs_cuda = pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")


def _trainer_with_cpu_scaler(
    demo_data_dir, tmp_path, monkeypatch, overflow_at, **overrides
) -> Trainer:
    """A Trainer whose scaler is a live CPU GradScaler, and whose loss overflows to inf
    in the micro-batches numbered `overflow_at` (1-based), as an fp16 overflow would."""
    trainer = build_training(tiny_config(demo_data_dir, tmp_path / "run", **overrides))
    trainer.scaler = torch.amp.GradScaler("cpu", init_scale=1024.0)
    real_loss = step_module.output_layer_loss
    calls = {"n": 0}

    def overflowing(features, weight, target, eps, pad):
        calls["n"] += 1
        out = real_loss(features, weight, target, eps, pad)
        if calls["n"] in overflow_at:
            out.loss = out.loss * float("inf")
        return out

    monkeypatch.setattr(step_module, "output_layer_loss", overflowing)
    return trainer


def test_an_overflow_skips_the_update_and_lowers_the_scale(demo_data_dir, tmp_path, monkeypatch):
    trainer = _trainer_with_cpu_scaler(
        demo_data_dir, tmp_path, monkeypatch, overflow_at={2}, max_update=3
    )
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = trainer.run()
    # 4 batches for 3 updates: the second batch overflowed and its update was skipped
    assert result.num_updates == 3 and trainer.progress.position == 4
    assert trainer.scaler.get_scale() == 512.0  # halved once, not grown back yet
    events = [
        json.loads(line) for line in (tmp_path / "run" / "train.jsonl").read_text().splitlines()
    ]
    train = [e for e in events if e["type"] == "train"]
    assert train[-1]["loss_scale"] == 512.0 and all(e["gnorm"] < float("inf") for e in train)
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_the_scale_falling_below_the_minimum_stops_the_run(demo_data_dir, tmp_path, monkeypatch):
    trainer = _trainer_with_cpu_scaler(
        demo_data_dir,
        tmp_path,
        monkeypatch,
        overflow_at=set(range(1, 100)),
        max_update=20,
        fp16_min_scale=100.0,
    )
    with pytest.raises(
        NmtError,
        match=r"precision=fp16: the loss scale fell below fp16_min_scale=100 "
        r"at update 1",
    ):
        trainer.run()
    assert trainer.progress.num_updates == 0


@pytest.mark.gpu
@needs_cuda
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_cuda_training_runs_and_lowers_the_loss(demo_data_dir, tmp_path, precision):
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / precision,
        device="cuda",
        precision=precision,
        max_update=30,
        log_interval=10,
        no_save=True,
    )
    run_training(
        replace(cfg, optim=replace(cfg.optim, lr=3e-3, warmup_updates=0, scheduler="fixed"))
    )
    events = [
        json.loads(line) for line in (tmp_path / precision / "train.jsonl").read_text().splitlines()
    ]
    losses = [e["loss"] for e in events if e["type"] == "train"]
    assert losses[-1] < losses[0]


@pytest.mark.gpu
@needs_cuda
def test_cuda_resume_continues_the_run(demo_data_dir, tmp_path):
    cfg = tiny_config(
        demo_data_dir, tmp_path / "run", device="cuda", precision="fp16", max_update=3
    )
    run_training(cfg)
    result = run_training(replace(cfg, max_update=6))
    assert result.num_updates == 6
