"""A split of a data dir as indexable sentence pairs (memory-mapped, nothing loaded eagerly)."""

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


class PairDataset:
    """Sentence pair i = (src[i], tgt[i]); both end in EOS."""

    def __init__(self, src: TokenSequences, tgt: TokenSequences, name: str = "") -> None:
        if len(src) != len(tgt):
            raise NmtError(
                f"{name}: {len(src)} source but {len(tgt)} target sentences; "
                "rebuild the data dir with nmt-preprocess"
            )
        self.src = src
        self.tgt = tgt
        self.name = name
        self.src_sizes = np.asarray(src.sizes, dtype=np.int64)
        self.tgt_sizes = np.asarray(tgt.sizes, dtype=np.int64)

    def __len__(self) -> int:
        return len(self.src)

    def __getitem__(self, i: int) -> tuple[np.ndarray, np.ndarray]:
        return self.src[i], self.tgt[i]

    def pairs(self, indices: Sequence[int] | np.ndarray) -> list[tuple[np.ndarray, np.ndarray]]:
        return [(self.src[int(i)], self.tgt[int(i)]) for i in indices]


def load_pair_dataset(
    data_dir: str | Path, split: str, src_lang: str, tgt_lang: str
) -> PairDataset:
    """Open `<data_dir>/<split>.<lang>.{bin,idx}` for both languages."""
    from nmt.data.binarize import TokenArray

    data_dir = Path(data_dir)
    arrays = []
    for lang in (src_lang, tgt_lang):
        prefix = data_dir / f"{split}.{lang}"
        if not Path(f"{prefix}.bin").is_file() or not Path(f"{prefix}.idx").is_file():
            raise NmtError(
                f"{prefix}.bin/.idx: missing; the data dir has no {split!r} split "
                f"for {lang!r} (see {data_dir / 'meta.json'})"
            )
        arrays.append(TokenArray(str(prefix)))
    return PairDataset(arrays[0], arrays[1], name=f"{data_dir}/{split}")
