"""On a trained tiny model, CTranslate2 (fp32, same beam, length penalty and max length)
translates the demo test split exactly as nmt-generate does, with the same scores."""

from __future__ import annotations

from pathlib import Path

import pytest

ctranslate2 = pytest.importorskip("ctranslate2")

from nmt.cli import main  # noqa: E402
from nmt.data.tokenizer import Tokenizer  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
DEMO = ROOT / "data" / "demo"


def parse_fairseq_h_lines(path: Path) -> dict[int, tuple[float, list[str]]]:
    """`H-<i>\\t<score>\\t<pieces>` lines -> {i: (score, pieces)}."""
    out = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        if line.startswith("H-"):
            head, score, *rest = line.split("\t")
            out[int(head[2:])] = (float(score), rest[0].split() if rest and rest[0] else [])
    return out


@pytest.mark.slow
def test_ctranslate2_equals_nmt_generate_on_the_test_split(tmp_path):
    data, run = tmp_path / "data-bin", tmp_path / "run"
    main(
        "preprocess",
        [
            f"data.trainpref={DEMO / 'train'}",
            f"data.validpref={DEMO / 'valid'}",
            f"data.testpref=[{DEMO / 'test'}]",
            f"data.dest={data}",
            "spm.vocab_size=500",
        ],
    )
    main(
        "train",
        [
            f"data={data}",
            f"save_dir={run}",
            "model=transformer_tiny",
            "model.embed_dim=64",
            "model.ffn_dim=128",
            "model.dropout=0.1",
            "optim.lr=0.003",
            "optim.warmup_updates=50",
            "max_update=200",
            "validation.split=",
            "device=cpu",
            "threads=2",
            "logging.progress_bar=false",
            "logging.tensorboard=false",
            "checkpoint.keep_last=1",
        ],
    )
    checkpoint = run / "checkpoint_last.pt"
    hyp = tmp_path / "nmt.out"
    beam, lenpen, max_len = 5, 1.0, 200
    # min_len=0 / min_decoding_length=0: while </s> is forbidden, nmt (as fairseq) removes it
    # after the softmax and CTranslate2 before it, which moves scores by up to p(</s>) / length
    # (5e-4 on a model this briefly trained); translations are the same either way.
    main(
        "generate",
        [
            f"checkpoint={checkpoint}",
            f"input={DEMO / 'test.en'}",
            f"output={hyp}",
            "format=fairseq",
            f"beam={beam}",
            f"lenpen={lenpen}",
            "max_len_a=0",
            f"max_len_b={max_len}",
            "min_len=0",
            "device=cpu",
            "threads=2",
            "progress=false",
        ],
    )
    main("export", [f"checkpoint={checkpoint}", f"output_dir={tmp_path / 'ct2'}"])

    nmt = parse_fairseq_h_lines(hyp)
    tok = Tokenizer.from_file(tmp_path / "ct2" / "spm.model")
    sources = (DEMO / "test.en").read_text(encoding="utf-8").splitlines()
    translator = ctranslate2.Translator(
        str(tmp_path / "ct2"), device="cpu", compute_type="float32", intra_threads=2
    )
    results = translator.translate_batch(
        [tok.encode_as_pieces(" ".join(s.split())) for s in sources],
        beam_size=beam,
        length_penalty=lenpen,
        max_decoding_length=max_len,
        min_decoding_length=0,
        return_scores=True,
        max_batch_size=64,
    )
    assert len(nmt) == len(sources) == len(results)
    lengths = []
    for i, result in enumerate(results):
        score, pieces = nmt[i]
        assert result.hypotheses[0] == pieces, f"sentence {i}"
        assert abs(result.scores[0] - score) < 1e-4, f"sentence {i}"  # nmt prints 4 decimals
        lengths.append(len(pieces))
    assert sum(lengths) / len(lengths) > 5  # real translations, not empty ones
