"""Issue 17, item 8 and the data dir lock: nmt-preprocess stopped by kill -9, SIGTERM or
Ctrl-C leaves no process running, and the next run removes what it left; two runs on one
data.dest cannot both proceed.

All with real processes: the console script started in a session of its own, so that its
children can be found in /proc (their session id is its pid) even after it is gone. The
corpus is big enough (benchmarks.make_corpus) to be caught while SentencePiece trains or
while the workers encode.
"""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from helpers import kill_9_when, wait_until

from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NMT_DEBUG": ""}
PAIRS = 20_000


@pytest.fixture(scope="module")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """train.{en,de} of PAIRS synthetic pairs, and spm.model: a model to reuse (so that the
    encoding phase starts at once)."""
    root = tmp_path_factory.mktemp("big")
    subprocess.run(
        [sys.executable, "-m", "benchmarks.make_corpus", "--pairs", str(PAIRS)]
        + ["--out", str(root / "train")],
        check=True,
        capture_output=True,
        cwd=Path(__file__).resolve().parents[2],
    )
    for lang in ("en", "de"):  # a model trained on a slice is as good as any for encoding
        with open(root / f"train.{lang}", encoding="utf-8") as f:
            head = [next(f) for _ in range(2000)]
        (root / f"head.{lang}").write_text("".join(head), encoding="utf-8")
    built = subprocess.run(
        [str(BIN / "nmt-preprocess"), *_args(root, root / "spm-data"), "spm.vocab_size=1000"]
        + [f"data.trainpref={root / 'head'}"],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert built.returncode == 0, built.stderr
    (root / "spm.model").write_bytes((root / "spm-data" / "spm.model").read_bytes())
    return root


def _args(corpus: Path, dest: Path, *extra: str) -> list[str]:
    return [
        f"data.trainpref={corpus / 'train'}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest={dest}",
        "spm.num_threads=1",
        "chunk_lines=500",
        *extra,
    ]


def session_processes(sid: int) -> list[int]:
    """Live (not zombie) processes of session `sid`, from /proc."""
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            stat = Path(f"/proc/{entry}/stat").read_text()
        except OSError:  # gone meanwhile
            continue
        state, _, _, session = stat.rsplit(")", 1)[1].split()[:4]
        if int(session) == sid and state != "Z":
            found.append(int(entry))
    return found


def encoding(proc: subprocess.Popen, folder: Path) -> Callable[[], bool]:
    """Whether its two workers run and the first .bin of the data dir being built exists."""
    return lambda: (
        bool(list(folder.glob(".data.*.tmp/train.en.bin")))
        and len(session_processes(proc.pid)) >= 3
    )


def start(args: list[str]) -> subprocess.Popen:
    return subprocess.Popen(
        [str(BIN / "nmt-preprocess"), *args],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
        start_new_session=True,  # its children keep this session id after it dies
    )


def temporaries(dest: Path) -> list[Path]:
    return sorted(dest.parent.glob(f".{dest.name}.*"))


def assert_no_process_survives(sid: int, within: float = 10.0) -> None:
    deadline = time.monotonic() + within
    while (left := session_processes(sid)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert not left, f"processes of the killed nmt-preprocess still run: {left}"


def data_dir_contents(dest: Path) -> dict[str, object]:
    """The data dir's files; meta.json and config.yaml without the settings that name
    the destination and the worker count (which change nothing else)."""
    out: dict[str, object] = {}
    for path in sorted(dest.iterdir()):
        if path.name == "meta.json":
            meta = json.loads(path.read_text())
            meta.pop("config")
            out[path.name] = meta
        elif path.name != "config.yaml":
            out[path.name] = path.read_bytes()
    return out


# what each phase looks like from outside: (spm option, how to recognise the phase)
PHASES = {
    # SentencePiece trains in one child (on a sample, to keep the test short)
    "tokenizer": lambda corpus: ["spm.input_sentence_size=4000"],
    # a reused model: the workers start encoding at once
    "encoding": lambda corpus: [f"spm.model={corpus / 'spm.model'}"],
}


@pytest.mark.parametrize("phase", sorted(PHASES))
def test_kill_9_of_the_main_process_leaves_no_child_and_the_next_run_cleans_up(
    corpus: Path, tmp_path: Path, phase: str
) -> None:
    dest = tmp_path / "data"
    args = _args(corpus, dest, "workers=2", *PHASES[phase](corpus))
    proc = start(args)
    # tokenizer: SentencePiece trains in its one child; encoding: the two workers run
    ready = (
        (lambda: len(session_processes(proc.pid)) >= 2)
        if phase == "tokenizer"
        else encoding(proc, tmp_path)
    )
    kill_9_when(proc, ready, timeout=240)
    assert_no_process_survives(proc.pid)
    assert not dest.exists()
    assert any(p.name.endswith(".tmp") for p in temporaries(dest))  # what kill -9 leaves

    rerun = subprocess.run(
        [str(BIN / "nmt-preprocess"), *args], capture_output=True, text=True, env=ENV
    )
    assert rerun.returncode == 0, rerun.stderr
    assert "left by an interrupted run" in rerun.stdout
    assert temporaries(dest) == []  # the stale temporary and the lock file are gone
    clean = tmp_path / "clean"
    once = subprocess.run(
        [str(BIN / "nmt-preprocess"), *_args(corpus, clean, "workers=1", *PHASES[phase](corpus))],
        capture_output=True,
        text=True,
        env=ENV,
    )
    assert once.returncode == 0, once.stderr
    assert data_dir_contents(dest) == data_dir_contents(clean)


@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, 143), (signal.SIGINT, 130)])
def test_sigterm_and_ctrl_c_stop_the_workers_and_leave_nothing(
    corpus: Path, tmp_path: Path, signum: int, code: int
) -> None:
    dest = tmp_path / "data"
    proc = start(_args(corpus, dest, "workers=2", f"spm.model={corpus / 'spm.model'}"))
    try:
        wait_until(proc, encoding(proc, tmp_path), timeout=240)
        proc.send_signal(signum)
        _, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == code
    name = "SIGTERM" if signum == signal.SIGTERM else None
    expected = f"nmt-preprocess: terminated by {name}" if name else "nmt-preprocess: interrupted"
    assert err.strip().splitlines() == [expected]
    assert_no_process_survives(proc.pid, within=1.0)  # stopped by the main process itself
    assert not dest.exists() and temporaries(dest) == []


