"""nmt-export: an nmt checkpoint -> a CTranslate2 model directory.

    nmt-export checkpoint=runs/demo/checkpoint_best.pt output_dir=ct2-demo quantization=int8

The directory holds model.bin, config.json, the vocabularies, the SentencePiece model(s)
and nmt_export.json (where it came from); nmt.interop.ctranslate2_export writes it.
Translate with ctranslate2.Translator on SentencePiece pieces; the source's </s> is
appended by CTranslate2 itself.
"""

from __future__ import annotations

import sys

from nmt.interop.config import ExportConfig


def run(cfg: ExportConfig) -> int:
    from nmt.interop.ctranslate2_export import export_ctranslate2

    info = export_ctranslate2(
        str(cfg.checkpoint), str(cfg.output_dir), cfg.quantization, cfg.overwrite, cfg.vmap
    )
    print(
        f"wrote CTranslate2 model {cfg.output_dir} ({info['src_lang']}->{info['tgt_lang']}, "
        f"quantization {cfg.quantization}) from {cfg.checkpoint}",
        file=sys.stderr,
    )
    return 0
