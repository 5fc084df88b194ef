"""nmt-train -m: run a sweep's trainings one after another and report them in one table.

The CLI expands Hydra's multirun syntax and composes and validates every run's config
before this module starts the first (nmt.cli.sweep_main). Each run is its own nmt-train
process, in its own save_dir under the sweep's, named after the values it was given
(`model=transformer_tiny,optim.lr=0.001`), so that:
- a run that fails, even one killed for its memory, is reported and the next one starts;
- running the same sweep again resumes each run as nmt-train resumes (a finished run
  stops at once), and a value added to a list adds a run without renaming the others;
- Ctrl-C or SIGTERM reaches the run in progress once (the children have a process group
  of their own, so the terminal does not signal them besides): it saves
  checkpoint_last.pt and stops, and the sweep stops after it; a child that would outlive
  the sweep gets SIGTERM from the kernel.

The table (one row per run: its values, status, updates, best valid loss and BLEU,
training time) is printed, and written with each run's error to <sweep dir>/sweep.json
after every run. Its figures come from each run's train.jsonl.
"""

from __future__ import annotations

import codecs
import json
import math
import os
import re
import signal
import subprocess
import sys
import threading
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from nmt.fsutil import atomic_write_text, exclusive_lock
from nmt.processes import signal_when_parent_dies

SWEEP_FILE = "sweep.json"
MAX_NAME = 120  # characters of a run's folder name; longer ones are named by their index
FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


@dataclass
class SweepRun:
    """One training of the sweep and how it went."""

    name: str  # its folder under the sweep dir
    values: list[str]  # the overrides that differ between runs (optim.lr=0.001)
    overrides: list[str]  # every override its nmt-train gets, save_dir's last
    save_dir: str
    status: str = "pending"  # pending, done, failed, interrupted, not run
    exit_code: int | None = None
    error: str = ""  # the last line the run wrote on stderr, when it failed
    updates: int | None = None
    best_valid_loss: float | None = None
    best_bleu: float | None = None
    train_seconds: float | None = None
    stop_reason: str | None = None  # max_update, max_epoch, max_time, patience, signal


def run_names(values: list[list[str]]) -> list[str]:
    """A folder name per run from its swept values, as Hydra's override_dirname writes
    them (key=value,key=value); unusual characters become _, a name that is too long or
    taken becomes the run's index."""
    names: list[str] = []
    for i, swept in enumerate(values):
        name = re.sub(r"[^\w.=,+-]", "_", ",".join(swept)) or "run"
        if len(name) > MAX_NAME or name in names or name.startswith("."):
            name = f"run{i}"
        names.append(name)
    return names


def read_figures(run: SweepRun) -> None:
    """The run's updates, best valid loss and BLEU, training time and how it stopped,
    from its train.jsonl (every session of it: a resumed run's too)."""
    path = Path(run.save_dir) / "train.jsonl"
    if not path.is_file():
        return
    records = []
    for line in path.read_text(encoding="utf-8", errors="replace").splitlines():
        try:
            records.append(json.loads(line))
        except json.JSONDecodeError:  # the line a killed run was writing
            continue
    updates = [r["update"] for r in records if isinstance(r.get("update"), int)]
    run.updates = max(updates) if updates else None
    valid = [r for r in records if r.get("type") == "valid"]
    run.best_valid_loss = _best([r.get("loss") for r in valid], min)
    run.best_bleu = _best([r.get("bleu") for r in valid], max)
    run.train_seconds = _session_seconds(records)
    ends = [r for r in records if r.get("type") in ("start", "stop")]
    run.stop_reason = ends[-1].get("reason") if ends and ends[-1]["type"] == "stop" else None


def _best(values: list[Any], pick) -> float | None:
    numbers = [v for v in values if isinstance(v, (int, float)) and math.isfinite(v)]
    return pick(numbers) if numbers else None


def _session_seconds(records: list[dict[str, Any]]) -> float | None:
    """Wall time from each session's start record to its last record, summed."""
    total, start, last = 0.0, None, None
    for record in records:
        when = record.get("time")
        if not isinstance(when, (int, float)):
            continue
        if record.get("type") == "start":
            if start is not None and last is not None:
                total += last - start
            start = when
        last = when
    if start is None or last is None:
        return None
    return total + last - start


