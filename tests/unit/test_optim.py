"""Learning-rate schedules as pure functions, and Adam's options."""

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

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
    kw = dict(lr=1e-3, warmup=4000, warmup_init_lr=1e-7)
    assert inverse_sqrt_lr(0, **kw) == 1e-7
    assert math.isclose(inverse_sqrt_lr(2000, **kw), 1e-7 + 0.5 * (1e-3 - 1e-7))
    assert math.isclose(inverse_sqrt_lr(4000, **kw), 1e-3)
    assert math.isclose(inverse_sqrt_lr(16000, **kw), 0.5e-3)  # sqrt(4000/16000) = 1/2


def test_inverse_sqrt_is_continuous_and_peaks_at_warmup_end():
    kw = dict(lr=5e-4, warmup=100, warmup_init_lr=0.0)
    values = [inverse_sqrt_lr(s, **kw) for s in range(400)]
    assert max(values) == values[100]
    assert all(a < b for a, b in zip(values[:100], values[1:101]))
    assert all(a > b for a, b in zip(values[100:], values[101:]))


def test_inverse_sqrt_without_warmup():
    assert inverse_sqrt_lr(0, lr=1.0, warmup=0, warmup_init_lr=0.0) == 1.0
    assert math.isclose(inverse_sqrt_lr(4, lr=1.0, warmup=0, warmup_init_lr=0.0), 0.5)


def test_cosine_points():
    kw = dict(lr=1e-3, warmup=10, warmup_init_lr=0.0, decay_end=110, min_lr=1e-5)
    assert cosine_lr(0, **kw) == 0.0
    assert math.isclose(cosine_lr(10, **kw), 1e-3)
    assert math.isclose(cosine_lr(60, **kw), 1e-5 + 0.5 * (1e-3 - 1e-5))  # half way: mean
    assert math.isclose(cosine_lr(110, **kw), 1e-5)
    assert cosine_lr(10_000, **kw) == cosine_lr(110, **kw)


def test_fixed_points():
    assert fixed_lr(5, lr=0.1, warmup=10, warmup_init_lr=0.0) == pytest.approx(0.05)
    assert fixed_lr(10, lr=0.1, warmup=10, warmup_init_lr=0.0) == 0.1
    assert fixed_lr(10**6, lr=0.1, warmup=0, warmup_init_lr=0.0) == 0.1


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


# --------------------------------------------------------------- schedules over time


def _the_formulas_before_schedules_took_fractions(step, cfg, max_update):
    """The update-based schedules as they were written before positions could be
    fractions of a time budget: integer positions must give exactly these values."""
    lr, w, init = cfg.lr, cfg.warmup_updates, cfg.warmup_init_lr
    if step < w:
        return init + step * (lr - init) / w
    if cfg.scheduler == "inverse_sqrt":
        return lr * math.sqrt(max(w, 1) / max(step, 1))
    if cfg.scheduler == "fixed":
        return lr
    end = cfg.decay_updates or max_update
    progress = min(1.0, (step - w) / max(end - w, 1))
    return cfg.min_lr + 0.5 * (lr - cfg.min_lr) * (1.0 + math.cos(math.pi * progress))


@pytest.mark.parametrize("scheduler", ["inverse_sqrt", "cosine", "fixed"])
@pytest.mark.parametrize("warmup", [0, 1, 37])
def test_update_based_schedules_are_bitwise_what_they_were(scheduler, warmup):
    # resumed runs compare bitwise with runs of older checkpoints' code: not one bit moves
    cfg = OptimConfig(scheduler=scheduler, lr=1.5e-3, warmup_updates=warmup, min_lr=1e-5)
    fn = schedule_function(cfg, max_update=400)
    for step in range(500):
        assert fn(step) == _the_formulas_before_schedules_took_fractions(step, cfg, 400)


def _time_cfg(**kw) -> OptimConfig:
    base = dict(
        scheduler="cosine",
        schedule_unit="time",
        lr=1.5e-3,
        warmup_updates=0,
        warmup_init_lr=1e-7,
        warmup_fraction=0.24,
        decay_fraction=1.0,
        min_lr=1e-5,
    )
    return OptimConfig(**{**base, **kw})


