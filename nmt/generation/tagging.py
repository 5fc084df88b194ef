"""Which language each sentence is translated into, as the ids a model needs for it.

A multilingual checkpoint records its LanguageTags (nmt.data.languages) under
`data.languages`; a call names the target language (`tgt_lang`), and the source language
where the model's style needs it (`src_lang`), once for all sentences or once per sentence
(a batch can mix target languages: the tag is per sentence). Any known source language
may go into any known target language: a direction the model was not trained on is
translated zero-shot, as Johnson et al. do. `ModelLanguages.tags` turns
them into each sentence's `SentenceTags`: ids put before its source tokens and ids forced
at the start of its target. A single-pair model has no tags: it accepts no language or
its own, and refuses any other with a one-line NmtError.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import torch

from nmt.data.languages import LanguageTags
from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.generator import Hypothesis

# One language code for every sentence of a call, or one per sentence (None: not given).
LangsLike = str | Sequence[str | None] | None


def _no_ids() -> np.ndarray:
    return np.zeros(0, np.int64)


@dataclass(frozen=True)
class SentenceTags:
    """One sentence's tag ids: `source` put before its source ids (which keep their EOS),
    `target` forced at the start of its translation and cut from what is reported."""

    source: np.ndarray = field(default_factory=_no_ids)  # [s] int64
    target: np.ndarray = field(default_factory=_no_ids)  # [t] int64


NO_TAGS = SentenceTags()


def checkpoint_languages(
    datas: Sequence[Mapping[str, Any]], paths: Sequence[str]
) -> LanguageTags | None:
    """The LanguageTags of an ensemble's checkpoints (their `data` entries), None for
    single-pair models; every member must have the same (NmtError naming the file)."""
    first = datas[0].get("languages")
    for path, data in zip(paths[1:], datas[1:]):
        if data.get("languages") != first:
            raise NmtError(
                f"{path}: its languages and tags differ from {paths[0]}'s; an ensemble needs "
                "checkpoints trained on the same data dir with the same lang_tag"
            )
    return None if first is None else LanguageTags.from_dict(first, paths[0])


class ModelLanguages:
    """A model's languages: the checks of `tgt_lang`/`src_lang` and the tags they give.

    `languages`: the model's LanguageTags (None: a single-pair model translating
    `src_lang` into `tgt_lang`, either None when unknown)."""

    def __init__(
        self, languages: LanguageTags | None, src_lang: str | None, tgt_lang: str | None
    ) -> None:
        self.languages = languages
        self.src_lang, self.tgt_lang = src_lang, tgt_lang
        style = languages.style if languages is not None else None
        # positions the tags take, the same for every sentence of the model
        self.source_length = {"tgt": 1, "src_tgt": 2}.get(style or "", 0)
        self.target_length = 1 if style == "decoder" else 0
        # no hypothesis chooses a tag: one starts a decoder-style target only when forced
        self.tag_ids = sorted(languages.ids.values()) if languages is not None else []

    def decoding(self, search: SearchConfig) -> SearchConfig:
        """The search as the generator runs it. A forced target tag is one more output
        token, so min_len (when set) and max_len_b count it too: the options count the
        tokens a translation shows."""
        t = self.target_length
        if not t:
            return search
        return dataclasses.replace(
            search,
            min_len=search.min_len + t if search.min_len else 0,
            max_len_b=search.max_len_b + t,
        )

    def check_pieces(
        self, piece_names: Callable[[list[int]], list[str]], vocab_size: int, where: str
    ) -> None:
        """Every tag id is a piece of the vocabulary, the one the checkpoint names."""
        if self.languages is None:
            return
        for lang, tag_id in self.languages.ids.items():
            want = self.languages.pieces.get(lang)
            fits = 0 <= tag_id < vocab_size
            if not fits or (want is not None and piece_names([tag_id]) != [want]):
                raise NmtError(
                    f"{where}: the tag of {lang} (id {tag_id}, {want}) is not in its "
                    "SentencePiece model; the checkpoint's data.languages is inconsistent"
                )

    def tags(self, n: int, tgt_lang: LangsLike, src_lang: LangsLike) -> list[SentenceTags]:
        """The tags of each of `n` sentences (NmtError naming a language the model does not
        know, or a list of the wrong length)."""
        tgts = _per_sentence(tgt_lang, n, "tgt_lang")
        srcs = _per_sentence(src_lang, n, "src_lang")
        found: dict[tuple[str | None, str | None], SentenceTags] = {}
        out = []
        for i, pair in enumerate(zip(srcs, tgts)):
            if pair not in found:
                keys = _key("src_lang", src_lang, i), _key("tgt_lang", tgt_lang, i)
                found[pair] = self._sentence_tags(*pair, *keys)
            out.append(found[pair])
        return out

    def check_source(self, src: str | None, key: str = "src_lang") -> str | None:
        """`src` if the model translates from it (None: if it need not be named)."""
        if self.languages is None:
            self._check_own(src, self.src_lang, key, "from")
            return src
        return self.languages.check_source(src, key)

    def _sentence_tags(
        self, src: str | None, tgt: str | None, src_key: str, tgt_key: str
    ) -> SentenceTags:
        langs = self.languages
        src = self.check_source(src, src_key)
        if langs is None:
            self._check_own(tgt, self.tgt_lang, tgt_key, "into")
            return NO_TAGS
        tgt = langs.check_target(tgt, tgt_key)
        return SentenceTags(
            source=np.asarray(langs.source_prefix(src, tgt), dtype=np.int64),
            target=np.asarray(langs.target_prefix(tgt), dtype=np.int64),
        )

    def _check_own(self, given: str | None, own: str | None, key: str, way: str) -> None:
        """A single-pair model accepts no language or its own."""
        if given is None or given == "" or given == own:
            return
        pair = f"{self.src_lang}-{self.tgt_lang}" if self.src_lang and self.tgt_lang else None
        known = f"{pair} only" if pair else "one language pair"
        fix = f"leave it out or give {own}" if own else "leave it out"
        raise NmtError(f"{key}={given}: this model translates {known}, not {way} it; {fix}")


def _per_sentence(langs: LangsLike, n: int, key: str) -> list[str | None]:
    """One code (or None) per sentence from one code for all or a sequence of them."""
    if langs is None or isinstance(langs, str):
        return [langs] * n
    if not isinstance(langs, Sequence):
        raise TypeError(f"{key}: pass a language code, or a list with one per text")
    if len(langs) != n:
        raise NmtError(
            f"{key}: {len(langs)} language codes for {n} texts; give one code for all "
            "texts or one per text"
        )
    bad = next((i for i, x in enumerate(langs) if not (x is None or isinstance(x, str))), None)
    if bad is not None:
        raise TypeError(f"{key}[{bad}]: {type(langs[bad]).__name__}, not a str")
    return list(langs)


def _key(name: str, langs: LangsLike, i: int) -> str:
    """How sentence `i`'s language option is named in messages: tgt_lang, tgt_lang[3]."""
    return name if langs is None or isinstance(langs, str) else f"{name}[{i}]"


def untagged(hyp: Hypothesis, tags: SentenceTags) -> Hypothesis:
    """`hyp` without its sentence's tags: the forced target tag leaves its tokens,
    positional scores and attention rows, the source tags its attention columns. Its
    score stays the search's, which counts the tag's step as a forced prefix's steps
    count (a tag's log-prob is the same for every hypothesis of a sentence)."""
    t, s = len(tags.target), len(tags.source)
    if not t and not s:
        return hyp
    if not torch.equal(hyp.tokens[:t], torch.from_numpy(tags.target)):
        t = 0  # a sentence every path of which was forbidden: [EOS] alone
    attention = None if hyp.attention is None else hyp.attention[t:, s:]  # [T-t,S-s]
    return dataclasses.replace(
        hyp,
        tokens=hyp.tokens[t:],
        positional_scores=hyp.positional_scores[t:],
        attention=attention,
    )
