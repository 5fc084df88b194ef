"""nmt-import-fairseq: a fairseq-format checkpoint, built here without fairseq, imports
into an nmt model that computes the same logits; unsafe pickles and unsupported
features are refused with one-line errors."""

from __future__ import annotations

import argparse
import io
import os
import random
import re
from collections import OrderedDict
from pathlib import Path

import pytest
import sentencepiece as spm
import torch
from omegaconf import OmegaConf
from rounding import assert_same_function, float64_twin

from nmt.errors import NmtError
from nmt.generation.loading import load_for_inference
from nmt.interop.config import ImportFairseqConfig
from nmt.interop.fairseq_import import (
    import_fairseq,
    import_fairseq_checkpoint,
    read_fairseq_checkpoint,
    read_fairseq_dictionary,
    spm_with_nmt_specials,
)
from nmt.interop.safe_unpickle import load_untrusted
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer

DEMO = Path(__file__).resolve().parents[2] / "data" / "demo"
SENTENCES = [
    "Anna wants to sell nine hundred seventy-four kitchen lamps.",
    "You sold eight tables.",
]


def _lines(lang: str, n: int = 800) -> list[str]:
    with open(DEMO / f"train.{lang}", encoding="utf-8") as f:
        return [next(f).strip() for _ in range(n)]


def _spm_default_ids(lines: list[str], vocab_size: int) -> bytes:
    """A SentencePiece model as fairseq users train it: spm's default ids (unk0 bos1 eos2)."""
    buf = io.BytesIO()
    spm.SentencePieceTrainer.train(
        sentence_iterator=iter(lines),
        model_writer=buf,
        vocab_size=vocab_size,
        model_type="unigram",
        character_coverage=1.0,
        minloglevel=2,
        num_threads=1,
    )
    return buf.getvalue()


