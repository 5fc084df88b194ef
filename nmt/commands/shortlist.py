"""nmt-shortlist: a data dir's parallel training data -> a target-vocabulary shortlist file
(a CTranslate2 vocabulary map) for `nmt-generate shortlist=` and `nmt-export vmap=`; the
work is nmt.data.lexical.build_shortlist."""

from __future__ import annotations

import sys

from nmt.data.config import ShortlistConfig


def run(cfg: ShortlistConfig) -> int:
    from nmt.data.lexical import build_shortlist

    report = build_shortlist(cfg)
    print(f"nmt-shortlist: {report.line()}", file=sys.stderr)
    return 0
