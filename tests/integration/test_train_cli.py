"""nmt-train == nmt.training.train: the command only composes the config and maps the result
to an exit code, so the same settings give the same run, bit for bit (CPU, fp32)."""

from __future__ import annotations

from dataclasses import asdict

import pytest
from helpers import assert_bitwise_equal, last_params, run_training, tiny_config

from nmt.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def test_the_cli_trains_what_the_library_trains(nmt_cli, demo_data_dir, tmp_path):
    cfg = tiny_config(demo_data_dir, tmp_path / "api", max_update=5, validation={"split": "test"})
    api = run_training(cfg)
    model = [f"model.{key}={value}" for key, value in asdict(cfg.model).items()]
    optim = [f"optim.{key}={value}" for key, value in asdict(cfg.optim).items() if key != "betas"]
    code, _, err = nmt_cli(
        "train",
        f"data={demo_data_dir}",
        f"save_dir={tmp_path / 'cli'}",
        "train_split=valid",
        "validation.split=test",
        "max_tokens=500",
        "device=cpu",
        "threads=1",
        "max_update=5",
        "logging.interval=2",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "checkpoint.keep_last=-1",
        *model,
        *optim,
    )
    assert code == 0, err
    saved = {run: load_checkpoint(tmp_path / run / "checkpoint_last.pt") for run in ("api", "cli")}
    configs = [{**saved[run]["config"], "save_dir": None} for run in ("api", "cli")]
    assert configs[0] == configs[1]  # the overrides above are the whole of tiny_config
    assert_bitwise_equal(last_params(tmp_path / "api"), last_params(tmp_path / "cli"))
    assert saved["cli"]["train_state"]["num_updates"] == api.num_updates == 5
    assert saved["cli"]["train_state"]["best"] == saved["api"]["train_state"]["best"]
