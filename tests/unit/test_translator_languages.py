"""Translator with a multilingual model: the language asked for is what its tag says, per
sentence, whatever the batch; the tag never shows in what is reported; bad languages are
one-line errors (tests/multilingual_checkpoint.py builds the models)."""

from __future__ import annotations

import pytest
import torch

from nmt import Translator
from nmt.data.languages import LanguageTags
from nmt.data.tokenizer import normalize_text
from nmt.errors import NmtError
from nmt.vocab import BOS, EOS, PAD
from tests.multilingual_checkpoint import language_tags, multilingual_checkpoint, sentences
from tests.rounding import logprob_tolerance

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=3, nbest=2)
TEXTS = sentences("en", 8, 1) + [""] + sentences("de", 3, 2)
TARGETS = ["fr", "de", "fr", "fr", "de", "en", "fr", "de", None, "fr", "en", "fr"]
SOURCES = ["en"] * 9 + ["de"] * 3


@pytest.fixture(scope="module", params=["tgt", "src_tgt", "decoder"])
def style(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory, style):
    return multilingual_checkpoint(tmp_path_factory.mktemp("ml") / f"{style}.pt", style)


@pytest.fixture(scope="module")
def translator(checkpoint) -> Translator:
    return Translator.from_checkpoint(checkpoint, device="cpu", **SEARCH)


def _langs(texts: list[str]) -> tuple[list[str], list[str]]:
    """Per text a target and a source language (an empty text: any)."""
    return [t or "de" for t in TARGETS][: len(texts)], SOURCES[: len(texts)]


def _tokens(results) -> list[list[list[str]]]:
    return [[t.pieces for t in per_source] for per_source in results]


def _tolerance(translator: Translator, results) -> float:
    """fp32 rounding of the model's log-probs on the translations (tags included)."""
    model = translator.models[0]
    enc = translator.src_tokenizer
    tags = translator.languages
    pairs = []
    for per_source, text, tgt, src in zip(results, TEXTS, *_langs(TEXTS)):
        if not text:
            continue
        source = tags.source_prefix(src, tgt) + enc.encode(text) + [EOS]
        for t in per_source:
            target = tags.target_prefix(tgt) + enc.encode(t.text) + [EOS]
            pairs.append((source, target))
    return logprob_tolerance(model, pairs)


def test_languages_come_from_the_checkpoint(translator, style):
    assert isinstance(translator.languages, LanguageTags)
    assert translator.languages == language_tags(style)
    tag_room = {"tgt": 1, "src_tgt": 2, "decoder": 0}[style]
    assert translator.max_source_positions == 16 - tag_room  # the tags count
    assert translator.max_target_positions == 12 - (style == "decoder")


def test_mixed_targets_in_a_batch_equal_each_alone(checkpoint, translator):
    """A sentence into fr alone is the same as in a batch with de and en targets, in any
    order and any batching; the tag is per sentence."""
    tgt, src = _langs(TEXTS)
    want = translator.translate_batch(TEXTS, tgt_lang=tgt, src_lang=src, return_scores=True)
    tolerance = _tolerance(translator, want)
    one_by_one = Translator.from_checkpoint(checkpoint, device="cpu", max_sentences=1, **SEARCH)
    alone = [
        one_by_one.translate_batch([t], tgt_lang=g, src_lang=s, return_scores=True)[0]
        for t, g, s in zip(TEXTS, tgt, src)
    ]
    reversed_ = translator.translate_batch(
        TEXTS[::-1], tgt_lang=tgt[::-1], src_lang=src[::-1], return_scores=True
    )[::-1]
    uncached = translator.translate_batch(
        TEXTS, tgt_lang=tgt, src_lang=src, return_scores=True, use_cache=False
    )
    for got in (alone, reversed_, uncached):
        assert _tokens(got) == _tokens(want)
        for a, b in zip(got, want):
            assert [t.score for t in a] == pytest.approx([t.score for t in b], abs=tolerance)
    # the target language decides: the same texts into other languages differ somewhere
    other = translator.translate(
        TEXTS, tgt_lang=["en" if g != "en" else "fr" for g in tgt], src_lang=src
    )
    assert other != [per[0].text for per in want]


