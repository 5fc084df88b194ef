"""A multilingual checkpoint built directly for generation tests: a tiny Transformer with
random weights (seeded), a joint SentencePiece model with the language tags <2en>, <2de>,
<2fr> as control symbols (nmt's special ids), and `data.languages` as nmt-train writes
it (LanguageTags.to_dict)."""

from __future__ import annotations

import functools
import io
import random
from dataclasses import asdict
from pathlib import Path

import sentencepiece as spm
import torch

from nmt.checkpoint import save_checkpoint, tokenizer_to_tensor
from nmt.data.languages import LanguageTags, direction_name, tag_piece
from nmt.data.tokenizer import Tokenizer
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer
from nmt.vocab import BOS, EOS, PAD, SPECIAL_IDS, UNK

LANGS = ("en", "de", "fr")
WORDS = {
    "en": "one two three four five six seven eight nine ten and hundred".split(),
    "de": "eins zwei drei vier fuenf sechs sieben acht neun zehn und hundert".split(),
    "fr": "un deux trois quatre cinq six sept huit neuf dix et cent".split(),
}


def sentences(lang: str, n: int, seed: int) -> list[str]:
    """`n` random sentences of `lang`'s words (1 to 6 of them)."""
    rng = random.Random(f"{lang}{seed}")
    words = WORDS[lang]
    return [" ".join(rng.choice(words) for _ in range(rng.randint(1, 6))) for _ in range(n)]


@functools.cache
def joint_tokenizer(langs: tuple[str, ...] = LANGS) -> Tokenizer:
    """A unigram model of every language's sentences with each language's tag as a
    control symbol (its id reserved; no text encodes to it; it decodes to "")."""
    text = [line for lang in langs for line in sentences(lang, 200, 0)]
    spm.set_random_generator_seed(1)
    model = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(text),
        model_writer=model,
        vocab_size=60,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        input_sentence_size=0,
        control_symbols=[tag_piece(lang) for lang in langs],
        bos_id=BOS,
        pad_id=PAD,
        eos_id=EOS,
        unk_id=UNK,
        normalization_rule_name="identity",
        num_threads=1,
        minloglevel=2,
    )
    return Tokenizer(model.getvalue(), name="multilingual test SentencePiece model")


def language_tags(
    style: str = "tgt", langs: tuple[str, ...] = LANGS, directions: list[str] | None = None
) -> LanguageTags:
    """The tags of `joint_tokenizer(langs)` for `directions` (default: every one)."""
    sp = spm.SentencePieceProcessor(model_proto=joint_tokenizer(langs).model_bytes)
    if directions is None:
        directions = [direction_name(a, b) for a in langs for b in langs if a != b]
    return LanguageTags(
        style=style,
        ids={lang: sp.piece_to_id(tag_piece(lang)) for lang in langs},
        directions=tuple(directions),
        pieces={lang: tag_piece(lang) for lang in langs},
    )


MODEL = ModelConfig(
    embed_dim=32,
    ffn_dim=64,
    attention_heads=4,
    encoder_layers=1,
    decoder_layers=2,
    dropout=0.0,
    max_source_positions=16,
    max_target_positions=12,
    share_all_embeddings=True,
)


def multilingual_checkpoint(
    path: Path,
    style: str | None = "tgt",
    *,
    seed: int = 0,
    langs: tuple[str, ...] = LANGS,
    directions: list[str] | None = None,
    model: ModelConfig = MODEL,
    transformer: Transformer | None = None,
) -> Path:
    """Save a tiny random multilingual model (tags of `style`) at `path`; style None: a
    single-pair model (the first direction's) with the same tokenizer, without tags.
    `transformer`: save these weights (over joint_tokenizer's vocabulary) instead."""
    tokenizer = joint_tokenizer(langs)
    tags = language_tags(style or "tgt", langs, directions)
    if transformer is None:
        torch.manual_seed(seed)
        transformer = Transformer(model, tokenizer.vocab_size, tokenizer.vocab_size)
    model = transformer.cfg
    spm_tensor = tokenizer_to_tensor(tokenizer.model_bytes)
    first_src, first_tgt = tags.directions[0].split("-")
    save_checkpoint(
        {
            "format_version": 1,
            "model_config": asdict(model),
            "model": transformer.state_dict(),
            "data": {
                "src_lang": first_src,
                "tgt_lang": first_tgt,
                "src_vocab_size": tokenizer.vocab_size,
                "tgt_vocab_size": tokenizer.vocab_size,
                "joint_vocab": True,
                "special_ids": dict(SPECIAL_IDS),
                "normalization": {"nfkc": False},
                **({"languages": tags.to_dict()} if style is not None else {}),
            },
            "tokenizers": {"src": spm_tensor, "tgt": spm_tensor},
            "config": {},
        },
        path,
    )
    return path
