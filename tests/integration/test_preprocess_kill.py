"""nmt-preprocess killed with SIGKILL (no cleanup runs) while replacing a data dir: the old
data dir stays whole, and the next run removes the temporary the killed one left."""

from __future__ import annotations

import pickle
import subprocess
import sys
import textwrap
from pathlib import Path

from helpers import kill_9_when

from nmt.data import build_data_dir
from nmt.data.meta import load_meta
from nmt.fsutil import stale_temps


def test_kill_9_while_replacing_a_data_dir_keeps_the_old_one(preprocess_config, tmp_path: Path):
    build_data_dir(preprocess_config())
    out = tmp_path / "out"
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    cfg = preprocess_config("overwrite=true", "clean.max_ratio=null")
    ready = tmp_path / "ready"
    # everything written but meta.json, then SIGKILL: the worst moment for the old code
    killed = textwrap.dedent(f"""
        import pickle, time
        from pathlib import Path
        import nmt.data.build as build

        def stuck(data_dir, meta):
            Path({str(ready)!r}).touch()
            time.sleep(60)

        build.write_meta = stuck
        build.build_data_dir(pickle.loads({pickle.dumps(cfg)!r}))
    """)
    proc = subprocess.Popen([sys.executable, "-c", killed])
    kill_9_when(proc, ready.exists, timeout=120)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before
    leftover = stale_temps(out)
    assert len(leftover) == 1 and (leftover[0] / "train.de.bin").is_file()

    build_data_dir(cfg)
    assert load_meta(out).config["clean"]["max_ratio"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out", "ready"]
