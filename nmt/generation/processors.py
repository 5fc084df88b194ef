"""The search's rules as small logit processors, each with one job, applied in one place.

Shape legend: R decoder rows (sentences x beam, sentence-major), V target vocabulary,
t tokens generated so far, C sampling candidates per row.

Three stages, in the order the generator meets them at every step:
1. `Temperature` divides each model's logits before its log-softmax.
2. `LogitProcessors(lprobs, step, tokens, forced, batch_rules)` edits the ensemble's
   log-probs [R,V] in place: the rules (never PAD/BOS, unk penalty, min length, no
   repeated n-grams) run in order, then the batch's own (its constraints: constraints.py),
   then `ForcedTokens` (target prefixes, EOS at the length limit) overrides them for the
   rows it pins, with the model's own log-prob of the pinned token.
3. Sampling draws among `top_k` candidates, cut further by `top_p` (search.py).

A rule is any callable `(lprobs [R,V], step, tokens [R,1+t]) -> None` editing lprobs in
place; `tokens` is the decoder input so far (the leading EOS, then the generated tokens).
Rules allocate nothing per step beyond what their own masking needs, and none of them
reads a value back from the device; nor does the pinning of forced tokens on a GPU
(`Pinned`), which works on every row instead of first finding the pinned ones.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import NamedTuple

import torch
from torch import Tensor

from nmt.generation.config import SearchConfig
from nmt.vocab import BOS, EOS, PAD, UNK

NEG_INF = -math.inf

Rule = Callable[[Tensor, int, Tensor], None]


class Temperature:
    """logits / temperature (< 1 sharper, > 1 flatter), in place: the logits are the
    step's own tensor, and a fresh [R,V] one per step costs page faults on a CPU."""

    def __init__(self, temperature: float):
        self.temperature = temperature

    def __call__(self, logits: Tensor) -> Tensor:
        return logits.div_(self.temperature)


