"""The language tokens of a fairseq multilingual model, as nmt's LanguageTags.

fairseq's `translation_multi_simple_epoch` task (multilingual_data_manager.py) adds one
token per language (`__en__`, or `[en_XX]` with --lang-tok-style mbart) to every
dictionary after the symbols of dict.txt, in --langs order (one set per
--langtoks-specs entry; `<mask>` after them in mbart style), and puts one of them:

- `--encoder-langtok tgt`: before the source tokens (PrependTokenDataset): nmt's
  lang_tag=tgt, whose tag is the target language's, first in the source;
- `--decoder-langtok`: first in the target, forced as a prefix when translating (its
  inference_step): nmt's lang_tag=decoder.

So such a model maps onto nmt unchanged: the tokens become SentencePiece control
symbols appended to the model's SentencePiece model (their ids reserved, no text
encoding to them), each taking the embedding row of its fairseq token. Placements nmt
has no style for (the source language's token on the source, tokens on both sides,
--lang-tok-replacing-bos-eos) are refused with a one-line error naming them.
"""

from __future__ import annotations

import importlib
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from nmt.data.languages import LanguageTags, check_lang_code, parse_direction
from nmt.errors import NmtError, option_error

MULTILINGUAL_TASK = "translation_multi_simple_epoch"
TOKEN_STYLES = {"multilingual": "__{}__", "mbart": "[{}]"}  # fairseq's TOKEN_STYLES
SPEC_SUFFIXES = {"dae": "_dae", "mined": "_mined"}  # get_lang_tok's per-spec languages


@dataclass(frozen=True)
class FairseqLanguages:
    """A fairseq multilingual model's languages, tokens and their placement."""

    langs: tuple[str, ...]  # --langs order: the order of the tokens in the dictionary
    style: str  # nmt's lang_tag: tgt or decoder
    directions: tuple[str, ...]  # --lang-pairs
    token_style: str  # "__{}__" or "[{}]"
    specs: tuple[str, ...] = ("main",)  # --langtoks-specs: one set of tokens each
    mask: bool = False  # "<mask>" after the tokens (mbart style, mono_dae data)

    def piece(self, lang: str) -> str:
        """The token of `lang` (the "main" spec's), as fairseq's dictionary holds it."""
        return self.token_style.format(lang)

    def dictionary(self, symbols: Sequence[str]) -> list[str]:
        """A dict.txt's symbols (the four specials first) as the task extends them: each
        token added once (Dictionary.add_symbol keeps a symbol it already has)."""
        out = list(symbols)
        seen = set(out)
        added = [
            self.token_style.format(lang + _spec_suffix(spec))
            for spec in self.specs
            for lang in self.langs
        ]
        for symbol in [*added, *(["<mask>"] if self.mask else [])]:
            if symbol not in seen:
                seen.add(symbol)
                out.append(symbol)
        return out

    def tags(self, piece_ids: Mapping[str, int]) -> LanguageTags:
        """nmt's LanguageTags, given the ids of the pieces in the SentencePiece model."""
        return LanguageTags(
            style=self.style,
            ids={lang: piece_ids[self.piece(lang)] for lang in self.langs},
            directions=self.directions,
            pieces={lang: self.piece(lang) for lang in self.langs},
        )


def _spec_suffix(spec: str) -> str:
    """What fairseq's get_lang_tok adds to a language for a --langtoks-specs entry."""
    return next((suffix for end, suffix in SPEC_SUFFIXES.items() if spec.endswith(end)), "")


def _as_list(value: Any) -> list[str]:
    """fairseq's csv_str_list options: a list, or a comma-separated string."""
    if value is None:
        return []
    if isinstance(value, str):
        return [v.strip() for v in value.split(",") if v.strip()]
    return [str(v) for v in value]


