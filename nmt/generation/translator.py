"""Translator: the one translation core, under nmt-generate, the Python API and servers.

    from nmt import Translator
    translator = Translator.from_checkpoint("runs/demo/checkpoint_best.pt", beam=5)
    translator.translate(["I bought twenty-one books."])        # ["Ich kaufte ..."]
    translator.translate(texts, beam=1, max_len_b=50)           # options for this call only
    translator.translate_batch(texts, nbest=3, return_scores=True)
    translator.translate(["The dog sleeps."], constraints=[["Hund"]])  # must contain "Hund"
    translator.translate(texts, glossary={"dog": "Hund"})      # a found term: its target
    translator.score(sources, references)                       # forced decoding
    translator.translate(texts, tgt_lang="fr")                  # a multilingual model
    translator.translate(texts, tgt_lang=["fr", "de", "fr"])    # one target per text

A Translator loads its checkpoint(s) once and holds the models, the tokenizers, the
device/precision (nmt.runtime) and its search (a SearchConfig: the defaults of its calls).
One rule sorts the options: the search options (SearchConfig's fields) decide what a
sentence's translation is, and any call may override them (`**search_options`, checked
by SearchConfig.with_options); everything else (device, precision, threads, batching,
overlong, alignment_layer, shortlist) is fixed when loading, and none of it changes a
translation but overlong's refusals and precision's rounding.

A call with search options decodes exactly as a Translator loaded with them would on its
first call (sampling: a random stream of its own from `seed`); a call without them uses
the translator's search, whose sampling stream goes on from call to call. Every call
batches its sentences by length within max_tokens/max_sentences and returns results in
input order; a translation never depends on the other sentences of its batch. Calls from
several threads are safe: decoding is serialized by a lock (the cache memory is shared
state), tokenization is not.

A multilingual model (`languages`, from the checkpoint's data.languages) translates into
the language each call names (`tgt_lang`, and `src_lang` where its tag style needs it:
one code for all texts or one per text; nmt.generation.tagging). Its tags are put before
the source ids (which keep their EOS; they count against max_source_positions, so
`max_source_positions` is the room left to the text) or, for lang_tag=decoder, forced as
the first target token. No tag ever reaches a translation's text, pieces, token_scores
or alignment; its `score` is the search's, which counts a forced tag's step (and its
position in the length) as the steps of any forced prefix count: the tag's log-prob is
the same for every hypothesis of a sentence, so it never changes their order. min_len
and max_len_b count the tokens after a forced tag, and no hypothesis ever chooses a tag
(the search never generates one). A single-pair model takes no language or its own, and
refuses others (NmtError).
"""

from __future__ import annotations

import contextlib
import copy
import dataclasses
import functools
import json
import logging
import os
import threading
from collections.abc import Callable, Collection, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from nmt.data.languages import LanguageTags
from nmt.data.lexical import Shortlist
from nmt.data.tokenizer import Tokenizer, normalize_text
from nmt.errors import NmtError
from nmt.generation.banned import Banned, banned_spellings, without_redundant
from nmt.generation.config import SearchConfig, check_batching, check_min_len
from nmt.generation.constraints import TokenConstraints, active, check_constraints
from nmt.generation.encoding import (
    PieceNames,
    TextEncoder,
    alignment_pairs,
    length_batches,
    pad_batch,
    target_ids,
)
from nmt.generation.forced import forced_batch, forced_log_probs
from nmt.generation.generator import Hypothesis, SequenceGenerator
from nmt.generation.loading import load_ensemble
from nmt.generation.tagging import (
    LangsLike,
    ModelLanguages,
    checkpoint_languages,
    untagged,
)
from nmt.generation.terminology import (
    Glossary,
    TextConstraints,
    as_constraints,
    as_glossary,
)
from nmt.model.cache import CacheMemory
from nmt.model.packed import pack_fp32
from nmt.model.quantize import quantize_int8
from nmt.model.transformer import Transformer
from nmt.runtime import Runtime, setup
from nmt.vocab import EOS, UNK

PathLike = str | os.PathLike
IdsLike = Sequence[int] | np.ndarray | torch.Tensor
# One text's constraints in the Python API: phrases (all include), a dict with "include"
# and "exclude", a TextConstraints, or None. A glossary: a Glossary, a TSV file, a mapping.
ConstraintsLike = Sequence[str] | Mapping[str, Sequence[str]] | TextConstraints | None
GlossaryLike = Glossary | PathLike | Mapping[str, str] | None

log = logging.getLogger("nmt.generation")


