"""The moving average of the weights (checkpoint.ema_decay): its recursion, tied weights, its place
in checkpoints, resume, and nmt-average weights=ema."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
from helpers import assert_bitwise_equal, run_training, tiny_config
from rounding import U_FP32

from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.training.averaging import average
from nmt.training.config import AverageConfig
from nmt.training.ema import WeightEMA, effective_decay

# build_training(threads=1) sets torch's global thread count; the fixture restores it.
pytestmark = pytest.mark.usefixtures("one_thread")

DECAY = 0.9


class Tied(torch.nn.Module):
    """Two names for one weight (as shared embeddings), a second weight, a buffer."""

    def __init__(self) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(5, 3)
        self.out = torch.nn.Linear(3, 5, bias=True)
        self.out.weight = self.embed.weight
        self.register_buffer("table", torch.arange(4.0))


def _reference(history: list[dict[str, torch.Tensor]], decay: float) -> dict[str, torch.Tensor]:
    """The recursion in float64 over the weights after each update (history[0]: before)."""
    average = {k: v.double() for k, v in history[0].items()}
    for n, weights in enumerate(history[1:], start=1):
        d = effective_decay(decay, n)
        average = {k: d * average[k] + (1 - d) * weights[k].double() for k in average}
    return average


def _bound(history: list[dict[str, torch.Tensor]]) -> float:
    """Each fp32 lerp a + w (b - a) rounds the difference, the product and the sum (3 u
    relative to the largest magnitude involved); the average contracts earlier errors,
    so n updates add at most n such errors."""
    largest = max(float(v.abs().max()) for weights in history for v in weights.values())
    return 3 * U_FP32 * largest * len(history)


def _close(actual: dict[str, torch.Tensor], expected: dict[str, torch.Tensor], bound: float):
    assert actual.keys() == expected.keys()
    for key, value in actual.items():
        difference = float((value.double() - expected[key]).abs().max())
        assert difference <= bound, (key, difference, bound)


def test_the_average_follows_its_recursion_and_ties_stay_tied():
    torch.manual_seed(0)
    model = Tied()
    ema = WeightEMA(model, DECAY)
    history = [{k: v.clone() for k, v in model.state_dict().items()}]
    for _ in range(30):
        with torch.no_grad():
            for p in model.parameters():
                p.add_(torch.randn_like(p))
        ema.update()
        history.append({k: v.clone() for k, v in model.state_dict().items()})
    weights = ema.weights()
    _close(weights, _reference(history, DECAY), _bound(history))
    assert torch.equal(weights["embed.weight"], weights["out.weight"])
    # and one tensor, saved once: the checkpoint grows by one copy of the weights
    saved = ema.state_dict()["weights"]
    assert saved["embed.weight"] is saved["out.weight"]
    assert torch.equal(weights["table"], model.table)
    # the decay warms up: the first update takes the new weights at 1 - 2/11
    assert effective_decay(DECAY, 1) == pytest.approx(2 / 11)
    assert effective_decay(DECAY, 1000) == DECAY


def test_restart_starts_again_from_the_current_weights():
    model = Tied()
    ema = WeightEMA(model, DECAY)
    with torch.no_grad():
        model.embed.weight.fill_(3.0)
    ema.update()
    assert not torch.equal(ema.weights()["embed.weight"], model.embed.weight)
    ema.restart()
    assert ema.updates == 0
    assert_bitwise_equal(ema.weights(), model.state_dict())


@pytest.fixture(scope="module")
def ema_run(demo_data_dir, tmp_path_factory) -> Path:
    """6 updates with checkpoint.ema_decay, a numbered checkpoint after each."""
    save_dir = tmp_path_factory.mktemp("ema") / "run"
    run_training(
        tiny_config(
            demo_data_dir, save_dir, checkpoint={"ema_decay": DECAY, "save_interval_updates": 1}
        )
    )
    return save_dir


def _numbered(run_dir: Path, update: int) -> dict:
    (path,) = run_dir.glob(f"checkpoint_*_{update}.pt")
    return load_checkpoint(path)


def test_training_updates_the_average_once_per_update_with_the_new_weights(ema_run):
    history = [_numbered(ema_run, u)["model"] for u in range(1, 7)]
    saved = _numbered(ema_run, 6)["train_state"]["ema"]
    assert saved["updates"] == 6 and saved["decay"] == DECAY
    # The weights before update 1 are in no checkpoint: run the recursion from update 1's
    # saved average over the weights saved after updates 2-6.
    first = _numbered(ema_run, 1)["train_state"]["ema"]["weights"]
    average = {k: v.double() for k, v in first.items()}
    for n, weights in enumerate(history[1:], start=2):
        d = effective_decay(DECAY, n)
        average = {k: d * average[k] + (1 - d) * weights[k].double() for k in average}
    _close(saved["weights"], average, _bound([first, *history]))
    model = history[-1]
    assert any(not torch.equal(saved["weights"][k], model[k]) for k in model)


def test_a_resumed_run_continues_the_same_average(demo_data_dir, ema_run, tmp_path):
    run = tmp_path / "run"
    run_training(tiny_config(demo_data_dir, run, max_update=3, checkpoint={"ema_decay": DECAY}))
    run_training(tiny_config(demo_data_dir, run, checkpoint={"ema_decay": DECAY}))
    resumed = load_checkpoint(run / "checkpoint_last.pt")["train_state"]["ema"]
    straight = _numbered(ema_run, 6)["train_state"]["ema"]
    assert resumed["updates"] == 6
    assert_bitwise_equal(resumed["weights"], straight["weights"])


def test_turning_the_average_on_when_resuming_starts_it_from_the_resumed_weights(
    demo_data_dir, tmp_path
):
    run = tmp_path / "run"
    run_training(tiny_config(demo_data_dir, run, max_update=3))
    assert "ema" not in load_checkpoint(run / "checkpoint_last.pt")["train_state"]
    run_training(tiny_config(demo_data_dir, run, checkpoint={"ema_decay": DECAY}))
    assert load_checkpoint(run / "checkpoint_last.pt")["train_state"]["ema"]["updates"] == 3


def test_nmt_average_reads_the_moving_average(ema_run, tmp_path):
    result = average(AverageConfig(inputs=str(ema_run), num_last=1, weights="ema"))
    assert result.output == ema_run / "checkpoint_avg_last1_ema.pt"
    averaged = load_checkpoint(result.output)
    assert averaged["config"]["weights"] == "ema"
    # the mean of one, summed in float64 and rounded back: the saved average itself
    assert_bitwise_equal(averaged["model"], _numbered(ema_run, 6)["train_state"]["ema"]["weights"])
    two = average(AverageConfig(inputs=str(ema_run), num_last=2, weights="ema"))
    expected = [_numbered(ema_run, u)["train_state"]["ema"]["weights"] for u in (5, 6)]
    mean = {k: (expected[0][k].double() + expected[1][k].double()) / 2 for k in expected[0]}
    _close(
        load_checkpoint(two.output)["model"],
        mean,
        U_FP32 * max(float(v.abs().max()) for v in mean.values()),
    )


def test_weights_ema_of_a_run_without_the_average_is_a_clear_error(demo_data_dir, tmp_path):
    run = tmp_path / "plain"
    run_training(tiny_config(demo_data_dir, run, max_update=2))
    with pytest.raises(NmtError, match=r"holds no moving average .* checkpoint.ema_decay > 0"):
        average(AverageConfig(inputs=str(run), num_last=1, weights="ema"))


def test_settings_out_of_range_are_refused(demo_data_dir, tmp_path):
    with pytest.raises(NmtError, match=r"^checkpoint.ema_decay=1.0: must be in \[0, 1\)"):
        tiny_config(demo_data_dir, tmp_path, checkpoint={"ema_decay": 1.0}).validate()
    with pytest.raises(NmtError, match=r"^weights=last: unknown; use model .* or ema"):
        AverageConfig(inputs="runs/x", num_last=1, weights="last").validate()
