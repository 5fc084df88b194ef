"""Each input mistake: a non-zero exit, one line on stderr naming the file/line/key, no output."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta
from nmt.data.tokenizer import load_tokenizers


@pytest.fixture
def corpus_args(small_corpus: Path, tmp_path: Path) -> list[str]:
    return [
        f"data.trainpref={small_corpus / 'train'}",
        f"data.validpref={small_corpus / 'valid'}",
        f"data.testpref=[{small_corpus / 'test'}]",
        f"data.dest={tmp_path / 'out'}",
        "spm.vocab_size=200",
        "spm.byte_fallback=false",
        "workers=1",
    ]


def _assert_one_line_error(code: int, err: str, tmp_path: Path, *needles: str) -> None:
    assert code != 0
    assert len(err.splitlines()) == 1, err
    assert err.startswith("nmt-preprocess: error: ")
    for needle in needles:
        assert needle in err, (needle, err)
    # nothing half-written: no data dir and no temporary leftovers
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_missing_file_through_the_console_script(small_corpus: Path, tmp_path: Path) -> None:
    script = Path(sys.executable).parent / "nmt-preprocess"
    proc = subprocess.run(
        [str(script), f"data.trainpref={small_corpus / 'nope'}", f"data.dest={tmp_path / 'out'}"],
        capture_output=True,
        text=True,
    )
    _assert_one_line_error(proc.returncode, proc.stderr, tmp_path, f"{small_corpus / 'nope'}.en")
    assert "no such file" in proc.stderr


def test_missing_target_side(nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path) -> None:
    (small_corpus / "test.de").unlink()
    code, _, err = nmt_cli("preprocess", *corpus_args)
    _assert_one_line_error(code, err, tmp_path, str(small_corpus / "test.de"))


def test_line_counts_differ(nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path) -> None:
    with open(small_corpus / "valid.de", "a", encoding="utf-8") as f:
        f.write("Eine Zeile zu viel.\n")
    code, _, err = nmt_cli("preprocess", *corpus_args)
    _assert_one_line_error(
        code,
        err,
        tmp_path,
        f"{small_corpus / 'valid.en'} has 50 lines",
        f"{small_corpus / 'valid.de'} has 51",
    )


def _break_utf8(path: Path, line_no: int) -> None:
    lines = path.read_bytes().split(b"\n")
    lines[line_no - 1] = lines[line_no - 1] + b" \xff\xfe"
    path.write_bytes(b"\n".join(lines))


def test_invalid_utf8_names_file_and_line(
    nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path
) -> None:
    _break_utf8(small_corpus / "valid.de", 3)
    code, _, err = nmt_cli("preprocess", *corpus_args)
    _assert_one_line_error(
        code,
        err,
        tmp_path,
        f"{small_corpus / 'valid.de'}:3: invalid UTF-8",
        "on_invalid_utf8=replace",
    )


def test_invalid_utf8_replace_and_skip(
    nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path
) -> None:
    _break_utf8(small_corpus / "valid.de", 3)
    _break_utf8(small_corpus / "train.en", 250)
    code, out, _ = nmt_cli(
        "preprocess",
        *corpus_args,
        "on_invalid_utf8=replace",
        "spm.byte_fallback=true",
        "spm.vocab_size=400",
        "clean.max_ratio=null",
    )
    assert code == 0
    assert "valid: 1 lines with invalid UTF-8 (replaced)" in out
    meta = load_meta(tmp_path / "out")
    assert meta.splits["valid"].kept == 50 and meta.splits["train"].kept == 400
    _, tgt_tok = load_tokenizers(tmp_path / "out")
    assert tgt_tok.decode(TokenArray(tmp_path / "out" / "valid.de")[2]).endswith("\ufffd\ufffd")

    code, out, _ = nmt_cli(
        "preprocess", *corpus_args, "on_invalid_utf8=skip", "overwrite=true", "clean.max_ratio=null"
    )
    assert code == 0
    meta = load_meta(tmp_path / "out")
    assert meta.splits["valid"].removed == {"invalid_utf8": 1}
    assert meta.splits["valid"].kept == 49
    assert meta.splits["train"].removed["invalid_utf8"] == 1 and meta.splits["train"].kept == 399


def test_empty_training_set_after_cleaning(
    nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path
) -> None:
    code, _, err = nmt_cli("preprocess", *corpus_args, "clean.max_pieces=1")
    _assert_one_line_error(
        code,
        err,
        tmp_path,
        f"data.trainpref={small_corpus / 'train'}",
        "no training pairs left",
        "too_long 400",
    )


def test_vocab_size_the_corpus_cannot_support(nmt_cli, corpus_args, tmp_path: Path) -> None:
    code, _, err = nmt_cli("preprocess", *corpus_args, "spm.vocab_size=50000")
    _assert_one_line_error(code, err, tmp_path, "spm.vocab_size=50000", "set spm.vocab_size=")
    limit = int(err.split("set spm.vocab_size=")[1].split()[0])
    assert 200 < limit < 50000
    code, _, err = nmt_cli("preprocess", *corpus_args, "spm.vocab_size=10")
    _assert_one_line_error(code, err, tmp_path, "spm.vocab_size=10", "or more")


def test_existing_data_dir_without_overwrite(nmt_cli, corpus_args, tmp_path: Path) -> None:
    assert nmt_cli("preprocess", *corpus_args)[0] == 0
    before = {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()}
    code, _, err = nmt_cli("preprocess", *corpus_args, "spm.vocab_size=150")
    assert code != 0 and len(err.splitlines()) == 1
    assert f"data.dest={tmp_path / 'out'}" in err and "overwrite=true" in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "out").iterdir()} == before


@pytest.mark.parametrize(
    "content, needle",
    [
        ("", "the training files are empty"),
        ("\n \n\t\n", "every line is empty"),
    ],
)
def test_training_files_without_text(
    nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path, content: str, needle: str
) -> None:
    for lang in ("en", "de"):
        (small_corpus / f"train.{lang}").write_text(content, encoding="utf-8")
    code, _, err = nmt_cli("preprocess", *corpus_args)
    _assert_one_line_error(code, err, tmp_path, str(small_corpus / "train"), needle)


@pytest.mark.parametrize(
    "override, key",
    [
        ("data.sorce=en", "sorce"),
        ("workers=two", "workers"),
        ("on_invalid_utf8=ignore", "on_invalid_utf8"),
        ("spm.model_type=wordpiece", "model_type"),
    ],
)
def test_config_mistakes_are_one_line_errors(nmt_cli, override: str, key: str) -> None:
    code, _, err = nmt_cli("preprocess", override)
    assert code != 0 and len(err.splitlines()) == 1 and key in err


def test_the_old_name_of_clean_max_pieces_gets_a_hint(nmt_cli, corpus_args, tmp_path: Path) -> None:
    code, _, err = nmt_cli("preprocess", *corpus_args, "clean.max_tokens=5")
    assert code == 2
    _assert_one_line_error(
        code, err, tmp_path, "clean.max_tokens: renamed to clean.max_pieces", "clean.max_pieces=..."
    )


@pytest.mark.parametrize(
    "override, message",
    [
        ("workers=0", "workers=0: must be 1 or more; use 1"),
        ("chunk_lines=-5", "chunk_lines=-5: must be 1 or more;"),
        ("data.tgt=en", "data.tgt=en: the same language as data.src; give two different"),
        ("data.src=e/n", "data.src=e/n: not a language suffix; give one such as en"),
        ("spm.vocab_size=0", "spm.vocab_size=0: too small: SentencePiece needs more than 4"),
        ("spm.num_threads=0", "spm.num_threads=0: must be 1 or more; use"),
        ("spm.input_sentence_size=-1", "spm.input_sentence_size=-1: must not be negative; use 0"),
        ("spm.character_coverage=0", "spm.character_coverage=0.0: must be in (0, 1]; use 1.0"),
        ("spm.seed=-3", "spm.seed=-3: must not be negative; use 0 or more"),
        ("spm.user_defined_symbols=['']", "spm.user_defined_symbols=['']: holds an empty string"),
        ("spm.src_model=a.model", "spm.src_model=a.model: the other side's model is missing"),
        (
            "clean.max_pieces=0",
            "clean.max_pieces=0: must be 1 or more (in SentencePiece pieces); use null for no limit",
        ),
        ("clean.max_ratio=0.5", "clean.max_ratio=0.5: must be 1 or more; use null for no limit"),
        ("data.testpref=[a/train]", "data.testpref=a/train: would be stored as split 'train'"),
    ],
)
def test_impossible_values_are_one_line_in_the_option_style(
    nmt_cli, corpus_args, tmp_path: Path, override: str, message: str
) -> None:
    code, _, err = nmt_cli("preprocess", *corpus_args, override)
    assert code == 2
    _assert_one_line_error(code, err, tmp_path, message)


def test_spm_model_and_separate_models_together(nmt_cli, corpus_args, tmp_path: Path) -> None:
    code, _, err = nmt_cli("preprocess", *corpus_args, "spm.model=j.model", "spm.src_model=s.model")
    _assert_one_line_error(code, err, tmp_path, "spm.model=j.model: set together with")
    code, _, err = nmt_cli("preprocess", *corpus_args, "spm.model=j.model", "spm.joint=false")
    _assert_one_line_error(code, err, tmp_path, "spm.joint=false: spm.model=j.model is one joint")


def test_a_model_with_other_special_ids_is_one_line(
    nmt_cli, corpus_args, small_corpus: Path, tmp_path: Path
) -> None:
    import io

    import sentencepiece as spm

    model = io.BytesIO()  # SentencePiece's own defaults: unk=0 bos=1 eos=2, no pad
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter((small_corpus / "train.en").read_text("utf-8").splitlines()),
        model_writer=model,
        vocab_size=100,
        minloglevel=2,
    )
    path = small_corpus / "foreign.model"
    path.write_bytes(model.getvalue())
    code, _, err = nmt_cli("preprocess", *corpus_args, f"spm.model={path}")
    _assert_one_line_error(code, err, tmp_path, f"spm.model={path}", "nmt needs bos=0 pad=1")


def test_a_missing_spm_model_is_one_line(nmt_cli, corpus_args, tmp_path: Path) -> None:
    missing = tmp_path / "nope.model"
    code, _, err = nmt_cli("preprocess", *corpus_args, f"spm.model={missing}")
    _assert_one_line_error(code, err, tmp_path, f"spm.model={missing}: no such file")
