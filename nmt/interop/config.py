"""Configs of nmt-export (to CTranslate2) and nmt-import-fairseq (from fairseq).

Each checks itself in `validate()` (the CLI calls it, and so do the library calls for
configs built in Python); messages read `option=value: what is wrong; what to do`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from nmt.errors import choice_error, option_error

QUANTIZATIONS = ("none", "int8", "int16", "float16", "bfloat16")
FAIRSEQ_LANG_TAGS = ("tgt", "decoder")  # the placements of fairseq's tokens nmt has


@dataclass
class ExportConfig:
    """nmt-export: write a CTranslate2 model directory from an nmt checkpoint."""

    checkpoint: Optional[str] = None  # nmt checkpoint to export (required)
    output_dir: Optional[str] = None  # CTranslate2 model directory to create (required)
    quantization: str = "none"  # weight type: none (float32), int8, int16, float16, bfloat16
    vmap: Optional[str] = None  # a shortlist file (nmt-shortlist) to ship as vmap.txt
    overwrite: bool = False  # replace an earlier nmt-export at output_dir (never another dir)
    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        if not self.checkpoint:
            raise option_error(
                "checkpoint",
                self.checkpoint,
                "required",
                "give the nmt checkpoint to export (checkpoint=PATH.pt)",
            )
        if not self.output_dir:
            raise option_error(
                "output_dir",
                self.output_dir,
                "required",
                "give the CTranslate2 model directory to create (output_dir=DIR)",
            )
        if self.quantization not in QUANTIZATIONS:
            raise choice_error("quantization", self.quantization, QUANTIZATIONS)


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
    # a multilingual model (translation_multi_simple_epoch): its languages in --langs order
    # ([]: those the checkpoint records), and where its language tokens go (None: the same)
    langs: list[str] = field(default_factory=list)
    lang_tag: Optional[str] = None  # tgt (--encoder-langtok tgt) or decoder (--decoder-langtok)
    output: Optional[str] = None  # nmt checkpoint to write (required)
    overwrite: bool = False  # replace an earlier nmt-import-fairseq output (never another file)
    debug: bool = False  # full tracebacks instead of one-line errors

    def validate(self) -> None:
        if not self.checkpoint:
            raise option_error(
                "checkpoint",
                self.checkpoint,
                "required",
                "give the fairseq checkpoint (checkpoint=PATH/checkpoint_best.pt)",
            )
        if not self.output:
            raise option_error(
                "output",
                self.output,
                "required",
                "give the nmt checkpoint to write (output=PATH.pt)",
            )
        if self.spm and (self.src_spm or self.tgt_spm):
            raise option_error(
                "spm",
                self.spm,
                "set together with src_spm/tgt_spm",
                "give spm= (one joint model) or src_spm= and tgt_spm=, not both",
            )
        if not self.spm and not self.src_spm and not self.tgt_spm:
            raise option_error(
                "spm",
                self.spm,
                "required",
                "give the SentencePiece model the fairseq data was encoded with "
                "(spm=PATH.model, or src_spm= and tgt_spm=)",
            )
        if not self.spm and not (self.src_spm and self.tgt_spm):
            given, missing = ("src_spm", "tgt_spm") if self.src_spm else ("tgt_spm", "src_spm")
            raise option_error(
                given,
                getattr(self, given),
                f"{missing} is not set",
                "give both, or spm= for one joint model",
            )
        if self.lang_tag is not None and self.lang_tag not in FAIRSEQ_LANG_TAGS:
            raise choice_error("lang_tag", self.lang_tag, FAIRSEQ_LANG_TAGS)
        for key in ("src_lang", "tgt_lang"):
            lang = getattr(self, key)
            if lang is not None and (not lang or "/" in lang or lang != lang.strip()):
                raise option_error(
                    key,
                    lang,
                    "not a language suffix",
                    "give one such as en or de, or null to take the checkpoint's",
                )