@dataclass(frozen=True)
class Translation:
    """One translation of one source sentence."""

    text: str  # detokenized
    pieces: list[str]  # its SentencePiece pieces (EOS not included)
    # sum(token_scores) / len(token_scores)**lenpen (return_scores); for lang_tag=decoder
    # the search's, with the forced tag's step (Translator's module docstring)
    score: float | None = None
    token_scores: list[float] | None = None  # log-prob of each piece, then of EOS
    alignment: list[tuple[int, int]] | None = None  # (source, target) positions (return_alignment)
    constraints_met: bool = True  # False: an include phrase is missing (the length limit)


@dataclass(frozen=True)
class TargetScore:
    """The model's score of a given translation (forced decoding)."""

    log_prob: float  # sum of token_scores: log p(target | source)
    token_scores: list[float]  # log-prob of each target piece, then of EOS
    score: float  # as generation reports scores: log_prob / len(token_scores)**lenpen
    # (for lang_tag=decoder, with the forced tag's step, as a translation's score has it)
    pieces: list[str]  # the target's SentencePiece pieces (EOS not included)


def checkpoint_paths(checkpoint: PathLike | Sequence[PathLike]) -> list[str]:
    """One checkpoint path or several (an ensemble) as a non-empty list of str."""
    if checkpoint is None or checkpoint == "":
        raise NmtError(
            "checkpoint=null: no checkpoint given; pass checkpoint=FILE, or "
            "checkpoint=[a.pt,b.pt] for an ensemble"
        )
    paths = [checkpoint] if isinstance(checkpoint, (str, os.PathLike)) else list(checkpoint)
    if not paths or not all(isinstance(p, (str, os.PathLike)) and os.fspath(p) for p in paths):
        raise NmtError(
            f"checkpoint={checkpoint!r}: not a file name or a list of them; "
            "pass a checkpoint file, or a list of files for an ensemble"
        )
    return [os.fspath(p) for p in paths]


