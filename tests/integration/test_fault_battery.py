"""The fault-injection battery (issue 17): kill -9 at random points of nmt-preprocess,
nmt-train, nmt-generate and nmt-export, 20 seeded trials each.

Each command runs as a user runs it (its console script, in a session of its own) over an
output that a previous complete run left, and is killed with SIGKILL (its main process
only, as the OOM killer or `kill -9 PID` would) at a time drawn from a seeded RNG over the
command's measured duration, so that the kills land in its start-up, its work and its
final write. After each kill:
- the previous complete output is intact: byte-identical to before the run, or to the
  complete new output if the kill came after the final rename (never a mix); for training,
  every checkpoint file is complete, and those the killed run did not replace are
  byte-identical;
- nothing of the killed command lives on (preprocessing's workers die with it);
- re-running the same command (in-process through nmt.cli.main, the console script's
  code without a second interpreter start-up) completes, and its output equals an
  uninterrupted run's: the data dir, the export dir and the translations byte for byte,
  training's weights bitwise (CPU, fp32);
- no temporary is left beside the output after the re-run.

Slow: `.venv/bin/python -m pytest -m slow tests/integration/test_fault_battery.py -s`
prints each trial (the kill time, where it landed, what was found). The kill times are
drawn over the duration last measured; a command that finished before its kill (the
machine got less busy) is timed again by that run and killed anew, up to three times.
"""

from __future__ import annotations

import os
import random
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import pytest
from helpers import assert_bitwise_equal, last_params
from test_reliability_crash import BIN, ENV, run_args, saved_update

from nmt.checkpoint import load_checkpoint
from nmt.fsutil import TMP_SUFFIX

pytestmark = pytest.mark.slow

TRIALS = 20
SEED = 17  # the kill times of trial i of a command: random.Random(f"{SEED}-{command}-{i}")
DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
GRACE_S = 10.0  # how long a killed command's other processes may take to go


# ------------------------------------------------------------------ what is on disk


def snapshot(path: Path) -> bytes | dict[str, bytes] | None:
    """A file's bytes, a directory's {relative path: bytes}, or None when absent."""
    if path.is_file():
        return path.read_bytes()
    if path.is_dir():
        return {
            str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()
        }
    return None


def temporaries(folder: Path) -> list[str]:
    """Names of nmt.fsutil temporaries (`.<name>.<random>.tmp`) anywhere under `folder`."""
    return sorted(str(p.relative_to(folder)) for p in folder.rglob(f".*{TMP_SUFFIX}"))


def restore(previous: Path, path: Path) -> None:
    """Put the previous complete output (a file or a directory) at `path`."""
    if path.is_dir():
        shutil.rmtree(path)
    elif path.exists():
        path.unlink()
    if previous.is_dir():
        shutil.copytree(previous, path)  # independent copies: never links into `previous`
    else:
        shutil.copy2(previous, path)


# ------------------------------------------------------------------ the kill


@dataclass
class Killed:
    at_s: float  # when the SIGKILL was sent, after the start
    exited_before: bool  # the command had finished before its kill time
    survivors: list[int]  # processes of its session still alive GRACE_S after the kill


def session_pids(sid: int) -> list[int]:
    """Live (non-zombie) processes of session `sid`."""
    pids = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            fields = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:  # gone meanwhile
            continue
        state, session = fields[0], int(fields[3])
        if session == sid and state != "Z":
            pids.append(int(entry.name))
    return pids


def run_and_kill(argv: list[str], after_s: float) -> Killed:
    """Start `argv` in a session of its own; SIGKILL its main process `after_s` later."""
    proc = subprocess.Popen(
        argv,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        env=ENV,
        start_new_session=True,  # its session id is its pid: its workers are found by it
    )
    started = time.monotonic()
    try:
        proc.wait(timeout=after_s)
        exited = True
    except subprocess.TimeoutExpired:
        exited = False
        os.kill(proc.pid, signal.SIGKILL)  # the main process alone
        proc.wait(timeout=60)
    at = time.monotonic() - started
    deadline = time.monotonic() + GRACE_S
    while (survivors := session_pids(proc.pid)) and time.monotonic() < deadline:
        time.sleep(0.1)
    for pid in survivors:  # leave nothing running behind the test
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    return Killed(round(at, 2), exited, survivors)


