"""nmt-preprocess: lossless valid/test, counts that add up, cleaning rules, safe output."""

from __future__ import annotations

import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest
import yaml

import nmt.data.build
import nmt.data.tokenizer_setup
from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta, split_prefix
from nmt.data.tokenizer import load_tokenizers, normalize_text
from nmt.errors import NmtError
from nmt.vocab import EOS


def _decoded(data_dir: Path, split: str, lang: str, side: str) -> list[str]:
    src_tok, tgt_tok = load_tokenizers(data_dir)
    tok = src_tok if side == "src" else tgt_tok
    arr = TokenArray(split_prefix(data_dir, split, lang))
    return [tok.decode(arr[i]) for i in range(len(arr))]


def _write(path: Path, lines: list[str]) -> None:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")


def test_demo_valid_and_test_decode_to_the_raw_text(demo_data_dir: Path, demo_corpus: Path) -> None:
    for split in ("valid", "test"):
        for lang, side in (("en", "src"), ("de", "tgt")):
            raw = (demo_corpus / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            expected = [normalize_text(t, False) for t in raw]
            assert _decoded(demo_data_dir, split, lang, side) == expected


def test_demo_counts_add_up(demo_data_dir: Path, demo_corpus: Path) -> None:
    meta = load_meta(demo_data_dir)
    assert (meta.src_lang, meta.tgt_lang, meta.joint_vocab) == ("en", "de", True)
    assert meta.special_ids == {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
    assert set(meta.splits) == {"train", "valid", "test"}
    for name, info in meta.splits.items():
        raw_lines = len((demo_corpus / f"{name}.en").read_text(encoding="utf-8").splitlines())
        assert info.lines == raw_lines
        assert info.kept + sum(info.removed.values()) == info.lines
        for lang, tokens in ((meta.src_lang, info.src_tokens), (meta.tgt_lang, info.tgt_tokens)):
            arr = TokenArray(split_prefix(demo_data_dir, name, lang))
            assert len(arr) == info.kept
            assert int(arr.sizes.sum()) == tokens
            assert arr.dtype == np.dtype(meta.dtype)
            ends = np.cumsum(arr.sizes) - 1  # every stored sentence ends in EOS, once
            assert (arr._bin[ends] == EOS).all() and int((arr._bin == EOS).sum()) == len(arr)
    assert meta.splits["valid"].kept == meta.splits["valid"].lines  # valid/test keep every line
    saved = yaml.safe_load((demo_data_dir / "config.yaml").read_text(encoding="utf-8"))
    assert saved == meta.config and saved["data"]["src"] == "en"


def test_cleaning_rules_are_applied_and_counted(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    en = (small_corpus / "train.en").read_text(encoding="utf-8").splitlines()
    de = (small_corpus / "train.de").read_text(encoding="utf-8").splitlines()
    bad = [
        ("", "Ich habe drei Bücher gekauft."),  # empty source
        ("I bought three books.", "   \t "),  # target empty after whitespace normalization
        (" ".join(["Anna"] * 300), " ".join(["Anna"] * 300)),  # both sides too long
        ("Tom.", "Tom sagt, dass Anna dreihundertzweiundzwanzig rote Lampen kaufen will."),
    ]
    for line_no, (s, t) in zip((3, 50, 120, 399), bad):  # spread over several chunks
        en[line_no], de[line_no] = s, t
    _write(small_corpus / "train.en", en)
    _write(small_corpus / "train.de", de)
    # the same lines in valid are kept
    _write(small_corpus / "valid.en", [s for s, _ in bad])
    _write(small_corpus / "valid.de", [t for _, t in bad])

    build_data_dir(
        preprocess_config("chunk_lines=100", "clean.max_pieces=100", "clean.max_ratio=2.5")
    )
    meta = load_meta(tmp_path / "out")
    # the rules restated in plain Python, on the lengths the stored tokenizer gives
    tok, _ = load_tokenizers(tmp_path / "out")
    expected_counts = {"invalid_utf8": 0, "empty": 0, "too_long": 0, "ratio": 0}
    expected_kept, rule_of_line = [], {}
    for i, (s, t) in enumerate(zip(en, de)):
        ls = len(tok.encode(normalize_text(s, False)))
        lt = len(tok.encode(normalize_text(t, False)))
        rule = (
            "empty"
            if min(ls, lt) == 0
            else "too_long"
            if max(ls, lt) > 100
            else "ratio"
            if max(ls, lt) > 2.5 * min(ls, lt)
            else None
        )
        if rule:
            expected_counts[rule] += 1
            rule_of_line[i] = rule
        else:
            expected_kept.append(normalize_text(t, False))
    assert meta.splits["train"].removed == expected_counts
    assert meta.splits["train"].kept == len(expected_kept)
    assert _decoded(tmp_path / "out", "train", "de", "tgt") == expected_kept
    # each constructed line was caught by its rule
    caught = [rule_of_line.get(i) for i in (3, 50, 120, 399)]
    assert caught == ["empty", "empty", "too_long", "ratio"]
    assert meta.splits["valid"].kept == meta.splits["valid"].lines == 4
    assert _decoded(tmp_path / "out", "valid", "de", "tgt")[1] == ""

    # every rule can be switched off
    build_data_dir(
        preprocess_config(
            "overwrite=true",
            "clean.remove_empty=false",
            "clean.max_pieces=null",
            "clean.max_ratio=null",
        )
    )
    train = load_meta(tmp_path / "out").splits["train"]
    assert train.kept == 400 and sum(train.removed.values()) == 0


def test_crlf_bom_and_nfkc(small_corpus: Path, preprocess_config, tmp_path: Path) -> None:
    valid_en = ["\ufeffThe number \ufb01ve.\r", "  Tom   says\tthat we count ten cups.\r"]
    (small_corpus / "valid.en").write_bytes("\n".join(valid_en).encode("utf-8"))  # no final \n
    _write(small_corpus / "valid.de", ["Die Zahl fünf.", "Tom sagt, dass wir zehn Tassen zählen."])
    build_data_dir(preprocess_config("nfkc=true"))
    assert load_meta(tmp_path / "out").normalization == {"nfkc": True}
    assert _decoded(tmp_path / "out", "valid", "en", "src") == [
        "The number five.",
        "Tom says that we count ten cups.",
    ]


def test_several_test_sets_keep_their_names(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    for lang in ("en", "de"):
        copy = (small_corpus / f"valid.{lang}").read_bytes()
        (small_corpus / f"test_2016.{lang}").write_bytes(copy)
    build_data_dir(
        preprocess_config(
            f"data.testpref=[{small_corpus / 'test'},{small_corpus / 'test_2016'}]",
            "data.validpref=null",
        )
    )
    meta = load_meta(tmp_path / "out")
    assert list(meta.splits) == ["train", "test", "test_2016"]
    raw = (small_corpus / "valid.de").read_text(encoding="utf-8").splitlines()
    assert _decoded(tmp_path / "out", "test_2016", "de", "tgt") == raw
    with pytest.raises(NmtError, match="data.testpref"):
        build_data_dir(
            preprocess_config(
                f"data.testpref=[{small_corpus / 'test'},{tmp_path / 'x' / 'test'}]",
                f"data.dest={tmp_path / 'other'}",
            )
        )


def test_existing_data_dir_is_replaced_only_with_overwrite(
    preprocess_config, tmp_path: Path
) -> None:
    build_data_dir(preprocess_config())
    before = (tmp_path / "out" / "meta.json").read_bytes()
    with pytest.raises(NmtError, match="overwrite=true"):
        build_data_dir(preprocess_config("clean.max_ratio=null"))
    assert (tmp_path / "out" / "meta.json").read_bytes() == before
    build_data_dir(preprocess_config("clean.max_ratio=null", "overwrite=true"))
    meta = json.loads((tmp_path / "out" / "meta.json").read_bytes())
    assert meta["config"]["clean"]["max_ratio"] is None
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus", "out"]  # no temp or old dirs


def test_a_folder_nmt_did_not_write_is_never_replaced(preprocess_config, tmp_path: Path) -> None:
    (tmp_path / "out").mkdir()
    (tmp_path / "out" / "notes.txt").write_text("mine")
    with pytest.raises(NmtError, match="not an nmt data dir"):
        build_data_dir(preprocess_config("overwrite=true"))
    assert (tmp_path / "out" / "notes.txt").read_text() == "mine"


def test_a_failed_run_leaves_nothing(
    preprocess_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def crash(*args: object) -> None:
        raise KeyboardInterrupt

    monkeypatch.setattr(nmt.data.build, "write_meta", crash)
    with pytest.raises(KeyboardInterrupt):
        build_data_dir(preprocess_config())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_ctrl_c_during_tokenizer_training_stops_at_once(
    preprocess_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    def endless_training(*args: object, **kwargs: object) -> None:
        # In the training child: Ctrl-C reaches the parent once training is under way. On a
        # loaded machine the parent may still be inside fork then, where Python would
        # swallow the KeyboardInterrupt without nmt.processes.sigint_deferred.
        os.kill(os.getppid(), signal.SIGINT)
        time.sleep(60)  # stands in for SentencePiece's C++ trainer, deaf to signals

    monkeypatch.setattr(nmt.data.tokenizer_setup, "train_tokenizer", endless_training)
    cfg = preprocess_config()
    started = time.monotonic()
    with pytest.raises(KeyboardInterrupt):
        build_data_dir(cfg)
    assert time.monotonic() - started < 10
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_the_library_checks_its_config_itself(preprocess_config, tmp_path: Path) -> None:
    """Configs built in Python never went through the CLI's validate()."""
    cfg = preprocess_config()
    cfg.workers = 0
    with pytest.raises(NmtError, match=r"^workers=0: must be 1 or more; use 1"):
        build_data_dir(cfg)
    cfg = preprocess_config()
    cfg.clean.max_pieces = 0
    with pytest.raises(
        NmtError,
        match=r"^clean\.max_pieces=0: must be 1 or more \(in SentencePiece pieces\); use null",
    ):
        build_data_dir(cfg)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_enum_options_may_be_given_as_strings(preprocess_config, tmp_path: Path) -> None:
    build_data_dir(preprocess_config("spm.model_type=unigram", "on_invalid_utf8=skip"))
    with_enums = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    cfg = preprocess_config(f"data.dest={tmp_path / 'strings'}")
    cfg.spm.model_type, cfg.on_invalid_utf8 = "unigram", "skip"  # as a Python user may write
    build_data_dir(cfg)
    with_strings = {p.name: p.read_bytes() for p in (tmp_path / "strings").iterdir()}
    assert with_enums.keys() == with_strings.keys()
    for name in with_enums:
        if name not in ("meta.json", "config.yaml"):  # they record data.dest
            assert with_enums[name] == with_strings[name], name
    assert load_meta(tmp_path / "strings").config["spm"]["model_type"] == "unigram"
    cfg.on_invalid_utf8 = "ignore"
    with pytest.raises(
        NmtError, match=r"^on_invalid_utf8=ignore: unknown; use one of error, replace"
    ):
        build_data_dir(cfg)


def test_the_report_matches_meta_json(preprocess_config, tmp_path: Path) -> None:
    report = build_data_dir(preprocess_config("workers=2"))
    assert report.dest == tmp_path / "out"
    assert report.meta == load_meta(tmp_path / "out")
    assert report.pairs == 400 + 50 + 50 and report.workers == 2
    assert report.encode_seconds > 0 and report.invalid_utf8 == {}
    lines = report.lines()
    assert lines[0] == "en->de, joint vocabulary of 200 pieces, uint16 ids"
    assert [line.split()[0] for line in lines if line.startswith("  ")] == [
        "train",
        "valid",
        "test",
    ]
    assert lines[-1] == f"wrote {tmp_path / 'out'}"


def test_temporaries_of_a_killed_run_are_removed(preprocess_config, tmp_path: Path) -> None:
    """A run killed mid-build leaves its hidden temporary beside data.dest (SIGKILL runs no
    cleanup); the next run removes it, and nothing else."""
    from nmt.fsutil import stale_temps

    killed = tmp_path / ".out.a1b2c3.tmp"
    killed.mkdir()
    (killed / "train.en.bin").write_bytes(b"half")
    assert stale_temps(tmp_path / "out") == [killed]
    mine = tmp_path / ".other.tmp"  # not a temporary of data.dest
    mine.mkdir()
    build_data_dir(preprocess_config())
    assert sorted(p.name for p in tmp_path.iterdir()) == [".other.tmp", "corpus", "out"]


def test_a_file_on_the_way_to_data_dest_is_named(preprocess_config, tmp_path: Path) -> None:
    blocker = tmp_path / "not-a-dir"
    blocker.write_text("x", encoding="utf-8")
    with pytest.raises(NmtError, match=f"data.dest={blocker}/a/data: {blocker} is not a dir"):
        build_data_dir(preprocess_config(f"data.dest={blocker / 'a' / 'data'}"))
    assert blocker.read_text(encoding="utf-8") == "x"