def fairseq_languages(
    task: Mapping[str, Any],
    langs: Sequence[str] | None,
    lang_tag: str | None,
    where: str,
) -> FairseqLanguages | None:
    """The languages of a checkpoint whose task options are `task` (None: a single-pair
    model), with nmt-import-fairseq's `langs=` and `lang_tag=` over what it records
    (NmtError naming the option, or the checkpoint `where`, when they cannot work)."""
    multilingual = task.get("_name", task.get("task")) == MULTILINGUAL_TASK
    if not multilingual and langs is None and lang_tag is None:
        return None
    if task.get("lang_tok_replacing_bos_eos"):
        raise NmtError(
            f"{where}: its language tokens replace BOS/EOS (--lang-tok-replacing-bos-eos), "
            "which nmt's tag styles do not do"
        )
    pairs = _as_list(task.get("lang_pairs"))
    for pair in pairs:
        parse_direction(pair, "lang_pairs")
    given = [check_lang_code(lang, "langs") for lang in langs] if langs is not None else None
    recorded = _as_list(task.get("langs"))
    if given is None and not recorded and task.get("lang_dict"):
        raise option_error(
            "langs",
            [],
            f"{where} reads its languages from --lang-dict {task['lang_dict']}",
            "give them in that file's order, e.g. langs=[en,de,fr]",
        )
    # fairseq infers sorted languages from the pairs when neither option is given
    order = given or recorded or sorted({x for p in pairs for x in p.split("-")})
    if not order:
        raise option_error(
            "langs", [], f"{where} does not record its languages", "give langs=[en,de,...]"
        )
    style = _style(task, lang_tag, where)
    directions = pairs or [f"{a}-{b}" for a in order for b in order if a != b]
    for direction in directions:
        if any(lang not in order for lang in direction.split("-")):
            raise option_error(
                "langs",
                list(order),
                f"the model's direction {direction} is not covered",
                "give every language of --lang-pairs, in --langs order",
            )
    token_style = str(task.get("lang_tok_style") or "multilingual")
    if token_style not in TOKEN_STYLES:
        raise NmtError(
            f"{where}: lang_tok_style={token_style} is not fairseq's multilingual or mbart"
        )
    extra = task.get("extra_data") or {}
    return FairseqLanguages(
        langs=tuple(order),
        style=style,
        directions=tuple(directions),
        token_style=TOKEN_STYLES[token_style],
        specs=tuple(_as_list(task.get("langtoks_specs")) or ["main"]),
        mask=token_style == "mbart" or "mono_dae" in extra,
    )


def _style(task: Mapping[str, Any], lang_tag: str | None, where: str) -> str:
    """nmt's lang_tag for the checkpoint's --encoder-langtok/--decoder-langtok."""
    main = (task.get("langtoks") or {}).get("main")
    encoder, decoder = (
        tuple(main) if main else (task.get("encoder_langtok"), task.get("decoder_langtok"))
    )
    decoder = "tgt" if decoder is True else decoder or None
    recorded = {("tgt", None): "tgt", (None, "tgt"): "decoder"}.get((encoder or None, decoder))
    if (encoder or decoder) and recorded is None:
        raise NmtError(
            f"{where}: its language tokens go on the source ({encoder}) and the target "
            f"({decoder}); nmt's tags go on one side: --encoder-langtok tgt (lang_tag=tgt) "
            "or --decoder-langtok alone (lang_tag=decoder)"
        )
    if lang_tag is not None and recorded is not None and lang_tag != recorded:
        raise option_error(
            "lang_tag",
            lang_tag,
            f"{where} was trained with lang_tag={recorded}'s placement",
            f"drop lang_tag= or give {recorded}",
        )
    style = lang_tag or recorded
    if style is None:
        raise option_error(
            "lang_tag",
            None,
            f"{where} does not record where its language tokens go",
            "give lang_tag=tgt (--encoder-langtok tgt) or lang_tag=decoder (--decoder-langtok)",
        )
    return style


def with_control_pieces(model_bytes: bytes, pieces: Sequence[str]) -> bytes:
    """The SentencePiece model with `pieces` appended as control symbols (those it does
    not have yet): their ids are reserved, no text encodes to them, they decode to ""."""
    import sentencepiece as spm

    pb: Any = importlib.import_module("sentencepiece.sentencepiece_model_pb2")
    proto = pb.ModelProto()
    proto.ParseFromString(model_bytes)
    have = {p.piece for p in proto.pieces}
    for text in pieces:
        if text in have:
            continue
        piece = pb.ModelProto.SentencePiece()
        piece.piece, piece.score, piece.type = text, 0.0, piece.CONTROL
        proto.pieces.append(piece)
    out = proto.SerializeToString()
    spm.SentencePieceProcessor(model_proto=out)  # must load
    return out
