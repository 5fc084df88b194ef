"""nmt-import-fairseq: a fairseq transformer checkpoint -> an nmt checkpoint.

    nmt-import-fairseq checkpoint=checkpoints/checkpoint_best.pt data_dir=data-bin/wmt \
        spm=spm.model output=imported.pt

Then `nmt-generate checkpoint=imported.pt` translates with it. The conversion is
nmt.interop.fairseq_import.import_fairseq_checkpoint.
"""

from __future__ import annotations

import sys

from nmt.interop.config import ImportFairseqConfig


def run(cfg: ImportFairseqConfig) -> int:
    from nmt.interop.fairseq_import import import_fairseq_checkpoint

    for line in import_fairseq_checkpoint(cfg).lines():
        print(line, file=sys.stderr)
    return 0
