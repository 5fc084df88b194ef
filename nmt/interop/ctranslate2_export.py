"""Export an nmt Transformer to a CTranslate2 model directory (ctranslate2's spec API).

nmt's parameter names and semantics are fairseq's, so the mapping is the one CTranslate2
uses for fairseq transformers: q/k/v projections fused into one linear for self-attention,
k/v fused for encoder-decoder attention, position tables written out explicitly (rows
from padding_idx + 1 on, fairseq's layout), the embedding scale written as a number.
Vocabularies are the SentencePiece pieces in id order (a piece's id is its nmt id), the
special tokens are nmt's (<s> <unk> </s>), the decoder starts with </s> and the source
gets </s> appended, as in nmt. The SentencePiece model(s) are copied next to the
weights, so the directory is all a CTranslate2 user needs.

A multilingual model (issue 49) exports as it is: its language tags are SentencePiece
control symbols, so they are pieces of the vocabulary ("<2fr>") like any other, and
nmt_export.json records them under "languages" (LanguageTags.to_dict: style, pieces,
ids, directions). CTranslate2 is called with the tags where nmt puts them:

    tags = [[p] for p in info["languages"]["pieces"].values()]
    # lang_tag=tgt: the target's tag first in the source (src_tgt: the source's, then it)
    translator.translate_batch([["<2fr>"] + sp.encode(text, out_type=str)],
                               suppress_sequences=tags)
    # lang_tag=decoder: the source as it is; the tag forced first in the target, and
    # dropped from the hypothesis (CTranslate2 returns the prefix with it)
    translator.translate_batch([sp.encode(text, out_type=str)],
                               target_prefix=[["<2fr>"]], suppress_sequences=tags)

suppress_sequences keeps the tags out of the free steps, as nmt's search does (the
forced prefix is not suppressed; CTranslate2 suppresses before its softmax and nmt after
it, which agree where the model gives a tag no probability of its own, as a trained one
does after the first target position). Scores: nmt's sums a forced decoder tag's
log-prob with the others' (as for any forced prefix), CTranslate2's leaves it out of the
sum; both count it in the length. With lenpen=0 they rank alike and CTranslate2's score
is the sum of nmt's token_scores; with a length penalty they may order the n-best apart.
CTranslate2 never ends a translation right after its target prefix, as nmt's min_len=1
does not (min_len and max_len_b count the tokens after the tag).

`ctranslate2` is an optional dependency (`pip install nmt[export]`).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path
from typing import Any, cast

import numpy as np
import torch
from torch import nn

from nmt.data.lexical import Shortlist
from nmt.errors import NmtError
from nmt.fsutil import (
    OutputKind,
    atomic_directory,
    atomic_write_bytes,
    atomic_write_text,
    check_replaceable,
    destination_lock,
    remove_stale_temps,
)
from nmt.interop.config import ExportConfig
from nmt.model.layers import (
    LearnedPositionalEmbedding,
    MultiheadAttention,
    SinusoidalPositionalEmbedding,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    _Layer,
)
from nmt.model.transformer import Transformer, TransformerDecoder, TransformerEncoder
from nmt.vocab import BOS, EOS, PAD, UNK

DECODER_START = EOS  # nmt's decoder input starts with </s>, as fairseq's
EXPORT_INFO = "nmt_export.json"  # where the export came from (exported_from, spm files, ...)
VMAP_FILE = "vmap.txt"  # the vocabulary map's name in a CTranslate2 model directory
# what nmt-export writes (CTranslate2's model.bin, config.json and vocabularies, the
# SentencePiece model(s), the vmap, nmt_export.json): overwrite=true replaces only such a
# directory
EXPORT_DIR = OutputKind(
    "nmt-export directory",
    EXPORT_INFO,
    (
        EXPORT_INFO,
        "model.bin",
        "config.json",
        "*vocabulary.json",
        "*vocabulary.txt",
        "spm*.model",
        VMAP_FILE,
    ),
)


def require_ctranslate2() -> Any:
    try:
        import ctranslate2
    except ImportError as exc:
        raise NmtError(
            "ctranslate2 is not installed; install it with `pip install "
            "'nmt[export]'` (or `pip install ctranslate2`)"
        ) from exc
    return ctranslate2


def _np(t: torch.Tensor) -> np.ndarray:
    return t.detach().to(torch.float32).cpu().numpy().copy()


def _linear(spec: Any, layer: nn.Linear) -> None:
    spec.weight = _np(layer.weight)
    if layer.bias is not None:
        spec.bias = _np(layer.bias)


def _fused(spec: Any, layers: list[nn.Linear]) -> None:
    """One linear computing several: weights stacked on the output axis [sum(out), in]."""
    spec.weight = np.concatenate([_np(x.weight) for x in layers])
    spec.bias = np.concatenate([_np(x.bias) for x in layers])


def _layer_norm(spec: Any, norm: nn.LayerNorm) -> None:
    spec.gamma = _np(norm.weight)
    spec.beta = _np(norm.bias)


def _attention(spec: Any, attn: MultiheadAttention, self_attention: bool) -> None:
    if self_attention:
        _fused(spec.linear[0], [attn.q_proj, attn.k_proj, attn.v_proj])
    else:
        _linear(spec.linear[0], attn.q_proj)
        _fused(spec.linear[1], [attn.k_proj, attn.v_proj])
    _linear(spec.linear[-1], attn.out_proj)


def _ffn(spec: Any, layer: _Layer) -> None:
    _layer_norm(spec.layer_norm, layer.final_layer_norm)
    _linear(spec.linear_0, layer.fc1)
    _linear(spec.linear_1, layer.fc2)


def _position_table(module: nn.Module) -> np.ndarray:
    """Rows for positions 0.. (fairseq's table without its padding_idx + 1 unused rows)."""
    if isinstance(module, LearnedPositionalEmbedding):
        table, padding_idx = module.weight, module.padding_idx  # [N, D]
    else:
        assert isinstance(module, SinusoidalPositionalEmbedding)
        table, padding_idx = module.weights, module.padding_idx
    assert padding_idx is not None
    return _np(table[padding_idx + 1 :])


def _inputs(spec: Any, side: TransformerEncoder | TransformerDecoder, embed_scale: float) -> None:
    embeddings = spec.embeddings[0] if isinstance(spec.embeddings, list) else spec.embeddings
    embeddings.weight = _np(side.embed_tokens.weight)
    spec.scale_embeddings = float(embed_scale)  # a number: sqrt(D), or 1.0 without scaling
    spec.position_encodings.encodings = _position_table(side.embed_positions)
    if side.layernorm_embedding is not None:
        _layer_norm(spec.layernorm_embedding, side.layernorm_embedding)
    if side.layer_norm is not None:
        _layer_norm(spec.layer_norm, side.layer_norm)


def build_spec(
    model: Transformer, model_config: Any, src_pieces: list[str], tgt_pieces: list[str]
) -> Any:
    """A ctranslate2 TransformerSpec holding the model's weights and vocabularies."""
    require_ctranslate2()
    from ctranslate2.specs import common_spec, transformer_spec

    cfg = model_config
    activation = {"relu": common_spec.Activation.RELU, "gelu": common_spec.Activation.GELU}
    spec = transformer_spec.TransformerSpec.from_config(
        (cfg.encoder_layers, cfg.decoder_layers),
        cfg.attention_heads,
        pre_norm=cfg.normalize_before,
        activation=activation[cfg.activation_fn],
        layernorm_embedding=cfg.layernorm_embedding,
    )
    scale = math.sqrt(cfg.embed_dim) if cfg.scale_embedding else 1.0
    encoder, decoder = model.encoder, model.decoder
    _inputs(spec.encoder, encoder, scale)
    encoder_layers = cast(list[TransformerEncoderLayer], encoder.layers)
    for layer_spec, enc_layer in zip(spec.encoder.layer, encoder_layers):
        _attention(layer_spec.self_attention, enc_layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, enc_layer.self_attn_layer_norm)
        _ffn(layer_spec.ffn, enc_layer)
    _inputs(spec.decoder, decoder, scale)
    _linear(spec.decoder.projection, decoder.output_projection)
    decoder_layers = cast(list[TransformerDecoderLayer], decoder.layers)
    for layer_spec, layer in zip(spec.decoder.layer, decoder_layers):
        _attention(layer_spec.self_attention, layer.self_attn, self_attention=True)
        _layer_norm(layer_spec.self_attention.layer_norm, layer.self_attn_layer_norm)
        _attention(layer_spec.attention, layer.encoder_attn, self_attention=False)
        _layer_norm(layer_spec.attention.layer_norm, layer.encoder_attn_layer_norm)
        _ffn(layer_spec.ffn, layer)

    spec.register_source_vocabulary(list(src_pieces))
    spec.register_target_vocabulary(list(tgt_pieces))
    config = spec.config
    config.unk_token, config.bos_token, config.eos_token = (
        tgt_pieces[UNK],
        tgt_pieces[BOS],
        tgt_pieces[EOS],
    )
    config.decoder_start_token = tgt_pieces[DECODER_START]
    config.add_source_bos = False
    config.add_source_eos = True  # nmt's sources end with </s>
    config.layer_norm_epsilon = 1e-5  # torch.nn.LayerNorm's default, which nmt uses
    return spec


def spm_pieces(model_bytes: bytes) -> list[str]:
    """A SentencePiece model's pieces in id order; its special ids must be nmt's."""
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_proto=model_bytes)
    pieces = [proc.id_to_piece(i) for i in range(proc.get_piece_size())]
    if len(set(pieces)) != len(pieces):
        raise NmtError(
            "checkpoint tokenizer: duplicate SentencePiece pieces; CTranslate2 "
            "needs one string per id"
        )
    ids = (proc.bos_id(), proc.pad_id(), proc.eos_id(), proc.unk_id())
    if ids != (BOS, PAD, EOS, UNK):
        raise NmtError(
            f"checkpoint tokenizer: special ids (bos, pad, eos, unk) = {ids}, not "
            f"nmt's {(BOS, PAD, EOS, UNK)}; re-run nmt-preprocess"
        )
    return pieces


