"""Reading parallel text: line counts, UTF-8 checks, CRLF/BOM handling (the cleaning rules
are nmt.data.cleaning's).

A line ends at "\\n" only (never at the other characters `str.splitlines` accepts), so line
numbers agree with `wc -l` and editors. A leading byte-order mark is dropped; a trailing "\\r"
disappears with whitespace normalization. Files may be gzip, xz or bzip2 compressed (zstd
too when the zstandard package is installed), read as streams. Files are scanned once up
front (counts, chunk boundaries, in `error` mode the UTF-8 check, and the SentencePiece
training sample) so that every input mistake is reported before any slow work starts.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import BinaryIO, cast

import numpy as np

from nmt.data.sampling import LineReservoir
from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError

BOM = b"\xef\xbb\xbf"
_BLOCK = 1 << 22  # bytes read at a time while scanning (a few of these are the scan's memory)

# meta.json's `removed` count of pairs skipped for invalid UTF-8 (on_invalid_utf8=skip)
INVALID_UTF8 = "invalid_utf8"


# Compressed input, read as a stream: the file's suffix says which, its magic bytes confirm.
COMPRESSIONS = {
    ".gz": b"\x1f\x8b",
    ".xz": b"\xfd7zXZ\x00",
    ".bz2": b"BZh",
    ".zst": b"\x28\xb5\x2f\xfd",
}


def input_file(prefix: str | Path, lang: str) -> Path:
    """The text file of one side: `<prefix>.<lang>`, or the same compressed
    (`<prefix>.<lang>.gz`, `.xz`, `.bz2`, `.zst`); NmtError when none or several exist."""
    plain = Path(f"{prefix}.{lang}")
    candidates = [plain] + [plain.with_name(plain.name + suffix) for suffix in COMPRESSIONS]
    found = [path for path in candidates if path.is_file()]
    if len(found) > 1:
        raise NmtError(
            f"{found[0]}: {found[1].name} is beside it; keep one of them (nmt reads plain, "
            ".gz, .xz, .bz2 or .zst text)"
        )
    return found[0] if found else plain  # a missing file is named when scanned


def open_text(path: Path) -> BinaryIO:
    """A binary stream of the file's text, decompressed on the fly when compressed."""
    suffix = path.suffix if path.suffix in COMPRESSIONS else ""
    if not path.is_file():
        raise NmtError(f"{path}: no such file")
    try:
        if not suffix:
            return open(path, "rb")
        with open(path, "rb") as f:
            magic = f.read(len(COMPRESSIONS[suffix]))
        if magic != COMPRESSIONS[suffix]:
            raise NmtError(
                f"{path}: not a {suffix[1:]} file (its first bytes say otherwise); "
                f"decompress it, or rename it without {suffix}"
            )
        if suffix == ".gz":
            return cast(BinaryIO, gzip.open(path, "rb"))
        if suffix == ".xz":
            return cast(BinaryIO, lzma.open(path, "rb"))
        if suffix == ".bz2":
            return cast(BinaryIO, bz2.open(path, "rb"))
        try:
            import zstandard  # optional (a mypy override covers its absence)
        except ImportError:
            raise NmtError(
                f"{path}: reading .zst needs the zstandard package (pip install zstandard); "
                "or give the text plain, .gz or .xz"
            ) from None
        return cast(BinaryIO, zstandard.open(path, "rb"))
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc})") from exc


def is_compressed(path: Path) -> bool:
    return path.suffix in COMPRESSIONS


@dataclass(frozen=True)
class FileScan:
    """A text file's line count and the byte offsets where each chunk of lines starts
    (offsets in the decompressed text when the file is compressed)."""

    path: Path
    lines: int
    starts: tuple[int, ...]  # starts[k]: offset of line k * chunk_lines; plus the text size
    size: int

    def chunk(self, k: int) -> tuple[int, int]:
        return self.starts[k], self.starts[k + 1]

    @property
    def chunks(self) -> int:
        return len(self.starts) - 1

    @property
    def compressed(self) -> bool:
        return is_compressed(self.path)


