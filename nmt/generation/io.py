"""Input and output of nmt-generate: streamed sources, formatted translations, the output file.

Inputs are read lazily (a text file or stdin line by line, a binarized split sentence by
sentence) so that any size of input runs in constant memory. Every input line becomes
exactly one `Source`, and every Source exactly one output entry: an empty line stays
empty, an over-long one is truncated with a warning (or refused, on request).
"""

from __future__ import annotations

import itertools
import logging
import sys
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import torch
from tqdm import tqdm

from nmt.data.binarize import TokenArray
from nmt.data.corpus import open_text, scan_file
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.fsutil import atomic_write, check_text_output, remove_stale_temps
from nmt.generation.encoding import (
    PieceNames,
    TextEncoder,
    alignment_pairs,
    length_batches,
    pad_batch,
    target_ids,
)
from nmt.generation.generator import Hypothesis
from nmt.generation.terminology import TextConstraints
from nmt.textlines import REMEDY, STDIN, TextLines


@dataclass
class Source:
    """One input sentence, ready for the model."""

    index: int  # 0-based position in the input (output order)
    ids: np.ndarray  # int64 source ids ending in EOS; empty for an empty line
    text: str  # the normalized source text
    ref: str | None = None  # reference translation, when known
    ref_ids: np.ndarray | None = None  # the reference's ids as stored (data dir splits)
    prefix: str | None = None  # target prefix for this sentence (prefix_file); "" = none
    constraints: TextConstraints | None = None  # its line of constraints= (None: none given)
    tgt_lang: str | None = None  # its line of tgt_lang_file= (None: none given)


def print_warning(message: str) -> None:
    """A warning on stderr that does not break a running progress bar."""
    tqdm.write(f"nmt-generate: warning: {message}", file=sys.stderr)


class _WarningsAsPrinted(logging.Handler):
    """Log records of the library shown as nmt-generate's own warnings."""

    def emit(self, record: logging.LogRecord) -> None:
        print_warning(record.getMessage())


@contextmanager
def library_warnings_printed() -> Iterator[None]:
    """While it lasts, warnings the library logs (logger `nmt.generation`, e.g. an exclude
    phrase with more spellings than are banned) print as `nmt-generate: warning: ...`."""
    logger = logging.getLogger("nmt.generation")
    handler, propagate = _WarningsAsPrinted(logging.WARNING), logger.propagate
    logger.addHandler(handler)
    logger.propagate = False  # once, as ours, not again by the root logger
    try:
        yield
    finally:
        logger.removeHandler(handler)
        logger.propagate = propagate


def print_note(message: str) -> None:
    """A note on stderr (something the user may want to know, not a problem of the
    input) that does not break a running progress bar."""
    tqdm.write(f"nmt-generate: note: {message}", file=sys.stderr)


def is_data_file(path: Path) -> bool:
    """A file nmt-preprocess writes into a data dir (a hypothesis file beside them is not)."""
    return path.name in ("meta.json", "config.yaml") or path.suffix in DATA_SUFFIXES


DATA_SUFFIXES = (".bin", ".idx", ".model", ".vocab")


def text_lines(path: str, key: str, errors: str) -> TextLines:
    """The lines of a text input (`key`= names it): a file, plain or compressed as
    nmt-preprocess reads them, or stdin ("-"); invalid UTF-8 as `errors` says."""
    if path != STDIN:
        check_text_file(path, key)
    return TextLines(path, errors, opener=lambda name: open_text(Path(name)))


def check_text_file(path: str, key: str) -> None:
    """NmtError naming `key` unless `path` is an existing file."""
    if Path(path).is_dir():
        raise NmtError(f"{key}={path}: is a directory; name a text file")
    if not Path(path).is_file():
        raise NmtError(f"{key}={path}: no such file; name an existing text file")


def scan_text_file(path: str, key: str, errors: str) -> int:
    """The lines of a text file, counted in one streaming pass (memory: a block of it)
    that, with errors="strict", also checks that every line is UTF-8: the error names the
    first bad line before any translation starts."""
    check_text_file(path, key)
    scan = scan_file(Path(path), chunk_lines=1 << 62, check_utf8=errors == "strict", remedy=REMEDY)
    return scan.lines


def read_text_lines(path: str, key: str = "input", errors: str = "strict") -> Iterator[str]:
    """The decoded lines of a text input, raising the strict-mode error where it occurs."""
    lines = text_lines(path, key, errors)
    yield from lines
    lines.check()


