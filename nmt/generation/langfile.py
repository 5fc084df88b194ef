"""nmt-generate's tgt_lang_file=: one target language code per input line.

The file is read twice before anything is translated: once before the model loads (its
line count against the input, and every code's spelling), once after (every distinct
code against the model's languages); both errors name the file and the first line with
the code. While translating, its lines are taken in step with the input (AlignedLines).
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass

from nmt.data.languages import check_lang_code
from nmt.errors import NmtError
from nmt.generation.io import read_text_lines
from nmt.generation.translator import Translator

KEY = "tgt_lang_file"


@dataclass(frozen=True)
class LanguageFile:
    """A tgt_lang_file's line count and the first line of each code it holds."""

    path: str
    lines: int
    first_line: dict[str, int]  # code -> its first 1-based line

    @classmethod
    def scan(cls, path: str) -> LanguageFile:
        """Count the lines and check that each is a language code (NmtError naming the
        file and line)."""
        first: dict[str, int] = {}
        lines = 0
        for lines, line in enumerate(read_text_lines(path, KEY), start=1):
            code = line.strip()
            if code not in first:
                with _at(path, lines):
                    check_lang_code(code, "tgt_lang")
                first[code] = lines
        return cls(path, lines, first)

    def check(self, translator: Translator, src_lang: str | None) -> None:
        """Every code is a language the model translates into."""
        for code, line in self.first_line.items():
            with _at(self.path, line):
                translator.check_languages(code, src_lang)


def line_code(line: str) -> str:
    """A line's language code (surrounding whitespace is no part of it)."""
    return line.strip()


@contextmanager
def _at(path: str, line: int) -> Iterator[None]:
    """An NmtError raised within, prefixed with the file and line."""
    try:
        yield
    except NmtError as exc:
        raise NmtError(f"{path}:{line}: {exc}") from None
