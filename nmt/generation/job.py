"""nmt-generate's work as one library call: stream text (a file or stdin) or a data dir
split through a Translator in chunks, write every input line's output in input order
(atomically to a file, or to stdout), then print throughput (and BLEU when references
are known) on stderr. With score_reference, the references are scored instead of
translated (forced decoding).

Constraints (constraints=, a JSON Lines file, streamed in step with the input as
prefix_file= is) and a glossary (glossary=, read whole) are checked before the model is
loaded (every line parsed, line counts), and their phrases against the target
vocabulary before the first line is translated. A data dir split has no text of its
own: a glossary matches the source text its ids decode to.
"""

from __future__ import annotations

import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path

import torch
from tqdm import tqdm

from nmt.data.languages import direction_name
from nmt.data.meta import DataMeta
from nmt.errors import NmtError, option_error
from nmt.fsutil import check_not_an_input
from nmt.generation.chunks import ChunkOutput, ChunkTranslator, load_translator
from nmt.generation.config import GenerateConfig
from nmt.generation.io import (
    AlignedLines,
    Source,
    SourceEncoder,
    check_text_file,
    is_data_file,
    library_warnings_printed,
    open_output,
    print_note,
    print_warning,
    scan_text_file,
    split_sources,
    text_lines,
    text_sources,
    with_side_lines,
)
from nmt.generation.langfile import LanguageFile, line_code
from nmt.generation.terminology import Glossary, iter_constraints, parse_constraints_line
from nmt.generation.translator import Translator, checkpoint_paths
from nmt.generation.workers import WorkerPool, check_workers, worker_threads
from nmt.generation.workfolder import WorkFolder
from nmt.scoring import corpus_bleu
from nmt.textlines import STDIN, TextLines, display_name


def generate(cfg: GenerateConfig) -> int:
    """Run nmt-generate as `cfg` says; returns the exit code (0)."""
    with library_warnings_printed():
        return _generate(cfg)


def _generate(cfg: GenerateConfig) -> int:
    cfg.validate()
    # Everything about the inputs that can be known without the model is checked first:
    # a mistake costs no model loading, and nothing is written before it is found.
    check_output(cfg)
    lines = check_text_inputs(cfg)
    lang_file = scan_language_file(cfg, lines)
    glossary = Glossary.read(cfg.glossary) if cfg.glossary is not None else None
    folder = None
    if cfg.workers > 1:
        check_workers(cfg)
        folder = WorkFolder.for_run(cfg)  # a stale one is an error before the model loads
    # With workers the parent only checks, reads and writes: one thread is enough.
    translator = load_translator(cfg, 1 if cfg.workers > 1 else cfg.threads)
    if translator.runtime.note:
        print(f"nmt-generate: note: {translator.runtime.note}", file=sys.stderr)
    check_languages(cfg, translator, lang_file)
    check_phrases(cfg, translator, glossary)
    interactive = cfg.interactive
    if interactive is None:  # workers read stdin in chunks too
        interactive = cfg.input == STDIN and cfg.workers == 1
    inputs = open_sources(cfg, translator, 1 if interactive else cfg.buffer_size, lines)
    short = ShortLimits(translator, cfg.min_len)
    if cfg.input == STDIN and sys.stdin.isatty():
        # as fairseq-interactive and cat-like tools: say what is awaited, or the user
        # sees a command that seems to hang
        print(
            "nmt-generate: reading sentences from the terminal, one per line; "
            "Ctrl-D ends the input",
            file=sys.stderr,
            flush=True,
        )

    def counted(chunks: Iterator[list[Source]]) -> Iterator[list[Source]]:
        for chunk in chunks:
            if not cfg.score_reference:
                short.count(chunk)
            yield chunk

    n_sent = n_tokens = 0
    hyps_text: list[str] = []
    refs: list[str] = []
    start = time.perf_counter()
    with (
        open_output(cfg.output) as stream,
        tqdm(
            total=inputs.total,
            unit="sent",
            file=sys.stderr,
            dynamic_ncols=True,
            leave=False,
            # None: tqdm's own choice, off when stderr is not a terminal (logs stay clean)
            disable=True if (interactive or not cfg.progress or inputs.total is None) else None,
        ) as bar,
        chunk_outputs(cfg, translator, glossary, counted(inputs.chunks), folder) as outputs,
    ):
        for chunk, out in outputs:
            stream.write(out.text)
            if interactive:
                stream.flush()
            for note in out.notes:
                print_note(note)
            n_tokens += out.tokens
            for src, best in zip(chunk, out.best):
                if src.ref is not None:
                    hyps_text.append(best)
                    refs.append(src.ref)
            n_sent += out.lines
            bar.update(out.lines)
    if folder is not None:  # the output is complete: its chunks are no longer needed
        folder.remove()
    # A stream that stopped at a line of invalid UTF-8 (strict, stdin): the lines before
    # it are translated and written (the output file too), and only then is it an error.
    stopped = inputs.text.error(translated(n_sent, cfg.output)) if inputs.text else None
    if stopped is not None:
        raise stopped
    for note in [*inputs.notes(), *short.notes()]:
        print_warning(note)
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


