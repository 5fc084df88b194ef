"""Terminology on the text side: per-sentence constraints and glossaries, as text.

A sentence's `TextConstraints` name target phrases its translation must contain
(`include`) and phrases it must never contain (`exclude`); the Translator turns them into
target ids (`Translator.constraint_ids`) for the constrained search. They come from
Python (a list of phrases, an {"include", "exclude"} dict), from a JSON Lines file (one
line per input line: `["Hund", "rote Mütze"]`, `{"include": [...], "exclude": [...]}`,
`[]` for none) or from a glossary.

A `Glossary` maps source terms to target terms: when a source text contains a term, its
target term becomes an include constraint of that sentence. A file is UTF-8 TSV, one
`source term<TAB>target term` a line; blank lines and lines starting with `#` are
skipped. A source term matches as whole words (no word character on either side,
Unicode's), case-insensitively, after the one text normalization (nmt.data.tokenizer's
`normalize_text`, with NFKC whatever the model's: matching is the same for every model);
where terms overlap, the longer wins. A term listed twice with the same target is one
term; with another target it is an error naming both lines (the same in Python).

Every error is an NmtError naming the file and line (`FILE:LINE: ...`) or the entry
(`constraints[3]: ...`, `glossary["Hund"]: ...`).
"""

from __future__ import annotations

import json
import os
import re
from collections.abc import Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from functools import cached_property
from pathlib import Path

from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError
from nmt.textlines import TextLines

CONSTRAINT_KEYS = ("include", "exclude")
CONSTRAINTS_FORM = '["phrase", ...] or {"include": [...], "exclude": [...]}'


@dataclass(frozen=True)
class TextConstraints:
    """One sentence's constraints as target text."""

    include: tuple[str, ...] = ()  # phrases the translation must contain
    exclude: tuple[str, ...] = ()  # phrases the translation must never contain

    def including(self, phrases: Iterable[str]) -> TextConstraints:
        """These constraints with `phrases` added to include (those not there yet)."""
        new = tuple(dict.fromkeys(p for p in phrases if p not in self.include))
        return TextConstraints(self.include + new, self.exclude) if new else self


def parse_constraints(value: object, where: str) -> TextConstraints:
    """A parsed JSON value as constraints: a list of phrases (all include) or an object
    with optional keys "include" and "exclude" (lists of phrases). A phrase is a string
    with a word in it. Anything else is an NmtError starting with `where`."""
    if isinstance(value, (list, tuple)):
        return TextConstraints(include=_phrases(value, where))
    if isinstance(value, Mapping):
        unknown = [k for k in value if k not in CONSTRAINT_KEYS]
        if unknown:
            raise NmtError(
                f"{where}: unknown key {json.dumps(unknown[0])}; an object takes "
                '"include" and "exclude" (lists of phrases)'
            )
        include, exclude = (_phrases(value.get(key, []), where, key) for key in CONSTRAINT_KEYS)
        return TextConstraints(include, exclude)
    raise NmtError(f"{where}: {_kind(value)}, not constraints; write {CONSTRAINTS_FORM}")


def as_constraints(value: object, where: str) -> TextConstraints | None:
    """What the Python API takes for one sentence: None, TextConstraints, or a value
    parse_constraints reads."""
    if value is None or isinstance(value, TextConstraints):
        return value
    return parse_constraints(value, where)


def _phrases(value: object, where: str, key: str = "") -> tuple[str, ...]:
    named = f'{where}: "{key}"' if key else where
    if not isinstance(value, (list, tuple)):
        raise NmtError(f'{named}: {_kind(value)}, not a list of phrases; write ["phrase", ...]')
    for i, phrase in enumerate(value):
        if not isinstance(phrase, str):
            raise NmtError(f"{named}: item {i + 1} is {_kind(phrase)}, not a string")
        if not normalize_text(phrase, nfkc=False):
            raise NmtError(f"{named}: item {i + 1} is an empty phrase; give words or leave it out")
    return tuple(value)


