"""scripts/average_checkpoints.py: the mean of the selected checkpoints, loadable for inference."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
import torch
from helpers import run_training, tiny_config

from nmt.checkpoint import load_checkpoint, load_for_inference
from nmt.errors import NmtError
from nmt.training.checkpointing import average_checkpoints

# Trainer(threads=1) sets torch's global thread count; the fixture restores it after each test.
pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "average_checkpoints.py"


def _script():
    spec = importlib.util.spec_from_file_location("average_checkpoints", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def run_dir(demo_data_dir, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("avg") / "run"
    run_training(tiny_config(demo_data_dir, save_dir, max_update=4, save_interval_updates=1))
    return save_dir


def test_average_of_the_last_k(run_dir, tmp_path, capsys):
    out = tmp_path / "avg.pt"
    assert _script().main(["--inputs", str(run_dir), "--num-last", "3", "--output", str(out)]) == 0
    assert "averaged 3 checkpoints" in capsys.readouterr().out
    avg = load_checkpoint(out)
    assert "train_state" not in avg
    inputs = [load_checkpoint(run_dir / f"checkpoint_1_{u}.pt")["model"] for u in (2, 3, 4)]
    for key, value in avg["model"].items():
        expected = sum(m[key].double() for m in inputs) / 3
        assert torch.allclose(value.double(), expected, atol=1e-6), key
    bundle = load_for_inference(out)
    assert bundle.model.training is False


def test_explicit_files_and_the_default_output(run_dir, capsys):
    files = [str(run_dir / f"checkpoint_1_{u}.pt") for u in (1, 2)]
    assert _script().main(["--inputs", *files]) == 0
    avg = load_checkpoint(run_dir / "checkpoint_avg.pt")["model"]
    one, two = (load_checkpoint(f)["model"] for f in files)
    assert all(torch.allclose(avg[k], (one[k] + two[k]) / 2, atol=1e-7) for k in avg)
    assert _script().main(["--inputs", str(run_dir)]) == 2
    assert "needs --num-last K or --num-best K" in capsys.readouterr().err


def test_averaging_one_checkpoint_is_the_identity(run_dir):
    path = run_dir / "checkpoint_1_4.pt"
    avg = average_checkpoints([path])
    original = load_checkpoint(path)["model"]
    assert all(torch.equal(avg["model"][k], original[k]) for k in original)


def test_asking_for_more_than_exist_is_an_error(run_dir, capsys):
    assert _script().main(["--inputs", str(run_dir), "--num-last", "99"]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("average_checkpoints: error:") and "asked for 99 but found 4" in err


def test_checkpoints_of_different_models_are_refused(run_dir, demo_data_dir, tmp_path):
    from dataclasses import replace

    from helpers import TINY_MODEL

    other = tmp_path / "other"
    run_training(
        tiny_config(demo_data_dir, other, model=replace(TINY_MODEL, ffn_dim=48), max_update=1)
    )
    with pytest.raises(NmtError, match="model_config differs"):
        average_checkpoints([run_dir / "checkpoint_last.pt", other / "checkpoint_last.pt"])
