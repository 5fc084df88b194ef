"""nmt.fsutil: the one durability rule (temp name, fsync, rename, fsync of the directory)."""

from __future__ import annotations

import os
import stat
from pathlib import Path

import pytest

from nmt.fsutil import (
    atomic_directory,
    atomic_write,
    atomic_write_bytes,
    atomic_write_text,
    remove_stale_temps,
    stale_temps,
)


@pytest.fixture
def umask_022():
    old = os.umask(0o022)
    yield
    os.umask(old)


def _mode(path: Path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_atomic_write_replaces_the_file_and_leaves_no_temporary(tmp_path: Path, umask_022):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    atomic_write_text(target, "new\n")
    assert target.read_text() == "new\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]
    atomic_write_bytes(tmp_path / "b.bin", b"\x00\x01")
    assert (tmp_path / "b.bin").read_bytes() == b"\x00\x01"


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path: Path):
    target = tmp_path / "out.txt"
    target.write_text("old\n")
    with pytest.raises(RuntimeError), atomic_write(target) as f:
        f.write("half of the new")
        raise RuntimeError("the writer failed")
    assert target.read_text() == "old\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


@pytest.mark.parametrize(
    "mask, file_mode, dir_mode", [(0o022, 0o644, 0o755), (0o077, 0o600, 0o700)]
)
def test_new_files_and_directories_follow_the_umask(tmp_path: Path, mask, file_mode, dir_mode):
    old = os.umask(mask)
    try:
        atomic_write_text(tmp_path / "f.txt", "x")
        with atomic_directory(tmp_path / "d") as d:
            (d / "inside").write_text("y")
    finally:
        os.umask(old)
    assert _mode(tmp_path / "f.txt") == file_mode
    assert _mode(tmp_path / "d") == dir_mode


def test_atomic_directory_replaces_the_old_one_only_when_complete(tmp_path: Path, umask_022):
    dest = tmp_path / "dir"
    dest.mkdir()
    (dest / "old.txt").write_text("old")
    with pytest.raises(KeyError), atomic_directory(dest) as build:
        (build / "new.txt").write_text("new")
        assert not (dest / "new.txt").exists()  # nothing visible while it is being built
        raise KeyError("failed half way")
    assert sorted(p.name for p in dest.iterdir()) == ["old.txt"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]
    with atomic_directory(dest) as build:
        (build / "sub").mkdir()
        (build / "sub" / "new.txt").write_text("new")
    assert (dest / "sub" / "new.txt").read_text() == "new" and not (dest / "old.txt").exists()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["dir"]


def test_stale_temporaries_are_found_by_the_name_they_belong_to(tmp_path: Path):
    target = tmp_path / "ckpt[1].pt"  # glob characters in the name are taken literally
    (tmp_path / ".ckpt[1].pt.abc123.tmp").write_bytes(b"partial")
    (tmp_path / ".ckpt[1].pt.dir9.tmp").mkdir()
    (tmp_path / ".other.pt.abc.tmp").write_bytes(b"not ours")
    assert [p.name for p in stale_temps(target)] == [
        ".ckpt[1].pt.abc123.tmp",
        ".ckpt[1].pt.dir9.tmp",
    ]
    removed = remove_stale_temps(target)
    assert len(removed) == 2 and stale_temps(target) == []
    assert (tmp_path / ".other.pt.abc.tmp").exists()


def test_exclusive_lock_refuses_a_second_holder_naming_the_first(tmp_path: Path):
    import socket
    import subprocess
    import sys

    from nmt.errors import NmtError
    from nmt.fsutil import exclusive_lock

    lock = tmp_path / ".lock"
    # A real second process holds the lock, then dies by SIGKILL: the OS releases it.
    holder = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, time\n"
            "from nmt.fsutil import exclusive_lock\n"
            "with exclusive_lock(sys.argv[1], 'x'):\n"
            "    print('held', flush=True)\n"
            "    time.sleep(60)\n",
            str(lock),
        ],
        stdout=subprocess.PIPE,
        text=True,
    )
    try:
        assert holder.stdout is not None and holder.stdout.readline() == "held\n"
        with pytest.raises(NmtError) as err:
            with exclusive_lock(lock, "save_dir=runs/x"):
                pass
        message = str(err.value)
        assert message.startswith("save_dir=runs/x: in use by another process")
        assert f"pid {holder.pid} on host {socket.gethostname()}" in message
    finally:
        holder.kill()
        holder.wait()
    with exclusive_lock(lock, "save_dir=runs/x"):  # released by the kernel at the kill
        assert f"pid {os.getpid()}" in lock.read_text()
