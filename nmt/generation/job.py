"""nmt-generate's work as one library call: stream text (a file or stdin) or a data dir
split through a Translator in chunks, write every input line's output in input order
(atomically to a file, or to stdout), then print throughput (and BLEU when references
are known) on stderr. With score_reference, the references are scored instead of
translated (forced decoding).
"""

from __future__ import annotations

import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nmt.errors import NmtError
from nmt.generation.config import GenerateConfig, search_config
from nmt.generation.generator import Hypothesis
from nmt.generation.io import (
    OutputWriter,
    Source,
    SourceEncoder,
    count_lines,
    open_output,
    print_warning,
    split_sources,
    text_sources,
    with_prefixes,
)
from nmt.generation.translator import Translator
from nmt.scoring import corpus_bleu

Step = Callable[[list[Source]], list[list[Hypothesis]]]


def generate(cfg: GenerateConfig) -> int:
    """Run nmt-generate as `cfg` says; returns the exit code (0)."""
    cfg.validate()
    translator = Translator.load(
        cfg.checkpoint,
        search_config(cfg),
        device=cfg.device,
        precision=cfg.resolved_precision,
        threads=cfg.threads,
        max_tokens=cfg.max_tokens,
        max_sentences=cfg.max_sentences,
        overlong=cfg.overlong,
        alignment_layer=cfg.alignment_layer,
        precision_key="dtype" if cfg.precision is None and cfg.dtype is not None else "precision",
        shortlist=cfg.shortlist,
    )
    if cfg.dtype is not None:
        print(
            f"nmt-generate: note: dtype= is now precision=; write precision={cfg.dtype} "
            "(dtype= will go away)",
            file=sys.stderr,
        )
    interactive = cfg.interactive if cfg.interactive is not None else cfg.input == "-"
    chunks, total = open_sources(cfg, translator, 1 if interactive else cfg.buffer_size)
    step = scorer(cfg, translator) if cfg.score_reference else translator_step(cfg, translator)

    n_sent = n_tokens = 0
    hyps_text: list[str] = []
    refs: list[str] = []
    start = time.perf_counter()
    with (
        open_output(cfg.output) as stream,
        tqdm(
            total=total,
            unit="sent",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
            # None: tqdm's own choice, off when stderr is not a terminal (logs stay clean)
            disable=True if (interactive or not cfg.progress or total is None) else None,
        ) as bar,
    ):
        writer = OutputWriter(
            stream,
            translator.tgt_tokenizer,
            cfg.format,
            cfg.nbest,
            cfg.print_alignment,
            flush=interactive,
            scores_only=cfg.score_reference,
        )
        for chunk in chunks:
            results = step(chunk)
            for src, hyps in zip(chunk, results):
                best = writer.write(src, hyps)
                n_tokens += len(hyps[0].tokens) if hyps else 0
                if src.ref is not None:
                    hyps_text.append(best)
                    refs.append(src.ref)
            n_sent += len(chunk)
            bar.update(len(chunk))
    elapsed = max(time.perf_counter() - start, 1e-9)
    done = "scored" if cfg.score_reference else "translated"
    what = "sentence pairs" if cfg.score_reference else "sentences"
    print(
        f"nmt-generate: {done} {n_sent} {what} ({n_tokens} target tokens) in "
        f"{elapsed:.1f}s: {n_sent / elapsed:.1f} sentences/s, {n_tokens / elapsed:.0f} tokens/s",
        file=sys.stderr,
    )
    if refs and len(refs) == n_sent and not cfg.score_reference:
        print(f"nmt-generate: {corpus_bleu(hyps_text, [refs]).line}", file=sys.stderr)
    return 0


def translator_step(cfg: GenerateConfig, translator: Translator) -> Step:
    """Chunk of sources -> their hypotheses (beam search or sampling)."""
    prefix = translator.encode_prefix(cfg.prefix)

    def step(chunk: list[Source]) -> list[list[Hypothesis]]:
        prefixes: list[list[int] | None] | None = None
        if prefix is not None:
            prefixes = [prefix] * len(chunk)
        elif cfg.prefix_file is not None:
            prefixes = [translator.encode_prefix(s.prefix) for s in chunk]
        return translator.translate_ids(
            [s.ids for s in chunk], prefixes=prefixes, alignment=cfg.print_alignment
        )

    return step


