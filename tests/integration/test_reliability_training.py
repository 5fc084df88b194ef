"""Reliability (issue 17), training: checkpoints, the run dir and the identity of a data dir.

Each case is reproduced the way a user meets it: `cp` over a checkpoint, two real nmt-train
processes on one save_dir (and a torchrun job), kill -9, a real file size limit
(RLIMIT_FSIZE) and a real full file system (a small tmpfs), a swapped SentencePiece model,
an edited meta.json, a truncated index. Every refusal is one `nmt-train: error:` line.
"""

from __future__ import annotations

import json
import os
import resource
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from test_reliability_input import one_line_error, train_args

from nmt.checkpoint import load_checkpoint
from nmt.data import build_data_dir
from nmt.training.run_dir import LOCK_FILE

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NMT_DEBUG": ""}


def events(save_dir: Path, kind: str) -> list[dict]:
    lines = (save_dir / "train.jsonl").read_text(encoding="utf-8").splitlines()
    return [e for e in map(json.loads, lines) if e["type"] == kind]


def num_updates(path: Path) -> int:
    return load_checkpoint(path)["train_state"]["num_updates"]


def console(*argv: str, timeout: float = 300, **kwargs) -> subprocess.CompletedProcess:
    """Run an nmt-* console script to its end."""
    return subprocess.run(
        [str(BIN / argv[0]), *argv[1:]],
        capture_output=True,
        text=True,
        env=ENV,
        timeout=timeout,
        **kwargs,
    )


# ------------------------------------------------------------------ 2: independent names


def test_checkpoint_names_are_independent_files(nmt_cli, demo_data_dir, tmp_path):
    """`cp checkpoint_1_1.pt checkpoint_last.pt` (in place: cp truncates and rewrites the
    target) and an in-place write leave checkpoint_best.pt as it was."""
    run = tmp_path / "run"
    args = train_args(
        demo_data_dir,
        run,
        "max_update=3",
        "checkpoint.save_interval_updates=1",
        "validation.split=test",
    )
    code, _, err = nmt_cli(
        "train", *args, "validation.interval_updates=1", "checkpoint.keep_best=2"
    )
    assert code == 0, err
    names = sorted(p.name for p in run.glob("*.pt"))
    assert {"checkpoint_last.pt", "checkpoint_best.pt", "checkpoint_1_3.pt"} <= set(names)
    for name in names:
        st = os.lstat(run / name)
        assert not os.path.islink(run / name) and st.st_nlink == 1, name
    best = (run / "checkpoint_best.pt").read_bytes()
    others = {n: (run / n).read_bytes() for n in names if n != "checkpoint_last.pt"}
    subprocess.run(
        ["cp", str(run / "checkpoint_1_1.pt"), str(run / "checkpoint_last.pt")], check=True
    )
    assert num_updates(run / "checkpoint_last.pt") == 1
    with open(run / "checkpoint_last.pt", "r+b") as f:  # an in-place write of another kind
        f.seek(100)
        f.write(b"\0" * 64)
    assert (run / "checkpoint_best.pt").read_bytes() == best
    assert {n: (run / n).read_bytes() for n in others} == others
    assert num_updates(run / "checkpoint_best.pt") >= 1


# ------------------------------------------------------------------ 3: one run per save_dir


def start_holder(data: Path, save_dir: Path) -> subprocess.Popen:
    """A real nmt-train that trains for a long time; returns once it holds the lock and has
    logged its start."""
    proc = subprocess.Popen(
        [str(BIN / "nmt-train"), *train_args(data, save_dir, "max_update=1000000")],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        env=ENV,
    )
    deadline = time.monotonic() + 120
    log = save_dir / "train.jsonl"
    while time.monotonic() < deadline:
        assert proc.poll() is None, proc.communicate()[1]
        if log.exists() and '"start"' in log.read_text(encoding="utf-8"):
            return proc
        time.sleep(0.05)
    proc.kill()
    raise AssertionError("the first nmt-train did not start within 120 s")


def test_a_second_run_on_a_save_dir_is_refused_and_a_killed_one_needs_no_unlock(
    nmt_cli, demo_data_dir, tmp_path
):
    run = tmp_path / "run"
    first = start_holder(demo_data_dir, run)
    try:
        # what the first run has in flight: a temporary checkpoint and its log
        in_flight = run / ".checkpoint_last.pt.a1b2c3d4.tmp"
        in_flight.write_bytes(b"half a checkpoint")
        log_before = (run / "train.jsonl").read_bytes()
        second = console("nmt-train", *train_args(demo_data_dir, run, "max_update=2"))
        line = one_line_error(
            second.returncode,
            second.stderr,
            "train",
            f"save_dir={run}: in use by another process",
            f"pid {first.pid} on host {socket.gethostname()}",
        )
        assert second.returncode == 2, line
        assert in_flight.read_bytes() == b"half a checkpoint"  # not deleted as stale
        assert (run / "train.jsonl").read_bytes().startswith(log_before)  # no line appended
        assert first.poll() is None  # the first run goes on
    finally:
        first.kill()
        first.communicate(timeout=30)
    # kill -9 released the lock: the same command starts (or resumes) without any unlock
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "max_update=1"))
    assert code == 0, err
    assert not in_flight.exists()  # now it is stale: removed by the next run
    assert (run / LOCK_FILE).exists() and len(events(run, "start")) == 2


