"""nmt-preprocess's corpus cleaning (clean.dedup, clean.drop_copies, clean.langid): what is
dropped, how it is counted in meta.json and the report, the same output for any number of
workers, and the errors before any work (the rules alone: tests/unit/test_cleaning.py)."""

from __future__ import annotations

import importlib.util
import re
import sys
from pathlib import Path

import pytest

from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.cleaning import LANGID_EXTRA, LangidRule, LanguageFilter
from nmt.data.config import LANGID_CANDIDATES
from nmt.data.meta import load_meta, split_prefix
from nmt.data.tokenizer import load_tokenizers, normalize_text

needs_langid = pytest.mark.skipif(
    importlib.util.find_spec("py3langid") is None,
    reason="the langid extra is not installed: pip install 'nmt[langid]'",
)

# (line number, source, target) put into the 400 demo pairs; chunk_lines=37 puts repeats in
# other chunks than their first occurrence
CRAFTED = [
    (60, "A man in a blue shirt is standing on a ladder.", "Ein Mann steht auf einer Leiter."),
    (110, "A man in a blue shirt is standing on a ladder.", "Ein Mann steht auf einer Leiter."),
    (160, " A man in a  blue shirt\tis standing on a ladder.", "Ein Mann steht auf einer Leiter. "),
    (210, "A MAN IN A BLUE SHIRT IS STANDING ON A LADDER.", "Ein Mann steht auf einer Leiter."),
    (220, "Anna and Tom are walking in the park.", "Anna and Tom are walking in the park."),
    (230, "Anna and Tom are walking  in the park.", "Anna and Tom are walking in the park."),
    (240, "Hello there, my good friend.", "hello there, my good friend."),
    (260, "A woman reads a book in the park.", "Une femme lit un livre dans le parc."),
    (270, "Die Kinder spielen am Strand.", "Die Kinder spielen am Strand Fußball."),
    (280, "Two dogs are playing in the snow.", "Zwei Hunde spielen im Schnee."),
]


@pytest.fixture
def corpus(small_corpus: Path) -> Path:
    """small_corpus with CRAFTED in train, and the crafted pairs alone as valid."""
    en = (small_corpus / "train.en").read_text(encoding="utf-8").splitlines()
    de = (small_corpus / "train.de").read_text(encoding="utf-8").splitlines()
    for line, src, tgt in CRAFTED:
        en[line], de[line] = src, tgt
    en[350], de[350] = en[5], de[5]  # a demo pair repeated
    _write(small_corpus / "train.en", en)
    _write(small_corpus / "train.de", de)
    _write(small_corpus / "valid.en", [src for _, src, _ in CRAFTED])
    _write(small_corpus / "valid.de", [tgt for _, _, tgt in CRAFTED])
    return small_corpus


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _pairs(folder: Path, split: str) -> list[tuple[str, str]]:
    en = (folder / f"{split}.en").read_text(encoding="utf-8").splitlines()
    de = (folder / f"{split}.de").read_text(encoding="utf-8").splitlines()
    return [(normalize_text(s, False), normalize_text(t, False)) for s, t in zip(en, de)]


def _stored(data_dir: Path, split: str) -> list[tuple[str, str]]:
    src_tok, tgt_tok = load_tokenizers(data_dir)
    src = TokenArray(split_prefix(data_dir, split, "en"))
    tgt = TokenArray(split_prefix(data_dir, split, "de"))
    return [(src_tok.decode(src[i]), tgt_tok.decode(tgt[i])) for i in range(len(src))]


def _expected(
    pairs: list[tuple[str, str]], languages: LanguageFilter | None
) -> tuple[list[tuple[str, str]], dict[str, int]]:
    """The rules restated in plain Python, with the texts themselves (not hashes) as the
    duplicate set; the length rules are off in these tests."""
    kept: list[tuple[str, str]] = []
    counts = {"invalid_utf8": 0, "empty": 0, "too_long": 0, "ratio": 0, "copy": 0}
    if languages is not None:
        counts["langid"] = 0
    counts["duplicate"] = 0
    seen: set[tuple[str, str]] = set()
    for src, tgt in pairs:
        if not src or not tgt:
            counts["empty"] += 1
        elif src == tgt:
            counts["copy"] += 1
        elif languages is not None and not languages.keeps(src, tgt):
            counts["langid"] += 1
        elif (src, tgt) in seen:
            counts["duplicate"] += 1
        else:
            seen.add((src, tgt))
            kept.append((src, tgt))
    return kept, counts


NO_LENGTH_RULES = ("clean.max_pieces=null", "clean.max_ratio=null", "chunk_lines=37")


