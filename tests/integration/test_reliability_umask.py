"""Issue 17, item 11 (permissions): every file and directory any command writes gets the
permissions the user's umask allows (0666 & ~umask, 0777 & ~umask), as `open()` and
`mkdir` give them, never a fixed 0600/0700.

The whole pipeline runs through the console scripts, each started with the umask set in
the child (`preexec_fn`), under 022 and 027: the data dir and its files, checkpoints
(numbered, last, best, averaged), train.jsonl, config.yaml, tensorboard/, translations,
a score report and a CTranslate2 export. nmt-import-fairseq writes through the same
`save_checkpoint` as nmt-average; nmt-serve writes nothing.
"""

from __future__ import annotations

import importlib.util
import os
import stat
import subprocess
import sys
from pathlib import Path

from helpers import small_preprocess_args
from test_reliability_input import train_args

from nmt.training.run_dir import LOCK_FILE

BIN = Path(sys.executable).parent
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "NMT_DEBUG": ""}


def _pipeline(corpus: Path, out: Path, mask: int) -> None:
    def nmt(command: str, *args: str) -> None:
        proc = subprocess.run(
            [str(BIN / f"nmt-{command}"), *args],
            capture_output=True,
            text=True,
            env=ENV,
            preexec_fn=lambda: os.umask(mask),
            timeout=600,
        )
        assert proc.returncode == 0, (command, proc.stderr[-2000:])

    data, run = out / "data", out / "run"
    nmt("preprocess", *small_preprocess_args(corpus, data, "workers=2"))  # workers run too
    nmt(
        "train",
        *train_args(
            data,
            run,
            "max_update=2",
            "checkpoint.save_interval_updates=1",
            "logging.tensorboard=true",
        ),
        "train_split=train",
        "validation.split=valid",
    )
    nmt("average", f"inputs={run}", "num_last=2")
    nmt(
        "generate",
        f"checkpoint={run / 'checkpoint_best.pt'}",
        f"input={corpus / 'test.en'}",
        f"output={out / 'hyp' / 'test.de'}",  # a folder that generate creates
        "beam=1",
        "max_len_b=3",
        "threads=1",
        "progress=false",
    )
    nmt("score", f"hyp={out / 'hyp' / 'test.de'}", f"refs={corpus / 'test.de'}",
        f"output={out / 'score.json'}", "format=json")  # fmt: skip
    if importlib.util.find_spec("ctranslate2") is not None:
        nmt("export", f"checkpoint={run / 'checkpoint_last.pt'}", f"output_dir={out / 'ct2'}")


def test_every_output_follows_the_umask(small_corpus: Path, tmp_path: Path) -> None:
    for mask in (0o022, 0o027):
        out = tmp_path / f"umask{mask:03o}"
        _pipeline(small_corpus, out, mask)
        entries = [out, *sorted(out.rglob("*"))]
        names = {p.name for p in entries}
        expected = {"meta.json", "spm.model", "train.en.bin", "checkpoint_last.pt", "hyp"}
        expected |= {"checkpoint_best.pt", "checkpoint_avg_last2.pt", "train.jsonl", "score.json"}
        assert expected <= names and any(n.startswith("events.out.tfevents") for n in names)
        wrong = []
        for path in entries:
            mode = stat.S_IMODE(path.lstat().st_mode)
            want = (0o777 if path.is_dir() else 0o666) & ~mask
            if mode != want:
                wrong.append(f"{path.relative_to(tmp_path)}: {mode:o}, not {want:o}")
        assert not wrong, wrong
        # no temporaries, no destination locks (the run dir keeps its own lock file)
        assert not [p for p in entries if p.name.startswith(".") and p.name != LOCK_FILE]
