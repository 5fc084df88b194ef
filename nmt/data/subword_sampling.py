"""Subword regularization: each training batch in segmentations drawn afresh every epoch.

As OpenNMT-py's `src_subword_alpha`/`tgt_subword_alpha`, Marian's `--sentencepiece-alphas`
and Sockeye's: a sentence is seen in another segmentation of the same SentencePiece model
every epoch. Unigram models sample from their lattice (Kudo 2018: forward filtering,
backward sampling over every segmentation, the piece scores times `alpha`; or among the
`nbest_size` best ones), BPE models drop each merge with probability `alpha`
(BPE-dropout, Provilkov et al. 2020), as SentencePiece's `enable_sampling` does.

Why not SentencePiece's own sampling: since 0.2 it draws from absl's BitGen, which mixes a
random per-process salt into any seed, so its draws differ from process to process; a
resumed run or another DDP rank would draw other segmentations. The draws here come from
`random.Random`, seeded per batch from (seed, epoch, the batch's sentences): a resumed run
(which rebuilds the same batch list and skips to its position) and every rank draw what an
uninterrupted run draws. The lattice and the merges are SentencePiece's (the same pieces,
scores, unknown characters, byte fallback and user-defined symbols): without sampling they
give back SentencePiece's own segmentation, the stored ids (tests/unit/test_train_data.py).

The data dir stores ids: a stored sentence is decoded to its text with the data dir's
model, which gives back exactly the text preprocessing encoded (nmt's `normalize_text` ran
before it, SentencePiece's own normalization is the identity). A sentence holding `<unk>`
cannot be decoded faithfully: that side keeps its stored segmentation.

Batching. Batches are built from the stored lengths (so the batch list stays a cheap pure
function of lengths, seed and epoch, and start-up does not grow with the corpus), and each
batch is drawn when it is trained on. Drawn segmentations are longer (on Multi30k's 8k
unigram model about 1.03x at alpha 0.5, 1.3x at 0.2, 1.9x at 0.1), so batches are packed
to `max_tokens / packing_factor()` stored tokens, the factor being the 95th percentile of
that growth over a seeded sample of pairs; `max_tokens` then holds for the drawn batch as
it does without sampling: a pair whose draw would not fit (rows x longest side over
max_tokens, or longer than the model's positions) is drawn again, up to RETRIES times,
then keeps its stored segmentation.

Control symbols that start a sentence (a multilingual model's language tags,
nmt.data.languages) are not text: they decode to nothing, so they are kept as they are
and put back before the drawn segmentation.
"""

from __future__ import annotations

import hashlib
import heapq
import math
import random
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from nmt.data.dataset import PairDataset
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.vocab import EOS, UNK

Pair = tuple[np.ndarray, np.ndarray]

RETRIES = 4  # draws after the first for a pair that does not fit its batch
ESTIMATE_PAIRS = 1000  # pairs drawn at start-up to size the packing budget
ESTIMATE_QUANTILE = 0.95
WORD_CACHE = 1 << 18  # unigram lattices of words kept (a few KB each); cleared when full
UNK_PENALTY = 10.0  # SentencePiece's: an unknown character scores min_score - 10
SPACE = "\u2581"  # SentencePiece's whitespace mark

# SentencePiece's piece types (sentencepiece_model.proto)
NORMAL, UNKNOWN, CONTROL, USER_DEFINED, UNUSED, BYTE = 1, 2, 3, 4, 5, 6
UNIGRAM, BPE = 1, 2


@dataclass
class _Piece:
    id: int
    score: float
    type: int