def test_duplicates_and_copies_are_dropped_and_counted(
    corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    build_data_dir(
        preprocess_config(*NO_LENGTH_RULES, "clean.dedup=true", "clean.drop_copies=true")
    )
    out = tmp_path / "out"
    train = load_meta(out).splits["train"]
    kept, counts = _expected(_pairs(corpus, "train"), None)
    assert _stored(out, "train") == kept
    assert train.removed == counts  # no langid count: that rule is off
    assert train.kept == len(kept) and train.lines == train.kept + sum(train.removed.values())
    stored = _stored(out, "train")
    ladder = stored.count(_pairs(corpus, "train")[60])
    assert ladder == 1  # the exact repeat and the whitespace variant are gone, the first kept
    assert stored.index(_pairs(corpus, "train")[60]) < stored.index(_pairs(corpus, "train")[210])
    assert _pairs(corpus, "train")[240] in stored  # "Hello"/"hello": case is kept, no copy
    assert counts["duplicate"] == 3 and counts["copy"] == 2
    assert load_meta(out).splits["valid"].kept == len(CRAFTED)  # valid keeps every line


@needs_langid
def test_langid_drops_pairs_with_a_side_in_another_language(
    corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    build_data_dir(preprocess_config(*NO_LENGTH_RULES, "clean.langid=true"))
    out = tmp_path / "out"
    train = load_meta(out).splits["train"]
    stored = _stored(out, "train")
    pairs = _pairs(corpus, "train")
    assert pairs[260] not in stored  # a French target
    assert pairs[270] not in stored  # a German source
    assert pairs[280] in stored and pairs[60] in stored
    assert train.removed["langid"] >= 2
    assert train.lines == train.kept + sum(train.removed.values())
    # the same identifier, run here on every pair, agrees with the workers
    languages = LanguageFilter(LangidRule("en", "de", LANGID_CANDIDATES))
    assert stored == [p for p in pairs if p[0] and p[1] and languages.keeps(*p)]


@needs_langid
def test_every_rule_on_gives_the_same_bytes_for_any_number_of_workers(
    corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    rules = ("clean.dedup=true", "clean.drop_copies=true", "clean.langid=true", *NO_LENGTH_RULES)
    one, two = tmp_path / "one", tmp_path / "two"
    build_data_dir(preprocess_config(*rules, f"data.dest={one}", "workers=1"))
    build_data_dir(preprocess_config(*rules, f"data.dest={two}", "workers=2"))
    files = sorted(p.name for p in one.iterdir() if p.suffix in (".bin", ".idx", ".model"))
    assert len(files) == 13  # spm.model; train, valid, test x en, de x .bin, .idx
    for name in files:
        assert (one / name).read_bytes() == (two / name).read_bytes(), name
    assert load_meta(one).splits == load_meta(two).splits
    # and what is stored is the rules restated, in order
    languages = LanguageFilter(LangidRule("en", "de", LANGID_CANDIDATES))
    kept, counts = _expected(_pairs(corpus, "train"), languages)
    assert _stored(one, "train") == kept
    assert load_meta(one).splits["train"].removed == counts


def test_the_report_counts_every_rule(nmt_cli, corpus: Path, tmp_path: Path) -> None:
    code, out, _ = nmt_cli(
        "preprocess",
        f"data.trainpref={corpus / 'train'}",
        f"data.validpref={corpus / 'valid'}",
        f"data.dest={tmp_path / 'out'}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "workers=1",
        "clean.dedup=true",
        "clean.drop_copies=true",
    )
    assert code == 0
    train = load_meta(tmp_path / "out").splits["train"]
    line = next(line for line in out.splitlines() if line.strip().startswith("train"))
    printed = dict(
        (rule, int(n)) for rule, n in re.findall(r"(\w+) (\d+)", line.split("removed:")[1])
    )
    assert printed == train.removed and printed["duplicate"] == 3 and printed["copy"] == 2
    assert f"{train.lines} lines" in line and f"{train.kept} kept" in line
    assert train.lines == train.kept + sum(printed.values())


def test_langid_without_its_package_is_one_line_before_any_work(
    nmt_cli, corpus: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The package made unimportable in this process (a None in sys.modules is what
    Python's import system reads as "not installed")."""
    monkeypatch.setitem(sys.modules, "py3langid", None)
    monkeypatch.delitem(sys.modules, "py3langid.langid", raising=False)
    code, out, err = nmt_cli(
        "preprocess",
        f"data.trainpref={corpus / 'train'}",
        f"data.dest={tmp_path / 'out'}",
        "clean.langid=true",
    )
    assert code != 0
    assert err.strip() == f"nmt-preprocess: error: {LANGID_EXTRA}"
    assert "SentencePiece" not in out and not (tmp_path / "out").exists()


@needs_langid
@pytest.mark.parametrize(
    ("override", "message"),
    [
        ("data.tgt=xx", "data.tgt=xx: not a language clean.langid knows;"),
        ("clean.langid_candidates=[fr,qq]", "clean.langid_candidates=[fr,qq]: qq: not a language"),
    ],
)
def test_a_language_the_identifier_does_not_know_is_named(
    nmt_cli, corpus: Path, tmp_path: Path, override: str, message: str
) -> None:
    if override.startswith("data.tgt"):
        for split in ("train", "valid"):
            (corpus / f"{split}.xx").write_bytes((corpus / f"{split}.de").read_bytes())
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={corpus / 'train'}",
        f"data.dest={tmp_path / 'out'}",
        "clean.langid=true",
        override,
    )
    assert code != 0 and len(err.strip().splitlines()) == 1
    assert message in err
    assert not (tmp_path / "out").exists()
