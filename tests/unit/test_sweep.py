"""nmt.commands.sweep: run names, the figures read from a run's train.jsonl, and a run killed
as the out-of-memory killer would kill it (real processes standing in for nmt-train)."""

from __future__ import annotations

import json
import sys
from pathlib import Path

from nmt.commands.sweep import SweepRun, format_table, read_figures, run_names, run_sweep


def test_run_names_come_from_the_swept_values() -> None:
    names = run_names(
        [
            ["model=transformer_tiny", "optim.lr=0.001"],
            ["data=data-bin/a b"],  # a / and a space: not in a folder name
            ["data=data-bin/a?b"],  # the same name once cleaned: the index instead
            [],  # nothing swept
            ["x=" + "y" * 200],  # too long
        ]
    )
    assert names == [
        "model=transformer_tiny,optim.lr=0.001",
        "data=data-bin_a_b",
        "run2",
        "run",
        "run4",
    ]


def _write_log(path: Path, records: list[dict], tail: str = "") -> None:
    path.mkdir(parents=True, exist_ok=True)
    lines = [json.dumps(r) for r in records]
    (path / "train.jsonl").write_text("\n".join(lines) + "\n" + tail, encoding="utf-8")


def test_the_figures_of_a_resumed_run(tmp_path: Path) -> None:
    """Two sessions (a resume): their times add up, the best valid loss is the lowest and
    the best BLEU the highest of every validation; a line cut by a kill is skipped."""
    _write_log(
        tmp_path / "run",
        [
            {"type": "start", "time": 100.0, "update": 0},
            {"type": "train", "time": 110.0, "update": 10, "loss": 5.0},
            {"type": "valid", "time": 112.0, "update": 10, "loss": 4.0, "bleu": 3.5},
            {"type": "start", "time": 500.0, "update": 10},
            {"type": "valid", "time": 530.0, "update": 20, "loss": 4.5, "bleu": 7.25},
            {"type": "stop", "time": 531.0, "update": 20, "reason": "max_update"},
        ],
        tail='{"type": "train", "ti',
    )
    run = SweepRun("run", [], [], str(tmp_path / "run"))
    read_figures(run)
    assert (run.updates, run.best_valid_loss, run.best_bleu) == (20, 4.0, 7.25)
    assert run.train_seconds == 12.0 + 31.0
    assert run.stop_reason == "max_update"


def test_a_run_that_did_not_stop_has_no_stop_reason(tmp_path: Path) -> None:
    _write_log(tmp_path / "r", [{"type": "start", "time": 1.0, "update": 0}])
    run = SweepRun("r", [], [], str(tmp_path / "r"))
    read_figures(run)
    assert run.stop_reason is None and run.best_valid_loss is None and run.train_seconds == 0


def test_a_killed_run_is_reported_and_the_next_one_runs(tmp_path: Path, capsys) -> None:
    """A run killed by SIGKILL (as the out-of-memory killer does) fails alone."""
    kill_or_pass = (
        "import os, signal, sys\n"
        "if sys.argv[1] == 'die': os.kill(os.getpid(), signal.SIGKILL)\n"
        "if sys.argv[1] == 'fail': sys.exit('nmt-train: error: x=1: wrong; fix it')\n"
    )
    command = [sys.executable, "-c", kill_or_pass]
    runs = [
        SweepRun(name, [f"v={name}"], [name], str(tmp_path / "sweep" / name))
        for name in ("die", "fail", "pass")
    ]
    code = run_sweep(runs, tmp_path / "sweep", command)
    assert code == 1
    saved = json.loads((tmp_path / "sweep" / "sweep.json").read_text())["runs"]
    assert [(r["status"], r["exit_code"]) for r in saved] == [
        ("failed", -9),
        ("failed", 1),
        ("done", 0),
    ]
    assert saved[0]["error"] == "killed by SIGKILL (out of memory?)"
    assert saved[1]["error"] == "x=1: wrong; fix it"
    out = capsys.readouterr().out
    assert out == format_table(runs) + "\n"
    assert [line.split()[:2] for line in out.splitlines()[1:]] == [
        ["v=die", "failed"],
        ["v=fail", "failed"],
        ["v=pass", "done"],
    ]
