"""The GPU suite (`pytest -m gpu`): every test here needs a CUDA device and is skipped
without one (tests/conftest.py). Run it on a GPU machine with a CUDA build of torch:

    .venv/bin/python -m pytest -m gpu tests/gpu

cuBLAS needs a fixed workspace for deterministic results (the bitwise-resume test turns
torch's deterministic algorithms on); it must be set before cuBLAS starts, so here.
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")


@pytest.fixture(scope="session")
def trained_checkpoint(demo_data_dir: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny model trained for 150 updates on the CPU: translations worth comparing."""
    from dataclasses import replace

    from helpers import run_training, tiny_config

    run = tmp_path_factory.mktemp("trained")
    cfg = tiny_config(demo_data_dir, run, train_split="train", max_update=150, max_tokens=2000)
    run_training(replace(cfg, optim=replace(cfg.optim, lr=3e-3, warmup_updates=20)))
    return run / "checkpoint_last.pt"
