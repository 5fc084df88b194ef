"""Reliability (issue 7), crashes: SIGKILL at random moments and in the middle of a checkpoint
write never leaves checkpoint_last.pt unreadable, every re-run resumes, and the end result
is bitwise equal (CPU, fp32) to an uninterrupted run; SIGINT through the real console script
saves at the current update and the same command resumes.

Each test runs `nmt-train` as a real process (the only way to SIGKILL it); the default set
kills twice, the slow one (`-m slow`) five times at random moments.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
from helpers import assert_bitwise_equal, last_params
from test_reliability_input import train_args

from nmt.checkpoint import load_checkpoint
from nmt.training.checkpointing import saved_update as update_in

BIN = Path(sys.executable).parent
UPDATES = 16
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NMT_DEBUG": ""}


def run_args(data: Path, save_dir: Path, max_update: int = UPDATES) -> list[str]:
    """Save every update (so a kill loses at most one) and keep few numbered files."""
    return train_args(
        data,
        save_dir,
        f"max_update={max_update}",
        "checkpoint.save_interval_updates=1",
        "checkpoint.keep_last=2",
        "logging.interval=1",
    )


@pytest.fixture(scope="module")
def reference(demo_data_dir, tmp_path_factory) -> Path:
    """The uninterrupted run, through the same CLI (in-process)."""
    from nmt.cli import main

    save_dir = tmp_path_factory.mktemp("uninterrupted")
    main("train", run_args(demo_data_dir, save_dir))
    return save_dir


def start(argv: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=ENV
    )


def saved_update(save_dir: Path) -> int:
    last = save_dir / "checkpoint_last.pt"
    return load_checkpoint(last)["train_state"]["num_updates"] if last.exists() else 0


def kill_at_random(proc: subprocess.Popen, save_dir: Path, rng: random.Random) -> None:
    """SIGKILL a short random time after the run's next checkpoint write (if it lives that long)."""
    last = save_dir / "checkpoint_last.pt"
    before = last.stat().st_mtime_ns if last.exists() else 0
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if last.exists() and last.stat().st_mtime_ns != before:
            break
        time.sleep(0.005)
    time.sleep(rng.uniform(0.0, 0.15))
    proc.kill()
    proc.communicate(timeout=30)  # reaps it and closes its stderr pipe


def resume_to_the_end(data: Path, save_dir: Path) -> None:
    """The same command once more, in-process (no kill follows, so no process start-up)."""
    from nmt.cli import main

    main("train", run_args(data, save_dir))  # a failure is SystemExit: the test fails


def kill_and_resume(data: Path, save_dir: Path, kills: int, seed: int) -> list[int]:
    """`kills` random SIGKILLs, each followed by a resume; returns the update saved at each kill."""
    rng = random.Random(seed)
    seen = []
    for _ in range(kills):
        kill_at_random(start([str(BIN / "nmt-train"), *run_args(data, save_dir)]), save_dir, rng)
        seen.append(saved_update(save_dir))  # raises if checkpoint_last.pt were unreadable
    resume_to_the_end(data, save_dir)
    return seen


KILL_MID_WRITE = textwrap.dedent("""
    # nmt-train whose k-th checkpoint write dies half way through (SIGKILL: no cleanup at all)
    import io, os, signal, sys
    import torch
    real_save, k, calls = torch.save, int(sys.argv[1]), 0
    def save(obj, f, *args, **kwargs):
        global calls
        calls += 1
        if calls == k:
            buf = io.BytesIO()
            real_save(obj, buf, *args, **kwargs)
            f.write(buf.getvalue()[: len(buf.getvalue()) // 2])
            f.flush()
            os.kill(os.getpid(), signal.SIGKILL)
        real_save(obj, f, *args, **kwargs)
    torch.save = save
    from nmt.cli import main
    main("train", sys.argv[2:])
""")


def sigint_after_next_update(proc: subprocess.Popen, save_dir: Path) -> str:
    """Ctrl-C once the run has logged one more update; returns its stderr."""
    log = save_dir / "train.jsonl"
    logged = log.read_text(encoding="utf-8").count('"train"') if log.exists() else 0
    deadline = time.monotonic() + 120
    while proc.poll() is None and time.monotonic() < deadline:
        if log.exists() and log.read_text(encoding="utf-8").count('"train"') > logged:
            break
        time.sleep(0.005)
    proc.send_signal(signal.SIGINT)
    return proc.communicate(timeout=60)[1]


