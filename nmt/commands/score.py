"""nmt-score: BLEU / chrF / TER of a hypothesis file against reference files, with
sacrebleu signatures, optional sentence scores, bootstrap confidence intervals and a
paired significance test against a baseline system (nmt.scoring.score), as text or JSON
on stdout or in the file `output`."""

from __future__ import annotations

import sys

from nmt.scoring import STDIO, ScoreConfig, score, write_report


def run(cfg: ScoreConfig) -> int:
    report = score(cfg)
    for note in report.notes:
        print(f"nmt-score: warning: {note}", file=sys.stderr)
    write_report(report, cfg.output, cfg.format)
    if cfg.output != STDIO:
        print(f"nmt-score: wrote {cfg.output}", file=sys.stderr)
    return 0
