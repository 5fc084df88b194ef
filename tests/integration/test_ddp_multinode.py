"""Across machines: 2 nodes x 1 process (two torchrun agents meeting through a c10d
rendezvous on loopback, gloo) train exactly as 1 node x 2 processes.

Both runs are real torchrun jobs of the same worker; the comparison is between their final
weights and validation figures (docs/training.md, "Several machines").
"""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import (
    assert_bitwise_equal,
    last_params,
    outputs_of,
    rank_env,
    rendezvous_store,
    torchrun_standalone,
    worker_env,
)


def _worker(tmp_path: Path, data_dir: Path) -> Path:
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import os, sys
        from pathlib import Path
        from helpers import NO_DROPOUT, tiny_config, train_as_a_rank
        save_dir = Path(sys.argv[1])
        # every rank writes where it ran, so the test can tell the nodes apart
        (save_dir.parent / f"{{save_dir.name}}.rank{{os.environ['RANK']}}").write_text(
            os.environ["GROUP_RANK"] + " " + os.environ["LOCAL_RANK"] + " " + os.environ["WORLD_SIZE"])
        train_as_a_rank(tiny_config(Path({str(data_dir)!r}), save_dir, update_freq=1,
                                 model=NO_DROPOUT, max_update=10, validation={{"split": "test"}},
                                 optim={{"clip_norm": 0.5}}))
    """)
    )
    return worker


def _torchrun(*args: str) -> list[str]:
    return [sys.executable, "-m", "torch.distributed.run", *args]


def _two_agents(worker: Path, port: int, save_dir: Path):
    """Two torchrun agents of one process each, meeting at the rendezvous_store on `port`
    through a c10d rendezvous; returns their (stdout, stderr) and the agents."""
    agents = [
        subprocess.Popen(
            _torchrun(
                "--nnodes",
                "2",
                "--nproc-per-node",
                "1",
                "--rdzv-backend",
                "c10d",
                "--rdzv-endpoint",
                f"127.0.0.1:{port}",
                "--rdzv-conf",
                "is_host=false",
                "--rdzv-id",
                "nmt-two-nodes",
                "--max-restarts",
                "0",
                str(worker),
                str(save_dir),
            ),  # fmt: skip
            env=worker_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        for _ in range(2)
    ]
    return outputs_of(agents, timeout=240), agents


def test_two_nodes_equal_one_node_with_two_processes(demo_data_dir: Path, tmp_path: Path) -> None:
    worker = _worker(tmp_path, demo_data_dir)
    failure = torchrun_standalone([str(worker), str(tmp_path / "one")], tmp_path / "logs", 300)
    assert failure is None, failure

    with rendezvous_store() as port:  # the agents meet there (is_host=false: neither binds it)
        outs, agents = _two_agents(worker, port, tmp_path / "two")
    for agent, (_, err) in zip(agents, outs):
        assert agent.returncode == 0, err[-2000:]
    # two nodes (GROUP_RANK 0 and 1), one process each (LOCAL_RANK 0), two ranks in all
    where = sorted((tmp_path / f"two.rank{r}").read_text() for r in range(2))
    assert where == ["0 0 2", "1 0 2"]

    # the same two ranks doing the same operations: bitwise (see test_ddp.py)
    assert_bitwise_equal(last_params(tmp_path / "one"), last_params(tmp_path / "two"))
    events = {
        run: [
            json.loads(line) for line in (tmp_path / run / "train.jsonl").read_text().splitlines()
        ]
        for run in ("one", "two")
    }
    for run in events.values():  # both trained 10 updates (not two untouched initialisations)
        assert [e["update"] for e in run if e["type"] == "stop"] == [10]
    valid = [[e for e in events[run] if e["type"] == "valid"][-1] for run in ("one", "two")]
    assert valid[0]["loss"] == valid[1]["loss"]
    assert valid[0]["ntokens"] == valid[1]["ntokens"] > 0


def test_a_rank_that_does_not_see_the_checkpoint_stops_the_run(
    demo_data_dir: Path, tmp_path: Path
) -> None:
    """save_dir not shared: rank 0 would resume while rank 1 starts afresh; both refuse."""
    (tmp_path / "run0").mkdir()
    (tmp_path / "run0" / "checkpoint_last.pt").write_bytes(b"rank 0's checkpoint")
    worker = tmp_path / "worker.py"
    worker.write_text(
        textwrap.dedent(f"""
        import os
        from nmt.cli import main
        main("train", ["data={demo_data_dir}", "save_dir={tmp_path}/run" + os.environ["RANK"],
                       "train_split=valid", "validation.split=''", "max_update=2", "threads=1",
                       "device=cpu", "distributed.timeout=60", "logging.tensorboard=false", "logging.progress_bar=false",
                       "model.embed_dim=16", "model.ffn_dim=32", "model.encoder_layers=1",
                       "model.decoder_layers=1", "model.attention_heads=2"])
    """)
    )
    with rendezvous_store() as port:
        procs = [
            subprocess.Popen(
                [sys.executable, str(worker)],
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                env=rank_env(port, r, local_rank=0),  # two machines: LOCAL_RANK 0 each
            )
            for r in range(2)
        ]
        outs = outputs_of(procs, timeout=120)
    for r, (proc, (_, err)) in enumerate(zip(procs, outs)):
        assert proc.returncode == 2, err[-2000:]
        last = err.strip().splitlines()[-1]
        assert last.startswith(
            f"nmt-train: error: {tmp_path}/run{r}/checkpoint_last.pt: ranks [0] see it, ranks [1] "
            "do not"
        ), last
        assert "put save_dir on storage every machine shares" in last
    assert (tmp_path / "run0" / "checkpoint_last.pt").read_bytes() == b"rank 0's checkpoint"
