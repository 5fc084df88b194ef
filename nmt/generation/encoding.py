"""Between text and the model: source/target ids, length-sorted batches, padding, pieces
and hard alignments. Shared by the Translator and nmt-generate's streaming job.

Shape legend: B sentences in a batch, S longest ids of the batch, T target tokens
(EOS included).
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence

import numpy as np
import sentencepiece as spm
import torch

from nmt.data.batching import pack
from nmt.data.tokenizer import Tokenizer, normalize_text
from nmt.errors import NmtError
from nmt.generation.generator import Hypothesis
from nmt.vocab import EOS, PAD

log = logging.getLogger("nmt.generation")


class TextEncoder:
    """Raw text -> ids as the model was trained on them: the normalization preprocess
    applied, SentencePiece, EOS; over-long ids are cut to the model's positions with a
    warning (overlong="truncate") or refused (overlong="error").

    `where` names the input in messages (`where:line: ...`); `warn` receives warnings
    (default: the "nmt.generation" logger).
    """

    def __init__(
        self,
        tokenizer: Tokenizer,
        nfkc: bool,
        max_positions: int,
        overlong: str,
        where: str,
        warn: Callable[[str], None] | None = None,
    ):
        self.tokenizer = tokenizer
        self.nfkc = nfkc
        self.max_positions = max_positions  # tokens the model accepts, EOS included
        self.overlong = overlong
        self.where = where
        self.warn = warn if warn is not None else log.warning

    def normalize(self, lines: Sequence[str]) -> list[str]:
        """The lines as preprocessing normalized its text (whitespace, optional NFKC)."""
        return [normalize_text(line, self.nfkc) for line in lines]

    def to_ids(self, texts: Sequence[str]) -> list[np.ndarray]:
        """int64 ids of normalized texts, each ending in EOS; an empty line gives []."""
        encoded = self.tokenizer.encode_batch(texts)
        return [
            np.asarray(ids + [EOS], dtype=np.int64) if text else np.zeros(0, np.int64)
            for text, ids in zip(texts, encoded)
        ]

    def fit(self, ids: np.ndarray, index: int) -> np.ndarray:
        """Cut ids (EOS included) to the model's positions, warning or failing; `index`
        is the 0-based line number for the message."""
        if len(ids) <= self.max_positions:
            return ids
        message = (
            f"{self.where}:{index + 1}: {len(ids)} tokens, the model accepts {self.max_positions}"
        )
        if self.overlong == "error":
            raise NmtError(f"{message}; shorten the line or set overlong=truncate")
        self.warn(
            f"{message}; truncated to its first {self.max_positions - 1} tokens "
            "(overlong=error refuses such lines)"
        )
        return np.concatenate([ids[: self.max_positions - 1], ids[-1:]])


def length_batches(lengths: np.ndarray, max_tokens: int, max_sentences: int) -> list[np.ndarray]:
    """Indices of the non-empty entries (lengths [n] > 0), longest first (ties in input
    order), packed into batches of at most max_sentences and max_tokens padded tokens
    (sentences x longest; 0 = no token limit). A batch's translations never depend on
    its composition, so the packing only decides speed."""
    todo = np.flatnonzero(lengths)
    if not len(todo):
        return []
    order = todo[np.argsort(-lengths[todo], kind="stable")]
    budget = max_tokens if max_tokens > 0 else np.iinfo(np.int64).max
    return pack(order, lengths, max_tokens=budget, max_sentences=max_sentences)


def pad_batch(rows: Sequence[np.ndarray], device: torch.device) -> torch.Tensor:
    """Right-padded ids [B,S] (S = the longest row, at least 1)."""
    longest = max(1, max(len(r) for r in rows))
    out = np.full((len(rows), longest), PAD, dtype=np.int64)
    for i, r in enumerate(rows):
        out[i, : len(r)] = r
    return torch.from_numpy(out).to(device)


class PieceNames:
    """SentencePiece ids -> piece strings (fairseq's H- lines show pieces)."""

    def __init__(self, tokenizer: Tokenizer):
        self._sp = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)

    def __call__(self, ids: Sequence[int]) -> list[str]:
        return list(self._sp.id_to_piece(list(ids))) if len(ids) else []


def target_ids(hyp: Hypothesis) -> list[int]:
    """The hypothesis' token ids without the final EOS."""
    return [t for t in hyp.tokens.tolist() if t != EOS]


def alignment_pairs(hyp: Hypothesis, src_len: int) -> list[tuple[int, int]]:
    """(source position, target position) pairs: each target token (EOS excluded) with
    the source token (EOS excluded) it attends to most. src_len counts the source's EOS."""
    if hyp.attention is None or src_len <= 1 or len(hyp.tokens) <= 1:
        return []
    attn = hyp.attention[: len(hyp.tokens) - 1, : src_len - 1]  # [T-1, S-1]
    return [(s, t) for t, s in enumerate(attn.argmax(dim=1).tolist())]