def _quoted(value: object) -> str:
    """A string in double quotes as JSON writes it (other values as Python does)."""
    return json.dumps(value, ensure_ascii=False) if isinstance(value, str) else repr(value)


def _kind(value: object) -> str:
    """A value as JSON names it, for messages."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return json.dumps(value)
    if isinstance(value, (int, float)):
        return f"a number ({value})"
    if isinstance(value, str):
        return f"a string ({_quoted(value)})"
    if isinstance(value, Mapping):
        return "an object"
    if isinstance(value, (list, tuple)):
        return "a list"
    return f"a {type(value).__name__}"


def parse_constraints_line(line: str, where: str) -> TextConstraints:
    """One line of a constraints file (JSON Lines); `where` is `FILE:LINE`."""
    if not line.strip():
        raise NmtError(f"{where}: an empty line; write [] for a line without constraints")
    try:
        value = json.loads(line)
    except json.JSONDecodeError as exc:
        raise NmtError(f"{where}: not JSON ({exc.msg} at column {exc.colno})") from None
    return parse_constraints(value, where)


def iter_constraints(path: str | os.PathLike) -> Iterator[TextConstraints]:
    """The constraints of each line of a JSON Lines file, read one line at a time; a bad
    line (or invalid UTF-8) is an NmtError naming the file and line when it is reached."""
    lines = _utf8_lines(path)
    for number, line in enumerate(lines, start=1):
        yield parse_constraints_line(line, f"{lines.name}:{number}")
    _check_utf8(lines)


def read_constraints(
    path: str | os.PathLike, expected_lines: int | None = None
) -> list[TextConstraints]:
    """Every line's constraints of a JSON Lines file; with `expected_lines`, a file of
    another line count is an NmtError."""
    found = list(iter_constraints(path))
    if expected_lines is not None and len(found) != expected_lines:
        raise NmtError(
            f"{path}: {len(found)} lines for {expected_lines} texts; "
            "give one line of constraints per text ([] for none)"
        )
    return found


def _utf8_lines(path: str | os.PathLike) -> TextLines:
    if not Path(path).is_file():
        raise NmtError(f"{path}: no such file")
    return TextLines(os.fspath(path))


def _check_utf8(lines: TextLines) -> None:
    if lines.problem is not None:  # strict TextLines stop at the first bad line
        raise NmtError(f"{lines.problem}; fix the line")


def match_form(text: str) -> str:
    """Text as glossary matching compares it: normalize_text with NFKC, case-folded."""
    return normalize_text(text, nfkc=True).casefold()


@dataclass(frozen=True)
class Term:
    """One glossary entry."""

    source: str  # the source term, whitespace normalized
    target: str  # the target term, whitespace normalized
    where: str  # names it in messages: FILE:LINE or glossary["source"]


class Glossary:
    """Source terms -> target terms; `targets_for(text)`: the target terms of the source
    terms a text contains (see the module docstring for the matching)."""

    def __init__(self, terms: Iterable[Term] = ()):
        self._terms: dict[str, Term] = {}  # match form of the source -> term
        for term in terms:
            key = match_form(term.source)
            known = self._terms.get(key)
            if known is not None and known.target != term.target:
                raise NmtError(
                    f"{term.where}: source term {_quoted(term.source)} "
                    f"is already at {known.where} with another target (terms match "
                    "case-insensitively); keep one"
                )
            self._terms.setdefault(key, term)

    @classmethod
    def read(cls, path: str | os.PathLike) -> Glossary:
        """A TSV file, `source term<TAB>target term` a line (blank lines and `#` comments
        skipped); a malformed line is an NmtError naming the file and line."""
        lines = _utf8_lines(path)
        terms = []
        for number, line in enumerate(lines, start=1):
            where = f"{lines.name}:{number}"
            if not line.strip() or line.startswith("#"):
                continue
            sides = line.rstrip("\r\n").split("\t")
            if len(sides) != 2:
                raise NmtError(
                    f"{where}: {len(sides) - 1} tabs; write one "
                    "'source term<TAB>target term' a line"
                )
            terms.append(_term(sides[0], sides[1], where))
        _check_utf8(lines)
        return cls(terms)

    @classmethod
    def of(
        cls,
        entries: Glossary | Mapping[str, str] | Sequence[tuple[str, str]],
        where: str = "glossary",
    ) -> Glossary:
        """A glossary from a mapping source -> target, or (source, target) pairs, as the
        Python API and the server get them; a bad entry is an NmtError naming it."""
        if isinstance(entries, Glossary):
            return entries
        if isinstance(entries, Mapping):
            pairs = [(s, t, f"{where}[{_quoted(s)}]") for s, t in entries.items()]
        elif isinstance(entries, Sequence) and not isinstance(entries, (str, bytes)):
            pairs = []
            for i, pair in enumerate(entries):
                if not (isinstance(pair, (list, tuple)) and len(pair) == 2):
                    raise NmtError(f"{where}[{i}]: {_kind(pair)}, not a (source, target) pair")
                pairs.append((pair[0], pair[1], f"{where}[{i}]"))
        else:
            raise NmtError(f"{where}: {_kind(entries)}; give a mapping source term -> target term")
        return cls(_term(s, t, w) for s, t, w in pairs)

    @staticmethod
    def merged(over: Glossary | None, under: Glossary | None) -> Glossary | None:
        """The terms of both; where both have a source term, `over`'s (a request's
        glossary over a server-wide one). None when both are None."""
        if over is None or under is None:
            return over if under is None else under
        mine = {match_form(t.source) for t in over.terms}
        return Glossary(
            [*over.terms, *(t for t in under.terms if match_form(t.source) not in mine)]
        )

    @property
    def terms(self) -> tuple[Term, ...]:
        return tuple(self._terms.values())

    def __len__(self) -> int:
        return len(self._terms)

    def __repr__(self) -> str:
        return f"Glossary({len(self)} terms)"

    def terms_in(self, source_text: str) -> tuple[Term, ...]:
        """The terms whose source occurs in `source_text` as whole words, in order of
        occurrence, each once; of overlapping occurrences the longer wins."""
        if not self._terms:
            return ()
        text = match_form(source_text)
        # every position where a term starts: the longest term starting there
        found = [(m.start(), m.end(1)) for m in self._pattern.finditer(text)]
        found.sort(key=lambda span: (span[0] - span[1], span[0]))  # longest first
        taken: list[tuple[int, int]] = []
        for start, end in found:
            if all(end <= s or start >= e for s, e in taken):
                taken.append((start, end))
        keys = dict.fromkeys(text[s:e] for s, e in sorted(taken))
        return tuple(self._terms[k] for k in keys)

    def targets_for(self, source_text: str) -> tuple[str, ...]:
        """The target terms of the terms `source_text` contains, in order, each once."""
        return tuple(dict.fromkeys(t.target for t in self.terms_in(source_text)))

    @cached_property
    def _pattern(self) -> re.Pattern[str]:
        """One alternation of every source term, longest first, at each word start: a
        zero-width match capturing the longest whole-word term from there."""
        alternatives = "|".join(map(re.escape, sorted(self._terms, key=len, reverse=True)))
        return re.compile(rf"(?<!\w)(?=((?:{alternatives})(?!\w)))")


def _term(source: object, target: object, where: str) -> Term:
    sides = []
    for name, value in (("source", source), ("target", target)):
        if not isinstance(value, str):
            raise NmtError(f"{where}: the {name} term is {_kind(value)}, not a string")
        text = normalize_text(value, nfkc=False)
        if not text:
            raise NmtError(f"{where}: an empty {name} term; give both terms")
        sides.append(text)
    return Term(sides[0], sides[1], where)


def as_glossary(value: object) -> Glossary | None:
    """What the Python API takes as a glossary: a Glossary, a TSV file's path, a mapping
    source -> target (or (source, target) pairs), or None."""
    if value is None or isinstance(value, Glossary):
        return value
    if isinstance(value, (str, os.PathLike)):
        return Glossary.read(value)
    return Glossary.of(value)  # type: ignore[arg-type]  # checked there
