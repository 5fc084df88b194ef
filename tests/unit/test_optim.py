"""Learning-rate schedules as pure functions, and Adam's options."""

import math

import pytest
import torch

from nmt.errors import NmtError
from nmt.training.config import OptimConfig
from nmt.training.optim import (
    LRScheduler,
    build_optimizer,
    cosine_lr,
    fixed_lr,
    inverse_sqrt_lr,
    schedule_function,
)


def test_inverse_sqrt_points():
    kw = dict(lr=1e-3, warmup_updates=4000, warmup_init_lr=1e-7)
    assert inverse_sqrt_lr(0, **kw) == 1e-7
    assert math.isclose(inverse_sqrt_lr(2000, **kw), 1e-7 + 0.5 * (1e-3 - 1e-7))
    assert math.isclose(inverse_sqrt_lr(4000, **kw), 1e-3)
    assert math.isclose(inverse_sqrt_lr(16000, **kw), 0.5e-3)  # sqrt(4000/16000) = 1/2


def test_inverse_sqrt_is_continuous_and_peaks_at_warmup_end():
    kw = dict(lr=5e-4, warmup_updates=100, warmup_init_lr=0.0)
    values = [inverse_sqrt_lr(s, **kw) for s in range(400)]
    assert max(values) == values[100]
    assert all(a < b for a, b in zip(values[:100], values[1:101]))
    assert all(a > b for a, b in zip(values[100:], values[101:]))


def test_inverse_sqrt_without_warmup():
    assert inverse_sqrt_lr(0, lr=1.0, warmup_updates=0, warmup_init_lr=0.0) == 1.0
    assert math.isclose(inverse_sqrt_lr(4, lr=1.0, warmup_updates=0, warmup_init_lr=0.0), 0.5)


def test_cosine_points():
    kw = dict(lr=1e-3, warmup_updates=10, warmup_init_lr=0.0, decay_updates=110, min_lr=1e-5)
    assert cosine_lr(0, **kw) == 0.0
    assert math.isclose(cosine_lr(10, **kw), 1e-3)
    assert math.isclose(cosine_lr(60, **kw), 1e-5 + 0.5 * (1e-3 - 1e-5))  # half way: mean
    assert math.isclose(cosine_lr(110, **kw), 1e-5)
    assert cosine_lr(10_000, **kw) == cosine_lr(110, **kw)


def test_fixed_points():
    assert fixed_lr(5, lr=0.1, warmup_updates=10, warmup_init_lr=0.0) == pytest.approx(0.05)
    assert fixed_lr(10, lr=0.1, warmup_updates=10, warmup_init_lr=0.0) == 0.1
    assert fixed_lr(10**6, lr=0.1, warmup_updates=0, warmup_init_lr=0.0) == 0.1


def test_cosine_needs_an_end():
    with pytest.raises(NmtError, match="decay_updates"):
        schedule_function(OptimConfig(scheduler="cosine", warmup_updates=10), max_update=0)
    fn = schedule_function(
        OptimConfig(scheduler="cosine", warmup_updates=10, lr=1.0), max_update=20
    )
    assert fn(20) == pytest.approx(0.0)


def test_unknown_scheduler_names_the_key():
    with pytest.raises(NmtError, match="optim.scheduler"):
        schedule_function(OptimConfig(scheduler="linear"), max_update=10)


def test_scheduler_sets_lr_and_restarts():
    p = torch.nn.Parameter(torch.zeros(2))
    opt = build_optimizer([p], OptimConfig())
    sched = LRScheduler(opt, lambda step: 1.0 / (step + 1))
    assert sched.step(3) == 0.25 and opt.param_groups[0]["lr"] == 0.25
    sched.restart(3)
    assert sched.step(3) == 1.0
    state = sched.state_dict()
    other = LRScheduler(opt, lambda step: 1.0 / (step + 1))
    other.load_state_dict(state)
    assert other.lr_at(5) == sched.lr_at(5) == 1.0 / 3


@pytest.mark.parametrize("decoupled", [False, True])
def test_weight_decay_coupled_vs_decoupled(decoupled):
    # Zero gradient: Adam with L2 moves the weight through the gradient term (a normalised
    # step of size ~lr); AdamW shrinks it by lr * wd, a much smaller step.
    p = torch.nn.Parameter(torch.ones(1))
    opt = build_optimizer([p], OptimConfig(weight_decay=0.1, decoupled_weight_decay=decoupled))
    opt.param_groups[0]["lr"] = 0.01
    p.grad = torch.zeros(1)
    opt.step()
    moved = 1.0 - p.item()
    if decoupled:
        assert moved == pytest.approx(0.01 * 0.1, rel=1e-4)
    else:
        assert moved == pytest.approx(0.01, rel=1e-3)


def test_bad_betas_name_the_key():
    with pytest.raises(NmtError, match="optim.betas"):
        build_optimizer([torch.nn.Parameter(torch.zeros(1))], OptimConfig(betas=[0.9]))
