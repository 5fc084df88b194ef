"""nmt-generate with a multilingual model (tests/multilingual_checkpoint.py): tgt_lang=,
tgt_lang_file= and src_lang= translate as the Python API does, in every output format and
with workers; a multilingual data dir split by its direction; every mistake is a one-line
error, before the model loads where it can be."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from nmt import Translator
from nmt.data.binarize import TokenArrayWriter
from nmt.data.meta import DataMeta, SplitInfo, write_meta
from nmt.data.tokenizer import normalize_text
from nmt.generation.chunks import ChunkOutput
from nmt.generation.config import GenerateConfig
from nmt.generation.workfolder import WorkFolder
from nmt.vocab import EOS, SPECIAL_IDS
from tests.multilingual_checkpoint import (
    joint_tokenizer,
    multilingual_checkpoint,
    sentences,
)

pytestmark = pytest.mark.usefixtures("one_thread")

BASE = ("device=cpu", "beam=2", "max_sentences=3", "buffer_size=4")
LINES = [*sentences("en", 6, 5), "", "<2fr> one two", *sentences("en", 3, 6)]
CODES = ["fr", "de", "fr", "en", "de", "fr", "de", "de", "fr", "de", "fr"]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(f"{line}\n" for line in lines), encoding="utf-8")
    return path


def one_line_error(code: int, err: str, *needles: str) -> str:
    lines = err.strip().splitlines()
    assert code == 2, err
    assert len(lines) == 1 and lines[0].startswith("nmt-generate: error: "), err
    for needle in needles:
        assert needle in lines[0], (needle, lines[0])
    return lines[0]


@pytest.fixture(scope="module", params=["tgt", "decoder"])
def ckpt(request, tmp_path_factory) -> Path:
    return multilingual_checkpoint(tmp_path_factory.mktemp("ml") / "m.pt", request.param)


@pytest.fixture(scope="module")
def translator(ckpt) -> Translator:
    return Translator.from_checkpoint(ckpt, device="cpu", beam=2, nbest=2, max_sentences=3)


@pytest.fixture
def src(tmp_path) -> Path:
    return write_lines(tmp_path / "in.en", LINES)


@pytest.fixture
def codes(tmp_path) -> Path:
    return write_lines(tmp_path / "langs.txt", CODES)


def test_cli_translates_as_the_api(nmt_cli, ckpt, translator, src, codes):
    code, out, err = nmt_cli("generate", f"checkpoint={ckpt}", f"input={src}", "tgt_lang=fr", *BASE)
    assert code == 0, err
    assert out.splitlines() == translator.translate(LINES, tgt_lang="fr")
    code, mixed, err = nmt_cli(
        "generate", f"checkpoint={ckpt}", f"input={src}", f"tgt_lang_file={codes}", *BASE
    )
    assert code == 0, err
    assert mixed.splitlines() == translator.translate(LINES, tgt_lang=CODES)
    # each line's language is its own: the lines into fr are those of tgt_lang=fr
    for got, want, lang in zip(mixed.splitlines(), out.splitlines(), CODES):
        assert lang != "fr" or got == want
    # the n-best with scores and alignments: the API's, without a tag anywhere
    code, fairseq, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        f"input={src}",
        f"tgt_lang_file={codes}",
        "format=fairseq",
        "nbest=2",
        "print_alignment=true",
        *BASE,
    )
    assert code == 0, err
    want = translator.translate_batch(LINES, tgt_lang=CODES, return_scores=True)
    h_lines = [line.split("\t") for line in fairseq.splitlines() if line.startswith("H-")]
    got_h = [(int(k[2:]), float(score), pieces) for k, score, pieces in h_lines]
    want_h = [(i, t.score, " ".join(t.pieces)) for i, per in enumerate(want) for t in per]
    assert [(i, p) for i, _, p in got_h] == [(i, p) for i, _, p in want_h]
    assert [s for _, s, _ in got_h] == pytest.approx([s for _, s, _ in want_h], abs=1e-4)
    assert "<2" not in "".join(p for _, _, p in got_h)


def test_score_reference_scores_in_the_language_given(nmt_cli, ckpt, translator, src, codes):
    refs = write_lines(src.parent / "ref.txt", [line.upper() for line in LINES])
    code, out, err = nmt_cli(
        "generate",
        f"checkpoint={ckpt}",
        f"input={src}",
        f"ref={refs}",
        "score_reference=true",
        f"tgt_lang_file={codes}",
        *BASE,
    )
    assert code == 0, err
    want = translator.score(LINES, [t.upper() for t in LINES], tgt_lang=CODES)
    assert [float(x) for x in out.splitlines()] == pytest.approx([s.score for s in want], abs=1e-3)


def test_workers_write_the_bytes_of_one_process_and_resume_by_language(
    nmt_cli, ckpt, src, codes, tmp_path
):
    args = (f"checkpoint={ckpt}", f"input={src}", f"tgt_lang_file={codes}", *BASE)
    code, one, err = nmt_cli("generate", *args)
    assert code == 0, err
    out = tmp_path / "out.txt"
    code, _, err = nmt_cli("generate", *args, f"output={out}", "workers=2", "device=cpu")
    assert code == 0, err
    assert out.read_text(encoding="utf-8") == one
    # a work folder left by a run into another language is never mixed in
    for options, left in (
        ({"tgt_lang": "de"}, "tgt_lang=de"),
        ({"tgt_lang_file": str(codes)}, "tgt_lang_file="),
    ):
        stale = GenerateConfig(
            checkpoint=str(ckpt),
            input=str(src),
            output=str(out),
            beam=2,
            max_sentences=3,
            buffer_size=4,
            device="cpu",
            **options,
        )
        folder = WorkFolder(stale)
        folder.save(ChunkOutput(0, 4, "x\n" * 4, [], 4, ["x"] * 4))
        if "tgt_lang_file" in options:  # the same option, the file changed since
            write_lines(codes, ["de"] * len(CODES))
        code, _, err = nmt_cli(
            "generate",
            f"checkpoint={ckpt}",
            f"input={src}",
            *(["tgt_lang=fr"] if "tgt_lang" in options else [f"tgt_lang_file={codes}"]),
            *BASE,
            f"output={out}",
            "workers=2",
        )
        one_line_error(code, err, str(folder.path), left, "resume=false")
        folder.remove()


def test_language_mistakes_are_one_line_errors(nmt_cli, ckpt, src, codes, tmp_path):
    run = ("generate", f"checkpoint={ckpt}", f"input={src}", *BASE)
    code, _, err = nmt_cli(*run)
    one_line_error(code, err, "tgt_lang: required", "give one of en, de, fr")
    code, _, err = nmt_cli(*run, "tgt_lang=it")
    one_line_error(code, err, "tgt_lang=it: the model does not translate into it", "en, de, fr")
    code, _, err = nmt_cli(*run, "tgt_lang=fr", "src_lang=it")
    one_line_error(code, err, "src_lang=it: the model does not translate from it")
    code, _, err = nmt_cli(*run, "tgt_lang=fr", f"tgt_lang_file={codes}")
    one_line_error(code, err, "tgt_lang_file=", "given together with tgt_lang=")
    bad = write_lines(tmp_path / "bad.txt", CODES[:3] + ["it"] + CODES[4:])
    out = tmp_path / "out.txt"
    code, _, err = nmt_cli(*run, f"tgt_lang_file={bad}", f"output={out}")
    one_line_error(code, err, f"{bad}:4: tgt_lang=it: the model does not translate into it")
    assert not out.exists()  # checked before anything is translated


def test_file_mistakes_are_found_before_the_model_loads(nmt_cli, src, tmp_path):
    missing = tmp_path / "no-such-model.pt"  # never reached: the files are refused first
    run = ("generate", f"checkpoint={missing}", f"input={src}", *BASE)
    short = write_lines(tmp_path / "short.txt", CODES[:-1])
    code, _, err = nmt_cli(*run, f"tgt_lang_file={short}")
    one_line_error(code, err, f"{short}: {len(CODES) - 1} lines", f"has {len(CODES)}")
    spelled = write_lines(tmp_path / "spelled.txt", CODES[:2] + ["en-de"] + CODES[3:])
    code, _, err = nmt_cli(*run, f"tgt_lang_file={spelled}")
    one_line_error(code, err, f"{spelled}:3: tgt_lang=en-de: not a language code")
    code, _, err = nmt_cli(*run, "tgt_lang=en-de")
    one_line_error(code, err, "tgt_lang=en-de: not a language code")


def test_a_single_pair_model_refuses_another_language(nmt_cli, src, tmp_path):
    pair = multilingual_checkpoint(tmp_path / "pair.pt", None)
    run = ("generate", f"checkpoint={pair}", f"input={src}", *BASE)
    code, plain, err = nmt_cli(*run)
    assert code == 0, err
    code, own, err = nmt_cli(*run, "tgt_lang=de")
    assert code == 0 and own == plain, err
    code, _, err = nmt_cli(*run, "tgt_lang=fr")
    one_line_error(code, err, "tgt_lang=fr: this model translates en-de only")


def _multilingual_data_dir(path: Path) -> Path:
    """A multilingual data dir as docs/ARCHITECTURE.md describes it: the pair en-de stored
    once as split `test.en-de`, read either way."""
    tokenizer = joint_tokenizer()
    path.mkdir()
    (path / "spm.model").write_bytes(tokenizer.model_bytes)
    counts = {}
    for lang in ("en", "de"):
        ids = [tokenizer.encode(normalize_text(t, False)) + [EOS] for t in sentences(lang, 5, 7)]
        writer = TokenArrayWriter(path / f"test.en-de.{lang}", np.uint16)
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
                "test.en-de": SplitInfo(
                    lines=5,
                    kept=5,
                    removed={},
                    src_tokens=counts["en"],
                    tgt_tokens=counts["de"],
                    langs=["en", "de"],
                )
            },
            langs=["en", "de", "fr"],
            directions={"en-de": "en-de", "de-en": "en-de"},
            lang_tags={lang: f"<2{lang}>" for lang in ("en", "de", "fr")},
        ),
    )
    return path


def test_a_multilingual_data_dir_split_by_direction(nmt_cli, ckpt, translator, tmp_path):
    data = _multilingual_data_dir(tmp_path / "data")
    run = ("generate", f"checkpoint={ckpt}", f"input={data}", "split=test", *BASE)
    for src_lang, tgt_lang in (("en", "de"), ("de", "en")):
        code, out, err = nmt_cli(
            *run, f"src_lang={src_lang}", f"tgt_lang={tgt_lang}", "format=fairseq"
        )
        assert code == 0, err
        sources = sentences(src_lang, 5, 7)
        assert [ln.split("\t")[1] for ln in out.splitlines() if ln.startswith("S-")] == sources
        assert [ln.split("\t")[1] for ln in out.splitlines() if ln.startswith("T-")] == sentences(
            tgt_lang, 5, 7
        )
        want = translator.translate(sources, tgt_lang=tgt_lang)
        got = [ln.split("\t")[2] for ln in out.splitlines() if ln.startswith("D-")]
        assert got == want
    code, _, err = nmt_cli(*run, "tgt_lang=de")
    one_line_error(code, err, "split=test", "src_lang= is not given")
    code, _, err = nmt_cli(*run, "src_lang=en", "tgt_lang=fr")
    one_line_error(code, err, "tgt_lang=fr", "no direction en-fr", "en-de, de-en")


def test_the_manifest_names_the_languages(ckpt, src, codes, tmp_path):
    cfg = GenerateConfig(
        checkpoint=str(ckpt), input=str(src), output=str(tmp_path / "o"), tgt_lang_file=str(codes)
    )
    manifest = json.loads(json.dumps(WorkFolder(cfg).manifest))
    assert manifest["options"]["tgt_lang_file"] == str(codes)
    assert manifest["files"]["tgt_lang_file"][0] == str(codes.resolve())
