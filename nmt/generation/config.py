"""Configuration of the search (SearchConfig) and of nmt-generate (GenerateConfig).

SearchConfig is the one list of search options: `SearchConfig.with_options` makes a
checked search from options wherever they come from (Translator.from_checkpoint, a
Translator call, nmt-serve's models and requests). GenerateConfig extends it, so the
search options sit at the top level where fairseq users look for them (`beam=5
lenpen=0.6`), while the generator receives only the part it uses. Every check raises
NmtError in one style: `option=value: what is wrong; what to do` (nmt.errors).
"""

from __future__ import annotations

import difflib
import math
import numbers
from collections.abc import Mapping
from dataclasses import dataclass, fields
from typing import Any, Optional

from nmt.data.languages import check_lang_code
from nmt.errors import choice_error, option_error, setting
from nmt.textlines import check_input_errors

FORMATS = ("plain", "fairseq")
PRECISIONS = ("fp32", "bf16", "fp16", "auto", "int8")  # nmt.runtime.INFERENCE_PRECISIONS (no torch)
OVERLONG = ("truncate", "error")
MAX_LENPEN = 5.0  # |lenpen|: length**lenpen for lengths up to 10^4 stays a finite fp32 factor
MAX_UNKPEN = 50.0  # |unkpen|: sampling's exp(log-prob + 50) stays a finite fp32 (e^89 is not)
MIN_TEMPERATURE = 1e-6  # fp32 logits / temperature stay finite (and sampling is greedy)
MAX_SEED = 2**63 - 1  # torch.Generator.manual_seed's range, non-negative


