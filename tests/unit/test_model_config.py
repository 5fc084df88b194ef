"""ModelConfig validation, the presets in configs/model/, and fairseq's position numbers."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path

import pytest
import torch
from omegaconf import OmegaConf
from rounding import U_FP32

from nmt.errors import NmtError
from nmt.model.config import ModelConfig
from nmt.model.layers import sinusoidal_table
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD

PRESET_DIR = Path(__file__).resolve().parents[2] / "configs" / "model"
PRESETS = ["tiny", "small", "iwslt_de_en", "base", "big", "student"]


def preset(name: str) -> ModelConfig:
    """Load a preset the way Hydra merges it into the schema (unknown keys/types fail)."""
    merged = OmegaConf.merge(
        OmegaConf.structured(ModelConfig), OmegaConf.load(PRESET_DIR / f"transformer_{name}.yaml")
    )
    return OmegaConf.to_object(merged)


def count_parameters(cfg: ModelConfig, src_vocab: int, tgt_vocab: int) -> int:
    with torch.device("meta"):  # shapes only: no memory for the big model
        model = Transformer(cfg, src_vocab, tgt_vocab)
    return sum(p.numel() for p in model.parameters())  # shared tensors counted once


# --------------------------------------------------------------------------- presets


@pytest.mark.parametrize("name", PRESETS)
def test_preset_states_only_what_differs_from_the_defaults_with_a_comment(name):
    text = (PRESET_DIR / f"transformer_{name}.yaml").read_text()
    stated = OmegaConf.to_container(OmegaConf.create(text))
    assert isinstance(stated, dict)
    defaults = dataclasses.asdict(ModelConfig())
    assert stated and set(stated) <= set(defaults)
    assert all(stated[key] != defaults[key] for key in stated), "a default restated"
    for line in text.splitlines():
        assert line.startswith("#") or " # " in line, f"uncommented line: {line!r}"
    preset(name).validate(8000, 8000, PAD)


# What each preset gave in 0.1, when its file stated every key: the same models now.
SAME_IN_EVERY_PRESET = dict(
    activation_fn="relu",
    normalize_before=False,
    max_source_positions=1024,
    max_target_positions=1024,
    learned_pos=False,
    scale_embedding=True,
    layernorm_embedding=False,
    share_decoder_input_output_embed=True,
)
# name: embed_dim, ffn_dim, heads, encoder/decoder layers, dropout, attention and activation
# dropout, share_all_embeddings
PRESET_VALUES = {
    "tiny": (128, 512, 4, 2, 0.1, 0.0, 0.0, False),
    "small": (256, 1024, 4, 3, 0.3, 0.1, 0.1, False),
    "iwslt_de_en": (512, 1024, 4, 6, 0.3, 0.0, 0.0, False),
    "base": (512, 2048, 8, 6, 0.1, 0.0, 0.0, True),
    "big": (1024, 4096, 16, 6, 0.3, 0.0, 0.0, True),
}


@pytest.mark.parametrize("name", PRESET_VALUES)
def test_presets_give_the_models_they_gave_when_they_stated_every_key(name):
    dim, ffn, heads, layers, dropout, attention, activation, share_all = PRESET_VALUES[name]
    assert dataclasses.asdict(preset(name)) == {
        **SAME_IN_EVERY_PRESET,
        "embed_dim": dim,
        "ffn_dim": ffn,
        "attention_heads": heads,
        "encoder_layers": layers,
        "decoder_layers": layers,
        "dropout": dropout,
        "attention_dropout": attention,
        "activation_dropout": activation,
        "share_all_embeddings": share_all,
    }


@pytest.mark.parametrize(
    "name, layers, dim, ffn, heads",
    [
        ("tiny", 2, 128, 512, 4),
        ("small", 3, 256, 1024, 4),
        ("iwslt_de_en", 6, 512, 1024, 4),
        ("base", 6, 512, 2048, 8),
        ("big", 6, 1024, 4096, 16),
    ],
)
def test_preset_shapes(name, layers, dim, ffn, heads):
    cfg = preset(name)
    assert (
        cfg.encoder_layers,
        cfg.decoder_layers,
        cfg.embed_dim,
        cfg.ffn_dim,
        cfg.attention_heads,
    ) == (layers, layers, dim, ffn, heads)


@pytest.mark.parametrize(
    "name, exact, paper", [("base", 63_082_496, 65e6), ("big", 214_245_376, 213e6)]
)
def test_paper_parameter_counts_with_37k_joint_vocab(name, exact, paper):
    cfg = preset(name)
    assert cfg.share_all_embeddings
    n = count_parameters(cfg, 37000, 37000)
    assert n == exact
    assert abs(n - paper) / paper < 0.04  # the paper rounds, and its vocab was "about 37k"


def test_small_and_tiny_parameter_counts():
    assert count_parameters(preset("small"), 8000, 8000) == 9_625_600
    assert count_parameters(preset("tiny"), 8000, 8000) == 2_973_696


def test_student_moves_depth_from_the_decoder_to_the_encoder():
    # Kasai et al. 2021: a deep encoder, one decoder layer, at the Multi30k recipe's width
    # (transformer_small narrowed to 192, one shared embedding matrix).
    cfg = preset("student")
    assert (cfg.encoder_layers, cfg.decoder_layers) == (6, 1)
    assert (cfg.embed_dim, cfg.ffn_dim, cfg.attention_heads) == (192, 768, 4)
    assert cfg.share_all_embeddings
    recipe = dataclasses.replace(
        preset("small"), embed_dim=192, ffn_dim=768, share_all_embeddings=True
    )
    # about the recipe's 4.7M parameters: the encoder's 3 extra layers outweigh the decoder's
    # 2 fewer (a decoder layer has cross-attention too, an encoder layer has not)
    assert count_parameters(cfg, 8000, 8000) == 4_798_656
    assert count_parameters(recipe, 8000, 8000) == 4_651_008


def test_sharing_changes_counts_by_exactly_the_embeddings():
    base = dataclasses.replace(
        preset("base"), share_all_embeddings=False, share_decoder_input_output_embed=False
    )
    untied = count_parameters(base, 37000, 37000)
    assert untied - count_parameters(preset("base"), 37000, 37000) == 2 * 37000 * 512


# ------------------------------------------------------------------------- validation


@pytest.mark.parametrize(
    "change, key",
    [
        ({"attention_heads": 6}, "model.attention_heads"),
        ({"embed_dim": 0}, "model.embed_dim"),
        ({"decoder_layers": 0}, "model.decoder_layers"),
        ({"activation_fn": "swish"}, "model.activation_fn"),
        ({"dropout": 1.0}, "model.dropout"),
        ({"attention_dropout": -0.1}, "model.attention_dropout"),
    ],
)
def test_invalid_config_names_the_key(change, key):
    cfg = ModelConfig(**change)
    with pytest.raises(NmtError, match=key.replace(".", r"\.")) as err:
        Transformer(cfg, 100, 100)
    assert "\n" not in str(err.value)


def test_share_all_embeddings_needs_a_joint_vocab():
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        share_all_embeddings=True,
    )
    with pytest.raises(NmtError, match=r"model\.share_all_embeddings=true: .* 100 .* 120"):
        Transformer(cfg, 100, 120)


# -------------------------------------------------------------------------- positions


def reference_sinusoid(position: int, dim: int) -> list[float]:
    """fairseq's sinusoid for one table row, written from its formula in float64:
    half = dim // 2 frequencies w_i = 10000 ** (-i / (half - 1)); the row is
    [sin(p w_0) .. sin(p w_{half-1}), cos(p w_0) .. cos(p w_{half-1})] (+ a 0 for odd dim)."""
    half = dim // 2
    freqs = [10000 ** (-i / (half - 1)) for i in range(half)]
    row = [math.sin(position * w) for w in freqs] + [math.cos(position * w) for w in freqs]
    return row + [0.0] * (dim % 2)


def reference_make_positions(tokens: torch.Tensor, pad: int) -> torch.Tensor:
    """fairseq's make_positions: running count of real tokens, offset by pad; pads get pad."""
    real = tokens.ne(pad).long()
    return torch.cumsum(real, dim=1) * real + pad


