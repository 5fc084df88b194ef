"""Languages of a multilingual model: directions, language tags and where a tag goes.

One model translates between several languages when each source carries a tag that names
the language to translate into (Johnson et al. 2017; fairseq's `--encoder-langtok tgt`).
A tag is a SentencePiece control symbol (`<2fr>`): its id is reserved in the vocabulary and
no text ever encodes to it, so a corpus line that contains the characters "<2fr>" stays
ordinary text. Each language has one tag; its position gives its role:

- `tgt` (default): `[<2tgt>] + source`: the target language's tag starts the source.
- `src_tgt`: `[<2src>, <2tgt>] + source`: both languages, the source's first.
- `decoder`: the source is untagged; the target starts with `<2tgt>` (fairseq's
  `--decoder-langtok`): trained as the first target token, forced as a prefix when
  translating, and dropped from the output (a control symbol decodes to "").

Training (nmt.training.data), translation (nmt.generation) and serving all go through
`LanguageTags`, which a checkpoint records under `data.languages` (`to_dict`).
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from typing import Any

from nmt.errors import NmtError, option_error

TAG_STYLES = ("tgt", "src_tgt", "decoder")
_LANG = re.compile(r"^[A-Za-z][A-Za-z0-9_]*$")


def tag_piece(lang: str) -> str:
    """The SentencePiece control symbol of `lang`'s tag."""
    return f"<2{lang}>"


def check_lang_code(lang: object, key: str) -> str:
    """`lang` if it is a language code (letters, digits and _: en, pt_BR, eng_Latn; no '-',
    which joins the two sides of a direction); otherwise NmtError naming `key`."""
    if not isinstance(lang, str) or not _LANG.match(lang):
        raise option_error(
            key,
            lang,
            "not a language code",
            "use letters, digits and _ (en, pt_BR, eng_Latn), as in the file names <prefix>.<lang>",
        )
    return lang


def parse_direction(direction: object, key: str) -> tuple[str, str]:
    """("en", "de") from "en-de"; NmtError naming `key` otherwise."""
    parts = direction.split("-") if isinstance(direction, str) else []
    if len(parts) != 2 or parts[0] == parts[1]:
        raise option_error(
            key,
            direction,
            "not a direction",
            "write source-target with two different language codes, e.g. en-de",
        )
    return check_lang_code(parts[0], key), check_lang_code(parts[1], key)


def direction_name(src: str, tgt: str) -> str:
    return f"{src}-{tgt}"


@dataclass(frozen=True)
class LanguageTags:
    """The languages a multilingual model knows and how its inputs are tagged."""

    style: str  # one of TAG_STYLES
    ids: dict[str, int]  # language -> its tag's id in the (joint) vocabulary
    directions: tuple[str, ...]  # the directions it was trained on ("en-de", ...)
    pieces: dict[str, str] = field(default_factory=dict)  # language -> tag piece

    def __post_init__(self) -> None:
        if self.style not in TAG_STYLES:
            raise NmtError(f"lang_tag={self.style!r}: use one of {', '.join(TAG_STYLES)}")

    @property
    def langs(self) -> list[str]:
        return list(self.ids)

    def targets(self, src_lang: str | None = None) -> list[str]:
        """The languages it translates into (from `src_lang`, when given), in tag order."""
        wanted = {
            tgt
            for src, tgt in (d.split("-") for d in self.directions)
            if src_lang is None or src == src_lang
        }
        return [lang for lang in self.ids if lang in wanted]

    def sources(self) -> list[str]:
        found = {d.split("-")[0] for d in self.directions}
        return [lang for lang in self.ids if lang in found]

    def check_target(self, tgt_lang: object, key: str = "tgt_lang") -> str:
        """`tgt_lang` if the model translates into it; else NmtError naming the ones it does."""
        if tgt_lang is None or tgt_lang == "":
            raise NmtError(
                f"{key}: required, this model translates into several languages; "
                f"give one of {', '.join(self.targets())}"
            )
        if tgt_lang not in self.targets():
            raise NmtError(
                f"{key}={tgt_lang}: the model does not translate into it; "
                f"it knows {', '.join(self.targets())}"
            )
        return str(tgt_lang)

    def check_source(self, src_lang: object, key: str = "src_lang") -> str | None:
        """`src_lang` (None allowed unless the style needs it) if the model knows it."""
        if src_lang is None or src_lang == "":
            if self.style == "src_tgt":
                raise NmtError(
                    f"{key}: required, this model's sources carry their own language's tag "
                    f"(lang_tag=src_tgt); give one of {', '.join(self.sources())}"
                )
            return None
        if src_lang not in self.sources():
            raise NmtError(
                f"{key}={src_lang}: the model does not translate from it; "
                f"it knows {', '.join(self.sources())}"
            )
        return str(src_lang)

    def source_prefix(self, src_lang: str | None, tgt_lang: str) -> list[int]:
        """The tag ids put before a source's tokens (the source keeps its EOS)."""
        if self.style == "tgt":
            return [self.ids[tgt_lang]]
        if self.style == "src_tgt":
            assert src_lang is not None, "check_source() first: src_tgt needs the source"
            return [self.ids[src_lang], self.ids[tgt_lang]]
        return []

    def target_prefix(self, tgt_lang: str) -> list[int]:
        """The tag ids a target starts with (forced when translating)."""
        return [self.ids[tgt_lang]] if self.style == "decoder" else []

    def to_dict(self) -> dict[str, Any]:
        """The checkpoint's `data.languages` entry."""
        return {
            "style": self.style,
            "ids": dict(self.ids),
            "pieces": dict(self.pieces),
            "directions": list(self.directions),
        }

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> LanguageTags:
        try:
            return cls(
                style=str(d["style"]),
                ids={str(k): int(v) for k, v in d["ids"].items()},
                directions=tuple(str(x) for x in d["directions"]),
                pieces={str(k): str(v) for k, v in d.get("pieces", {}).items()},
            )
        except (KeyError, TypeError, ValueError, AttributeError) as exc:
            raise NmtError(f"{where}: malformed data.languages ({exc!r})") from exc
