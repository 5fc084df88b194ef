"""nmt-generate workers=N on the suite's tiny trained model: the output is byte for byte
workers=1's (plain, n-best, fairseq with alignments, sampling, constraints with their
notes); a run killed with kill -9 resumes from its work folder, and one whose worker is
killed fails in one line and resumes too; a work folder of other options is refused.

The comparisons run nmt-generate in-process (nmt.cli.main, its workers are real spawned
processes); the kill -9 cases run it as a real process. Every wait has a deadline and
none depends on the machine's speed: a kill waits for a finished chunk on disk, and the
input has many more chunks than can be done between that and the kill.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from nmt.generation.workfolder import work_folder_path

BIN = Path(sys.executable).parent
DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
BASE = ("device=cpu", "threads=1", "max_len_b=12", "buffer_size=7")

pytestmark = pytest.mark.usefixtures("one_thread")


def demo(n: int, lang: str = "en") -> list[str]:
    return (DEMO / f"train.{lang}").read_text(encoding="utf-8").splitlines()[:n]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def one_line_error(code: int, err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("nmt-generate: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture
def src(tmp_path) -> Path:
    """40 demo lines and an empty one among them: 6 chunks of buffer_size=7."""
    lines = demo(40)
    lines[9] = ""
    return write_lines(tmp_path / "in.en", lines)


def run(nmt_cli, ckpt: Path, *args: str) -> tuple[int, str, str]:
    if not any(a.startswith("beam=") for a in args):
        args = ("beam=2", *args)
    return nmt_cli("generate", f"checkpoint={ckpt}", *BASE, *args)


@pytest.mark.parametrize(
    "options",
    [
        (),
        ("beam=3", "nbest=2"),
        ("format=fairseq", "print_alignment=true", "nbest=2"),
        ("sampling=true", "nbest=2", "temperature=1.5"),
    ],
    ids=["plain", "nbest", "fairseq-alignments", "sampling"],
)
def test_workers_2_writes_the_bytes_of_workers_1(
    nmt_cli, tiny_trained_checkpoint, src, tmp_path, options
):
    code, one, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", *options)
    assert code == 0, err
    out = tmp_path / "out.txt"
    code, _, err = run(
        nmt_cli, tiny_trained_checkpoint, f"input={src}", f"output={out}", "workers=2", *options
    )
    assert code == 0, err
    assert out.read_bytes() == one.encode()  # bytes: a sampled "\r" stays a "\r"
    assert re.search(r"translated 40 sentences .* sentences/s", err), err
    assert not work_folder_path(str(out)).exists()  # removed once the output is complete
    # to stdout too (no work folder: nothing to resume from)
    code, two, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", "workers=2", *options)
    assert code == 0, err
    assert two == one


def test_a_sample_depends_on_the_seed_and_line_not_on_the_chunking_of_others(
    nmt_cli, tiny_trained_checkpoint, src
):
    """Sampling streams are per chunk, seeded from (seed, first line): the first chunk's
    samples are the same whether more lines follow it or not, and another seed differs."""
    sampling = ("sampling=true", "temperature=1.5")
    code, whole, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", *sampling)
    assert code == 0, err
    first = write_lines(src.with_suffix(".head"), demo(7))
    code, head, err = run(nmt_cli, tiny_trained_checkpoint, f"input={first}", *sampling)
    assert code == 0, err
    assert whole.splitlines()[:7] == head.splitlines()
    code, other, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", *sampling, "seed=2")
    assert code == 0, err
    assert other != whole


def test_constraints_and_their_notes_are_those_of_workers_1(
    nmt_cli, tiny_trained_checkpoint, tmp_path
):
    refs = demo(24, "de")
    lines = demo(24)
    lines[5] = ""
    constraints: list[object] = []
    for i, ref in enumerate(refs):
        kinds = [[ref.split()[0]], [], {"exclude": [ref.split()[-1]]}, [" ".join(refs[:4])]]
        constraints.append(["Hund"] if i == 5 else kinds[i % 4])  # [3]: too long to be met
    src = write_lines(tmp_path / "in.en", lines)
    spec = write_lines(tmp_path / "c.jsonl", [json.dumps(c) for c in constraints])
    args = (f"input={src}", f"constraints={spec}", "max_len_b=8")
    code, one, err_one = run(nmt_cli, tiny_trained_checkpoint, *args)
    assert code == 0, err_one
    out = tmp_path / "out.de"
    code, _, err_two = run(nmt_cli, tiny_trained_checkpoint, *args, f"output={out}", "workers=2")
    assert code == 0, err_two
    assert out.read_bytes() == one.encode()

    def notes(err: str) -> list[str]:
        return [line for line in err.splitlines() if line.startswith("nmt-generate: note: line")]

    assert notes(err_one) and notes(err_two) == notes(err_one)
    assert any("line 6: an empty line" in n for n in notes(err_two))


def test_bad_input_is_the_same_one_line_error_before_any_worker_starts(
    nmt_cli, tiny_trained_checkpoint, src, tmp_path, monkeypatch
):
    short = write_lines(tmp_path / "c.jsonl", ["[]"] * 3)
    errors = []
    for workers in ("workers=1", "workers=2"):
        code, _, err = run(
            nmt_cli, tiny_trained_checkpoint, f"input={src}", f"constraints={short}", workers
        )
        errors.append(one_line_error(code, err, str(short), "3 lines"))
    assert errors[0] == errors[1]
    code, _, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", "workers=0")
    one_line_error(code, err, "workers=0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    code, _, err = run(nmt_cli, tiny_trained_checkpoint, f"input={src}", "workers=2")
    one_line_error(code, err, "workers=2", "torchrun")


# ------------------------------------------------------------------ kill -9 and resume


def children(pid: int) -> list[int]:
    """The processes `pid` started (Linux's /proc children list)."""
    text = Path(f"/proc/{pid}/task/{pid}/children").read_text()
    return [int(p) for p in text.split()]


def is_worker(pid: int) -> bool:
    """A spawned worker, not multiprocessing's resource tracker."""
    try:
        return b"spawn_main" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


def gone(pids: list[int], timeout: float = 60) -> bool:
    deadline = time.monotonic() + timeout
    while any(Path(f"/proc/{p}").exists() for p in pids):
        if time.monotonic() > deadline:
            return False
        time.sleep(0.05)
    return True


def start_and_wait_for_a_chunk(args: list[str], parts: Path, stderr) -> subprocess.Popen:
    """nmt-generate started as a real process, once its work folder holds a finished
    chunk of its own (and the run is still going: it has many more)."""
    started = time.time()
    proc = subprocess.Popen(args, stderr=stderr)
    deadline = time.monotonic() + 300
    while not any(mtime >= started for mtime in chunk_times(parts)):
        assert proc.poll() is None, "nmt-generate ended before it was killed"
        assert time.monotonic() < deadline, "no chunk finished within 300 s"
        time.sleep(0.01)
    assert proc.poll() is None
    return proc


def chunk_times(parts: Path) -> list[float]:
    """The modification times of the finished chunks in `parts`."""
    try:
        return [chunk.stat().st_mtime for chunk in parts.glob("chunk-*.json")]
    except OSError:  # the folder is being replaced
        return []


@pytest.fixture
def big(tmp_path) -> Path:
    """600 lines: 86 chunks of 7, many more than a run finishes in the moment it is
    killed."""
    return write_lines(tmp_path / "big.en", demo(600))


def command(ckpt: Path, src: Path, out: Path, beam: int = 2) -> list[str]:
    """The options of a resumable run (without the program: for nmt_cli)."""
    args = [f"checkpoint={ckpt}", "device=cpu", "threads=1", "buffer_size=7", f"beam={beam}"]
    return [*args, f"input={src}", f"output={out}", "workers=2", "max_len_b=20"]


def workers_1(nmt_cli, ckpt: Path, src: Path) -> str:
    """What workers=1 prints for `src` with the options of `command`."""
    code, out, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        "device=cpu",
        "threads=1",
        "buffer_size=7",
        "beam=2",
        f"input={src}",
        "max_len_b=20",
    )
    assert code == 0, err
    return out


