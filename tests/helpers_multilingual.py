"""A small multilingual data dir for the training tests, built directly to the contract of
nmt.data.meta (langs, directions, lang_tags; each pair stored once as `<split>.<stem>`)
rather than through nmt-preprocess.

Three languages: English and German from the demo corpus, and "fr", each English word
spelled backwards (a language of its own as far as a model can tell). The pairs are not
multi-parallel and differ in size (en-de 240 training pairs, en-fr 120, de-fr 60), so that
temperature sampling has sizes to even out. One joint unigram SentencePiece model with
nmt's special ids and a control symbol per language (`<2en>`, ...).
"""

from __future__ import annotations

import io
from itertools import permutations
from pathlib import Path

import numpy as np
import sentencepiece as spm

from nmt.data.binarize import TokenArrayWriter, dtype_for_vocab
from nmt.data.languages import direction_name, tag_piece
from nmt.data.meta import DataMeta, SplitInfo, write_meta
from nmt.data.tokenizer import Tokenizer
from nmt.vocab import BOS, EOS, PAD, SPECIAL_IDS, UNK

LANGS = ["en", "de", "fr"]
# pair stem -> training pairs (and the demo lines they start at, so that the pairs differ)
TRAIN_PAIRS = {"en-de": (240, 0), "en-fr": (120, 240), "de-fr": (60, 360)}
VALID_PAIRS = 40
VOCAB_SIZE = 400


def _demo_lines(demo_corpus: Path, split: str, lang: str) -> list[str]:
    source = "en" if lang == "fr" else lang
    lines = (demo_corpus / f"{split}.{source}").read_text(encoding="utf-8").splitlines()
    if lang == "fr":
        lines = [" ".join(word[::-1] for word in line.split()) for line in lines]
    return lines


def _tokenizer(text: list[str]) -> Tokenizer:
    model = io.BytesIO()
    spm.set_random_generator_seed(1)
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=model,
        vocab_size=VOCAB_SIZE,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        control_symbols=[tag_piece(lang) for lang in LANGS],
        bos_id=BOS,
        pad_id=PAD,
        eos_id=EOS,
        unk_id=UNK,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    return Tokenizer(model.getvalue(), name="multilingual test model")


def _write_side(prefix: Path, tokenizer: Tokenizer, lines: list[str]) -> int:
    """Binarize `lines` (ids and EOS) to prefix.bin/.idx; the tokens written."""
    ids = [np.array([*seq, EOS]) for seq in tokenizer.encode_batch(lines)]
    writer = TokenArrayWriter(prefix, dtype_for_vocab(tokenizer.vocab_size))
    writer.add(np.concatenate(ids), np.array([len(s) for s in ids]))
    writer.close()
    return writer.tokens


def build_multilingual_data_dir(demo_corpus: Path, dest: Path) -> Path:
    """`dest`: a multilingual data dir of en, de and fr, with splits train.<stem> and
    valid.<stem> for each pair stem of TRAIN_PAIRS, and every direction among them."""
    dest.mkdir(parents=True, exist_ok=True)
    text: dict[tuple[str, str, str], list[str]] = {}  # (split, stem, lang) -> lines
    for stem, (count, start) in TRAIN_PAIRS.items():
        for lang in stem.split("-"):
            text["train", stem, lang] = _demo_lines(demo_corpus, "valid", lang)[
                start : start + count
            ]
            text["valid", stem, lang] = _demo_lines(demo_corpus, "test", lang)[:VALID_PAIRS]
    tokenizer = _tokenizer([line for lines in text.values() for line in lines])
    (dest / "spm.model").write_bytes(tokenizer.model_bytes)
    splits = {}
    for split in ("train", "valid"):
        for stem in TRAIN_PAIRS:
            a, b = stem.split("-")
            tokens = [
                _write_side(dest / f"{split}.{stem}.{lang}", tokenizer, text[split, stem, lang])
                for lang in (a, b)
            ]
            n = len(text[split, stem, a])
            splits[f"{split}.{stem}"] = SplitInfo(
                lines=n,
                kept=n,
                removed={},
                src_tokens=tokens[0],
                tgt_tokens=tokens[1],
                langs=[a, b],
            )
    directions = {}
    for stem in TRAIN_PAIRS:
        for src, tgt in permutations(stem.split("-")):
            directions[direction_name(src, tgt)] = stem
    files = {"file": "spm.model", "sha256": tokenizer.sha256}
    first = next(iter(directions)).split("-")
    meta = DataMeta(
        src_lang=first[0],
        tgt_lang=first[1],
        joint_vocab=True,
        src_vocab_size=tokenizer.vocab_size,
        tgt_vocab_size=tokenizer.vocab_size,
        special_ids=dict(SPECIAL_IDS),
        dtype=dtype_for_vocab(tokenizer.vocab_size).name,
        tokenizers={"src": dict(files), "tgt": dict(files)},
        normalization={"nfkc": False},
        splits=splits,
        langs=list(LANGS),
        directions=directions,
        lang_tags={lang: tag_piece(lang) for lang in LANGS},
    )
    write_meta(dest, meta)
    return dest
