"""Lexical constraints of a beam search: phrases (target ids) that must appear in a
translation, and phrases that must never appear.

Shape legend: N sentences still being decoded, K beam, R = N*K rows, V target vocabulary
(V' columns over a shortlist), P the most required phrases of a sentence of the batch,
E the most banned phrases, L the longest phrase, C = 2K candidates a step keeps, M the
candidates considered before that cut.

Required phrases use dynamic beam allocation (Post & Vilar, 2018), batched as in Hu et
al. (2019), with tensors only: each row tracks, per phrase, how many of its tokens end
the row's history (`progress`, as a string matcher would: a mismatch falls back to the
longest prefix of the phrase that still ends the history) and whether it has appeared
(`met`, for good); phrases are matched independently, in any order, and two may share
tokens. A row's bank is the number of constraint tokens it has produced: the lengths of
its met phrases plus the progress of the others. Each step a sentence's candidates are the plain
search's top 2K, the next token of every unmet phrase of every row and every row's best
token; duplicates go, and the rest are dealt round-robin over the banks from the
highest (the best of each bank, then the second best of each, ...), so every bank gets a
share of the beam and a bank's unused share passes on. The first 2K so ordered are the
step's candidates: the generator files EOS among the first K and continues the first K
that do not end, as without constraints. EOS is forbidden to rows with an unmet phrase
(`block_eos`), but at the length limit, where the forced EOS wins: such a hypothesis
ends with `constraints_met` False. A sentence without constraints sees the plain top 2K
in its first columns, in order (stable sorts, one bank): it decodes as without them.

The endings `block_eos` forbids are kept aside (`endings`): those the plain search would
have filed (EOS among a sentence's top K candidates, fairseq's rule) the generator files
apart, K slots per sentence, in case no hypothesis meets the phrases within the length
limit. The sentence then lists what the plain search would have listed of what was
found: those complete translations and, in the slots they left free, the ones cut off at
the limit, by score.

Banned phrases are a rule on the log-probs (`BannedPhrases`): a row whose history ends
with all of a phrase but its last token may not produce that token.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass
from typing import NamedTuple

import numpy as np
import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.generation.processors import NEG_INF
from nmt.generation.search import row_best
from nmt.generation.shortlist import BatchVocab
from nmt.vocab import BOS, EOS, PAD

NONE = -1  # padding of the phrase tensors: no token (and no id or column is negative)


@dataclass(frozen=True)
class TokenConstraints:
    """One sentence's constraints as target ids."""

    include: tuple[tuple[int, ...], ...] = ()  # target-id phrases that must appear
    exclude: tuple[tuple[int, ...], ...] = ()  # target-id phrases that must never appear

    def __bool__(self) -> bool:
        return bool(self.include or self.exclude)


def check_constraints(
    constraints: Sequence[TokenConstraints | None], vocab_size: int, where: str = "constraints"
) -> None:
    """NmtError naming the entry (`where[i]`) of a phrase that is empty or holds an id
    that is not a word of the target vocabulary (PAD, BOS, EOS, or >= vocab_size)."""
    for i, item in enumerate(constraints):
        if item is None:
            continue
        if not isinstance(item, TokenConstraints):
            raise NmtError(f"{where}[{i}]: {type(item).__name__}, not a TokenConstraints or None")
        for kind, phrases in (("include", item.include), ("exclude", item.exclude)):
            for phrase in phrases:
                if not phrase:
                    raise NmtError(f"{where}[{i}]: an empty {kind} phrase; leave it out")
                bad = [t for t in phrase if not _word_id(t, vocab_size)]
                if bad:
                    raise NmtError(
                        f"{where}[{i}]: {kind} phrase {list(phrase)} holds {bad[0]!r}, not a "
                        f"target word id (4..{vocab_size - 1}, or 3 for <unk>)"
                    )


def _word_id(token: object, vocab_size: int) -> bool:
    """An int id of a target word (or <unk>): not PAD, BOS or EOS, within the vocabulary."""
    if isinstance(token, bool) or not isinstance(token, (int, np.integer)):
        return False
    return int(token) not in (PAD, BOS, EOS) and 0 <= int(token) < vocab_size