class SourceEncoder(TextEncoder):
    """Raw lines -> Sources: normalization as preprocess did, SentencePiece, EOS, length
    cap; warnings go to stderr above the progress bar unless `warn` says otherwise."""

    def __init__(
        self,
        tokenizer: Tokenizer,
        nfkc: bool,
        max_positions: int,
        overlong: str,
        where: str,
        warn: Callable[[str], None] | None = None,
    ):
        super().__init__(tokenizer, nfkc, max_positions, overlong, where, warn or print_warning)

    def encode(
        self, lines: Sequence[str], first_index: int, refs: Sequence[str | None] | None = None
    ) -> list[Source]:
        texts = self.normalize(lines)
        return [
            Source(
                index=first_index + i,
                ids=self.fit(ids, first_index + i),
                text=text,
                ref=None if refs is None else refs[i],
            )
            for i, (text, ids) in enumerate(zip(texts, self.to_ids(texts)))
        ]


def text_sources(
    lines: TextLines, encoder: SourceEncoder, chunk: int, refs: AlignedLines | None = None
) -> Iterator[list[Source]]:
    """Sources of a text file or stdin, `chunk` lines at a time, references zipped in.

    In strict mode the iteration ends at a line of invalid UTF-8, after the chunk of the
    lines before it: `lines.error()` is then the caller's to raise."""
    stream = iter(lines)
    index = 0
    while batch := list(itertools.islice(stream, chunk)):
        batch_refs = None if refs is None else [r.rstrip() for r in refs.take(len(batch))]
        yield encoder.encode(batch, index, batch_refs)
        index += len(batch)
    if refs is not None and lines.problem is None:
        refs.check_exhausted()


class AlignedLines:
    """The lines of a side file (references, prefixes) taken in step with the input, so
    that a count mismatch is an error naming the file even when the input is a stream.
    Invalid UTF-8 in it is an error at once (strict) or replaced (`errors`)."""

    def __init__(self, path: str, key: str, input_name: str, errors: str = "strict"):
        self.path, self.key, self.input_name = path, key, input_name
        self.text = text_lines(path, key, errors)
        self.lines = iter(self.text)
        self.taken = 0

    def take(self, n: int) -> list[str]:
        got = list(itertools.islice(self.lines, n))
        self.text.check()
        self.taken += len(got)
        if len(got) < n:
            raise NmtError(
                f"{self.path}: {self.taken} lines, fewer than input {self.input_name}; "
                f"{self.key}= needs one line per input line"
            )
        return got

    def check_exhausted(self) -> None:
        more = next(self.lines, None)
        self.text.check()
        if more is not None:
            raise NmtError(
                f"{self.path}: more lines than the {self.taken} of input {self.input_name}; "
                f"{self.key}= needs one line per input line"
            )


def with_side_lines(
    chunks: Iterator[list[Source]],
    side: AlignedLines,
    complete: Callable[[], bool],
    attach: Callable[[Source, str], None],
) -> Iterator[list[Source]]:
    """The chunks with each Source given its line of `side` (prefix_file=, constraints=)
    by `attach`; once they end, the side lines must be used up too if `complete()` says
    the input was read to its end."""
    for chunk in chunks:
        for source, line in zip(chunk, side.take(len(chunk))):
            attach(source, line)
        yield chunk
    if complete():
        side.check_exhausted()


def split_sources(
    src: TokenArray | Sequence[np.ndarray],
    tgt: TokenArray | Sequence[np.ndarray] | None,
    src_tok: Tokenizer,
    tgt_tok: Tokenizer,
    encoder: SourceEncoder,
    chunk: int,
) -> Iterator[list[Source]]:
    """Sources of a binarized split (ids as stored), references decoded from the target side."""
    for start in range(0, len(src), chunk):
        out = []
        for i in range(start, min(start + chunk, len(src))):
            ids = np.asarray(src[i], dtype=np.int64)
            if len(ids) <= 1:  # an empty line is stored as [EOS]
                ids = np.zeros(0, np.int64)
            ref_ids = None if tgt is None else np.asarray(tgt[i], dtype=np.int64)
            out.append(
                Source(
                    index=i,
                    ids=encoder.fit(ids, i) if len(ids) else ids,
                    text=src_tok.decode(ids),
                    ref=None if ref_ids is None else tgt_tok.decode(ref_ids),
                    ref_ids=ref_ids,
                )
            )
        yield out