class Segmenter:
    """Draws segmentations of text with one SentencePiece model (unigram or BPE): a unigram
    model with smoothing `alpha` among every segmentation (`nbest_size` -1) or among the
    `nbest_size` best; a BPE model with merge-dropout probability `alpha`."""

    def __init__(self, tokenizer: Tokenizer, alpha: float, nbest_size: int, what: str) -> None:
        from sentencepiece import sentencepiece_model_pb2

        proto = sentencepiece_model_pb2.ModelProto()  # type: ignore[attr-defined]  # protoc's
        proto.ParseFromString(tokenizer.model_bytes)
        self.tokenizer = tokenizer
        self.alpha = alpha
        self.nbest_size = nbest_size
        self.model_type = proto.trainer_spec.model_type
        spec = proto.normalizer_spec
        if self.model_type not in (UNIGRAM, BPE):
            raise NmtError(
                f"{what}: subword sampling needs a unigram or BPE SentencePiece model; "
                "preprocess with spm.model_type=unigram (or bpe)"
            )
        if not spec.escape_whitespaces or proto.trainer_spec.treat_whitespace_as_suffix:
            raise NmtError(
                f"{what}: subword sampling needs SentencePiece's default whitespace handling "
                "(escaped, as a prefix), as nmt-preprocess trains it; preprocess again"
            )
        if self.model_type == BPE and any(p.type == UNUSED for p in proto.pieces):
            raise NmtError(
                f"{what}: subword sampling does not support BPE models with unused pieces "
                "(a restricted vocabulary); preprocess again without one"
            )
        self.dummy_prefix = spec.add_dummy_prefix
        self.control_ids = {i for i, p in enumerate(proto.pieces) if p.type == CONTROL}
        # Pieces text can be cut into: normal, user-defined and (never emitted) unused ones.
        self.pieces: dict[str, _Piece] = {}
        self.byte_ids: dict[int, int] = {}
        for i, p in enumerate(proto.pieces):
            if p.type in (NORMAL, USER_DEFINED, UNUSED):
                self.pieces[p.piece] = _Piece(i, p.score, p.type)
            elif p.type == BYTE:
                self.byte_ids[int(p.piece[3:5], 16)] = i  # "<0xNN>"
        self.user_defined = sorted(
            (s for s, p in self.pieces.items() if p.type == USER_DEFINED), key=len, reverse=True
        )
        self.prefixes = {s[:k] for s in self.pieces for k in range(1, len(s) + 1)}
        normal = [p.score for p in proto.pieces if p.type == NORMAL]
        self.unk_score = min(normal, default=0.0) - UNK_PENALTY
        self.byte_fallback = proto.trainer_spec.byte_fallback and len(self.byte_ids) == 256
        self.id_scores = {p.id: self._piece_score(p, len(s)) for s, p in self.pieces.items()}
        # No piece holds a whitespace mark after its start (SentencePiece's default,
        # split_by_whitespace): then words are segmented independently of each other, and
        # a word's lattice is computed once and kept.
        self.by_word = not any(SPACE in s[1:] for s in self.pieces) and not self.user_defined
        self.word_tables: dict[str, list[list[tuple[float, int, tuple[int, ...]]]]] = {}
        self.bpe_starts: dict[
            str, tuple[list[str], list[bool], list[tuple[float, int, int, int]]]
        ] = {}

    def sample(self, text: str, rng: random.Random) -> list[int]:
        """The ids of one segmentation of `text` (normalized, as stored) drawn with `rng`."""
        if self.model_type == UNIGRAM and self.nbest_size > 1:
            return self._nbest(text, rng)
        s = self._surface(text)
        words = self._words(s) if self.by_word else [s]
        if self.model_type == BPE:
            return [i for word in words for i in self._bpe(word, rng)]
        # Backward sampling: from a word's end, a node ending there, drawn with its
        # probability; then on from that node's start. (The hot loop: kept inline.)
        backwards: list[int] = []
        tables, draw = self.word_tables, rng.random
        for word in reversed(words):
            table = tables.get(word) or self._lattice(word)
            j = len(table) - 1
            while j > 0:
                r, nodes, k = draw(), table[j], 0
                while r >= nodes[k][0]:  # the last node's cumulative is 2: it stops there
                    k += 1
                _, j, ids = nodes[k]
                backwards += ids  # (reversed, as the whole list is)
        backwards.reverse()
        return backwards

    def _surface(self, text: str) -> str:
        escaped = text.replace(" ", SPACE)
        return SPACE + escaped if self.dummy_prefix and text else escaped

    @staticmethod
    def _words(s: str) -> list[str]:
        """s cut before each whitespace mark: "▁a▁man" -> ["▁a", "▁man"]."""
        parts = s.split(SPACE)
        words = [SPACE + w for w in parts[1:]]
        return [parts[0], *words] if parts[0] else words

    def _unknown(self, chars: str) -> list[int]:
        """Ids of characters no piece covers: their UTF-8 bytes, or <unk>."""
        if not self.byte_fallback:
            return [UNK]
        return [self.byte_ids[b] for b in chars.encode("utf-8")]

    def _piece_score(self, piece: _Piece, length: int) -> float:
        # SentencePiece favours user-defined symbols so that they always win
        return 0.1 * (length - 1) if piece.type == USER_DEFINED else piece.score

    def _lattice(self, s: str) -> list[list[tuple[float, int, tuple[int, ...]]]]:
        """SentencePiece's unigram lattice of s, ready for backward sampling: for each end
        position j, the nodes ending there as (cumulative probability, start, ids
        reversed), where a node's probability is that of being the last node of a path to
        j, with paths weighted exp(alpha * score) (forward filtering). Kept per word when
        by_word."""
        table = self.word_tables.get(s)
        if table is not None:
            return table
        n = len(s)
        alpha = self.alpha
        ends: list[list[tuple[int, tuple[int, ...], float]]] = [[] for _ in range(n + 1)]
        for i in range(n):
            single = False
            for j in range(i + 1, n + 1):
                part = s[i:j]
                if part not in self.prefixes:
                    break
                piece = self.pieces.get(part)
                if piece is not None and piece.type != UNUSED:
                    ends[j].append((i, (piece.id,), alpha * self._piece_score(piece, j - i)))
                    single = single or j == i + 1
            if not single:  # an unknown character: one node, scored below every piece
                ends[i + 1].append((i, tuple(self._unknown(s[i])), alpha * self.unk_score))
        forward = [0.0] * (n + 1)  # log of the summed weights of the paths to each position
        table = [[] for _ in range(n + 1)]
        for j in range(1, n + 1):
            scores = [forward[i] + w for i, _, w in ends[j]]
            top = max(scores)
            total = sum(math.exp(x - top) for x in scores)
            forward[j] = top + math.log(total)
            acc = 0.0
            for (i, ids, _), x in zip(ends[j], scores):
                acc += math.exp(x - top) / total
                table[j].append((acc, i, ids[::-1]))  # ids reversed: sampling runs backwards
            table[j][-1] = (2.0, *table[j][-1][1:])  # rounding never runs past the last node
        if self.by_word:
            if len(self.word_tables) >= WORD_CACHE:
                self.word_tables.clear()
            self.word_tables[s] = table
        return table

    def _nbest(self, text: str, rng: random.Random) -> list[int]:
        """One of SentencePiece's `nbest_size` best segmentations (deterministic), drawn
        with probability proportional to exp(alpha * score)."""
        candidates = self.tokenizer.nbest_encode(text, self.nbest_size)
        if len(candidates) <= 1:
            return candidates[0] if candidates else []
        scores = self.id_scores
        logits = [self.alpha * sum(scores.get(i, self.unk_score) for i in c) for c in candidates]
        top = max(logits)
        weights = [math.exp(x - top) for x in logits]
        return rng.choices(candidates, weights=weights)[0]

    def _bpe_start(self, s: str) -> tuple[list[str], list[bool], list[tuple[float, int, int, int]]]:
        """BPE's starting point for s, kept per word when by_word: its symbols (user-defined
        symbols whole, the rest by character), which of them are frozen (user-defined), and
        the agenda of merges of adjacent symbols, a heap of (-score, left, right, length)."""
        start = self.bpe_starts.get(s)
        if start is not None:
            return start
        symbols: list[str] = []
        frozen: list[bool] = []
        i = 0
        while i < len(s):
            user = next((u for u in self.user_defined if s.startswith(u, i)), None)
            symbols.append(user or s[i])
            frozen.append(user is not None)
            i += len(symbols[-1])
        agenda = []
        for k in range(len(symbols) - 1):
            merged = symbols[k] + symbols[k + 1]
            piece = self.pieces.get(merged)
            if piece is not None and not (frozen[k] or frozen[k + 1]):
                agenda.append((-piece.score, k, k + 1, len(merged)))
        heapq.heapify(agenda)
        if self.by_word:
            if len(self.bpe_starts) >= WORD_CACHE:
                self.bpe_starts.clear()
            self.bpe_starts[s] = (symbols, frozen, agenda)
        return symbols, frozen, agenda

    def _bpe(self, s: str, rng: random.Random) -> list[int]:
        """SentencePiece's BPE with each merge dropped with probability alpha: the adjacent
        pair whose merge scores highest (the leftmost of equals) merges first; a dropped
        merge is gone (a new neighbour makes new pairs)."""
        dropout, pieces = self.alpha, self.pieces
        start_symbols, frozen, start_agenda = self._bpe_start(s)
        symbols = list(start_symbols)
        agenda = list(start_agenda) if dropout < 1.0 else []
        n = len(symbols)
        prev = list(range(-1, n - 1))
        nxt = list(range(1, n + 1))
        nxt[-1] = -1
        draw = rng.random
        while agenda:
            _, left, right, length = heapq.heappop(agenda)
            if not symbols[left] or not symbols[right]:
                continue
            if len(symbols[left]) + len(symbols[right]) != length:
                continue  # stale: a symbol changed since the pair was queued
            if dropout > 0.0 and draw() < dropout:
                continue
            symbols[left] += symbols[right]
            symbols[right] = ""
            nxt[left] = nxt[right]
            if nxt[right] >= 0:
                prev[nxt[right]] = left
            for a, b in ((prev[left], left), (left, nxt[left])):  # the new neighbours
                if a >= 0 and b >= 0 and not (frozen[a] or frozen[b]):
                    merged = symbols[a] + symbols[b]
                    piece = pieces.get(merged)
                    if piece is not None:
                        heapq.heappush(agenda, (-piece.score, a, b, len(merged)))
        out: list[int] = []
        for symbol in symbols:
            if symbol:
                self._emit(symbol, out)
        return out

    def _emit(self, symbol: str, out: list[int]) -> None:
        piece = self.pieces.get(symbol)
        if piece is not None:
            out.append(piece.id)
        else:
            out.extend(self._unknown(symbol))


