"""Without constraints, translations are bit-identical to those of the code before
constrained decoding existed (ada98f6): on the first 100 lines of the demo test set by
default, on all 500 under `-m slow`."""

from __future__ import annotations

import importlib

import pytest

from benchmarks import common
from nmt.generation.translator import Translator
from tests.unit.test_benchmarks import DEMO, has_revision

BEFORE_CONSTRAINTS = "ada98f6"  # main before issue 51 (terminology)

needs_before = pytest.mark.skipif(
    not has_revision(BEFORE_CONSTRAINTS),
    reason=f"{BEFORE_CONSTRAINTS} is not in this clone's history",
)


def _hypotheses(translator, texts: list[str], **options) -> list[list[tuple[str, float]]]:
    """Per text its n-best (text, score) pairs."""
    results = translator.translate_batch(texts, return_scores=True, **options)
    return [[(t.text, t.score) for t in hyps] for hyps in results]


SETTINGS = [dict(beam=5, nbest=2), dict(beam=1), dict(precision="int8")]
CASES = [pytest.param(100, SETTINGS[0])] + [
    pytest.param(500, options, marks=pytest.mark.slow) for options in SETTINGS
]


@needs_before
@pytest.mark.parametrize(("lines", "options"), CASES)
def test_no_constraints_translate_as_before(tiny_trained_checkpoint, lines, options):
    package = common.import_revision(BEFORE_CONSTRAINTS).__name__
    before = importlib.import_module(f"{package}.generation.translator").Translator
    texts = (DEMO / "test.en").read_text(encoding="utf-8").splitlines()[:lines]
    search = {k: v for k, v in options.items() if k != "precision"}
    load = dict(device="cpu", max_sentences=32, precision=options.get("precision", "fp32"))
    old = before.from_checkpoint(tiny_trained_checkpoint, **load)
    new = Translator.from_checkpoint(tiny_trained_checkpoint, **load)
    want = _hypotheses(old, texts, **search)
    assert len(want) == len(texts) == lines
    assert _hypotheses(new, texts, **search) == want
    # empty constraints and an empty glossary are no constraints
    empty = _hypotheses(new, texts, constraints=[[]] * len(texts), glossary={}, **search)
    assert empty == want
