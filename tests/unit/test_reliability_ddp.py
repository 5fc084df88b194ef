"""Reliability (issue 7), torchrun: a rank that raises (rather than dies, which test_ddp.py
covers) ends with its own one-line error, and the other rank stops within a bounded time
with a one-line error naming its rank, never a hang. Two real gloo processes: slow."""

from __future__ import annotations

import subprocess
import sys
import textwrap
import time

import pytest

from test_ddp import _env, _free_port


@pytest.mark.slow
def test_a_rank_that_raises_stops_the_other_within_the_timeout(demo_data_dir, tmp_path):
    worker = tmp_path / "worker.py"
    worker.write_text(textwrap.dedent(f"""
        import os
        from nmt.cli import main
        from nmt.errors import NmtError
        from nmt.training.trainer import Trainer

        if os.environ["RANK"] == "1":
            real_step = Trainer._train_step
            def failing_step(self, group):
                if self.num_updates == 2:
                    raise NmtError("update 3: injected failure on rank 1")
                real_step(self, group)
            Trainer._train_step = failing_step
        main("train", ["data={demo_data_dir}", "save_dir={tmp_path / 'run'}", "train_split=valid",
                       "valid_split=''", "max_tokens=500", "max_update=50", "threads=1", "device=cpu",
                       "ddp_timeout=20", "tensorboard=false", "progress_bar=false",
                       "model.embed_dim=16", "model.ffn_dim=32", "model.encoder_layers=1",
                       "model.decoder_layers=1", "model.attention_heads=2"])
    """))
    port = str(_free_port())
    procs = [subprocess.Popen([sys.executable, str(worker)], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=_env(RANK=str(r), LOCAL_RANK=str(r), WORLD_SIZE="2",
                                                  MASTER_ADDR="127.0.0.1", MASTER_PORT=port))
             for r in range(2)]
    try:
        out1 = procs[1].communicate(timeout=120)
        failed_at = time.monotonic()
        out0 = procs[0].communicate(timeout=60)  # ddp_timeout=20 bounds the wait
        waited = time.monotonic() - failed_at
    finally:
        for p in procs:
            p.kill()
    assert procs[1].returncode == 2
    assert out1[1].strip().splitlines()[-1] == "nmt-train: error: update 3: injected failure on rank 1"
    assert procs[0].returncode == 2, out0[1][-2000:]
    last = out0[1].strip().splitlines()[-1]
    assert last.startswith("nmt-train: error: rank 0/2: lost contact with the other ranks"), last
    assert "Traceback" not in out0[1] + out1[1]
    assert waited < 50