def make_batches(
    sources: Sequence[Source], max_tokens: int, max_sentences: int
) -> list[list[Source]]:
    """Non-empty sources sorted by length (longest first), packed within the budgets
    (encoding.length_batches).

    max_tokens counts padded source tokens (sentences x longest); 0 = no token limit.
    """
    lengths = np.array([len(s.ids) for s in sources], dtype=np.int64)
    return [
        [sources[i] for i in batch] for batch in length_batches(lengths, max_tokens, max_sentences)
    ]


def collate(batch: Sequence[Source], device: torch.device) -> torch.Tensor:
    """Right-padded source ids [B,S]."""
    return pad_batch([s.ids for s in batch], device)


class OutputWriter:
    """Formats the hypotheses of each source, in input order.

    plain, nbest=1: the detokenized best translation, one line per input line.
    plain, nbest>1: Moses n-best lines `index ||| translation ||| score`.
    fairseq: S-/T-/H-/D-/P- (and A-) lines as fairseq-generate prints them; scores are
    natural-log probabilities (fairseq prints base 2).
    scores_only (score_reference): plain prints the one hypothesis' score per line;
    fairseq prints its lines as above (the hypothesis is the scored reference).
    """

    def __init__(
        self,
        stream: IO[str],
        tokenizer: Tokenizer,
        fmt: str,
        nbest: int,
        alignment: bool,
        flush: bool,
        scores_only: bool = False,
    ):
        self.stream = stream
        self.tokenizer = tokenizer
        self.pieces = PieceNames(tokenizer)
        self.fmt = fmt
        self.nbest = nbest
        self.alignment = alignment
        self.flush = flush
        self.scores_only = scores_only

    def write(self, source: Source, hyps: list[Hypothesis]) -> str:
        """Write one source's output; returns its best translation (detokenized)."""
        texts = [self.tokenizer.decode(h.tokens) for h in hyps]
        best = texts[0] if texts else ""
        if self.fmt == "plain" and self.scores_only:
            lines = [f"{hyps[0].score:.4f}"]
        elif self.fmt == "plain" and self.nbest == 1:
            lines = [best]
        elif self.fmt == "plain":
            lines = [f"{source.index} ||| {t} ||| {h.score:.4f}" for h, t in zip(hyps, texts)]
            lines = lines or [f"{source.index} |||  ||| 0.0000"]  # an empty input line
        else:
            lines = self._fairseq(source, hyps, texts)
        self.stream.write("".join(line + "\n" for line in lines))
        if self.flush:
            self.stream.flush()
        return best

    def _fairseq(self, source: Source, hyps: list[Hypothesis], texts: list[str]) -> list[str]:
        i = source.index
        lines = [f"S-{i}\t{source.text}"]
        if source.ref is not None:
            lines.append(f"T-{i}\t{source.ref}")
        if not hyps:  # empty input: an empty hypothesis, so that every input has H-/D- lines
            return lines + [f"H-{i}\t0.0000\t", f"D-{i}\t0.0000\t", f"P-{i}\t"]
        for h, text in zip(hyps, texts):
            pieces = " ".join(self.pieces(target_ids(h)))
            lines += [
                f"H-{i}\t{h.score:.4f}\t{pieces}",
                f"D-{i}\t{h.score:.4f}\t{text}",
                f"P-{i}\t" + " ".join(f"{p:.4f}" for p in h.positional_scores.tolist()),
            ]
            if self.alignment:
                lines.append(f"A-{i}\t{hard_alignment(h, len(source.ids))}")
        return lines


def hard_alignment(hyp: Hypothesis, src_len: int) -> str:
    """`src-tgt` pairs: each target token (EOS excluded) to the source token (EOS excluded)
    it attends to most."""
    return " ".join(f"{s}-{t}" for s, t in alignment_pairs(hyp, src_len))


@contextmanager
def open_output(path: str) -> Iterator[IO[str]]:
    """stdout, or a file written atomically (nmt.fsutil): a failure never leaves a
    half-written translation file behind, and a killed run's temporary is removed by the
    next run writing the same file."""
    if path == STDIN:
        try:
            yield sys.stdout
        finally:  # what was translated before an error is shown too
            sys.stdout.flush()
        return
    target = Path(path)
    if target.is_dir():
        raise NmtError(f"output={path}: is a directory; name a file")
    check_text_output(target, "output", "nmt-generate")
    target.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_temps(target)
    with atomic_write(target, "w") as f:
        yield f
