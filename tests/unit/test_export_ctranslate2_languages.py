"""nmt-export of a multilingual model: CTranslate2, called with the tags as the export's
docstring says, translates into each language exactly as nmt does (beam search, tokens
and scores), for tags on the source (lang_tag=tgt, src_tgt) and on the target (decoder).

A forced decoder tag is scored differently: nmt's score sums its log-prob with the
others' (as for any forced prefix), CTranslate2's leaves it out of the sum (both count it
in the length). Without a length penalty both rank hypotheses alike, and CTranslate2's
score is the sum of nmt's token_scores (which leave the tag out)."""

from __future__ import annotations

import json

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from nmt import Translator  # noqa: E402
from nmt.data.tokenizer import normalize_text  # noqa: E402
from nmt.generation.config import SearchConfig  # noqa: E402
from nmt.generation.generator import SequenceGenerator  # noqa: E402
from nmt.interop.ctranslate2_export import export_ctranslate2  # noqa: E402
from nmt.model.config import ModelConfig  # noqa: E402
from nmt.model.transformer import Transformer  # noqa: E402
from nmt.vocab import BOS, EOS, PAD  # noqa: E402
from tests.helpers import padded  # noqa: E402
from tests.multilingual_checkpoint import (  # noqa: E402
    joint_tokenizer,
    language_tags,
    multilingual_checkpoint,
    sentences,
)

pytestmark = pytest.mark.usefixtures("one_thread")

LIMIT = 30
BEAM, LENPEN = 4, 0.8
TEXTS = sentences("en", 12, 3) + sentences("de", 12, 4)
TARGETS = (["fr", "de", "fr"] * 4) + (["en", "fr"] * 6)
SOURCES = ["en"] * 12 + ["de"] * 12


def _lenpen(style: str) -> float:
    return 0.0 if style == "decoder" else LENPEN


def _min_len(style: str) -> int:
    """nmt's min_len: 0 (nmt masks </s> at step 0 after the softmax, CTranslate2 before
    it: only without that mask do the scores compare), 1 for a decoder tag: CTranslate2
    never ends a translation right after its target prefix, nor does nmt's min_len=1,
    which counts the tokens after the tag (as a translation shows them)."""
    return 1 if style == "decoder" else 0


def _model(style: str) -> Transformer:
    """A random model (every weight off its init) whose translations end at a median
    length of 4 to 12 tokens: the </s> logit gets a bias, bisected; PAD, BOS and the
    tags are all but impossible (a forced decoder tag's step scores about -100)."""
    tok, tags = joint_tokenizer(), language_tags(style)
    cfg = ModelConfig(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.0,
        max_source_positions=64,
        max_target_positions=64,
        share_all_embeddings=True,
    )
    torch.manual_seed(0)
    model = Transformer(cfg, tok.vocab_size, tok.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    rows = [
        torch.tensor(tags.source_prefix(s, t) + tok.encode(x) + [EOS])
        for x, s, t in zip(TEXTS, SOURCES, TARGETS)
    ]
    prefix = None
    if style == "decoder":
        prefix = torch.tensor([tags.target_prefix(t) for t in TARGETS])
    # the search nmt runs (a decoder tag is one more token of the minimum)
    search = SearchConfig(
        beam=BEAM, lenpen=_lenpen(style), max_len_b=LIMIT, min_len=2 * _min_len(style)
    )
    generator = SequenceGenerator([model], search, never=list(tags.ids.values()))
    norm = model.decoder.layers[-1].final_layer_norm
    out = model.decoder.output_projection.weight  # [V,D]
    low, high = -5.0, 15.0
    for _ in range(12):
        bias = (low + high) / 2
        with torch.no_grad():  # feature 0 is constant 1: column 0 of the output is a bias
            norm.weight[0], norm.bias[0] = 0.0, 1.0
            out[:, 0] = 0.0
            # never chosen (as by a trained model): PAD, BOS and the tags; CTranslate2
            # suppresses the tags before its softmax, nmt after it, which then agree
            out[[PAD, BOS, *tags.ids.values()], 0] = -100.0
            out[EOS, 0] = bias
        hyps = generator.generate(padded(rows), prefix)
        median = sorted(len(h[0].tokens) for h in hyps)[len(hyps) // 2]
        if 4 <= median <= 12:
            break
        low, high = (bias, high) if median > 12 else (low, bias)
    return model


@pytest.mark.parametrize("style", ["tgt", "src_tgt", "decoder"])
def test_ctranslate2_translates_into_each_language_as_nmt(style, tmp_path):
    path = multilingual_checkpoint(tmp_path / "m.pt", style, transformer=_model(style))
    export_ctranslate2(path, tmp_path / "ct2")
    info = json.loads((tmp_path / "ct2" / "nmt_export.json").read_text())
    tags = language_tags(style)
    assert info["languages"] == tags.to_dict()
    vocab = (tmp_path / "ct2" / "shared_vocabulary.json").read_text()
    assert all(f'"{piece}"' in vocab for piece in tags.pieces.values())

    ours = Translator.from_checkpoint(
        path,
        device="cpu",
        beam=BEAM,
        lenpen=_lenpen(style),
        max_len_b=LIMIT,
        min_len=_min_len(style),
    ).translate_batch(TEXTS, tgt_lang=TARGETS, src_lang=SOURCES, return_scores=True)

    tok = joint_tokenizer()
    piece = tags.pieces
    sources, prefixes = [], []
    for text, src, tgt in zip(TEXTS, SOURCES, TARGETS):
        pieces = tok.encode_as_pieces(normalize_text(text, False))
        source_tags = {"tgt": [piece[tgt]], "src_tgt": [piece[src], piece[tgt]]}
        sources.append(source_tags.get(style, []) + pieces)
        prefixes.append([piece[tgt]] if style == "decoder" else None)
    forced = style == "decoder"
    theirs = ctranslate2.Translator(
        str(tmp_path / "ct2"), device="cpu", compute_type="float32", intra_threads=1
    ).translate_batch(
        sources,
        target_prefix=prefixes if forced else None,
        suppress_sequences=[[p] for p in piece.values()],
        beam_size=BEAM,
        length_penalty=_lenpen(style),
        max_decoding_length=LIMIT,
        min_decoding_length=0,
        return_scores=True,
    )
    compared = 0
    for mine, result, tgt in zip(ours, theirs, TARGETS):
        best = mine[0]
        if len(best.pieces) + forced >= LIMIT:  # nmt ends at the limit with </s>, CT2 without
            continue
        hyp = result.hypotheses[0]
        if forced:
            assert hyp[0] == piece[tgt]  # CTranslate2 returns the forced prefix
            hyp = hyp[1:]
        assert hyp == best.pieces
        want = sum(best.token_scores) if forced else best.score
        assert result.scores[0] == pytest.approx(want, abs=1e-4)
        compared += 1
    assert compared >= len(TEXTS) // 2  # not a vacuous check
