"""A writer killed with SIGKILL in the middle of nmt.fsutil.atomic_write leaves the old file
whole; its temporary is what remove_stale_temps finds and removes."""

from __future__ import annotations

import subprocess
import sys
import textwrap
from pathlib import Path

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