def _greedy(
    model, source: list[int], forced: list[int], never: list[int], max_len: int
) -> list[int]:
    """Greedy decoding with Transformer.forward alone (no cache, no nmt search code):
    `forced` first, then the argmax over every token but PAD, BOS and `never` (the tags;
    nor EOS right after `forced`: min_len=1); EOS at max_len."""
    src = torch.tensor([source])
    out: list[int] = []
    with torch.no_grad():
        while True:
            if len(out) == max_len:
                return out + [EOS]
            prev = torch.tensor([[EOS] + out])
            logits = model(src, prev)[0, -1].float()  # [V]
            logits[[PAD, BOS, *never]] = -torch.inf
            if len(out) <= len(forced):  # min_len=1 counts the tokens after a forced tag
                logits[EOS] = -torch.inf
            token = forced[len(out)] if len(out) < len(forced) else int(logits.argmax())
            out.append(token)
            if token == EOS:
                return out


def test_the_tag_is_what_decides(translator, style):
    """Greedy translations are the model's own greedy decoding of the tagged source (the
    tag ids before the source ids, or forced first in the target); a text holding the
    characters "<2fr>" keeps them as text."""
    model, tags, tok = translator.models[0], translator.languages, translator.src_tokenizer
    texts = [*TEXTS[:4], "<2fr> one two"]
    ids = [tok.encode(normalize_text(t, False)) for t in texts]
    assert all(tags.ids["fr"] not in i for i in ids)  # "<2fr>" is text, not the tag
    for tgt in ("fr", "de"):
        got = translator.translate_batch(texts, tgt_lang=tgt, src_lang="en", beam=1, nbest=1)
        for text_ids, per_source in zip(ids, got):
            source = tags.source_prefix("en", tgt) + text_ids + [EOS]
            forced = tags.target_prefix(tgt)
            never = list(tags.ids.values())
            want = _greedy(model, source, forced, never, model.cfg.max_target_positions - 1)
            hyp = per_source[0]
            assert want[: len(forced)] == forced
            assert translator.pieces(want[len(forced) : -1]) == hyp.pieces


def test_the_tag_never_shows(translator, style):
    tgt, src = _langs(TEXTS)
    results = translator.translate_batch(
        TEXTS, tgt_lang=tgt, src_lang=src, nbest=2, return_scores=True, return_alignment=True
    )
    tag_pieces = set(translator.languages.pieces.values())
    for text, per_source in zip(TEXTS, results):
        if not text:
            assert [t.text for t in per_source] == [""]
            continue
        for t in per_source:
            assert not tag_pieces & set(t.pieces)
            assert "<2" not in t.text
            assert len(t.token_scores) == len(t.pieces) + 1
            assert [j for _, j in t.alignment] == list(range(len(t.pieces)))
            n_src = len(translator.src_tokenizer.encode(text))
            assert all(0 <= i < n_src for i, _ in t.alignment)  # text positions, no tags
            mean = sum(t.token_scores) / len(t.token_scores)
            if style != "decoder" and t.pieces:
                assert t.score == pytest.approx(mean, abs=1e-5)


def test_score_agrees_with_generation(translator, style):
    """Forced decoding of a translation gives its score (with a decoder tag's step, as
    generation counts it) and its token scores (without); the tag is no piece of it."""
    tgt, src = _langs(TEXTS)
    keep = [i for i, t in enumerate(TEXTS) if t]
    texts, tgt, src = [TEXTS[i] for i in keep], [tgt[i] for i in keep], [src[i] for i in keep]
    encoder = translator.source_encoder()
    sources = encoder.to_ids(encoder.normalize(texts))
    hyps = translator.translate_ids(sources, tgt_lang=tgt, src_lang=src, nbest=2)
    best = [h[0] for h in hyps]
    tolerance = _tolerance(
        translator, translator.translate_batch(TEXTS, tgt_lang=_langs(TEXTS)[0], src_lang=SOURCES)
    )
    scored = translator.score_ids(sources, [h.tokens for h in best], tgt_lang=tgt, src_lang=src)
    for h, s in zip(best, scored):
        assert s.tokens.tolist() == h.tokens.tolist()
        assert s.positional_scores.tolist() == pytest.approx(
            h.positional_scores.tolist(), abs=tolerance
        )
        assert s.score == pytest.approx(h.score, abs=tolerance * len(s.tokens))
    for s in translator.score(texts, texts, tgt_lang=tgt, src_lang=src):
        assert not set(translator.languages.pieces.values()) & set(s.pieces)
        assert len(s.token_scores) == len(s.pieces) + 1
        assert s.log_prob == pytest.approx(sum(s.token_scores), abs=1e-4)
        if style != "decoder":
            assert s.score == pytest.approx(s.log_prob / len(s.token_scores), abs=1e-5)