class Translator:
    """Translate and score with one checkpoint or an ensemble (see the module docstring)."""

    def __init__(
        self,
        models: Sequence[Transformer],
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        *,
        search: SearchConfig | None = None,
        runtime: Runtime | None = None,
        nfkc: bool = False,
        max_tokens: int = 0,
        max_sentences: int = 64,
        overlong: str = "truncate",
        alignment_layer: int = -1,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        shortlist: Shortlist | None = None,
        languages: LanguageTags | None = None,
    ):
        """From already-built parts: models in eval mode on `runtime.device` (default:
        the first model's device, fp32), sharing the target vocabulary; models with
        bf16/fp16 weights run in them, without autocast. `nfkc`: the
        normalization the data dir applied (its meta.json / the checkpoint's data);
        `src_lang`/`tgt_lang`: the language codes of its data (None when unknown; a
        multilingual model's first direction); `languages`: a multilingual model's tags
        (the tokenizers' control symbols); `shortlist`: decode over each sentence's
        candidate target tokens only."""
        self.search = search if search is not None else SearchConfig()
        self.search.validate()
        check_batching(max_tokens, max_sentences, overlong)
        self.models = list(models)
        if not self.models:
            raise ValueError("Translator needs at least one model")
        first_weight = next(self.models[0].parameters())
        self.runtime = runtime or Runtime(first_weight.device)
        # Weights already in bf16/fp16 (Runtime.inference_weights_dtype) run as they are:
        # autocast over them would only add fp32 casts around layer norms and softmaxes.
        self._precision = (
            self.runtime.autocast if first_weight.dtype == torch.float32 else contextlib.nullcontext
        )
        self.src_tokenizer, self.tgt_tokenizer = src_tokenizer, tgt_tokenizer
        self.nfkc = nfkc
        self.max_tokens, self.max_sentences, self.overlong = max_tokens, max_sentences, overlong
        self.alignment_layer = alignment_layer
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        self.languages = languages
        self._langs = ModelLanguages(languages, src_lang, tgt_lang)
        self._langs.check_pieces(PieceNames(src_tokenizer), src_tokenizer.vocab_size, "languages")
        # the positions a source text and a target text may take: the model's, less the
        # positions its language tags take
        self.max_source_positions = (
            min(m.cfg.max_source_positions for m in self.models) - self._langs.source_length
        )
        self.max_target_positions = (
            min(m.cfg.max_target_positions for m in self.models) - self._langs.target_length
        )
        check_min_len(self.search, self.max_source_positions, self.max_target_positions)
        self.shortlist = shortlist
        self._cache_memory = [CacheMemory() for _ in self.models]  # every generator's
        self.generator = self._generator(self.search)
        self.pieces = PieceNames(tgt_tokenizer)
        self._fit_source = self.source_encoder("sources").fit
        self._fit_target = self.target_encoder("targets").fit
        self._lock = threading.Lock()
        self._banned = functools.lru_cache(maxsize=1024)(self._spellings_to_ban)

    @classmethod
    def from_checkpoint(
        cls,
        checkpoint: PathLike | Sequence[PathLike],
        *,
        device: str = "auto",
        precision: str = "fp32",
        threads: int = 0,
        max_tokens: int = 0,
        max_sentences: int = 64,
        overlong: str = "truncate",
        alignment_layer: int = -1,
        shortlist: PathLike | None = None,
        search: SearchConfig | None = None,
        **search_options: Any,
    ) -> Translator:
        """Load one checkpoint, or several (an ensemble, sharing tokenizers), once.

        The search: `search` (default: SearchConfig()) with `search_options` over it,
        fairseq's names (beam=5, lenpen=0.6, ...; SearchConfig); it is the default of
        every call. `device` (auto, cpu, cuda, cuda:N) and `precision` (fp32, bf16, fp16,
        auto, or int8 on the CPU: int8 linear layers) as nmt.runtime reads them; `threads`
        sets torch's CPU threads for the process (0: torch's default). Batches hold at
        most `max_sentences` sentences and `max_tokens` padded source tokens (0: no
        limit); a source longer than the model accepts is truncated with a warning, or
        refused with overlong="error". `alignment_layer`: the decoder layer whose
        attention gives alignments. `shortlist`: a shortlist file (nmt-shortlist; a
        CTranslate2 vocabulary map): the search considers only each sentence's candidate
        target tokens. Every option is checked before anything is loaded.
        """
        search = (search or SearchConfig()).with_options(search_options)
        check_batching(max_tokens, max_sentences, overlong)
        paths = checkpoint_paths(checkpoint)
        # fp32 stays exact fp32 (no TF32): translations equal the CPU's, as before.
        runtime = setup(device, precision, threads=threads, tf32=False, inference=True)
        bundles = load_ensemble(paths, runtime.device)
        first = bundles[0]
        languages = checkpoint_languages([b.data for b in bundles], paths)
        table = None
        if shortlist is not None:
            table = Shortlist.from_file(shortlist, first.src_tokenizer, first.tgt_tokenizer)
        models = [b.model for b in bundles]
        if runtime.precision == "int8":  # int8 weights, quantized here once
            models = [quantize_int8(m) for m in models]
        elif runtime.precision == "fp32" and runtime.device.type == "cpu":
            models = [pack_fp32(m) for m in models]  # oneDNN's GEMM where it wins (fp32_gemm)
        weights_dtype = runtime.inference_weights_dtype
        if weights_dtype is not None:  # bf16/fp16 weights on a GPU, cast here once
            models = [m.to(weights_dtype) for m in models]
        return cls(
            models,
            first.src_tokenizer,
            first.tgt_tokenizer,
            search=search,
            runtime=runtime,
            nfkc=bool(first.data.get("normalization", {}).get("nfkc", False)),
            max_tokens=max_tokens,
            max_sentences=max_sentences,
            overlong=overlong,
            alignment_layer=alignment_layer,
            src_lang=first.data.get("src_lang"),
            tgt_lang=first.data.get("tgt_lang"),
            shortlist=table,
            languages=languages,
        )

    def search_with(self, **search_options: Any) -> SearchConfig:
        """This translator's search with `search_options` over it, checked for its
        model (NmtError naming the option): what a call with these options decodes with."""
        search = self.search.with_options(search_options)
        check_min_len(search, self.max_source_positions, self.max_target_positions)
        return search

    def with_search(self, search: SearchConfig) -> Translator:
        """This translator with another default search: the same models, tokenizers,
        device, batching, cache memory and lock (calls on either stay serialized). A
        sampling search starts a random stream of its own from `search.seed`."""
        other = copy.copy(self)
        other.search = self.search_with(**dataclasses.asdict(search))
        other.generator = other._generator(other.search)
        return other

    def _generator(self, search: SearchConfig) -> SequenceGenerator:
        """A generator of `search` over this translator's models and cache memory."""
        return SequenceGenerator(
            self.models,
            self._langs.decoding(search),
            shortlist=self.shortlist,
            cache_memory=self._cache_memory,
            never=self._langs.tag_ids,
        )

    def _call_generator(self, search_options: dict[str, Any]) -> tuple[SequenceGenerator, int]:
        """The generator of a call with these search options, and the call's nbest: the
        translator's own without options, else one of the call's search (checked). A
        beam search that differs from the translator's in nbest only is the translator's
        generator (nbest only cuts the finished list); a sampling one starts its stream."""
        if not search_options:
            return self.generator, self.search.nbest
        search = self.search_with(**search_options)
        same = dataclasses.replace(search, nbest=self.search.nbest) == self.search
        if same and not search.sampling:
            return self.generator, search.nbest
        return self._generator(search), search.nbest

    def check_languages(self, tgt_lang: LangsLike = None, src_lang: LangsLike = None) -> None:
        """NmtError unless this model translates `src_lang` into `tgt_lang` as a call's
        options give them (one code, or a list with one per text)."""
        n = max(
            (
                len(x)
                for x in (tgt_lang, src_lang)
                if isinstance(x, Sequence) and not isinstance(x, str)
            ),
            default=1,
        )
        self._langs.tags(n, tgt_lang, src_lang)

    def check_source_language(self, src_lang: str | None) -> None:
        """NmtError unless this model translates from `src_lang` (None: unless it must
        be named, as lang_tag=src_tgt needs)."""
        self._langs.check_source(src_lang)

    @property
    def device(self) -> torch.device:
        return self.runtime.device

    # -- text in, text out ------------------------------------------------------------

    def source_encoder(
        self, where: str = "input", warn: Callable[[str], None] | None = None
    ) -> TextEncoder:
        """Text -> source ids as this model needs them; `where` names the input in
        messages about over-long lines, `warn` receives the warnings (default: logging)."""
        return TextEncoder(
            self.src_tokenizer, self.nfkc, self.max_source_positions, self.overlong, where, warn
        )

    def target_encoder(
        self, where: str = "targets", warn: Callable[[str], None] | None = None
    ) -> TextEncoder:
        """Text -> target ids (EOS included) within the decoder's positions."""
        return TextEncoder(
            self.tgt_tokenizer, self.nfkc, self.max_target_positions, self.overlong, where, warn
        )

    def encode_prefix(self, text: str | None) -> list[int] | None:
        """A target prefix as ids (no EOS); None for None or an empty prefix."""
        if not text:
            return None
        return self.tgt_tokenizer.encode(normalize_text(text, self.nfkc)) or None

    def constraint_ids(
        self,
        constraints: TextConstraints | None,
        source: str,
        glossary: Glossary | None,
    ) -> TokenConstraints | None:
        """One sentence's constraints as target ids, for translate_ids: the include
        phrases with the target terms of the glossary terms `source` contains, each as
        the target tokenizer segments it (normalized as targets are), and the exclude
        phrases in every spelling a translation could hold them in (nmt.generation.banned:
        where a word starts and glued to what precedes it; the fewest-piece ones of a
        phrase with very many, with a warning); None when there are none. An include
        phrase the target vocabulary cannot write (it encodes to nothing or holds <unk>)
        is an NmtError naming it, as is one whose ids hold a banned spelling of an exclude
        phrase; an exclude phrase the vocabulary cannot write is left out (no translation
        can contain it)."""
        include: dict[tuple[int, ...], str] = {}  # ids -> the phrase, in order, each once
        exclude: dict[tuple[int, ...], str] = {}
        for phrase in constraints.include if constraints else ():
            ids = self._phrase_ids(phrase, f"include phrase {_quoted(phrase)}")
            include.setdefault(ids, phrase)
        for term in glossary.terms_in(source) if glossary else ():
            what = f"{term.where}: target term {_quoted(term.target)}"
            include.setdefault(self._phrase_ids(term.target, what), term.target)
        for phrase in constraints.exclude if constraints else ():
            for ids in self._exclude_ids(phrase):
                exclude.setdefault(ids, phrase)
        for inc, phrase in include.items():
            for exc, banned in exclude.items():
                if _contains(inc, exc):
                    raise NmtError(
                        f"include phrase {_quoted(phrase)} contains exclude phrase "
                        f"{_quoted(banned)}: no translation can meet both; drop one of them"
                    )
        if not include and not exclude:
            return None
        kept = without_redundant(list(exclude))  # ("▁", "Mann") holds ("Mann",): one is enough
        return TokenConstraints(include=tuple(include), exclude=tuple(kept))

    def _encode_target(self, phrase: str) -> tuple[int, ...]:
        """A target phrase's ids, as a translation's pieces would hold it."""
        return tuple(self.tgt_tokenizer.encode(normalize_text(phrase, self.nfkc)))

    def _exclude_ids(self, phrase: str) -> tuple[tuple[int, ...], ...]:
        """The target-id phrases to ban for an exclude phrase."""
        return self._banned(normalize_text(phrase, self.nfkc)).spellings

    def _spellings_to_ban(self, text: str) -> Banned:
        """banned_spellings of a normalized exclude phrase, with a warning when it has
        more spellings than are banned (cached as _banned: phrases recur from line to
        line, and nmt-generate checks every line before translating it)."""
        banned = banned_spellings(self.tgt_tokenizer, text)
        if not banned.complete:
            log.warning(
                "exclude phrase %s: %d of its %d spellings in target pieces are banned, "
                "every one in up to %d pieces (the tokenizer's: %d); a translation could "
                "still hold it in more",
                _quoted(text),
                banned.banned,
                banned.total,
                banned.fewest_left - 1,
                len(banned.spellings[0]),
            )
        return banned

    def _phrase_ids(self, phrase: str, what: str) -> tuple[int, ...]:
        """An include phrase's ids; NmtError naming it (`what`) if the target vocabulary
        cannot write it."""
        ids = self._encode_target(phrase)
        if not ids:
            raise NmtError(f"{what}: no target pieces; give a phrase with words")
        if UNK in ids:
            pieces = " ".join(self.pieces(list(ids)))
            raise NmtError(
                f"{what}: the target vocabulary cannot write it (pieces: {pieces}), so no "
                "translation can contain it; drop it or spell it with the target's characters"
            )
        return ids

    def translate(
        self,
        texts: Sequence[str],
        *,
        tgt_lang: LangsLike = None,
        src_lang: LangsLike = None,
        constraints: Sequence[ConstraintsLike] | None = None,
        glossary: GlossaryLike = None,
        **search_options: Any,
    ) -> list[str]:
        """The best translation of each text (an empty text gives ""); `search_options`
        (beam=1, lenpen=0.6, ...) override the translator's search for this call.
        `tgt_lang`, `src_lang`, `constraints` and `glossary` as translate_batch takes
        them; a text whose include
        phrases could not all be met within its length limit gets its best complete
        translation and a warning naming its index (logger "nmt.generation")."""
        results = self.translate_batch(
            texts,
            tgt_lang=tgt_lang,
            src_lang=src_lang,
            constraints=constraints,
            glossary=glossary,
            **search_options,
        )
        for i, best in enumerate(results):
            if not best[0].constraints_met:
                log.warning(
                    "texts[%d]: an include phrase could not be met within the length limit "
                    "(or the text is empty); its translation is the best one without it "
                    "(translate_batch's Translation.constraints_met is False)",
                    i,
                )
        return [best[0].text for best in results]

    def translate_batch(
        self,
        texts: Sequence[str],
        *,
        tgt_lang: LangsLike = None,
        src_lang: LangsLike = None,
        return_scores: bool = False,
        return_alignment: bool = False,
        prefixes: Sequence[str | None] | None = None,
        constraints: Sequence[ConstraintsLike] | None = None,
        glossary: GlossaryLike = None,
        **search_options: Any,
    ) -> list[list[Translation]]:
        """Per text, up to `nbest` translations, best first; `search_options` (nbest=3,
        beam=1, lenpen=0.6, ...) override the translator's search for this call.

        `tgt_lang`: the language to translate into, one code for all texts or a list with
        one per text (required by a multilingual model; a single-pair model takes None or
        its own); `src_lang`: the texts' language, likewise (needed by lang_tag=src_tgt
        only). A language the model does not know is an NmtError naming those it knows.
        `prefixes`: one target prefix per text (None or "" = free), forced at the start
        of its translations. An empty text gets one empty Translation.
        `constraints`: one entry per text: phrases its translations must contain
        (`["Hund", "rote Mütze"]`), `{"include": [...], "exclude": [...]}` (exclude:
        phrases they must never contain), a TextConstraints, or None. `glossary`: a
        Glossary, a TSV file (`source term<TAB>target term`) or a mapping source term ->
        target term; the target terms of the source terms a text contains (whole words,
        any case) are include phrases of that text. Constraints need beam search. A
        translation that could not meet every include phrase within the length limit
        has `constraints_met` False (the n-best lists those that could first).
        """
        _check_texts(texts, "texts")
        wanted = self._text_constraints(texts, constraints, glossary)
        encoder = self.source_encoder("input")
        sources = _encode(encoder, texts)
        prefix_ids = None
        if prefixes is not None:
            _check_texts(prefixes, "prefixes", allow_none=True)
            if len(prefixes) != len(texts):
                raise NmtError(
                    f"prefixes: {len(prefixes)} of them for {len(texts)} texts; "
                    "give one prefix (or None) per text"
                )
            prefix_ids = [self.encode_prefix(p) for p in prefixes]
        results = self.translate_ids(
            sources,
            tgt_lang=tgt_lang,
            src_lang=src_lang,
            prefixes=prefix_ids,
            alignment=return_alignment,
            constraints=wanted,
            **search_options,
        )
        return [
            self.translations(
                hyps,
                len(src),
                scores=return_scores,
                alignment=return_alignment,
                constraints=None if wanted is None else wanted[i],
            )
            for i, (hyps, src) in enumerate(zip(results, sources))
        ]

    def _text_constraints(
        self,
        texts: Sequence[str],
        constraints: Sequence[ConstraintsLike] | None,
        glossary: GlossaryLike,
    ) -> list[TokenConstraints | None] | None:
        """translate_batch's constraints and glossary as one TokenConstraints (or None)
        per text; None when no text has any."""
        if constraints is None and glossary is None:
            return None
        if constraints is not None:
            if isinstance(constraints, (str, Mapping)) or not isinstance(constraints, Sequence):
                raise TypeError(
                    "constraints: pass one entry per text (a list of phrases, a dict, or "
                    "None), e.g. constraints=[['Hund']] for one text"
                )
            if len(constraints) != len(texts):
                raise NmtError(
                    f"constraints: {len(constraints)} of them for {len(texts)} texts; "
                    "give one entry (or None) per text"
                )
        terms = as_glossary(glossary)
        wanted = [
            self.constraint_ids(
                None
                if constraints is None
                else as_constraints(constraints[i], f"constraints[{i}]"),
                text,
                terms,
            )
            for i, text in enumerate(texts)
        ]
        return wanted if any(w is not None for w in wanted) else None

    def score(
        self,
        sources: Sequence[str],
        targets: Sequence[str],
        *,
        lenpen: float | None = None,
        tgt_lang: LangsLike = None,
        src_lang: LangsLike = None,
    ) -> list[TargetScore]:
        """Forced decoding: the model's log-probability of each target given its source
        (EOS included), per token and length-normalized as generation reports scores
        (`lenpen`: this call's, default the search's). `tgt_lang`/`src_lang`: the
        targets' and sources' languages, as translate_batch takes them."""
        _check_texts(sources, "sources")
        _check_texts(targets, "targets")
        if len(sources) != len(targets):
            raise NmtError(
                f"targets: {len(targets)} of them for {len(sources)} sources; "
                "give one target per source"
            )
        src_enc, tgt_enc = self.source_encoder("sources"), self.target_encoder("targets")
        src, tgt = _encode(src_enc, sources), _encode(tgt_enc, targets)
        return [
            TargetScore(
                log_prob=float(h.positional_scores.sum()),
                token_scores=h.positional_scores.tolist(),
                score=h.score,
                pieces=self.pieces(target_ids(h)),
            )
            for h in self.score_ids(src, tgt, lenpen=lenpen, tgt_lang=tgt_lang, src_lang=src_lang)
        ]

    # -- ids in, hypotheses out -------------------------------------------------------

    def translate_ids(
        self,
        sources: Sequence[IdsLike],
        *,
        tgt_lang: LangsLike = None,
        src_lang: LangsLike = None,
        prefixes: Sequence[IdsLike | None] | None = None,
        alignment: bool = False,
        cancelled: Callable[[], Collection[int]] | None = None,
        constraints: Sequence[TokenConstraints | None] | None = None,
        **search_options: Any,
    ) -> list[list[Hypothesis]]:
        """Per source (ids ending in EOS, as a data dir stores them; empty = an empty
        line; no language tags), up to `nbest` hypotheses, best first; [] for an empty
        source. `tgt_lang`/`src_lang` as translate_batch takes them: the ids of their tags
        go before each source's, or start its target, and leave its hypotheses (which
        are as if the model had no tags). `prefixes`: target ids (no EOS) to force per
        source, or None, after the target's tag. With `alignment`, hypotheses
        carry the attention of decoder layer `alignment_layer`. `search_options`
        override the translator's search for this call (see the module docstring).

        `cancelled`, when given, is asked between decoding steps (once a step) which
        sources are no longer wanted: it returns their indices (into `sources`). Their
        decoding stops at that step, they get [], and the other sources' hypotheses
        are exactly what they would be without it (with beam search; sampling draws
        of a batch share one stream). A server drops the sentences of clients that
        left, or whose deadline passed, this way.

        `constraints`: one entry per source (None or an empty TokenConstraints: none),
        target-id phrases its translations must include and phrases they must not (beam
        search only); a hypothesis that could not include one has `constraints_met`
        False. Every entry is checked before any decoding."""
        generator, nbest = self._call_generator(search_options)
        tags = self._langs.tags(len(sources), tgt_lang, src_lang)
        rows = [
            _tagged(tags[i].source, self._fit_source(_as_ids(s), i), keep_empty=True)
            for i, s in enumerate(sources)
        ]
        forced = None
        if prefixes is not None:
            forced = [None if p is None else _as_ids(p) for p in prefixes]
        if forced is not None and len(forced) != len(rows):
            raise NmtError(
                f"prefixes: {len(forced)} of them for {len(rows)} sources; "
                "give one prefix (or None) per source"
            )
        if self._langs.target_length:  # every target starts with its tag
            forced = [
                _tagged(t.target, np.zeros(0, np.int64) if p is None else p)
                for t, p in zip(tags, forced or [None] * len(rows))
            ]
        wanted = self._check_constraints(constraints, len(rows), generator)
        lengths = np.fromiter((len(r) for r in rows), dtype=np.int64, count=len(rows))
        out: list[list[Hypothesis]] = [[] for _ in rows]
        attn_layer = self.alignment_layer if alignment else None
        with self._lock, self._precision():
            for batch in length_batches(lengths, self.max_tokens, self.max_sentences):
                stopped = None if cancelled is None else self._stopped(cancelled, batch)
                if stopped is not None and stopped.sentences() == len(batch):
                    continue  # every sentence of the batch is cancelled already
                src = pad_batch([rows[i] for i in batch], self.device)  # [B,S]
                prefix = None if forced is None else self._prefix_tensor(forced, batch)
                hyps = generator.generate(
                    src,
                    prefix,
                    nbest=nbest,
                    attn_layer=attn_layer,
                    stopped=stopped,
                    constraints=None if wanted is None else [wanted[i] for i in batch.tolist()],
                )
                for i, h in zip(batch.tolist(), hyps):
                    out[i] = [untagged(hyp, tags[i]) for hyp in h]
        if cancelled is not None:
            for i in cancelled():
                out[i] = []
        return out

    def _stopped(self, cancelled: Callable[[], Collection[int]], batch: np.ndarray) -> _Stopped:
        return _Stopped(cancelled, batch.tolist(), self.device)

    def _check_constraints(
        self,
        constraints: Sequence[TokenConstraints | None] | None,
        sources: int,
        generator: SequenceGenerator,
    ) -> list[TokenConstraints] | None:
        """A call's constraints, one per source, checked (NmtError naming the entry);
        None when no source has any."""
        if constraints is not None and len(constraints) != sources:
            raise NmtError(
                f"constraints: {len(constraints)} of them for {sources} sources; "
                "give one entry (or None) per source"
            )
        wanted = active(constraints, sources)
        if wanted is None:
            return None
        if generator.search.sampling:
            raise NmtError(
                "sampling=true: constraints need beam search (sampling=false); "
                "drop sampling for constrained sentences"
            )
        check_constraints(wanted, self.models[0].decoder.embed_tokens.num_embeddings)
        return wanted

    def score_ids(
        self,
        sources: Sequence[IdsLike],
        targets: Sequence[IdsLike],
        *,
        lenpen: float | None = None,
        tgt_lang: LangsLike = None,
        src_lang: LangsLike = None,
    ) -> list[Hypothesis]:
        """Forced decoding on ids (each ending in EOS; an empty one is the empty
        sentence [EOS]; no language tags): per pair a Hypothesis of the target with its
        token log-probs and its score normalized by `lenpen` (default: the search's).
        `tgt_lang`/`src_lang` as translate_ids takes them: a target tag is scored (its
        step counts in the score, as in generation) and then left out."""
        lenpen = (
            self.search if lenpen is None else self.search_with(lenpen=lenpen)
        ).lenpen  # checked
        if len(sources) != len(targets):
            raise NmtError(
                f"targets: {len(targets)} of them for {len(sources)} sources; "
                "give one target per source"
            )
        tags = self._langs.tags(len(sources), tgt_lang, src_lang)
        src = [
            _tagged(tags[i].source, _nonempty(self._fit_source(_as_ids(s), i)))
            for i, s in enumerate(sources)
        ]
        tgt = [
            _tagged(tags[i].target, self._fit_target(_nonempty(_as_ids(t)), i))
            for i, t in enumerate(targets)
        ]
        lengths = np.array([max(len(s), len(t)) for s, t in zip(src, tgt)], dtype=np.int64)
        out: dict[int, Hypothesis] = {}
        with self._lock, self._precision():
            for batch in length_batches(lengths, self.max_tokens, self.max_sentences):
                idx = batch.tolist()
                tensors = forced_batch([src[i] for i in idx], [tgt[i] for i in idx], self.device)
                lprobs = forced_log_probs(self.models, *tensors).cpu()  # [B,T]
                for row, i in enumerate(idx):
                    n = len(tgt[i])
                    positional = lprobs[row, :n].clone()  # not a view of the batch
                    whole = Hypothesis(
                        tokens=torch.from_numpy(tgt[i]),
                        score=float(positional.sum()) / n**lenpen,
                        positional_scores=positional,
                        attention=None,
                    )
                    out[i] = untagged(whole, tags[i])
        return [out[i] for i in range(len(src))]

    # -- helpers ----------------------------------------------------------------------

    def _prefix_tensor(
        self, prefixes: list[np.ndarray | None], batch: np.ndarray
    ) -> torch.Tensor | None:
        """[B,P] PAD-padded prefixes of the batch's rows, or None when none has one."""
        rows = [prefixes[i] for i in batch.tolist()]
        if not any(r is not None and len(r) for r in rows):
            return None
        empty = np.zeros(0, np.int64)
        return pad_batch([empty if r is None else r for r in rows], self.device)

    def translations(
        self,
        hyps: list[Hypothesis],
        src_len: int,
        *,
        scores: bool,
        alignment: bool,
        constraints: TokenConstraints | None = None,
    ) -> list[Translation]:
        """translate_ids' hypotheses of one source (`src_len` ids, EOS included) as
        translate_batch returns them: text, pieces, and scores/alignment on request.
        `constraints`: the source's; an empty source meets none of its include phrases."""
        if not hyps:  # an empty source: one empty translation
            return [
                Translation(
                    "",
                    [],
                    0.0 if scores else None,
                    [] if scores else None,
                    [] if alignment else None,
                    constraints_met=constraints is None or not constraints.include,
                )
            ]
        out = []
        for h in hyps:
            ids = target_ids(h)
            out.append(
                Translation(
                    text=self.tgt_tokenizer.decode(ids),
                    pieces=self.pieces(ids),
                    score=h.score if scores else None,
                    token_scores=h.positional_scores.tolist() if scores else None,
                    alignment=alignment_pairs(h, src_len) if alignment else None,
                    constraints_met=h.constraints_met,
                )
            )
        return out


