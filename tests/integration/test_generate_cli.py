"""nmt-generate end to end on a checkpoint built here: a randomly initialised tiny
Transformer with a SentencePiece model trained in the test, saved per the checkpoint format."""

from __future__ import annotations

import io
import random
import re
import shutil
import sys
from dataclasses import asdict
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt import runtime
from nmt.checkpoint import save_checkpoint, tokenizer_to_tensor
from nmt.cli import main
from nmt.data.binarize import TokenArrayWriter
from nmt.data.meta import DataMeta, SplitInfo, write_meta
from nmt.data.tokenizer import Tokenizer, normalize_text
from nmt.generation.chunks import chunk_seed
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, SPECIAL_IDS
from tests.helpers import unigram_tokenizer

WORDS = (
    "one two three four five six seven eight nine ten eleven twelve hundred thousand and".split()
)


pytestmark = pytest.mark.usefixtures("one_thread")


def _sentences(n: int, seed: int) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(n)]


@pytest.fixture(scope="module")
def tokenizer() -> Tokenizer:
    return unigram_tokenizer(_sentences(300, 0), 32)


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


def test_auto_precision_translates_as_the_precision_it_names(ckpt, text, capsys):
    """precision=auto is bf16 on a CPU with native bf16, fp32 elsewhere: the same output,
    and a note on stderr says which."""
    named = "bf16" if runtime.native_bf16(torch.device("cpu")) else "fp32"
    args = (f"checkpoint={ckpt}", f"input={text}", "beam=3")
    auto, err = _generate(capsys, *args, "precision=auto")
    assert f"nmt-generate: note: precision=auto: {named} (this CPU " in err
    assert auto == _generate(capsys, *args, f"precision={named}")[0]


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
    assert "fp16" in _error(capsys, f"checkpoint={ckpt}", f"input={text}", "precision=fp16")
    assert "split=" in _error(capsys, f"checkpoint={ckpt}", f"input={tmp_path}")
    assert "nbest" in _error(capsys, f"checkpoint={ckpt}", "beam=2", "nbest=3")
    other = unigram_tokenizer(_sentences(300, 5) + ["zebra quartz"] * 50, 34, "other text")
    data = _data_dir(tmp_path / "data", other, ["one"], ["eins"])
    assert "SentencePiece" in _error(capsys, f"checkpoint={ckpt}", f"input={data}", "split=test")


# -- the Translator API and nmt-generate agree; prefixes, forced scoring, precision ----------


@pytest.fixture(scope="module")
def trained(demo_data_dir, tmp_path_factory) -> Path:
    """A tiny model trained for a few seconds on the demo data: outputs of varied lengths."""
    from tests.helpers import run_training, tiny_config

    run = tmp_path_factory.mktemp("generate-run")
    run_training(tiny_config(demo_data_dir, run, max_update=60))
    return run / "checkpoint_last.pt"


@pytest.fixture
def demo_text(demo_corpus, tmp_path) -> Path:
    lines = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    lines[4] = ""
    path = tmp_path / "demo.en"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


SEARCH_ARGS = ("beam=3", "max_len_a=1.0", "max_len_b=5")
SEARCH_KW = dict(beam=3, max_len_a=1.0, max_len_b=5)


def test_translator_equals_the_cli_line_for_line(trained, demo_text, capsys):
    from nmt import Translator

    lines = demo_text.read_text(encoding="utf-8").splitlines()
    plain, _ = _generate(capsys, f"checkpoint={trained}", f"input={demo_text}", *SEARCH_ARGS)
    translator = Translator.from_checkpoint(trained, device="cpu", **SEARCH_KW)
    assert translator.translate(lines) == plain
    # max_sentences=2 on the command line: other batches, the same lines
    small, _ = _generate(
        capsys, f"checkpoint={trained}", f"input={demo_text}", "max_sentences=2", *SEARCH_ARGS
    )
    assert small == plain
    # a call's own options: Translator.from_checkpoint(ck).translate(texts, beam=1) is
    # nmt-generate ... beam=1; the command samples each chunk of buffer_size lines (one
    # here) from its own stream, seeded from (seed, its first line's index)
    greedy, _ = _generate(
        capsys, f"checkpoint={trained}", f"input={demo_text}", *SEARCH_ARGS, "beam=1", "lenpen=0.5"
    )
    assert translator.translate(lines, beam=1, lenpen=0.5) == greedy
    sampled, _ = _generate(
        capsys, f"checkpoint={trained}", f"input={demo_text}", *SEARCH_ARGS, "sampling=true"
    )
    assert translator.translate(lines, sampling=True, seed=chunk_seed(1, 0)) == sampled


