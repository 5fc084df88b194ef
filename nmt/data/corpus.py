"""Reading parallel text: line counts, UTF-8 checks, CRLF/BOM handling, and cleaning rules.

A line ends at "\\n" only (never at the other characters `str.splitlines` accepts), so line
numbers agree with `wc -l` and editors. A leading byte-order mark is dropped; a trailing "\\r"
disappears with whitespace normalization. Files are scanned once up front (counts, chunk
boundaries, and in `error` mode the UTF-8 check) so that every input mistake is reported
before any slow work starts.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

import numpy as np

from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError

BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 24  # bytes read at a time while scanning

# Rule names as they appear in meta.json's `removed` counts, in the order they are checked.
CLEAN_RULES = ("empty", "too_long", "ratio")
INVALID_UTF8 = "invalid_utf8"


@dataclass(frozen=True)
class FileScan:
    """A text file's line count and the byte offsets where each chunk of lines starts."""

    path: Path
    lines: int
    starts: tuple[int, ...]  # starts[k]: offset of line k * chunk_lines; plus the file size
    size: int

    def chunk(self, k: int) -> tuple[int, int]:
        return self.starts[k], self.starts[k + 1]


def scan_file(path: Path, chunk_lines: int, check_utf8: bool) -> FileScan:
    """Count lines and record chunk offsets; with `check_utf8`, NmtError at the first bad line."""
    if not path.is_file():
        raise NmtError(f"{path}: no such file")
    starts = [0]
    lines = 0  # complete lines ("\n"-terminated) seen so far
    pending = b""  # bytes of an unfinished line, kept for the UTF-8 check
    pending_line = 0  # 0-based number of the line `pending` starts
    pos = 0
    last = b""
    try:
        with open(path, "rb") as f:
            while block := f.read(_BLOCK):
                newlines = np.flatnonzero(np.frombuffer(block, dtype=np.uint8) == 10)
                # 1-based number of the line each newline completes; the next chunk starts
                # after each newline that completes a multiple of chunk_lines
                completed = lines + 1 + np.arange(len(newlines))
                cuts = newlines[completed % chunk_lines == 0]
                starts.extend((pos + cuts + 1).tolist())
                if check_utf8 and len(newlines):
                    end = int(newlines[-1]) + 1
                    _check_utf8(path, pending + block[:end], pending_line)
                    pending, pending_line = block[end:], lines + len(newlines)
                elif check_utf8:
                    pending += block
                lines += len(newlines)
                pos += len(block)
                last = block[-1:]
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    if check_utf8 and pending:
        _check_utf8(path, pending, pending_line)
    if pos and last != b"\n":  # a last line without "\n" still counts
        lines += 1
    if starts[-1] != pos:
        starts.append(pos)
    return FileScan(path=path, lines=lines, starts=tuple(starts), size=pos)


def _check_utf8(path: Path, data: bytes, first_line: int) -> None:
    try:
        data.decode("utf-8")
    except UnicodeDecodeError as exc:
        line = first_line + data.count(b"\n", 0, exc.start) + 1
        column = exc.start - (data.rfind(b"\n", 0, exc.start) + 1)
        raise NmtError(
            f"{path}:{line}: invalid UTF-8 ({exc.reason} at byte {column + 1} of the "
            "line); fix the file or set on_invalid_utf8=replace or =skip"
        ) from exc


def check_parallel(src: FileScan, tgt: FileScan) -> None:
    if src.lines != tgt.lines:
        raise NmtError(
            f"{src.path} has {src.lines} lines but {tgt.path} has {tgt.lines}; "
            "parallel files need one sentence per line on both sides"
        )


def read_lines(
    path: Path, start: int, end: int, first_line: int, policy: str, nfkc: bool
) -> tuple[list[str | None], int]:
    """Normalized lines of bytes [start, end); None marks a line skipped for bad UTF-8.

    Returns the lines and how many had invalid UTF-8 (replaced or skipped). `first_line` is
    the 0-based number of the first line, for error messages.
    """
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(end - start)
    if start == 0 and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if not raw and end == start:
        return [], 0
    try:
        # fast path: the whole chunk at once ("\n" never occurs inside a UTF-8 sequence)
        return [normalize_text(t, nfkc) for t in raw.decode("utf-8").split("\n")], 0
    except UnicodeDecodeError:
        pass
    lines: list[str | None] = []
    bad = 0
    for number, chunk in enumerate(raw.split(b"\n"), start=first_line + 1):
        try:
            text = chunk.decode("utf-8")
        except UnicodeDecodeError as exc:
            bad += 1
            if policy == "error":
                raise NmtError(
                    f"{path}:{number}: invalid UTF-8 ({exc.reason}); fix the file or "
                    "set on_invalid_utf8=replace or =skip"
                ) from exc
            if policy == "skip":
                lines.append(None)
                continue
            text = chunk.decode("utf-8", errors="replace")
        lines.append(normalize_text(text, nfkc))
    return lines, bad


@dataclass(frozen=True)
class CleanRules:
    """The training-split filters, applied to subword lengths without EOS."""

    remove_empty: bool
    max_pieces: int | None
    max_ratio: float | None

    def apply(
        self, src_lens: np.ndarray, tgt_lens: np.ndarray
    ) -> tuple[np.ndarray, dict[str, int]]:
        """Keep mask and per-rule counts; a pair is counted under the first rule it breaks."""
        keep = np.ones(len(src_lens), dtype=bool)
        counts = dict.fromkeys(CLEAN_RULES, 0)
        shorter = np.minimum(src_lens, tgt_lens)
        longer = np.maximum(src_lens, tgt_lens)
        if self.remove_empty:
            hit = shorter == 0
            counts["empty"] = int(hit.sum())
            keep &= ~hit
        if self.max_pieces is not None:
            hit = keep & (longer > self.max_pieces)
            counts["too_long"] = int(hit.sum())
            keep &= ~hit
        if self.max_ratio is not None:
            # an empty side kept on purpose (remove_empty=false) is not a ratio problem
            hit = keep & (shorter > 0) & (longer > self.max_ratio * shorter)
            counts["ratio"] = int(hit.sum())
            keep &= ~hit
        return keep, counts