@pytest.mark.slow  # a torchrun job: tens of seconds of process start-up on a busy machine
def test_torchrun_ranks_all_stop_when_the_save_dir_is_locked(demo_data_dir, tmp_path):
    """Only rank 0 takes the lock; when it is refused, every rank stops at once, with the
    refusal, instead of rank 1 waiting for rank 0 in the first collective."""
    run = tmp_path / "run"
    first = start_holder(demo_data_dir, run)
    try:
        torchrun = [sys.executable, "-m", "torch.distributed.run", "--standalone"]
        job = subprocess.run(
            [
                *torchrun,
                "--nproc_per_node=2",
                "--no-python",
                str(BIN / "nmt-train"),
                *train_args(demo_data_dir, run, "max_update=2", "distributed.timeout=60"),
            ],
            capture_output=True,
            text=True,
            env=ENV,
            timeout=240,
        )
        assert job.returncode != 0
        refusals = [ln for ln in job.stderr.splitlines() if "in use by another process" in ln]
        # rank 0's refusal (rank 1 prints the same, unless torchrun stopped it first)
        assert refusals and all(f"pid {first.pid} on host" in ln for ln in refusals), job.stderr
        assert "lost contact" not in job.stderr and "timed out" not in job.stderr
        assert len(events(run, "start")) == 1 and first.poll() is None
    finally:
        first.kill()
        first.communicate(timeout=30)


# ------------------------------------------------------------------ 5: where save_dir may be


def test_save_dir_in_the_data_dir_is_refused(nmt_cli, preprocess_config, tmp_path):
    data = tmp_path / "data"
    build_data_dir(preprocess_config(f"data.dest={data}"))
    before = {p.name: p.read_bytes() for p in data.iterdir()}
    (tmp_path / "link").symlink_to(data)
    for save_dir in (
        data,
        data / "run",
        tmp_path / "other" / ".." / "data" / "run",
        tmp_path / "link" / "run",
    ):
        code, _, err = nmt_cli("train", *train_args(data, save_dir))
        one_line_error(code, err, "train", f"save_dir={save_dir}", "data dir", "outside it")
        assert {p.name: p.read_bytes() for p in data.iterdir()} == before  # nothing written
    # the other way round is the demo's layout (scripts/demo.sh): a data dir inside the run
    # dir is fine, nmt-train writes only its own names
    inside = tmp_path / "runs" / "demo"
    shutil.copytree(data, inside / "data-bin")
    code, _, err = nmt_cli("train", *train_args(inside / "data-bin", inside))
    assert code == 0, err
    assert (inside / "data-bin" / "config.yaml").read_bytes() == before["config.yaml"]


# ------------------------------------------------------------------ 9: a real full disk


@pytest.fixture(scope="module")
def two_updates(demo_data_dir, tmp_path_factory) -> Path:
    """A run dir with checkpoint_last.pt at update 2 (and checkpoint_1_2.pt: the max_update
    stop's final weights)."""
    from nmt.cli import main

    run = tmp_path_factory.mktemp("full-disk") / "run"
    main("train", train_args(demo_data_dir, run, "max_update=2"))
    return run


def assert_full_disk_refused(code: int, stderr: str, run: Path, before: bytes, why: str):
    line = one_line_error(
        code,
        stderr.strip().splitlines()[-1] + "\n",
        "train",
        f"{run / 'checkpoint_last.pt'}: could not write checkpoint ({why})",
        "the previous checkpoint is intact",
    )
    assert code == 2, line
    assert "Traceback" not in stderr and "inline_container" not in stderr
    assert stderr.count("error:") == 1
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert num_updates(run / "checkpoint_last.pt") == 2
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []


