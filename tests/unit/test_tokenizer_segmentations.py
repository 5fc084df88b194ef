"""Tokenizer.segmentations: every id sequence whose pieces spell a normalized text.

On a hand-made vocabulary (pieces ▁ a b ab ▁a ▁ab, an unused, a control and a
user-defined piece, with or without byte pieces) the counts are derived by hand and the
spellings compared with a brute-force enumeration; on a trained vocabulary, every
spelling of real words decodes to the word.
"""

from __future__ import annotations

import random
from functools import cache
from pathlib import Path

import pytest
from sentencepiece import sentencepiece_model_pb2 as pb

from nmt.data.tokenizer import Tokenizer

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
WRITING = {"▁": -3.0, "a": -3.0, "b": -3.0, "ab": -1.0, "▁a": -2.0, "▁ab": -1.0}
USER_DEFINED = "<x>"  # a piece too; its characters have none of their own


def hand_made(byte_pieces: bool) -> Tokenizer:
    """A unigram model of WRITING's pieces (scores: the tokenizer's own spelling of
    "abab" is "▁ab" "ab"), nmt's special ids, "aa" unused, "ba" a control piece."""
    piece = pb.ModelProto.SentencePiece
    proto = pb.ModelProto()  # type: ignore[attr-defined]  # protoc's
    spec = proto.trainer_spec
    spec.model_type, spec.byte_fallback = pb.TrainerSpec.UNIGRAM, byte_pieces
    spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = 0, 1, 2, 3
    norm = proto.normalizer_spec
    norm.name, norm.add_dummy_prefix = "identity", True
    norm.remove_extra_whitespaces, norm.escape_whitespaces = True, True
    for text, kind in [("<s>", piece.CONTROL), ("<pad>", piece.CONTROL), ("</s>", piece.CONTROL)]:
        proto.pieces.add(piece=text, type=kind)
    proto.pieces.add(piece="<unk>", type=piece.UNKNOWN)
    for b in range(256 if byte_pieces else 0):
        proto.pieces.add(piece=f"<0x{b:02X}>", type=piece.BYTE)
    for text, score in WRITING.items():
        proto.pieces.add(piece=text, type=piece.NORMAL, score=score)
    proto.pieces.add(piece="aa", type=piece.UNUSED)
    proto.pieces.add(piece="ba", type=piece.CONTROL)
    proto.pieces.add(piece=USER_DEFINED, type=piece.USER_DEFINED)
    tokenizer = Tokenizer(proto.SerializeToString(), name="hand-made")
    tokenizer.check_special_ids("hand-made")
    return tokenizer


@pytest.fixture(scope="module")
def hand() -> Tokenizer:
    return hand_made(byte_pieces=False)


@pytest.fixture(scope="module")
def hand_bytes() -> Tokenizer:
    return hand_made(byte_pieces=True)


def pieces(tokenizer: Tokenizer, ids: tuple[int, ...]) -> list[str]:
    every = tokenizer.pieces()
    return [every[i] for i in ids]


def brute_force(tokenizer: Tokenizer, text: str) -> set[tuple[int, ...]]:
    """Every way to cut `text` into WRITING's pieces or the user-defined one (a byteless
    vocabulary: the only ones a spelling may use), by trying each piece at each point;
    none for an empty text (segmentations: nothing to ban, nothing to require)."""
    ids = {p: i for i, p in enumerate(tokenizer.pieces()) if p in WRITING or p == USER_DEFINED}

    @cache
    def spell(rest: str) -> frozenset[tuple[int, ...]]:
        if not rest:
            return frozenset({()})
        return frozenset(
            (i, *tail)
            for p, i in ids.items()
            if rest.startswith(p)
            for tail in spell(rest[len(p) :])
        )

    return set(spell(text)) if text else set()


def test_the_normalized_text_is_sentencepieces(hand):
    assert hand.normalized("rote  Mütze") == "▁rote▁Mütze"
    assert hand.normalized("rote Mütze", word_start=False) == "rote▁Mütze"
    assert hand.normalized("") == "" and hand.normalized("", word_start=False) == ""


@pytest.mark.parametrize(
    "text, word_start, count",
    [
        ("ab", True, 4),  # ▁ab | ▁a b | ▁ ab | ▁ a b
        ("ab", False, 2),  # ab | a b
        ("abab", True, 8),  # (ab)^k glued: 2^k; "▁" + that, "▁a" + b(ab)^(k-1), "▁ab" + (ab)^(k-1)
        ("abababab", True, 32),  # 2^4 + 2^3 + 2^3
        ("abababab", False, 16),
        ("aab", True, 4),  # ▁a + 2, ▁ a + 2: the unused "aa" is never used
        ("aba", True, 4),  # ▁ab a, ▁a b a, ▁ ab a, ▁ a b a: the control "ba" is never used
        ("a b", True, 2),  # ▁a ▁ b, ▁ a ▁ b ("▁b" is no piece)
        ("a<x>", True, 2),  # a user-defined piece is a piece like the others
        ("ac", True, 0),  # "c" has no piece and there are no byte pieces
        ("", True, 0),
    ],
)
def test_every_spelling_on_a_hand_made_vocabulary(hand, text, word_start, count):
    assert hand.segmentation_count(text, word_start=word_start) == count
    found = hand.segmentations(text, limit=100, word_start=word_start)
    assert len(found) == len(set(found)) == count
    assert set(found) == brute_force(hand, hand.normalized(text, word_start))
    for ids in found:
        assert "".join(pieces(hand, ids)) == hand.normalized(text, word_start)
        assert hand.decode(ids) == text