def test_translate_batch_matches_the_fairseq_format(trained, demo_text, capsys):
    from nmt import Translator

    lines = demo_text.read_text(encoding="utf-8").splitlines()
    out, _ = _generate(
        capsys,
        f"checkpoint={trained}",
        f"input={demo_text}",
        "nbest=3",
        "format=fairseq",
        "print_alignment=true",
        *SEARCH_ARGS,
    )
    translator = Translator.from_checkpoint(trained, device="cpu", nbest=3, **SEARCH_KW)
    results = translator.translate_batch(lines, return_scores=True, return_alignment=True)
    cli: dict[int, dict[str, list[list[str]]]] = {}
    for line in out:
        kind, rest = line.split("-", 1)
        index, *fields = rest.split("\t")
        cli.setdefault(int(index), {}).setdefault(kind, []).append(fields)
    assert sorted(cli) == list(range(len(lines)))
    for i, per_source in enumerate(results):
        if not lines[i]:
            assert cli[i]["H"] == [["0.0000", ""]] and per_source[0].pieces == []
            continue
        assert len(per_source) == len(cli[i]["H"]) == 3
        for t, h, d, p, a in zip(per_source, cli[i]["H"], cli[i]["D"], cli[i]["P"], cli[i]["A"]):
            assert h == [f"{t.score:.4f}", " ".join(t.pieces)]
            assert d == [f"{t.score:.4f}", t.text]
            assert p == [" ".join(f"{s:.4f}" for s in t.token_scores)]
            assert a == [" ".join(f"{s}-{tgt}" for s, tgt in t.alignment)]


def test_per_sentence_prefixes_from_a_file(trained, demo_text, capsys, tmp_path):
    from nmt import Translator

    lines = demo_text.read_text(encoding="utf-8").splitlines()
    prefixes = ["Sie", "", "zwei hundert", "Max", "Anna", "", "", "Er", "", "Ich", "", "Wir"]
    prefix_file = tmp_path / "prefix.de"
    prefix_file.write_text("\n".join(prefixes) + "\n", encoding="utf-8")
    out, _ = _generate(
        capsys,
        f"checkpoint={trained}",
        f"input={demo_text}",
        f"prefix_file={prefix_file}",
        "format=fairseq",
        "nbest=3",
        *SEARCH_ARGS,
    )
    translator = Translator.from_checkpoint(trained, device="cpu", nbest=3, **SEARCH_KW)
    api = translator.translate_batch(lines, prefixes=prefixes)
    hyps = [line.split("\t") for line in out if line.startswith("H-")]
    for i, prefix in enumerate(prefixes):
        mine = [h[2] for h in hyps if h[0] == f"H-{i}"]
        assert mine == [" ".join(t.pieces) for t in api[i]]
        if prefix and lines[i]:
            want = " ".join(translator.tgt_tokenizer.encode_as_pieces(prefix))
            assert all(m.startswith(want) for m in mine)  # every hypothesis
    plain, _ = _generate(
        capsys, f"checkpoint={trained}", f"input={demo_text}", f"prefix_file={prefix_file}"
    )
    assert plain[4] == ""  # an empty input line stays empty, prefix or not
    short = tmp_path / "short.de"
    short.write_text("Sie\n", encoding="utf-8")
    err = _error(capsys, f"checkpoint={trained}", f"input={demo_text}", f"prefix_file={short}")
    assert f"{short}: 1 lines, but input {demo_text} has 12" in err
    err = _error(
        capsys, f"checkpoint={trained}", f"prefix_file={short}", "prefix=Sie", f"input={demo_text}"
    )
    assert "prefix_file=" in err and "prefix=" in err


