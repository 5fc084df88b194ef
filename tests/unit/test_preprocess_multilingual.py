"""nmt-preprocess of several languages: one joint model whose language tags are control
symbols, each pair binarized once and read either way, lossless splits, clear errors."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.languages import tag_piece
from nmt.data.meta import load_meta, split_prefix
from nmt.data.tokenizer import load_tokenizers, normalize_text
from nmt.errors import NmtError
from tests.helpers import unigram_tokenizer

LANGS = ["en", "de", "fr"]
SPLITS = ("train", "valid", "test")
# a line that holds a tag's text: it must stay text, never become the tag
TAG_TEXT_LINE = "The sign <2fr> says <2de>."


def _lines(path: Path) -> list[str]:
    return path.read_text(encoding="utf-8").splitlines()


def _write(path: Path, lines: list[str]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def _pseudo_french(line: str) -> str:
    """A third language made from English, deterministically: each word spelled backwards."""
    return " ".join(word[::-1] for word in line.split(" "))


@pytest.fixture
def trilingual_corpus(small_corpus: Path) -> Path:
    """small_corpus with a multi-parallel .fr beside .en and .de, and a first line of
    train and valid that holds a tag's text (the model has no byte pieces: its characters
    must be in the training text)."""
    for split in SPLITS:
        en = _lines(small_corpus / f"{split}.en")
        if split != "test":
            en[0] = TAG_TEXT_LINE
            _write(small_corpus / f"{split}.en", en)
        _write(small_corpus / f"{split}.fr", [_pseudo_french(line) for line in en])
    return small_corpus


def _decoded(data_dir: Path, split: str, lang: str) -> list[str]:
    tok, _ = load_tokenizers(data_dir)
    arr = TokenArray(split_prefix(data_dir, split, lang))
    return [tok.decode(arr[i]) for i in range(len(arr))]


def _error(cfg) -> str:
    with pytest.raises(NmtError) as info:
        build_data_dir(cfg)
    message = str(info.value)
    assert "\n" not in message
    return message


def test_multi_parallel_corpus_makes_every_pair_once(
    trilingual_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    out = tmp_path / "out"
    report = build_data_dir(preprocess_config("data.langs=[en,de,fr]"))
    meta = load_meta(out)
    stems = ["en-de", "en-fr", "de-fr"]  # each unordered pair once, as first listed
    assert meta.multilingual and meta.langs == LANGS
    assert meta.directions == {
        "en-de": "en-de",
        "en-fr": "en-fr",
        "de-en": "en-de",
        "de-fr": "de-fr",
        "fr-en": "en-fr",
        "fr-de": "de-fr",
    }
    assert meta.lang_tags == {lang: tag_piece(lang) for lang in LANGS}
    assert (meta.src_lang, meta.tgt_lang, meta.joint_vocab) == ("en", "de", True)
    assert meta.tokenizers["src"] == meta.tokenizers["tgt"]
    assert set(meta.splits) == {f"{split}.{stem}" for split in SPLITS for stem in stems}
    stored = {p.name for p in out.iterdir() if p.suffix in (".bin", ".idx")}
    assert stored == {
        f"{split}.{stem}.{lang}.{ext}"
        for split in SPLITS
        for stem in stems
        for lang in stem.split("-")
        for ext in ("bin", "idx")
    }
    for direction, stem in meta.directions.items():  # both directions read the one pair
        src, tgt = direction.split("-")
        assert meta.direction_split("valid", direction) == (f"valid.{stem}", src, tgt)
    for name, info in meta.splits.items():
        stem = name.split(".", 1)[1]
        assert info.langs == stem.split("-")
        assert info.lines == len(_lines(trilingual_corpus / f"{name.split('.')[0]}.en"))
        assert info.kept + sum(info.removed.values()) == info.lines
        for lang, tokens in zip(info.langs, (info.src_tokens, info.tgt_tokens)):
            arr = TokenArray(split_prefix(out, name, lang))
            assert len(arr) == info.kept and int(arr.sizes.sum()) == tokens
    # valid and test keep every line: each language decodes back to its input
    for split in ("valid", "test"):
        for stem in stems:
            for lang in stem.split("-"):
                raw = _lines(trilingual_corpus / f"{split}.{lang}")
                expected = [normalize_text(line, False) for line in raw]
                assert _decoded(out, f"{split}.{stem}", lang) == expected
    assert _decoded(out, "valid.en-de", "en")[0] == TAG_TEXT_LINE
    report_lines = "\n".join(report.lines())
    for name in meta.splits:
        assert f"  {name} " in report_lines
    assert "3 language tags" in report_lines


def test_tags_are_control_symbols(trilingual_corpus: Path, preprocess_config, tmp_path) -> None:
    build_data_dir(preprocess_config("data.pairs=[en-de,de-en,en-fr]"))
    meta = load_meta(tmp_path / "out")
    tok, _ = load_tokenizers(tmp_path / "out")
    ids = tok.control_symbol_ids(meta.lang_tags.values())
    assert sorted(ids) == sorted(tag_piece(lang) for lang in LANGS)
    for tag, tag_id in ids.items():
        assert tok.decode([tag_id]) == ""
        for text in (tag, f"{tag} hello", TAG_TEXT_LINE, f"a{tag}b"):
            assert not set(tok.encode(text)) & set(ids.values()), (text, tok.encode(text))


def test_pair_placeholder_reads_other_files_per_pair(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    """A corpus that is not multi-parallel: en-de and fr-en from different sentences."""
    raw = tmp_path / "raw"
    for split in SPLITS:
        en = _lines(small_corpus / f"{split}.en")
        de = _lines(small_corpus / f"{split}.de")
        half = len(en) // 2
        _write(raw / "en-de" / f"{split}.en", en[:half])
        _write(raw / "en-de" / f"{split}.de", de[:half])
        _write(raw / "fr-en" / f"{split}.en", en[half:])
        _write(raw / "fr-en" / f"{split}.fr", [_pseudo_french(line) for line in en[half:]])
    out = tmp_path / "out"
    build_data_dir(
        preprocess_config(
            "data.pairs=[en-de,de-en,fr-en]",
            f"data.trainpref={raw}/{{pair}}/train",
            f"data.validpref={raw}/{{pair}}/valid",
            f'data.testpref=["{raw}/{{pair}}/test"]',
        )
    )
    meta = load_meta(out)
    assert meta.langs == LANGS  # in the order data.pairs names them
    assert meta.directions == {"en-de": "en-de", "de-en": "en-de", "fr-en": "fr-en"}
    assert set(meta.splits) == {
        f"{split}.{stem}" for split in SPLITS for stem in meta.directions.values()
    }
    assert meta.splits["train.fr-en"].langs == ["fr", "en"]
    for split in ("valid", "test"):
        for stem in ("en-de", "fr-en"):
            for lang in stem.split("-"):
                expected = _lines(raw / stem / f"{split}.{lang}")
                assert _decoded(out, f"{split}.{stem}", lang) == expected


def test_cleaning_is_counted_per_pair(trilingual_corpus: Path, preprocess_config, tmp_path) -> None:
    en = _lines(trilingual_corpus / "train.en")
    en[5] = ""  # empty in en: pairs with en lose it, de-fr keeps it
    _write(trilingual_corpus / "train.en", en)
    de = _lines(trilingual_corpus / "train.de")
    de[7] = en[7]  # a copy in en-de only
    _write(trilingual_corpus / "train.de", de)
    build_data_dir(preprocess_config("data.langs=[en,de,fr]", "clean.drop_copies=true"))
    splits = load_meta(tmp_path / "out").splits
    assert splits["train.en-de"].removed["empty"] == 1
    assert splits["train.en-fr"].removed["empty"] == 1
    assert splits["train.de-fr"].removed["empty"] == 0
    assert splits["train.en-de"].removed["copy"] == 1
    assert splits["train.en-fr"].removed["copy"] == 0


def test_a_reused_joint_model_needs_the_tags(
    trilingual_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    build_data_dir(preprocess_config("data.langs=[en,de,fr]"))
    model = tmp_path / "out" / "spm.model"
    reused = tmp_path / "reused"
    build_data_dir(
        preprocess_config("data.pairs=[fr-de]", f"spm.model={model}", f"data.dest={reused}")
    )
    assert load_meta(reused).tokenizers["src"] == load_meta(tmp_path / "out").tokenizers["src"]
    plain = tmp_path / "plain.model"
    text = _lines(trilingual_corpus / "train.en") + _lines(trilingual_corpus / "train.fr")
    plain.write_bytes(unigram_tokenizer(text, 200).model_bytes)
    message = _error(
        preprocess_config(
            "data.langs=[en,de,fr]", f"spm.model={plain}", f"data.dest={tmp_path / 'x'}"
        )
    )
    assert message.startswith(f"spm.model={plain}: lacks the language tags <2en> <2de> <2fr>")
    assert not (tmp_path / "x").exists()


def test_option_mistakes_are_one_line_errors(
    trilingual_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    cases = {
        "data.pairs=[en-en]": "data.pairs=en-en: not a direction",
        "data.pairs=[ende]": "data.pairs=ende: not a direction",
        "data.pairs=[en-de,en-de]": "data.pairs=[en-de,en-de]: lists a direction twice",
        "data.langs=[en,e-n]": "data.langs=e-n: not a language code",
        "data.langs=[en]": "data.langs=[en]: a multilingual build needs two languages",
        "data.langs=[en,en,de]": "data.langs=[en,en,de]: names a language twice",
    }
    for override, start in cases.items():
        assert _error(preprocess_config(override)).startswith(start)
    assert _error(preprocess_config("data.langs=[en,de]", "data.pairs=[en-fr]")).startswith(
        "data.pairs=[en-fr]: uses fr, not in data.langs=[en,de]"
    )
    assert _error(preprocess_config("data.langs=[en,de,fr]", "spm.joint=false")).startswith(
        "spm.joint=false: a multilingual build"
    )
    assert _error(preprocess_config("data.langs=[en,fr]", "data.src=fr")).startswith(
        "data.src=fr: unused by a multilingual build"
    )
    message = _error(preprocess_config(f"data.trainpref={trilingual_corpus}/{{pair}}/train"))
    assert message.startswith("data.trainpref=") and "{pair} stands for a pair" in message
    assert not (tmp_path / "out").exists()


def test_a_missing_file_is_named_before_any_work(
    trilingual_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    (trilingual_corpus / "test.fr").unlink()
    message = _error(preprocess_config("data.langs=[en,de,fr]"))
    assert message == (
        f"{trilingual_corpus / 'test.fr'}: no such file "
        f"(data.testpref={trilingual_corpus / 'test'} for en-fr)"
    )
    raw = tmp_path / "raw"
    shutil.copytree(trilingual_corpus, raw / "en-de")
    shutil.copytree(trilingual_corpus, raw / "de-fr")
    (raw / "de-fr" / "valid.de").unlink()
    message = _error(
        preprocess_config(
            "data.pairs=[en-de,de-fr]",
            f"data.trainpref={raw}/{{pair}}/train",
            f"data.validpref={raw}/{{pair}}/valid",
            "data.testpref=[]",
        )
    )
    assert message == (
        f"{raw / 'de-fr' / 'valid.de'}: no such file "
        f"(data.validpref={raw}/{{pair}}/valid for de-fr)"
    )
    assert not (tmp_path / "out").exists()


def test_multilingual_shards_join_pair_by_pair(
    trilingual_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    first, second, joined = tmp_path / "a", tmp_path / "b", tmp_path / "j"
    build_data_dir(preprocess_config("data.langs=[en,de,fr]", f"data.dest={first}"))
    build_data_dir(
        preprocess_config(
            "data.langs=[en,de,fr]", f"spm.model={first / 'spm.model'}", f"data.dest={second}"
        )
    )
    build_data_dir(preprocess_config(f"join=[{first},{second}]", f"data.dest={joined}"))
    a, meta = load_meta(first), load_meta(joined)
    assert (meta.langs, meta.directions, meta.lang_tags) == (a.langs, a.directions, a.lang_tags)
    for name, info in meta.splits.items():
        assert info.langs == a.splits[name].langs and info.shards == [f"{name}.0", f"{name}.1"]
        for lang in info.langs:
            assert _decoded(joined, info.shards[1], lang) == _decoded(second, name, lang)
    other = tmp_path / "other"
    build_data_dir(
        preprocess_config(
            "data.pairs=[en-fr]", f"spm.model={first / 'spm.model'}", f"data.dest={other}"
        )
    )
    message = _error(preprocess_config(f"join=[{first},{other}]", f"data.dest={tmp_path / 'x'}"))
    assert message.startswith(f"join={other}: its langs is ['en', 'fr'] but {first}'s is")
