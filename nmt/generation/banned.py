"""Exclude phrases as the target-id phrases the search bans (Translator.constraint_ids).

A translation may write a word in any pieces that spell it ("▁Man" "n" as well as the
tokenizer's "▁Mann"), so an exclude phrase is banned in every spelling the target
vocabulary allows (Tokenizer.segmentations) of two forms of its normalized text:

- where it starts a word, "▁Mann" (after a space, or as a translation's first word);
- glued to what precedes it, "Mann": after "(" or a quote ("▁(" "Mann"), or as a
  translation's first piece written without the word-start mark (a barely trained
  model does that; the search cannot see where a translation starts, so this form is
  banned everywhere);

and the byte pieces of each of its characters that has a piece of its own are banned
anywhere (Tokenizer.byte_spellings: the tokenizer never writes them, a model may).
SentencePiece keeps letters and punctuation in separate pieces, so a word that stands
alone in a translation (no letter or digit on either side) starts and ends between two
pieces or right after a word start's "▁": the phrase, if its spellings are all banned,
never appears so.

What else the bans do: the search bans a phrase's last piece after the others, and
pieces do not say where a word ends, so a longer word written through the same pieces
is banned too ("▁Mann" "er" for "Manner", while "▁Man" "ner" stays allowed), and the
glued form bans the word inside longer words written through it ("▁Schnee" "Mann"):
the translation uses another spelling or another word. A phrase with more than
`EXCLUDE_SPELLINGS` spellings (the count grows exponentially with a word's length; long
compounds have thousands) has the tokenizer's spelling and those with the fewest pieces
banned (`Banned.complete` is False): a model trained on the tokenizer's spellings writes
a word in few pieces. The search's cost grows with the number of banned phrases.
"""

from __future__ import annotations

import heapq
from collections.abc import Sequence
from dataclasses import dataclass

from nmt.data.tokenizer import Tokenizer

EXCLUDE_SPELLINGS = 128  # the most spellings banned of an exclude phrase (both forms)


@dataclass(frozen=True)
class Banned:
    """The id phrases the search bans for one exclude phrase."""

    spellings: tuple[tuple[int, ...], ...]  # target-id phrases, the tokenizer's first
    total: int  # how many spellings its two forms have
    banned: int  # how many of those are in `spellings` (byte spellings are on top)
    fewest_left: int = 0  # the fewest pieces of a spelling not banned (0: none is left)

    @property
    def complete(self) -> bool:
        """Every spelling is banned."""
        return self.banned == self.total


def banned_spellings(tokenizer: Tokenizer, text: str, limit: int = EXCLUDE_SPELLINGS) -> Banned:
    """The id phrases to ban for the normalized target text `text`: the spellings of
    its two forms, at most `limit` (the tokenizer's, then the fewest pieces, either
    form), and the byte spellings (module docstring)."""
    starts = tokenizer.segmentations(text, limit + 1)  # the tokenizer's first, by pieces
    total = tokenizer.segmentation_count(text)
    glued: list[tuple[int, ...]] = []
    if tokenizer.normalized(text, word_start=False) != tokenizer.normalized(text):
        glued = tokenizer.segmentations(text, limit + 1, word_start=False)
        total += tokenizer.segmentation_count(text, word_start=False)
    others = list(heapq.merge(starts[1:], glued, key=len))  # one more than can be banned
    chosen = starts[:1] + others[: limit - 1]
    left = others[limit - 1 : limit]
    found = dict.fromkeys(chosen + tokenizer.byte_spellings(text))
    return Banned(tuple(found), total, len(chosen), len(left[0]) if left else 0)


def without_redundant(phrases: Sequence[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """`phrases` but those that contain another of them as a contiguous run: a search
    that bans the shorter one can never complete the longer one."""
    every = set(phrases)

    def holds_another(ids: tuple[int, ...]) -> bool:
        n = len(ids)
        return any(ids[i:j] in every for i in range(n) for j in range(i + 1, n + 1) if j - i < n)

    return [ids for ids in phrases if not holds_another(ids)]
