"""nmt-preprocess: parallel text -> data dir (nmt.data.build_data_dir), with a summary."""

from __future__ import annotations

from nmt.data import build_data_dir
from nmt.data.config import PreprocessConfig

PROG = "nmt-preprocess"


def _say(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def run(cfg: PreprocessConfig) -> int:
    report = build_data_dir(cfg, progress=True, log=_say)
    for line in report.lines():
        print(line if line.startswith(" ") else f"{PROG}: {line}")
    return 0
