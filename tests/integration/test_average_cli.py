"""nmt-average through the CLI (and the old scripts/average_checkpoints.py over the same
library): the same file as the library call, one-line errors naming the key."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest
from helpers import assert_bitwise_equal, run_training, tiny_config
from rounding import rounded_once
from test_reliability_input import one_line_error

from nmt.checkpoint import load_checkpoint
from nmt.training.averaging import average
from nmt.training.config import AverageConfig

pytestmark = pytest.mark.usefixtures("one_thread")

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "average_checkpoints.py"


@pytest.fixture(scope="module")
def run_dir(demo_data_dir, tmp_path_factory):
    save_dir = tmp_path_factory.mktemp("avg-cli") / "run"
    run_training(
        tiny_config(demo_data_dir, save_dir, max_update=4, checkpoint={"save_interval_updates": 1})
    )
    return save_dir


def _script():
    spec = importlib.util.spec_from_file_location("average_checkpoints", SCRIPT)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_cli_writes_what_the_library_writes(nmt_cli, run_dir, tmp_path):
    code, out, err = nmt_cli(
        "average", f"inputs={run_dir}", "num_last=3", f"output={tmp_path / 'cli.pt'}"
    )
    assert code == 0, err
    assert out.strip() == (
        "averaged 3 checkpoints (checkpoint_1_4.pt, checkpoint_1_3.pt, checkpoint_1_2.pt) "
        f"into {tmp_path / 'cli.pt'}"
    )
    average(AverageConfig(inputs=str(run_dir), num_last=3, output=str(tmp_path / "api.pt")))
    cli, api = load_checkpoint(tmp_path / "cli.pt"), load_checkpoint(tmp_path / "api.pt")
    assert_bitwise_equal(cli["model"], api["model"])
    assert cli["config"] == api["config"] and "train_state" not in cli
    assert not list(tmp_path.glob(".*.tmp"))


def test_cli_averages_listed_files(nmt_cli, run_dir, tmp_path):
    files = [run_dir / f"checkpoint_1_{u}.pt" for u in (1, 2)]
    out = tmp_path / "two.pt"
    code, _, err = nmt_cli("average", f"inputs=[{files[0]},{files[1]}]", f"output={out}")
    assert code == 0, err
    one, two = (load_checkpoint(f)["model"] for f in files)
    avg = load_checkpoint(out)["model"]
    assert all(rounded_once(avg[k], (one[k].double() + two[k].double()) / 2) for k in avg)


@pytest.mark.parametrize(
    "args, needles",
    [
        ([], ["inputs=null", "no checkpoints to average"]),
        (["num_last=2", "num_best=2"], ["num_last=2, num_best=2"]),
        (["num_last=99"], ["asked for 99 but found 4", "ask for fewer"]),
        ([], ["a run dir; pick its checkpoints with num_last=K or num_best=K"]),
        (["num_lats=2"], ["num_lats"]),
        (["last_fraction=2"], ["last_fraction=2", "must be within [0, 1]"]),
    ],
    ids=["no-inputs", "both", "too-many", "run-dir-without-k", "unknown-key", "fraction"],
)
def test_cli_errors_are_one_line_naming_the_key(nmt_cli, run_dir, tmp_path, args, needles):
    inputs = [] if "inputs=null" in needles else [f"inputs={run_dir}"]
    code, _, err = nmt_cli("average", *inputs, *args, f"output={tmp_path / 'x.pt'}")
    one_line_error(code, err, "average", *needles)
    assert not (tmp_path / "x.pt").exists()


def test_the_old_script_runs_the_same_library(run_dir, tmp_path, capsys):
    out = tmp_path / "script.pt"
    assert _script().main(["--inputs", str(run_dir), "--num-last", "3", "--output", str(out)]) == 0
    assert "averaged 3 checkpoints" in capsys.readouterr().out
    api = average(AverageConfig(inputs=str(run_dir), num_last=3, output=str(tmp_path / "a.pt")))
    assert_bitwise_equal(load_checkpoint(out)["model"], load_checkpoint(api.output)["model"])
    assert _script().main(["--inputs", str(run_dir)]) == 2
    err = capsys.readouterr().err.strip()
    assert err.startswith("average_checkpoints: error:") and "num_last=K or num_best=K" in err
