"""nmt-export: the CTranslate2 model scores and translates exactly as the nmt model does."""

from __future__ import annotations

import json
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import torch

ctranslate2 = pytest.importorskip("ctranslate2")

from nmt.checkpoint import build_checkpoint, save_checkpoint  # noqa: E402
from nmt.data.tokenizer import Tokenizer  # noqa: E402
from nmt.errors import NmtError  # noqa: E402
from nmt.generation.config import SearchConfig  # noqa: E402
from nmt.generation.generator import SequenceGenerator  # noqa: E402
from nmt.interop.ctranslate2_export import export_ctranslate2  # noqa: E402
from nmt.model.config import ModelConfig  # noqa: E402
from nmt.model.transformer import Transformer  # noqa: E402
from nmt.vocab import BOS, EOS, PAD  # noqa: E402
from tests.helpers import unigram_tokenizer  # noqa: E402

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"


def _lines(split: str, lang: str, n: int) -> list[str]:
    with open(DEMO / f"{split}.{lang}", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _tokenizer(lines: list[str], size: int) -> Tokenizer:
    return unigram_tokenizer(lines, size)


@pytest.fixture(scope="module")
def tokenizers() -> dict[str, Tokenizer]:
    en, de = _lines("train", "en", 800), _lines("train", "de", 800)
    return {"joint": _tokenizer(en + de, 200), "en": _tokenizer(en, 120), "de": _tokenizer(de, 140)}


def _random_model(cfg: ModelConfig, src: Tokenizer, tgt: Tokenizer) -> Transformer:
    """A random model with every weight moved off its init (LayerNorms are 1/0 there)."""
    torch.manual_seed(0)
    model = Transformer(cfg, src.vocab_size, tgt.vocab_size).eval()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    return model


def _set_output_bias(model: Transformer, eos_bias: float) -> None:
    """Make one feature of the final hidden state constant 1 and let the output layer read
    it as a bias: <pad> and <s> at -100 (nmt never generates them and CTranslate2 is not
    told), </s> at eos_bias (so that random translations end)."""
    dec = model.decoder
    norm = dec.layer_norm if model.cfg.normalize_before else dec.layers[-1].final_layer_norm
    with torch.no_grad():
        norm.weight[0], norm.bias[0] = 0.0, 1.0
        out = dec.output_projection.weight  # [V,D]
        out[:, 0] = 0.0
        out[PAD] = out[BOS] = 0.0
        out[PAD, 0] = out[BOS, 0] = -100.0
        out[EOS, 0] = eos_bias


def _save(path: Path, model: Transformer, src: Tokenizer, tgt: Tokenizer) -> None:
    data = {
        "src_lang": "en",
        "tgt_lang": "de",
        "src_vocab_size": src.vocab_size,
        "tgt_vocab_size": tgt.vocab_size,
        "joint_vocab": src is tgt,
        "special_ids": {"bos": 0, "pad": 1, "eos": 2, "unk": 3},
        "normalization": {"nfkc": False},
    }
    save_checkpoint(
        build_checkpoint(
            model_state=model.state_dict(),
            model_config=asdict(model.cfg),
            data=data,
            src_tokenizer=src.model_bytes,
            tgt_tokenizer=tgt.model_bytes,
        ),
        path,
    )


def _checkpoint(path: Path, cfg: ModelConfig, src: Tokenizer, tgt: Tokenizer) -> Transformer:
    model = _random_model(cfg, src, tgt)
    _save(path, model, src, tgt)
    return model


def _batch(rows: list[list[int]]) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [PAD] * (width - len(r)) for r in rows])


VARIANTS = {
    "post-norm, shared": dict(cfg=dict(share_all_embeddings=True), joint=True),
    "pre-norm, shared": dict(
        cfg=dict(share_all_embeddings=True, normalize_before=True), joint=True
    ),
    "post-norm, learned pos, layernorm_embedding, unscaled, gelu, separate vocab": dict(
        cfg=dict(
            learned_pos=True, layernorm_embedding=True, scale_embedding=False, activation_fn="gelu"
        ),
        joint=False,
    ),
    "pre-norm, tied decoder in/out, separate vocab": dict(
        cfg=dict(normalize_before=True, share_decoder_input_output_embed=True), joint=False
    ),
}


