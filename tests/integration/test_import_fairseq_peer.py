"""With a real fairseq (the venv ../shared/bench/fairseq_peer.sh builds): train a few
fairseq updates, import the checkpoint, and check that nmt-generate translates the demo
test split exactly as fairseq-generate does. Skipped where that venv does not exist."""

from __future__ import annotations

import math
import os
import subprocess
from pathlib import Path

import pytest
import sentencepiece as spm

from nmt.cli import main

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"
VENV = Path(os.environ.get("FAIRSEQ_PEER", "/tmp/fairseq-peer")) / "venv" / "bin"


def _fairseq(tool: str, *args: str, cwd: Path) -> str:
    # fairseq 0.12 calls torch.load without weights_only, which torch >= 2.6 refuses for
    # its (trusted, just written) checkpoints; this restores the old default for fairseq only.
    env = dict(os.environ, TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD="1")
    done = subprocess.run(
        [str(VENV / tool), *args], cwd=cwd, capture_output=True, text=True, env=env
    )
    assert done.returncode == 0, f"{tool} failed:\n{done.stderr[-2000:]}"
    return done.stdout


def _fairseq_data(work: Path) -> None:
    """SentencePiece as fairseq users train it (spm's own ids), pieces, dict, binarized data."""
    spm.SentencePieceTrainer.train(
        input=f"{DEMO / 'train.en'},{DEMO / 'train.de'}",
        model_prefix=str(work / "spm"),
        vocab_size=500,
        model_type="unigram",
        character_coverage=1.0,
        num_threads=2,
        bos_id=-1,
        eos_id=-1,
        pad_id=-1,
        unk_id=0,
        minloglevel=2,
    )
    sp = spm.SentencePieceProcessor(model_file=str(work / "spm.model"))
    for split in ("train", "test"):
        for lang in ("en", "de"):
            lines = (DEMO / f"{split}.{lang}").read_text(encoding="utf-8").splitlines()
            (work / f"{split}.sp.{lang}").write_text(
                "".join(" ".join(sp.encode(line.strip(), out_type=str)) + "\n" for line in lines),
                encoding="utf-8",
            )
    pieces = [sp.id_to_piece(i) for i in range(1, sp.get_piece_size())]  # without <unk>
    (work / "dict.txt").write_text("".join(f"{p} 100\n" for p in pieces), encoding="utf-8")
    _fairseq(
        "fairseq-preprocess",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--trainpref",
        "train.sp",
        "--testpref",
        "test.sp",
        "--destdir",
        "bin",
        "--joined-dictionary",
        "--srcdict",
        "dict.txt",
        "--workers",
        "2",
        cwd=work,
    )


def _h_lines(text: str) -> dict[int, tuple[float, list[str]]]:
    out = {}
    for line in text.splitlines():
        if line.startswith("H-"):
            head, score, *rest = line.split("\t")
            out[int(head[2:])] = (float(score), rest[0].split() if rest and rest[0] else [])
    return out


@pytest.mark.slow
@pytest.mark.skipif(
    not (VENV / "fairseq-train").exists(),
    reason="no fairseq venv (run ../shared/bench/fairseq_peer.sh to build one)",
)
def test_nmt_generate_translates_an_imported_model_as_fairseq_generate(tmp_path):
    _fairseq_data(tmp_path)
    _fairseq(
        "fairseq-train",
        "bin",
        "--cpu",
        "--arch",
        "transformer",
        "--source-lang",
        "en",
        "--target-lang",
        "de",
        "--encoder-layers",
        "2",
        "--decoder-layers",
        "2",
        "--encoder-embed-dim",
        "64",
        "--decoder-embed-dim",
        "64",
        "--encoder-ffn-embed-dim",
        "128",
        "--decoder-ffn-embed-dim",
        "128",
        "--encoder-attention-heads",
        "4",
        "--decoder-attention-heads",
        "4",
        "--share-all-embeddings",
        "--dropout",
        "0.1",
        "--optimizer",
        "adam",
        "--adam-betas",
        "(0.9,0.98)",
        "--lr",
        "3e-3",
        "--lr-scheduler",
        "inverse_sqrt",
        "--warmup-updates",
        "50",
        "--criterion",
        "label_smoothed_cross_entropy",
        "--label-smoothing",
        "0.1",
        "--max-tokens",
        "4096",
        "--save-dir",
        "ckpt",
        "--no-epoch-checkpoints",
        "--disable-validation",
        "--max-update",
        "150",
        "--seed",
        "1",
        "--num-workers",
        "0",
        cwd=tmp_path,
    )
    fairseq_out = _fairseq(
        "fairseq-generate",
        "bin",
        "--path",
        "ckpt/checkpoint_last.pt",
        "--gen-subset",
        "test",
        "--beam",
        "5",
        "--lenpen",
        "1.0",
        "--max-len-a",
        "0",
        "--max-len-b",
        "200",
        "--batch-size",
        "64",
        "--cpu",
        cwd=tmp_path,
    )
    main(
        "import_fairseq",
        [
            f"checkpoint={tmp_path / 'ckpt' / 'checkpoint_last.pt'}",
            f"data_dir={tmp_path / 'bin'}",
            f"spm={tmp_path / 'spm.model'}",
            f"output={tmp_path / 'imported.pt'}",
        ],
    )
    main(
        "generate",
        [
            f"checkpoint={tmp_path / 'imported.pt'}",
            f"input={DEMO / 'test.en'}",
            f"output={tmp_path / 'nmt.out'}",
            "format=fairseq",
            "beam=5",
            "lenpen=1.0",
            "max_len_a=0",
            "max_len_b=200",
            "device=cpu",
            "progress=false",
        ],
    )

    theirs = _h_lines(fairseq_out)  # scores in base 2, as fairseq-generate prints them
    ours = _h_lines((tmp_path / "nmt.out").read_text(encoding="utf-8"))
    # fairseq-fixed 0.12.3 under torch 2.13 leaves out a few sentences (500 % 8 of them in
    # our runs); every sentence it does translate must match.
    assert len(ours) == 500 and len(theirs) >= 490
    differ = [i for i in theirs if ours[i][1] != theirs[i][1]]
    assert not differ, (
        f"{len(differ)} translations differ, e.g. {differ[0]}: "
        f"{ours[differ[0]][1]} vs {theirs[differ[0]][1]}"
    )
    for i in theirs:  # nmt prints natural-log scores with 4 decimals
        assert abs(ours[i][0] - theirs[i][0] * math.log(2)) < 2e-4, f"sentence {i}"