def test_a_file_size_limit_during_a_save_is_one_line(demo_data_dir, two_updates, tmp_path):
    """RLIMIT_FSIZE set in the child, as `ulimit -f` does: the write fails with EFBIG
    (Python ignores SIGXFSZ, which would otherwise kill the process)."""
    run = tmp_path / "run"
    shutil.copytree(two_updates, run)
    before = (run / "checkpoint_last.pt").read_bytes()
    limit = len(before) // 2

    def limit_file_size() -> None:
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))

    proc = console(
        "nmt-train", *train_args(demo_data_dir, run, "max_update=4"), preexec_fn=limit_file_size
    )
    assert_full_disk_refused(proc.returncode, proc.stderr, run, before, "File too large")
    assert "ulimit -f" in proc.stderr


@pytest.fixture
def small_tmpfs(tmp_path):
    """Mount a tmpfs of a given size (needs root, or CAP_SYS_ADMIN); skip where that fails."""
    mounted: list[Path] = []

    def mount(size: int) -> Path:
        point = tmp_path / "tmpfs"
        point.mkdir()
        proc = subprocess.run(
            ["mount", "-t", "tmpfs", "-o", f"size={size}", "tmpfs", str(point)],
            capture_output=True,
            text=True,
        )
        if proc.returncode != 0:
            pytest.skip(
                f"cannot mount a tmpfs here ({proc.stderr.strip()}); RLIMIT_FSIZE covers it"
            )
        mounted.append(point)
        return point

    yield mount
    for point in mounted:
        subprocess.run(["umount", "-l", str(point)], check=False)


def test_a_full_file_system_during_a_save_is_one_line(
    nmt_cli, demo_data_dir, two_updates, small_tmpfs
):
    """save_dir on a tmpfs with room for the run dir and half a checkpoint more: the next
    save's temporary file fills it (ENOSPC mid-write)."""
    size = os.path.getsize(two_updates / "checkpoint_last.pt")
    run_dir_bytes = sum(p.stat().st_size for p in two_updates.iterdir())
    run = small_tmpfs(run_dir_bytes + size // 2 + 64 * 1024) / "run"
    shutil.copytree(two_updates, run)
    before = (run / "checkpoint_last.pt").read_bytes()
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "max_update=4"))
    assert_full_disk_refused(code, err, run, before, "No space left on device")
    assert "free space on its device" in err


# ------------------------------------------------------------------ 4, 6: data identity


def rebuild(preprocess_config, dest: Path, *overrides: str) -> Path:
    build_data_dir(preprocess_config(f"data.dest={dest}", *overrides))
    return dest


def test_a_swapped_sentencepiece_model_is_refused_at_start(nmt_cli, preprocess_config, tmp_path):
    data = rebuild(preprocess_config, tmp_path / "a")
    other = rebuild(preprocess_config, tmp_path / "b", "spm.model_type=unigram")  # same size
    shutil.copyfile(other / "spm.model", data / "spm.model")
    code, _, err = nmt_cli("train", *train_args(data, tmp_path / "run"))
    one_line_error(
        code,
        err,
        "train",
        f"{data / 'spm.model'}: differs from the model",
        "sha256",
        "resume.reset_data_check=true",
    )
    assert not (tmp_path / "run").exists()  # nothing written, not even the save_dir
    code, _, err = nmt_cli(
        "train", *train_args(data, tmp_path / "run", "resume.reset_data_check=true")
    )
    assert code == 0, err
    assert "going on as resume.reset_data_check=true asks" in err


def test_resuming_on_other_data_is_refused_unless_asked(
    nmt_cli, preprocess_config, small_corpus, tmp_path
):
    """Same vocabulary (the first data dir's SentencePiece model, reused) and size: only the
    corpus, or the direction, differs."""
    first = rebuild(preprocess_config, tmp_path / "a")
    reused = f"spm.model={first / 'spm.model'}"
    half = tmp_path / "half"
    half.mkdir()
    for name in ("train.en", "train.de"):
        lines = (small_corpus / name).read_text(encoding="utf-8").splitlines()
        (half / name).write_text("\n".join(lines[:200]) + "\n", encoding="utf-8")
    other_corpus = rebuild(
        preprocess_config, tmp_path / "b", reused, f"data.trainpref={half / 'train'}"
    )
    reverse = rebuild(preprocess_config, tmp_path / "c", reused, "data.src=de", "data.tgt=en")
    moved = tmp_path / "moved"
    shutil.copytree(first, moved)
    run = tmp_path / "run"
    args = ["train_split=train", "validation.split=valid"]
    code, _, err = nmt_cli("train", *train_args(first, run, *args))
    assert code == 0, err
    last = run / "checkpoint_last.pt"
    saved = last.read_bytes()
    code, _, err = nmt_cli("train", *train_args(other_corpus, run, *args, "max_update=2"))
    one_line_error(
        code,
        err,
        "train",
        f"{last}: was trained on other data than {other_corpus}",
        "split train (",
        "resume.reset_data_check=true",
    )
    code, _, err = nmt_cli("train", *train_args(reverse, run, *args, "max_update=2"))
    one_line_error(code, err, "train", "src_lang 'en' in the checkpoint, 'de' here")
    assert last.read_bytes() == saved
    # a copy of the same data dir elsewhere is the same data: it resumes
    code, _, err = nmt_cli("train", *train_args(moved, run, *args, "max_update=2"))
    assert code == 0 and "resumed from" in err, err
    code, _, err = nmt_cli(
        "train",
        *train_args(other_corpus, run, *args, "max_update=3", "resume.reset_data_check=true"),
    )
    assert code == 0, err
    assert (
        "was trained on other data" in err
        and "going on as resume.reset_data_check=true asks" in err
    )
    # the checkpoints now record the new data: resuming on it again needs no option
    assert num_updates(last) == 3
    code, _, err = nmt_cli("train", *train_args(other_corpus, run, *args, "max_update=4"))
    assert code == 0 and "was trained on other data" not in err, err


