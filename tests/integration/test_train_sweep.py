"""nmt-train -m: a sweep in Hydra's multirun syntax, run through the console script on the
demo data: each run in its own save_dir under the sweep's, a failed run reported while
the others go on, the table printed and written as sweep.json, a second run of the same
sweep resuming (no update trained again), Ctrl-C stopping the sweep after the run in
progress has saved, and every run's config validated before the first starts."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

BIN = Path(sys.executable).parent
ENV = {**os.environ, "NMT_DEBUG": ""}


def _sweep(data: Path, sweep_dir: Path, *overrides: str) -> list[str]:
    return [
        str(BIN / "nmt-train"),
        "-m",
        f"data={data}",
        f"save_dir={sweep_dir}",
        "model=transformer_tiny",
        "max_tokens=500",
        "device=cpu",
        "threads=1",
        *overrides,
    ]


def _records(run_dir: Path) -> list[dict]:
    lines = (run_dir / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [json.loads(line) for line in lines]


def test_a_sweep_runs_each_combination_reports_a_failure_and_resumes(
    demo_data_dir: Path, tmp_path: Path
) -> None:
    sweep_dir = tmp_path / "sweep"
    # 2 x 1 runs; the split that the data dir lacks fails when training starts, not when
    # the config is validated
    argv = _sweep(demo_data_dir, sweep_dir, "train_split=valid,nosuch", "max_update=range(4,5)")
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 1, proc.stderr  # one run failed

    table = json.loads((sweep_dir / "sweep.json").read_text())
    runs = {run["name"]: run for run in table["runs"]}
    assert list(runs) == ["train_split=valid,max_update=4", "train_split=nosuch,max_update=4"]
    done, failed = runs.values()
    assert done["status"] == "done" and done["exit_code"] == 0 and done["updates"] == 4
    assert done["save_dir"] == str(sweep_dir / done["name"])
    assert done["best_valid_loss"] > 0 and done["train_seconds"] > 0
    assert done["stop_reason"] == "max_update"
    assert failed["status"] == "failed" and failed["exit_code"] == 2
    assert failed["error"].startswith("train_split=nosuch: ") and failed["updates"] is None
    assert sorted(p.name for p in sweep_dir.iterdir()) == sorted([done["name"], "sweep.json"])
    records = _records(sweep_dir / done["name"])
    assert {r["config"]["save_dir"] for r in records if r["type"] == "start"} == {done["save_dir"]}

    # the printed table: a header and one row per run, with its values and figures
    header, *rows = proc.stdout.strip().splitlines()
    assert header.split() == ["run", "status", "updates", "valid", "loss", "BLEU", "time"]
    assert rows[0].split()[:3] == ["train_split=valid", "max_update=4", "done"]
    assert f"{done['best_valid_loss']:.3f}" in rows[0]
    assert rows[1].split()[:4] == ["train_split=nosuch", "max_update=4", "failed", "-"]
    assert f"sweep run {failed['name']} failed: train_split=nosuch" in proc.stderr

    # the same sweep again: the finished run resumes and stops at once, nothing retrained
    again = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=600)
    assert again.returncode == 1, again.stderr
    assert "resumed from" in again.stderr
    trained = [r for r in _records(sweep_dir / done["name"]) if r["type"] == "train"]
    assert trained == [r for r in records if r["type"] == "train"]
    rerun = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    assert [(r["status"], r["updates"]) for r in rerun] == [("done", 4), ("failed", None)]


def test_every_run_is_validated_before_the_first_starts(demo_data_dir, tmp_path) -> None:
    sweep_dir = tmp_path / "sweep"
    argv = _sweep(demo_data_dir, sweep_dir, "optim.lr=1e-3,-1", "max_update=4")
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=600)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert lines[0].startswith("nmt-train: error: sweep run 2 of 2 (optim.lr=-1): optim.lr=-1")
    assert not sweep_dir.exists()


def test_cfg_prints_each_runs_config(nmt_cli, tmp_path: Path) -> None:
    code, out, err = nmt_cli("train", "-m", "--cfg", "data=d", f"save_dir={tmp_path}", "seed=1,2")
    assert code == 0, err
    assert out.count("# sweep run ") == 2 and "# sweep run 2 of 2: seed=2" in out
    assert f"save_dir: {tmp_path / 'seed=1'}" in out and f"save_dir: {tmp_path / 'seed=2'}" in out
    assert not any(tmp_path.iterdir())


@pytest.mark.parametrize("command", ["generate", "score", "preprocess"])
def test_other_commands_refuse_multirun_in_one_line(nmt_cli, command: str) -> None:
    code, _, err = nmt_cli(command, "--multirun", "seed=1,2")
    assert code == 2 and err.count("\n") == 1
    assert f"sweeps are run by nmt-train only; run nmt-{command} once per value" in err


def test_a_sweep_under_torchrun_is_refused(nmt_cli, monkeypatch) -> None:
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = nmt_cli("train", "-m", "seed=1,2")
    assert code == 2 and err.count("\n") == 1 and "every rank would run the whole sweep" in err


def test_ctrl_c_stops_the_sweep_after_the_run_in_progress_saved(
    demo_data_dir: Path, tmp_path: Path
) -> None:
    sweep_dir = tmp_path / "sweep"
    argv = _sweep(demo_data_dir, sweep_dir, "train_split=valid", "seed=1,2", "max_update=100000")
    proc = subprocess.Popen(
        argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=ENV
    )
    first = sweep_dir / "seed=1"
    deadline = time.monotonic() + 300
    log = first / "train.jsonl"
    while not (log.is_file() and log.read_text().endswith("\n")):  # the start record
        assert proc.poll() is None and time.monotonic() < deadline, proc.communicate()
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)  # as Ctrl-C reaches the sweep (its runs have their own group)
    out, err = proc.communicate(timeout=300)
    assert proc.returncode == 130, err
    runs = json.loads((sweep_dir / "sweep.json").read_text())["runs"]
    assert [r["status"] for r in runs] == ["interrupted", "not run"]
    assert runs[0]["exit_code"] == 130 and (first / "checkpoint_last.pt").is_file()
    assert not (sweep_dir / "seed=2").exists()
    assert "interrupted" in out and "not run" in out
