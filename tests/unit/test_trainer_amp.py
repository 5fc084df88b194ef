"""Loss scaling (the fp16 path) exercised on CPU; the CUDA runs are in tests/gpu/.

fp16 needs CUDA, but its control flow (nmt.training.scaler.LossScaler: unscale before the
norm, skip the step and lower the scale on overflow, stop below fp16.min_scale) is the same
code on CPU, so the CPU tests swap an enabled scaler into an fp32 run, with an injected
overflow, or with fp16's real arithmetic (torch's CPU autocast to float16, slow but exact
to fp16's rules, which nmt does not offer as precision=fp16 on a CPU).
"""

from __future__ import annotations

import json

import pytest
import torch
from helpers import assert_fp16_overflows_were_skipped, tiny_config

from nmt.errors import NmtError
from nmt.runtime import Runtime
from nmt.training import build_training, run
from nmt.training import step as step_module
from nmt.training.scaler import LossScaler
from nmt.training.trainer import Trainer

# build_training(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")


def _trainer_with_cpu_scaler(
    demo_data_dir, tmp_path, monkeypatch, overflow_at, **overrides
) -> Trainer:
    """A Trainer whose scaler is an enabled LossScaler, and whose loss overflows to inf
    in the micro-batches numbered `overflow_at` (1-based), as an fp16 overflow would;
    `trainer.grad_scales` records the grad_scale each micro-batch's loss was given."""
    trainer = build_training(tiny_config(demo_data_dir, tmp_path / "run", **overrides))
    trainer.scaler = LossScaler(init_scale=1024.0)
    real_loss = step_module.output_layer_loss
    calls = {"n": 0}
    trainer.grad_scales = []

    def overflowing(features, weight, target, eps, pad, **options):
        calls["n"] += 1
        trainer.grad_scales.append(options["grad_scale"])
        out = real_loss(features, weight, target, eps, pad, **options)
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
    result = run(trainer)
    # 4 batches for 3 updates: the second batch overflowed and its update was skipped
    assert result.num_updates == 3 and trainer.progress.position == 4
    assert trainer.scaler.scale == 512.0  # halved once, not grown back yet
    # the logits' gradient carries the loss scale of its update (fp16: scaled, then rounded)
    assert trainer.grad_scales == [1024.0, 1024.0, 512.0, 512.0]
    events = [
        json.loads(line) for line in (tmp_path / "run" / "train.jsonl").read_text().splitlines()
    ]
    train = [e for e in events if e["type"] == "train"]
    assert train[-1]["loss_scale"] == 512.0 and all(e["gnorm"] < float("inf") for e in train)
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_real_fp16_overflows_halve_the_scale_and_skip_their_updates(
    demo_data_dir, tmp_path, capsys
):
    """tests/gpu's fp16 overflow test in the CPU's fp16 arithmetic: a loss scale of 2**22
    overflows fp16 at once; every overflow skips its update (its batch consumed) and
    halves the scale until the gradients fit, and no NaN reaches the weights. (Small
    batches: the CPU's fp16 matmuls are slow.)"""
    trainer = build_training(
        tiny_config(
            demo_data_dir,
            tmp_path / "run",
            max_update=3,
            max_tokens=100,
            checkpoint={"no_save": True},
        )
    )
    trainer.runtime = Runtime(torch.device("cpu"), "fp16")  # autocast to float16
    trainer.scaler = LossScaler(init_scale=2.0**22)
    before = {k: v.clone() for k, v in trainer.model.state_dict().items()}
    result = run(trainer)
    assert result.num_updates == 3
    assert_fp16_overflows_were_skipped(trainer, capsys.readouterr().err, 2.0**22)
    assert any(not torch.equal(before[k], v) for k, v in trainer.model.state_dict().items())


def test_the_scale_falling_below_the_minimum_stops_the_run(demo_data_dir, tmp_path, monkeypatch):
    trainer = _trainer_with_cpu_scaler(
        demo_data_dir,
        tmp_path,
        monkeypatch,
        overflow_at=set(range(1, 100)),
        max_update=20,
        fp16={"min_scale": 100.0},
    )
    with pytest.raises(
        NmtError,
        match=r"precision=fp16: the loss scale fell below fp16.min_scale=100 "
        r"at update 1",
    ):
        run(trainer)
    assert trainer.progress.num_updates == 0


def test_the_scale_backs_off_on_overflow_and_grows_after_a_run_of_good_updates():
    scaler = LossScaler(init_scale=8.0, growth_interval=3)
    for overflow, scale in [(False, 8), (True, 4), (False, 4), (False, 4), (False, 8)]:
        scaler.update(overflow)
        assert scaler.scale == scale
    grads = [torch.full((2,), 16.0)]
    scaler.unscale_(grads, factor=0.5)  # / 8, then * 0.5
    assert grads[0].tolist() == [1.0, 1.0]
    fixed = LossScaler(enabled=False)
    fixed.update(True)
    assert fixed.scale == 1.0 and fixed.state_dict() == {}


def test_the_scale_state_is_torchs_grad_scaler_state():
    """Checkpoints written with torch.amp.GradScaler resume with LossScaler, and back."""
    theirs = torch.amp.GradScaler("cpu", init_scale=1024.0, growth_interval=7)
    ours = LossScaler()
    ours.load_state_dict(theirs.state_dict())
    assert (ours.scale, ours.growth_interval) == (1024.0, 7)
    ours.update(True)
    back = torch.amp.GradScaler("cpu")
    back.load_state_dict(ours.state_dict())
    assert back.get_scale() == 512.0 and back.state_dict() == ours.state_dict()
