"""Reliability case 34: no command writes outside the paths its config names, and a path
is only ever a path (never run through a shell or evaluated).

The whole pipeline runs as a user would run it (the console scripts, in subprocesses) from
an empty working directory, with HOME and TMPDIR pointing at empty directories of their
own. Afterwards every file that exists must lie under a path named on a command line.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

from helpers import small_preprocess_args

BIN = Path(sys.executable).parent
# A path with shell syntax in it: taken literally, it must create a directory of that
# name and nothing else (no file called PWNED anywhere).
ODD_NAME = "run $(touch PWNED); `touch PWNED2` $HOME"


def _files(root: Path) -> set[Path]:
    return {p for p in root.rglob("*") if p.is_file() or p.is_symlink()}


def test_the_pipeline_writes_only_where_it_is_told(small_corpus, tmp_path):
    cwd, home, tmp = tmp_path / "cwd", tmp_path / "home", tmp_path / "tmp"
    for d in (cwd, home, tmp):
        d.mkdir()
    out = tmp_path / "out"
    data, run_dir = out / "data", out / ODD_NAME
    hyp = out / "hyp.de"
    env = {
        **os.environ,
        "HOME": str(home),
        "TMPDIR": str(tmp),
        "XDG_CACHE_HOME": str(home / ".cache"),
        "OMP_NUM_THREADS": "1",
    }

    def nmt(command: str, *args: str) -> None:
        proc = subprocess.run(
            [str(BIN / f"nmt-{command}"), *args],
            cwd=cwd,
            env=env,
            capture_output=True,
            text=True,
            timeout=300,
        )
        assert proc.returncode == 0, proc.stderr[-2000:]

    corpus = small_corpus
    inputs_before = _files(corpus)
    nmt("preprocess", *small_preprocess_args(corpus, data))
    nmt(
        "train",
        f"data={data}",
        f"save_dir='{run_dir}'",
        "max_update=2",
        "threads=1",
        "device=cpu",
        "max_tokens=500",
        "logging.progress_bar=false",
        "model.embed_dim=16",
        "model.ffn_dim=32",
        "model.attention_heads=2",
        "model.encoder_layers=1",
        "model.decoder_layers=1",
    )
    nmt(
        "generate",
        f"checkpoint='{run_dir / 'checkpoint_last.pt'}'",
        f"input={corpus / 'test.en'}",
        f"output={hyp}",
        "beam=2",
        "max_len_b=5",
        "threads=1",
        "device=cpu",
        "progress=false",
    )
    nmt("score", f"hyp={hyp}", f"refs=[{corpus / 'test.de'}]", "format=json")  # to stdout
    named = [data, run_dir, hyp]
    if importlib.util.find_spec("ctranslate2") is not None:
        ct2 = out / "ct2"
        nmt("export", f"checkpoint='{run_dir / 'checkpoint_last.pt'}'", f"output_dir={ct2}")
        named.append(ct2)

    assert run_dir.is_dir() and (run_dir / "checkpoint_last.pt").is_file()
    assert not _files(cwd), "written into the working directory"
    assert not _files(home), "written into HOME"
    assert not _files(tmp), "temporary files left behind"
    assert _files(corpus) == inputs_before, "the input corpus folder changed"
    stray = [p for p in _files(out) if not any(p == n or n in p.parents for n in named)]
    assert not stray, stray
    assert not list(tmp_path.rglob("PWNED*")), "a path was run through a shell"
