"""nmt-generate end to end on a checkpoint built here: a randomly initialised tiny
Transformer with a SentencePiece model trained in the test, saved per the checkpoint format."""

from __future__ import annotations

import io
import random
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.checkpoint import save_checkpoint, tokenizer_to_tensor
from nmt.cli import main
from nmt.data.binarize import TokenArrayWriter
from nmt.data.meta import DataMeta, SplitInfo, write_meta
from nmt.data.tokenizer import Tokenizer, normalize_text, train_tokenizer
from nmt.data.vocab import EOS, SPECIAL_IDS
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer

WORDS = (
    "one two three four five six seven eight nine ten eleven twelve hundred thousand and".split()
)


pytestmark = pytest.mark.usefixtures("one_thread")


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return train_tokenizer(
        _sentences(300, 0),
        vocab_size=32,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        input_sentence_size=0,
        user_defined_symbols=[],
        num_threads=1,
        seed=1,
        what="test text",
    )


def _checkpoint(path: Path, tokenizer: Tokenizer, seed: int) -> Path:
    torch.manual_seed(seed)
    cfg = ModelConfig(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=1,
        decoder_layers=2,
        dropout=0.0,
        max_source_positions=16,
        max_target_positions=12,
        share_all_embeddings=True,
    )
    model = Transformer(cfg, tokenizer.vocab_size, tokenizer.vocab_size)
    spm_tensor = tokenizer_to_tensor(tokenizer.model_bytes)
    save_checkpoint(
        {
            "format_version": 1,
            "model_config": asdict(cfg),
            "model": model.state_dict(),
            "data": {
                "src_lang": "en",
                "tgt_lang": "de",
                "src_vocab_size": tokenizer.vocab_size,
                "tgt_vocab_size": tokenizer.vocab_size,
                "joint_vocab": True,
                "special_ids": dict(SPECIAL_IDS),
                "normalization": {"nfkc": False},
            },
            "tokenizers": {"src": spm_tensor, "tgt": spm_tensor},
            "config": {},
        },
        path,
    )
    return path


@pytest.fixture(scope="module")
def ckpt(tmp_path_factory, tokenizer) -> Path:
    return _checkpoint(tmp_path_factory.mktemp("ckpt") / "a.pt", tokenizer, 0)


LONG = " ".join(WORDS * 2)  # far more than the model's 16 source positions


@pytest.fixture
def text(tmp_path) -> Path:
    lines = _sentences(7, 3)
    lines[2] = ""  # an empty line
    lines[5] = LONG
    path = tmp_path / "in.en"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def _generate(capsys, *args: str) -> tuple[list[str], str]:
    main("generate", [*args, "device=cpu"])
    out = capsys.readouterr()
    return out.out.splitlines(), out.err


def test_one_output_line_per_input_line_in_order(ckpt, text, capsys, tmp_path):
    lines = text.read_text(encoding="utf-8").splitlines()
    out, err = _generate(capsys, f"checkpoint={ckpt}", f"input={text}", "beam=3", "max_sentences=2")
    assert len(out) == len(lines)
    assert out[2] == ""
    assert "in.en:6: " in err and "truncat" in err  # the long line, with its line number
    assert "sentences/s" in err and "tokens/s" in err
    # Each line alone (interactive stdin, batches of one) gives the same translations.
    stdin = io.TextIOWrapper(io.BytesIO(text.read_bytes()), encoding="utf-8")
    monkey = pytest.MonkeyPatch()
    monkey.setattr(sys, "stdin", stdin)
    try:
        alone, _ = _generate(capsys, f"checkpoint={ckpt}", "beam=3")
    finally:
        monkey.undo()
    assert alone == out


def test_fairseq_format_nbest_and_alignments(ckpt, text, capsys, tokenizer):
    plain, _ = _generate(capsys, f"checkpoint={ckpt}", f"input={text}", "beam=3")
    out, _ = _generate(
        capsys,
        f"checkpoint={ckpt}",
        f"input={text}",
        "beam=3",
        "nbest=2",
        "format=fairseq",
        "print_alignment=true",
    )
    n = len(plain)
    by_kind = {k: [line for line in out if line.startswith(f"{k}-")] for k in "SHDPA"}
    assert len(by_kind["S"]) == n
    assert len(by_kind["H"]) == len(by_kind["D"]) == len(by_kind["P"]) == 2 * n - 1  # empty: one
    assert len(by_kind["A"]) == 2 * (n - 1)
    first_d = {}
    for line in by_kind["D"]:
        key, score, hyp = line.split("\t")
        first_d.setdefault(int(key[2:]), hyp)
        float(score)
    assert [first_d[i] for i in range(n)] == plain  # D- lines are the plain translations
    h0 = by_kind["H"][0].split("\t")
    p0 = by_kind["P"][0].split("\t")[1].split()
    assert len(p0) == len(h0[2].split()) + 1  # a score per piece, plus EOS
    assert float(h0[1]) == pytest.approx(sum(map(float, p0)) / len(p0), abs=1e-3)  # lenpen 1
    pairs = by_kind["A"][0].split("\t")[1].split()
    assert len(pairs) == len(h0[2].split()) and all("-" in p for p in pairs)


def test_moses_nbest_in_plain_format(ckpt, text, capsys):
    out, _ = _generate(capsys, f"checkpoint={ckpt}", f"input={text}", "beam=3", "nbest=3")
    n_lines = len(text.read_text().splitlines())
    ids = [int(line.split(" ||| ")[0]) for line in out]
    assert sorted(set(ids)) == list(range(n_lines))
    assert all(ids.count(i) == (1 if i == 2 else 3) for i in range(n_lines))  # 2 is empty