def _cfg(**overrides) -> ModelConfig:
    return ModelConfig(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=2,
        decoder_layers=3,
        dropout=0.0,
        max_source_positions=128,
        max_target_positions=128,
        **overrides,
    )


@pytest.mark.parametrize("variant", list(VARIANTS), ids=list(VARIANTS))
def test_ctranslate2_scores_equal_nmt_forced_decoding(variant, tokenizers, tmp_path):
    spec = VARIANTS[variant]
    src, tgt = (tokenizers["joint"],) * 2 if spec["joint"] else (tokenizers["en"], tokenizers["de"])
    model = _checkpoint(tmp_path / "model.pt", _cfg(**spec["cfg"]), src, tgt)
    export_ctranslate2(tmp_path / "model.pt", tmp_path / "ct2")

    sources, targets = _lines("test", "en", 6), _lines("test", "de", 6)
    translator = ctranslate2.Translator(
        str(tmp_path / "ct2"), device="cpu", compute_type="float32", intra_threads=1
    )
    results = translator.score_batch(
        [src.encode_as_pieces(s) for s in sources], [tgt.encode_as_pieces(t) for t in targets]
    )
    tgt_ids = [tgt.encode(t) + [EOS] for t in targets]
    with torch.no_grad():
        logits = model(
            _batch([src.encode(s) + [EOS] for s in sources]),
            _batch([[EOS] + t[:-1] for t in tgt_ids]),
        )
    lprobs = torch.log_softmax(logits.float(), dim=-1)  # [B,T,V]
    for b, (ids, result) in enumerate(zip(tgt_ids, results)):
        ours = lprobs[b, torch.arange(len(ids)), torch.tensor(ids)]  # includes </s>
        torch.testing.assert_close(torch.tensor(result.log_probs), ours, rtol=0, atol=1e-4)


@pytest.mark.parametrize("normalize_before", [False, True], ids=["post-norm", "pre-norm"])
def test_ctranslate2_beam_search_equals_nmt_generate(normalize_before, tokenizers, tmp_path):
    """Same beam, length penalty and max length: same translations, scores to 1e-4.

    min_len=0 on both sides: nmt (like fairseq) masks </s> at step 0 after the softmax,
    CTranslate2 before it, so only without that mask are the step-0 scores comparable.
    """
    tok = tokenizers["joint"]
    model = _random_model(
        _cfg(normalize_before=normalize_before, share_all_embeddings=True), tok, tok
    )
    sources = _lines("test", "en", 24)
    src_tokens = _batch([tok.encode(s) + [EOS] for s in sources])
    limit = 60
    search = SearchConfig(beam=4, lenpen=0.8, max_len_a=0.0, max_len_b=limit, min_len=0)
    low, high = -5.0, 15.0  # bisect the </s> bias to a median translation of ~8 tokens
    for _ in range(12):
        bias = (low + high) / 2
        _set_output_bias(model, bias)
        hyps = SequenceGenerator([model], search).generate(src_tokens)
        median = sorted(len(h[0].tokens) for h in hyps)[len(hyps) // 2]
        if 6 <= median <= 12:
            break
        low, high = (bias, high) if median > 12 else (low, bias)
    _save(tmp_path / "model.pt", model, tok, tok)
    export_ctranslate2(tmp_path / "model.pt", tmp_path / "ct2")
    translator = ctranslate2.Translator(
        str(tmp_path / "ct2"), device="cpu", compute_type="float32", intra_threads=1
    )
    results = translator.translate_batch(
        [tok.encode_as_pieces(s) for s in sources],
        beam_size=4,
        length_penalty=0.8,
        max_decoding_length=limit,
        min_decoding_length=0,
        return_scores=True,
    )
    vocab = _pieces(tok)
    compared = lengths = 0
    for hyp, result in zip(hyps, results):
        tokens = hyp[0].tokens.tolist()[:-1]  # without </s>
        if len(tokens) >= limit:  # nmt forces </s> at the limit, CTranslate2 stops without it
            continue
        assert result.hypotheses[0] == [vocab[t] for t in tokens]
        assert abs(result.scores[0] - hyp[0].score) < 1e-4
        compared += 1
        lengths += len(tokens)
    assert compared >= len(sources) // 2 and lengths / compared >= 2  # not a vacuous check


def _pieces(tok: Tokenizer) -> list[str]:
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_proto=tok.model_bytes)
    return [proc.id_to_piece(i) for i in range(proc.get_piece_size())]


