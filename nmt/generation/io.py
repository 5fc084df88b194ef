"""Input and output of nmt-generate: streamed sources, batches, formatted translations.

Inputs are read lazily (a text file or stdin line by line, a binarized split sentence by
sentence) so that any size of input runs in constant memory. Every input line becomes
exactly one `Source`, and every Source exactly one output entry: an empty line stays
empty, an over-long one is truncated with a warning (or refused, on request).
"""

from __future__ import annotations

import itertools
import os
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import IO

import numpy as np
import sentencepiece as spm
import torch
from tqdm import tqdm

from nmt.data.batching import pack
from nmt.data.tokenizer import Tokenizer, normalize_text
from nmt.data.vocab import EOS, PAD
from nmt.errors import NmtError
from nmt.generation.generator import Hypothesis

BOM = "\ufeff"


@dataclass
class Source:
    """One input sentence, ready for the model."""

    index: int  # 0-based position in the input (output order)
    ids: np.ndarray  # int64 source ids ending in EOS; empty for an empty line
    text: str  # the normalized source text
    ref: str | None = None  # reference translation, when known


def warn(message: str) -> None:
    """A warning on stderr that does not break a running progress bar."""
    tqdm.write(f"nmt-generate: warning: {message}", file=sys.stderr)


def count_lines(path: str) -> int:
    """Lines of a file ("\\n"-separated, a last line without "\\n" counted), cheaply."""
    count, last = 0, b"\n"
    with open(path, "rb") as f:
        while block := f.read(1 << 20):
            count += block.count(b"\n")
            last = block[-1:]
    return count + (last != b"\n")


def read_text_lines(path: str) -> Iterator[str]:
    """Decoded lines of a UTF-8 file or stdin ("-"), split at "\\n" only, read lazily."""
    name = "stdin" if path == "-" else path
    if path != "-" and not Path(path).is_file():
        raise NmtError(f"input {path}: no such file")
    stream = sys.stdin.buffer if path == "-" else open(path, "rb")
    try:
        for number, raw in enumerate(iter(stream.readline, b""), start=1):
            try:
                text = raw.decode("utf-8")
            except UnicodeDecodeError as exc:
                raise NmtError(
                    f"{name}:{number}: invalid UTF-8 ({exc.reason}); convert the input to UTF-8"
                ) from exc
            yield text.lstrip(BOM) if number == 1 else text
    finally:
        if stream is not sys.stdin.buffer:
            stream.close()


class SourceEncoder:
    """Raw text -> Source: normalization as preprocess did, SentencePiece, EOS, length cap."""

    def __init__(
        self, tokenizer: Tokenizer, nfkc: bool, max_positions: int, overlong: str, where: str
    ):
        self.tokenizer = tokenizer
        self.nfkc = nfkc
        self.max_positions = max_positions  # source tokens the model accepts, EOS included
        self.overlong = overlong
        self.where = where  # input name for messages

    def fit(self, ids: np.ndarray, index: int) -> np.ndarray:
        """Cut ids (EOS included) to the model's source positions, warning or failing."""
        if len(ids) <= self.max_positions:
            return ids
        message = (
            f"{self.where}:{index + 1}: {len(ids)} tokens, the model accepts {self.max_positions}"
        )
        if self.overlong == "error":
            raise NmtError(f"{message}; shorten the line or set overlong=truncate")
        warn(
            f"{message}; truncated to its first {self.max_positions - 1} tokens "
            "(overlong=error refuses such lines)"
        )
        return np.concatenate([ids[: self.max_positions - 1], ids[-1:]])

    def encode(
        self, lines: Sequence[str], first_index: int, refs: Sequence[str | None] | None = None
    ) -> list[Source]:
        texts = [normalize_text(line, self.nfkc) for line in lines]
        encoded = self.tokenizer.encode_batch(texts)
        out = []
        for i, (text, ids) in enumerate(zip(texts, encoded)):
            index = first_index + i
            arr = np.asarray(ids + [EOS], dtype=np.int64) if text else np.zeros(0, np.int64)
            out.append(
                Source(
                    index=index,
                    ids=self.fit(arr, index),
                    text=text,
                    ref=None if refs is None else refs[i],
                )
            )
        return out


