"""Binarized splits: `<prefix>.bin` (flat token ids) + `<prefix>.idx` (int64 offsets, n+1).

Sentence i is `bin[idx[i]:idx[i+1]]`. Both files are memory-mapped when read, so opening
a split costs nothing and sentence i is read without loading the rest. The token dtype is
uint16 when the vocabulary fits, else int32; a reader infers it from the file sizes.

`encode_split` turns a pair of text files into these arrays: chunks of lines are encoded
(read, normalize, SentencePiece, clean) in `workers` processes and written in chunk order,
so the output does not depend on the number of workers. Duplicate pairs (clean.dedup) are
dropped as the chunks are written, in order, by the hashes the workers computed.
"""

from __future__ import annotations

import itertools
import multiprocessing
import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ProcessPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from pathlib import Path
from typing import cast

import numpy as np

from nmt.data.cleaning import CleanRules, LanguageFilter, SeenPairs, pair_hashes
from nmt.data.corpus import INVALID_UTF8, FileScan, decode_lines, read_chunks, read_lines
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.processes import become_child_of, interrupts_deferred
from nmt.vocab import EOS


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    return np.dtype(np.uint16) if vocab_size <= np.iinfo(np.uint16).max + 1 else np.dtype(np.int32)


class TokenArray:
    """Read-only, memory-mapped view of one binarized split and side."""

    def __init__(self, prefix: str | os.PathLike, dtype: str | None = None) -> None:
        """`dtype`: meta.json's ("uint16" or "int32"); None tells it from the file sizes."""
        self.prefix = str(prefix)
        bin_path, idx_path = Path(self.prefix + ".bin"), Path(self.prefix + ".idx")
        for path in (bin_path, idx_path):
            if not path.is_file():
                raise NmtError(f"{path}: missing; rebuild the data dir with nmt-preprocess")
        idx_bytes = idx_path.stat().st_size
        if idx_bytes == 0 or idx_bytes % 8:
            raise NmtError(f"{idx_path}: truncated index; rebuild the data dir with nmt-preprocess")
        self._idx = np.memmap(idx_path, dtype=np.int64, mode="r")
        n_tokens = int(self._idx[-1])
        itemsize = _token_size(bin_path, idx_path, n_tokens, dtype)
        if n_tokens == 0:
            self._bin: np.ndarray = np.zeros(0, dtype=np.uint16)
        else:
            self._bin = np.memmap(
                bin_path, dtype=np.uint16 if itemsize == 2 else np.int32, mode="r"
            )

    @property
    def dtype(self) -> np.dtype:
        return self._bin.dtype

    def __len__(self) -> int:
        return len(self._idx) - 1

    def __getitem__(self, i: int) -> np.ndarray:
        n = len(self)
        if i < 0:
            i += n
        if not 0 <= i < n:
            raise IndexError(f"sentence {i} out of range for {n} sentences in {self.prefix}")
        start, end = self._idx[i], self._idx[i + 1]
        return np.array(self._bin[start:end], dtype=np.int64)

    @property
    def sizes(self) -> np.ndarray:
        """Length of every sentence (EOS included), int64."""
        if not hasattr(self, "_sizes"):
            self._sizes = np.diff(np.asarray(self._idx))
        return self._sizes

    def lengths(self, limit: int | None = None) -> np.ndarray:
        """Lengths of the first `limit` sentences (None: all) in the smallest unsigned dtype
        that holds them (uint8 for text cleaned to 250 pieces): 1-2 bytes a sentence instead
        of `sizes`' 8. The index is read in chunks, not through the memory map, so a big
        split costs no resident memory beyond the result."""
        return read_lengths(self.prefix + ".idx", len(self) if limit is None else limit)

    # DataLoader workers get the path and map the files again, instead of a copy of the data
    def __getstate__(self) -> dict:
        return {"prefix": self.prefix, "dtype": str(self._bin.dtype)}

    def __setstate__(self, state: dict) -> None:
        TokenArray.__init__(self, state["prefix"], state.get("dtype"))


