"""What a training run reads from its data dir: meta.json, the tokenizers' bytes, the
training corpora (one split, or several mixed with weights; each possibly in shards) and
the valid split with its fixed batches.

Memory does not grow with the corpus beyond a few bytes a pair: the sentences stay in
their memory-mapped files, lengths are read as uint8/uint16 arrays, and an epoch's batch
list is two numpy arrays (nmt.data.batching.BatchList). A sharded split (nmt.data.join) is
read one shard per epoch, in turn, as fairseq reads `data-bin/shard0:shard1`: epoch e
trains on shard (e - 1) mod (number of shards) of each corpus.

Several corpora (`train_split={noisy: 1, clean: 2}`): each epoch takes `weight x size`
pairs of each: a whole weight repeats every pair (2 = each pair twice), a fraction takes a
random part drawn anew every epoch from (seed, epoch). The mix is in the run's config
(config.yaml, the checkpoints' `config`), and the log names each corpus's share.

A multilingual data dir (nmt.training.multilingual): each split of train_split and each
direction trained is one corpus of the mix, read in the direction's orientation from the
pair's split (`train.en-de` for en-de and de-en), its sentences with their language tags
in front (nmt.data.dataset.PrefixedSequences: batching, size limits and subword sampling
see the tagged lengths). Temperature sampling multiplies the weights of each direction's
corpora by p_d N / n_d, computed on each epoch's usable pairs. Validation reads each
direction's part of the valid split, tagged the same way (`valid_sets`, one per direction).

Every problem with the data dir is an NmtError naming the file, split or key at fault.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from nmt.data.batching import (
    BatchList,
    epoch_batches,
    filter_by_size,
    fixed_batches,
    index_dtype,
)
from nmt.data.dataset import (
    ConcatSequences,
    PairDataset,
    load_pair_dataset,
    open_side,
    prefixed,
)
from nmt.data.languages import LanguageTags
from nmt.data.meta import DataMeta, load_meta
from nmt.data.subword_sampling import SubwordSampler
from nmt.errors import NmtError, option_error
from nmt.training.config import TrainConfig
from nmt.training.identity import checked_tokenizers, read_splits, split_counts
from nmt.training.multilingual import (
    check_language_options,
    language_tags,
    temperature_factors,
)
from nmt.vocab import SPECIAL_IDS


@dataclass(frozen=True)
class TrainCorpus:
    """One training split of the mix: its weight and its shards' file prefixes; in a
    multilingual data dir, one direction of a pair's split, with its tag ids."""

    split: str
    weight: float
    shards: list[str]
    src_lang: str
    tgt_lang: str
    direction: str = ""  # "en-de" in a multilingual data dir
    src_prefix: tuple[int, ...] = ()  # tag ids before each source sentence
    tgt_prefix: tuple[int, ...] = ()  # tag ids before each target sentence

    def shard_of(self, epoch: int) -> int:
        return (epoch - 1) % len(self.shards)

    @property
    def name(self) -> str:
        return f"{self.split} ({self.direction})" if self.direction else self.split


@dataclass
class ValidSet:
    """The valid split of one direction (direction "" for a single pair) in fixed batches."""

    direction: str
    dataset: PairDataset
    batches: BatchList | list[np.ndarray]
    bleu_indices: np.ndarray  # the pairs decoded for BLEU
    target_prefix: tuple[int, ...] = ()  # forced first target ids (lang_tag=decoder)