class _Stopped:
    """A generator's `stopped` for one batch of a call: the call's cancelled sources
    (indices into the call's sources) as a [B] mask over the batch (None: none of it)."""

    def __init__(
        self, cancelled: Callable[[], Collection[int]], batch: list[int], device: torch.device
    ):
        self.cancelled, self.device = cancelled, device
        self.position = {source: row for row, source in enumerate(batch)}  # source -> row

    def rows(self) -> list[int]:
        position = self.position
        return list({position[i] for i in self.cancelled() if i in position})

    def sentences(self) -> int:
        return len(self.rows())

    def __call__(self) -> torch.Tensor | None:
        rows = self.rows()
        if not rows:
            return None
        mask = torch.zeros(len(self.position), dtype=torch.bool)
        mask[rows] = True
        return mask.to(self.device)


def _encode(encoder: TextEncoder, texts: Sequence[str]) -> list[np.ndarray]:
    """Ids of each text, fitted to the model's positions (warning or failing per line)."""
    return [encoder.fit(ids, i) for i, ids in enumerate(encoder.to_ids(encoder.normalize(texts)))]


def _quoted(text: str) -> str:
    """A phrase in double quotes for messages (JSON's quoting: "rote Mütze")."""
    return json.dumps(text, ensure_ascii=False)