def test_every_quantization_writes_a_working_model(tokenizers, tmp_path):
    tok = tokenizers["joint"]
    _checkpoint(tmp_path / "model.pt", _cfg(share_all_embeddings=True), tok, tok)
    sources = [tok.encode_as_pieces(s) for s in _lines("test", "en", 4)]
    targets = [tok.encode_as_pieces(t) for t in _lines("test", "de", 4)]
    reference = None
    sizes = {}
    for quantization in ("none", "int8", "int16", "float16", "bfloat16"):
        out = tmp_path / f"ct2-{quantization}"
        export_ctranslate2(tmp_path / "model.pt", out, quantization)
        sizes[quantization] = (out / "model.bin").stat().st_size
        info = json.loads((out / "nmt_export.json").read_text())
        assert info["quantization"] == quantization and info["spm"]["src"] == "spm.model"
        assert Tokenizer.from_file(out / "spm.model").model_bytes == tok.model_bytes
        translator = ctranslate2.Translator(str(out), device="cpu", compute_type="default")
        scores = [sum(r.log_probs) for r in translator.score_batch(sources, targets)]
        if reference is None:
            reference = scores
        for got, want in zip(scores, reference):  # quantized weights, close scores
            assert abs(got - want) <= 0.05 * abs(want) + 0.5
        assert translator.translate_batch(sources[:1], max_decoding_length=5)[0].hypotheses
    assert sizes["int8"] < sizes["int16"] < sizes["none"]
    assert sizes["float16"] < sizes["none"] and sizes["bfloat16"] < sizes["none"]


def test_existing_output_is_kept_unless_overwrite(tokenizers, tmp_path):
    tok = tokenizers["joint"]
    _checkpoint(tmp_path / "model.pt", _cfg(share_all_embeddings=True), tok, tok)
    out = tmp_path / "ct2"
    export_ctranslate2(tmp_path / "model.pt", out)
    before = (out / "model.bin").stat().st_ino
    with pytest.raises(
        NmtError
    ) as error:  # the CLI's one line: tests/integration/test_interop_cli.py
        export_ctranslate2(tmp_path / "model.pt", out)
    assert "already exists" in str(error.value) and "overwrite=true" in str(error.value)
    assert str(error.value).startswith(f"output_dir={out}: ")
    assert (out / "model.bin").stat().st_ino == before
    export_ctranslate2(tmp_path / "model.pt", out, overwrite=True)
    assert (out / "model.bin").stat().st_ino != before  # a new export
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "model.pt"]  # no temp dirs left


def test_temporaries_of_a_killed_export_are_removed(tokenizers, tmp_path):
    tok = tokenizers["joint"]
    _checkpoint(tmp_path / "model.pt", _cfg(share_all_embeddings=True), tok, tok)
    killed = tmp_path / ".ct2.x1y2z3.tmp"  # what SIGKILL during an export leaves behind
    killed.mkdir()
    (killed / "model.bin").write_bytes(b"half")
    export_ctranslate2(tmp_path / "model.pt", tmp_path / "ct2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["ct2", "model.pt"]


def test_bad_quantization_and_missing_package_are_one_line_errors(tmp_path, monkeypatch):
    with pytest.raises(NmtError, match=r"^quantization=int4: unknown; use one of none, int8"):
        export_ctranslate2(tmp_path / "model.pt", tmp_path / "ct2", "int4")
    monkeypatch.setitem(sys.modules, "ctranslate2", None)  # as if it were not installed
    with pytest.raises(NmtError, match=r"ctranslate2 is not installed; install it with"):
        export_ctranslate2(tmp_path / "model.pt", tmp_path / "ct2")
    assert not (tmp_path / "ct2").exists()