def active(
    constraints: Sequence[TokenConstraints | None] | None, sentences: int
) -> list[TokenConstraints] | None:
    """One TokenConstraints per sentence, or None when no sentence has any (the plain
    search then runs, unchanged)."""
    if constraints is None:
        return None
    if len(constraints) != sentences:
        raise NmtError(
            f"constraints: {len(constraints)} of them for {sentences} sentences; "
            "give one entry (or None) per sentence"
        )
    if not any(constraints):
        return None
    return [c if c is not None else TokenConstraints() for c in constraints]


def required_ids(constraints: Sequence[TokenConstraints]) -> list[np.ndarray]:
    """Per sentence, the ids of its required phrases (a shortlist must hold them)."""
    return [
        np.array([t for phrase in c.include for t in phrase], dtype=np.int64) for c in constraints
    ]


def _padded(phrases: list[tuple[tuple[int, ...], ...]], right: bool = False) -> np.ndarray:
    """[N,P,L] int64 of each sentence's phrases, NONE-padded (at the left with `right`,
    so that phrases end in the last column); P and L at least 1."""
    p = max(1, max(len(ps) for ps in phrases))
    length = max(1, max((len(ph) for ps in phrases for ph in ps), default=1))
    out = np.full((len(phrases), p, length), NONE, dtype=np.int64)
    for n, ps in enumerate(phrases):
        for j, phrase in enumerate(ps):
            if right:
                out[n, j, length - len(phrase) :] = phrase
            else:
                out[n, j, : len(phrase)] = phrase
    return out


def _to_columns(ids: Tensor, vocab: BatchVocab | None) -> Tensor:
    """Target ids (NONE: none) -> the search's token columns (NONE: none, or not in the
    batch's vocabulary), same shape."""
    if vocab is None:
        return ids
    last = vocab.columns.numel() - 1
    inside = ids.ge(0) & ids.le(last)
    return torch.where(inside, vocab.columns[ids.clamp(0, last)], NONE)


def _fallbacks(phrases: np.ndarray) -> np.ndarray:
    """extends [N,P,L,L] bool: extends[..., j, k] says the phrase's first k tokens end
    its first j (k <= j), so that a row with progress j whose next token is the phrase's
    token k has progress k + 1 (k = j: the match goes on; k < j: it falls back, as
    Knuth-Morris-Pratt's failure links would)."""
    n, p, length = phrases.shape
    extends = np.zeros((n, p, length, length), dtype=bool)
    idx = np.arange(length)
    extends[:, :, idx, idx] = True  # k = j
    for shift in range(1, length):  # j - k = shift: tokens shift.. equal tokens 0..
        same = phrases[:, :, shift:] == phrases[:, :, : length - shift]  # [N,P,L-shift]
        prefix_equal = np.concatenate(
            [np.ones((n, p, 1), dtype=bool), np.cumprod(same, axis=2, dtype=bool)], axis=2
        )  # [N,P,L-shift+1]: the first k tokens equal, k = 0..L-shift
        k = np.arange(length - shift)
        extends[:, :, k + shift, k] = prefix_equal[:, :, : length - shift]
    return extends


class PhraseState(NamedTuple):
    """The required phrases' state of some rows or candidates of each sentence, [N,J,P]
    (J: K rows, or C candidates)."""

    progress: Tensor  # [N,J,P] long: tokens of the phrase that end the history
    met: Tensor  # [N,J,P] bool: the phrase has appeared (padding phrases: always)

    def complete(self) -> Tensor:
        """[N,J] bool: every phrase met."""
        return self.met.all(dim=2)

    def take(self, index: Tensor) -> PhraseState:
        """The states of columns index [N,J'] of each sentence."""
        index = index.unsqueeze(2).expand(-1, -1, self.met.size(2))  # [N,J',P]
        return PhraseState(self.progress.gather(1, index), self.met.gather(1, index))


