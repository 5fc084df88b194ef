"""Exclude phrases are banned in every spelling a translation could hold them in
(nmt.generation.banned, through Translator.constraint_ids).

On the hand-made vocabulary of test_tokenizer_segmentations: which id phrases a word
becomes. On the suite's tiny trained model: a word drawn from a sentence's unconstrained
n-best outputs, forbidden, is in none of its n-best translations, also when the search
is pushed to write it in another spelling (where banning the tokenizer's spelling alone
lets it through).
"""

from __future__ import annotations

import logging
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from benchmarks.constraints import contains_word, strip_punctuation
from nmt import Translator
from nmt.errors import NmtError
from nmt.generation.banned import EXCLUDE_SPELLINGS, banned_spellings, without_redundant
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import TokenConstraints
from nmt.generation.terminology import TextConstraints
from nmt.vocab import EOS
from tests import helpers
from tests.unit.test_tokenizer_segmentations import hand_made, pieces

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def hand() -> Translator:
    """A random model over the hand-made vocabulary with byte pieces."""
    tok = hand_made(byte_pieces=True)
    model = helpers.random_transformer(vocab=tok.vocab_size)
    return Translator([model], tok, tok, search=SearchConfig(beam=2, max_len_b=4))


def excluded(translator: Translator, *phrases: str) -> list[list[str]]:
    got = translator.constraint_ids(TextConstraints(exclude=phrases), "", None)
    assert got is not None
    return [pieces(translator.tgt_tokenizer, ids) for ids in got.exclude]


def test_a_word_is_banned_where_it_starts_a_word_glued_and_in_bytes(hand):
    assert excluded(hand, "ab") == [
        ["▁ab"],  # the tokenizer's own spelling first, then by number of pieces
        ["ab"],
        ["▁a", "b"],
        ["a", "b"],
        # ("▁", "ab") and ("▁", "a", "b") hold glued ones: left out
        ["<0xE2>", "<0x96>", "<0x81>"],  # "▁", "a" and "b" in bytes: never the tokenizer's
        ["<0x61>"],
        ["<0x62>"],
    ]
    # a phrase spelled inside another phrase's spellings is enough for both
    both = excluded(hand, "abab", "ab")
    assert sorted(both) == sorted(excluded(hand, "ab"))


def test_an_include_phrase_holding_any_spelling_of_an_exclude_phrase_is_refused(hand):
    tok = hand.tgt_tokenizer
    assert pieces(tok, tuple(tok.encode("bab"))) == ["▁", "b", "ab"]  # not the "▁ab" of "ab"
    with pytest.raises(NmtError) as error:
        hand.constraint_ids(TextConstraints(("bab",), ("ab",)), "", None)
    assert str(error.value) == (
        'include phrase "bab" contains exclude phrase "ab": no translation can meet both; '
        "drop one of them"
    )
    assert hand.constraint_ids(TextConstraints(("ba",), ("ab",)), "", None) is not None


def test_phrases_holding_another_are_left_out():
    phrases = [(1, 2, 3), (2, 3), (4,), (5, 4, 6), (7,), (2, 3, 7)]
    assert without_redundant(phrases) == [(2, 3), (4,), (7,)]
    assert without_redundant([(1, 2), (1, 2, 1)]) == [(1, 2)]
    assert without_redundant([]) == []


def test_a_phrase_with_too_many_spellings_bans_the_fewest_pieces_and_warns_once(hand, caplog):
    tok = hand.tgt_tokenizer
    phrase = "ab" * 6  # where it starts a word 2^7 spellings, glued 2^6 (see the counts)
    every = [
        ids for start in (True, False) for ids in tok.segmentations(phrase, 999, word_start=start)
    ]
    assert len(every) == 2**7 + 2**6 > EXCLUDE_SPELLINGS
    banned = banned_spellings(tok, phrase)
    assert (banned.total, banned.banned, banned.complete) == (192, EXCLUDE_SPELLINGS, False)
    chosen, rest = banned.spellings[:EXCLUDE_SPELLINGS], set(every) - set(banned.spellings)
    assert len(banned.spellings) == EXCLUDE_SPELLINGS + 3  # and three byte spellings
    assert chosen[0] == tuple(tok.encode(phrase)) and set(chosen) <= set(every)
    assert banned.fewest_left == min(map(len, rest)) >= max(map(len, chosen[1:]))
    assert {pieces(tok, ids)[0].startswith("▁") for ids in chosen} == {True, False}  # both forms
    assert banned_spellings(tok, "abab").complete
    with caplog.at_level(logging.WARNING, logger="nmt.generation"):
        for _ in range(2):
            hand.constraint_ids(TextConstraints(exclude=(phrase, "abab")), "", None)
    warned = [r.getMessage() for r in caplog.records]
    assert warned == [
        f'exclude phrase "{phrase}": {EXCLUDE_SPELLINGS} of its 192 spellings in target pieces '
        f"are banned, every one in up to {banned.fewest_left - 1} pieces (the tokenizer's: 6); "
        "a translation could still hold it in more"
    ]


# -- the tiny trained model --------------------------------------------------------------

