"""nmt-preprocess: parallel text -> data dir (nmt.data.build_data_dir), with a summary."""

from __future__ import annotations

from nmt.data import build_data_dir
from nmt.data.config import PreprocessConfig
from nmt.processes import sigterm_raises

PROG = "nmt-preprocess"


def _say(message: str) -> None:
    print(f"{PROG}: {message}", flush=True)


def run(cfg: PreprocessConfig) -> int:
    with sigterm_raises():  # SIGTERM cleans up as Ctrl-C does: workers stopped, temporary removed
        report = build_data_dir(cfg, progress=True, log=_say)
    for line in report.lines():
        print(line if line.startswith(" ") else f"{PROG}: {line}")
    return 0