@pytest.mark.parametrize("dim", [8, 31, 64])
def test_sinusoidal_table_matches_fairseq_formula(dim):
    rows = 300
    table = sinusoidal_table(rows, dim, PAD)
    reference = torch.tensor([reference_sinusoid(p, dim) for p in range(rows)], dtype=torch.float)
    reference[PAD] = 0
    assert table.shape == (rows, dim)
    # fp32 rounding (tests/rounding.py): the exponent x_i = i * step is rounded twice (2 U
    # of itself), exp adds 1 ulp (2 U) and p * w_i one rounding, so the angle lies within
    # p * w_i * (2 x_i + 3) U of the exact p * w_i (up to 4.8e-5 at p = 299, D = 64); sin
    # and cos add 1 ulp (2 U) and the reference's own rounding to fp32 U.
    half = dim // 2
    x = torch.arange(half, dtype=torch.float64) * math.log(10000) / (half - 1)  # [D/2]
    positions = torch.arange(rows, dtype=torch.float64)[:, None]  # [rows,1]
    angle_error = positions * torch.exp(-x) * (2 * x + 3) * U_FP32  # [rows,D/2]
    bound = torch.cat([angle_error, angle_error, torch.zeros(rows, dim % 2)], 1) + 3 * U_FP32
    assert torch.all((table.double() - reference.double()).abs() <= bound)


