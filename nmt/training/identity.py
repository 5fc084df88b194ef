"""The identity of the data a run trains on: checked at every start and on every resume.

A data dir's ids mean what its SentencePiece model(s) say, so a run must notice when the
data it meets is not what it was built or trained on:
- at every start, the data dir against its own meta.json: each SentencePiece model's
  sha256 (a model swapped after preprocessing pairs the stored ids with other pieces, and
  the checkpoints would carry it to generation) and the vocabulary sizes (nmt.data.tokenizer);
- on resume (and for resume.finetune_from), the checkpoint's `data` entry against the data dir:
  the tokenizers themselves, languages, normalization, vocabulary sizes and, for the splits
  the run reads, their pair and token counts (another corpus with the same vocabulary
  trains silently on the wrong data otherwise); on resume also the language options of a
  multilingual run (nmt.training.multilingual: lang_tag, directions, sampling_temperature).

A difference is an NmtError saying what differs, unless `resume.reset_data_check=true` asks to
train on this data dir all the same: then it is a note in the log, and the following
checkpoints record the new identity. Vocabulary sizes are never waived: no model of one
size loads the weights of another; nor are the language options, which change the batches.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt.checkpoint import tensor_to_bytes
from nmt.data.meta import DataMeta
from nmt.data.tokenizer import Tokenizer, load_tokenizers
from nmt.errors import NmtError
from nmt.training.config import TrainConfig
from nmt.training.multilingual import check_resumed_languages, trained_directions

OPTION = "resume.reset_data_check=true"


def accept_or_refuse(cfg: TrainConfig, notes: list[str], remedy: str) -> Callable[[str], None]:
    """What to do with a difference: note it (resume.reset_data_check=true) or refuse it, saying
    `remedy` or the option."""

    def handle(what: str) -> None:
        if cfg.resume.reset_data_check:
            notes.append(f"{what}; going on as {OPTION} asks")
        else:
            raise NmtError(f"{what}: {remedy}, or set {OPTION} to train with it anyway")

    return handle


def checked_tokenizers(
    cfg: TrainConfig, meta: DataMeta, notes: list[str]
) -> tuple[Tokenizer, Tokenizer]:
    """The data dir's (source, target) tokenizers, checked against its meta.json."""
    changed = accept_or_refuse(cfg, notes, "rebuild the data dir with nmt-preprocess")
    return load_tokenizers(cfg.data_dir(), meta, changed=changed)


def read_splits(cfg: TrainConfig, meta: DataMeta) -> list[str]:
    """The splits a run of `cfg` reads: its training corpora and its valid split (in a
    multilingual data dir, each of them for the pairs of the directions trained)."""
    stems = list(cfg.train_weights()) + ([cfg.validation.split] if cfg.validation.split else [])
    directions = trained_directions(cfg, meta)
    if not directions:
        return stems
    names = (meta.direction_split(stem, d)[0] for stem in stems for d in directions)
    return list(dict.fromkeys(names))  # a pair's two directions read one split


def split_counts(meta: DataMeta, splits: list[str]) -> dict[str, dict[str, int]]:
    """{split: {pairs, src_tokens, tgt_tokens}} of the splits a run reads (its checkpoints
    record them: a rebuilt corpus changes them, a copied or moved data dir does not)."""
    return {
        name: {
            "pairs": meta.splits[name].kept,
            "src_tokens": meta.splits[name].src_tokens,
            "tgt_tokens": meta.splits[name].tgt_tokens,
        }
        for name in splits
        if name in meta.splits
    }


def check_checkpoint_data(
    ckpt: dict[str, Any],
    path: Path,
    cfg: TrainConfig,
    meta: DataMeta,
    tokenizer_bytes: dict[str, bytes],
    *,
    resuming: bool,
    remedy: str,
    notes: list[str],
) -> None:
    """`ckpt` (at `path`) must have been trained on data like cfg.data's. Resuming compares
    everything; resume.finetune_from only what the weights depend on (vocabularies, tokenizers):
    a new corpus and other languages are what fine-tuning is for."""
    info = ckpt.get("data") or {}
    for key in ("src_vocab_size", "tgt_vocab_size"):
        if info.get(key) != getattr(meta, key):
            raise NmtError(
                f"{path}: {key} {info.get(key)} differs from {cfg.data}'s "
                f"{getattr(meta, key)}; {remedy}"
            )
    differences = []
    toks = ckpt.get("tokenizers") or {}
    changed = {}  # side -> (sha256 in the checkpoint, sha256 in the data dir)
    for side in ("src", "tgt"):
        if side in toks:
            saved = tensor_to_bytes(toks[side])
            if saved != tokenizer_bytes[side]:
                changed[side] = (_sha(saved), _sha(tokenizer_bytes[side]))
    if len(changed) == 2 and changed["src"] == changed["tgt"]:  # one joint model
        changed = {"": changed["src"]}
    for side, (saved_sha, sha) in changed.items():
        differences.append(
            f"the {side + ' ' if side else ''}tokenizer (sha256 {saved_sha} in the "
            f"checkpoint, {sha} in the data dir)"
        )
    if resuming:
        check_resumed_languages(ckpt, path, cfg, meta)  # never waived: the batches would differ
        current = {
            "src_lang": meta.src_lang,
            "tgt_lang": meta.tgt_lang,
            "normalization": dict(meta.normalization),
        }
        for key, value in current.items():
            if key in info and info[key] != value:
                differences.append(f"{key} {info[key]!r} in the checkpoint, {value!r} here")
        saved_splits = info.get("splits") or {}
        # splits the run reads no more (train_split or validation.split changed) are not compared
        now = split_counts(meta, [s for s in read_splits(cfg, meta) if s in saved_splits])
        for name, counts in now.items():
            if saved_splits[name] != counts:
                differences.append(
                    f"split {name} ({_counts(saved_splits[name])} in the checkpoint, "
                    f"{_counts(counts)} here)"
                )
    if differences:
        handle = accept_or_refuse(cfg, notes, remedy)
        handle(f"{path}: was trained on other data than {cfg.data}: {'; '.join(differences)}")


def _sha(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()[:12]


def _counts(c: dict[str, int]) -> str:
    return f"{c.get('pairs')} pairs of {c.get('src_tokens')}/{c.get('tgt_tokens')} tokens"