@contextmanager
def chunk_outputs(
    cfg: GenerateConfig,
    translator: Translator,
    glossary: Glossary | None,
    chunks: Iterator[list[Source]],
    folder: WorkFolder | None,
) -> Iterator[Iterator[tuple[list[Source], ChunkOutput]]]:
    """Each chunk with its output, in input order: translated here (workers=1) or by
    worker processes (workers=N, resumed from `folder` when it holds finished chunks)."""
    if cfg.workers == 1:
        translate = ChunkTranslator(cfg, translator, glossary)
        yield ((chunk, translate(chunk)) for chunk in chunks)
        return
    with WorkerPool(cfg, worker_threads(cfg)) as pool:
        yield pool.outputs(chunks, folder)


def translated(n_sent: int, output: str) -> str:
    """What became of the lines before a stream's bad line, for its error message."""
    lines = "line" if n_sent == 1 else "lines"
    where = "on stdout" if output == STDIN else f"in {output}"
    return f"the {n_sent} {lines} before it are translated {where}"


class ShortLimits:
    """Counts the sentences whose longest output (max_len_a * source length + max_len_b,
    capped by the model) is below min_len: their translations end at that limit, which
    wins over min_len (the generator forces EOS there); nmt-generate says so at the end."""

    def __init__(self, translator: Translator, min_len: int):
        self.generator, self.min_len = translator.generator, min_len
        self.count_short = 0
        self.first: int | None = None  # the first such sentence's line number

    def count(self, chunk: list[Source]) -> None:
        sources = [s for s in chunk if len(s.ids)]
        if self.min_len <= 1 or not sources:  # every limit is at least 1 token
            return
        lengths = torch.tensor([len(s.ids) for s in sources])  # [n], EOS included
        short = (self.generator.max_lengths(lengths) < self.min_len).tolist()
        hits = [s.index for s, is_short in zip(sources, short) if is_short]
        if hits and self.first is None:
            self.first = hits[0] + 1
        self.count_short += len(hits)

    def notes(self) -> list[str]:
        if not self.count_short:
            return []
        s = self.generator.search
        return [
            f"min_len={self.min_len}: {self.count_short} sentence(s) (the first: line "
            f"{self.first}) allow fewer output tokens (max_len_a={s.max_len_a} x source "
            f"length + max_len_b={s.max_len_b}, at most {self.generator.max_positions} for "
            "this model); their translations end at that limit; raise max_len_a or "
            "max_len_b for longer ones"
        ]


def check_phrases(cfg: GenerateConfig, translator: Translator, glossary: Glossary | None) -> None:
    """Every phrase of constraints= and every target term of glossary= can be written by
    the target vocabulary, and no include phrase contains an exclude phrase of its line
    (NmtError naming the file and line), before anything is translated."""
    if glossary is not None:
        for term in glossary.terms:  # its own source contains it: checked as it is used
            translator.constraint_ids(None, term.source, Glossary([term]))
    if cfg.constraints is None:
        return
    for number, constraints in enumerate(iter_constraints(cfg.constraints), start=1):
        try:
            translator.constraint_ids(constraints, "", None)
        except NmtError as exc:
            raise NmtError(f"{cfg.constraints}:{number}: {exc}") from None


@dataclass
class Inputs:
    """nmt-generate's input as chunks of Sources, with what the job reports at the end."""

    chunks: Iterator[list[Source]]
    total: int | None  # lines, when known before reading (a file or a data dir split)
    text: TextLines | None  # the text input (None for a data dir split)
    side: list[AlignedLines] = field(default_factory=list)  # ref=, prefix_file=

    def notes(self) -> list[str]:
        """input_errors=replace: one line per text read with replaced bytes."""
        texts = ([self.text] if self.text else []) + [s.text for s in self.side]
        return [n for t in texts if (n := t.replacement_note()) is not None]


