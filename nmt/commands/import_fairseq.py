"""nmt-import-fairseq: a fairseq transformer checkpoint -> an nmt checkpoint.

    nmt-import-fairseq checkpoint=checkpoints/checkpoint_best.pt data_dir=data-bin/wmt \
        spm=spm.model output=imported.pt

Then `nmt-generate checkpoint=imported.pt` translates with it. The conversion itself
(vocabulary re-ordering, SentencePiece special ids, unsupported features) is
nmt.interop.fairseq_import; this module resolves paths and writes the file.
"""

from __future__ import annotations

import sys
from pathlib import Path

from nmt.errors import NmtError
from nmt.interop.config import ImportFairseqConfig


def _spm_paths(cfg: ImportFairseqConfig) -> tuple[Path, Path]:
    if cfg.spm and (cfg.src_spm or cfg.tgt_spm):
        raise NmtError("spm: give either spm= (one joint model) or src_spm= and tgt_spm=, not both")
    if cfg.spm:
        return Path(cfg.spm), Path(cfg.spm)
    if cfg.src_spm and cfg.tgt_spm:
        return Path(cfg.src_spm), Path(cfg.tgt_spm)
    raise NmtError(
        "spm: the SentencePiece model the fairseq data was encoded with is needed; "
        "pass spm=PATH.model (or src_spm= and tgt_spm=)"
    )


def run(cfg: ImportFairseqConfig) -> None:
    from nmt.checkpoint import save_checkpoint
    from nmt.interop.fairseq_import import import_fairseq, read_fairseq_checkpoint

    if not cfg.checkpoint:
        raise NmtError(
            "checkpoint: no fairseq checkpoint given; pass checkpoint=PATH/checkpoint_best.pt"
        )
    if not cfg.output:
        raise NmtError("output: no output file given; pass output=PATH.pt")
    output = Path(cfg.output)
    if output.exists() and not cfg.overwrite:
        raise NmtError(
            f"output: {output} already exists; choose another path or pass overwrite=true"
        )
    src_spm, tgt_spm = _spm_paths(cfg)

    ckpt = read_fairseq_checkpoint(cfg.checkpoint)
    src_lang = cfg.src_lang or ckpt.source_lang
    tgt_lang = cfg.tgt_lang or ckpt.target_lang
    data_dir = Path(cfg.data_dir) if cfg.data_dir else ckpt.path.parent
    dicts = []
    for key, given, lang in (("src", cfg.src_dict, src_lang), ("tgt", cfg.tgt_dict, tgt_lang)):
        if not given and not lang:
            raise NmtError(
                f"{key}_lang: the checkpoint does not name its languages; pass "
                f"{key}_lang= (or {key}_dict=PATH/dict.<lang>.txt)"
            )
        dicts.append(Path(given) if given else data_dir / f"dict.{lang}.txt")

    nmt_ckpt, report = import_fairseq(
        ckpt, dicts[0], dicts[1], src_spm, tgt_spm, src_lang=src_lang, tgt_lang=tgt_lang
    )
    save_checkpoint(nmt_ckpt, output)
    for line in report.lines():
        print(line, file=sys.stderr)
    data = nmt_ckpt["data"]
    print(
        f"wrote {output} ({data['src_lang']}->{data['tgt_lang']}); translate with "
        f"nmt-generate checkpoint={output}",
        file=sys.stderr,
    )