def test_reference_gives_bleu_and_output_file(ckpt, text, capsys, tmp_path):
    result = tmp_path / "out" / "hyp.de"
    out, err = _generate(
        capsys, f"checkpoint={ckpt}", f"input={text}", f"ref={text}", f"output={result}", "beam=2"
    )
    assert out == []
    assert len(result.read_text(encoding="utf-8").splitlines()) == len(
        text.read_text().splitlines()
    )
    assert "BLEU|nrefs:1|" in err and "version:" in err


def test_ensemble_prefix_sampling_and_uncached(ckpt, text, capsys, tmp_path, tokenizer):
    second = _checkpoint(tmp_path / "b.pt", tokenizer, 1)
    n = len(text.read_text().splitlines())
    for extra in (
        [f"checkpoint=[{ckpt},{second}]"],
        [f"checkpoint={ckpt}", "prefix=one two"],
        [f"checkpoint={ckpt}", "sampling=true", "sampling_topp=0.9", "temperature=0.7"],
        [f"checkpoint={ckpt}", "use_cache=false", "dtype=bf16"],
    ):
        out, _ = _generate(capsys, f"input={text}", "beam=2", *extra)
        assert len(out) == n
        if "prefix=one two" in extra:
            assert all(line.startswith("one two") for i, line in enumerate(out) if i != 2)
            assert out[2] == ""  # an empty input line stays empty


def _data_dir(path: Path, tokenizer: Tokenizer, src: list[str], tgt: list[str]) -> Path:
    """A minimal data dir per docs/ARCHITECTURE.md, with a `test` split."""
    path.mkdir()
    (path / "spm.model").write_bytes(tokenizer.model_bytes)
    counts = {}
    for lang, lines in (("en", src), ("de", tgt)):
        ids = [tokenizer.encode(normalize_text(t, False)) + [EOS] for t in lines]
        writer = TokenArrayWriter(path / f"test.{lang}", np.uint16)
        writer.add(np.concatenate(ids), np.array([len(i) for i in ids]))
        writer.close()
        counts[lang] = sum(len(i) for i in ids)
    tok_info = {"file": "spm.model", "sha256": tokenizer.sha256}
    write_meta(
        path,
        DataMeta(
            src_lang="en",
            tgt_lang="de",
            joint_vocab=True,
            src_vocab_size=tokenizer.vocab_size,
            tgt_vocab_size=tokenizer.vocab_size,
            special_ids=dict(SPECIAL_IDS),
            dtype="uint16",
            tokenizers={"src": tok_info, "tgt": tok_info},
            normalization={"nfkc": False},
            splits={
                "test": SplitInfo(
                    lines=len(src),
                    kept=len(src),
                    removed={},
                    src_tokens=counts["en"],
                    tgt_tokens=counts["de"],
                )
            },
        ),
    )
    return path


def test_data_dir_split_with_references(ckpt, capsys, tmp_path, tokenizer):
    src = _sentences(5, 8) + [""]
    data = _data_dir(tmp_path / "data", tokenizer, src, _sentences(6, 9))
    out, err = _generate(
        capsys, f"checkpoint={ckpt}", f"input={data}", "split=test", "format=fairseq", "beam=2"
    )
    assert [line for line in out if line.startswith("T-")][0] == f"T-0\t{_sentences(6, 9)[0]}"
    assert len([line for line in out if line.startswith("S-")]) == 6
    assert "BLEU|nrefs:1|" in err


def _error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main("generate", [*args, "device=cpu"])
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("nmt-generate: error: ")
    return err[0]


def test_errors_are_one_line_and_leave_no_output(ckpt, text, capsys, tmp_path, tokenizer):
    result = tmp_path / "hyp.de"
    err = _error(
        capsys, f"checkpoint={ckpt}", f"input={text}", "overlong=error", f"output={result}"
    )
    assert "in.en:6" in err and "overlong=truncate" in err
    assert not result.exists() and list(tmp_path.glob(".hyp.de*")) == []
    assert "nope.pt" in _error(capsys, f"checkpoint={tmp_path / 'nope.pt'}", f"input={text}")
    assert "no.en" in _error(capsys, f"checkpoint={ckpt}", f"input={tmp_path / 'no.en'}")
    short = tmp_path / "short.de"
    short.write_text("one\n", encoding="utf-8")
    err = _error(capsys, f"checkpoint={ckpt}", f"input={text}", f"ref={short}")
    assert "1 lines" in err and "has 7" in err
    assert "fp16" in _error(capsys, f"checkpoint={ckpt}", f"input={text}", "dtype=fp16")
    assert "split=" in _error(capsys, f"checkpoint={ckpt}", f"input={tmp_path}")
    assert "nbest" in _error(capsys, f"checkpoint={ckpt}", "beam=2", "nbest=3")
    other = train_tokenizer(
        _sentences(300, 5) + ["zebra quartz"] * 50,
        vocab_size=34,
        model_type="unigram",
        character_coverage=1.0,
        byte_fallback=False,
        input_sentence_size=0,
        user_defined_symbols=[],
        num_threads=1,
        seed=1,
        what="other text",
    )
    data = _data_dir(tmp_path / "data", other, ["one"], ["eins"])
    assert "SentencePiece" in _error(capsys, f"checkpoint={ckpt}", f"input={data}", "split=test")
