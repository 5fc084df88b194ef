"""nmt.fsutil's rules for replacing outputs (issue 17): what may be replaced, the lock
beside a destination being built, and the atomic swap of a directory."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import nmt.fsutil
from nmt.errors import NmtError
from nmt.fsutil import (
    OutputKind,
    atomic_directory,
    check_replaceable,
    check_text_output,
    destination_lock,
)

KIND = OutputKind("nmt-thing directory", "thing.json", ("thing.json", "*.bin"))


def test_check_replaceable_allows_only_nothing_an_empty_dir_or_its_own_output(tmp_path: Path):
    target = tmp_path / "out"
    check_replaceable(target, "output_dir", KIND, overwrite=False)  # nothing there
    target.mkdir()
    check_replaceable(target, "output_dir", KIND, overwrite=False)  # empty: filled
    (target / "thing.json").write_text("{}")
    (target / "a.bin").write_bytes(b"\0")
    with pytest.raises(NmtError, match=r"an nmt-thing directory already exists there; .*over"):
        check_replaceable(target, "output_dir", KIND, overwrite=False)
    check_replaceable(target, "output_dir", KIND, overwrite=True)  # its own: replaced
    (target / "sub").mkdir()
    (target / "sub" / "b.bin").write_bytes(b"\0")  # own names, but not where it writes them
    (target / "notes.txt").write_text("mine")
    with pytest.raises(NmtError) as err:
        check_replaceable(target, "output_dir", KIND, overwrite=True)
    assert str(err.value) == (
        f"output_dir={target}: an nmt-thing directory that also holds 2 other entries "
        "(notes.txt, sub/b.bin), which overwrite=true would delete; move them out or choose "
        "another output_dir"
    )


def test_check_replaceable_never_replaces_what_another_command_wrote(tmp_path: Path):
    run = tmp_path / "run"
    (run / "tensorboard").mkdir(parents=True)
    for name in ("checkpoint_last.pt", "checkpoint_best.pt", "train.jsonl"):
        (run / name).write_bytes(b"work")
    with pytest.raises(NmtError) as err:
        check_replaceable(run, "output_dir", KIND, overwrite=True)
    assert str(err.value) == (
        f"output_dir={run}: holds 3 files and 1 folder and is not an nmt-thing directory (no "
        "thing.json); choose another output_dir (overwrite=true only replaces an nmt-thing "
        "directory)"
    )
    (tmp_path / "file").write_text("x")
    with pytest.raises(NmtError, match=r"file: exists and is not a directory; choose another"):
        check_replaceable(tmp_path / "file", "output_dir", KIND, overwrite=True)
    (tmp_path / "link").symlink_to(run)
    with pytest.raises(NmtError, match=r"link: is a symbolic link; give the directory it"):
        check_replaceable(tmp_path / "link", "output_dir", KIND, overwrite=True)


def test_check_text_output_refuses_binary_files(tmp_path: Path):
    text = tmp_path / "hyp.de"
    check_text_output(text, "output", "nmt-x")  # missing
    text.write_text("Ein Satz.\nNoch einer: äöü ß 日本\n", encoding="utf-8")
    check_text_output(text, "output", "nmt-x")
    binary = tmp_path / "checkpoint.pt"
    binary.write_bytes(b"PK\x03\x04\x14\x00\x00\x00" + b"x" * 100)  # a zip, as torch.save's
    with pytest.raises(NmtError) as err:
        check_text_output(binary, "output", "nmt-x")
    assert str(err.value) == (
        f"output={binary}: exists and holds binary data (a checkpoint or model?), not text; "
        "nmt-x writes text and replaces only text files: choose another output"
    )


def test_destination_lock_leaves_no_file_and_admits_one_holder_at_a_time(tmp_path: Path):
    dest = tmp_path / "deep" / "data"
    with destination_lock(dest, "data.dest=x"):
        assert (tmp_path / "deep" / ".data.lock").is_file()
        with pytest.raises(NmtError, match=r"^data.dest=x: in use by another process \(pid"):
            with destination_lock(dest, "data.dest=x"):
                pass
    assert list(tmp_path.iterdir()) == []  # the folder it made is gone with the lock
    with destination_lock(dest, "data.dest=x"):
        dest.mkdir()  # an output: the folders stay
    assert [p.name for p in (tmp_path / "deep").iterdir()] == ["data"]


RACER = textwrap.dedent("""
    import os, sys, time
    from nmt.errors import NmtError
    from nmt.fsutil import exclusive_lock
    lock, marker = sys.argv[1], sys.argv[2]
    held = overlaps = 0
    deadline = time.monotonic() + float(sys.argv[3])
    while time.monotonic() < deadline:
        try:
            with exclusive_lock(lock, "x", remove=True):
                held += 1
                try:
                    os.close(os.open(marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:  # another holder is inside too
                    overlaps += 1
                    continue
                os.unlink(marker)
        except NmtError:
            pass
    print(held, overlaps)
""")


def test_a_removed_lock_file_never_admits_two_holders(tmp_path: Path):
    """Processes racing for a lock whose holders remove its file: a taker that opened the
    file before it was removed must not hold the lock beside the next holder. (Without the
    inode check in exclusive_lock, 4 racers overlap about once in 150 takes here.)"""
    racers = [
        subprocess.Popen(
            [sys.executable, "-c", RACER, str(tmp_path / "l"), str(tmp_path / "m"), "4"],
            stdout=subprocess.PIPE,
            text=True,
        )
        for _ in range(4)
    ]
    results = [tuple(map(int, r.communicate(timeout=120)[0].split())) for r in racers]
    assert sum(held for held, _ in results) > 0
    assert [overlaps for _, overlaps in results] == [0, 0, 0, 0]


def _build(path: Path, content: str) -> None:
    with atomic_directory(path) as tmp:
        (tmp / "f").write_text(content)


@pytest.mark.parametrize("exchange", [True, False])
def test_atomic_directory_replaces_the_old_one_and_leaves_nothing_aside(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
):
    if not exchange:
        # the fallback for file systems without renameat2's RENAME_EXCHANGE: none here
        monkeypatch.setattr(nmt.fsutil, "exchange", lambda a, b: False)
    target = tmp_path / "out"
    _build(target, "old")
    _build(target, "new")
    assert (target / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]


@pytest.mark.parametrize("exchange", [True, False])
def test_ctrl_c_during_the_swap_waits_until_the_new_directory_is_in_place(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, exchange: bool
):
    """With the two-rename fallback, a Ctrl-C between the renames used to leave no `out`
    at all (the old one aside, the new one deleted); it now comes after the swap."""
    target = tmp_path / "out"
    _build(target, "old")
    if not exchange:
        monkeypatch.setattr(nmt.fsutil, "exchange", lambda a, b: False)  # as above
    rename, fsync_dir = os.rename, nmt.fsutil.fsync_dir

    def rename_then_ctrl_c(src, dst):  # Ctrl-C right after the old one is moved aside
        rename(src, dst)
        if Path(src) == target:
            signal.raise_signal(signal.SIGINT)

    def fsync_then_ctrl_c(path):  # Ctrl-C right after the swap
        fsync_dir(path)
        if Path(path) == tmp_path:
            signal.raise_signal(signal.SIGINT)

    monkeypatch.setattr(os, "rename", rename_then_ctrl_c)
    monkeypatch.setattr(nmt.fsutil, "fsync_dir", fsync_then_ctrl_c)
    with pytest.raises(KeyboardInterrupt):
        _build(target, "new")
    assert (target / "f").read_text() == "new"
    assert [p.name for p in tmp_path.iterdir()] == ["out"]