def export_ctranslate2(
    checkpoint: str | os.PathLike,
    output_dir: str | os.PathLike,
    quantization: str = "none",
    overwrite: bool = False,
    vmap: str | os.PathLike | None = None,
) -> dict[str, Any]:
    """Write a CTranslate2 model directory; returns what nmt_export.json records.

    The directory is assembled beside `output_dir` and renamed into place
    (nmt.fsutil.atomic_directory), so an interrupted export never leaves a half-written
    model. An existing `output_dir` is replaced only with `overwrite`, and only when it is
    an earlier export holding nothing else (nmt.fsutil.check_replaceable); two exports to
    one `output_dir` at a time: the second is refused (nmt.fsutil.destination_lock).
    `vmap`: a shortlist file (nmt-shortlist), checked against the model's vocabularies and
    written as the model's vocabulary map, vmap.txt (CTranslate2's use_vmap=True).
    """
    ExportConfig(
        checkpoint=str(checkpoint),
        output_dir=str(output_dir),
        quantization=quantization,
        vmap=None if vmap is None else str(vmap),
        overwrite=overwrite,
    ).validate()
    require_ctranslate2()
    output_dir = Path(output_dir)
    check_replaceable(output_dir, "output_dir", EXPORT_DIR, overwrite)  # before slow work
    from nmt.generation.loading import load_for_inference

    bundle = load_for_inference(checkpoint, "cpu")
    src_pieces = spm_pieces(bundle.src_tokenizer.model_bytes)
    tgt_pieces = spm_pieces(bundle.tgt_tokenizer.model_bytes)
    if (
        len(src_pieces) != bundle.data["src_vocab_size"]
        or len(tgt_pieces) != bundle.data["tgt_vocab_size"]
    ):
        raise NmtError(
            f"{checkpoint}: tokenizer sizes ({len(src_pieces)}, {len(tgt_pieces)}) differ "
            "from the model's vocabulary sizes; the checkpoint is inconsistent"
        )
    vmap_bytes = None
    if vmap is not None:  # read and checked like nmt-generate's shortlist=
        Shortlist.from_file(vmap, bundle.src_tokenizer, bundle.tgt_tokenizer, key="vmap")
        vmap_bytes = Path(vmap).read_bytes()
    with torch.no_grad():
        spec = build_spec(bundle.model, bundle.model_config, src_pieces, tgt_pieces)
    try:
        spec.validate()
        spec.optimize(quantization=None if quantization == "none" else quantization)
    except ValueError as exc:  # ctranslate2 reports spec problems as ValueError
        raise NmtError(f"{checkpoint}: CTranslate2 rejected the model: {exc}") from exc

    data = bundle.data
    spm_files = _tokenizer_files(bundle, data)
    info = {
        "exported_from": str(checkpoint),
        "quantization": quantization,
        "src_lang": data.get("src_lang"),
        "tgt_lang": data.get("tgt_lang"),
        "spm": spm_files,
        "vmap": None if vmap is None else str(vmap),
        "special_ids": data.get("special_ids"),
        "normalization": data.get("normalization"),
        "languages": data.get("languages"),  # a multilingual model's tags, else None
        "model_config": {
            k: getattr(bundle.model_config, k)
            for k in (
                "embed_dim",
                "encoder_layers",
                "decoder_layers",
                "normalize_before",
                "max_source_positions",
                "max_target_positions",
            )
        },
    }
    try:
        with destination_lock(output_dir, f"output_dir={output_dir}"):
            check_replaceable(output_dir, "output_dir", EXPORT_DIR, overwrite)  # under the lock
            remove_stale_temps(output_dir)  # what a killed export left beside it
            with atomic_directory(output_dir) as tmp:
                spec.save(str(tmp))
                models = {
                    spm_files["src"]: bundle.src_tokenizer.model_bytes,
                    spm_files["tgt"]: bundle.tgt_tokenizer.model_bytes,  # one file when joint
                }
                for name, model_bytes in models.items():
                    atomic_write_bytes(tmp / name, model_bytes)
                if vmap_bytes is not None:
                    atomic_write_bytes(tmp / VMAP_FILE, vmap_bytes)
                atomic_write_text(tmp / EXPORT_INFO, json.dumps(info, indent=2) + "\n")
    except OSError as exc:
        raise NmtError(
            f"output_dir={output_dir}: could not write it ({exc.strerror or exc}); choose a "
            "writable path"
        ) from exc
    return info


def _tokenizer_files(bundle: Any, data: dict[str, Any]) -> dict[str, str]:
    """File names of the SentencePiece model(s) in the export: one joint, or one per side."""
    if bundle.src_tokenizer.model_bytes == bundle.tgt_tokenizer.model_bytes:
        return {"src": "spm.model", "tgt": "spm.model"}
    return {
        "src": f"spm.{data.get('src_lang', 'src')}.model",
        "tgt": f"spm.{data.get('tgt_lang', 'tgt')}.model",
    }