@dataclass
class SearchConfig:
    """Beam search and sampling, with fairseq's option names and semantics."""

    beam: int = 5  # hypotheses kept per sentence; 1 = greedy decoding
    nbest: int = 1  # finished hypotheses returned per sentence (at most beam)
    lenpen: float = 1.0  # final score = sum of log-probs / length**lenpen (length incl. EOS)
    max_len_a: float = 0.0  # longest output: max_len_a * source length + max_len_b tokens
    max_len_b: int = 200  # (any size: capped by the model's max_target_positions - 1)
    min_len: int = 1  # shortest output in tokens, EOS not counted (a lower length limit wins)
    unkpen: float = 0.0  # subtracted from <unk>'s log-prob (positive = fewer <unk>)
    no_repeat_ngram_size: int = 0  # forbid repeating any n-gram of this size; 0 = off
    sampling: bool = False  # sample instead of beam search (beam = samples per sentence)
    sampling_topk: int = 0  # sample among the k most likely tokens; 0 = all
    sampling_topp: float = 1.0  # sample from the smallest set with this much mass; 1 = all
    temperature: float = 1.0  # logits are divided by it (< 1 sharper, > 1 flatter)
    seed: int = 1  # random seed for sampling
    use_cache: bool = True  # incremental decoding with a KV cache (false: re-run the prefix; slow)

    def validate(self) -> None:
        """Raise NmtError naming the first option that cannot work."""
        if self.beam < 1:
            raise option_error("beam", self.beam, "must be 1 or more", "use 1 for greedy search")
        check_nbest(self.nbest, self.beam)
        for key in ("lenpen", "max_len_a", "unkpen", "temperature", "sampling_topp"):
            if not math.isfinite(getattr(self, key)):  # nan/inf make every score nan or inf
                raise option_error(key, getattr(self, key), "not a finite number", "give a number")
        if abs(self.lenpen) > MAX_LENPEN:  # length**lenpen must stay a finite fp32 divisor
            raise option_error(
                "lenpen",
                self.lenpen,
                f"out of range (-{MAX_LENPEN:g} to {MAX_LENPEN:g})",
                "use 1 for the average log-prob per token, 0 for none (fairseq's usual 0.6-2)",
            )
        if abs(self.unkpen) > MAX_UNKPEN:  # <unk>'s probability must stay a finite fp32
            raise option_error(
                "unkpen",
                self.unkpen,
                f"out of range (-{MAX_UNKPEN:g} to {MAX_UNKPEN:g})",
                f"use 0 for no penalty; {MAX_UNKPEN:g} all but forbids <unk>",
            )
        if not 0 <= self.seed <= MAX_SEED:
            raise option_error("seed", self.seed, "out of range", f"use 0 to {MAX_SEED} (2^63 - 1)")
        for key in ("max_len_a", "max_len_b"):
            if getattr(self, key) < 0:
                raise option_error(
                    key,
                    getattr(self, key),
                    "must not be negative",
                    "the longest output is max_len_a * source length + max_len_b",
                )
        if self.min_len < 0:
            raise option_error(
                "min_len", self.min_len, "must not be negative", "use 0 for no minimum"
            )
        if self.max_len_a == 0 and self.min_len > self.max_len_b:
            raise option_error(
                "min_len",
                self.min_len,
                f"more than max_len_b={self.max_len_b}, the longest output (max_len_a=0)",
                "lower min_len or raise max_len_b",
            )
        if self.no_repeat_ngram_size < 0:
            raise option_error(
                "no_repeat_ngram_size",
                self.no_repeat_ngram_size,
                "must not be negative",
                "use 0 to allow repeats",
            )
        if self.sampling_topk < 0:
            raise option_error(
                "sampling_topk",
                self.sampling_topk,
                "must not be negative",
                "use 0 to sample from every token",
            )
        if not 0.0 < self.sampling_topp <= 1.0:
            raise option_error(
                "sampling_topp",
                self.sampling_topp,
                "must be in (0, 1]",
                "use 1.0 to sample from every token",
            )
        if not self.temperature > 0:
            raise option_error(
                "temperature",
                self.temperature,
                "must be positive",
                "use 1.0 for the model's own distribution",
            )
        if self.temperature < MIN_TEMPERATURE:  # logits / temperature would overflow
            raise option_error(
                "temperature",
                self.temperature,
                f"below {MIN_TEMPERATURE:g}, where the logits overflow",
                "use beam=1 without sampling for the most likely tokens",
            )
        if not self.sampling:
            if self.sampling_topk:
                raise option_error(
                    "sampling_topk",
                    self.sampling_topk,
                    "applies to sampling only",
                    "add sampling=true",
                )
            if self.sampling_topp < 1.0:
                raise option_error(
                    "sampling_topp",
                    self.sampling_topp,
                    "applies to sampling only",
                    "add sampling=true",
                )

    def with_options(self, options: Mapping[str, Any]) -> SearchConfig:
        """A checked copy of this search with `options` (search option names) over it.

        The one way a search is made from options: Translator.from_checkpoint, each
        Translator call, nmt-serve's models and requests. An unknown name or a value of
        the wrong type is an NmtError naming the option; then validate() checks values."""
        for key, value in options.items():
            check_search_option(key, value)
        own = {f.name: getattr(self, f.name) for f in fields(SearchConfig)}  # not a subclass's
        search = SearchConfig(**{**own, **options})
        search.validate()
        return search


SEARCH_OPTIONS = tuple(f.name for f in fields(SearchConfig))
_DEFAULTS = {f.name: f.default for f in fields(SearchConfig)}
# What each kind of option takes: an int option any integer, a float option any number.
_KINDS = {bool: (bool, "true or false"), int: (numbers.Integral, "a whole number")}
_KINDS[float] = (numbers.Real, "a number")


def check_search_option(key: str, value: Any) -> None:
    """`key` names a search option and `value` has its type (NmtError otherwise)."""
    if key not in SEARCH_OPTIONS:
        close = difflib.get_close_matches(key, SEARCH_OPTIONS, n=1)
        fix = f"did you mean {close[0]}?" if close else f"use one of {', '.join(SEARCH_OPTIONS)}"
        raise option_error(key, value, "not a search option", fix)
    default = _DEFAULTS[key]
    wanted, kind = _KINDS[type(default)]
    if not isinstance(value, wanted) or (wanted is not bool and isinstance(value, bool)):
        shown = repr(value) if isinstance(value, str) else value  # "5" is not 5
        raise option_error(key, shown, f"not {kind}", f"e.g. {setting(key, default)}")