# ------------------------------------------------------------------ 10: damaged data dirs


@pytest.mark.parametrize("size", [300, 1500])
def test_edited_vocabulary_sizes_in_meta_json_are_one_line(nmt_cli, demo_data_dir, tmp_path, size):
    data = tmp_path / "data"
    shutil.copytree(demo_data_dir, data)
    meta = json.loads((data / "meta.json").read_text(encoding="utf-8"))
    meta["src_vocab_size"] = meta["tgt_vocab_size"] = size
    (data / "meta.json").write_text(json.dumps(meta), encoding="utf-8")
    needles = (f"{data / 'meta.json'}: src_vocab_size is {size}", "has 1000 pieces")
    code, _, err = nmt_cli("train", *train_args(data, tmp_path / "run"))
    one_line_error(code, err, "train", *needles)
    ckpt = tmp_path / "ckpt"
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, ckpt))
    assert code == 0, err
    code, _, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt / 'checkpoint_last.pt'}",
        f"input={data}",
        "split=test",
        "device=cpu",
    )
    one_line_error(code, err, "generate", *needles)


@pytest.mark.parametrize("damage", ["text", "empty", "truncated", "nearly whole"])
def test_a_file_that_is_no_checkpoint_gets_a_whole_sentence(
    nmt_cli, demo_data_dir, tmp_path, damage
):
    run = tmp_path / "run"
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run))
    assert code == 0, err
    data = (run / "checkpoint_last.pt").read_bytes()
    bad = tmp_path / "bad.pt"
    content = {
        "text": b"checkpoint_last.pt\nthis is a text file\n",
        "empty": b"",
        "truncated": data[: len(data) // 2],
        "nearly whole": data[:-10],
    }[damage]
    bad.write_bytes(content)
    reason = {
        "text": "a text file, not a torch file",
        "empty": "the file is empty",
        "truncated": "truncated or corrupted (",
        "nearly whole": "truncated or corrupted (",
    }[damage]
    for command, args in (
        ("generate", [f"checkpoint={bad}", "input=-", "device=cpu"]),
        ("train", train_args(demo_data_dir, tmp_path / "ft", f"resume.finetune_from={bad}")),
    ):
        code, _, err = nmt_cli(command, *args)
        line = one_line_error(code, err, command, f"{bad}: not a readable nmt checkpoint", reason)
        assert line.endswith("(e.g. a numbered checkpoint_<epoch>_<update>.pt)"), line


@pytest.mark.parametrize("file", ["idx", "bin"])
def test_a_truncated_index_or_array_is_blamed_on_itself(nmt_cli, demo_data_dir, tmp_path, file):
    data = tmp_path / "data"
    shutil.copytree(demo_data_dir, data)
    target = data / f"valid.de.{file}"
    keep = os.path.getsize(target) - (8 * 10 if file == "idx" else 2 * 10)  # 10 offsets / ids
    os.truncate(target, keep)
    code, _, err = nmt_cli("train", *train_args(data, tmp_path / "run"))
    other = "bin" if file == "idx" else "idx"
    line = one_line_error(code, err, "train", f"{target}: truncated")
    assert f"valid.de.{other}:" not in line


# ------------------------------------------------------------- 11: validation.split


def test_a_valid_split_the_data_dir_lacks_is_an_error(nmt_cli, demo_data_dir, tmp_path):
    run = tmp_path / "run"
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "validation.split=vaild"))
    one_line_error(
        code,
        err,
        "train",
        "validation.split=vaild: ",
        "has no split vaild",
        "test, train, valid",
        "validation.split=null",
    )
    assert not run.exists()
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "validation.split=null"))
    assert code == 0, err
    assert events(run, "valid") == []
