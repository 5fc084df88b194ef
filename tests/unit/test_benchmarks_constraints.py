"""benchmarks.constraints: how it draws constraints from references, and one small run."""

from __future__ import annotations

import random

import pytest

from benchmarks import common
from benchmarks.constraints import (
    contains_word,
    draw_forbidden,
    draw_phrases,
    draw_spans,
    strip_punctuation,
)
from tests.unit.test_benchmarks import DEMO, bench

REFERENCES = [
    "Ein Mann mit einer roten Mütze, der auf einer Bank sitzt.",
    "Zwei Hunde spielen im Schnee.",
    "Kinder.",
    "„Hallo“, sagt die Frau (lächelnd) zu dem Mann.",
]


@pytest.mark.parametrize("seed", range(20))
def test_drawn_phrases_are_words_of_the_reference_that_never_overlap(seed):
    rng = random.Random(seed)
    for reference in REFERENCES:
        words = reference.split()
        count = rng.randint(1, 3)
        spans = draw_spans(words, count, rng)
        assert 1 <= len(spans) <= count
        used = [i for span in spans for i in span]
        assert len(used) == len(set(used))  # no word in two phrases
        for span in spans:
            assert 1 <= len(span) <= 3 and span.stop <= len(words)
    for reference in REFERENCES:
        for phrase in draw_phrases(reference, 3, rng):
            assert phrase and phrase in reference and phrase == strip_punctuation(phrase)


def test_the_draw_is_the_same_for_the_same_seed():
    first = [draw_phrases(r, 3, random.Random(7)) for r in REFERENCES]
    again = [draw_phrases(r, 3, random.Random(7)) for r in REFERENCES]
    assert first == again


def test_punctuation_around_a_word_is_not_part_of_it():
    assert strip_punctuation("„Hallo“,") == "Hallo"
    assert strip_punctuation("(lächelnd)") == "lächelnd"
    assert strip_punctuation("z.B.") == "z.B"
    assert strip_punctuation("...") == ""


def test_a_forbidden_word_is_found_only_as_a_whole_word():
    assert contains_word("Ein Mann sitzt.", "Mann")
    assert not contains_word("Ein Mannequin sitzt.", "Mann")
    assert not contains_word("Der Hausmann sitzt.", "Mann")
    assert contains_word("Männer und Mann", "Mann")
    assert draw_forbidden("...", random.Random(0)) is None
    assert draw_forbidden("Ein Mann.", random.Random(0)) in {"Ein", "Mann"}


def test_a_small_run_reports_coverage_bleu_negatives_and_speed(tiny_trained_checkpoint, tmp_path):
    argv = ["--checkpoint", str(tiny_trained_checkpoint), "--source", str(DEMO / "test.en")]
    argv += ["--reference", str(DEMO / "test.de"), "--lines", "8", "--beams", "2,1"]
    figures = bench("constraints", [*argv, "--batch", "4", "--passes", "2"], tmp_path)
    assert figures["sentences"] == 8
    for beam in ("2", "1"):
        quality = figures["quality"][beam]
        assert quality["constraints"] >= 8  # at least one a sentence
        # every constraint is in the output, unless its sentence is reported unmet
        assert quality["coverage"] == 1.0 or quality["sentences_unmet"] > 0
        assert quality["forbidden_produced"] == 0
        speed = figures["speed"][beam]["constrained_over_free"]["cpu"]
        assert speed["turns"] == 2 * 2 and speed["low"] <= speed["ratio"] <= speed["high"]


def test_references_of_another_length_are_one_line(tiny_trained_checkpoint, tmp_path, capsys):
    from benchmarks import constraints

    short = tmp_path / "ref.de"
    short.write_text("eins\n")
    argv = ["--checkpoint", str(tiny_trained_checkpoint), "--source", str(DEMO / "test.en")]
    code = common.main(
        "constraints", constraints.build_parser, constraints.run, [*argv, "--reference", str(short)]
    )
    assert code == 2
    assert "ref.de: 1 lines for" in capsys.readouterr().err