def run_sweep(runs: list[SweepRun], sweep_dir: Path, command: list[str]) -> int:
    """Run each of `runs` as `command + run.overrides` in turn; print and save the table.

    Returns 0 when every run finished, 1 when one failed, 128 + the signal number when a
    signal stopped the sweep."""
    sweep_dir.mkdir(parents=True, exist_ok=True)
    with exclusive_lock(sweep_dir / ".sweep.lock", f"save_dir={sweep_dir}", remove=True):
        _save(runs, sweep_dir)  # the plan: every run pending
        stopped = _run_all(runs, sweep_dir, command)
        _save(runs, sweep_dir)
    print(format_table(runs))
    failed = [r for r in runs if r.status == "failed"]
    for run in failed:
        print(f"nmt-train: sweep run {run.name} failed: {run.error}", file=sys.stderr)
    print(f"nmt-train: sweep table written to {sweep_dir / SWEEP_FILE}", file=sys.stderr)
    if stopped:
        return 128 + stopped
    return 1 if failed else 0


def _run_all(runs: list[SweepRun], sweep_dir: Path, command: list[str]) -> int | None:
    """The runs one by one; the signal that stopped the sweep, or None."""
    current: list[subprocess.Popen] = []
    received: list[int] = []

    def forward(signum: int, frame: Any) -> None:
        received.append(signum)
        for process in current:  # the run saves checkpoint_last.pt and stops
            process.send_signal(signal.SIGTERM if signum == signal.SIGHUP else signum)

    previous = {sig: signal.signal(sig, forward) for sig in FORWARDED}
    try:
        for i, run in enumerate(runs):
            if received:
                run.status = "not run"
                continue
            print(
                f"nmt-train: sweep run {i + 1} of {len(runs)}: {' '.join(run.values) or '-'} "
                f"(save_dir={run.save_dir})",
                file=sys.stderr,
                flush=True,
            )
            code, error = _train(command + run.overrides, current)
            run.exit_code = code
            read_figures(run)
            if code == 0:
                run.status = "done"
            elif received:
                run.status = "interrupted"
            else:
                run.status = "failed"
                run.error = error or _exit_description(code)
            _save(runs, sweep_dir)
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    return received[0] if received else None


def _train(argv: list[str], current: list[subprocess.Popen]) -> tuple[int, str]:
    """Run one nmt-train; (its exit code, the last line of its stderr). Its stderr is
    passed through as it comes (progress bars included)."""
    process = subprocess.Popen(argv, stderr=subprocess.PIPE, preexec_fn=_own_process_group)
    current.append(process)
    tail = [""]  # the end of its stderr, for the error of a failed run

    def pass_through() -> None:
        assert process.stderr is not None
        decoder = codecs.getincrementaldecoder("utf-8")(errors="replace")
        while chunk := os.read(process.stderr.fileno(), 65536):
            text = decoder.decode(chunk)
            sys.stderr.write(text)
            sys.stderr.flush()
            tail[0] = (tail[0] + text)[-4096:]

    reader = threading.Thread(target=pass_through, daemon=True)
    reader.start()
    try:
        code = process.wait()
    finally:
        current.remove(process)
        reader.join()
    lines = [ln.strip() for ln in tail[0].splitlines() if ln.strip()]
    errors = [ln.split(": error: ", 1)[1] for ln in lines if ": error: " in ln]
    return code, (errors or lines or [""])[-1] if code else ""


def _own_process_group() -> None:
    """In the child, before nmt-train starts: a process group of its own (the sweep
    forwards the terminal's signals once), and SIGTERM when the sweep dies."""
    os.setpgrp()
    signal_when_parent_dies(signal.SIGTERM)


def _exit_description(code: int) -> str:
    if code < 0:
        return f"killed by {signal.Signals(-code).name} (out of memory?)"
    return f"exit status {code}"


def _save(runs: list[SweepRun], sweep_dir: Path) -> None:
    table = {"sweep_dir": str(sweep_dir), "runs": [asdict(run) for run in runs]}
    atomic_write_text(sweep_dir / SWEEP_FILE, json.dumps(table, indent=2) + "\n")


def format_table(runs: list[SweepRun]) -> str:
    """One row per run: its values, status, updates, best valid loss and BLEU, time."""
    header = ("run", "status", "updates", "valid loss", "BLEU", "time")
    rows = [header] + [
        (
            " ".join(r.values) or r.name,
            r.status,
            "-" if r.updates is None else str(r.updates),
            "-" if r.best_valid_loss is None else f"{r.best_valid_loss:.3f}",
            "-" if r.best_bleu is None else f"{r.best_bleu:.2f}",
            _duration(r.train_seconds),
        )
        for r in runs
    ]
    widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
    lines = []
    for row in rows:
        cells = [row[0].ljust(widths[0]), row[1].ljust(widths[1])]
        cells += [cell.rjust(width) for cell, width in zip(row[2:], widths[2:])]
        lines.append("  ".join(cells).rstrip())
    return "\n".join(lines)


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "-"
    minutes, secs = divmod(round(seconds), 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"
