"""A run stopped by max_time and started again with the same budget stops at once: the
budget is training time over every start of the run dir, read from the checkpoint."""

from __future__ import annotations

import pytest
from helpers import run_training, tiny_config

from nmt.checkpoint import load_checkpoint

pytestmark = pytest.mark.usefixtures("one_thread")


def test_a_finished_max_time_run_does_not_train_again(demo_data_dir, tmp_path):
    run = tmp_path / "run"
    first = run_training(tiny_config(demo_data_dir, run, max_update=50, max_time=1e-9))
    assert first.stop_reason == "max_time" and first.num_updates == 1
    before = load_checkpoint(run / "checkpoint_last.pt")

    again = run_training(tiny_config(demo_data_dir, run, max_update=50, max_time=1e-9))

    assert again.stop_reason == "max_time" and again.num_updates == first.num_updates
    after = load_checkpoint(run / "checkpoint_last.pt")
    assert after["train_state"]["num_updates"] == before["train_state"]["num_updates"]
    for name, tensor in before["model"].items():
        assert after["model"][name].equal(tensor), name