@dataclass
class TrainData:
    """The data of one run; `notes` are lines for the log (the mix, what the size filter
    dropped). `train` and `train_indices` are the current epoch's (see `epoch_batches`)."""

    meta: DataMeta
    tokenizer_bytes: dict[str, bytes]  # {"src": ..., "tgt": ...}: SentencePiece models
    corpora: list[TrainCorpus]
    train: PairDataset  # the corpora (their shards of the current epoch) end to end
    train_indices: np.ndarray | None  # its pairs that fit the model and max_tokens; None: all
    valid_sets: list[ValidSet]  # one per direction validated; []: validation is off
    max_tokens: int
    max_sentences: int
    seed: int
    max_positions: tuple[int, int]  # the model's (source, target) positions
    data_dir: str = ""
    read_splits: list[str] = field(default_factory=list)  # train corpora and valid split
    notes: list[str] = field(default_factory=list)
    sampler: SubwordSampler | None = None  # subword regularization; None: as stored
    packing_tokens: int = 0  # the stored tokens a batch is packed to; 0: max_tokens
    languages: LanguageTags | None = None  # a multilingual data dir's; None: a single pair
    temperature: float = 1.0  # sampling_temperature (multilingual)
    _epoch_shards: tuple[int, ...] = ()
    _offsets: np.ndarray = field(default_factory=lambda: np.zeros(1, dtype=np.int64))
    _tgt_tokenizer: Any = field(default=None, repr=False)

    def epoch_batches(self, epoch: int) -> BatchList:
        """The seeded batch list of `epoch` (the same on every rank); loads the epoch's
        shards first, so that `train` is what the batches index."""
        self.load_epoch(epoch)
        return epoch_batches(
            self.mixed_indices(epoch),
            self.train.src_sizes,
            self.train.tgt_sizes,
            max_tokens=self.packing_tokens or self.max_tokens,
            max_sentences=self.max_sentences,
            seed=self.seed,
            epoch=epoch,
        )

    def train_pairs(self, rows: np.ndarray, epoch: int) -> list[tuple[np.ndarray, np.ndarray]]:
        """The training pairs of `rows` (a batch of `epoch`): as stored, or in segmentations
        drawn for this batch (subword sampling; a function of seed, epoch and rows)."""
        pairs = self.train.pairs(rows)
        if self.sampler is None:
            return pairs
        return self.sampler.sample(
            pairs, rows, epoch, max_tokens=self.max_tokens, max_positions=self.max_positions
        )

    def load_epoch(self, epoch: int) -> None:
        """Open the shards `epoch` trains on (nothing to do when they are open already)."""
        shards = tuple(c.shard_of(epoch) for c in self.corpora)
        if shards == self._epoch_shards:
            return
        sides: list[list[Any]] = [[], []]
        for corpus, k in zip(self.corpora, shards):
            for side, lang, prefix in zip(
                sides,
                (corpus.src_lang, corpus.tgt_lang),
                (corpus.src_prefix, corpus.tgt_prefix),
            ):
                seqs = open_side(
                    self.data_dir, corpus.shards[k], lang, corpus.split, self.meta.dtype
                )
                side.append(prefixed(seqs, prefix))
        src, tgt = (s[0] if len(s) == 1 else ConcatSequences(s) for s in sides)
        name = "+".join(
            c.name + (f"[shard {k + 1}/{len(c.shards)}]" if len(c.shards) > 1 else "")
            for c, k in zip(self.corpora, shards)
        )
        self.train = PairDataset(src, tgt, name=f"{self.data_dir}/{name}")
        self._offsets = np.cumsum([0] + [len(s) for s in sides[0]])
        self.train_indices, notes = _filter_train(self.train, self.max_tokens, self.max_positions)
        self._epoch_shards = shards
        if not self.notes:  # the first epoch's figures go to the log
            self.notes += notes + self._mix_notes()

    def mixed_indices(self, epoch: int) -> np.ndarray | None:
        """The pairs of `epoch`, each corpus repeated by its weight times its direction's
        temperature factor (None: every pair once)."""
        if all(c.weight == 1.0 for c in self.corpora) and self.temperature == 1.0:
            return self.train_indices
        n = len(self.train)
        usable = np.arange(n, dtype=index_dtype(n)) if self.train_indices is None else None
        pairs = []
        for c in range(len(self.corpora)):
            lo, hi = int(self._offsets[c]), int(self._offsets[c + 1])
            if usable is not None:
                pairs.append(usable[lo:hi])
            else:
                kept = self.train_indices
                assert kept is not None
                pairs.append(kept[np.searchsorted(kept, lo) : np.searchsorted(kept, hi)])
        parts = []
        for c, (mine, weight) in enumerate(zip(pairs, self._weights(pairs))):
            whole = math.floor(weight)
            parts += [mine] * whole
            extra = round((weight - whole) * len(mine))
            if extra:  # a random part, drawn anew each epoch
                rng = np.random.default_rng([self.seed, epoch, 1 + c])
                parts.append(np.sort(rng.choice(mine, size=extra, replace=False)))
        if not parts:
            return np.zeros(0, dtype=index_dtype(n))
        return np.concatenate(parts).astype(index_dtype(n), copy=False)

    def _weights(self, pairs: list[np.ndarray]) -> list[float]:
        """Each corpus's weight times its direction's temperature factor, from the usable
        `pairs` of each corpus this epoch (nmt.training.multilingual.temperature_factors)."""
        sizes: dict[str, float] = {}
        for corpus, mine in zip(self.corpora, pairs):
            sizes[corpus.direction] = sizes.get(corpus.direction, 0.0) + corpus.weight * len(mine)
        factors = temperature_factors(sizes, self.temperature)
        return [c.weight * factors[c.direction] for c in self.corpora]

    def _mix_notes(self) -> list[str]:
        if self.languages is not None:
            return self._direction_notes()
        if len(self.corpora) == 1 and self.corpora[0].weight == 1.0:
            count = len(self.corpora[0].shards)
            return [f"train: {count} shards, one per epoch, in turn"] if count > 1 else []
        parts = []
        for c, corpus in enumerate(self.corpora):
            n = int(self._offsets[c + 1] - self._offsets[c])
            shards = f" ({len(corpus.shards)} shards, in turn)" if len(corpus.shards) > 1 else ""
            parts.append(f"{corpus.split} {n} pairs x {corpus.weight:g}{shards}")
        indices = self.mixed_indices(1)
        total = len(self.train) if indices is None else len(indices)
        return [f"train: mixing {', '.join(parts)}: {total} pairs in epoch 1"]

    def _direction_notes(self) -> list[str]:
        """The pairs of each direction in epoch 1, and their tags."""
        assert self.languages is not None
        indices = self.mixed_indices(1)
        if indices is None:
            indices = np.arange(len(self.train))
        drawn = np.bincount(
            np.searchsorted(self._offsets, indices, side="right") - 1, minlength=len(self.corpora)
        )
        stored: dict[str, int] = {}
        taken: dict[str, int] = {}
        for c, corpus in enumerate(self.corpora):
            d = corpus.direction
            stored[d] = stored.get(d, 0) + int(self._offsets[c + 1] - self._offsets[c])
            taken[d] = taken.get(d, 0) + int(drawn[c])
        total = max(sum(taken.values()), 1)
        parts = [
            f"{d} {taken[d]} ({stored[d]} stored, {100 * taken[d] / total:.1f}%)" for d in stored
        ]
        tags = self.languages
        return [
            f"train: {len(stored)} directions, sampling_temperature={self.temperature:g}, "
            f"pairs in epoch 1: {', '.join(parts)}",
            f"train: lang_tag={tags.style}: "
            + ", ".join(f"{lang} {tags.pieces.get(lang, '')}={i}" for lang, i in tags.ids.items()),
        ]

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
            "splits": split_counts(meta, self.read_splits),
            **({"languages": self.languages.to_dict()} if self.languages is not None else {}),
        }


