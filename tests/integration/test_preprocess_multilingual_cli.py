"""nmt-preprocess of several languages as a command: the report lists each pair, a {pair}
prefix is given in Hydra's quoting, and a mistake is one line with nothing written."""

from __future__ import annotations

from pathlib import Path

from nmt.data.meta import load_meta
from tests.helpers import small_preprocess_args


def _add_third_language(corpus: Path, lang: str) -> None:
    """`<split>.<lang>` made from English, deterministically (each line upper-cased)."""
    for split in ("train", "valid", "test"):
        text = (corpus / f"{split}.en").read_text(encoding="utf-8")
        (corpus / f"{split}.{lang}").write_text(text.upper(), encoding="utf-8")


def test_the_report_lists_every_pair(nmt_cli, small_corpus: Path, tmp_path: Path) -> None:
    _add_third_language(small_corpus, "fr")
    out = tmp_path / "out"
    code, stdout, stderr = nmt_cli(
        "preprocess",
        *small_preprocess_args(small_corpus, out, "data.pairs=[en-de,de-en,fr-en]"),
    )
    assert code == 0, stderr
    meta = load_meta(out)
    assert meta.directions == {"en-de": "en-de", "de-en": "en-de", "fr-en": "fr-en"}
    assert "en, de, fr: 3 directions (en-de, de-en, fr-en)" in stdout
    listed = [line.split()[0] for line in stdout.splitlines() if line.startswith("  ")]
    assert listed == list(meta.splits)
    for name, info in meta.splits.items():
        src, tgt = info.langs
        assert f"tokens {info.src_tokens} {src} / {info.tgt_tokens} {tgt}" in stdout, name


def test_pair_prefixes_quoted_for_hydra(nmt_cli, small_corpus: Path, tmp_path: Path) -> None:
    raw = tmp_path / "raw" / "en-de"
    raw.mkdir(parents=True)
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            lines = (small_corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (raw / f"{split}.{lang}").write_text("\n".join(lines[:30]) + "\n", encoding="utf-8")
    out = tmp_path / "out"
    pair_prefix = tmp_path / "raw" / "{pair}"
    args = small_preprocess_args(small_corpus, out, "data.langs=[en,de]")
    code, _, stderr = nmt_cli(
        "preprocess",
        *(
            arg
            for arg in args
            if not arg.startswith(("data.trainpref", "data.validpref", "data.testpref"))
        ),
        f"data.trainpref='{pair_prefix}/train'",
        f"data.validpref='{pair_prefix}/valid'",
        "data.testpref=[]",
    )
    assert code == 0, stderr
    splits = load_meta(out).splits
    assert set(splits) == {"train.en-de", "valid.en-de"}
    assert splits["train.en-de"].lines == splits["valid.en-de"].lines == 30


def test_a_bad_direction_is_one_line(nmt_cli, small_corpus: Path, tmp_path: Path) -> None:
    out = tmp_path / "out"
    code, _, stderr = nmt_cli(
        "preprocess", *small_preprocess_args(small_corpus, out, "data.pairs=[en-de,de]")
    )
    assert code != 0
    assert stderr.splitlines() == [
        "nmt-preprocess: error: data.pairs=de: not a direction; write source-target with "
        "two different language codes, e.g. en-de"
    ]
    assert not out.exists()
