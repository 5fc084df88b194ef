"""nmt.training.averaging (nmt-average's library): the mean of the selected checkpoints,
loadable for inference; what it selects, where it writes, and what it refuses."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest
import torch
from helpers import TINY_MODEL, run_training, tiny_config
from rounding import rounded_once

from nmt.checkpoint import load_checkpoint
from nmt.errors import NmtError
from nmt.generation.loading import load_for_inference
from nmt.training.averaging import (
    average,
    average_checkpoints,
    select_checkpoints,
    select_last_fraction,
)
from nmt.training.config import AverageConfig

# build_training(threads=1) sets torch's global thread count; the fixture restores it.
pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def run_dir(demo_data_dir, tmp_path_factory):
    """Updates 1-4 saved as numbered checkpoints; validation every update keeps the best 2."""
    save_dir = tmp_path_factory.mktemp("avg") / "run"
    run_training(
        tiny_config(
            demo_data_dir,
            save_dir,
            max_update=4,
            checkpoint={"save_interval_updates": 1, "keep_best": 2},
            validation={"split": "test", "interval_updates": 1},
        )
    )
    return save_dir


def _models(paths: list[Path]) -> list[dict[str, torch.Tensor]]:
    return [load_checkpoint(p)["model"] for p in paths]


def test_average_of_the_last_k(run_dir, tmp_path):
    out = tmp_path / "avg.pt"
    result = average(AverageConfig(inputs=str(run_dir), num_last=3, output=str(out)))
    assert [p.name for p in result.inputs] == [f"checkpoint_1_{u}.pt" for u in (4, 3, 2)]
    assert result.output == out
    avg = load_checkpoint(out)
    assert "train_state" not in avg
    assert avg["config"]["averaged_from"] == [str(p) for p in result.inputs]
    inputs = _models([run_dir / f"checkpoint_1_{u}.pt" for u in (2, 3, 4)])
    for key, value in avg["model"].items():
        # summed in float64, rounded once to fp32 (tests/rounding.py)
        assert rounded_once(value, sum(m[key].double() for m in inputs) / 3), key
    bundle = load_for_inference(out)
    assert bundle.model.training is False


def test_average_of_the_best_k_and_default_names(run_dir):
    result = average(AverageConfig(inputs=str(run_dir), num_best=2))
    assert result.output == run_dir / "checkpoint_avg_best2.pt"
    names = [p.name for p in result.inputs]
    assert len(names) == 2 and all(n.startswith("checkpoint.best_loss_") for n in names)
    values = [float(n[len("checkpoint.best_loss_") : -3]) for n in names]
    assert values == sorted(values)  # best (lowest loss) first
    avg = load_checkpoint(result.output)["model"]
    one, two = _models(result.inputs)
    assert all(rounded_once(avg[k], (one[k].double() + two[k].double()) / 2) for k in avg)
    last = average(AverageConfig(inputs=str(run_dir), num_last=2))
    assert last.output == run_dir / "checkpoint_avg_last2.pt"


def test_last_fraction_takes_the_checkpoints_of_the_last_part_of_the_run(run_dir, tmp_path):
    # updates 1-4: the last half starts at update 2 (4 x (1 - 0.5)), the last quarter at 3
    half = average(AverageConfig(inputs=str(run_dir), last_fraction=0.5))
    assert [p.name for p in half.inputs] == [f"checkpoint_1_{u}.pt" for u in (4, 3, 2)]
    assert half.output == run_dir / "checkpoint_avg_last50pct.pt"
    last3 = average(AverageConfig(inputs=str(run_dir), num_last=3, output=str(tmp_path / "3.pt")))
    assert all(
        torch.equal(v, load_checkpoint(last3.output)["model"][k])
        for k, v in load_checkpoint(half.output)["model"].items()
    )  # the same files, the same mean
    assert [p.name for p in select_last_fraction(run_dir, 0.25)] == [
        "checkpoint_1_4.pt",
        "checkpoint_1_3.pt",
    ]
    assert len(select_last_fraction(run_dir, 1.0)) == 4


def test_last_fraction_refuses_a_window_that_keep_last_cut(run_dir, tmp_path):
    cut = tmp_path / "cut"
    cut.mkdir()
    for u in (3, 4):  # as checkpoint.keep_last=2 would have left it
        (cut / f"checkpoint_1_{u}.pt").write_bytes((run_dir / f"checkpoint_1_{u}.pt").read_bytes())
    assert len(select_last_fraction(cut, 0.25)) == 2  # starts at update 3: whole
    for fraction in (0.5, 1.0):  # would start at update 2 or 0, deleted
        with pytest.raises(NmtError) as info:
            select_last_fraction(cut, fraction)
        message = str(info.value)
        assert message.startswith(f"last_fraction={fraction}: the window starts at update ")
        assert "oldest numbered checkpoint is from update 3" in message and "keep_last" in message
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(NmtError, match="found no numbered checkpoints"):
        select_last_fraction(empty, 0.5)


def test_explicit_files_and_the_default_output(run_dir):
    files = [str(run_dir / f"checkpoint_1_{u}.pt") for u in (1, 2)]
    result = average(AverageConfig(inputs=files))
    assert result.output == run_dir / "checkpoint_avg.pt"
    avg = load_checkpoint(run_dir / "checkpoint_avg.pt")["model"]
    one, two = _models([Path(f) for f in files])
    assert all(rounded_once(avg[k], (one[k].double() + two[k].double()) / 2) for k in avg)
    with pytest.raises(
        NmtError, match=r"a run dir; pick its checkpoints with num_last=K or num_best=K"
    ):
        average(AverageConfig(inputs=str(run_dir)))


def test_averaging_one_checkpoint_is_the_identity(run_dir):
    path = run_dir / "checkpoint_1_4.pt"
    avg = average_checkpoints([path])
    original = load_checkpoint(path)["model"]
    assert all(torch.equal(avg["model"][k], original[k]) for k in original)


def test_asking_for_more_than_exist_is_an_error(run_dir):
    with pytest.raises(NmtError, match="asked for 99 but found 4") as info:
        select_checkpoints(run_dir, num_last=99)
    assert str(info.value).startswith(f"{run_dir}: ")
    with pytest.raises(NmtError, match="asked for 3 but found 2"):
        select_checkpoints(run_dir, num_best=3)


def test_the_output_may_not_be_an_input(run_dir):
    last = run_dir / "checkpoint_1_4.pt"
    before = last.read_bytes()
    with pytest.raises(NmtError, match=r"^output=.*checkpoint_1_4.pt: is one of the inputs"):
        average(AverageConfig(inputs=str(run_dir), num_last=2, output=str(last)))
    assert last.read_bytes() == before


def test_best_files_of_several_metrics_are_not_mixed(tmp_path):
    for name in ("checkpoint.best_loss_3.0000.pt", "checkpoint.best_bleu_20.0000.pt"):
        (tmp_path / name).write_bytes(b"")
    with pytest.raises(NmtError, match=r"several metrics \(loss, bleu\); list the files"):
        select_checkpoints(tmp_path, num_best=1)


def test_checkpoints_of_different_models_are_refused(run_dir, demo_data_dir, tmp_path):
    other = tmp_path / "other"
    run_training(
        tiny_config(demo_data_dir, other, model=replace(TINY_MODEL, ffn_dim=48), max_update=1)
    )
    with pytest.raises(NmtError, match="model_config differs"):
        average_checkpoints([run_dir / "checkpoint_last.pt", other / "checkpoint_last.pt"])


@pytest.mark.parametrize(
    "cfg, message",
    [
        (AverageConfig(), "inputs=null: no checkpoints to average; give a run dir"),
        (AverageConfig(inputs=[]), "inputs=[]: no checkpoints to average"),
        (AverageConfig(inputs="run", num_last=-1), "num_last=-1: must be 0 or more; use 0"),
        (
            AverageConfig(inputs="run", num_last=2, num_best=2),
            "num_last=2, num_best=2: both set; choose",
        ),
        (
            AverageConfig(inputs="run", num_last=2, last_fraction=0.5),
            "num_last=2, last_fraction=0.5: both set; choose",
        ),
        (AverageConfig(inputs="run", last_fraction=1.5), "last_fraction=1.5: must be within"),
        (AverageConfig(inputs="run", last_fraction=-0.1), "last_fraction=-0.1: must be within"),
        (
            AverageConfig(inputs=["a.pt", "b.pt"], last_fraction=0.5),
            "last_fraction=0.5: picks checkpoints of one run dir, but inputs lists 2 paths",
        ),
        (
            AverageConfig(inputs=["a.pt", "b.pt"], num_best=2),
            "num_best=2: picks checkpoints of one run dir, but inputs lists 2 paths; give",
        ),
        (AverageConfig(inputs="run", num_last=1, output=""), "output='': empty;"),
    ],
)
def test_config_mistakes_name_the_key(cfg, message):
    with pytest.raises(NmtError) as info:
        cfg.validate()
    assert str(info.value).startswith(message) and "\n" not in str(info.value)