def test_language_errors(translator, style):
    needs_source = style == "src_tgt"
    src = "en" if needs_source else None
    with pytest.raises(NmtError, match=r"^tgt_lang: required, .*give one of en, de, fr$"):
        translator.translate(["one two"], src_lang=src)
    with pytest.raises(
        NmtError,
        match=r"^tgt_lang=it: the model does not translate into it; "
        r"it knows en, de, fr$",
    ):
        translator.translate(["one two"], tgt_lang="it", src_lang=src)
    with pytest.raises(NmtError, match=r"^tgt_lang\[1\]=xx: "):
        translator.translate(["one", "two"], tgt_lang=["de", "xx"], src_lang=src)
    with pytest.raises(NmtError, match=r"^tgt_lang: 3 language codes for 2 texts"):
        translator.translate(["one", "two"], tgt_lang=["de", "fr", "en"], src_lang=src)
    with pytest.raises(NmtError, match=r"^src_lang=it: the model does not translate from it"):
        translator.translate(["one"], tgt_lang="de", src_lang="it")
    with pytest.raises(NmtError, match=r"^tgt_lang=it: "):
        translator.score(["one"], ["zwei"], tgt_lang="it", src_lang=src)
    if needs_source:
        with pytest.raises(NmtError, match=r"^src_lang: required, .*lang_tag=src_tgt"):
            translator.translate(["one"], tgt_lang="de")


def test_a_direction_it_was_not_trained_on_is_zero_shot(tmp_path):
    """Languages are checked one by one: de -> fr goes although only en -> fr was trained
    (Johnson et al.'s zero-shot translation); fr is no source of this model."""
    path = multilingual_checkpoint(tmp_path / "m.pt", directions=["en-de", "de-en", "en-fr"])
    translator = Translator.from_checkpoint(path, device="cpu", beam=1)
    assert translator.translate(
        ["eins zwei"], tgt_lang="fr", src_lang="de"
    ) == translator.translate(["eins zwei"], tgt_lang="fr")
    with pytest.raises(
        NmtError,
        match=r"^src_lang=fr: the model does not translate from it; "
        r"it knows en, de$",
    ):
        translator.translate(["un"], tgt_lang="en", src_lang="fr")


def test_a_single_pair_model_takes_no_language_or_its_own(tmp_path):
    translator = Translator.from_checkpoint(
        multilingual_checkpoint(tmp_path / "pair.pt", None), device="cpu", beam=1
    )
    assert translator.languages is None
    plain = translator.translate(TEXTS)
    assert translator.translate(TEXTS, tgt_lang="de", src_lang="en") == plain
    with pytest.raises(
        NmtError,
        match=r"^tgt_lang=fr: this model translates en-de only, not "
        r"into it; leave it out or give de$",
    ):
        translator.translate(TEXTS, tgt_lang="fr")
    with pytest.raises(NmtError, match=r"^src_lang=fr: this model translates en-de only"):
        translator.score(["un"], ["eins"], src_lang="fr")


def test_an_ensemble_needs_the_same_languages(tmp_path):
    a = multilingual_checkpoint(tmp_path / "a.pt", "tgt", seed=1)
    b = multilingual_checkpoint(tmp_path / "b.pt", "tgt", seed=2)
    c = multilingual_checkpoint(tmp_path / "c.pt", "decoder", seed=3)
    ensemble = Translator.from_checkpoint([a, b], device="cpu", beam=2)
    assert ensemble.languages == language_tags("tgt")
    assert ensemble.translate(["one two"], tgt_lang="fr")
    with pytest.raises(NmtError, match=rf"^{c}: its languages and tags differ from {a}'s"):
        Translator.from_checkpoint([a, c], device="cpu")


def test_length_options_count_the_tokens_a_translation_shows(translator):
    """min_len and max_len_b leave a forced decoder tag out: max_len_b=1 with min_len=1
    is one visible piece in every style."""
    tgt, src = _langs(TEXTS)
    results = translator.translate_batch(
        TEXTS, tgt_lang=tgt, src_lang=src, max_len_b=1, min_len=1, nbest=1
    )
    for text, per_source in zip(TEXTS, results):
        assert len(per_source[0].pieces) == (1 if text else 0)