def test_time_cosine_runs_over_the_budget():
    fn = schedule_function(_time_cfg(), max_update=0)  # max_update plays no part
    assert fn(0.0) == 1e-7
    assert fn(0.12) == pytest.approx(1e-7 + 0.5 * (1.5e-3 - 1e-7))
    assert fn(0.24) == pytest.approx(1.5e-3)
    assert fn(0.62) == pytest.approx(1e-5 + 0.5 * (1.5e-3 - 1e-5))  # half way through the decay
    assert fn(1.0) == pytest.approx(1e-5)
    values = [fn(i / 1000) for i in range(1001)]
    peak = values.index(max(values))
    assert peak == 240
    assert all(a < b for a, b in zip(values[:peak], values[1 : peak + 1]))
    assert all(a > b for a, b in zip(values[peak:], values[peak + 1 :]))
    # an earlier end: flat at min_lr from there on
    early = schedule_function(_time_cfg(decay_fraction=0.8), max_update=0)
    assert early(0.8) == early(0.9) == early(1.0) == pytest.approx(1e-5)


def test_time_inverse_sqrt_and_fixed():
    inv = schedule_function(_time_cfg(scheduler="inverse_sqrt", warmup_fraction=0.1), 0)
    assert inv(0.1) == pytest.approx(1.5e-3)
    assert inv(0.4) == pytest.approx(1.5e-3 * 0.5)  # sqrt(0.1 / 0.4)
    fixed = schedule_function(_time_cfg(scheduler="fixed", warmup_fraction=0.5), 0)
    assert fixed(0.25) == pytest.approx(1e-7 + 0.5 * (1.5e-3 - 1e-7))
    assert fixed(0.5) == fixed(1.0) == 1.5e-3


def _sched(cfg: OptimConfig, hours: float, max_update: int = 0):
    from nmt.training.optim import build_scheduler

    p = torch.nn.Parameter(torch.zeros(2))
    return build_scheduler(build_optimizer([p], cfg), cfg, max_update=max_update, max_time=hours)


def test_the_scheduler_reads_the_clock_only_by_time():
    by_time = _sched(_time_cfg(), hours=0.5)  # a budget of 1800 s
    assert by_time.by_time and by_time.budget_seconds == 1800.0
    assert by_time.position(num_updates=5, elapsed=900.0) == 0.5
    assert by_time.position(num_updates=5, elapsed=3600.0) == 1.0  # past the end: the end
    assert by_time.step(7, 1800.0 * 0.24) == pytest.approx(1.5e-3)
    assert by_time.optimizer.param_groups[0]["lr"] == pytest.approx(1.5e-3)
    by_updates = _sched(OptimConfig(scheduler="cosine", warmup_updates=10), 0.5, max_update=20)
    assert not by_updates.by_time
    assert by_updates.lr_at(10, elapsed=123.0) == by_updates.lr_at(10, elapsed=0.0)


def test_a_restarted_time_schedule_spans_what_is_left_of_the_budget():
    s = _sched(_time_cfg(), hours=1.0)
    s.restart(num_updates=100, elapsed=1800.0)
    assert s.lr_at(100, 1800.0) == 1e-7  # the schedule's first update again
    assert s.position(150, 1800.0 + 0.24 * 1800.0) == pytest.approx(0.24)
    assert s.lr_at(150, 3600.0) == pytest.approx(1e-5)  # and it ends with the budget
    state = s.state_dict()
    other = _sched(_time_cfg(), hours=1.0)
    other.load_state_dict(state)
    assert other.lr_at(120, 2000.0) == s.lr_at(120, 2000.0)
    other.load_state_dict({"offset": 3})  # a checkpoint from before time-based schedules
    assert (other.offset, other.offset_seconds) == (3, 0.0)