def scan_file(
    path: Path,
    chunk_lines: int,
    check_utf8: bool,
    sample: LineReservoir | None = None,
    progress: Callable[[int], object] | None = None,
    remedy: str = "fix the file or set on_invalid_utf8=replace or =skip",
) -> FileScan:
    """Count lines and record chunk offsets; with `check_utf8`, NmtError at the first bad
    line, ending with `remedy` (what to do). Every line is offered to `sample` (the
    SentencePiece training sample); `progress` receives the number of (compressed) bytes
    read since its last call."""
    starts = [0]
    lines = 0  # complete lines ("\n"-terminated) seen so far
    carry = b""  # bytes of an unfinished line
    pos = 0  # offset of `carry` in the text
    skip_bom = 0
    try:
        with open_text(path) as f:
            raw = getattr(f, "fileobj", None) or getattr(f, "_fp", None)
            read_so_far = 0
            while block := f.read(_BLOCK):
                data = carry + block if carry else block
                if pos == 0 and not carry and data.startswith(BOM):
                    skip_bom = len(BOM)
                newlines = np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)
                # 1-based number of the line each newline completes; the next chunk starts
                # after each newline that completes a multiple of chunk_lines
                completed = lines + 1 + np.arange(len(newlines))
                cuts = newlines[completed % chunk_lines == 0]
                starts.extend((pos + cuts + 1).tolist())
                if len(newlines):
                    end = int(newlines[-1]) + 1
                    if check_utf8:
                        _check_utf8(path, memoryview(data)[:end], lines, remedy)
                    if sample is not None:
                        sample.offer(data, newlines, skip_bom if lines == 0 else 0)
                    lines += len(newlines)
                    carry = data[end:]
                    pos += end
                else:
                    carry = data
                if progress is not None:
                    now = raw.tell() if raw is not None and hasattr(raw, "tell") else pos
                    progress(now - read_so_far)
                    read_so_far = now
    except OSError as exc:
        raise NmtError(f"{path}: cannot read ({exc.strerror or exc})") from exc
    except EOFError as exc:  # a truncated compressed file
        raise NmtError(f"{path}: truncated ({exc}); get the file again") from exc
    if carry:  # a last line without "\n" still counts
        if check_utf8:
            _check_utf8(path, carry, lines, remedy)
        if sample is not None:
            sample.offer(carry, np.array([len(carry)]), skip_bom if lines == 0 else 0)
        lines += 1
    size = pos + len(carry)
    if starts[-1] != size:
        starts.append(size)
    return FileScan(path=path, lines=lines, starts=tuple(starts), size=size)


def read_chunks(scan: FileScan) -> Iterator[bytes]:
    """The file's chunks of lines as raw bytes, in order, read as one stream (for
    compressed files, which cannot be read from an offset)."""
    with open_text(scan.path) as f:
        for k in range(scan.chunks):
            start, end = scan.chunk(k)
            data = f.read(end - start)
            if len(data) != end - start:
                raise NmtError(f"{scan.path} changed while being read; run again")
            yield data


def _check_utf8(path: Path, data: bytes | memoryview, first_line: int, remedy: str) -> None:
    try:
        str(data, "utf-8")  # a memoryview decodes without a copy of the bytes
    except UnicodeDecodeError as exc:
        raw = bytes(data[: exc.start])
        line = first_line + raw.count(b"\n") + 1
        column = exc.start - (raw.rfind(b"\n") + 1)
        raise NmtError(
            f"{path}:{line}: invalid UTF-8 ({exc.reason} at byte {column + 1} of the line); "
            f"{remedy}"
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
    """Normalized lines of bytes [start, end) of a plain file; see `decode_lines`."""
    with open(path, "rb") as f:
        f.seek(start)
        raw = f.read(end - start)
    return decode_lines(raw, start == 0, path, first_line, policy, nfkc)


def decode_lines(
    raw: bytes, at_start: bool, path: Path, first_line: int, policy: str, nfkc: bool
) -> tuple[list[str | None], int]:
    """Normalized lines of a chunk of raw text; None marks a line skipped for bad UTF-8.

    Returns the lines and how many had invalid UTF-8 (replaced or skipped). `at_start`: the
    chunk begins the file (a byte-order mark is dropped); `first_line` is the 0-based number
    of its first line, for error messages.
    """
    if at_start and raw.startswith(BOM):
        raw = raw[len(BOM) :]
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    elif not raw:
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