@pytest.mark.parametrize("learned", [False, True])
def test_encoder_input_is_fairseqs_at_real_positions(learned):
    """scale * embedding + position, with positions as fairseq numbers them (make_positions)."""
    torch.manual_seed(0)
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        dropout=0.0,
        learned_pos=learned,
    )
    model = Transformer(cfg, 30, 30).eval()
    src = torch.tensor([[5, 6, 7, 8, EOS], [9, 10, EOS, PAD, PAD]])
    seen = []
    model.encoder.layers[0].register_forward_pre_hook(lambda mod, args: seen.append(args[0]))
    with torch.no_grad():
        model.encode(src)
    if learned:
        table = model.encoder.embed_positions.weight
    else:
        table = sinusoidal_table(cfg.max_source_positions + PAD + 1, 16, PAD)
    embedded = model.encoder.embed_tokens(src)  # [B,S,D]
    positions = table[reference_make_positions(src, PAD)]  # [B,S,D]
    expected = 4.0 * embedded + positions
    # one fp32 addition (the scaling by 4 is exact): each side within U of its terms
    bound = 2 * U_FP32 * (4.0 * embedded.abs() + positions.abs())
    real = src.ne(PAD)
    assert torch.all((seen[0][real] - expected[real]).abs() <= bound[real])


def test_sinusoidal_positions_extend_past_max_like_fairseq():
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        max_source_positions=8,
    )
    model = Transformer(cfg, 30, 30)
    rows = model.encoder.embed_positions(0, 12)
    assert torch.equal(rows, sinusoidal_table(12 + PAD + 1, 16, PAD)[PAD + 1 :])


def test_learned_positions_reject_too_long_input():
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        max_source_positions=8,
        learned_pos=True,
    )
    model = Transformer(cfg, 30, 30)
    with pytest.raises(NmtError, match=r"model\.max_source_positions"):
        model.encode(torch.full((1, 9), 5))


def test_position_tables_are_not_saved():
    model = Transformer(
        ModelConfig(
            embed_dim=16, ffn_dim=32, attention_heads=2, encoder_layers=1, decoder_layers=1
        ),
        30,
        30,
    )
    assert not any("embed_positions" in key for key in model.state_dict())
