"""SentencePiece tokenizers: nmt's special ids, lossless round trips, training and reuse."""

from __future__ import annotations

import io
import re
from pathlib import Path

import numpy as np
import pytest
import sentencepiece as spm

from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta
from nmt.data.tokenizer import Tokenizer, load_tokenizers, normalize_text, train_tokenizer
from nmt.errors import NmtError
from nmt.vocab import BOS, EOS, PAD, UNK


def _lines(corpus: Path, name: str) -> list[str]:
    return (corpus / name).read_text(encoding="utf-8").splitlines()


@pytest.fixture
def tokenizer(small_corpus: Path) -> Tokenizer:
    text = _lines(small_corpus, "train.en") + _lines(small_corpus, "train.de")
    return train_tokenizer(
        text,
        vocab_size=400,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=True,
        input_sentence_size=0,
        user_defined_symbols=["<sep>"],
        num_threads=1,
        seed=1,
        what="small corpus",
    )


@pytest.mark.parametrize(
    "raw, nfkc, expected",
    [
        ("  a \t b\r", False, "a b"),
        ("a\u00a0b\u2003c", False, "a b c"),  # no-break and em spaces are whitespace too
        ("\ufb01le Ｎｏ.１", False, "\ufb01le Ｎｏ.１"),
        ("\ufb01le Ｎｏ.１", True, "file No.1"),
        ("", True, ""),
    ],
)
def test_normalize_text(raw: str, nfkc: bool, expected: str) -> None:
    assert normalize_text(raw, nfkc) == expected


def test_trained_model_uses_nmt_special_ids(tokenizer: Tokenizer) -> None:
    assert tokenizer.special_ids() == {"bos": BOS, "pad": PAD, "eos": EOS, "unk": UNK}
    tokenizer.check_special_ids("trained model")
    assert tokenizer.vocab_size == 400
    assert "<sep>" in tokenizer.encode_as_pieces("a <sep> b")  # a user-defined symbol stays whole


def test_round_trip_is_lossless(tokenizer: Tokenizer, small_corpus: Path) -> None:
    text = _lines(small_corpus, "test.en") + _lines(small_corpus, "test.de")
    text.append("Ωmega — unseen characters, spelled as bytes ✓")
    for line in text:
        ids = tokenizer.encode(line)
        assert all(i > UNK for i in ids)  # byte fallback: no <unk>
        assert tokenizer.decode(ids) == line


def test_decode_drops_special_ids(tokenizer: Tokenizer) -> None:
    ids = tokenizer.encode("Ich habe drei Bücher gekauft.")
    noisy = [BOS, *ids[:2], UNK, *ids[2:], EOS, PAD, PAD]
    assert tokenizer.decode(noisy) == "Ich habe drei Bücher gekauft."
    assert tokenizer.decode(np.array(ids)) == "Ich habe drei Bücher gekauft."


def test_from_bytes_and_from_file_agree(tokenizer: Tokenizer, tmp_path: Path) -> None:
    path = tmp_path / "m.model"
    path.write_bytes(tokenizer.model_bytes)
    line = "Lena will zweiundvierzig rote Lampen kaufen."
    assert (
        Tokenizer.from_file(path).encode(line)
        == Tokenizer.from_bytes(tokenizer.model_bytes).encode(line)
        == tokenizer.encode(line)
    )
    assert Tokenizer.from_file(path).sha256 == tokenizer.sha256


def test_bad_model_files_are_one_line_errors(tmp_path: Path) -> None:
    with pytest.raises(NmtError, match="not found"):
        Tokenizer.from_file(tmp_path / "missing.model")
    junk = tmp_path / "junk.model"
    junk.write_bytes(b"not a model")
    with pytest.raises(NmtError, match="junk.model: not a SentencePiece model"):
        Tokenizer.from_file(junk)


def test_model_with_other_special_ids_is_refused(
    small_corpus: Path, tmp_path: Path, preprocess_config
) -> None:
    model = io.BytesIO()  # SentencePiece's own defaults: unk=0 bos=1 eos=2, no pad
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(_lines(small_corpus, "train.en")),
        model_writer=model,
        vocab_size=100,
        minloglevel=2,
    )
    path = tmp_path / "foreign.model"
    path.write_bytes(model.getvalue())
    with pytest.raises(NmtError, match="nmt needs bos=0 pad=1 eos=2 unk=3"):
        Tokenizer.from_file(path).check_special_ids("foreign")
    cfg = preprocess_config(f"spm.model={path}", "data.validpref=null", "data.testpref=[]")
    with pytest.raises(NmtError, match=re.escape(f"spm.model={path}: the model's special ids")):
        build_data_dir(cfg)  # the CLI's one-line error: tests/integration/test_preprocess_errors.py
    assert not (tmp_path / "out").exists()


def test_preprocess_reuses_a_given_model(preprocess_config, tmp_path: Path) -> None:
    first = preprocess_config(f"data.dest={tmp_path / 'first'}")
    build_data_dir(first)
    model = tmp_path / "first" / "spm.model"
    build_data_dir(
        preprocess_config(
            f"data.dest={tmp_path / 'second'}", f"spm.model={model}", "spm.vocab_size=999"
        )
    )  # ignored: the reused model decides
    meta = load_meta(tmp_path / "second")
    first_meta = load_meta(tmp_path / "first")
    assert meta.tokenizers["src"]["sha256"] == first_meta.tokenizers["src"]["sha256"]
    assert meta.src_vocab_size == 200
    for name in ("spm.model", "train.en.bin", "train.de.bin", "test.de.idx"):
        assert (tmp_path / "first" / name).read_bytes() == (tmp_path / "second" / name).read_bytes()


def test_separate_vocabularies(preprocess_config, tmp_path: Path) -> None:
    build_data_dir(preprocess_config("spm.joint=false", "spm.vocab_size=150"))
    out = tmp_path / "out"
    meta = load_meta(out)
    assert not meta.joint_vocab
    assert meta.tokenizers["src"]["file"] == "spm.en.model"
    assert meta.tokenizers["tgt"]["file"] == "spm.de.model"
    assert meta.tokenizers["src"]["sha256"] != meta.tokenizers["tgt"]["sha256"]
    src_tok, tgt_tok = load_tokenizers(out)
    raw = (out.parent / "corpus" / "valid.de").read_text(encoding="utf-8").splitlines()
    decoded = [tgt_tok.decode(TokenArray(out / "valid.de")[i]) for i in range(len(raw))]
    assert decoded == raw
    # the two models can be reused as a pair
    build_data_dir(
        preprocess_config(
            f"data.dest={tmp_path / 'again'}",
            f"spm.src_model={out / 'spm.en.model'}",
            f"spm.tgt_model={out / 'spm.de.model'}",
        )
    )
    assert (tmp_path / "again" / "valid.de.bin").read_bytes() == (out / "valid.de.bin").read_bytes()


def test_modified_model_file_is_detected(preprocess_config, tmp_path: Path) -> None:
    build_data_dir(preprocess_config())
    model = tmp_path / "out" / "spm.model"
    model.write_bytes(model.read_bytes() + b"\x00")
    with pytest.raises(NmtError, match="sha256"):
        load_tokenizers(tmp_path / "out")
