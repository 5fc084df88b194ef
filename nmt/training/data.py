"""What a training run reads from its data dir: meta.json, the tokenizers' bytes, the train
split (size-filtered) and the valid split with its fixed batches.

Every problem with the data dir is an NmtError naming the file, split or key at fault.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nmt.data.batching import epoch_batches, filter_by_size, fixed_batches
from nmt.data.dataset import PairDataset, load_pair_dataset
from nmt.data.meta import DataMeta, load_meta
from nmt.data.vocab import SPECIAL_IDS
from nmt.errors import NmtError
from nmt.training.config import TrainConfig


@dataclass
class TrainData:
    """The data of one run; `notes` are lines for the log (what the size filter dropped)."""

    meta: DataMeta
    tokenizer_bytes: dict[str, bytes]  # {"src": ..., "tgt": ...}: SentencePiece models
    train: PairDataset
    train_indices: np.ndarray  # the train pairs that fit the model and max_tokens
    valid: PairDataset | None  # None: validation is off
    valid_batches: list[np.ndarray]  # the valid split in fixed batches (all ranks' shares)
    bleu_indices: np.ndarray  # the valid pairs decoded for BLEU
    max_tokens: int
    max_sentences: int
    seed: int
    notes: list[str] = field(default_factory=list)
    _tgt_tokenizer: Any = field(default=None, repr=False)

    def epoch_batches(self, epoch: int) -> list[np.ndarray]:
        """The seeded batch list of `epoch` (the same on every rank)."""
        return epoch_batches(
            self.train_indices,
            self.train.src_sizes,
            self.train.tgt_sizes,
            max_tokens=self.max_tokens,
            max_sentences=self.max_sentences,
            seed=self.seed,
            epoch=epoch,
        )

    def tgt_tokenizer(self):
        """The target Tokenizer (validation BLEU detokenizes with it), built on first use."""
        if self._tgt_tokenizer is None:
            from nmt.data.tokenizer import Tokenizer

            self._tgt_tokenizer = Tokenizer.from_bytes(self.tokenizer_bytes["tgt"])
        return self._tgt_tokenizer

    def checkpoint_info(self) -> dict[str, Any]:
        """The `data` entry of a checkpoint (see docs/ARCHITECTURE.md)."""
        meta = self.meta
        return {
            "src_lang": meta.src_lang,
            "tgt_lang": meta.tgt_lang,
            "src_vocab_size": meta.src_vocab_size,
            "tgt_vocab_size": meta.tgt_vocab_size,
            "joint_vocab": meta.joint_vocab,
            "special_ids": dict(meta.special_ids),
            "normalization": dict(meta.normalization),
        }


def load_train_data(cfg: TrainConfig) -> TrainData:
    """Read `cfg.data`: check meta.json and the tokenizers, load and filter the splits."""
    meta = load_meta(cfg.data)
    meta_json = Path(cfg.data) / "meta.json"
    if meta.special_ids != SPECIAL_IDS:
        raise NmtError(
            f"{meta_json}: special_ids {meta.special_ids} differ from nmt's {SPECIAL_IDS}; "
            "rebuild the data dir with nmt-preprocess"
        )
    tokenizer_bytes = {}
    for side in ("src", "tgt"):
        path = meta.tokenizer_file(cfg.data, side)
        try:
            tokenizer_bytes[side] = path.read_bytes()
        except OSError as exc:
            raise NmtError(
                f"{path}: cannot read the tokenizer named in {meta_json} "
                f"({exc.strerror}); rebuild the data dir"
            ) from exc
    if cfg.train_split not in meta.splits:
        raise NmtError(
            f"train_split={cfg.train_split}: {meta_json} has splits "
            f"{sorted(meta.splits)}; choose one of them"
        )
    train = load_pair_dataset(cfg.data, cfg.train_split, meta.src_lang, meta.tgt_lang)
    train_indices, notes = _filter_train(train, cfg)
    data = TrainData(
        meta=meta,
        tokenizer_bytes=tokenizer_bytes,
        train=train,
        train_indices=train_indices,
        valid=None,
        valid_batches=[],
        bleu_indices=np.zeros(0, dtype=np.int64),
        max_tokens=cfg.max_tokens,
        max_sentences=cfg.max_sentences,
        seed=cfg.seed,
        notes=notes,
    )
    if cfg.valid_split and cfg.valid_split in meta.splits:
        _load_valid(data, cfg)
    elif cfg.valid_split:
        data.notes.append(
            f"valid: the data dir has no {cfg.valid_split!r} split; validation is off"
        )
    return data


def _filter_train(train: PairDataset, cfg: TrainConfig) -> tuple[np.ndarray, list[str]]:
    """The train pairs that fit the model's positions and max_tokens, and notes on the rest."""
    m = cfg.model
    kept = filter_by_size(
        train.src_sizes,
        train.tgt_sizes,
        max_source_positions=m.max_source_positions,
        max_target_positions=m.max_target_positions,
        max_tokens=cfg.max_tokens,
    )
    notes = [f"train: {len(kept.kept)} of {len(train)} sentence pairs of {train.name}"]
    if kept.too_long:
        notes.append(
            f"train: skipped {kept.too_long} pairs longer than the model's "
            f"positions ({m.max_source_positions}/{m.max_target_positions})"
        )
    if kept.over_budget:
        notes.append(
            f"train: skipped {kept.over_budget} pairs longer than max_tokens={cfg.max_tokens}"
        )
    if len(kept.kept) == 0:
        raise NmtError(
            f"{train.name}: no usable training pairs (all longer than "
            "the model's positions or max_tokens); raise max_tokens or the positions"
        )
    return kept.kept, notes


def _load_valid(data: TrainData, cfg: TrainConfig) -> None:
    """The valid split must fit the model whole: its line numbers are the raw file's."""
    m = cfg.model
    valid = load_pair_dataset(cfg.data, cfg.valid_split, data.meta.src_lang, data.meta.tgt_lang)
    too_long = (valid.src_sizes > m.max_source_positions) | (
        valid.tgt_sizes > m.max_target_positions
    )
    if too_long.any():
        first = int(np.flatnonzero(too_long)[0])
        raise NmtError(
            f"{valid.name}: {int(too_long.sum())} pairs (the first is line {first + 1}) "
            f"are longer than the model's positions ({m.max_source_positions}/"
            f"{m.max_target_positions}); raise model.max_*_positions or filter "
            "the valid set in nmt-preprocess"
        )
    indices = np.arange(len(valid), dtype=np.int64)
    data.valid = valid
    data.valid_batches = fixed_batches(
        indices,
        valid.src_sizes,
        valid.tgt_sizes,
        max_tokens=cfg.valid_max_tokens or cfg.max_tokens,
        max_sentences=cfg.max_sentences,
    )
    data.bleu_indices = indices[: cfg.eval_bleu_max_sentences or len(valid)]