class _NoSentences:
    """The empty TokenSequences a TrainData holds until its first epoch is opened."""

    sizes = np.zeros(0, dtype=np.int64)

    def __len__(self) -> int:
        return 0

    def __getitem__(self, i: int) -> np.ndarray:
        raise IndexError(i)


_NO_SENTENCES = _NoSentences()


def load_train_data(cfg: TrainConfig, epoch: int = 1) -> TrainData:
    """Read `cfg.data`: check meta.json and the tokenizers, open the training corpora
    (their shards of `epoch`) and the valid split."""
    meta = load_meta(cfg.data_dir())
    meta_json = Path(cfg.data_dir()) / "meta.json"
    if meta.special_ids != SPECIAL_IDS:
        raise NmtError(
            f"{meta_json}: special_ids {meta.special_ids} differ from nmt's {SPECIAL_IDS}; "
            "rebuild the data dir with nmt-preprocess"
        )
    check_language_options(cfg, meta)
    notes: list[str] = []
    src_tokenizer, tgt_tokenizer = checked_tokenizers(cfg, meta, notes)
    languages = language_tags(cfg, meta, src_tokenizer) if meta.multilingual else None
    m = cfg.model
    data = TrainData(
        meta=meta,
        tokenizer_bytes={"src": src_tokenizer.model_bytes, "tgt": tgt_tokenizer.model_bytes},
        corpora=_train_corpora(cfg, meta, languages),
        train=PairDataset(_NO_SENTENCES, _NO_SENTENCES),  # opened by load_epoch
        train_indices=None,
        valid_sets=[],
        max_tokens=cfg.max_tokens,
        max_sentences=cfg.max_sentences,
        seed=cfg.seed,
        max_positions=(m.max_source_positions, m.max_target_positions),
        data_dir=str(cfg.data),
        read_splits=read_splits(cfg, meta),
        languages=languages,
        temperature=cfg.sampling_temperature,
        _tgt_tokenizer=tgt_tokenizer,
    )
    if cfg.validation.split:
        for split, _, _, _ in _direction_splits(meta, cfg.validation.split, languages):
            if split not in meta.splits:
                raise option_error(
                    "validation.split",
                    cfg.validation.split,
                    f"{meta_json} has no split {split} (it has {', '.join(sorted(meta.splits))})",
                    "choose one of them, or set validation.split=null to train without validation",
                )
    data.load_epoch(epoch)
    data.notes[:0] = notes
    if cfg.subword.sampling():
        _set_up_sampling(data, cfg)
    if cfg.validation.split:
        for split, src, tgt, direction in _direction_splits(meta, cfg.validation.split, languages):
            _load_valid(data, cfg, split, src, tgt, direction)
    return data


