"""A split of a data dir as indexable sentence pairs (memory-mapped, nothing loaded eagerly).

A split may be stored in shards (see nmt.data.meta, `SplitInfo.shards`); `load_pair_dataset`
opens one shard, or all of them as one dataset, and `ConcatSequences` puts several
sequences (shards, or the corpora of a weighted mix) end to end.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Protocol

import numpy as np

from nmt.errors import NmtError


class TokenSequences(Protocol):
    """What nmt.data.binarize.TokenArray provides (and what tests may stand in with)."""

    @property
    def sizes(self) -> np.ndarray: ...  # int64 lengths, eos included

    def __len__(self) -> int: ...

    def __getitem__(self, i: int) -> np.ndarray: ...


def compact_lengths(seqs: TokenSequences, limit: int | None = None) -> np.ndarray:
    """Lengths of the first `limit` sequences (None: all) in the smallest unsigned dtype."""
    n = len(seqs) if limit is None else min(limit, len(seqs))
    lengths = getattr(seqs, "lengths", None)
    if lengths is not None:
        return lengths(n)
    sizes = np.asarray(seqs.sizes)[:n]
    return sizes.astype(np.min_scalar_type(int(sizes.max(initial=0))))


class ConcatSequences:
    """Several token sequences end to end: item i of part k is item offsets[k] + i."""

    def __init__(self, parts: Sequence[TokenSequences]) -> None:
        self.parts = list(parts)
        self.offsets = np.cumsum([0] + [len(p) for p in self.parts])  # int64, parts + 1

    def __len__(self) -> int:
        return int(self.offsets[-1])

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sentence {i} out of range for {n} sentences")
        k = int(np.searchsorted(self.offsets, i, side="right")) - 1
        return self.parts[k][i - int(self.offsets[k])]

    @property
    def sizes(self) -> np.ndarray:
        return np.concatenate([np.asarray(p.sizes, dtype=np.int64) for p in self.parts])

    def lengths(self, limit: int | None = None) -> np.ndarray:
        n = len(self) if limit is None else min(limit, len(self))
        parts = []
        for k, part in enumerate(self.parts):
            take = min(len(part), n - int(self.offsets[k]))
            if take <= 0:
                break
            parts.append(compact_lengths(part, take))
        if not parts:
            return np.zeros(0, dtype=np.uint8)
        return np.concatenate(parts).astype(np.result_type(*parts), copy=False)


class PrefixedSequences:
    """Token sequences with the same ids put before each one (a multilingual model's language
    tags, nmt.data.languages): item i is prefix + seqs[i], its size seqs' + len(prefix), so
    that batching and size limits see the sequences as the model does."""

    def __init__(self, seqs: TokenSequences, prefix: Sequence[int]) -> None:
        self.seqs = seqs
        self.prefix = np.asarray(prefix, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.seqs)

    def __getitem__(self, i: int) -> np.ndarray:
        return np.concatenate([self.prefix, self.seqs[i]])

    @property
    def sizes(self) -> np.ndarray:
        return np.asarray(self.seqs.sizes, dtype=np.int64) + len(self.prefix)

    def lengths(self, limit: int | None = None) -> np.ndarray:
        lengths = compact_lengths(self.seqs, limit)
        longest = int(lengths.max(initial=0)) + len(self.prefix)
        return lengths.astype(np.min_scalar_type(longest)) + len(self.prefix)


def prefixed(seqs: TokenSequences, prefix: Sequence[int]) -> TokenSequences:
    """`seqs` with `prefix` before each sequence (`seqs` itself when the prefix is empty)."""
    return PrefixedSequences(seqs, prefix) if len(prefix) else seqs


class PairDataset:
    """Sentence pair i = (src[i], tgt[i]); both end in EOS. With `limit`, only the first
    `limit` pairs (a bounded validation set)."""

    def __init__(
        self, src: TokenSequences, tgt: TokenSequences, name: str = "", limit: int | None = None
    ) -> None:
        if len(src) != len(tgt):
            raise NmtError(
                f"{name}: {len(src)} source but {len(tgt)} target sentences; "
                "rebuild the data dir with nmt-preprocess"
            )
        self.src = src
        self.tgt = tgt
        self.name = name
        # compact (uint8/uint16) lengths: 2-4 bytes a pair, read without loading the data
        self.src_sizes = compact_lengths(src, limit)
        self.tgt_sizes = compact_lengths(tgt, limit)

    def __len__(self) -> int:
        return len(self.src_sizes)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def pairs(self, indices: Sequence[int] | np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self.src[int(i)], self.tgt[int(i)]) for i in indices]


def open_side(data_dir: str | Path, prefix: str, lang: str, split: str, dtype: str | None = None):
    """The TokenArray `<data_dir>/<prefix>.<lang>.{bin,idx}` (`dtype`: meta.json's);
    NmtError naming the split."""
    from nmt.data.binarize import TokenArray

    path = Path(data_dir) / f"{prefix}.{lang}"
    if not Path(f"{path}.bin").is_file() or not Path(f"{path}.idx").is_file():
        raise NmtError(
            f"{path}.bin/.idx: missing; the data dir has no {split!r} split "
            f"for {lang!r} (see {Path(data_dir) / 'meta.json'})"
        )
    return TokenArray(str(path), dtype)


def load_pair_dataset(
    data_dir: str | Path,
    split: str,
    src_lang: str,
    tgt_lang: str,
    *,
    shards: Sequence[str] = (),
    limit: int | None = None,
    dtype: str | None = None,
) -> PairDataset:
    """Open `<data_dir>/<split>.<lang>.{bin,idx}` for both languages; for a sharded split,
    `shards` names the shards' file prefixes (nmt.data.meta.shard_prefixes), opened end to
    end. `limit`: only the first `limit` pairs; `dtype`: meta.json's."""
    prefixes = list(shards) or [split]
    sides = []
    for lang in (src_lang, tgt_lang):
        arrays = [open_side(data_dir, prefix, lang, split, dtype) for prefix in prefixes]
        sides.append(arrays[0] if len(arrays) == 1 else ConcatSequences(arrays))
    return PairDataset(sides[0], sides[1], name=f"{data_dir}/{split}", limit=limit)
