"""Terminology on the text side (nmt.generation.terminology): constraints as JSON values and
JSON Lines files, glossaries (TSV, whole-word case-insensitive matching after the
normalization, longer terms first), and the Translator's text -> target-id constraints on a
small random model whose tokenizer has no byte pieces (so that <unk> exists)."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest

from nmt import Translator
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import TokenConstraints
from nmt.generation.terminology import (
    Glossary,
    TextConstraints,
    as_constraints,
    as_glossary,
    parse_constraints,
    read_constraints,
)
from nmt.vocab import UNK
from tests import helpers

pytestmark = pytest.mark.usefixtures("one_thread")


def write(path: Path, text: str | bytes) -> Path:
    path.write_bytes(text if isinstance(text, bytes) else text.encode("utf-8"))
    return path


def error_of(call, *args) -> str:
    """The one-line message of the NmtError that call(*args) raises."""
    with pytest.raises(NmtError) as caught:
        call(*args)
    message = str(caught.value)
    assert "\n" not in message, message
    return message


def assert_error_at(where: str, needle: str, call, *args) -> None:
    """call(*args) raises an NmtError starting with `where: ` and saying `needle`."""
    message = error_of(call, *args)
    assert message.startswith(f"{where}: ") and needle in message, message


# ------------------------------------------------------------------ constraints


def test_a_list_is_include_phrases_and_an_object_names_both_kinds():
    assert parse_constraints(["Hund", "rote Mütze"], "x") == TextConstraints(("Hund", "rote Mütze"))
    assert parse_constraints([], "x") == TextConstraints()
    assert parse_constraints({"exclude": ["Katze"]}, "x") == TextConstraints((), ("Katze",))
    both = parse_constraints({"include": ["a b"], "exclude": ["c"]}, "x")
    assert both == TextConstraints(("a b",), ("c",))
    assert as_constraints(None, "x") is None
    assert as_constraints(both, "x") is both
    assert as_constraints(("Hund",), "x") == TextConstraints(("Hund",))


@pytest.mark.parametrize(
    "value, needle",
    [
        ({"include": ["a"], "required": ["b"]}, 'unknown key "required"'),
        ("Hund", 'a string ("Hund"), not constraints'),
        (None, "null, not constraints"),
        (7, "a number (7), not constraints"),
        (["Hund", 3], "item 2 is a number (3), not a string"),
        (["Hund", ""], "item 2 is an empty phrase"),
        (["\t \u00a0"], "item 1 is an empty phrase"),
        ({"include": "Hund"}, '"include": a string ("Hund"), not a list of phrases'),
        ({"exclude": [None]}, '"exclude": item 1 is null, not a string'),
    ],
)
def test_a_malformed_value_is_an_error_naming_where_and_what(value, needle):
    assert_error_at("constraints[4]", needle, parse_constraints, value, "constraints[4]")


def test_a_constraints_file_is_read_line_by_line(tmp_path):
    path = write(
        tmp_path / "c.jsonl",
        '\ufeff["Hund"]\n[]\n{"include": ["rote Mütze"], "exclude": ["Katze"]}\r\n',
    )
    assert read_constraints(path, 3) == [
        TextConstraints(("Hund",)),
        TextConstraints(),
        TextConstraints(("rote Mütze",), ("Katze",)),
    ]
    assert read_constraints(str(path)) == read_constraints(path, 3)


@pytest.mark.parametrize(
    "third, needle",
    [
        ('["Hund"', "not JSON ("),
        ("", "an empty line; write [] for a line without constraints"),
        ("  ", "an empty line"),
        ('"Hund"', 'a string ("Hund"), not constraints'),
        ('{"include": ["a"], "exclude": ["b"], "x": 1}', 'unknown key "x"'),
        ('["Hund", "  "]', "item 2 is an empty phrase"),
        ('[["Hund"]]', "item 1 is a list, not a string"),
    ],
)
def test_every_malformed_line_is_an_error_naming_the_file_and_line(tmp_path, third, needle):
    path = write(tmp_path / "c.jsonl", f'["a"]\n[]\n{third}\n["b"]\n')
    assert_error_at(f"{path}:3", needle, read_constraints, path, 4)


def test_invalid_utf8_a_missing_file_and_a_wrong_line_count_are_errors(tmp_path):
    bad = write(tmp_path / "bad.jsonl", b'["a"]\n["\xff"]\n')
    assert error_of(read_constraints, bad).startswith(f"{bad}:2: invalid UTF-8")
    missing = tmp_path / "missing.jsonl"
    assert error_of(read_constraints, missing) == f"{missing}: no such file"
    two = write(tmp_path / "two.jsonl", '["a"]\n[]\n')
    message = error_of(read_constraints, two, 3)
    assert message.startswith(f"{two}: 2 lines for 3 texts"), message


def test_including_adds_the_new_phrases_once():
    base = TextConstraints(("Hund",), ("Katze",))
    assert base.including(["Hund", "Maus", "Maus"]) == TextConstraints(("Hund", "Maus"), ("Katze",))
    assert base.including(["Hund"]) is base


# ------------------------------------------------------------------ glossary files


def test_a_glossary_file_skips_comments_and_blank_lines(tmp_path):
    path = write(
        tmp_path / "g.tsv",
        "\ufeff# source\ttarget\n\ndog\tHund\r\n  red  hat \t rote Mütze\n\ndog\tHund\n",
    )
    glossary = Glossary.read(path)
    assert [(t.source, t.target) for t in glossary.terms] == [
        ("dog", "Hund"),
        ("red hat", "rote Mütze"),
    ]
    assert glossary.terms[1].where == f"{path}:4"
    assert len(as_glossary(str(path))) == 2  # type: ignore[arg-type]


@pytest.mark.parametrize(
    "line, needle",
    [
        ("dog Hund", "0 tabs; write one 'source term<TAB>target term' a line"),
        ("dog\tHund\tx", "2 tabs"),
        ("dog\t", "an empty target term"),
        (" \tHund", "an empty source term"),
    ],
)
def test_a_malformed_glossary_line_is_an_error_naming_the_file_and_line(tmp_path, line, needle):
    path = write(tmp_path / "g.tsv", f"cat\tKatze\n# note\n{line}\n")
    assert_error_at(f"{path}:3", needle, Glossary.read, path)


def test_a_term_given_again_with_another_target_names_both_lines(tmp_path):
    path = write(tmp_path / "g.tsv", "dog\tHund\ncat\tKatze\nDOG\tRüde\n")
    message = error_of(Glossary.read, path)
    assert message.startswith(f'{path}:3: source term "DOG" is already at {path}:1'), message
    bad = write(tmp_path / "bad.tsv", b"dog\tHund\ncat\tK\xe4tze\n")
    assert error_of(Glossary.read, bad).startswith(f"{bad}:2: invalid UTF-8")


# ------------------------------------------------------------------ glossary matching


def targets(entries: dict[str, str], text: str) -> tuple[str, ...]:
    return Glossary.of(entries).targets_for(text)


def test_terms_match_whole_words_only():
    entries = {"dog": "Hund", "art": "Kunst"}
    assert targets(entries, "The dog sleeps.") == ("Hund",)
    assert targets(entries, "dog") == ("Hund",)
    assert targets(entries, "(dog)") == ("Hund",)
    assert targets(entries, "dogs and hotdog, dog_x, dog2") == ()
    assert targets(entries, "a party, an artist, art.") == ("Kunst",)


def test_terms_match_in_any_case():
    assert targets({"Red Hat": "rote Mütze"}, "a RED hat and a red HAT") == ("rote Mütze",)
    assert targets({"STRASSE": "Straße"}, "die Straße") == ("Straße",)  # case folding: ß = ss


def test_terms_match_after_the_normalization():
    entries = {"red hat": "rote Mütze", "file": "Datei"}
    assert targets(entries, "a red\u00a0\t hat") == ("rote Mütze",)  # whitespace runs
    assert targets(entries, "the \ufb01le") == ("Datei",)  # NFKC: the ligature fi
    assert targets(entries, "\uff46\uff49\uff4c\uff45!") == ("Datei",)  # NFKC: full-width
    assert targets({"re\u0301sume\u0301": "Lebenslauf"}, "my résumé") == ("Lebenslauf",)  # NFC


def test_a_longer_term_wins_over_the_shorter_ones_it_overlaps():
    entries = {"York": "York", "New York": "New York", "York University": "Universität York"}
    assert targets(entries, "New York University") == ("Universität York",)
    assert targets(entries, "in New York") == ("New York",)
    assert targets(entries, "York, New York") == ("York", "New York")
    assert targets({"dog": "Hund", "hot dog": "Hotdog"}, "a hot dog") == ("Hotdog",)


def test_terms_come_in_order_of_occurrence_each_once():
    entries = {"cat": "Katze", "dog": "Hund", "hound": "Hund"}
    assert targets(entries, "dog, cat, dog, hound") == ("Hund", "Katze")
    assert [t.source for t in Glossary.of(entries).terms_in("dog cat dog")] == ["dog", "cat"]


def test_word_boundaries_are_unicode_ones():
    entries = {"über": "over", "straße": "street", "кот": "Katze", "c++": "C++", "u.s.": "USA"}
    assert targets(entries, "Über alles") == ("over",)
    assert targets(entries, "Hauptstraße, darüber") == ()
    assert targets(entries, "Кот и котёнок") == ("Katze",)
    assert targets(entries, "C++ and c++11") == ("C++",)
    assert targets(entries, "the U.S. army") == ("USA",)


def test_regex_characters_in_terms_are_literal():
    entries = {"a.b": "x", "(c)": "y", "d|e": "z"}
    assert targets(entries, "a-b axb c d e") == ()
    assert targets(entries, "a.b (c) d|e") == ("x", "y", "z")


def test_an_empty_glossary_finds_nothing():
    assert Glossary().targets_for("anything") == ()
    assert len(Glossary.of({})) == 0


# ------------------------------------------------------------------ glossaries from Python


def test_a_glossary_from_a_mapping_or_pairs():
    assert Glossary.of([("dog", "Hund"), ["cat", "Katze"]]).targets_for("cat dog") == (
        "Katze",
        "Hund",
    )
    glossary = Glossary.of({"dog": "Hund"})
    assert Glossary.of(glossary) is glossary
    assert as_glossary({"dog": "Hund"}).targets_for("dog") == ("Hund",)  # type: ignore[union-attr]
    assert as_glossary(None) is None


@pytest.mark.parametrize(
    "entries, needle",
    [
        ({"dog": 3}, 'glossary["dog"]: the target term is a number (3), not a string'),
        ({"dog": " "}, 'glossary["dog"]: an empty target term'),
        ({"": "Hund"}, 'glossary[""]: an empty source term'),
        ([("dog", "Hund"), ("cat",)], "glossary[1]: a list, not a (source, target) pair"),
        (
            {"Dog": "Hund", "dog": "Rüde"},
            'glossary["dog"]: source term "dog" is already at glossary["Dog"]',
        ),
        ("dog", 'glossary: a string ("dog"); give a mapping'),
    ],
)
def test_a_bad_entry_is_an_error_naming_it(entries, needle):
    message = error_of(Glossary.of, entries)
    assert message.startswith(needle), message


def test_merged_keeps_both_and_the_first_wins_a_shared_term():
    server = Glossary.of({"dog": "Hund", "cat": "Katze"})
    request = Glossary.of({"Dog": "Rüde", "mouse": "Maus"})
    merged = Glossary.merged(request, server)
    assert merged is not None
    assert merged.targets_for("dog cat mouse") == ("Rüde", "Katze", "Maus")
    assert Glossary.merged(None, server) is server
    assert Glossary.merged(request, None) is request
    assert Glossary.merged(None, None) is None


# ------------------------------------------------------------------ text -> target ids

WORDS = "one two three four five six seven eight nine ten hundred and".split()


@pytest.fixture(scope="module")
def words_tokenizer() -> Tokenizer:
    """A tokenizer of a few English words, without byte pieces: other letters are <unk>."""
    return helpers.words_tokenizer(WORDS, vocab_size=32)


@pytest.fixture(scope="module")
def translator(words_tokenizer) -> Translator:
    model = helpers.random_transformer(vocab=words_tokenizer.vocab_size)
    return Translator(
        [model], words_tokenizer, words_tokenizer, search=SearchConfig(beam=4, max_len_b=8)
    )


def ids(tokenizer: Tokenizer, text: str) -> tuple[int, ...]:
    return tuple(tokenizer.encode(text))


def test_constraints_become_the_target_pieces_of_each_phrase(translator, words_tokenizer):
    tok = words_tokenizer
    glossary = Glossary.of({"dog": "seven", "cat": "one two"})
    got = translator.constraint_ids(
        TextConstraints(("one two", " three\t four "), ("nine",)), "a Dog and a cat", glossary
    )
    assert got is not None
    assert got.include == (ids(tok, "one two"), ids(tok, "three four"), ids(tok, "seven"))
    # the exclude phrase in every spelling (tests/unit/test_excluded_spellings.py), the
    # tokenizer's first
    assert got.exclude[0] == ids(tok, "nine")
    assert {tok.decode(e) for e in got.exclude} == {"nine"}
    assert translator.constraint_ids(None, "no term here", glossary) is None
    assert translator.constraint_ids(TextConstraints(), "", None) is None
    only_glossary = translator.constraint_ids(None, "cat", glossary)
    assert only_glossary == TokenConstraints(include=(ids(tok, "one two"),))


def test_a_phrase_the_target_vocabulary_cannot_write_is_an_error_naming_it(translator):
    message = error_of(translator.constraint_ids, TextConstraints(("one Xylophon",)), "", None)
    assert message.startswith(
        'include phrase "one Xylophon": the target vocabulary cannot write it'
    ), message
    assert "<unk>" in message
    glossary = Glossary.of({"dog": "Hund"})
    message = error_of(translator.constraint_ids, None, "the dog", glossary)
    assert message.startswith('glossary["dog"]: target term "Hund": the target'), message


def test_an_exclude_phrase_with_unk_is_left_out_and_one_inside_an_include_is_an_error(
    translator, words_tokenizer
):
    assert UNK in ids(words_tokenizer, "Katze")
    assert translator.constraint_ids(TextConstraints((), ("Katze",)), "", None) is None
    message = error_of(
        translator.constraint_ids, TextConstraints(("one two three",), ("two",)), "", None
    )
    assert message == (
        'include phrase "one two three" contains exclude phrase "two": no translation can '
        "meet both; drop one of them"
    )


def test_translate_batch_checks_its_constraints_argument(translator):
    with pytest.raises(TypeError, match="one entry per text"):
        translator.translate_batch(["one two"], constraints="seven")  # type: ignore[arg-type]
    assert error_of(
        lambda: translator.translate_batch(["one two"], constraints=["seven"])
    ).startswith('constraints[0]: a string ("seven"), not constraints; write ["phrase", ...]')
    assert error_of(
        lambda: translator.translate_batch(["one", "two"], constraints=[["seven"]])
    ).startswith("constraints: 1 of them for 2 texts")
    assert error_of(
        lambda: translator.translate_batch(["one", "two"], constraints=[None, {"inc": []}])
    ).startswith('constraints[1]: unknown key "inc"')


def test_met_phrases_are_in_the_translation_and_an_unmet_one_is_reported(translator, caplog):
    texts = ["one two three", "four five", "six", ""]
    wanted = [["seven eight"], {"exclude": ["one"]}, ["one two three four five six seven"], ["ten"]]
    results = translator.translate_batch(texts, constraints=wanted, max_len_b=4)
    met = [r[0].constraints_met for r in results]
    assert met == [True, True, False, False]  # 7 words need more than 4 pieces; an empty text
    assert "seven eight" in results[0][0].text
    assert "one" not in results[1][0].text.split()
    with caplog.at_level(logging.WARNING, logger="nmt.generation"):
        best = translator.translate(texts, constraints=wanted, max_len_b=4)
    assert best == [r[0].text for r in results]
    warned = [r.getMessage() for r in caplog.records if "could not be met" in r.getMessage()]
    assert [m.split(":")[0] for m in warned] == ["texts[2]", "texts[3]"]


def test_without_constraints_the_translations_are_the_unconstrained_ones(translator):
    texts = ["one two three", "four five"]
    plain = translator.translate_batch(texts, nbest=2, return_scores=True)
    assert (
        translator.translate_batch(
            texts, nbest=2, return_scores=True, constraints=[None, []], glossary={}
        )
        == plain
    )
    assert all(t.constraints_met for per_text in plain for t in per_text)