def check_output(cfg: GenerateConfig) -> None:
    """output= must not be one of the run's inputs (it would be replaced by translations)."""
    if cfg.output == STDIN:
        return
    inputs = [("checkpoint", c) for c in checkpoint_paths(cfg.checkpoint)]
    if Path(cfg.input).is_dir():  # a data dir: the files it is made of
        inputs += [("input", str(p)) for p in Path(cfg.input).iterdir() if is_data_file(p)]
    else:
        inputs.append(("input", cfg.input))
    inputs += [(key, getattr(cfg, key)) for key in SIDE_FILES if getattr(cfg, key)]
    check_not_an_input("output", cfg.output, inputs)


# text files beside input=
SIDE_FILES = ("ref", "prefix_file", "constraints", "glossary", "tgt_lang_file")


def check_text_inputs(cfg: GenerateConfig) -> dict[str, int]:
    """The text files of the run (input=, ref=, prefix_file=, constraints=) exist, are
    UTF-8 throughout (input_errors=strict: the error names the file and line; always for
    constraints=, whose every line is parsed too) and have one line per input line;
    returns their line counts by key (no "input" for stdin or a data dir)."""
    lines: dict[str, int] = {}
    if cfg.split is None and cfg.input != STDIN:
        if Path(cfg.input).is_dir():
            raise NmtError(
                f"input={cfg.input}: a directory; for a data dir add split=test, "
                "otherwise name a text file"
            )
        lines["input"] = scan_text_file(cfg.input, "input", cfg.input_errors)
    for key in ("ref", "prefix_file"):
        path = getattr(cfg, key)
        if path is None:
            continue
        lines[key] = scan_text_file(path, key, cfg.input_errors)
        if "input" in lines and lines[key] != lines["input"]:
            raise line_count_error(path, key, lines[key], lines["input"], cfg.input)
    if cfg.constraints is not None:
        check_text_file(cfg.constraints, "constraints")
        lines["constraints"] = sum(1 for _ in iter_constraints(cfg.constraints))
        if "input" in lines and lines["constraints"] != lines["input"]:
            raise line_count_error(
                cfg.constraints, "constraints", lines["constraints"], lines["input"], cfg.input
            )
    if cfg.glossary is not None:
        check_text_file(cfg.glossary, "glossary")
    return lines


def scan_language_file(cfg: GenerateConfig, lines: dict[str, int]) -> LanguageFile | None:
    """tgt_lang_file= scanned before the model loads: a code on each line, one line per
    input line (when the input's count is known)."""
    if cfg.tgt_lang_file is None:
        return None
    found = LanguageFile.scan(cfg.tgt_lang_file)
    if "input" in lines and found.lines != lines["input"]:
        raise line_count_error(
            cfg.tgt_lang_file, "tgt_lang_file", found.lines, lines["input"], cfg.input
        )
    return found


def check_languages(
    cfg: GenerateConfig, translator: Translator, lang_file: LanguageFile | None
) -> None:
    """The run's languages are the model's (NmtError naming the option, or the file and
    line of tgt_lang_file=), before anything is translated."""
    if lang_file is None:
        translator.check_languages(cfg.tgt_lang, cfg.src_lang)
    else:
        translator.check_source_language(cfg.src_lang)
        lang_file.check(translator, cfg.src_lang)


def line_count_error(path: str, key: str, lines: int, total: int, input_name: str) -> NmtError:
    return NmtError(
        f"{path}: {lines} lines, but input {input_name} has {total}; {key}= needs one "
        "line per input line"
    )


