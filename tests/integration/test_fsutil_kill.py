"""A writer killed with SIGKILL in the middle of nmt.fsutil.atomic_write leaves the old file
whole; its temporary is what remove_stale_temps finds and removes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
from helpers import kill_9_when

from nmt.fsutil import remove_stale_temps, stale_temps


def test_kill_9_during_an_atomic_write_leaves_the_old_file(tmp_path: Path):
    target = tmp_path / "translations.txt"
    target.write_text("the complete old version\n")
    ready = tmp_path / "ready"
    writer = textwrap.dedent(f"""
        import time
        from pathlib import Path
        from nmt.fsutil import atomic_write
        with atomic_write({str(target)!r}) as f:
            f.write("half of the new version")
            f.flush()
            Path({str(ready)!r}).touch()
            time.sleep(60)
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    kill_9_when(proc, ready.exists, timeout=60)
    assert target.read_text() == "the complete old version\n"
    assert len(stale_temps(target)) == 1
    remove_stale_temps(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ready", "translations.txt"]


@pytest.mark.parametrize("moment", ["before", "after"])
def test_kill_9_while_a_directory_is_replaced_leaves_the_old_or_the_new_one(tmp_path, moment):
    """atomic_directory swaps the old directory with the new one in one step: a SIGKILL
    just before that step leaves the old one, just after it the new one; never no
    directory at all. (Two renames, the old one aside and then the new one in, had a
    window with nothing at the path, the old one under a temporary name that the next
    run's remove_stale_temps deleted.)"""
    target = tmp_path / "data-bin"
    target.mkdir()
    (target / "meta.json").write_text("old")
    ready = tmp_path / "ready"
    # the writer stops just before or just after its first rename (or swap) and is killed
    writer = textwrap.dedent(f"""
        import os, time
        from pathlib import Path
        import nmt.fsutil as fsutil

        def paused(real):
            def step(*args):
                if {moment!r} == "before":
                    Path({str(ready)!r}).touch()
                    time.sleep(60)
                result = real(*args)
                Path({str(ready)!r}).touch()
                time.sleep(60)
                return result
            return step

        os.rename = paused(os.rename)
        if hasattr(fsutil, "exchange"):
            fsutil.exchange = paused(fsutil.exchange)
        with fsutil.atomic_directory({str(target)!r}) as tmp:
            (tmp / "meta.json").write_text("new")
    """)
    proc = subprocess.Popen([sys.executable, "-c", writer])
    kill_9_when(proc, ready.exists, timeout=120)
    assert target.is_dir(), "no directory at the path"
    assert sorted(p.name for p in target.iterdir()) == ["meta.json"]
    assert (target / "meta.json").read_text() == ("old" if moment == "before" else "new")
    assert len(stale_temps(target)) == 1  # the other version, under a temporary name
    remove_stale_temps(target)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["data-bin", "ready"]
