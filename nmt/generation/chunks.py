"""One chunk of nmt-generate's input (consecutive lines, `buffer_size` of them) in, its
finished output out: the formatted text of its lines, their notes, their counts.

Both ways of running nmt-generate go through `ChunkTranslator`: one process chunk after
chunk (workers=1), or worker processes a chunk each (workers=N, nmt.generation.workers),
whose outputs the parent writes in input order. The same chunks, batched and formatted
by the same code, give the same bytes. Sampling draws each chunk's random stream from
(seed, its first line's index), so a line's sample does not depend on which process
translates it, nor on the chunks translated before.
"""

from __future__ import annotations

import io
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.generation.config import GenerateConfig, search_config
from nmt.generation.generator import Hypothesis
from nmt.generation.io import OutputWriter, Source, print_warning
from nmt.generation.terminology import Glossary
from nmt.generation.translator import Translator

Step = Callable[[list[Source]], list[list[Hypothesis]]]
MAX_SEED = 2**63 - 1


@dataclass
class ChunkOutput:
    """What a chunk of input lines became: plain data, sent between processes and kept
    in the work folder of a resumable run (nmt.generation.workfolder)."""

    first: int  # the 0-based index of its first input line
    lines: int  # how many input lines it holds
    text: str  # the output of its lines, formatted as output= receives it
    notes: list[str]  # per-line notes (unmet include phrases), in line order
    tokens: int  # target tokens of the best translations
    best: list[str]  # per line, the best translation (detokenized), for BLEU


def load_translator(cfg: GenerateConfig, threads: int) -> Translator:
    """The Translator nmt-generate translates with, using `threads` CPU threads."""
    return Translator.from_checkpoint(
        cfg.checkpoint,
        device=cfg.device,
        precision=cfg.precision,
        threads=threads,
        max_tokens=cfg.max_tokens,
        max_sentences=cfg.max_sentences,
        overlong=cfg.overlong,
        alignment_layer=cfg.alignment_layer,
        shortlist=cfg.shortlist,
        search=search_config(cfg),
    )


class ChunkTranslator:
    """Chunks of Sources -> ChunkOutputs (beam search, sampling, or scoring references)."""

    def __init__(self, cfg: GenerateConfig, translator: Translator, glossary: Glossary | None):
        self.step = (
            scorer(cfg, translator)
            if cfg.score_reference
            else translator_step(cfg, translator, glossary)
        )
        self.writer = OutputWriter(
            io.StringIO(),
            translator.tgt_tokenizer,
            cfg.format,
            cfg.nbest,
            cfg.print_alignment,
            flush=False,
            scores_only=cfg.score_reference,
        )

    def __call__(self, chunk: list[Source]) -> ChunkOutput:
        self.writer.stream = io.StringIO()
        results = self.step(chunk)
        notes, best, tokens = [], [], 0
        for src, hyps in zip(chunk, results):
            best.append(self.writer.write(src, hyps))
            if (note := unmet_note(src, hyps)) is not None:
                notes.append(note)
            tokens += len(hyps[0].tokens) if hyps else 0
        first = chunk[0].index if chunk else 0
        return ChunkOutput(first, len(chunk), self.writer.stream.getvalue(), notes, tokens, best)


def chunk_seed(seed: int, first_line: int) -> int:
    """The sampling seed of the chunk starting at 0-based line `first_line`: a hash of
    both (numpy's SeedSequence), so that neighbouring chunks' streams are unrelated."""
    words = np.random.SeedSequence([seed, first_line]).generate_state(2, np.uint32)
    return ((int(words[0]) << 32) | int(words[1])) & MAX_SEED


def unmet_note(source: Source, hyps: list[Hypothesis]) -> str | None:
    """The note of a line whose include constraints its translation lacks, or None."""
    line = source.index + 1
    if hyps and not hyps[0].constraints_met:
        return (
            f"line {line}: an include phrase could not be met within the length limit; "
            "its translation is the best one that ended without it (raise max_len_b or "
            "max_len_a for longer translations)"
        )
    if not hyps and source.constraints is not None and source.constraints.include:
        return f"line {line}: an empty line, so its include phrases could not be met"
    return None


def translator_step(
    cfg: GenerateConfig, translator: Translator, glossary: Glossary | None = None
) -> Step:
    """Chunk of sources -> their hypotheses (beam search, or sampling from the chunk's
    own random stream)."""
    prefix = translator.encode_prefix(cfg.prefix)
    constrained = cfg.constraints is not None or glossary is not None

    def step(chunk: list[Source]) -> list[list[Hypothesis]]:
        prefixes: list[list[int] | None] | None = None
        if prefix is not None:
            prefixes = [prefix] * len(chunk)
        elif cfg.prefix_file is not None:
            prefixes = [translator.encode_prefix(s.prefix) for s in chunk]
        constraints = None
        if constrained:
            constraints = [
                translator.constraint_ids(s.constraints, s.text, glossary) for s in chunk
            ]
        return translator.translate_ids(
            [s.ids for s in chunk],
            **languages(cfg, chunk),
            prefixes=prefixes,
            alignment=cfg.print_alignment,
            constraints=constraints,
            **sampling_seed(cfg, chunk),
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
        sources = [s.ids for s in chunk]
        return [[h] for h in translator.score_ids(sources, targets, **languages(cfg, chunk))]

    return step


def languages(cfg: GenerateConfig, chunk: list[Source]) -> dict[str, Any]:
    """The chunk's tgt_lang and src_lang as Translator calls take them: tgt_lang= for
    every line, or each line's own from tgt_lang_file=."""
    tgt_lang: str | list[str | None] | None = cfg.tgt_lang
    if cfg.tgt_lang_file is not None:
        tgt_lang = [s.tgt_lang for s in chunk]
    return {"tgt_lang": tgt_lang, "src_lang": cfg.src_lang}


def sampling_seed(cfg: GenerateConfig, chunk: list[Source]) -> dict[str, Any]:
    """The search option of a sampling chunk's own random stream ({} for beam search):
    a call with seed= starts a stream of its own (Translator.translate_ids)."""
    if not cfg.sampling or not chunk:
        return {}
    return {"seed": chunk_seed(cfg.seed, chunk[0].index)}
