"""The GPU suite (`pytest -m gpu`): every test here needs a CUDA device and is skipped
without one (tests/conftest.py). Run it on a GPU machine with a CUDA build of torch:

    .venv/bin/python -m pytest -m gpu tests/gpu

cuBLAS needs a fixed workspace for deterministic results (the bitwise-resume test turns
torch's deterministic algorithms on); it must be set before cuBLAS starts, so here.

TF32, deterministic algorithms, cuDNN attention and the sync debug mode are process-wide
switches that training turns on or off (runtime.setup) or a test sets: each test gets them back as
they were, so that no test's result depends on which tests ran before it (generation's
exact-fp32 comparisons would otherwise run on TF32 after any CUDA training test).
"""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import torch

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


@pytest.fixture(autouse=True)
def cuda_switches_restored():
    """TF32, deterministic algorithms, cuDNN attention and the sync debug mode as they were
    before the test."""
    matmul, cudnn = torch.backends.cuda.matmul, torch.backends.cudnn
    before = (matmul.allow_tf32, cudnn.allow_tf32, torch.are_deterministic_algorithms_enabled())
    cudnn_attention = torch.backends.cuda.cudnn_sdp_enabled()  # runtime.setup turns it off
    yield
    matmul.allow_tf32, cudnn.allow_tf32 = before[:2]
    torch.use_deterministic_algorithms(before[2])
    torch.backends.cuda.enable_cudnn_sdp(cudnn_attention)
    if torch.cuda.is_available():
        torch.cuda.set_sync_debug_mode("default")