class Endings(NamedTuple):
    """The endings (EOS) `block_eos` forbade at one step, per sentence [N,K] best first."""

    scores: Tensor  # [N,K] cumulative log-probs, EOS included (-inf: none)
    lprobs: Tensor  # [N,K] the EOS log-prob (the model's, before block_eos)
    origins: Tensor  # [N,K] the row (0..K-1) each ends
    eligible: Tensor  # [N,K] bool: among the sentence's top K candidates, had EOS been free


class RequiredPhrases:
    """The required phrases of one batch and their state in each row (module docstring)."""

    def __init__(
        self,
        phrases: Tensor,
        lengths: Tensor,
        extends: Tensor,
        beam: int,
        most: int,
        sentences: list[bool],
    ):
        self.sentences = sentences  # which of the batch's sentences have phrases (host)
        self.phrases = phrases  # [N,P,L] long columns, NONE-padded (a row of NONE: none)
        self.lengths = lengths  # [N,P] long, 0 for padding
        self.extends = extends  # [N,P,L,L] bool: see _fallbacks
        self.beam = beam
        self.most = most  # the largest bank of any sentence: its phrases' total length
        n, p = lengths.shape
        self.rows = PhraseState(  # [N,K,P] each
            torch.zeros(n, beam, p, dtype=torch.long, device=lengths.device),
            lengths.eq(0).unsqueeze(1).expand(n, beam, p).clone(),
        )
        # [R] the EOS log-probs block_eos took away at the current step (-inf: none)
        self.blocked = torch.full((n * beam,), NEG_INF, device=lengths.device)

    @classmethod
    def of(
        cls,
        constraints: Sequence[TokenConstraints],
        beam: int,
        vocab: BatchVocab | None,
        device: torch.device,
    ) -> RequiredPhrases | None:
        """The batch's required phrases (None when no sentence has one); with a
        shortlist `vocab`, which must hold their ids (required_ids)."""
        include = [c.include for c in constraints]
        if not any(include):
            return None
        ids = _padded(include)  # [N,P,L]
        lengths = torch.from_numpy((ids != NONE).sum(axis=2)).to(device)  # [N,P]
        extends = torch.from_numpy(_fallbacks(ids)).to(device)
        phrases = _to_columns(torch.from_numpy(ids).to(device), vocab)
        most = max(sum(len(ph) for ph in ps) for ps in include)
        return cls(phrases, lengths, extends, beam, most, [bool(ps) for ps in include])

    def block_eos(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        """A rule (processors.py): no EOS for rows lprobs [R,V] with an unmet phrase."""
        unmet = ~self.rows.complete().view(-1)  # [R]
        eos = lprobs[:, EOS]  # [R] a view: the earlier rules applied (min length, ...)
        self.blocked = torch.where(unmet, eos, NEG_INF)  # kept before the mask (endings)
        eos.masked_fill_(unmet, NEG_INF)

    def endings(self, scores: Tensor, plain_scores: Tensor) -> Endings:
        """The endings block_eos forbade at this step: scores [N,K] of the rows,
        plain_scores [N,C] the step's plain candidates (beam_candidates, best first, EOS
        forbidden). An ending is eligible where the plain search with EOS free would
        have filed it: fewer than K candidates (plain ones or other endings) before it."""
        n, k = scores.shape
        ends, origins = (scores + self.blocked.view(n, k)).sort(
            dim=1, descending=True, stable=True
        )  # [N,K] each
        lprobs = self.blocked.view(n, k).gather(1, origins)
        before = plain_scores.unsqueeze(1).gt(ends.unsqueeze(2)).sum(dim=2)  # [N,K]
        before += torch.arange(k, device=scores.device)  # the better endings
        return Endings(ends, lprobs, origins, before.lt(k) & ends.gt(NEG_INF))

    def advance(self, origins: Tensor, tokens: Tensor) -> PhraseState:
        """The state of each candidate [N,M]: row origins [N,M] (0..K-1) followed by
        token columns tokens [N,M]."""
        n, p, length = self.phrases.shape
        before = self.rows.take(origins)  # [N,M,P]
        at = before.progress.clamp(max=length - 1)  # [N,M,P] (a met phrase's is unused)
        sent = torch.arange(n, device=origins.device).view(n, 1, 1)
        phrase = torch.arange(p, device=origins.device).view(1, 1, p)
        extends = self.extends[sent, phrase, at]  # [N,M,P,L]
        hits = extends & self.phrases.unsqueeze(1).eq(tokens.view(n, -1, 1, 1))  # [N,M,P,L]
        step = torch.arange(1, length + 1, device=origins.device)  # [L]
        progress = (hits * step).amax(dim=3)  # [N,M,P]: 0 when nothing matches
        met = before.met | progress.eq(self.lengths.unsqueeze(1))  # [N,M,P]
        return PhraseState(torch.where(before.met, before.progress, progress), met)

    def bank(self, state: PhraseState) -> Tensor:
        """[N,J] long: the constraint tokens produced (met lengths + others' progress)."""
        lengths = self.lengths.unsqueeze(1)  # [N,1,P]
        return torch.where(state.met, lengths, state.progress).sum(dim=2)

    def candidates(
        self, lprobs: Tensor, scores: Tensor, plain: tuple[Tensor, Tensor, Tensor]
    ) -> tuple[tuple[Tensor, Tensor, Tensor], PhraseState]:
        """A step's candidates with beam allocation: lprobs [N,K,V] (the rules applied),
        scores [N,K] of the rows, plain = (scores, tokens, origins) [N,C] of the plain
        search (beam_candidates). Returns (scores, tokens, origins) [N,C] and the
        candidates' phrase states [N,C,P]."""
        n, k, v = lprobs.shape
        p = self.phrases.size(1)
        plain_scores, plain_tokens, plain_origins = plain
        c = plain_scores.size(1)
        device = lprobs.device
        beams = torch.arange(k, device=device)  # [K]
        # each row's next token of each unmet phrase
        sent = torch.arange(n, device=device).view(n, 1, 1)
        at = self.rows.progress.clamp(max=self.phrases.size(2) - 1)  # [N,K,P]
        wanted = self.phrases[sent, torch.arange(p, device=device).view(1, 1, p), at]  # [N,K,P]
        wanted = wanted.masked_fill(self.rows.met, PAD)  # (PAD: any column, scored -inf)
        wanted_scores = (scores.unsqueeze(2) + lprobs.gather(2, wanted)).masked_fill(
            self.rows.met, NEG_INF
        )  # [N,K,P]
        best_lprobs, best_tokens = row_best(lprobs)  # [N,K] each row's best token
        all_scores = torch.cat(
            [plain_scores, wanted_scores.view(n, k * p), scores + best_lprobs], dim=1
        )  # [N,M]
        all_tokens = torch.cat([plain_tokens, wanted.view(n, k * p), best_tokens], dim=1)
        all_origins = torch.cat(
            [plain_origins, beams.repeat_interleave(p).expand(n, -1), beams.expand(n, -1)], dim=1
        )  # [N,M]
        repeats = _repeats(all_origins * v + all_tokens)  # [N,M]
        all_scores = all_scores.masked_fill(repeats, NEG_INF)  # each (row, token) once
        valid = all_scores.gt(NEG_INF)  # [N,M]
        state = self.advance(all_origins, all_tokens)  # [N,M,P]
        order = self._allocate(all_scores, self.bank(state), valid)[:, :c]  # [N,C]
        picked = (all_scores.gather(1, order), all_tokens.gather(1, order))
        return (*picked, all_origins.gather(1, order)), state.take(order)

    def _allocate(self, scores: Tensor, bank: Tensor, valid: Tensor) -> Tensor:
        """[N,M] candidate columns in the order the beam takes them: valid ones first,
        round-robin over the banks from the highest, each bank's best first; ties keep
        column order (stable sorts). scores, bank [N,M], valid [N,M] bool: the finite
        scores."""
        m = scores.size(1)
        by_score = scores.argsort(dim=1, descending=True, stable=True)
        by_bank = bank.gather(1, by_score).argsort(dim=1, descending=True, stable=True)
        order = by_score.gather(1, by_bank)  # [N,M] grouped by bank, best first within
        bank = bank.gather(1, order)
        column = torch.arange(m, device=scores.device).expand_as(bank)  # [N,M]
        starts = torch.ones_like(valid)
        starts[:, 1:] = bank[:, 1:].ne(bank[:, :-1])  # [N,M] first of its bank
        rank = column - torch.where(starts, column, 0).cummax(dim=1).values  # [N,M] in its bank
        span = self.most + 1  # banks are 0..most
        key = rank * span + (self.most - bank)  # the stripe: rank, then the higher bank
        key = key + (~valid.gather(1, order)).long() * (m * span)  # invalid ones last
        return order.gather(1, key.argsort(dim=1, stable=True))

    def follow(self, rows: PhraseState, kept: Tensor | None) -> None:
        """The continuing rows' states rows [N,K,P]; kept [N']: the sentences that stay
        (None: all of them)."""
        if kept is not None:
            rows = PhraseState(rows.progress[kept], rows.met[kept])
            self.phrases, self.lengths = self.phrases[kept], self.lengths[kept]
            self.extends = self.extends[kept]
        self.rows = rows


def _repeats(keys: Tensor) -> Tensor:
    """[N,M] bool: the key already occurs in an earlier column of its row. keys [N,M]."""
    ordered, where = keys.sort(dim=1, stable=True)  # equal keys keep column order
    again = torch.zeros_like(where, dtype=torch.bool)
    again[:, 1:] = ordered[:, 1:].eq(ordered[:, :-1])
    return torch.zeros_like(again).scatter_(1, where, again)


class BannedPhrases:
    """A rule (processors.py) for one batch: no row may complete a banned phrase of its
    sentence (a one-token phrase: that token is never produced)."""

    def __init__(self, phrases: Tensor, beam: int):
        self.phrases = phrases  # [N,E,L] long columns, right-aligned, NONE-padded at the left
        self.beam = beam

    @classmethod
    def of(
        cls,
        constraints: Sequence[TokenConstraints],
        beam: int,
        vocab: BatchVocab | None,
        device: torch.device,
    ) -> BannedPhrases | None:
        """The batch's banned phrases (None when no sentence has one). A phrase with a
        token outside the shortlist `vocab` cannot appear: it is left out."""
        exclude = [c.exclude for c in constraints]
        if not any(exclude):
            return None
        ids = torch.from_numpy(_padded(exclude, right=True)).to(device)  # [N,E,L]
        phrases = _to_columns(ids, vocab)
        missing = (ids.ne(NONE) & phrases.eq(NONE)).any(dim=2, keepdim=True)  # [N,E,1]
        return cls(phrases.masked_fill(missing, NONE), beam)

    def keep(self, kept: Tensor) -> None:
        """Only the sentences `kept` [N'] stay in the batch."""
        self.phrases = self.phrases[kept]

    def __call__(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        """-inf, in place, on lprobs [R,V] for each row's token that would complete a
        banned phrase; tokens [R,1+t] the decoder input (EOS, then the history)."""
        n, e, length = self.phrases.shape
        rows = lprobs.size(0)
        last = self.phrases[:, :, -1].unsqueeze(1)  # [N,1,E]
        head = self.phrases[:, :, :-1].unsqueeze(1)  # [N,1,E,L-1]
        history = tokens[:, 1:]  # [R,t]
        gap = length - 1 - history.size(1)
        if gap > 0:  # fewer tokens than a phrase's head: no real token matches the gap
            history = torch.cat([history.new_full((rows, gap), NONE - 1), history], dim=1)
        recent = history[:, history.size(1) - (length - 1) :].view(n, self.beam, 1, length - 1)
        ends = (head.eq(recent) | head.eq(NONE)).all(dim=3)  # [N,K,E]: the head ends the row
        hit = (ends & last.ge(0)).view(rows, e)  # [R,E]
        columns = last.expand(n, self.beam, e).reshape(rows, e).clamp(min=0)  # [R,E]
        # -inf where a phrase ends, +inf (no change) elsewhere; a column written twice
        # gets the smallest value, so the order of the writes does not matter
        values = torch.full((rows, e), math.inf, device=lprobs.device).masked_fill_(hit, NEG_INF)
        lprobs.scatter_reduce_(1, columns, values, reduce="amin")