@pytest.mark.parametrize(
    "cfg, needle",
    [
        (
            dict(schedule_unit="hours"),
            "optim.schedule_unit=hours: unknown; use one of updates, time",
        ),
        (dict(warmup_fraction=1.0), "optim.warmup_fraction=1.0: must be in [0, 1)"),
        (dict(decay_fraction=0.0), "optim.decay_fraction=0.0: must be in (0, 1]"),
        (
            dict(warmup_updates=600),
            "optim.warmup_updates=600: counts updates, but optim.schedule_unit=time counts "
            "shares of max_time; set optim.warmup_updates=0 and give optim.warmup_fraction",
        ),
        (dict(decay_updates=2600), "optim.decay_updates=2600: counts updates"),
        (
            dict(scheduler="inverse_sqrt", warmup_fraction=0.0),
            "optim.warmup_fraction=0.0: inverse_sqrt decays",
        ),
        (
            dict(decay_fraction=0.2),
            "optim.decay_fraction=0.2: the cosine decay must end after the warmup",
        ),
        (
            dict(schedule_unit="updates", warmup_fraction=0.1),
            "optim.warmup_fraction=0.1: a share of the time budget, but "
            "optim.schedule_unit=updates counts updates",
        ),
        (
            dict(schedule_unit="updates", warmup_fraction=0.0, decay_fraction=0.5),
            "optim.decay_fraction=0.5: a share of the time budget",
        ),
    ],
)
def test_meaningless_schedule_settings_are_refused_in_one_line(cfg, needle):
    with pytest.raises(NmtError) as err:
        _time_cfg(**cfg).validate()
    assert str(err.value).startswith(needle) and "\n" not in str(err.value)


def test_a_time_schedule_needs_a_time_budget():
    from nmt.training.config import TrainConfig

    with pytest.raises(NmtError, match=r"^optim.schedule_unit=time: .* set max_time \(hours\)"):
        TrainConfig(data="d", save_dir="r", optim=_time_cfg(), max_update=1000).validate()
    TrainConfig(
        data="d", save_dir="r", optim=_time_cfg(), max_time=1.0
    ).validate()  # the cosine needs no max_update


# --------------------------------------------------------------------------- presets

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "optim"
# What each recipe of configs/optim/ gave in 0.1, when its file stated every key:
# lr, weight_decay, decoupled, scheduler, warmup_updates, min_lr, schedule_unit, warmup_fraction
PRESET_VALUES = {
    "adam_inverse_sqrt": (5e-4, 0.0, False, "inverse_sqrt", 4000, 0.0, "updates", 0.0),
    "adam_cosine": (7e-4, 0.01, True, "cosine", 1000, 1e-6, "updates", 0.0),
    "adam_cosine_time": (7e-4, 0.01, True, "cosine", 0, 1e-6, "time", 0.1),
    "adam_fixed": (1e-4, 0.0, False, "fixed", 0, 0.0, "updates", 0.0),
}
SAME_IN_EVERY_PRESET = dict(
    betas=[0.9, 0.98], eps=1e-8, clip_norm=0.0, warmup_init_lr=1e-7, decay_updates=0
)


def _preset(name: str) -> tuple[dict, OptimConfig]:
    """(what the file states, the OptimConfig Hydra merges it into)."""
    stated = OmegaConf.load(PRESET_DIR / f"{name}.yaml")
    merged = OmegaConf.to_object(OmegaConf.merge(OmegaConf.structured(OptimConfig), stated))
    assert isinstance(merged, OptimConfig)
    return OmegaConf.to_container(stated), merged  # type: ignore[return-value]


def test_every_recipe_file_is_tested():
    assert sorted(p.stem for p in PRESET_DIR.glob("*.yaml")) == sorted(PRESET_VALUES)


@pytest.mark.parametrize("name", sorted(PRESET_VALUES))
def test_recipes_give_the_optimizers_they_gave_when_they_stated_every_key(name):
    lr, decay, decoupled, scheduler, warmup, min_lr, unit, fraction = PRESET_VALUES[name]
    assert dataclasses.asdict(_preset(name)[1]) == {
        **SAME_IN_EVERY_PRESET,
        "lr": lr,
        "weight_decay": decay,
        "decoupled_weight_decay": decoupled,
        "scheduler": scheduler,
        "warmup_updates": warmup,
        "min_lr": min_lr,
        "schedule_unit": unit,
        "warmup_fraction": fraction,
        "decay_fraction": 1.0,
    }


@pytest.mark.parametrize("name", sorted(PRESET_VALUES))
def test_recipes_state_their_scheduler_and_what_differs_from_the_defaults(name):
    """Each file names its scheduler (what the recipe is) and otherwise only the keys whose
    value differs from OptimConfig's, each with a comment."""
    stated, _ = _preset(name)
    defaults = dataclasses.asdict(OptimConfig())
    assert "scheduler" in stated and set(stated) <= set(defaults)
    restated = [k for k in stated if k != "scheduler" and stated[k] == defaults[k]]
    assert restated == [], restated
    text = (PRESET_DIR / f"{name}.yaml").read_text()
    for line in text.splitlines():
        assert line.startswith("#") or " # " in line, f"uncommented line: {line!r}"