def scorer(cfg: GenerateConfig, translator: Translator) -> Step:
    """Chunk of sources -> [the reference as a scored hypothesis] each (forced decoding)."""
    where = cfg.ref if cfg.ref is not None else f"{cfg.input} split {cfg.split} target side"
    encoder = translator.target_encoder(where, warn=print_warning)

    def step(chunk: list[Source]) -> list[list[Hypothesis]]:
        targets: list[np.ndarray] = []
        for s in chunk:
            ids = s.ref_ids
            if ids is None:  # a text reference
                ids = encoder.to_ids(encoder.normalize([s.ref or ""]))[0]
            targets.append(encoder.fit(ids, s.index))
        return [[h] for h in translator.score_ids([s.ids for s in chunk], targets)]

    return step


def open_sources(
    cfg: GenerateConfig, translator: Translator, chunk: int
) -> tuple[Iterator[list[Source]], int | None]:
    """The input as chunks of Sources (prefixes attached), and its length when known."""
    where = (
        "stdin"
        if cfg.input == "-"
        else f"{cfg.input} split {cfg.split}"
        if cfg.split
        else cfg.input
    )
    encoder = SourceEncoder(
        translator.src_tokenizer,
        translator.nfkc,
        translator.max_source_positions,
        cfg.overlong,
        where,
    )
    total: int | None
    if cfg.split is not None:
        chunks, total = _split_sources(cfg, translator, encoder, chunk)
    else:
        chunks, total = _text_sources(cfg, encoder, chunk)
    if cfg.prefix_file is not None:
        if total is not None:
            _check_line_count(cfg.prefix_file, "prefix_file", total, where)
        chunks = with_prefixes(chunks, cfg.prefix_file, where)
    return chunks, total


def _split_sources(
    cfg: GenerateConfig, translator: Translator, encoder: SourceEncoder, chunk: int
) -> tuple[Iterator[list[Source]], int]:
    from nmt.data.binarize import TokenArray
    from nmt.data.meta import load_meta, split_prefix

    meta = load_meta(cfg.input)
    for side in ("src", "tgt"):
        if meta.tokenizers[side]["sha256"] != getattr(translator, f"{side}_tokenizer").sha256:
            raise NmtError(
                f"{cfg.input}: its {side} SentencePiece model is not the checkpoint's; "
                "translate a data dir built for this model"
            )
    if cfg.split not in meta.splits:
        raise NmtError(
            f"split={cfg.split}: not in {cfg.input}; choose one of {', '.join(sorted(meta.splits))}"
        )
    src = TokenArray(split_prefix(cfg.input, cfg.split, meta.src_lang))
    tgt_prefix = split_prefix(cfg.input, cfg.split, meta.tgt_lang)
    tgt = TokenArray(tgt_prefix) if Path(f"{tgt_prefix}.bin").is_file() else None
    if cfg.score_reference and tgt is None:
        raise NmtError(
            f"score_reference=true: split {cfg.split} of {cfg.input} has no {meta.tgt_lang} "
            "side to score; choose a split with references, or text input with ref="
        )
    return (
        split_sources(src, tgt, translator.src_tokenizer, translator.tgt_tokenizer, encoder, chunk),
        len(src),
    )


def _text_sources(
    cfg: GenerateConfig, encoder: SourceEncoder, chunk: int
) -> tuple[Iterator[list[Source]], int | None]:
    if cfg.input != "-" and Path(cfg.input).is_dir():
        raise NmtError(
            f"input={cfg.input}: a directory; for a data dir add split=test, "
            "otherwise name a text file"
        )
    total: int | None = None
    if cfg.input != "-" and Path(cfg.input).is_file():
        total = count_lines(cfg.input)
        if cfg.ref is not None:
            _check_line_count(cfg.ref, "ref", total, cfg.input)
    return text_sources(cfg.input, encoder, chunk, cfg.ref), total


def _check_line_count(path: str, key: str, total: int, input_name: str) -> None:
    """A side file (ref=, prefix_file=) must have a line per input line."""
    if not Path(path).is_file():
        raise NmtError(f"{key}={path}: no such file; name an existing text file")
    lines = count_lines(path)
    if lines != total:
        raise NmtError(
            f"{path}: {lines} lines, but input {input_name} has {total}; {key}= needs one "
            "line per input line"
        )