def test_kill_mid_write_kill_at_random_sigint_then_resume_bitwise(
    demo_data_dir, tmp_path, reference
):
    """One run dir through every kind of interruption, then the same command finishes it."""
    run = tmp_path / "run"
    args = run_args(demo_data_dir, run)
    # 1. SIGKILL half way through the 3rd checkpoint write
    proc = subprocess.run(
        [sys.executable, "-c", KILL_MID_WRITE, "3", *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert proc.returncode == -signal.SIGKILL, proc.stderr[-2000:]
    assert saved_update(run) == 2  # the 3rd write died: the 2nd is complete and readable
    half_written = list(run.glob(".checkpoint_last.pt.*.tmp"))
    assert half_written, "the half-written temp file"
    # 2. SIGKILL at a random moment after the next save
    kill_at_random(start([str(BIN / "nmt-train"), *args]), run, random.Random(0))
    killed_at = saved_update(run)
    assert killed_at >= 3 and not half_written[0].exists()  # the re-run removed it
    # 3. Ctrl-C: finish the update, save it, exit 130 with one line saying how to resume
    proc = start([str(BIN / "nmt-train"), *args])
    err = sigint_after_next_update(proc, run)
    stopped = saved_update(run)
    assert proc.returncode == 128 + signal.SIGINT, err[-2000:]
    assert "Traceback" not in err and stopped > killed_at
    assert f"interrupted at update {stopped}" in err.strip().splitlines()[-1]
    events = [
        json.loads(line) for line in (run / "train.jsonl").read_text(encoding="utf-8").splitlines()
    ]
    assert events[-1]["reason"] == "signal" and events[-1]["update"] == stopped
    # 4. the same command resumes to the end: bitwise the uninterrupted result
    assert stopped < UPDATES, "the run ended before the SIGINT arrived; raise UPDATES"
    resume_to_the_end(demo_data_dir, run)
    assert saved_update(run) == UPDATES and list(run.glob(".*.tmp")) == []
    assert_bitwise_equal(last_params(run), last_params(reference))


@pytest.mark.slow
@pytest.mark.parametrize("seed", [1, 2])
def test_fault_injection_five_random_kills_bitwise(demo_data_dir, tmp_path, reference, seed):
    run = tmp_path / "run"
    seen = kill_and_resume(demo_data_dir, run, kills=5, seed=seed)
    assert seen == sorted(seen)  # progress is never lost
    assert_bitwise_equal(last_params(run), last_params(reference))


KILL_BEFORE_COPY = textwrap.dedent("""
    # nmt-train killed (SIGKILL) when its save at update argv[1] has written checkpoint_last.pt
    # and is about to copy it to the name argv[2]
    import os, signal, sys
    from pathlib import Path
    from nmt.training import checkpointing
    update, name, real_copy = int(sys.argv[1]), sys.argv[2], checkpointing.atomic_copy
    def copy(src, dst):
        if Path(dst).name == name and checkpointing.saved_update(Path(src)) == update:
            os.kill(os.getpid(), signal.SIGKILL)
        real_copy(src, dst)
    checkpointing.atomic_copy = copy
    from nmt.cli import main
    main("train", sys.argv[3:])
""")


@pytest.fixture(scope="module")
def validated_reference(demo_data_dir, tmp_path_factory) -> tuple[Path, list[str]]:
    """An uninterrupted run that validates, whose final save (the max_update stop) writes
    checkpoint_last.pt, a numbered copy and checkpoint_best.pt; and its arguments."""
    from nmt.cli import main

    save_dir = tmp_path_factory.mktemp("validated")
    args = train_args(
        demo_data_dir, save_dir, "max_update=6", "validation.split=valid", "logging.interval=1"
    )
    main("train", args)
    assert update_in(save_dir / "checkpoint_best.pt") == 6, "the last validation must be best"
    return save_dir, args


@pytest.mark.parametrize("copy", ["numbered", "best"])
def test_a_kill_between_checkpoint_last_and_its_copies_is_completed_by_the_rerun(
    validated_reference, tmp_path, copy
):
    """kill -9 after the final save wrote checkpoint_last.pt, before its copy to the numbered
    name (or to checkpoint_best.pt): the same command, with nothing left to train, makes it."""
    reference, reference_args = validated_reference
    (numbered,) = [p.name for p in reference.glob("checkpoint_*_6.pt")]
    name = numbered if copy == "numbered" else "checkpoint_best.pt"
    run = tmp_path / "run"
    args = [f"save_dir={run}" if a.startswith("save_dir=") else a for a in reference_args]
    killed = subprocess.run(
        [sys.executable, "-c", KILL_BEFORE_COPY, "6", name, *args],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=300,
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr[-2000:]
    assert saved_update(run) == 6
    if copy == "numbered":
        assert not (run / name).exists()
    else:  # the best of an earlier validation, or none
        assert not (run / name).exists() or update_in(run / name) < 6
    rerun = subprocess.run(
        [str(BIN / "nmt-train"), *args], capture_output=True, text=True, env=ENV, timeout=300
    )
    assert rerun.returncode == 0, rerun.stderr[-2000:]
    assert f"wrote {name}" in rerun.stderr
    assert update_in(run / name) == 6
    assert_bitwise_equal(load_checkpoint(run / name)["model"], last_params(reference))
    assert sorted(p.name for p in run.glob("checkpoint*.pt")) == sorted(
        p.name for p in reference.glob("checkpoint*.pt")
    )