class SubwordSampler:
    """Draws segmentations of stored sentence pairs; `alphas[s]` > 0 draws side s (0 =
    source, 1 = target), 0 keeps it as stored."""

    def __init__(
        self,
        tokenizers: tuple[Tokenizer, Tokenizer],
        alphas: tuple[float, float],
        nbest_size: int,
        seed: int,
        what: str = "the data dir",
    ) -> None:
        self.tokenizers = tokenizers
        self.alphas = alphas
        self.nbest_size = nbest_size
        self.seed = seed
        self.sides = [s for s in (0, 1) if alphas[s] > 0]
        names = ("source", "target")
        self.segmenters = {
            s: Segmenter(tokenizers[s], alphas[s], nbest_size, f"{what} ({names[s]} tokenizer)")
            for s in self.sides
        }
        self.pairs_sampled = 0  # since the start of the run
        self.pairs_kept = 0  # of them, pairs kept as stored because no draw fit

    def batch_rng(self, epoch: int, rows: np.ndarray) -> random.Random:
        """The draws of the batch of `rows` in `epoch`: the same in every process."""
        digest = hashlib.blake2b(np.asarray(rows, dtype=np.int64).tobytes(), digest_size=16)
        key = f"{self.seed}:{epoch}:{digest.hexdigest()}"
        return random.Random(key)  # a str seed is hashed with SHA-512: no PYTHONHASHSEED

    def sample(
        self,
        pairs: Sequence[Pair],
        rows: np.ndarray,
        epoch: int,
        *,
        max_tokens: int,
        max_positions: tuple[int, int],
    ) -> list[Pair]:
        """`pairs` (those of `rows` in `epoch`) in fresh segmentations, each within the
        batch's share of max_tokens and the model's positions (else as stored)."""
        share = max_tokens // max(len(pairs), 1)  # the batch costs rows x longest side
        limits = (min(share, max_positions[0]), min(share, max_positions[1]))
        out, kept = self._draw(pairs, limits, self.batch_rng(epoch, rows))
        self.pairs_sampled += len(pairs)
        self.pairs_kept += kept
        return out

    def _draw(
        self, pairs: Sequence[Pair], limits: tuple[int, int], rng: random.Random
    ) -> tuple[list[Pair], int]:
        """(the pairs with their sampled sides drawn until they fit `limits`, the number
        of pairs kept as stored because no draw fit)."""
        out: list[Pair] = list(pairs)
        texts: dict[int, list[str | None]] = {}
        tags = {s: [self._leading_controls(s, pair[s]) for pair in pairs] for s in self.sides}
        for s in self.sides:
            stored = [pair[s] for pair in pairs]
            decoded = self.tokenizers[s].decode_batch(stored)
            # <unk> hides the character it stood for: such a side stays as stored
            texts[s] = [None if (seq == UNK).any() else t for seq, t in zip(stored, decoded)]
        kept = 0
        for i, pair in enumerate(pairs):
            if all(texts[s][i] is None for s in self.sides):
                continue
            for _ in range(1 + RETRIES):
                candidate = list(pair)
                for s in self.sides:
                    text = texts[s][i]
                    if text is not None:
                        ids = self.segmenters[s].sample(text, rng)
                        candidate[s] = np.array([*tags[s][i], *ids, EOS], dtype=np.int64)
                if len(candidate[0]) <= limits[0] and len(candidate[1]) <= limits[1]:
                    out[i] = (candidate[0], candidate[1])
                    break
            else:
                kept += 1
        return out, kept

    def _leading_controls(self, side: int, seq: np.ndarray) -> list[int]:
        """The control symbols (language tags) `seq` starts with, before its text."""
        controls = self.segmenters[side].control_ids
        k = 0
        while k < len(seq) - 1 and int(seq[k]) in controls:
            k += 1
        return [int(i) for i in seq[:k]]

    def packing_factor(self, dataset: PairDataset, indices: np.ndarray | None) -> float:
        """How much longer a drawn pair is than its stored segmentation (longer side over
        longer side), at the ESTIMATE_QUANTILE of up to ESTIMATE_PAIRS pairs of `indices`
        (None: all pairs) chosen from the seed; at least 1, rounded up to 0.01. A pure
        function of the data, the seed and the sampling settings."""
        pool = np.arange(len(dataset)) if indices is None else np.asarray(indices)
        if len(pool) == 0:
            return 1.0
        rng = np.random.default_rng([self.seed, 0x5B5A])
        rows = np.sort(rng.choice(pool, size=min(ESTIMATE_PAIRS, len(pool)), replace=False))
        pairs = dataset.pairs(rows)
        unlimited = (np.iinfo(np.int64).max, np.iinfo(np.int64).max)
        drawn, _ = self._draw(pairs, unlimited, self.batch_rng(0, rows))
        before = np.array([max(len(s), len(t)) for s, t in pairs], dtype=np.float64)
        after = np.array([max(len(s), len(t)) for s, t in drawn], dtype=np.float64)
        growth = float(np.quantile(after / before, ESTIMATE_QUANTILE))
        return max(1.0, math.ceil(growth * 100.0 - 1e-9) / 100.0)