def test_the_tokenizers_own_spelling_comes_first_then_the_fewest_pieces(hand):
    found = hand.segmentations("abababab", limit=100)
    assert found[0] == tuple(hand.encode("abababab"))
    assert pieces(hand, found[0]) == ["▁ab", "ab", "ab", "ab"]
    sizes = [len(ids) for ids in found[1:]]
    assert sizes == sorted(sizes)
    assert pieces(hand, found[-1]) == ["▁", "a", "b", "a", "b", "a", "b", "a", "b"]
    glued = hand.segmentations("abab", limit=100, word_start=False)
    assert [pieces(hand, ids) for ids in glued] == [
        ["ab", "ab"],
        ["ab", "a", "b"],  # of as many pieces: longer pieces first, from the left
        ["a", "b", "ab"],
        ["a", "b", "a", "b"],
    ]


@pytest.mark.parametrize("limit", [1, 2, 10, 31, 32, 33])
def test_the_limit_keeps_the_tokenizers_spelling_and_the_fewest_pieces(hand, limit):
    every = hand.segmentations("abababab", limit=100)
    found = hand.segmentations("abababab", limit=limit)
    assert len(found) == min(limit, 32)
    assert found == every[:limit]  # the same order, cut
    left = set(every) - set(found)
    if left:
        assert max(len(ids) for ids in found[1:] or [()]) <= min(len(ids) for ids in left)
    assert hand.segmentation_count("abababab") == 32  # whatever the limit
    with pytest.raises(ValueError, match="limit=0"):
        hand.segmentations("ab", limit=0)


def test_byte_pieces_spell_only_characters_without_a_piece(hand_bytes):
    tok = hand_bytes
    byte = {p: i for i, p in enumerate(tok.pieces()) if p.startswith("<0x")}
    # "c" has no piece: its byte piece is its one spelling, as the tokenizer writes it
    assert [pieces(tok, ids) for ids in tok.segmentations("ac")] == [
        ["▁a", "<0x63>"],
        ["▁", "a", "<0x63>"],
    ]
    assert all(tok.decode(ids) == "ac" for ids in tok.segmentations("ac"))
    # "a" has one: never spelled as <0x61> ...
    assert all(byte["<0x61>"] not in ids for ids in tok.segmentations("abab", limit=100))
    assert tok.segmentation_count("abab") == 8
    # ... which byte_spellings lists, with "▁" (3 bytes) and "b", not "c"
    assert [pieces(tok, ids) for ids in tok.byte_spellings("ac b")] == [
        ["<0xE2>", "<0x96>", "<0x81>"],
        ["<0x61>"],
        ["<0x62>"],
    ]
    assert tok.decode(tok.byte_spellings("ab")[1]) == "a"
    # "<", "x" and ">" have no pieces: the user-defined piece or their bytes
    assert tok.segmentation_count("a<x>") == 4


def test_no_byte_spellings_without_byte_pieces(hand):
    assert hand.byte_spellings("ab") == []


@pytest.fixture(scope="module")
def trained(demo_data_dir) -> Tokenizer:
    """The demo data dir's model, as nmt-preprocess trains it (BPE, byte pieces)."""
    return Tokenizer.from_file(demo_data_dir / "spm.model")


def test_every_spelling_of_real_words_decodes_to_them(trained):
    words = (DEMO / "test.de").read_text(encoding="utf-8").split()
    rng = random.Random(3)
    phrases = rng.sample(words, 40) + [" ".join(rng.sample(words, 2)) for _ in range(10)]
    phrases += ["Ωmega", "Café (neu)"]  # a character without a piece, punctuation
    every = {p for p in trained.pieces() if not p.startswith("<")}  # no byte or special piece
    for phrase in phrases:
        for word_start in (True, False):
            count = trained.segmentation_count(phrase, word_start=word_start)
            found = trained.segmentations(phrase, 16, word_start=word_start)
            assert count >= 1 and len(found) == len(set(found)) == min(count, 16), phrase
            for ids in found:
                assert trained.decode(ids) == phrase
                shown = pieces(trained, ids)
                if all(p in every for p in shown):  # no byte pieces
                    assert "".join(shown) == trained.normalized(phrase, word_start)
        assert trained.segmentations(phrase)[0] == tuple(trained.encode(phrase))