def _direction_splits(
    meta: DataMeta, stem: str, languages: LanguageTags | None
) -> list[tuple[str, str, str, str]]:
    """(split, source language, target language, direction) of each direction of `stem`
    (a split of a single-pair data dir: itself, in the data dir's languages, direction "")."""
    if languages is None:
        return [(stem, meta.src_lang, meta.tgt_lang, "")]
    return [(*meta.direction_split(stem, d), d) for d in languages.directions]


def _train_corpora(
    cfg: TrainConfig, meta: DataMeta, languages: LanguageTags | None
) -> list[TrainCorpus]:
    """Each split of train_split (and in a multilingual data dir, each direction trained)
    as a corpus of the mix, with its weight and tags."""
    meta_json = Path(cfg.data_dir()) / "meta.json"
    corpora = []
    for stem, weight in cfg.train_weights().items():
        for split, src, tgt, direction in _direction_splits(meta, stem, languages):
            if split not in meta.splits and direction:
                raise option_error(
                    "train_split",
                    stem,
                    f"{meta_json} has no split {split}, which {direction} would read",
                    "name splits every direction has, or train the directions that have it "
                    "(directions=[...])",
                )
            if split not in meta.splits:
                raise NmtError(
                    f"train_split={stem}: {meta_json} has splits "
                    f"{sorted(meta.splits)}; choose one of them"
                )
            src_prefix: tuple[int, ...] = ()
            tgt_prefix: tuple[int, ...] = ()
            if languages is not None:
                src_prefix = tuple(languages.source_prefix(src, tgt))
                tgt_prefix = tuple(languages.target_prefix(tgt))
            shards = meta.splits[split].shard_prefixes(split)
            corpora.append(
                TrainCorpus(split, weight, shards, src, tgt, direction, src_prefix, tgt_prefix)
            )
    return corpora


