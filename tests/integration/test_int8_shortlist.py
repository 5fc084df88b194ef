"""precision=int8, shortlist= and fp32 on oneDNN's GEMM through the commands, on a small
model trained here on the demo corpus: BLEU on the demo's test split stays within
BLEU_TOLERANCE of fp32's on torch's GEMM, int8
translations are deterministic and batch-independent, nmt-shortlist's file feeds both
nmt-generate and nmt-export, and every bad option is one line with exit code 2.

BLEU_TOLERANCE: measured on this fixture (BLEU ~46 after 150 updates), int8 moved BLEU by
-0.2 and the shortlist by less; on the full demo model (BLEU 96.6) neither moved it at
all (0 and 2 of 500 translations differed). The test split's references hold ~3,460
tokens in 500 sentences, so one translation that changes a word changes up to 4 of its
n-grams and moves corpus BLEU by about 0.1-0.3: 1.0 lets a handful of near-ties flip
either way, while an int8 or shortlist bug (a wrong scale, a lost candidate, a mask on
the wrong row) costs tens of points.
"""

from __future__ import annotations

import importlib.util
import re
import subprocess
import sys
from pathlib import Path

import pytest

from nmt import Translator
from nmt.cli import main
from nmt.model.config import ModelConfig
from nmt.model.packed import FP32_GEMM_ENV, onednn_fp32_available
from nmt.runtime import int8_engine
from nmt.scoring import corpus_bleu
from nmt.training.config import OptimConfig
from tests.helpers import run_training, tiny_config

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(int8_engine() is None, reason="this torch has no fbgemm int8 kernels"),
]

BLEU_TOLERANCE = 1.0
SEARCH = ["beam=5", "max_len_a=1.5", "max_len_b=10", "device=cpu", "progress=false"]


@pytest.fixture(scope="module")
def model(demo_data_dir, tmp_path_factory) -> Path:
    """A 2+2-layer, 64-dim model trained for 150 updates on the demo's 10,000 pairs (~30
    CPU-seconds): it has learned enough for BLEU differences to mean something."""
    run = tmp_path_factory.mktemp("int8-run")
    cfg = ModelConfig(
        embed_dim=64,
        ffn_dim=256,
        attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.1,
        share_all_embeddings=True,
    )
    optim = OptimConfig(lr=3e-3, warmup_updates=50, warmup_init_lr=1e-4)
    run_training(
        tiny_config(
            demo_data_dir,
            run,
            model=cfg,
            optim=optim,
            train_split="train",
            max_tokens=2048,
            max_update=150,
        )
    )
    return run / "checkpoint_last.pt"


@pytest.fixture(scope="module")
def shortlist(demo_data_dir, tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("shortlist") / "shortlist.txt"
    main("shortlist", [f"data={demo_data_dir}", f"output={out}", "progress=false"])
    return out


def _bleu(model: Path, demo_data_dir: Path, demo_corpus: Path, out: Path, *options: str) -> float:
    """nmt-generate on the test split with `options`; BLEU of its output file."""
    args = [f"checkpoint={model}", f"input={demo_data_dir}", "split=test", f"output={out}"]
    main("generate", [*args, *SEARCH, *options])
    refs = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()
    return corpus_bleu(out.read_text(encoding="utf-8").splitlines(), [refs]).score


def test_int8_and_the_shortlist_keep_the_demo_bleu(
    model, shortlist, demo_data_dir, demo_corpus, tmp_path
):
    fp32 = _bleu(model, demo_data_dir, demo_corpus, tmp_path / "fp32.de")
    assert fp32 > 30  # the model translates: a comparison with it means something
    int8 = _bleu(model, demo_data_dir, demo_corpus, tmp_path / "int8.de", "precision=int8")
    assert abs(int8 - fp32) <= BLEU_TOLERANCE, (fp32, int8)
    both = _bleu(
        model,
        demo_data_dir,
        demo_corpus,
        tmp_path / "int8sl.de",
        "precision=int8",
        f"shortlist={shortlist}",
    )
    assert abs(both - fp32) <= BLEU_TOLERANCE, (fp32, both)
    fp32_shortlist = _bleu(
        model, demo_data_dir, demo_corpus, tmp_path / "fp32sl.de", f"shortlist={shortlist}"
    )
    assert abs(fp32_shortlist - fp32) <= BLEU_TOLERANCE, (fp32, fp32_shortlist)


def test_fp32_on_onednn_keeps_the_demo_bleu(
    model, shortlist, demo_data_dir, demo_corpus, tmp_path, monkeypatch
):
    """nmt.model.packed: fp32 on oneDNN's GEMM (every call of every layer) against torch's
    rounds differently, so a near-tie may flip, within BLEU_TOLERANCE; most translations
    are the same, with the shortlist too."""
    if not onednn_fp32_available():
        pytest.skip("this torch has no oneDNN fp32 linear")
    monkeypatch.setattr("nmt.model.packed.ONEDNN_MIN_MACS", 1)
    outputs = {}
    for gemm in ("torch", "onednn"):
        monkeypatch.setenv(FP32_GEMM_ENV, gemm)
        for options in ((), (f"shortlist={shortlist}",)):
            out = tmp_path / f"{gemm}{len(options)}.de"
            outputs[gemm, options] = _bleu(model, demo_data_dir, demo_corpus, out, *options)
            outputs[gemm, options, "text"] = out.read_text(encoding="utf-8").splitlines()
    for options in ((), (f"shortlist={shortlist}",)):
        torch_bleu, onednn_bleu = outputs["torch", options], outputs["onednn", options]
        assert torch_bleu > 30 and abs(onednn_bleu - torch_bleu) <= BLEU_TOLERANCE, options
        pairs = zip(outputs["torch", options, "text"], outputs["onednn", options, "text"])
        assert sum(a == b for a, b in pairs) >= 0.95 * 500, options


@pytest.mark.parametrize("beam", [4, 1])
def test_int8_translations_are_deterministic_and_batch_independent(model, demo_corpus, beam):
    """Bit for bit: int8 layers quantize each row on its own, and attention over padded
    keys runs each length's rows on their own (FastKernels.rows_alone), so nothing of a
    batch's other sentences reaches a row: alone, in another order or in other batches."""
    texts = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:40]
    kw = dict(device="cpu", precision="int8", beam=beam, nbest=min(beam, 2))
    kw.update(max_len_a=1.5, max_len_b=10)
    first = Translator.from_checkpoint(model, **kw)
    want = first.translate_batch(texts, return_scores=True)

    def flat(results):
        return [[(t.pieces, t.score, t.token_scores) for t in per] for per in results]

    again = Translator.from_checkpoint(model, **kw)  # quantized anew: the same weights
    assert flat(again.translate_batch(texts, return_scores=True)) == flat(want)
    one_by_one = Translator.from_checkpoint(model, max_sentences=1, **kw)
    alone = [one_by_one.translate_batch([t], return_scores=True)[0] for t in texts]
    assert flat(alone) == flat(want)
    shuffled = first.translate_batch(texts[::-1], return_scores=True)[::-1]
    assert flat(shuffled) == flat(want)
    budget = Translator.from_checkpoint(model, max_tokens=40, **kw)
    assert flat(budget.translate_batch(texts, return_scores=True)) == flat(want)