def check_nbest(nbest: int, beam: int) -> None:
    """nbest must be between 1 and the beam."""
    if not 1 <= nbest <= beam:
        raise option_error(
            "nbest",
            nbest,
            f"must be between 1 and beam={beam}",
            "raise beam or lower nbest",
        )


def check_min_len(
    search: SearchConfig, max_source_positions: int, max_target_positions: int
) -> None:
    """min_len must be reachable by some sentence: no output is longer than
    max_len_a * source length + max_len_b tokens, nor than the model's
    max_target_positions - 1, and no source longer than max_source_positions (EOS
    included). A sentence whose own limit is below min_len still gets a translation, cut
    at its limit (the limit wins, as nmt-generate says at the end)."""
    longest_model = max_target_positions - 1
    if search.min_len > longest_model:
        raise option_error(
            "min_len",
            search.min_len,
            f"more than the model's longest output ({longest_model} tokens: "
            f"model.max_target_positions={max_target_positions})",
            f"use min_len={longest_model} or less",
        )
    # in float, capped first: a huge max_len_a or max_len_b gives the model's limit
    longest = int(
        min(
            search.max_len_a * max_source_positions + min(search.max_len_b, longest_model),
            longest_model,
        )
    )
    if search.min_len > longest:
        raise option_error(
            "min_len",
            search.min_len,
            f"more than any output can be ({setting('max_len_a', search.max_len_a)} x the longest "
            f"source, {max_source_positions} tokens, + max_len_b={search.max_len_b} = {longest})",
            "lower min_len or raise max_len_a or max_len_b",
        )


def check_batching(max_tokens: int, max_sentences: int, overlong: str) -> None:
    """The batching options of Translator and nmt-generate."""
    if max_tokens < 0:
        raise option_error(
            "max_tokens", max_tokens, "must not be negative", "use 0 for no token limit"
        )
    if max_sentences < 1:
        raise option_error(
            "max_sentences",
            max_sentences,
            "must be 1 or more",
            "use 64 for batches of 64 sentences",
        )
    if overlong not in OVERLONG:
        raise choice_error("overlong", overlong, OVERLONG)


def search_config(options: Any) -> SearchConfig:
    """The SearchConfig part of any object with its fields (e.g. a GenerateConfig)."""
    return SearchConfig(**{name: getattr(options, name) for name in SEARCH_OPTIONS})