def text_sources(
    path: str, encoder: SourceEncoder, chunk: int, ref_path: str | None = None
) -> Iterator[list[Source]]:
    """Sources of a text file or stdin, `chunk` lines at a time, references zipped in."""
    lines = read_text_lines(path)
    refs = None if ref_path is None else read_text_lines(ref_path)
    index = 0
    while batch := list(itertools.islice(lines, chunk)):
        batch_refs = None
        if refs is not None:
            batch_refs = [r.rstrip() for r in itertools.islice(refs, len(batch))]
            if len(batch_refs) < len(batch):
                raise NmtError(
                    f"ref {ref_path}: {index + len(batch_refs)} lines, fewer than input "
                    f"{path}; they must be line-aligned"
                )
        yield encoder.encode(batch, index, batch_refs)
        index += len(batch)
    if refs is not None and next(refs, None) is not None:
        raise NmtError(
            f"ref {ref_path}: more lines than the {index} of input {path}; they "
            "must be line-aligned"
        )


def split_sources(
    src: Sequence[np.ndarray],
    tgt: Sequence[np.ndarray] | None,
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
            ref = None if tgt is None else tgt_tok.decode(tgt[i])
            out.append(
                Source(
                    index=i,
                    ids=encoder.fit(ids, i) if len(ids) else ids,
                    text=src_tok.decode(ids),
                    ref=ref,
                )
            )
        yield out


def make_batches(
    sources: Sequence[Source], max_tokens: int, max_sentences: int
) -> list[list[Source]]:
    """Non-empty sources sorted by length (longest first), packed within the budgets.

    max_tokens counts padded source tokens (sentences x longest); 0 = no token limit.
    """
    todo = [s for s in sources if len(s.ids)]
    if not todo:
        return []
    lengths = np.array([len(s.ids) for s in todo], dtype=np.int64)
    order = np.argsort(-lengths, kind="stable")
    budget = max_tokens if max_tokens > 0 else np.iinfo(np.int64).max
    return [
        [todo[i] for i in batch]
        for batch in pack(order, lengths, max_tokens=budget, max_sentences=max_sentences)
    ]


def collate(batch: Sequence[Source], device: torch.device) -> torch.Tensor:
    """Right-padded source ids [B,S]."""
    longest = max(len(s.ids) for s in batch)
    out = np.full((len(batch), longest), PAD, dtype=np.int64)
    for row, s in enumerate(batch):
        out[row, : len(s.ids)] = s.ids
    return torch.from_numpy(out).to(device)


class OutputWriter:
    """Formats the hypotheses of each source, in input order.

    plain, nbest=1: the detokenized best translation, one line per input line.
    plain, nbest>1: Moses n-best lines `index ||| translation ||| score`.
    fairseq: S-/T-/H-/D-/P- (and A-) lines as fairseq-generate prints them; scores are
    natural-log probabilities (fairseq prints base 2).
    """

    def __init__(
        self,
        stream: IO[str],
        tokenizer: Tokenizer,
        fmt: str,
        nbest: int,
        alignment: bool,
        flush: bool,
    ):
        self.stream = stream
        self.tokenizer = tokenizer
        self.pieces = spm.SentencePieceProcessor(model_proto=tokenizer.model_bytes)
        self.fmt = fmt
        self.nbest = nbest
        self.alignment = alignment
        self.flush = flush

    def write(self, source: Source, hyps: list[Hypothesis]) -> str:
        """Write one source's output; returns its best translation (detokenized)."""
        texts = [self.tokenizer.decode(h.tokens) for h in hyps]
        best = texts[0] if texts else ""
        if self.fmt == "plain" and self.nbest == 1:
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
            ids = [t for t in h.tokens.tolist() if t != EOS]
            pieces = " ".join(self.pieces.id_to_piece(ids)) if ids else ""
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
    if hyp.attention is None or src_len <= 1 or len(hyp.tokens) <= 1:
        return ""
    attn = hyp.attention[: len(hyp.tokens) - 1, : src_len - 1]  # [T-1, S-1]
    return " ".join(f"{s}-{t}" for t, s in enumerate(attn.argmax(dim=1).tolist()))


@contextmanager
def open_output(path: str) -> Iterator[IO[str]]:
    """stdout, or a file written under a temporary name and renamed when complete, so a
    failure never leaves a half-written translation file behind."""
    if path == "-":
        yield sys.stdout
        sys.stdout.flush()
        return
    target = Path(path)
    if target.is_dir():
        raise NmtError(f"output {path}: is a directory; name a file")
    target.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{target.name}.", suffix=".tmp", dir=target.parent)
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            yield f
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, target)
    finally:
        Path(tmp).unlink(missing_ok=True)