@pytest.fixture(scope="module")
def spms(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("spm")
    out = {}
    for name, lines, size in (
        ("joint", _lines("en") + _lines("de"), 160),
        ("en", _lines("en"), 120),
        ("de", _lines("de"), 130),
    ):
        out[name] = root / f"{name}.model"
        out[name].write_bytes(_spm_default_ids(lines, size))
    return out


def _pieces(model: Path) -> list[str]:
    """The normal pieces of a SentencePiece model (what fairseq's dict.txt lists)."""
    sp = spm.SentencePieceProcessor(model_file=str(model))
    return [
        sp.id_to_piece(i)
        for i in range(sp.get_piece_size())
        if not (sp.is_control(i) or sp.is_unknown(i))
    ]


def _write_dict(path: Path, pieces: list[str], seed: int, drop: int = 0) -> list[str]:
    """dict.txt in a shuffled order, with `drop` pieces left out, two symbols that are no
    piece, and madeupword padding to a multiple of 8 (fairseq-preprocess's layout)."""
    symbols = list(pieces)
    random.Random(seed).shuffle(symbols)
    symbols = symbols[drop:] + ["@@EXTRA1", "@@EXTRA2"]
    while (len(symbols) + 4) % 8:
        symbols.append(f"madeupword{len(symbols) % 8:04d}")
    path.write_text(
        "".join(f"{s} {100 - i % 50}\n" for i, s in enumerate(symbols)), encoding="utf-8"
    )
    return ["<s>", "<pad>", "</s>", "<unk>"] + symbols


def _legacy_keys(state: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """fairseq < 0.9 names: fused in_proj, layer_norms.N, decoder.embed_out."""
    names = {
        "encoder": ["self_attn_layer_norm", "final_layer_norm"],
        "decoder": ["self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"],
    }
    out: dict[str, torch.Tensor] = OrderedDict()
    for key, value in state.items():
        parts = key.split(".")
        if parts[-2] in ("q_proj", "k_proj", "v_proj"):
            if parts[-2] == "q_proj":
                base = ".".join(parts[:-2])
                out[f"{base}.in_proj_{parts[-1]}"] = torch.cat(
                    [state[f"{base}.{p}.{parts[-1]}"] for p in ("q_proj", "k_proj", "v_proj")]
                )
            continue
        if len(parts) == 5 and parts[1] == "layers" and parts[3] in names[parts[0]]:
            idx = names[parts[0]].index(parts[3])
            out[f"{parts[0]}.layers.{parts[2]}.layer_norms.{idx}.{parts[4]}"] = value
            continue
        if key == "decoder.output_projection.weight":
            out["decoder.embed_out"] = value
            continue
        out[key] = value
    return out


def _args(cfg: ModelConfig, arch: str = "transformer", **extra) -> dict:
    """fairseq's flat option names for `cfg` (what transformer's base_architecture sets)."""
    args = dict(
        arch=arch,
        source_lang="en",
        target_lang="de",
        dropout=cfg.dropout,
        activation_fn=cfg.activation_fn,
        max_source_positions=cfg.max_source_positions,
        max_target_positions=cfg.max_target_positions,
        share_all_embeddings=cfg.share_all_embeddings,
        share_decoder_input_output_embed=cfg.share_decoder_input_output_embed,
        no_scale_embedding=not cfg.scale_embedding,
        layernorm_embedding=cfg.layernorm_embedding,
        adaptive_input=False,
        adaptive_softmax_cutoff=None,
        quant_noise_pq=0.0,
        no_token_positional_embeddings=False,
    )
    for side, layers in (("encoder", cfg.encoder_layers), ("decoder", cfg.decoder_layers)):
        args.update(
            {
                f"{side}_embed_dim": cfg.embed_dim,
                f"{side}_ffn_embed_dim": cfg.ffn_dim,
                f"{side}_attention_heads": cfg.attention_heads,
                f"{side}_layers": layers,
                f"{side}_normalize_before": cfg.normalize_before,
                f"{side}_learned_pos": cfg.learned_pos,
            }
        )
    args.update(extra)
    return args


def _nested_cfg(args: dict) -> dict:
    """fairseq >= 0.10 dataclass layout: encoder/decoder sub-configs, `_name` for the arch."""
    model: dict = {"_name": args["arch"], "encoder": {}, "decoder": {}}
    for key, value in args.items():
        side = key.split("_", 1)[0]
        if side in ("encoder", "decoder") and key != "encoder_decoder":
            model[side][key.split("_", 1)[1]] = value
        elif key not in ("arch", "source_lang", "target_lang"):
            model[key] = value
    return model


def _save_fairseq(path: Path, state: dict, args: dict, style: str) -> None:
    task = {"_name": "translation", "source_lang": "en", "target_lang": "de"}
    if style == "namespace":  # fairseq < 0.10
        obj = {"args": argparse.Namespace(**args), "model": state}
    elif style == "cfg_namespace":  # fairseq 0.12 with a legacy architecture
        obj = {
            "args": None,
            "cfg": {"model": argparse.Namespace(**args), "task": task},
            "model": state,
        }
    else:  # fairseq 0.10: the whole cfg pickled as an OmegaConf DictConfig
        obj = {
            "args": None,
            "cfg": OmegaConf.create({"model": _nested_cfg(args), "task": task}),
            "model": state,
        }
    obj.update(optimizer_history=[{"num_updates": 7}], extra_state={"epoch": 1, "val_loss": 3.5})
    torch.save(obj, path)


def _fairseq_case(
    tmp: Path,
    spms: dict[str, Path],
    cfg: ModelConfig,
    joint: bool,
    style: str,
    legacy: bool = False,
    drop: int = 0,
    **extra_args,
):
    """A random model in fairseq's index space, saved as fairseq would save it."""
    src_spm, tgt_spm = (spms["joint"], spms["joint"]) if joint else (spms["en"], spms["de"])
    src_symbols = _write_dict(tmp / "dict.en.txt", _pieces(src_spm), seed=1, drop=drop)
    if joint:
        (tmp / "dict.de.txt").write_bytes((tmp / "dict.en.txt").read_bytes())
        tgt_symbols = src_symbols
    else:
        tgt_symbols = _write_dict(tmp / "dict.de.txt", _pieces(tgt_spm), seed=2, drop=drop)
    torch.manual_seed(0)
    model = Transformer(cfg, len(src_symbols), len(tgt_symbols)).eval()
    with torch.no_grad():  # move every weight off its init (LayerNorms are 1/0 there)
        for p in model.parameters():
            p.add_(0.1 * torch.randn_like(p))
    state = OrderedDict((k, v.clone()) for k, v in model.state_dict().items())
    state["encoder.version"] = torch.tensor([3.0])
    state["decoder.version"] = torch.tensor([3.0])
    if not cfg.learned_pos:
        state["encoder.embed_positions._float_tensor"] = torch.tensor([0.0])
    if legacy:
        state = _legacy_keys(state)
    _save_fairseq(tmp / "checkpoint_best.pt", state, _args(cfg, **extra_args), style)
    return model, src_symbols, tgt_symbols, src_spm, tgt_spm


def _ids(sp_path: Path, symbols: list[str], text: str) -> list[int]:
    """fairseq's pipeline: spm_encode to pieces, then dictionary lookup, then </s>."""
    sp = spm.SentencePieceProcessor(model_file=str(sp_path))
    index = {s: i for i, s in enumerate(symbols)}
    return [index.get(p, 3) for p in sp.encode(text, out_type=str)] + [2]


def _batch(rows: list[list[int]], pad: int = 1) -> torch.Tensor:
    width = max(map(len, rows))
    return torch.tensor([r + [pad] * (width - len(r)) for r in rows])


CASES = {
    "post-norm, sinusoidal, shared all, args Namespace": dict(
        cfg=dict(share_all_embeddings=True), joint=True, style="namespace"
    ),
    "pre-norm, learned pos, layernorm_embedding, unscaled, gelu, separate, cfg Namespace": dict(
        cfg=dict(
            normalize_before=True,
            learned_pos=True,
            layernorm_embedding=True,
            scale_embedding=False,
            activation_fn="gelu",
        ),
        joint=False,
        style="cfg_namespace",
    ),
    "post-norm, tied decoder in/out, separate, cfg DictConfig": dict(
        cfg=dict(share_decoder_input_output_embed=True), joint=False, style="dictconfig"
    ),
    "pre-norm, legacy key names, joint dict, nothing shared": dict(
        cfg=dict(normalize_before=True), joint=True, style="namespace", legacy=True
    ),
}


@pytest.mark.parametrize("case", list(CASES), ids=list(CASES))
def test_imported_model_gives_fairseq_models_logits(case, spms, tmp_path):
    spec = CASES[case]
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=2,
        decoder_layers=3,
        dropout=0.0,
        max_source_positions=64,
        max_target_positions=64,
        **spec["cfg"],
    )
    fs_model, src_symbols, tgt_symbols, src_spm, tgt_spm = _fairseq_case(
        tmp_path, spms, cfg, spec["joint"], spec["style"], legacy=spec.get("legacy", False)
    )
    out = tmp_path / "imported.pt"
    cfg_import = ImportFairseqConfig(
        checkpoint=str(tmp_path / "checkpoint_best.pt"), output=str(out)
    )
    if spec["joint"]:
        cfg_import.spm = str(src_spm)
    else:
        cfg_import.src_spm, cfg_import.tgt_spm = str(src_spm), str(tgt_spm)
    result = import_fairseq_checkpoint(cfg_import)  # dicts: <checkpoint dir>/dict.{en,de}.txt
    assert (result.output, result.src_lang, result.tgt_lang) == (out, "en", "de")
    assert result.lines()[-1].startswith(f"wrote {out} (en->de)")

    bundle = load_for_inference(out)
    assert bundle.data["src_lang"] == "en" and bundle.data["tgt_lang"] == "de"
    assert bundle.model_config == cfg
    src_tok, tgt_tok = bundle.src_tokenizer, bundle.tgt_tokenizer
    assert src_tok.special_ids() == {"bos": 0, "pad": 1, "eos": 2, "unk": 3}
    targets = [
        "Anna will neunhundertvierundsiebzig Küchenlampen verkaufen.",
        "Du hast acht Tische verkauft.",
    ]

    fs_src = _batch([_ids(src_spm, src_symbols, s) for s in SENTENCES])
    fs_tgt = [_ids(tgt_spm, tgt_symbols, t) for t in targets]
    nmt_src = _batch([src_tok.encode(s) + [2] for s in SENTENCES])
    nmt_tgt = [tgt_tok.encode(t) + [2] for t in targets]
    fs_prev = _batch([[2] + t[:-1] for t in fs_tgt])
    nmt_prev = _batch([[2] + t[:-1] for t in nmt_tgt])
    assert fs_src.shape == nmt_src.shape and fs_prev.shape == nmt_prev.shape  # same segmentation
    with torch.no_grad():
        expected = fs_model(fs_src, fs_prev)  # [B,T,V_fairseq]
        got = bundle.model(nmt_src, nmt_prev)  # [B,T,V_nmt]
        exact = float64_twin(fs_model)(fs_src, fs_prev)  # [B,T,V_fairseq]
    index = {s: i for i, s in enumerate(tgt_symbols)}
    pieces = spm.SentencePieceProcessor(model_proto=tgt_tok.model_bytes)
    columns = torch.tensor(
        [index[pieces.id_to_piece(j)] if j > 3 else j for j in range(tgt_tok.vocab_size)]
    )
    real = fs_prev.ne(1)  # compare real positions; padded ones are never read
    # the same function in another index order: as close to float64 (tests/rounding.py)
    assert_same_function(got[real], expected[..., columns][real], exact[..., columns][real])


def test_missing_pieces_take_the_unk_row_and_are_reported(spms, tmp_path):
    cfg = ModelConfig(
        embed_dim=16,
        ffn_dim=32,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        share_all_embeddings=True,
    )
    fs_model, symbols, _, sp, _ = _fairseq_case(
        tmp_path, spms, cfg, joint=True, style="namespace", drop=5
    )
    ckpt = read_fairseq_checkpoint(tmp_path / "checkpoint_best.pt")
    nmt, report = import_fairseq(ckpt, tmp_path / "dict.en.txt", tmp_path / "dict.de.txt", sp, sp)
    assert report.src.missing == 5 and report.src.dropped == 2
    assert report.src.padding == sum(s.startswith("madeupword") for s in symbols)
    assert "5 pieces not in the fairseq dict" in " ".join(report.lines())
    proc = spm.SentencePieceProcessor(model_proto=spm_with_nmt_specials(sp.read_bytes(), "x"))
    present = set(symbols)
    missing = [i for i in range(4, proc.get_piece_size()) if proc.id_to_piece(i) not in present]
    assert len(missing) == 5
    emb = nmt["model"]["encoder.embed_tokens.weight"]
    unk_row = fs_model.state_dict()["encoder.embed_tokens.weight"][3]
    for i in missing:
        assert torch.equal(emb[i], unk_row)


def test_rewritten_spm_segments_text_exactly_as_before(spms):
    original = spms["joint"].read_bytes()
    rewritten = spm_with_nmt_specials(original, "joint.model")
    old = spm.SentencePieceProcessor(model_proto=original)
    new = spm.SentencePieceProcessor(model_proto=rewritten)
    assert (new.bos_id(), new.pad_id(), new.eos_id(), new.unk_id()) == (0, 1, 2, 3)
    assert new.get_piece_size() == old.get_piece_size() + 1  # <pad> added; unk/bos/eos kept
    for line in _lines("en", 300) + _lines("de", 300) + ["unseen ÄÖÜ ß 你好 text"]:
        assert new.encode(line, out_type=str) == old.encode(line, out_type=str)
    assert spm_with_nmt_specials(rewritten, "again") == rewritten  # already nmt's ids: unchanged


class _RunsShell:
    def __init__(self, marker: str):
        self.marker = marker

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


def test_a_pickle_that_runs_code_is_refused_before_running(tmp_path):
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint_evil.pt"
    torch.save(
        {
            "args": argparse.Namespace(arch="transformer"),
            "model": {"w": torch.zeros(1)},
            "x": _RunsShell(str(marker)),
        },
        path,
    )
    with pytest.raises(NmtError, match=r"refusing to unpickle (posix|os|nt)\.system"):
        load_untrusted(path)
    assert not marker.exists()


def test_the_import_call_refuses_such_a_pickle_too(tmp_path):
    """The CLI's one-line form of this: tests/integration/test_interop_cli.py."""
    marker = tmp_path / "pwned"
    path = tmp_path / "checkpoint_evil.pt"
    torch.save({"model": {}, "x": _RunsShell(str(marker))}, path)
    cfg = ImportFairseqConfig(checkpoint=str(path), spm=str(path), output=str(tmp_path / "o.pt"))
    with pytest.raises(NmtError, match="refusing to unpickle") as error:
        import_fairseq_checkpoint(cfg)
    assert str(path) in str(error.value)
    assert not marker.exists() and not (tmp_path / "o.pt").exists()


def test_any_unlisted_class_is_refused_by_name(tmp_path):
    path = tmp_path / "c.pt"
    torch.save({"model": {}, "x": io.StringIO("data")}, path)  # harmless, but not plain data
    with pytest.raises(NmtError, match=r"_io\.StringIO"):
        load_untrusted(path)


@pytest.mark.parametrize(
    "extra, feature",
    [
        (dict(arch="transformer_align", alignment_heads=1), "alignment heads"),
        (dict(arch="lstm"), "architecture 'lstm' is not supported"),
        (dict(arch="transformer_lm"), "language model"),
        (dict(adaptive_input=True), "adaptive input"),
        (dict(adaptive_softmax_cutoff="1000,5000"), "adaptive softmax"),
        (dict(quant_noise_pq=0.1), "quant-noise"),
        (dict(activation_fn="gelu_accurate"), "activation_fn='gelu_accurate'"),
        (dict(decoder_normalize_before=True), "norm placements"),
    ],
)
def test_unsupported_features_are_named(extra, feature, spms, tmp_path):
    cfg = ModelConfig(
        embed_dim=8,
        ffn_dim=16,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        share_all_embeddings=True,
    )
    _fairseq_case(tmp_path, spms, cfg, joint=True, style="namespace", **extra)
    ckpt = read_fairseq_checkpoint(tmp_path / "checkpoint_best.pt")
    with pytest.raises(NmtError, match=feature):
        import_fairseq(
            ckpt, tmp_path / "dict.en.txt", tmp_path / "dict.de.txt", spms["joint"], spms["joint"]
        )


def test_a_dictionary_of_another_model_is_refused(spms, tmp_path):
    cfg = ModelConfig(
        embed_dim=8,
        ffn_dim=16,
        attention_heads=2,
        encoder_layers=1,
        decoder_layers=1,
        share_all_embeddings=True,
    )
    _fairseq_case(tmp_path, spms, cfg, joint=True, style="namespace")
    small = tmp_path / "dict.small.txt"
    small.write_text("a 1\nb 1\n", encoding="utf-8")
    ckpt = read_fairseq_checkpoint(tmp_path / "checkpoint_best.pt")
    with pytest.raises(NmtError, match=r"dict\.small\.txt: 6 symbols"):
        import_fairseq(ckpt, small, small, spms["joint"], spms["joint"])
    rows = ckpt.state["encoder.embed_tokens.weight"].shape[0]
    other = tmp_path / "dict.other.txt"  # the right size, but another segmentation's symbols
    other.write_text("".join(f"w{i} 1\n" for i in range(rows - 4)), encoding="utf-8")
    with pytest.raises(
        NmtError, match=r"dict\.other\.txt: \d+ of \d+ pieces of .* are not in this"
    ):
        import_fairseq(ckpt, other, other, spms["joint"], spms["joint"])


def test_dictionary_format_errors_name_the_line(tmp_path):
    path = tmp_path / "dict.en.txt"
    path.write_text("hello 5\nworld\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"dict\.en\.txt:2: expected"):
        read_fairseq_dictionary(path)
    path.write_text("hello 5\nhello 3\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"dict\.en\.txt:2: duplicate symbol 'hello'"):
        read_fairseq_dictionary(path)
    path.write_text("hello 5\n<unk> 3 #fairseq:overwrite\n", encoding="utf-8")
    assert read_fairseq_dictionary(path) == ["<s>", "<pad>", "</s>", "<unk>", "hello", "<unk>"]


def test_existing_output_is_not_overwritten(spms, tmp_path):
    out = tmp_path / "imported.pt"
    out.write_bytes(b"precious")
    cfg = ImportFairseqConfig(
        checkpoint=str(tmp_path / "none.pt"), spm=str(spms["joint"]), output=str(out)
    )
    with pytest.raises(NmtError, match=r"exists and is not an nmt checkpoint, not one nmt-imp"):
        import_fairseq_checkpoint(cfg)
    assert out.read_bytes() == b"precious"


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(checkpoint=None), "checkpoint=null: required; give the fairseq checkpoint"),
        (dict(output=None), "output=null: required; give the nmt checkpoint to write"),
        (dict(spm=None), "spm=null: required; give the SentencePiece model the fairseq data"),
        (dict(src_spm="a.model"), "spm=j.model: set together with src_spm/tgt_spm; give spm="),
        (dict(spm=None, src_spm="a.model"), "src_spm=a.model: tgt_spm is not set; give both"),
        (dict(src_lang="e/n"), "src_lang=e/n: not a language suffix; give one such as en"),
    ],
)
def test_config_mistakes_are_named_in_the_option_style(options, message, tmp_path):
    base = dict(checkpoint=str(tmp_path / "c.pt"), spm="j.model", output=str(tmp_path / "o.pt"))
    cfg = ImportFairseqConfig(**{**base, **options})
    with pytest.raises(NmtError, match="^" + re.escape(message)):
        cfg.validate()
    with pytest.raises(NmtError, match="^" + re.escape(message)):
        import_fairseq_checkpoint(cfg)  # the library checks configs built in Python itself