def _set_up_sampling(data: TrainData, cfg: TrainConfig) -> None:
    """Subword regularization: the sampler, and the stored tokens a batch is packed to so
    that its sampled segmentations keep within max_tokens (see nmt.data.subword_sampling);
    sized on epoch 1's pairs, so that every start of the run packs the same batches."""
    from nmt.data.tokenizer import Tokenizer

    tokenizers = (
        Tokenizer(data.tokenizer_bytes["src"], name=f"{cfg.data} source tokenizer"),
        Tokenizer(data.tokenizer_bytes["tgt"], name=f"{cfg.data} target tokenizer"),
    )
    alphas = (cfg.subword.src_alpha, cfg.subword.tgt_alpha)
    data.sampler = SubwordSampler(tokenizers, alphas, cfg.subword.nbest_size, cfg.seed)
    factor = data.sampler.packing_factor(data.train, data.train_indices)
    data.packing_tokens = max(1, int(cfg.max_tokens / factor))
    sides = " and ".join(
        f"{side} alpha {alpha:g}" for side, alpha in zip(("source", "target"), alphas) if alpha
    )
    data.notes.append(
        f"train: subword sampling ({sides}, nbest {cfg.subword.nbest_size}): sampled pairs "
        f"are {factor:.2f}x longer (95th percentile), so batches are packed to "
        f"{data.packing_tokens} stored tokens to keep within max_tokens={cfg.max_tokens}"
    )


def _filter_train(
    train: PairDataset, max_tokens: int, max_positions: tuple[int, int]
) -> tuple[np.ndarray | None, list[str]]:
    """The train pairs that fit the model's positions and max_tokens (None: all), and
    notes on the rest."""
    src_max, tgt_max = max_positions
    kept = filter_by_size(
        train.src_sizes,
        train.tgt_sizes,
        max_source_positions=src_max,
        max_target_positions=tgt_max,
        max_tokens=max_tokens,
    )
    notes = [f"train: {kept.count(len(train))} of {len(train)} sentence pairs of {train.name}"]
    if kept.too_long:
        notes.append(
            f"train: skipped {kept.too_long} pairs longer than the model's "
            f"positions ({src_max}/{tgt_max})"
        )
    if kept.over_budget:
        notes.append(f"train: skipped {kept.over_budget} pairs longer than max_tokens={max_tokens}")
    if kept.count(len(train)) == 0:
        raise NmtError(
            f"{train.name}: no usable training pairs (all longer than "
            "the model's positions or max_tokens); raise max_tokens or the positions"
        )
    return kept.kept, notes


def _load_valid(
    data: TrainData, cfg: TrainConfig, split: str, src_lang: str, tgt_lang: str, direction: str
) -> None:
    """One direction's valid split (its first validation.max_pairs pairs, tagged as in
    training) must fit the model whole: its line numbers are the raw file's."""
    m = cfg.model
    info = data.meta.splits[split]
    limit = cfg.validation.max_pairs or None
    valid = load_pair_dataset(
        cfg.data_dir(),
        split,
        src_lang,
        tgt_lang,
        shards=info.shards,
        limit=limit,
        dtype=data.meta.dtype,
    )
    target_prefix: tuple[int, ...] = ()
    if data.languages is not None:
        target_prefix = tuple(data.languages.target_prefix(tgt_lang))
        valid = PairDataset(
            prefixed(valid.src, data.languages.source_prefix(src_lang, tgt_lang)),
            prefixed(valid.tgt, target_prefix),
            name=f"{valid.name} ({direction})",
            limit=limit,
        )
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
    if cfg.validation.max_pairs and info.kept > cfg.validation.max_pairs:
        data.notes.append(
            f"valid: the first {len(valid)} of {info.kept} pairs of {split} "
            f"(validation.max_pairs={cfg.validation.max_pairs})"
        )
    indices = np.arange(len(valid), dtype=np.int64)
    batches = fixed_batches(
        indices,
        valid.src_sizes,
        valid.tgt_sizes,
        max_tokens=cfg.validation.max_tokens or cfg.max_tokens,
        max_sentences=cfg.max_sentences,
    )
    bleu_indices = indices[: cfg.validation.bleu.max_sentences or len(valid)]
    data.valid_sets.append(ValidSet(direction, valid, batches, bleu_indices, target_prefix))