def _token_size(bin_path: Path, idx_path: Path, n_tokens: int, dtype: str | None) -> int:
    """Bytes per token of `bin_path` (2 or 4), which must hold exactly the `n_tokens` tokens
    `idx_path` ends with; otherwise an NmtError blaming the file that is short: a .bin
    holding more tokens than its index describes means the index lost its end."""
    bin_bytes = bin_path.stat().st_size
    sizes = [np.dtype(dtype).itemsize] if dtype else [2, 4]
    for size in sizes:
        if bin_bytes == n_tokens * size:
            return size
    whole = [size for size in sizes if bin_bytes % size == 0] or sizes  # possible token sizes
    fix = "rebuild the data dir with nmt-preprocess"
    if all(bin_bytes > n_tokens * size for size in whole):
        raise NmtError(
            f"{idx_path}: truncated or damaged: it describes {n_tokens} tokens, but "
            f"{bin_path.name} holds more ({bin_bytes} bytes); {fix}"
        )
    if all(bin_bytes < n_tokens * size for size in whole):
        raise NmtError(
            f"{bin_path}: truncated: {bin_bytes} bytes, but {idx_path.name} describes "
            f"{n_tokens} tokens; {fix}"
        )
    raise NmtError(
        f"{bin_path}: {bin_bytes} bytes do not hold the {n_tokens} tokens {idx_path.name} "
        f"describes; {fix}"
    )


_LENGTH_CHUNK = 1 << 20  # offsets read at a time by read_lengths


def _offset_chunks(idx_path: str, n: int) -> Iterator[tuple[int, np.ndarray]]:
    """(first sentence, its lengths as int64) for chunks of the first n sentences."""
    with open(idx_path, "rb") as f:
        for start in range(0, n, _LENGTH_CHUNK):
            count = min(_LENGTH_CHUNK, n - start)
            f.seek(8 * start)
            offsets = np.fromfile(f, dtype=np.int64, count=count + 1)
            if len(offsets) != count + 1:
                raise NmtError(
                    f"{idx_path}: truncated index; rebuild the data dir with nmt-preprocess"
                )
            yield start, np.diff(offsets)


def read_lengths(idx_path: str | os.PathLike, n: int) -> np.ndarray:
    """Lengths of the first n sentences of an .idx file, in the smallest unsigned dtype."""
    idx_path = str(idx_path)
    longest = 0
    for _, lens in _offset_chunks(idx_path, n):
        longest = max(longest, int(lens.max(initial=0)))
    dtype = np.min_scalar_type(longest)  # uint8, uint16, uint32 or uint64
    out = np.empty(n, dtype=dtype)
    for start, lens in _offset_chunks(idx_path, n):
        out[start : start + len(lens)] = lens
    return out


class TokenArrayWriter:
    """Appends sentences chunk by chunk to `<prefix>.bin` and `.idx`; call close() at the end."""

    def __init__(self, prefix: str | os.PathLike, dtype: np.dtype) -> None:
        self.dtype = np.dtype(dtype)
        self._bin = open(f"{prefix}.bin", "wb")
        self._idx = open(f"{prefix}.idx", "wb")
        self.tokens = 0
        self.sentences = 0
        np.zeros(1, dtype=np.int64).tofile(self._idx)

    def add(self, ids: np.ndarray, lengths: np.ndarray) -> None:
        """`ids`: the chunk's sentences concatenated; `lengths`: tokens per sentence."""
        self._bin.write(np.ascontiguousarray(ids, dtype=self.dtype).tobytes())
        (self.tokens + np.cumsum(lengths, dtype=np.int64)).tofile(self._idx)
        self.tokens += int(np.sum(lengths, dtype=np.int64))
        self.sentences += len(lengths)

    def close(self) -> None:
        self._bin.close()
        self._idx.close()


@dataclass
class ChunkResult:
    """One encoded chunk: kept sentences (EOS appended) of both sides, and what was dropped."""

    lines: int
    src_ids: np.ndarray
    src_lens: np.ndarray
    tgt_ids: np.ndarray
    tgt_lens: np.ndarray
    removed: dict[str, int]
    bad_utf8: int  # lines with invalid UTF-8 (replaced or skipped)
    hashes: np.ndarray | None = None  # with clean.dedup: the kept pairs' (pair_hashes)

    def select(self, keep: np.ndarray) -> None:
        """Keep the pairs `keep` marks (a mask over the kept pairs)."""
        self.src_ids, self.src_lens = _select(self.src_ids, self.src_lens, keep)
        self.tgt_ids, self.tgt_lens = _select(self.tgt_ids, self.tgt_lens, keep)


@dataclass(frozen=True)
class EncodeSettings:
    """Everything a worker needs besides the chunk: fixed for the whole run."""

    src_model: bytes
    tgt_model: bytes
    dtype: str
    nfkc: bool
    on_invalid_utf8: str


@dataclass(frozen=True)
class ChunkTask:
    src: Path
    tgt: Path
    src_range: tuple[int, int]
    tgt_range: tuple[int, int]
    first_line: int  # 0-based
    clean: CleanRules | None  # None for valid/test: every line is kept
    # the chunk's raw text when the file is compressed (the main process reads the stream);
    # None: the worker reads the range from the file itself
    src_data: bytes | None = None
    tgt_data: bytes | None = None


