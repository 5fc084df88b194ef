"""Every way a SentencePiece vocabulary can spell a normalized string (Tokenizer.segmentations).

A tokenizer writes a text one way, but a model may produce any sequence of pieces: "Mann"
is "▁Mann" to the tokenizer, and "▁Man" "n" or "▁M" "ann" decode to the same text. A
dynamic program over the string's positions counts the spellings by their number of
pieces (`Spellings.ways`), so that they can be listed fewest pieces first without
listing them all (a long word has thousands).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Iterator

import sentencepiece as spm

WORD_START = "\u2581"  # "▁": SentencePiece's mark of a space, and of a word start
SEGMENTATIONS = 64  # Tokenizer.segmentations' default limit

Step = tuple[int, tuple[int, ...]]  # (end, ids): ids spell text[start:end]


class PieceIndex:
    """A vocabulary's pieces by the text they spell.

    Spellings use the normal and user-defined pieces, never control, unknown or unused
    ones, and byte pieces only for a character that has no piece of its own, as
    SentencePiece's byte fallback writes it: a character the vocabulary has is never
    written as bytes by the tokenizer (so no training target holds such a spelling), and
    its byte spellings, one more choice per character, would multiply the count."""

    def __init__(self, sp: spm.SentencePieceProcessor) -> None:
        self.pieces: dict[str, int] = {}  # normal and user-defined pieces -> id
        self.bytes: dict[int, int] = {}  # byte value -> id of its byte-fallback piece
        for i in range(sp.get_piece_size()):
            if sp.is_byte(i):
                self.bytes[int(sp.id_to_piece(i)[3:5], 16)] = i  # "<0x41>"
            elif not (sp.is_control(i) or sp.is_unknown(i) or sp.is_unused(i)):
                self.pieces[sp.id_to_piece(i)] = i
        self.longest = max(map(len, self.pieces), default=0)

    def spellings(self, text: str) -> Spellings:
        """The spellings of `text` (already normalized: "▁rote▁Mütze")."""
        steps: list[list[Step]] = []
        for i in range(len(text)):
            ends = range(min(len(text), i + self.longest), i, -1)  # longest piece first
            here: list[Step] = [
                (j, (self.pieces[text[i:j]],)) for j in ends if text[i:j] in self.pieces
            ]
            spelled = self.byte_spelling(text[i])
            if text[i] not in self.pieces and spelled:  # SentencePiece's byte fallback
                here.append((i + 1, spelled))
            steps.append(here)
        return Spellings(steps)

    def byte_spelling(self, char: str) -> tuple[int, ...]:
        """The ids of the byte pieces of `char`'s UTF-8 bytes; () without byte pieces."""
        spelled = tuple(self.bytes.get(b, -1) for b in char.encode("utf-8"))
        return () if -1 in spelled else spelled


class Spellings:
    """The spellings of one string: steps[i] lists each way (end, ids) to spell
    text[i:end], longest first; ways[i] counts the spellings of text[i:] by their number
    of pieces (an empty string has none)."""

    def __init__(self, steps: list[list[Step]]) -> None:
        self.steps = steps
        n = len(steps)
        self.ways: list[Counter[int]] = [Counter() for _ in range(n + 1)]
        self.ways[n][0] = 1
        for i in range(n - 1, -1, -1):
            for end, ids in steps[i]:
                for pieces, count in self.ways[end].items():
                    self.ways[i][pieces + len(ids)] += count
        if n == 0:
            self.ways[0].clear()

    def count(self) -> int:
        return sum(self.ways[0].values())

    def fewest_first(self) -> Iterator[tuple[int, ...]]:
        """Every spelling, by number of pieces, fewest first; of as many pieces, in step
        order (longer pieces first, from the left)."""
        for pieces in sorted(self.ways[0]):
            yield from self._walk(pieces)

    def _walk(self, pieces: int) -> Iterator[tuple[int, ...]]:
        """The spellings in exactly `pieces` pieces, depth first (an explicit stack: a
        string may be longer than Python's recursion limit)."""
        n = len(self.steps)
        stack: list[tuple[int, int, tuple[int, ...]]] = [(0, pieces, ())]
        while stack:
            i, left, ids = stack.pop()
            if i == n:
                yield ids
                continue
            for end, step in reversed(self.steps[i]):  # so that they pop in step order
                if self.ways[end][left - len(step)]:
                    stack.append((end, left - len(step), ids + step))
