"""Lines of UTF-8 text from a file or stdin, read one at a time, with invalid bytes either
refused by file and line or replaced: `input_errors=strict|replace` of nmt-generate and
nmt-score.

A line ends at "\\n" only (as `wc -l` counts, and as nmt-preprocess reads), so line numbers
agree with editors; the first line's byte-order mark is dropped. Memory holds one line.

strict: the first line that is not UTF-8 ends the iteration, and `error()` names it
(`<path>:<line>: invalid UTF-8 (...)`); every line before it has been yielded, so a
streaming caller can finish the work on them (print their translations) before it raises.
replace: invalid bytes become U+FFFD (one per invalid sequence, as Python's "replace"),
every line is yielded, and `replacement_note()` says how many lines had some.
"""

from __future__ import annotations

import sys
from collections.abc import Callable, Iterator
from typing import BinaryIO

from nmt.errors import NmtError, option_error

INPUT_ERRORS = ("strict", "replace")
STDIN = "-"
BOM = "\ufeff"
REMEDY = "fix the line, or input_errors=replace"


def display_name(path: str) -> str:
    """How messages name an input: the path, or <stdin>."""
    return "<stdin>" if path == STDIN else path


def check_input_errors(value: str) -> None:
    """NmtError unless `value` is one of INPUT_ERRORS."""
    if value not in INPUT_ERRORS:
        raise option_error(
            "input_errors",
            value,
            "unknown",
            "use strict (invalid UTF-8 is an error naming the line) or replace (invalid bytes "
            "become U+FFFD)",
        )


def _open_binary(path: str) -> BinaryIO:
    return open(path, "rb")


class TextLines:
    """The decoded lines of `path` ("-": stdin), read lazily; see the module docstring.

    `opener` opens a file as a binary stream (default: plain `open`; nmt-generate passes
    one that also reads compressed files). Iterate once.
    """

    def __init__(
        self,
        path: str,
        errors: str = "strict",
        opener: Callable[[str], BinaryIO] = _open_binary,
    ):
        check_input_errors(errors)
        self.path, self.name, self.errors = path, display_name(path), errors
        self._opener = opener
        self.lines_read = 0  # lines yielded so far
        self.replaced = 0  # lines in which invalid bytes were replaced (replace)
        self.first_replaced: int | None = None  # the first such line's number
        self.problem: str | None = None  # strict: "<name>:<line>: invalid UTF-8 (...)"

    def __iter__(self) -> Iterator[str]:
        stream = sys.stdin.buffer if self.path == STDIN else self._opener(self.path)
        try:
            for number, raw in enumerate(iter(stream.readline, b""), start=1):
                try:
                    text = raw.decode("utf-8")
                except UnicodeDecodeError as exc:
                    if self.errors == "strict":
                        self.problem = (
                            f"{self.name}:{number}: invalid UTF-8 ({exc.reason} at byte "
                            f"{exc.start + 1} of the line)"
                        )
                        return
                    text = raw.decode("utf-8", errors="replace")
                    self.replaced += 1
                    if self.first_replaced is None:
                        self.first_replaced = number
                self.lines_read = number
                yield text.lstrip(BOM) if number == 1 else text
        finally:
            if stream is not sys.stdin.buffer:
                stream.close()

    def error(self, done: str = "") -> NmtError | None:
        """The strict-mode error, or None; `done` (e.g. "the 30 lines before it are
        translated") goes between the problem and the remedy."""
        if self.problem is None:
            return None
        return NmtError(f"{self.problem}; {done + '; ' if done else ''}{REMEDY}")

    def check(self) -> None:
        """Raise the strict-mode error, if iterating met one."""
        if (error := self.error()) is not None:
            raise error

    def replacement_note(self) -> str | None:
        """replace: one line on the lines that had invalid UTF-8, or None when none had."""
        if not self.replaced:
            return None
        lines = "line" if self.replaced == 1 else "lines"
        return (
            f"{self.name}: {self.replaced} {lines} had invalid UTF-8, replaced by U+FFFD "
            f"(the first: line {self.first_replaced})"
        )