_worker: _ChunkEncoder | None = None


class _ChunkEncoder:
    def __init__(self, settings: EncodeSettings) -> None:
        self.settings = settings
        self.src = Tokenizer(settings.src_model)
        joint = settings.tgt_model == settings.src_model
        self.tgt = self.src if joint else Tokenizer(settings.tgt_model)
        self.dtype = np.dtype(settings.dtype)
        self._languages: LanguageFilter | None = None  # loaded for the first langid task

    def __call__(self, task: ChunkTask) -> ChunkResult:
        s = self.settings
        src_lines, src_bad = _chunk_lines(task.src, task.src_range, task.src_data, task, s)
        tgt_lines, tgt_bad = _chunk_lines(task.tgt, task.tgt_range, task.tgt_data, task, s)
        if len(src_lines) != len(tgt_lines):  # the scan matched the counts; files changed since
            raise NmtError(f"{task.src} and {task.tgt} changed while being read; run again")
        n = len(src_lines)
        removed = {INVALID_UTF8: 0}
        if None in src_lines or None in tgt_lines:  # lines skipped for invalid UTF-8 drop the pair
            pairs = [
                (a, b) for a, b in zip(src_lines, tgt_lines) if a is not None and b is not None
            ]
            removed[INVALID_UTF8] = n - len(pairs)
            src_lines, tgt_lines = [a for a, _ in pairs], [b for _, b in pairs]
        # no None is left: the pairs with a skipped line are gone
        texts = cast(list[str], src_lines), cast(list[str], tgt_lines)
        src_ids, src_lens = self._encode(self.src, texts[0])
        tgt_ids, tgt_lens = self._encode(self.tgt, texts[1])
        hashes = None
        if task.clean is not None:
            keep, counts = task.clean.apply(src_lens, tgt_lens)
            keep, text_counts = task.clean.apply_text(*texts, keep, self._language_filter(task))
            removed.update(counts, **text_counts)
            src_ids, src_lens = _select(src_ids, src_lens, keep)
            tgt_ids, tgt_lens = _select(tgt_ids, tgt_lens, keep)
            if task.clean.dedup:
                kept = np.flatnonzero(keep)
                hashes = pair_hashes([texts[0][i] for i in kept], [texts[1][i] for i in kept])
        src_ids, src_lens = _append_eos(src_ids, src_lens)
        tgt_ids, tgt_lens = _append_eos(tgt_ids, tgt_lens)
        return ChunkResult(
            n, src_ids, src_lens, tgt_ids, tgt_lens, removed, src_bad + tgt_bad, hashes
        )

    def _language_filter(self, task: ChunkTask) -> LanguageFilter | None:
        rule = task.clean.langid if task.clean is not None else None
        if rule is None:
            return None
        if self._languages is None or self._languages.rule != rule:
            self._languages = LanguageFilter(rule)
        return self._languages

    def _encode(self, tokenizer: Tokenizer, lines: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Flat ids and per-sentence lengths, built by numpy from SentencePiece's batch output."""
        encoded = tokenizer.encode_batch(lines)
        lens = np.fromiter(map(len, encoded), dtype=np.int64, count=len(encoded))
        ids = np.fromiter(
            itertools.chain.from_iterable(encoded), dtype=self.dtype, count=int(lens.sum())
        )
        return ids, lens


def _chunk_lines(
    path: Path, span: tuple[int, int], data: bytes | None, task: ChunkTask, s: EncodeSettings
) -> tuple[list[str | None], int]:
    if data is None:
        return read_lines(path, *span, task.first_line, s.on_invalid_utf8, s.nfkc)
    return decode_lines(data, span[0] == 0, path, task.first_line, s.on_invalid_utf8, s.nfkc)


def _select(ids: np.ndarray, lens: np.ndarray, keep: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    return ids[np.repeat(keep, lens)], lens[keep]


def _append_eos(ids: np.ndarray, lens: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Insert EOS after every sentence: positions are the sentence ends in `ids`."""
    return np.insert(ids, np.cumsum(lens), EOS), lens + 1


def _init_worker(settings: EncodeSettings, parent_pid: int) -> None:
    global _worker
    become_child_of(parent_pid)  # never outlive the main process, even one killed by -9
    _worker = _ChunkEncoder(settings)


def _run_chunk(task: ChunkTask) -> ChunkResult:
    assert _worker is not None
    return _worker(task)


@dataclass
class SplitStats:
    """What meta.json records for a split."""

    lines: int = 0
    kept: int = 0
    removed: dict[str, int] = field(default_factory=dict)
    src_tokens: int = 0
    tgt_tokens: int = 0
    bad_utf8: int = 0  # reported, not stored: replaced lines are kept, skipped ones are removed


def _chunk_tasks(
    src: FileScan, tgt: FileScan, chunk_lines: int, clean: CleanRules | None
) -> Iterator[ChunkTask]:
    """One task per chunk of lines, made as the encoder asks for them; a compressed file's
    chunks are read here, as one stream, and handed over as bytes."""
    src_data = read_chunks(src) if src.compressed else None
    tgt_data = read_chunks(tgt) if tgt.compressed else None
    for k in range(src.chunks):
        yield ChunkTask(
            src.path,
            tgt.path,
            src.chunk(k),
            tgt.chunk(k),
            k * chunk_lines,
            clean,
            next(src_data) if src_data is not None else None,
            next(tgt_data) if tgt_data is not None else None,
        )


class Encoder:
    """Encodes splits with `workers` processes (or in-process for one); use as a context.

    A process pool from concurrent.futures, not multiprocessing.Pool: if a worker dies
    (killed, out of memory) the run fails at once instead of waiting forever for its chunk.
    At most `2 * workers` chunks are in flight, so memory stays bounded on any corpus.
    """

    def __init__(self, settings: EncodeSettings, workers: int) -> None:
        self.settings = settings
        self.workers = workers
        self._pool: ProcessPoolExecutor | None = None
        self._local: _ChunkEncoder | None = None

    def __enter__(self) -> Encoder:
        if self.workers > 1:
            self._pool = ProcessPoolExecutor(
                self.workers,
                mp_context=multiprocessing.get_context(),
                initializer=_init_worker,
                initargs=(self.settings, os.getpid()),
            )
        else:
            self._local = _ChunkEncoder(self.settings)
        return self

    def __exit__(self, *exc: object) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool = None

    def _submit(self, task: ChunkTask) -> Future[ChunkResult]:
        assert self._pool is not None
        with interrupts_deferred():  # a submit may fork the workers
            return self._pool.submit(_run_chunk, task)

    def _results(self, tasks: Iterable[ChunkTask]) -> Iterator[ChunkResult]:
        """Results in the order of `tasks`, whatever order the workers finish in."""
        if self._pool is None:
            assert self._local is not None
            yield from map(self._local, tasks)
            return
        pending: deque[Future[ChunkResult]] = deque()
        queue = iter(tasks)
        for task in itertools.islice(queue, 2 * self.workers):
            pending.append(self._submit(task))
        while pending:
            try:
                result = pending.popleft().result()
            except BrokenProcessPool as exc:
                raise NmtError(
                    "an encoding worker process died (killed, or out of memory?); run again "
                    "with fewer workers or a smaller chunk_lines"
                ) from exc
            for task in itertools.islice(queue, 1):
                pending.append(self._submit(task))
            yield result

    def encode_split(
        self,
        src: FileScan,
        tgt: FileScan,
        chunk_lines: int,
        out_prefix_src: Path,
        out_prefix_tgt: Path,
        clean: CleanRules | None,
        progress: Callable[[int], object] = lambda n: None,
    ) -> SplitStats:
        """Write both sides of one split; returns its counts."""
        tasks = _chunk_tasks(src, tgt, chunk_lines, clean)
        dtype = np.dtype(self.settings.dtype)
        rules = (INVALID_UTF8, *clean.names) if clean is not None else (INVALID_UTF8,)
        stats = SplitStats(removed=dict.fromkeys(rules, 0))
        seen = SeenPairs(src.lines) if clean is not None and clean.dedup else None
        src_out = TokenArrayWriter(out_prefix_src, dtype)
        tgt_out = TokenArrayWriter(out_prefix_tgt, dtype)
        try:
            for result in self._results(tasks):
                if seen is not None:
                    assert result.hashes is not None
                    first = seen.first_seen(result.hashes)
                    result.select(first)
                    result.removed["duplicate"] = len(first) - int(first.sum())
                src_out.add(result.src_ids, result.src_lens)
                tgt_out.add(result.tgt_ids, result.tgt_lens)
                stats.lines += result.lines
                stats.bad_utf8 += result.bad_utf8
                for rule, count in result.removed.items():
                    stats.removed[rule] += count
                progress(result.lines)
        finally:
            src_out.close()
            tgt_out.close()
        stats.kept = src_out.sentences
        stats.src_tokens, stats.tgt_tokens = src_out.tokens, tgt_out.tokens
        return stats