class NeverGenerate:
    """Tokens no hypothesis may produce (PAD and BOS: they are not words)."""

    def __init__(self, ids: Sequence[int] = (PAD, BOS)):
        self.ids = tuple(ids)

    def __call__(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        for i in self.ids:
            lprobs[:, i] = NEG_INF


class UnkPenalty:
    """Subtract `penalty` from <unk>'s log-prob (positive: fewer <unk> in the output)."""

    def __init__(self, penalty: float):
        self.penalty = penalty

    def __call__(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        lprobs[:, UNK] -= self.penalty


class MinLength:
    """No EOS before `min_len` tokens have been generated."""

    def __init__(self, min_len: int):
        self.min_len = min_len

    def __call__(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        if step < self.min_len:
            lprobs[:, EOS] = NEG_INF


class NoRepeatNgram:
    """No row may repeat an n-gram it has already generated."""

    def __init__(self, n: int):
        self.n = n

    def __call__(self, lprobs: Tensor, step: int, tokens: Tensor) -> None:
        block_repeated_ngrams(tokens[:, 1:], lprobs, self.n)


def block_repeated_ngrams(history: Tensor, lprobs: Tensor, n: int) -> Tensor:
    """Forbid (-inf, in place) every token that would repeat an n-gram of its row.

    history [R,t] holds the tokens generated so far (without the leading EOS), lprobs
    [R,V] the next-token log-probabilities of the same rows.
    """
    rows, t = history.shape
    if n <= 0 or t < n:  # no complete n-gram yet, nothing can repeat
        return lprobs
    vocab = lprobs.size(1)
    windows = history.unfold(1, n, 1)  # [R, t-n+1, n]: every n-gram of the row
    suffix = history[:, t - n + 1 :]  # [R, n-1]: what the next token would extend
    match = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=2)  # [R, t-n+1]
    # Banned next tokens; non-matching windows point at a spare column V that is dropped.
    banned = torch.where(match, windows[:, :, -1], vocab)  # [R, t-n+1]
    mask = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=lprobs.device)
    mask.scatter_(1, banned, True)
    return lprobs.masked_fill_(mask[:, :vocab], NEG_INF)


class Pinned(NamedTuple):
    """The rows a step pins to one token each.

    On a CPU, `rows` [F] lists them and `tokens` [F] holds their tokens. On a GPU listing
    them would wait for the device (their number sets a shape), so `rows` is None and
    `tokens` [R] covers every row, -1 for the free ones.
    """

    rows: Tensor | None
    tokens: Tensor


class ForcedTokens:
    """The tokens rows must produce, for one batch: each sentence's target prefix while it
    lasts, and EOS once a row reaches its sentence's length limit (EOS wins).

    prefix [N,P] is right-padded with PAD (a row of PAD: no prefix), max_lens [N] the
    longest output of each sentence (tokens before EOS); each sentence has `beam` rows.
    `min_max`: max_lens.min(), when the caller has it on the host already.
    """

    def __init__(
        self, prefix: Tensor | None, max_lens: Tensor, beam: int, min_max: int | None = None
    ):
        if prefix is not None and (prefix.eq(EOS) | prefix.eq(BOS)).any():
            raise ValueError("prefix_tokens must not contain EOS or BOS")
        self.prefix = prefix
        self.beam = beam
        self.row_max = max_lens.repeat_interleave(beam)  # [R]
        # no row is at its limit before this step
        self.min_max = int(max_lens.min()) if min_max is None else min_max

    def keep(self, kept: Tensor, max_lens: Tensor, min_max: int | None = None) -> None:
        """Only the sentences `kept` [N'] stay in the batch; max_lens [N'] are theirs (and
        `min_max` their minimum, when the caller has it on the host)."""
        self.row_max = self.row_max.view(-1, self.beam)[kept].view(-1)
        self.prefix = None if self.prefix is None else self.prefix[kept]
        self.min_max = int(max_lens.min()) if min_max is None else min_max

    def at(self, step: int) -> Pinned | None:
        """The rows pinned at this step, or None when every row is surely free."""
        prefix = self.prefix if self.prefix is not None and step < self.prefix.size(1) else None
        if prefix is None and step < self.min_max:
            return None
        forced = torch.full_like(self.row_max, -1)  # [R], -1 = free
        if prefix is not None:
            col = prefix[:, step].repeat_interleave(self.beam)  # [R]
            forced = torch.where(col.eq(PAD), forced, col)
        if step >= self.min_max:
            forced = torch.where(self.row_max.le(step), EOS, forced)
        if forced.device.type != "cpu":
            return Pinned(rows=None, tokens=forced)
        rows = forced.ge(0).nonzero().squeeze(1)
        return Pinned(rows=rows, tokens=forced[rows]) if rows.numel() else None


class LogitProcessors:
    """Every rule of a search, applied in one call per step (see the module docstring)."""

    def __init__(self, rules: Sequence[Rule], temperature: float = 1.0):
        self.rules = list(rules)
        self.temperature = Temperature(temperature) if temperature != 1.0 else None

    @classmethod
    def from_search(cls, search: SearchConfig) -> LogitProcessors:
        """The rules that `search` switches on, in fairseq's order."""
        rules: list[Rule] = [NeverGenerate((PAD, BOS))]
        if search.unkpen:
            rules.append(UnkPenalty(search.unkpen))
        if search.min_len:
            rules.append(MinLength(search.min_len))
        if search.no_repeat_ngram_size:
            rules.append(NoRepeatNgram(search.no_repeat_ngram_size))
        return cls(rules, search.temperature)

    def log_probs(self, logits: Tensor) -> Tensor:
        """One model's logits [R,V] (float32, the step's own tensor) -> log-probs, in place."""
        if self.temperature is not None:
            logits = self.temperature(logits)
        return torch.log_softmax(logits, dim=-1, out=logits)

    def __call__(
        self,
        lprobs: Tensor,
        step: int,
        tokens: Tensor,
        forced: ForcedTokens | None = None,
        batch_rules: Sequence[Rule] = (),
    ) -> None:
        """Apply the rules to lprobs [R,V] in place, then the batch's own `batch_rules`
        (its constraints), then pin the forced rows."""
        rules = self.rules if not batch_rules else [*self.rules, *batch_rules]
        pinned = None if forced is None else forced.at(step)
        if pinned is None:
            for rule in rules:
                rule(lprobs, step, tokens)
            return
        if pinned.rows is not None:  # the pinned rows listed
            rows, pinned_tokens = pinned.rows, pinned.tokens
            own = lprobs[rows, pinned_tokens]  # the model's own log-prob, before any rule
            for rule in rules:
                rule(lprobs, step, tokens)
            lprobs[rows] = NEG_INF  # a pinned row may produce its token only
            lprobs[rows, pinned_tokens] = own
            return
        # Every row, the free ones (-1) unchanged: nothing read back from the device.
        free = pinned.tokens.lt(0).unsqueeze(1)  # [R,1]
        column = pinned.tokens.clamp(min=0).unsqueeze(1)  # [R,1]
        own = lprobs.gather(1, column)  # [R,1] before any rule
        for rule in rules:
            rule(lprobs, step, tokens)
        after = lprobs.gather(1, column)  # what the rules left (kept for free rows)
        lprobs.masked_fill_(~free, NEG_INF)
        lprobs.scatter_(1, column, torch.where(free, after, own))


def top_k(lprobs: Tensor, k: int) -> tuple[Tensor, Tensor]:
    """Sampling candidates: the k most likely tokens of each row (0 = all of them), best
    first. lprobs [R,V] -> (lprobs [R,C], token ids [R,C])."""
    if k > 0:
        return lprobs.topk(min(k, lprobs.size(1)), dim=1)
    return lprobs.sort(dim=1, descending=True)


def top_p(probs: Tensor, p: float) -> Tensor:
    """Nucleus sampling on candidates sorted best first, probs [R,C]: keep a candidate
    while the mass before it is below p (so the first always stays); the others get 0."""
    if p >= 1.0:
        return probs
    before = probs.cumsum(dim=1) - probs
    return probs.masked_fill(before >= p, 0.0)
