"""Configuration of `nmt-preprocess`: inputs and output, SentencePiece, cleaning.

Plain dataclasses (no Hydra here): `nmt/config.py` registers `PreprocessConfig` as the
schema of configs/preprocess.yaml, so a mistyped key or a wrong type is rejected when
the config is composed. The keys follow fairseq-preprocess where one exists
(`data.trainpref`, `data.validpref`, `data.testpref`, `workers`).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from enum import Enum
from typing import Optional


class ModelType(str, Enum):
    """SentencePiece segmentation algorithm."""

    unigram = "unigram"
    bpe = "bpe"


class InvalidUtf8(str, Enum):
    """What to do with a line that is not valid UTF-8."""

    error = "error"  # stop with the file and line number
    replace = "replace"  # keep the line, bad bytes become U+FFFD
    skip = "skip"  # drop the pair (counted as removed: invalid_utf8), in every split


@dataclass
class DataConfig:
    """Where the parallel text is and where the data dir goes (paths relative to the cwd)."""

    src: str = "en"  # source language: files are <prefix>.<src>
    tgt: str = "de"  # target language: files are <prefix>.<tgt>
    trainpref: str = "data/demo/train"  # training text prefix (required)
    validpref: Optional[str] = "data/demo/valid"  # stored as split "valid"; null: no valid split
    # test prefixes, any number; each is stored under its file name (test_2016_flickr, ...)
    testpref: list[str] = field(default_factory=lambda: ["data/demo/test"])
    dest: str = "data-bin/demo"  # the data dir to write


@dataclass
class SpmConfig:
    """Train a SentencePiece model on the training split, or reuse existing model file(s)."""

    model: Optional[str] = None  # reuse this joint model file instead of training
    src_model: Optional[str] = None  # reuse separate models: source side (needs tgt_model)
    tgt_model: Optional[str] = None  # reuse separate models: target side (needs src_model)
    joint: bool = True  # when training: one model for both languages, else one per language
    model_type: ModelType = ModelType.bpe  # bpe or unigram
    vocab_size: int = 1000  # pieces per model, special ids and byte pieces included (demo size)
    character_coverage: float = 1.0  # share of characters covered; the rest: <unk> or bytes
    byte_fallback: bool = True  # spell unseen characters as UTF-8 bytes, so decoding is lossless
    input_sentence_size: int = 0  # train on a random sample of this many sentences; 0: all
    user_defined_symbols: list[str] = field(default_factory=list)  # always kept as one piece
    num_threads: int = 2  # training threads; part of the recipe (another count, another model)
    seed: int = 1  # SentencePiece's random seed (sentence sampling)


@dataclass
class CleanConfig:
    """Filters for the training split only; valid and test keep every line."""

    remove_empty: bool = True  # drop pairs with an empty side (after normalization)
    max_tokens: Optional[int] = 250  # drop pairs with a side over this many pieces; null: off
    # drop pairs whose longer side has over max_ratio times the pieces of the shorter; null: off
    max_ratio: Optional[float] = 3.0


@dataclass
class PreprocessConfig:
    """`nmt-preprocess`: raw parallel text -> data dir (see docs/ARCHITECTURE.md)."""

    data: DataConfig = field(default_factory=DataConfig)
    spm: SpmConfig = field(default_factory=SpmConfig)
    clean: CleanConfig = field(default_factory=CleanConfig)
    nfkc: bool = False  # Unicode NFKC first (whitespace is normalized either way)
    on_invalid_utf8: InvalidUtf8 = InvalidUtf8.error  # error, replace or skip
    workers: int = 2  # encoding processes; the output is the same for any number
    chunk_lines: int = 5000  # lines per unit of work handed to a worker
    overwrite: bool = False  # replace an existing data dir at data.dest
    debug: bool = False  # show tracebacks instead of one-line errors