def timed(argv: list[str]) -> float:
    """The wall time of one uninterrupted run of `argv` (which must succeed)."""
    started = time.monotonic()
    proc = subprocess.run(argv, capture_output=True, text=True, env=ENV, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    return time.monotonic() - started


# ------------------------------------------------------------------ the commands


@dataclass
class Case:
    """One command under the battery: its console script's argv, the output it writes,
    the previous complete output put there before each trial, and how to compare."""

    command: str
    args: list[str]
    output: Path  # the file or directory the command writes
    previous: Path  # a previous complete output, copied to `output` before each trial
    reference: Path  # the output of an uninterrupted run, beside the trial's
    duration_s: float  # the wall time of an uninterrupted console-script run, as last seen
    # checks after a kill (None: the output is the previous one or the reference, whole)
    check_killed: Callable[[Case], str | None] | None = None
    # checks the re-run's output against the reference (None: byte-identical)
    check_rerun: Callable[[Case], str | None] | None = None

    @property
    def argv(self) -> list[str]:
        return [str(BIN / f"nmt-{self.command}"), *self.args]


def measured_case(tmp: Path, command: str, args: list[str], output: Path, previous: Path) -> Case:
    """Run the command once uninterrupted over a copy of `previous` (timed: the kill times
    are drawn over this duration); its output is the reference."""
    restore(previous, output)
    duration = timed([str(BIN / f"nmt-{command}"), *args])
    reference = tmp / f"reference-{command}"
    if output.is_dir():
        shutil.copytree(output, reference)
    else:
        shutil.copy2(output, reference)
    return Case(command, args, output, previous, reference, duration)


def preprocess_args(dest: Path, *extra: str) -> list[str]:
    return [
        f"data.trainpref={DEMO / 'train'}",
        f"data.validpref={DEMO / 'valid'}",
        f"data.testpref=[{DEMO / 'test'}]",
        f"data.dest={dest}",
        "spm.num_threads=1",
        "workers=2",  # worker processes, which must die with the main one
        *extra,
    ]


def preprocess_case(tmp: Path) -> Case:
    from nmt.cli import main

    previous = tmp / "previous"  # the same corpus, another vocabulary: other bytes
    main("preprocess", preprocess_args(previous, "spm.vocab_size=400"))
    dest = tmp / "data-bin"
    return measured_case(tmp, "preprocess", preprocess_args(dest, "overwrite=true"), dest, previous)


@pytest.fixture(scope="module")
def trained(demo_data_dir, tmp_path_factory) -> dict[str, Path]:
    """A run dir after 4 updates (a previous, complete state), and checkpoints of 4 and
    10 updates for generation and export."""
    from nmt.cli import main

    run = tmp_path_factory.mktemp("battery-run") / "run"
    main("train", run_args(demo_data_dir, run, max_update=4))
    early = run.parent / "early.pt"
    shutil.copy2(run / "checkpoint_last.pt", early)
    after_four = run.parent / "after-four"
    shutil.copytree(run, after_four)
    main("train", run_args(demo_data_dir, run, max_update=10))
    return {"run": after_four, "early": early, "late": run / "checkpoint_last.pt"}


TRAIN_UPDATES = 40  # from 4: enough updates (and saves) for kills in the middle of training


def checkpoints_whole(case: Case) -> str | None:
    """After a killed training run: every checkpoint loads (checksums verified), the last
    one is at or past the previous run's, the files the run did not replace are
    byte-identical, and train.jsonl begins with the previous log."""
    before = snapshot(case.previous)
    assert isinstance(before, dict)
    after = snapshot(case.output)
    if not isinstance(after, dict):
        return "the run dir is gone"
    for name in after:
        if name.endswith(".pt"):
            try:
                load_checkpoint(case.output / name)
            except Exception as exc:  # noqa: BLE001 - any failure to load is the finding
                return f"{name} does not load: {exc}"
    if saved_update(case.output) < saved_update(case.previous):
        return "checkpoint_last.pt went back"
    replaced = {"checkpoint_last.pt", "checkpoint_best.pt", "config.yaml", "train.jsonl"}
    changed = [n for n in before if n in after and n not in replaced and after[n] != before[n]]
    if changed:
        return f"rewritten in place: {changed}"
    if not after.get("train.jsonl", b"").startswith(before["train.jsonl"]):
        return "train.jsonl lost its previous lines"
    return None


def train_rerun_equals_reference(case: Case) -> str | None:
    if saved_update(case.output) != TRAIN_UPDATES:
        return f"the re-run stopped at update {saved_update(case.output)}"
    assert_bitwise_equal(last_params(case.output), last_params(case.reference))
    return None


def train_case(tmp: Path, trained: dict[str, Path], data: Path) -> Case:
    run = tmp / "run"
    case = measured_case(
        tmp, "train", run_args(data, run, max_update=TRAIN_UPDATES), run, trained["run"]
    )
    case.check_killed = checkpoints_whole
    case.check_rerun = train_rerun_equals_reference
    return case


def generate_case(tmp: Path, trained: dict[str, Path]) -> Case:
    from nmt.cli import main

    source = tmp / "test.en"
    source.write_text(
        "\n".join((DEMO / "test.en").read_text(encoding="utf-8").splitlines()[:300]) + "\n",
        encoding="utf-8",
    )
    common = [f"checkpoint={trained['late']}", f"input={source}", "threads=1", "progress=false"]
    common += ["max_len_a=1.5", "max_len_b=5"]  # the barely trained model's outputs stay short
    previous = tmp / "previous.de"  # greedy translations: other bytes
    main("generate", [*common, f"output={previous}", "beam=1"])
    out = tmp / "test.hyp.de"
    return measured_case(tmp, "generate", [*common, f"output={out}", "beam=4"], out, previous)


def export_case(tmp: Path, trained: dict[str, Path]) -> Case:
    from nmt.cli import main

    previous = tmp / "previous-ct2"  # the 4-update checkpoint's export: other bytes
    main("export", [f"checkpoint={trained['early']}", f"output_dir={previous}"])
    out = tmp / "ct2"
    args = [f"checkpoint={trained['late']}", f"output_dir={out}", "overwrite=true"]
    return measured_case(tmp, "export", args, out, previous)


# ------------------------------------------------------------------ the trials


def trial(case: Case, index: int) -> tuple[str, str | None]:
    """One kill and one re-run; returns (what happened, the failure or None)."""
    from nmt.cli import main

    rng = random.Random(f"{SEED}-{case.command}-{index}")
    previous, reference = snapshot(case.previous), snapshot(case.reference)
    for _ in range(3):
        restore(case.previous, case.output)
        killed = run_and_kill(case.argv, rng.uniform(0.0, case.duration_s))
        if not killed.exited_before:
            break
        # It finished before its kill time: the machine is less busy than when the
        # duration was measured. Measure it again (this run's) and draw anew.
        case.duration_s = killed.at_s
    left = temporaries(case.output.parent)
    found = snapshot(case.output)
    if case.command == "train":
        where = f"at update {saved_update(case.output)}"
    else:
        where = "old" if found == previous else "new" if found == reference else "MIXED"
    note = f"kill at {killed.at_s:5.2f}s: output {where}, {len(left)} temporaries"
    if killed.exited_before:
        note += " (had finished)"
    if killed.survivors:
        return note, f"processes alive {GRACE_S:.0f}s after the kill: {killed.survivors}"
    failure = (
        case.check_killed(case) if case.check_killed else (None if where != "MIXED" else "mixed")
    )
    if failure:
        return note, f"after the kill: {failure}"
    try:
        main(case.command, case.args)
    except SystemExit as exc:
        if exc.code:
            return note, f"the re-run failed (exit {exc.code})"
    if case.check_rerun:
        failure = case.check_rerun(case)
    elif snapshot(case.output) != reference:
        failure = "the re-run's output differs from an uninterrupted run's"
    if failure:
        return note, failure
    if left_after := temporaries(case.output.parent):
        return note, f"temporaries left after the re-run: {left_after}"
    return note, None


def run_battery(case: Case) -> None:
    print(f"\nnmt-{case.command}: uninterrupted run {case.duration_s:.2f}s")
    failures = []
    for i in range(TRIALS):
        note, failure = trial(case, i)
        print(f"  trial {i:2d}: {note}: {failure or 'ok'}", flush=True)
        if failure:
            failures.append(f"trial {i}: {note}: {failure}")
    print(f"nmt-{case.command}: {TRIALS - len(failures)} of {TRIALS} trials passed")
    assert not failures, "\n".join(failures)


def test_kill_9_nmt_preprocess(tmp_path):
    run_battery(preprocess_case(tmp_path))


def test_kill_9_nmt_train(tmp_path, trained, demo_data_dir):
    run_battery(train_case(tmp_path, trained, demo_data_dir))


def test_kill_9_nmt_generate(tmp_path, trained):
    run_battery(generate_case(tmp_path, trained))


def test_kill_9_nmt_export(tmp_path, trained):
    pytest.importorskip("ctranslate2")
    run_battery(export_case(tmp_path, trained))