def test_a_second_run_on_the_same_data_dest_is_refused_naming_the_first(
    corpus: Path, tmp_path: Path
) -> None:
    dest = tmp_path / "data"
    args = _args(corpus, dest, "workers=1", f"spm.model={corpus / 'spm.model'}")
    first = start(args)
    try:
        wait_until(first, lambda: bool(list(tmp_path.glob(".data.*.tmp"))), timeout=240)
        first.send_signal(signal.SIGSTOP)  # held mid-build, however fast this machine is
        second = subprocess.run(
            [str(BIN / "nmt-preprocess"), *args], capture_output=True, text=True, env=ENV
        )
        first.send_signal(signal.SIGCONT)
        assert second.returncode == 2
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1, second.stderr
        assert lines[0].startswith(f"nmt-preprocess: error: data.dest={dest}: in use by ")
        assert f"pid {first.pid} on host {socket.gethostname()}" in lines[0]
        _, err = first.communicate(timeout=600)
    finally:
        first.kill()
        first.wait()
    assert first.returncode == 0, err  # the refused run took nothing from the first
    meta = load_meta(dest)
    assert len(TokenArray(dest / "train.en")) == meta.splits["train"].kept > 0
    assert temporaries(dest) == []  # its temporary became the data dir; the lock is gone