SEARCH = dict(beam=4, nbest=4, max_len_a=1.0, max_len_b=4)  # the tiny model rarely stops


@pytest.fixture(scope="module")
def tiny(tiny_trained_checkpoint) -> Translator:
    return Translator.from_checkpoint(tiny_trained_checkpoint, device="cpu", **SEARCH)


def demo(n: int, lang: str) -> list[str]:
    return (DEMO / f"test.{lang}").read_text(encoding="utf-8").splitlines()[:n]


def words_of(text: str) -> list[str]:
    """The words of a text (2+ characters), the punctuation around them stripped."""
    return [w for w in map(strip_punctuation, text.split()) if len(w) >= 2]


def source_ids(translator: Translator, texts: list[str]) -> list[np.ndarray]:
    return [np.array(translator.src_tokenizer.encode(t) + [EOS]) for t in texts]


def holds(tokens: torch.Tensor, phrase: tuple[int, ...]) -> bool:
    ids = tuple(tokens.tolist())
    return any(ids[i : i + len(phrase)] == phrase for i in range(len(ids) - len(phrase) + 1))


@pytest.mark.parametrize("seed", range(3))
def test_a_word_of_the_unconstrained_outputs_forbidden_is_in_no_nbest_output(tiny, seed):
    texts = demo(60, "en")
    rng = random.Random(seed)
    forbidden = [
        rng.choice(words) if (words := [w for t in hyps for w in words_of(t.text)]) else None
        for hyps in tiny.translate_batch(texts)
    ]
    avoided = tiny.translate_batch(
        texts, constraints=[[] if w is None else {"exclude": [w]} for w in forbidden]
    )
    tok = tiny.tgt_tokenizer
    guaranteed = [w is not None and banned_spellings(tok, w).complete for w in forbidden]
    assert sum(guaranteed) >= 40  # most words have few spellings; the others are warned about
    for word, hyps, complete in zip(forbidden, avoided, guaranteed):
        if complete:
            assert not any(contains_word(h.text, word) for h in hyps), (
                word,
                [h.text for h in hyps],
            )
    # banning the tokenizer's spelling alone lets the model write many of them otherwise
    only_own = tiny.translate_ids(
        source_ids(tiny, texts),
        constraints=[
            None if w is None else TokenConstraints(exclude=(tuple(tok.encode(w)),))
            for w in forbidden
        ],
    )
    leaks = sum(
        contains_word(tok.decode(h.tokens), w)
        for w, hyps in zip(forbidden, only_own)
        if w
        for h in hyps
    )
    assert leaks >= 10


class Pushed(torch.nn.Module):
    """An output layer with a bias added to the logits: pushes the model to a piece."""

    def __init__(self, projection: torch.nn.Module, vocab_size: int):
        super().__init__()
        self.projection = projection
        self.bias = torch.zeros(vocab_size)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.projection(x) + self.bias


def test_pushed_to_another_spelling_the_search_still_never_writes_the_word(
    tiny_trained_checkpoint,
):
    """Per reference word (one with every spelling banned), one of its other spellings (either form) is pushed: its pieces
    but the last are required and the last gets +8 on its logit; or the whole spelling
    is required. Banning the tokenizer's spelling alone, the spelling appears; banning
    every spelling, never, nor the word as a whole word (the whole spelling required:
    never met)."""
    translator = Translator.from_checkpoint(tiny_trained_checkpoint, device="cpu", **SEARCH)
    decoder = translator.models[0].decoder
    tok = translator.tgt_tokenizer
    pushed = Pushed(decoder.output_projection, tok.vocab_size)
    decoder.output_projection = pushed
    texts, references = demo(40, "en"), demo(40, "de")
    sources = source_ids(translator, texts)
    rng = random.Random(0)
    leaks = cases = 0
    for source, reference in zip(sources, references):
        words = [w for w in words_of(reference) if banned_spellings(tok, w).complete]
        if not words:  # long number words: more spellings than are banned
            continue
        word = rng.choice(words)
        banned = translator.constraint_ids(TextConstraints(exclude=(word,)), "", None)
        assert banned is not None
        own = tuple(tok.encode(word))
        others = [
            ids
            for word_start in (True, False)
            for ids in tok.segmentations(word, word_start=word_start)
            if ids != own and len(ids) > 1
        ]
        spelling = rng.choice(others)
        pushed.bias.zero_()
        pushed.bias[spelling[-1]] = 8.0
        for include in (spelling[:-1], spelling):
            cases += 1
            for exclude, every in (((own,), False), (banned.exclude, True)):
                wanted = TokenConstraints(include=(include,), exclude=exclude)
                hyps = translator.translate_ids([source], constraints=[wanted])[0]
                written = [holds(h.tokens, spelling) for h in hyps]
                if not every:
                    leaks += any(written)
                    continue
                assert not any(written), (word, pieces(tok, spelling))
                assert not any(contains_word(tok.decode(h.tokens), word) for h in hyps), word
                if include == spelling:
                    assert not any(h.constraints_met for h in hyps)
    assert cases >= 40 and leaks >= cases * 3 // 4, (leaks, cases)