def test_the_shortlist_goes_into_the_ctranslate2_export(model, shortlist, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    out = tmp_path / "ct2"
    main("export", [f"checkpoint={model}", f"output_dir={out}", f"vmap={shortlist}"])
    assert (out / "vmap.txt").read_bytes() == shortlist.read_bytes()
    translator = ctranslate2.Translator(str(out), device="cpu", compute_type="float32")
    result = translator.translate_batch([["▁one", "▁hundred", "."]], use_vmap=True)
    assert result[0].hypotheses[0]
    # vmap.txt is the export's own file: overwrite=true replaces such an export, and the
    # new one (no vmap=) does not keep the old vocabulary map
    main("export", [f"checkpoint={model}", f"output_dir={out}", "overwrite=true"])
    assert (out / "nmt_export.json").is_file() and not (out / "vmap.txt").exists()


def _cli(command: str, *args: str) -> subprocess.CompletedProcess:
    code = f"import sys; from nmt.cli import main; main({command!r}, sys.argv[1:])"
    return subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=300
    )


def test_bad_options_are_one_line(model, shortlist, demo_data_dir, tmp_path):
    text = tmp_path / "in.en"
    text.write_text("one hundred.\n", encoding="utf-8")
    bad = tmp_path / "bad.txt"
    bad.write_text("\t▁a\nno tab here\n", encoding="utf-8")
    cases = [
        (
            ("generate", f"checkpoint={model}", f"input={text}", f"shortlist={tmp_path}/no.txt"),
            r"nmt-generate: error: shortlist=.*no\.txt: no such file; build one with nmt-shortlist",
        ),
        (
            ("generate", f"checkpoint={model}", f"input={text}", f"shortlist={bad}"),
            r"nmt-generate: error: .*bad\.txt:2: no tab; each line is",
        ),
        (
            ("train", f"data={demo_data_dir}", f"save_dir={tmp_path}/run", "precision=int8"),
            r"nmt-train: error: precision=int8: for translation only",
        ),
        (
            ("generate", f"checkpoint={model}", f"input={text}", "precision=int4"),
            r"nmt-generate: error: precision=int4: unknown; use one of fp32, bf16, fp16, auto, int8",
        ),
        (
            ("generate", f"checkpoint={model}", f"input={text}", "score_reference=true")
            + (f"ref={text}", f"shortlist={shortlist}"),
            r"nmt-generate: error: shortlist=.*: scoring uses the whole target vocabulary",
        ),
        (
            ("shortlist", f"data={demo_data_dir}", f"output={shortlist}"),
            r"nmt-shortlist: error: output=.*: already exists; .* overwrite=true",
        ),
        (
            ("shortlist", f"data={demo_data_dir}", "split=nosuch", f"output={tmp_path}/s.txt"),
            r"nmt-shortlist: error: split=nosuch: not in .*; choose one of",
        ),
        (
            ("shortlist", f"data={demo_data_dir}", "topk=0"),
            r"nmt-shortlist: error: topk=0: must be 1 or more",
        ),
    ]
    if importlib.util.find_spec("ctranslate2") is not None:
        cases.append(
            (
                ("export", f"checkpoint={model}", f"output_dir={tmp_path}/x", f"vmap={bad}"),
                r"nmt-export: error: .*bad\.txt:2: no tab",
            )
        )
    for (command, *args), message in cases:
        done = _cli(command, *args)
        assert done.returncode == 2, (args, done.stderr)
        lines = done.stderr.strip().splitlines()
        assert len(lines) == 1 and re.match(message, lines[0]), lines
    assert not (tmp_path / "run").exists() and not (tmp_path / "x").exists()