@dataclass
class GenerateConfig(SearchConfig):
    """nmt-generate: translate text (a file or stdin) or a data dir split, or score
    given translations (score_reference)."""

    # The key is not `model`: that name is the config group of model presets in configs/.
    checkpoint: Any = None  # checkpoint file, or a list [a.pt,b.pt] to ensemble (required)
    input: str = "-"  # text file to translate, "-" for stdin, or a data dir (with split=)
    split: Optional[str] = None  # with a data dir as input: the binarized split ("test")
    ref: Optional[str] = None  # reference file for raw text input: print BLEU at the end
    output: str = "-"  # where translations go; "-" = stdout
    format: str = "plain"  # plain: one translation per line; fairseq: S-/T-/H-/D-/P- lines
    print_alignment: bool = False  # fairseq format: A- lines (hard alignment from attention)
    alignment_layer: int = -1  # decoder layer whose attention gives alignments; -1 = last
    tgt_lang: Optional[str] = None  # a multilingual model: the language to translate into
    src_lang: Optional[str] = None  # the input's language (lang_tag=src_tgt needs it)
    tgt_lang_file: Optional[str] = None  # one target language code per input line
    prefix: Optional[str] = None  # target text every translation must start with
    prefix_file: Optional[str] = None  # one target prefix per input line ("" = none)
    constraints: Optional[str] = None  # JSON Lines: per input line, phrases that must (not) appear
    glossary: Optional[str] = None  # TSV source term<TAB>target term: found terms must appear
    score_reference: bool = False  # score the references (ref= or the split's target side)
    max_tokens: int = 0  # source tokens per batch (padding included); 0 = no limit
    max_sentences: int = 64  # sentences per batch
    buffer_size: int = 10000  # lines read ahead and sorted by length (file or piped input)
    interactive: Optional[bool] = None  # translate each line as soon as read; null = for stdin
    overlong: str = "truncate"  # source longer than the model accepts: truncate (warn) or error
    input_errors: str = "strict"  # invalid UTF-8 in the text inputs: strict (error) or replace
    device: str = "auto"  # cpu, cuda, cuda:1, or auto (cuda when available)
    precision: str = "fp32"  # fp32, bf16, fp16 (cuda), auto or int8 (cpu)
    threads: int = 0  # CPU threads for torch; 0 = torch's default (workers: cores / workers)
    workers: int = 1  # processes translating chunks of buffer_size lines in parallel (CPU)
    resume: bool = True  # workers, output file: reuse the finished chunks of a killed run
    shortlist: Optional[str] = None  # target-vocabulary shortlist file (nmt-shortlist); null = all
    progress: bool = True  # tqdm bar on stderr for file input
    debug: bool = False  # tracebacks instead of one-line errors

    def validate(self) -> None:
        super().validate()  # (checkpoint= is checked when loading: --cfg works without it)
        if self.format not in FORMATS:
            raise choice_error("format", self.format, FORMATS)
        if self.precision not in PRECISIONS:
            raise choice_error("precision", self.precision, PRECISIONS)
        check_batching(self.max_tokens, self.max_sentences, self.overlong)
        check_input_errors(self.input_errors)
        if self.buffer_size < 1:
            raise option_error(
                "buffer_size", self.buffer_size, "must be 1 or more", "e.g. 10000 lines"
            )
        if self.workers < 1:
            raise option_error(
                "workers", self.workers, "must be 1 or more", "use 1 for one process"
            )
        if self.threads < 0:
            raise option_error(
                "threads", self.threads, "must not be negative", "use 0 for torch's default"
            )
        if self.print_alignment and self.format != "fairseq":
            raise option_error(
                "print_alignment", True, "A- lines need format=fairseq", "add format=fairseq"
            )
        if self.split is not None and self.ref is not None:
            raise option_error(
                "ref", self.ref, "a data dir split has its own references", "drop ref="
            )
        self._validate_languages()
        if self.prefix and self.prefix_file:
            raise option_error(
                "prefix_file",
                self.prefix_file,
                "given together with prefix=",
                "use prefix= (one for all lines) or prefix_file= (one per line)",
            )
        for key in ("constraints", "glossary"):
            if getattr(self, key) is not None and self.sampling:
                raise option_error(
                    key,
                    getattr(self, key),
                    "constraints need beam search",
                    "drop sampling=true (beam=1 for greedy search)",
                )
        if self.score_reference:
            self._validate_score_reference()

    def _validate_languages(self) -> None:
        """Language codes are spelled as codes; one way of naming the target language."""
        for key in ("tgt_lang", "src_lang"):
            if getattr(self, key) is not None:
                check_lang_code(getattr(self, key), key)
        if self.tgt_lang is not None and self.tgt_lang_file is not None:
            raise option_error(
                "tgt_lang_file",
                self.tgt_lang_file,
                "given together with tgt_lang=",
                "use tgt_lang= (one for all lines) or tgt_lang_file= (one per line)",
            )
        if self.tgt_lang_file is not None and self.split is not None:
            raise option_error(
                "tgt_lang_file",
                self.tgt_lang_file,
                "a data dir split is one direction",
                "give src_lang= and tgt_lang= for a multilingual data dir's split",
            )

    def _validate_score_reference(self) -> None:
        if self.split is None and self.ref is None:
            raise option_error(
                "score_reference",
                True,
                "there is nothing to score",
                "give ref=FILE (the translations of input=) or a data dir split",
            )
        for key, problem in (
            ("prefix", "a reference is scored as it is"),
            ("prefix_file", "a reference is scored as it is"),
            ("constraints", "a reference is scored as it is"),
            ("glossary", "a reference is scored as it is"),
            ("print_alignment", "scoring prints no alignments"),
            ("shortlist", "scoring uses the whole target vocabulary"),
        ):
            if getattr(self, key):
                raise option_error(
                    key, getattr(self, key), problem, f"drop {key}= with score_reference"
                )
