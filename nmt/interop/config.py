"""Configs of nmt-export (to CTranslate2) and nmt-import-fairseq (from fairseq)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

QUANTIZATIONS = ("none", "int8", "int16", "float16", "bfloat16")


@dataclass
class ExportConfig:
    """nmt-export: write a CTranslate2 model directory from an nmt checkpoint."""

    checkpoint: Optional[str] = None  # nmt checkpoint to export (required)
    output_dir: Optional[str] = None  # CTranslate2 model directory to create (required)
    quantization: str = "none"  # weight type: none (float32), int8, int16, float16, bfloat16
    overwrite: bool = False  # replace an existing output_dir (otherwise refuse)
    debug: bool = False  # full tracebacks instead of one-line errors


@dataclass
class ImportFairseqConfig:
    """nmt-import-fairseq: convert a fairseq transformer checkpoint to an nmt checkpoint."""

    checkpoint: Optional[str] = None  # fairseq checkpoint*.pt (required)
    data_dir: Optional[str] = (
        None  # fairseq data-bin dir holding dict.<lang>.txt; None = the checkpoint's dir
    )
    src_dict: Optional[str] = None  # source dict.txt; None = <data_dir>/dict.<src_lang>.txt
    tgt_dict: Optional[str] = None  # target dict.txt; None = <data_dir>/dict.<tgt_lang>.txt
    spm: Optional[str] = None  # the SentencePiece model fairseq's data was encoded with (joint)
    src_spm: Optional[str] = None  # source SentencePiece model, when source and target differ
    tgt_spm: Optional[str] = None  # target SentencePiece model, when source and target differ
    src_lang: Optional[str] = None  # source language; None = the checkpoint's (task.source_lang)
    tgt_lang: Optional[str] = None  # target language; None = the checkpoint's (task.target_lang)
    output: Optional[str] = None  # nmt checkpoint to write (required)
    overwrite: bool = False  # replace an existing output file (otherwise refuse)
    debug: bool = False  # full tracebacks instead of one-line errors
