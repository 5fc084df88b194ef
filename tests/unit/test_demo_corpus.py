"""The demo corpus: correct number words, deterministic generation, disjoint splits."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location(
        "make_demo_corpus", REPO / "scripts" / "make_demo_corpus.py"
    )
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.mark.parametrize(
    "n, german",
    [
        (0, "null"),
        (1, "eins"),
        (7, "sieben"),
        (11, "elf"),
        (16, "sechzehn"),
        (17, "siebzehn"),
        (20, "zwanzig"),
        (21, "einundzwanzig"),
        (30, "dreißig"),
        (36, "sechsunddreißig"),
        (67, "siebenundsechzig"),
        (100, "hundert"),
        (101, "hunderteins"),
        (110, "hundertzehn"),
        (121, "hunderteinundzwanzig"),
        (200, "zweihundert"),
        (321, "dreihunderteinundzwanzig"),
        (999, "neunhundertneunundneunzig"),
        (1000, "tausend"),
        (1001, "tausendeins"),
        (2021, "zweitausendeinundzwanzig"),
        (21000, "einundzwanzigtausend"),
        (101000, "hunderteintausend"),
        (999999, "neunhundertneunundneunzigtausendneunhundertneunundneunzig"),
    ],
)
def test_german_numbers(gen, n: int, german: str) -> None:
    assert gen.german_number(n) == german


@pytest.mark.parametrize(
    "n, english",
    [
        (0, "zero"),
        (15, "fifteen"),
        (40, "forty"),
        (42, "forty-two"),
        (100, "one hundred"),
        (115, "one hundred fifteen"),
        (321, "three hundred twenty-one"),
        (1000, "one thousand"),
        (2021, "two thousand twenty-one"),
    ],
)
def test_english_numbers(gen, n: int, english: str) -> None:
    assert gen.english_number(n) == english


def test_number_words_are_distinct(gen) -> None:
    """Every number has its own word in both languages, so the mapping is learnable."""
    numbers = range(1000)
    assert len({gen.german_number(n) for n in numbers}) == 1000
    assert len({gen.english_number(n) for n in numbers}) == 1000
    assert all(" " not in gen.german_number(n) for n in numbers)  # one compound word


def test_committed_files_are_the_generators_output(gen, tmp_path: Path) -> None:
    splits = gen.generate(train=10000, valid=500, test=500, seed=1)
    gen.write_corpus(tmp_path, splits)
    for path in sorted((REPO / "data" / "demo").glob("*.*")):
        assert (tmp_path / path.name).read_bytes() == path.read_bytes(), path.name


def test_splits_are_disjoint_and_small(demo_corpus: Path) -> None:
    sources = {}
    for split in ("train", "valid", "test"):
        en = (demo_corpus / f"{split}.en").read_text(encoding="utf-8").splitlines()
        de = (demo_corpus / f"{split}.de").read_text(encoding="utf-8").splitlines()
        assert len(en) == len(de) > 0
        assert len(set(en)) == len(en)
        assert max(len(line.split()) for line in en + de) <= 14
        sources[split] = set(en)
    assert not sources["train"] & sources["valid"]
    assert not sources["train"] & sources["test"]
    assert not sources["valid"] & sources["test"]
    assert sum(p.stat().st_size for p in demo_corpus.iterdir()) < 2_000_000


def test_seed_changes_the_corpus(gen) -> None:
    a = gen.generate(train=50, valid=5, test=5, seed=1)
    b = gen.generate(train=50, valid=5, test=5, seed=2)
    assert a == gen.generate(train=50, valid=5, test=5, seed=1)
    assert a["train"] != b["train"]