def _contains(ids: tuple[int, ...], part: tuple[int, ...]) -> bool:
    """`part` occurs in `ids` as a contiguous run."""
    n = len(part)
    return any(ids[i : i + n] == part for i in range(len(ids) - n + 1))


def _as_ids(ids: IdsLike) -> np.ndarray:
    """1-D int64 ids from a list, an array or a tensor (no copy when already so)."""
    if isinstance(ids, torch.Tensor):
        ids = ids.cpu().numpy()
    return np.asarray(ids, dtype=np.int64).reshape(-1)


def _tagged(tags: np.ndarray, ids: np.ndarray, keep_empty: bool = False) -> np.ndarray:
    """`ids` after their language tags (`keep_empty`: an empty source stays empty, the
    empty line it is)."""
    if not len(tags) or (keep_empty and not len(ids)):
        return ids
    return np.concatenate([tags, ids])


def _nonempty(ids: np.ndarray) -> np.ndarray:
    """An empty sentence is [EOS] for the model."""
    return ids if len(ids) else np.array([EOS], dtype=np.int64)


def _check_texts(texts: object, name: str, allow_none: bool = False) -> None:
    """A list of str, not one str (which would be read as a list of characters)."""
    if isinstance(texts, str) or not isinstance(texts, Sequence):
        raise TypeError(f"{name}: pass a list of strings (for one sentence: [text])")
    bad = next(
        (i for i, t in enumerate(texts) if not (isinstance(t, str) or (allow_none and t is None))),
        None,
    )
    if bad is not None:
        raise TypeError(f"{name}[{bad}]: {type(texts[bad]).__name__}, not a str")