def test_score_reference_scores_the_references(trained, demo_text, demo_corpus, capsys):
    from nmt import Translator

    lines = demo_text.read_text(encoding="utf-8").splitlines()
    refs = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()[: len(lines)]
    ref = demo_text.with_suffix(".de")
    ref.write_text("\n".join(refs) + "\n", encoding="utf-8")
    args = (f"checkpoint={trained}", f"input={demo_text}", f"ref={ref}", "score_reference=true")
    plain, err = _generate(capsys, *args, "lenpen=0.5")
    assert "scored 12 sentence pairs" in err and "BLEU" not in err
    translator = Translator.from_checkpoint(trained, device="cpu", lenpen=0.5)
    scores = translator.score(lines, refs)  # an empty source is scored as the empty sentence
    assert plain == [f"{s.score:.4f}" for s in scores]
    out, _ = _generate(capsys, *args, "format=fairseq", "lenpen=0.5")
    by_kind = {k: [line.split("\t") for line in out if line.startswith(f"{k}-")] for k in "STHDP"}
    assert [t[1] for t in by_kind["T"]] == refs
    for s, h, d, p in zip(scores, by_kind["H"], by_kind["D"], by_kind["P"]):
        assert h[1:] == [f"{s.score:.4f}", " ".join(s.pieces)]
        assert d[1] == f"{s.score:.4f}"
        assert p[1] == " ".join(f"{x:.4f}" for x in s.token_scores)
    err = _error(capsys, f"checkpoint={trained}", f"input={demo_text}", "score_reference=true")
    assert "score_reference=true: there is nothing to score" in err
    assert "checkpoint=null: no checkpoint given" in _error(capsys, f"input={demo_text}")


def test_score_reference_on_a_data_dir_split(trained, demo_data_dir, capsys, tmp_path):
    from nmt import Translator
    from nmt.data.binarize import TokenArray
    from nmt.data.meta import split_prefix

    out, err = _generate(
        capsys,
        f"checkpoint={trained}",
        f"input={demo_data_dir}",
        "split=test",
        "score_reference=true",
    )
    src = TokenArray(split_prefix(demo_data_dir, "test", "en"))
    tgt = TokenArray(split_prefix(demo_data_dir, "test", "de"))
    assert len(out) == len(src) and "BLEU" not in err
    translator = Translator.from_checkpoint(trained, device="cpu")
    first = translator.score_ids([src[i] for i in range(20)], [tgt[i] for i in range(20)])
    assert out[:20] == [f"{h.score:.4f}" for h in first]
    assert [h.tokens.tolist() for h in first] == [tgt[i].tolist() for i in range(20)]
    no_target = tmp_path / "data"
    shutil.copytree(demo_data_dir, no_target)
    for suffix in ("bin", "idx"):
        (no_target / f"test.de.{suffix}").unlink()
    err = _error(
        capsys, f"checkpoint={trained}", f"input={no_target}", "split=test", "score_reference=true"
    )
    assert "score_reference=true: split test of" in err and "no de side" in err


def test_precision_and_its_deprecated_alias_dtype(trained, demo_text, capsys):
    base = (f"checkpoint={trained}", f"input={demo_text}", *SEARCH_ARGS)
    precision, err = _generate(capsys, *base, "precision=bf16")
    assert "dtype" not in err
    alias, err = _generate(capsys, *base, "dtype=bf16")
    assert alias == precision
    notes = [line for line in err.splitlines() if re.search(r"note: (dtype|precision)=", line)]
    alias_note = (
        "nmt-generate: note: dtype= is deprecated, renamed to precision= (removed in 0.3.0)"
    )
    if runtime.native_bf16(torch.device("cpu")):
        assert notes == [alias_note]
    else:  # a CPU without bf16 instructions: then the emulation note, under the new name
        assert len(notes) == 2 and notes[0] == alias_note
        assert notes[1].startswith("nmt-generate: note: precision=bf16: this CPU has no native")
    same, _ = _generate(capsys, *base, "precision=bf16", "dtype=bf16")
    assert same == precision
    err = _error(capsys, *base, "precision=bf16", "dtype=fp16")
    assert "precision=bf16, dtype=fp16:" in err and "give precision= only" in err
    assert "precision=fp16: needs a CUDA device" in _error(capsys, *base, "precision=fp16")
    assert "precision=fp8: unknown" in _error(capsys, *base, "precision=fp8")