def open_sources(
    cfg: GenerateConfig, translator: Translator, chunk: int, lines: dict[str, int]
) -> Inputs:
    """The input as chunks of Sources (prefixes attached); `lines`: check_text_inputs'
    line counts."""
    where = (
        display_name(STDIN)
        if cfg.input == STDIN
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
    if cfg.split is not None:
        chunks, total = _split_sources(cfg, translator, encoder, chunk)
        inputs = Inputs(chunks, total, None)
        for key in ("prefix_file", "constraints"):
            if getattr(cfg, key) is not None and lines[key] != total:
                raise line_count_error(getattr(cfg, key), key, lines[key], total, where)
    else:
        text = text_lines(cfg.input, "input", cfg.input_errors)
        refs = None
        if cfg.ref is not None:
            refs = AlignedLines(cfg.ref, "ref", cfg.input, cfg.input_errors)
        inputs = Inputs(text_sources(text, encoder, chunk, refs), lines.get("input"), text)
        inputs.side += [refs] if refs else []
    main = inputs.text

    def complete() -> bool:  # a stream that stopped at invalid UTF-8 leaves side lines unused
        return main is None or main.problem is None

    if cfg.prefix_file is not None:
        prefixes = AlignedLines(cfg.prefix_file, "prefix_file", where, cfg.input_errors)
        inputs.chunks = with_side_lines(inputs.chunks, prefixes, complete, set_prefix)
        inputs.side.append(prefixes)
    if cfg.tgt_lang_file is not None:
        codes = AlignedLines(cfg.tgt_lang_file, "tgt_lang_file", where, cfg.input_errors)
        inputs.chunks = with_side_lines(inputs.chunks, codes, complete, set_tgt_lang)
        inputs.side.append(codes)
    if cfg.constraints is not None:
        path = cfg.constraints  # parsed before: only a file changed since fails here
        constraints = AlignedLines(path, "constraints", where)

        def set_constraints(source: Source, line: str) -> None:
            source.constraints = parse_constraints_line(line, f"{path}:{source.index + 1}")

        inputs.chunks = with_side_lines(inputs.chunks, constraints, complete, set_constraints)
    return inputs


def set_prefix(source: Source, line: str) -> None:
    source.prefix = line


def set_tgt_lang(source: Source, line: str) -> None:
    source.tgt_lang = line_code(line)


def _split_sources(
    cfg: GenerateConfig, translator: Translator, encoder: SourceEncoder, chunk: int
) -> tuple[Iterator[list[Source]], int]:
    from nmt.data.binarize import TokenArray
    from nmt.data.meta import load_meta, split_prefix
    from nmt.data.tokenizer import check_vocab_sizes

    meta = load_meta(cfg.input)
    for side in ("src", "tgt"):
        if meta.tokenizers[side]["sha256"] != getattr(translator, f"{side}_tokenizer").sha256:
            raise NmtError(
                f"{cfg.input}: its {side} SentencePiece model is not the checkpoint's; "
                "translate a data dir built for this model"
            )
    check_vocab_sizes(cfg.input, meta, translator.src_tokenizer, translator.tgt_tokenizer)
    split, src_lang, tgt_lang = split_direction(cfg, meta)
    if split not in meta.splits:
        raise NmtError(
            f"split={cfg.split}: not in {cfg.input}; choose one of {', '.join(sorted(meta.splits))}"
        )
    src = TokenArray(split_prefix(cfg.input, split, src_lang), meta.dtype)
    tgt_prefix = split_prefix(cfg.input, split, tgt_lang)
    tgt = TokenArray(tgt_prefix, meta.dtype) if Path(f"{tgt_prefix}.bin").is_file() else None
    if cfg.score_reference and tgt is None:
        raise NmtError(
            f"score_reference=true: split {cfg.split} of {cfg.input} has no {tgt_lang} "
            "side to score; choose a split with references, or text input with ref="
        )
    return (
        split_sources(src, tgt, translator.src_tokenizer, translator.tgt_tokenizer, encoder, chunk),
        len(src),
    )


def split_direction(cfg: GenerateConfig, meta: DataMeta) -> tuple[str, str, str]:
    """(stored split, source language, target language) of split= in the data dir: a
    multilingual one's part for the direction src_lang-tgt_lang (both required)."""
    if not meta.multilingual:
        return cfg.split or "", meta.src_lang, meta.tgt_lang
    directions = ", ".join(meta.directions)
    if cfg.src_lang is None or cfg.tgt_lang is None:
        missing = "src_lang" if cfg.src_lang is None else "tgt_lang"
        raise option_error(
            "split",
            cfg.split,
            f"{cfg.input} holds several directions ({directions}), and {missing}= is not given",
            "add src_lang= and tgt_lang= to choose one",
        )
    direction = direction_name(cfg.src_lang, cfg.tgt_lang)
    if direction not in meta.directions:
        raise option_error(
            "tgt_lang",
            cfg.tgt_lang,
            f"{cfg.input} has no direction {direction}",
            f"choose one of {directions}",
        )
    return meta.direction_split(cfg.split or "", direction)