def test_a_killed_run_resumes_and_a_stale_work_folder_is_refused(
    nmt_cli, tiny_trained_checkpoint, big, tmp_path
):
    out = tmp_path / "out.de"
    parts = work_folder_path(str(out))
    options = command(tiny_trained_checkpoint, big, out)
    args = [str(BIN / "nmt-generate"), *options]
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = start_and_wait_for_a_chunk(args, parts, stderr)
        workers = [p for p in children(proc.pid) if is_worker(p)]
        assert len(workers) == 2
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    assert gone(workers), "the workers outlived their killed parent"
    assert not out.exists()
    kept = len(list(parts.glob("chunk-*.json")))
    assert 1 <= kept < 86

    # other options, or another checkpoint, never mix with the chunks kept
    code, _, err = nmt_cli("generate", *command(tiny_trained_checkpoint, big, out, beam=3))
    one_line_error(code, err, f"output={out}", "beam=2, not beam=3", "resume=false")
    os.utime(tiny_trained_checkpoint)  # as a checkpoint written again
    code, _, err = nmt_cli("generate", *options)
    one_line_error(code, err, "checkpoint=", "resume=false")
    assert len(list(parts.glob("chunk-*.json"))) == kept
    # ... so start over with resume=false, killed again once a chunk is done
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = start_and_wait_for_a_chunk([*args, "resume=false"], parts, stderr)
        proc.send_signal(signal.SIGKILL)
        assert proc.wait(timeout=60) == -signal.SIGKILL
    kept = len(list(parts.glob("chunk-*.json")))

    rerun = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert f"{kept} finished chunk(s) reused" in rerun.stderr
    assert not parts.exists()
    expected = workers_1(nmt_cli, tiny_trained_checkpoint, big)
    assert out.read_bytes() == expected.encode()
    assert len(expected.splitlines()) == 600


def test_a_killed_worker_is_a_one_line_error_and_the_rerun_completes(
    nmt_cli, tiny_trained_checkpoint, big, tmp_path
):
    out = tmp_path / "out.de"
    parts = work_folder_path(str(out))
    options = command(tiny_trained_checkpoint, big, out)
    args = [str(BIN / "nmt-generate"), *options]
    with open(tmp_path / "stderr", "wb") as stderr:
        proc = start_and_wait_for_a_chunk(args, parts, stderr)
        workers = [p for p in children(proc.pid) if is_worker(p)]
        os.kill(workers[0], signal.SIGKILL)
        code = proc.wait(timeout=120)
    err = (tmp_path / "stderr").read_text(encoding="utf-8")
    one_line_error(code, err, "died (killed by SIGKILL", "chunk of lines", str(parts))
    assert gone(workers)
    assert parts.is_dir() and not out.exists()

    rerun = subprocess.run(args, capture_output=True, text=True, timeout=600)
    assert rerun.returncode == 0, rerun.stderr
    assert "finished chunk(s) reused" in rerun.stderr
    expected = workers_1(nmt_cli, tiny_trained_checkpoint, big)
    assert out.read_bytes() == expected.encode()
