"""Two NCCL ranks (needs two GPUs): they make the updates one rank with update_freq=2
makes, an out-of-memory batch on one rank is skipped by both, and a dead rank gives the
other a one-line error (issue 20, items 9 and 10)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
from helpers import NO_DROPOUT, last_params, run_training, tiny_config

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(torch.cuda.device_count() < 2, reason="needs two GPUs"),
]

TESTS = Path(__file__).resolve().parents[1]


def _torchrun(script: Path, timeout: float) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK")}
    env["PYTHONPATH"] = f"{TESTS}{os.pathsep}{env.get('PYTHONPATH', '')}"
    return subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node", "2"]
        + [str(script)],
        env=env,
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def test_two_nccl_ranks_equal_one_gpu_with_update_freq_2(demo_data_dir, tmp_path):
    common = dict(max_update=10, device="cuda", optim={"clip_norm": 0.5})
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        from pathlib import Path
        from helpers import NO_DROPOUT, run_training, tiny_config
        run_training(tiny_config(Path({str(demo_data_dir)!r}), Path({str(tmp_path / "ddp")!r}),
                                 update_freq=1, model=NO_DROPOUT, **{common!r}))
    """)
    )
    proc = _torchrun(worker, timeout=300)
    assert proc.returncode == 0, proc.stderr[-2000:]
    run_training(
        tiny_config(demo_data_dir, tmp_path / "single", update_freq=2, model=NO_DROPOUT, **common)
    )
    ddp, single = last_params(tmp_path / "ddp"), last_params(tmp_path / "single")
    # TF32 matmuls and NCCL's summation order: equal to float rounding, not bitwise
    assert max(float((ddp[k] - single[k]).abs().max()) for k in ddp) <= 1e-4


def test_a_dead_nccl_rank_gives_the_other_a_one_line_error(demo_data_dir, tmp_path):
    """Rank 1 exits without a word at its 3rd update; rank 0 notices at its next host
    agreement (a gloo group beside NCCL) and stops with nmt's one-line error, rather than
    waiting for NCCL's watchdog to abort it."""
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import os
        from nmt.cli import main
        from nmt.training import step

        if os.environ["RANK"] == "1":
            real_step = step.train_step
            def faulty_step(t, group):
                if t.progress.num_updates == 2:
                    os._exit(3)
                real_step(t, group)
            step.train_step = faulty_step
        main("train", ["data={demo_data_dir}", "save_dir={tmp_path / "run"}", "train_split=valid",
                       "validation.split=''", "max_tokens=500", "max_update=50", "device=cuda",
                       "distributed.timeout=30", "logging.tensorboard=false", "logging.progress_bar=false",
                       "model.embed_dim=16", "model.ffn_dim=32", "model.encoder_layers=1",
                       "model.decoder_layers=1", "model.attention_heads=2"])
    """)
    )
    proc = _torchrun(worker, timeout=240)
    assert proc.returncode != 0
    lines = [line for line in proc.stderr.splitlines() if line.startswith("nmt-train: error:")]
    assert any("rank 0/2: lost contact with the other ranks" in line for line in lines), (
        proc.stderr[-3000:]
    )
