"""benchmarks.train's model FLOPs and MFU: the parameter count of a preset against a hand
count from the Transformer's arithmetic, the issue's FLOP estimate, the GPU peak table, and
the clocks read after a device sync."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf

from benchmarks import common, train
from nmt.model.config import ModelConfig

PRESETS = common.REPO / "configs" / "model"
TINY_TRAIN = ["--model", "transformer_tiny", "--max-tokens", "300", "--threads", "1"]
TINY_TRAIN += ["--set", "model.embed_dim=32", "--set", "model.ffn_dim=64"]
TINY_TRAIN += ["--set", "model.encoder_layers=1", "--set", "model.decoder_layers=1"]
TINY_TRAIN += ["--set", "train_split=valid"]


def preset(name: str, **overrides) -> ModelConfig:
    return ModelConfig(
        **{**OmegaConf.to_container(OmegaConf.load(PRESETS / f"{name}.yaml")), **overrides}
    )


def hand_count(d: int, f: int, enc_layers: int, dec_layers: int, vocab: int, pre_norm: bool):
    """Parameters per place, from the layer shapes: an attention is 4 d x d projections
    with biases, the FFN d x f and f x d with biases, a LayerNorm a weight and a bias."""
    attention = 4 * (d * d + d)
    ffn = d * f + f + f * d + d
    norm = 2 * d
    final = norm if pre_norm else 0  # pre-norm stacks end with a LayerNorm
    encoder = enc_layers * (attention + ffn + 2 * norm) + final
    decoder = dec_layers * (2 * attention + ffn + 3 * norm) + final
    return encoder, decoder, d * vocab


def test_transformer_big_params_and_flops_per_target_token_match_a_hand_count():
    cfg = preset("transformer_big")
    params = train.model_params(cfg, 32768, 32768)
    encoder, decoder, output = hand_count(1024, 4096, 6, 6, 32768, pre_norm=False)
    assert (params.encoder, params.decoder, params.output) == (encoder, decoder, output)
    # the estimate: 6 x (enc x src + (dec + out) x tgt), sources as long as targets
    per_token = params.training_flops(1.0, 1.0)
    assert per_token == 6 * (encoder + decoder + output)
    assert per_token == pytest.approx(1.26e9, rel=0.005)  # issue 20: ~1.26 GFLOP per token


def test_params_of_a_pre_norm_model_with_separate_vocabularies():
    cfg = preset("transformer_tiny", normalize_before=True, share_all_embeddings=False)
    params = train.model_params(cfg, 500, 700)
    encoder, decoder, output = hand_count(
        cfg.embed_dim, cfg.ffn_dim, cfg.encoder_layers, cfg.decoder_layers, 700, pre_norm=True
    )
    assert (params.encoder, params.decoder, params.output) == (encoder, decoder, output)
    # the source tokens go through the encoder only, the target tokens through the rest
    assert params.training_flops(10, 0) == 6 * 10 * encoder
    assert params.training_flops(0, 3) == 6 * 3 * (decoder + output)


@pytest.mark.parametrize(
    "name, peak",
    [
        ("NVIDIA H100 80GB HBM3", 989.0),
        ("NVIDIA H200", 989.0),
        ("NVIDIA A100-SXM4-80GB", 312.0),
        ("NVIDIA H100 PCIe", None),  # not the SXM part: its peak is not the table's
        ("NVIDIA GeForce RTX 4090", None),
    ],
)
def test_dense_bf16_peak_by_device_name(name, peak):
    assert train.device_peak_tflops(name) == peak


def test_mfu_text():
    assert train.mfu_text(494.5e12, 989.0) == "50.0%"
    assert train.mfu_text(1e12, None) == "n/a"


def test_timed_reads_each_clock_after_a_sync():
    events: list[str] = []
    with common.timed(lambda: events.append("sync")) as t:
        events.append("work")
    assert events == ["sync", "work", "sync"]
    assert t.wall >= 0
    calls: list[str] = []
    common.interleave(
        [lambda turn: calls.append("a"), lambda turn: calls.append("b")],
        2,
        sync=lambda: calls.append("sync"),
    )
    assert calls.count("sync") == 8 and calls.count("a") == calls.count("b") == 2
    assert train.device_sync("cpu") is None
    assert train.device_sync("cuda") is torch.cuda.synchronize


def test_train_reports_mfu_against_a_given_peak_and_n_a_without(demo_data_dir, tmp_path, capsys):
    argv = ["--data", str(demo_data_dir), *TINY_TRAIN, "--updates", "2", "--warmup", "0"]
    argv += ["--log-interval", "1", "--peak-seconds", "0", "--precisions", "fp32"]
    out = tmp_path / "train.json"
    assert common.main("train", train.build_parser, train.run, [*argv, "--json", str(out)]) == 0
    assert "MFU n/a" in capsys.readouterr().out
    figures = json.loads(out.read_text())["figures"]
    assert figures["peak_tflops"] is None and figures["results"][0]["mfu"] is None
    argv += ["--peak-tflops", "0.5", "--json", str(out)]
    assert common.main("train", train.build_parser, train.run, argv) == 0
    figures = json.loads(out.read_text())["figures"]
    result = figures["results"][0]
    assert figures["peak_tflops"] == 0.5
    assert result["mfu"] == pytest.approx(result["flop_s"] / 0.5e12, rel=1e-4)
    assert f"MFU {100 * result['mfu']:.1f}%" in capsys.readouterr().out


@pytest.mark.parametrize("value", ["0", "-3", "fast"])
def test_peak_tflops_must_be_a_positive_number(value, capsys, tmp_path: Path):
    with pytest.raises(SystemExit) as exc:
        train.build_parser().parse_args(["--peak-tflops", value, "--data", str(tmp_path)])
    assert exc.value.code == 2
    assert "--peak-tflops" in capsys.readouterr().err
