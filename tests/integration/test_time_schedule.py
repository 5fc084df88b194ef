"""A schedule over the time budget (optim.schedule_unit=time): a run killed with SIGKILL
and resumed continues the same learning-rate curve from the training time saved in its
checkpoint, and the ranks of a torchrun job set the same learning rate at every update.

Each test runs real processes (an nmt-train killed with SIGKILL, two gloo ranks).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import torchrun_standalone
from test_reliability_input import train_args

from nmt.checkpoint import load_checkpoint
from nmt.cli import compose_config, to_dataclass
from nmt.training.optim import schedule_function

BIN = Path(sys.executable).parent
BUDGET_S = 10.0  # the run's max_time, in seconds


def time_schedule_args(data: Path, save_dir: Path, budget_s: float = BUDGET_S) -> list[str]:
    """The tiny model on the demo's valid split for `budget_s` seconds, its lr over that
    budget: warmup in the first 20%, a cosine down to min_lr at the end."""
    common = [a for a in train_args(data, save_dir) if not a.startswith("max_update=")]
    return [
        *common,
        f"max_time={budget_s / 3600.0!r}",
        "logging.interval=1",
        "checkpoint.save_interval_updates=50",
        "checkpoint.keep_last=1",
        "optim=adam_cosine_time",
        "optim.lr=1e-3",
        "optim.warmup_fraction=0.2",
        "optim.min_lr=1e-5",
    ]


def events(save_dir: Path) -> list[dict]:
    log = save_dir / "train.jsonl"
    if not log.exists():
        return []
    lines = log.read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines if line.endswith("}")]  # a line being written


def ten_updates_past_a_checkpoint(proc: subprocess.Popen, run: Path) -> bool:
    """Whether the run, past 55% of its budget, has logged 10 updates since the checkpoint
    it would resume from; if so it is left stopped (SIGSTOP), so that a kill loses them.

    Saves come at epoch ends as well as every 50 updates, and one may land between a look
    at the log and the kill: the run is frozen while its log and checkpoint_last.pt are
    read, and goes on (SIGCONT) when the answer is no."""
    logged = [e for e in events(run) if e["type"] == "train"]
    saves = [e["update"] for e in events(run) if e["type"] == "save"]
    if not (logged and saves and logged[-1]["budget"] >= 0.55):
        return False
    if logged[-1]["update"] < saves[-1] + 10:
        return False
    os.kill(proc.pid, signal.SIGSTOP)
    logged = [e for e in events(run) if e["type"] == "train"]
    saved = load_checkpoint(run / "checkpoint_last.pt")["train_state"]["num_updates"]  # atomic
    if logged[-1]["update"] >= saved + 10:
        return True
    os.kill(proc.pid, signal.SIGCONT)
    return False


def test_a_killed_run_resumes_on_the_same_lr_curve(demo_data_dir, tmp_path):
    run = tmp_path / "run"
    args = time_schedule_args(demo_data_dir, run)
    cfg = to_dataclass(compose_config("train", args), "train")
    lr_of = schedule_function(cfg.optim, cfg.max_update)
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    # stderr to a file, not a pipe nobody reads while waiting: logging.interval=1 fills a 64 KiB
    # pipe before 55% of the budget on a fast CPU, and the blocked run never got there
    stderr_path = tmp_path / "stderr.log"
    with stderr_path.open("wb") as stderr:
        proc = subprocess.Popen(
            [str(BIN / "nmt-train"), *args], stdout=subprocess.DEVNULL, stderr=stderr, env=env
        )
    # SIGKILL half way through the decay, 10 or more updates after a checkpoint
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if ten_updates_past_a_checkpoint(proc, run):
            break
        time.sleep(0.02)
    proc.kill()
    proc.wait(timeout=60)
    err = stderr_path.read_text(errors="replace")
    assert proc.returncode == -9, f"the run ended before the kill: {err[-2000:]}"
    saved = load_checkpoint(run / "checkpoint_last.pt")["train_state"]
    first_run = [e for e in events(run) if e["type"] == "train"]
    assert first_run[-1]["update"] > saved["num_updates"]  # the kill lost some updates

    from nmt.cli import main

    main("train", args)  # the same command resumes, to the end of the budget
    log = events(run)
    starts = [i for i, e in enumerate(log) if e["type"] == "start"]
    assert len(starts) == 2 and log[starts[1]]["update"] == saved["num_updates"]
    killed = [e for e in log[: starts[1]] if e["type"] == "train"]
    resumed = [e for e in log[starts[1] :] if e["type"] == "train"]
    assert log[-1]["type"] == "stop" and log[-1]["reason"] == "max_time"

    # The lr is the schedule's function of the budget share, in both runs, to the bit.
    for e in killed + resumed:
        assert e["lr"] == lr_of(e["budget"]), e
    # The resumed run's clock starts from the checkpoint's training time, not from zero
    # (a restarted curve) nor from the kill (a jump over the lost updates): its first
    # update is just after the saved time, and the curve goes on from there.
    at_save = saved["elapsed"] / BUDGET_S
    first = resumed[0]
    assert first["update"] == saved["num_updates"] + 1
    assert at_save <= first["budget"] <= at_save + 0.1, (at_save, first["budget"])
    before = next(e for e in killed if e["update"] == saved["num_updates"])
    lost = killed[-1]
    assert before["budget"] <= first["budget"] < lost["budget"]
    assert before["lr"] >= first["lr"] > lost["lr"]  # the decay, continued: no jump up or down
    # On to the end of the budget: a monotone decay down to min_lr.
    budgets = [e["budget"] for e in resumed]
    assert budgets == sorted(budgets) and budgets[-1] >= 0.95
    lrs = [e["lr"] for e in resumed]
    assert lrs == sorted(lrs, reverse=True)
    assert lrs[-1] == pytest.approx(1e-5, abs=2e-5)
    stopped = load_checkpoint(run / "checkpoint_last.pt")["train_state"]
    assert stopped["elapsed"] >= BUDGET_S


WORKER = textwrap.dedent("""
    # one rank of a torchrun job: records the lr it sets at every update, as it sets it
    # (nmt-train's ranks leave with os._exit: nothing runs after main)
    import json, os, sys
    from nmt.training import optim
    lrs, real_step = [], optim.LRScheduler.step
    record = os.path.join(sys.argv[1], f"lrs.{os.environ['RANK']}.json")
    def step(self, num_updates, elapsed=0.0):
        lr = real_step(self, num_updates, elapsed)
        lrs.append([num_updates, lr])
        with open(record, "w") as f:
            json.dump(lrs, f)
        return lr
    optim.LRScheduler.step = step
    from nmt.cli import main
    main("train", sys.argv[2:])
""")


def test_ranks_set_the_same_lr_from_one_agreed_clock(demo_data_dir, tmp_path):
    """Each rank's own clock differs (the processes started apart); the learning rate they
    set must not, or their weights drift apart under DDP."""
    worker = tmp_path / "worker.py"
    worker.write_text(WORKER)
    args = time_schedule_args(demo_data_dir, tmp_path / "ddp", budget_s=3600.0)
    args += ["max_update=12", "model.dropout=0.0", "optim.warmup_fraction=0.5"]
    failure = torchrun_standalone([str(worker), str(tmp_path), *args], tmp_path / "logs", 300)
    assert failure is None, failure
    rank0, rank1 = (json.loads((tmp_path / f"lrs.{r}.json").read_text()) for r in (0, 1))
    assert len(rank0) == 12 and rank0 == rank1
    lrs = [lr for _, lr in rank0]
    assert lrs == sorted(lrs) and lrs[0] < lrs[-1]  # in the warmup: the clock moved
