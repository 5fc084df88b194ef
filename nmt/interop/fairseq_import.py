"""Convert a fairseq transformer checkpoint into an nmt checkpoint.

fairseq ids are dictionary positions (<s>0 <pad>1 </s>2 <unk>3, then dict.txt order,
then `madeupword` padding); nmt ids are SentencePiece ids with the same four specials at
0-3. So the embedding and output-projection rows are re-ordered into SentencePiece order:
each piece takes the row of its fairseq symbol, pieces fairseq never saw take the <unk>
row (fairseq maps them to <unk> too), and fairseq symbols that are not pieces are dropped.
A SentencePiece model trained with other special ids (e.g. spm's defaults, unk=0) is
rewritten so that the four specials sit at 0-3, with every other piece, score and the
normalizer unchanged: it segments text exactly as before.

The architecture is read from the tensors wherever they tell it (widths, depths, pre-norm,
learned positions, layernorm_embedding); the checkpoint's args/cfg supply what they cannot
(attention heads, activation, embedding scale, sharing, max positions). Neither fairseq nor
its source is needed: the checkpoint is read with nmt.interop.safe_unpickle.
"""

from __future__ import annotations

import argparse
import importlib
import math
import re
from collections.abc import Mapping
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import torch
from torch import Tensor

from nmt.errors import NmtError
from nmt.interop.config import ImportFairseqConfig
from nmt.interop.fairseq_languages import FairseqLanguages, fairseq_languages, with_control_pieces
from nmt.interop.safe_unpickle import load_untrusted
from nmt.vocab import BOS, EOS, PAD, SPECIAL_IDS, UNK

# fairseq's TransformerModel architectures (transformer_legacy.py); all share one layout.
SUPPORTED_ARCHS = (
    "transformer",
    "transformer_tiny",
    "transformer_iwslt_de_en",
    "transformer_wmt_en_de",
    "transformer_vaswani_wmt_en_de_big",
    "transformer_vaswani_wmt_en_fr_big",
    "transformer_wmt_en_de_big",
    "transformer_wmt_en_de_big_t2t",
)
SPECIAL_PIECES = {BOS: "<s>", PAD: "<pad>", EOS: "</s>", UNK: "<unk>"}  # fairseq's and nmt's
MADEUP = re.compile(r"^madeupword\d+$")  # fairseq's pad-to-multiple-of-8 filler symbols


# ---------------------------------------------------------------------------- reading


@dataclass
class FairseqCheckpoint:
    """What a fairseq checkpoint says about its model, as plain Python."""

    path: Path
    state: dict[str, Tensor]  # the model state dict, fairseq key names
    args: dict[str, Any]  # model hyperparameters, flat fairseq names (encoder_embed_dim, ...)
    source_lang: str | None
    target_lang: str | None
    task: dict[str, Any] = field(default_factory=dict)  # the task's options (flat)


def _plain(obj: Any) -> Any:
    """args/cfg as plain dicts: Namespace and OmegaConf containers unwrapped."""
    if isinstance(obj, argparse.Namespace):
        return dict(vars(obj))
    from omegaconf import DictConfig, ListConfig, OmegaConf

    if isinstance(obj, (DictConfig, ListConfig)):
        try:
            return OmegaConf.to_container(obj, resolve=True, throw_on_missing=False)
        except Exception:  # an interpolation that cannot resolve: keep it as written
            return OmegaConf.to_container(obj, resolve=False)
    return obj


def _flatten_model_cfg(model: Mapping[str, Any]) -> dict[str, Any]:
    """fairseq >= 0.10 dataclass configs nest `encoder: {embed_dim: ..}`; the legacy CLI
    names are the flattened ones (`encoder_embed_dim`), which is what the rest reads."""
    flat: dict[str, Any] = {}
    for key, value in model.items():
        value = _plain(value)
        if key in ("encoder", "decoder", "quant_noise") and isinstance(value, Mapping):
            for sub, v in value.items():
                flat[f"{key}_{sub}"] = _plain(v)
        else:
            flat[key] = value
    if "arch" not in flat and "_name" in flat:
        flat["arch"] = flat["_name"]
    return flat


def read_fairseq_checkpoint(path: str | Path) -> FairseqCheckpoint:
    """Load a fairseq checkpoint's model state and hyperparameters, refusing code."""
    path = Path(path)
    ckpt = load_untrusted(path)
    if not isinstance(ckpt, Mapping) or not isinstance(ckpt.get("model"), Mapping):
        raise NmtError(f"{path}: not a fairseq checkpoint (no 'model' state dict inside)")
    args = _plain(ckpt.get("args"))
    task: dict[str, Any] = {}
    if args:  # fairseq < 0.10: one flat Namespace holds model and task options
        model_args = dict(args)
        task = model_args
    else:
        cfg = _plain(ckpt.get("cfg"))
        if not isinstance(cfg, Mapping) or cfg.get("model") is None:
            raise NmtError(
                f"{path}: fairseq checkpoint has neither 'args' nor 'cfg.model'; "
                "cannot tell its architecture"
            )
        model_args = _flatten_model_cfg(_plain(cfg["model"]))
        task = _plain(cfg.get("task")) or {}
        if not isinstance(task, Mapping):
            task = {}
    state = {k: v for k, v in ckpt["model"].items() if isinstance(v, Tensor)}
    return FairseqCheckpoint(
        path=path,
        state=state,
        args=model_args,
        source_lang=task.get("source_lang") or model_args.get("source_lang"),
        target_lang=task.get("target_lang") or model_args.get("target_lang"),
        task=dict(task),
    )


def read_fairseq_dictionary(path: str | Path) -> list[str]:
    """fairseq Dictionary symbols in index order: <s> <pad> </s> <unk>, then dict.txt.

    Lines are `<symbol> <count> [#fairseq:overwrite]`, as fairseq's Dictionary.add_from_file
    reads them; a duplicate without the overwrite flag is an error there and here.
    """
    path = Path(path)
    if not path.is_file():
        raise NmtError(
            f"{path}: fairseq dictionary not found; pass src_dict=/tgt_dict= or "
            "data_dir= (the fairseq-preprocess destdir)"
        )
    symbols = [SPECIAL_PIECES[i] for i in range(4)]
    seen = set(symbols)
    with open(path, encoding="utf-8") as f:
        for lineno, raw in enumerate(f, start=1):
            line = raw.rstrip()
            if not line:
                continue
            parts = line.rsplit(" ", 1)
            overwrite = len(parts) == 2 and parts[1] == "#fairseq:overwrite"
            if overwrite:
                parts = parts[0].rsplit(" ", 1)
            if len(parts) != 2 or not parts[1].lstrip("-").isdigit():
                raise NmtError(
                    f"{path}:{lineno}: expected '<symbol> <count> [flags]', got {line[:60]!r}"
                )
            word = parts[0]
            if word in seen and not overwrite:
                raise NmtError(
                    f"{path}:{lineno}: duplicate symbol {word!r} (fairseq rejects it "
                    "too unless the line ends with #fairseq:overwrite)"
                )
            seen.add(word)
            symbols.append(word)
    return symbols


# ---------------------------------------------------------------------- sentencepiece


def spm_with_nmt_specials(model_bytes: bytes, source: str) -> bytes:
    """The same SentencePiece model with <s>0 <pad>1 </s>2 <unk>3 (nmt's fixed ids).

    Returned unchanged when it already has them. Otherwise the old special pieces are
    removed, the four are put first, and all other pieces keep their order, scores and
    types; segmentation depends on pieces and scores only, so it does not change.
    """
    import sentencepiece as spm

    try:
        proc = spm.SentencePieceProcessor(model_proto=model_bytes)
    except Exception as exc:
        raise NmtError(f"{source}: not a SentencePiece model ({str(exc)[:120]})") from exc
    if (proc.bos_id(), proc.pad_id(), proc.eos_id(), proc.unk_id()) == (BOS, PAD, EOS, UNK) and all(
        proc.id_to_piece(i) == p for i, p in SPECIAL_PIECES.items()
    ):
        return model_bytes
    # protobuf classes are made at import time: no static types to check against
    pb: Any = importlib.import_module("sentencepiece.sentencepiece_model_pb2")

    proto = pb.ModelProto()
    proto.ParseFromString(model_bytes)
    spec = proto.trainer_spec
    old_specials = {i for i in (spec.unk_id, spec.bos_id, spec.eos_id, spec.pad_id) if i >= 0}
    names = set(SPECIAL_PIECES.values())
    kept = [p for i, p in enumerate(proto.pieces) if i not in old_specials and p.piece not in names]
    specials = []
    for idx in range(4):
        piece = pb.ModelProto.SentencePiece()
        piece.piece = SPECIAL_PIECES[idx]
        piece.score = 0.0
        piece.type = piece.UNKNOWN if idx == UNK else piece.CONTROL
        specials.append(piece)
    del proto.pieces[:]
    proto.pieces.extend(specials + kept)
    spec.bos_id, spec.pad_id, spec.eos_id, spec.unk_id = BOS, PAD, EOS, UNK
    spec.bos_piece, spec.pad_piece, spec.eos_piece, spec.unk_piece = (
        SPECIAL_PIECES[BOS],
        SPECIAL_PIECES[PAD],
        SPECIAL_PIECES[EOS],
        SPECIAL_PIECES[UNK],
    )
    out = proto.SerializeToString()
    spm.SentencePieceProcessor(model_proto=out)  # must load: fails loudly on a bad rewrite
    return out


def _pieces_in_id_order(model_bytes: bytes) -> list[str]:
    """Every piece of a SentencePiece model, in id order."""
    import sentencepiece as spm

    proc = spm.SentencePieceProcessor(model_proto=model_bytes)
    return [proc.id_to_piece(i) for i in range(proc.get_piece_size())]


# ------------------------------------------------------------------------- vocabulary


@dataclass
class VocabMap:
    """For each nmt (SentencePiece) id, the fairseq row that supplies its weights."""

    rows: list[int]  # len = nmt vocab size; rows[i] = fairseq index for nmt id i
    missing: int  # pieces without a fairseq symbol (given the <unk> row)
    dropped: int  # fairseq symbols that are no piece (not counting madeupword padding)
    padding: int  # madeupword symbols (fairseq's pad-to-multiple-of-8)
    missing_examples: list[str] = field(default_factory=list)
    dropped_examples: list[str] = field(default_factory=list)


def vocab_map(pieces: list[str], symbols: list[str]) -> VocabMap:
    index: dict[str, int] = {}
    for i, sym in enumerate(symbols):
        index[sym] = i  # the last one wins, as in fairseq's Dictionary.indices
    rows, missing = [], []
    for nmt_id, piece in enumerate(pieces):
        if nmt_id < 4:
            rows.append(nmt_id)  # same four specials at the same ids on both sides
        elif piece in index:
            rows.append(index[piece])
        else:
            rows.append(UNK)
            missing.append(piece)
    piece_set = set(pieces)
    extra = [s for s in symbols[4:] if s not in piece_set]
    padding = [s for s in extra if MADEUP.match(s)]
    dropped = [s for s in extra if not MADEUP.match(s)]
    return VocabMap(
        rows=rows,
        missing=len(missing),
        dropped=len(dropped),
        padding=len(padding),
        missing_examples=missing[:5],
        dropped_examples=dropped[:5],
    )


# ----------------------------------------------------------------------- architecture


def _arg(args: Mapping[str, Any], key: str, default: Any) -> Any:
    value = args.get(key, default)
    return default if value is None else value


def check_supported(args: Mapping[str, Any], path: Path) -> None:
    """NmtError naming the first fairseq feature nmt's Transformer does not have."""
    arch = str(args.get("arch") or "")
    if "align" in arch:
        raise NmtError(
            f"{path}: architecture {arch!r} adds alignment heads "
            "(alignment-augmented transformer), which nmt does not support"
        )
    if arch.startswith("transformer_lm") or arch in ("lightconv_lm", "fconv_lm"):
        raise NmtError(
            f"{path}: architecture {arch!r} is a language model; nmt imports "
            "encoder-decoder translation models only"
        )
    if arch not in SUPPORTED_ARCHS:
        raise NmtError(
            f"{path}: architecture {arch!r} is not supported; nmt imports fairseq's "
            f"transformer architectures: {', '.join(SUPPORTED_ARCHS)}"
        )
    features = [
        ("adaptive_input", bool(args.get("adaptive_input")), "adaptive input embeddings"),
        (
            "adaptive_softmax_cutoff",
            args.get("adaptive_softmax_cutoff") not in (None, "", 0),
            "adaptive softmax",
        ),
        (
            "quant_noise_pq",
            float(_arg(args, "quant_noise_pq", 0)) > 0,
            "quant-noise (--quant-noise-pq)",
        ),
        (
            "quant_noise_scalar",
            float(_arg(args, "quant_noise_scalar", 0)) > 0,
            "quant-noise (--quant-noise-scalar)",
        ),
        (
            "no_token_positional_embeddings",
            bool(args.get("no_token_positional_embeddings")),
            "models without positional embeddings",
        ),
        ("cross_self_attention", bool(args.get("cross_self_attention")), "cross+self attention"),
        (
            "no_cross_attention",
            bool(args.get("no_cross_attention")),
            "decoders without cross attention",
        ),
        ("char_inputs", bool(args.get("char_inputs")), "character inputs"),
        ("base_layers", int(_arg(args, "base_layers", 0)) > 0, "BASE layers"),
        (
            "encoder_layers_to_keep",
            bool(args.get("encoder_layers_to_keep")),
            "pruned layers (layers_to_keep)",
        ),
        (
            "decoder_layers_to_keep",
            bool(args.get("decoder_layers_to_keep")),
            "pruned layers (layers_to_keep)",
        ),
        (
            "no_decoder_final_norm",
            bool(args.get("no_decoder_final_norm")),
            "pre-norm without the final decoder LayerNorm",
        ),
    ]
    for key, present, name in features:
        if present:
            raise NmtError(
                f"{path}: {name} ({key}={args.get(key)!r}) is not supported by nmt's Transformer"
            )
    for a, b, what in (
        ("encoder_embed_dim", "decoder_embed_dim", "embedding widths"),
        ("encoder_ffn_embed_dim", "decoder_ffn_embed_dim", "FFN widths"),
        ("encoder_attention_heads", "decoder_attention_heads", "attention heads"),
        ("encoder_normalize_before", "decoder_normalize_before", "norm placements"),
        ("encoder_learned_pos", "decoder_learned_pos", "position embedding kinds"),
    ):
        if a in args and b in args and args[a] != args[b]:
            raise NmtError(
                f"{path}: different encoder and decoder {what} ({a}={args[a]}, "
                f"{b}={args[b]}) are not supported by nmt's Transformer"
            )
    dim = args.get("decoder_embed_dim")
    for key in ("decoder_input_dim", "decoder_output_dim"):
        if dim is not None and args.get(key) not in (None, dim):
            raise NmtError(
                f"{path}: {key}={args[key]} differs from decoder_embed_dim={dim} "
                "(projected decoder input/output), which nmt does not support"
            )
    act = _arg(args, "activation_fn", "relu")
    if act not in ("relu", "gelu"):
        raise NmtError(f"{path}: activation_fn={act!r} is not supported; nmt has relu and gelu")


def _count_layers(state: Mapping[str, Tensor], prefix: str) -> int:
    pattern = re.compile(rf"^{prefix}\.layers\.(\d+)\.")
    found = {int(m.group(1)) for k in state if (m := pattern.match(k))}
    if found != set(range(len(found))):
        raise NmtError(
            f"{prefix} layers {sorted(found)} are not numbered 0..n-1 "
            "(pruned with layers_to_keep?); nmt cannot import them"
        )
    return len(found)


def model_config_from_fairseq(ckpt: FairseqCheckpoint) -> dict[str, Any]:
    """nmt ModelConfig fields; shapes from the tensors, the rest from args."""
    args, state, path = ckpt.args, ckpt.state, ckpt.path
    check_supported(args, path)
    emb = state.get("encoder.embed_tokens.weight")
    fc1 = state.get("encoder.layers.0.fc1.weight")
    if emb is None or fc1 is None:
        raise NmtError(
            f"{path}: no encoder.embed_tokens / encoder.layers.0.fc1 weights; "
            "not a fairseq transformer state dict"
        )
    heads = args.get("encoder_attention_heads")
    if heads is None:
        raise NmtError(
            f"{path}: args lack encoder_attention_heads; the tensors cannot tell the "
            "number of heads"
        )
    learned = "encoder.embed_positions.weight" in state
    norm_before = "encoder.layer_norm.weight" in state
    if norm_before != ("decoder.layer_norm.weight" in state):
        raise NmtError(
            f"{path}: encoder and decoder disagree on pre-norm (final layer_norm "
            "present on one side only), which nmt does not support"
        )
    share_all = bool(args.get("share_all_embeddings"))
    return {
        "embed_dim": int(emb.shape[1]),
        "ffn_dim": int(fc1.shape[0]),
        "attention_heads": int(heads),
        "encoder_layers": _count_layers(state, "encoder"),
        "decoder_layers": _count_layers(state, "decoder"),
        "dropout": float(_arg(args, "dropout", 0.1)),
        "attention_dropout": float(_arg(args, "attention_dropout", 0.0)),
        "activation_dropout": float(
            _arg(args, "activation_dropout", _arg(args, "relu_dropout", 0.0))
        ),
        "activation_fn": str(_arg(args, "activation_fn", "relu")),
        "normalize_before": norm_before,
        "max_source_positions": int(_arg(args, "max_source_positions", 1024)),
        "max_target_positions": int(_arg(args, "max_target_positions", 1024)),
        "learned_pos": learned,
        "scale_embedding": not bool(args.get("no_scale_embedding")),
        "layernorm_embedding": "encoder.layernorm_embedding.weight" in state,
        "share_decoder_input_output_embed": bool(args.get("share_decoder_input_output_embed")),
        "share_all_embeddings": share_all,
    }


# ----------------------------------------------------------------------------- weights


def _upgrade_keys(state: Mapping[str, Tensor]) -> dict[str, Tensor]:
    """fairseq's own state-dict upgrades for old checkpoints: fused in_proj -> q/k/v,
    `layer_norms.N` -> named norms, `embed_out` -> output_projection; buffers dropped."""
    out: dict[str, Tensor] = {}
    norm_names = {
        "encoder": ("self_attn_layer_norm", "final_layer_norm"),
        "decoder": ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"),
    }
    for key, value in state.items():
        if key.endswith((".version", "._float_tensor")):
            continue  # fairseq bookkeeping buffers, not weights
        m = re.match(r"^(encoder|decoder)\.layers\.(\d+)\.layer_norms\.(\d)\.(weight|bias)$", key)
        if m:
            side, layer, idx, kind = m.groups()
            out[f"{side}.layers.{layer}.{norm_names[side][int(idx)]}.{kind}"] = value
            continue
        m = re.match(r"^(.*)\.in_proj_(weight|bias)$", key)
        if m:
            for name, part in zip(("q_proj", "k_proj", "v_proj"), value.chunk(3, dim=0)):
                out[f"{m.group(1)}.{name}.{m.group(2)}"] = part
            continue
        if key == "decoder.embed_out":
            out["decoder.output_projection.weight"] = value
            continue
        out[key] = value
    return out


def convert_state(
    ckpt: FairseqCheckpoint, cfg: dict[str, Any], src_map: VocabMap, tgt_map: VocabMap
) -> dict[str, Tensor]:
    """fairseq tensors under nmt's names (the same names), vocabulary rows re-ordered."""
    state = _upgrade_keys(ckpt.state)
    if "decoder.output_projection.weight" not in state:
        if not (cfg["share_decoder_input_output_embed"] or cfg["share_all_embeddings"]):
            raise NmtError(
                f"{ckpt.path}: no decoder.output_projection weights and no shared "
                "embeddings; the checkpoint is incomplete"
            )
        state["decoder.output_projection.weight"] = state["decoder.embed_tokens.weight"]
    for key, vmap in (
        ("encoder.embed_tokens.weight", src_map),
        ("decoder.embed_tokens.weight", tgt_map),
        ("decoder.output_projection.weight", tgt_map),
    ):
        weight = state[key]
        if max(vmap.rows) >= weight.shape[0]:
            raise NmtError(
                f"{ckpt.path}: {key} has {weight.shape[0]} rows but the dictionary "
                f"has more symbols; the dict.*.txt files are not this model's"
            )
        state[key] = weight[torch.tensor(vmap.rows)].clone()  # [V_nmt, D]: nmt id order
    return state


def _check_dictionary_size(
    ckpt: FairseqCheckpoint, key: str, symbols: list[str], where: str
) -> None:
    rows = ckpt.state[key].shape[0]
    if len(symbols) != rows:  # the translation task embeds exactly the dictionary
        raise NmtError(
            f"{where}: {len(symbols)} symbols, but the checkpoint's {key} has {rows} "
            "rows; this is not the dictionary the model was trained with"
        )


# ------------------------------------------------------------------------------- import


@dataclass
class ImportReport:
    """What the conversion changed, for the user to see."""

    arch: str
    model_config: dict[str, Any]
    src: VocabMap
    tgt: VocabMap
    spm_rewritten: bool

    def lines(self) -> list[str]:
        out = [
            f"fairseq arch {self.arch}: "
            + ", ".join(
                f"{k}={v}"
                for k, v in self.model_config.items()
                if k
                in (
                    "embed_dim",
                    "ffn_dim",
                    "attention_heads",
                    "encoder_layers",
                    "decoder_layers",
                    "normalize_before",
                    "learned_pos",
                    "share_all_embeddings",
                )
            )
        ]
        for side, vm in (("source", self.src), ("target", self.tgt)):
            out.append(
                f"{side} vocabulary: {len(vm.rows)} pieces; {vm.missing} pieces not in "
                f"the fairseq dict get the <unk> row{_examples(vm.missing_examples)}; "
                f"{vm.dropped} fairseq symbols that are no piece dropped"
                f"{_examples(vm.dropped_examples)}; {vm.padding} madeupword fillers dropped"
            )
        if self.spm_rewritten:
            out.append(
                "SentencePiece model rewritten to nmt's special ids (<s>0 <pad>1 </s>2 "
                "<unk>3); segmentation is unchanged"
            )
        return out


def _examples(items: list[str]) -> str:
    return f" (e.g. {', '.join(items)})" if items else ""


def import_fairseq(
    ckpt: FairseqCheckpoint,
    src_dict: str | Path,
    tgt_dict: str | Path,
    src_spm: str | Path,
    tgt_spm: str | Path,
    src_lang: str | None = None,
    tgt_lang: str | None = None,
    languages: FairseqLanguages | None = None,
) -> tuple[dict[str, Any], ImportReport]:
    """Build the nmt checkpoint dict (docs/ARCHITECTURE.md) for a fairseq checkpoint;
    `languages`: a multilingual model's (nmt.interop.fairseq_languages), whose tokens
    become the SentencePiece models' control symbols and the checkpoint's tags."""
    from nmt.checkpoint import build_checkpoint
    from nmt.model.config import ModelConfig

    checkpoint = ckpt.path
    cfg = model_config_from_fairseq(ckpt)
    src_lang = src_lang or ckpt.source_lang or "src"
    tgt_lang = tgt_lang or ckpt.target_lang or "tgt"

    spm_bytes = {"src": _read_spm(src_spm), "tgt": _read_spm(tgt_spm)}
    fixed = {
        "src": spm_with_nmt_specials(spm_bytes["src"], str(src_spm)),
        "tgt": spm_with_nmt_specials(spm_bytes["tgt"], str(tgt_spm)),
    }
    src_symbols = read_fairseq_dictionary(src_dict)
    tgt_symbols = read_fairseq_dictionary(tgt_dict)
    if languages is not None:  # the task's tokens after dict.txt's, and as pieces
        tag_pieces = [languages.piece(lang) for lang in languages.langs]
        fixed = {side: with_control_pieces(b, tag_pieces) for side, b in fixed.items()}
        src_symbols = languages.dictionary(src_symbols)
        tgt_symbols = languages.dictionary(tgt_symbols)
    _check_dictionary_size(ckpt, "encoder.embed_tokens.weight", src_symbols, str(src_dict))
    _check_dictionary_size(ckpt, "decoder.embed_tokens.weight", tgt_symbols, str(tgt_dict))
    src_map = vocab_map(_pieces_in_id_order(fixed["src"]), src_symbols)
    tgt_map = vocab_map(_pieces_in_id_order(fixed["tgt"]), tgt_symbols)
    for vmap, sp_path, dict_path in ((src_map, src_spm, src_dict), (tgt_map, tgt_spm, tgt_dict)):
        if vmap.missing > (len(vmap.rows) - 4) / 2:
            raise NmtError(
                f"{dict_path}: {vmap.missing} of {len(vmap.rows) - 4} pieces of {sp_path} "
                "are not in this dictionary; pass the SentencePiece model the fairseq "
                "data was encoded with"
            )
    joint = fixed["src"] == fixed["tgt"]
    if cfg["share_all_embeddings"] and (not joint or src_symbols != tgt_symbols):
        raise NmtError(
            f"{checkpoint}: share_all_embeddings needs one joint dictionary and one "
            "SentencePiece model for both languages; pass spm= and matching dicts"
        )

    data_languages = {}
    if languages is not None:
        ids = {p: i for i, p in enumerate(_pieces_in_id_order(fixed["src"]))}
        data_languages = {"languages": languages.tags(ids).to_dict()}
        src_lang, tgt_lang = languages.directions[0].split("-")
    model_cfg = ModelConfig(**cfg)
    model_state = _nmt_state(
        convert_state(ckpt, cfg, src_map, tgt_map),
        model_cfg,
        len(src_map.rows),
        len(tgt_map.rows),
        checkpoint,
    )
    nmt_ckpt = build_checkpoint(
        model_state=model_state,
        model_config=asdict(model_cfg),
        data={
            "src_lang": src_lang,
            "tgt_lang": tgt_lang,
            "src_vocab_size": len(src_map.rows),
            "tgt_vocab_size": len(tgt_map.rows),
            "joint_vocab": joint,
            "special_ids": dict(SPECIAL_IDS),
            "normalization": {"nfkc": False},
            **data_languages,
        },
        src_tokenizer=fixed["src"],
        tgt_tokenizer=fixed["tgt"],
        config={
            "imported_from": "fairseq",
            "fairseq_checkpoint": str(checkpoint),
            "fairseq_args": _primitive_args(ckpt.args),
        },
    )
    report = ImportReport(
        arch=str(ckpt.args.get("arch")),
        model_config=cfg,
        src=src_map,
        tgt=tgt_map,
        spm_rewritten=fixed["src"] != spm_bytes["src"] or fixed["tgt"] != spm_bytes["tgt"],
    )
    return nmt_ckpt, report


def _read_spm(path: str | Path) -> bytes:
    path = Path(path)
    if not path.is_file():
        raise NmtError(
            f"{path}: SentencePiece model not found; pass spm= (or src_spm= and tgt_spm=)"
        )
    return path.read_bytes()


def _nmt_state(
    state: dict[str, Tensor], cfg: Any, src_vocab: int, tgt_vocab: int, checkpoint: Path
) -> dict[str, Tensor]:
    """Load the converted tensors into nmt's Transformer (every key and shape checked) and
    return its state dict, so that tied weights are tied exactly as nmt ties them."""
    from nmt.model.transformer import Transformer

    cfg.validate(src_vocab, tgt_vocab, PAD)
    model = Transformer(cfg, src_vocab_size=src_vocab, tgt_vocab_size=tgt_vocab, pad_id=PAD)
    expected = model.state_dict()
    unexpected = sorted(set(state) - set(expected))
    absent = sorted(set(expected) - set(state))
    if unexpected or absent:
        raise NmtError(
            f"{checkpoint}: weights do not map onto nmt's Transformer: unexpected "
            f"{unexpected[:4]}, missing {absent[:4]}; is this a plain fairseq transformer?"
        )
    for key, value in state.items():
        if tuple(value.shape) != tuple(expected[key].shape):
            raise NmtError(
                f"{checkpoint}: {key} has shape {tuple(value.shape)}, nmt expects "
                f"{tuple(expected[key].shape)} from the checkpoint's args"
            )
    model.load_state_dict(state, strict=True)
    return model.state_dict()


def _primitive_args(args: Mapping[str, Any]) -> dict[str, Any]:
    """The args values a weights_only load can read back (str/int/float/bool/None)."""
    out: dict[str, Any] = {}
    for key, value in args.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            if isinstance(value, float) and not math.isfinite(value):
                value = str(value)
            out[str(key)] = value
    return out


# ------------------------------------------------------------------ nmt-import-fairseq's call


@dataclass
class ImportResult:
    """What `import_fairseq_checkpoint` wrote, and the conversion's report."""

    output: Path  # the nmt checkpoint written
    src_lang: str
    tgt_lang: str
    report: ImportReport
    languages: dict[str, Any] | None = None  # a multilingual model's data.languages

    def lines(self) -> list[str]:
        if self.languages is None:
            return [
                *self.report.lines(),
                f"wrote {self.output} ({self.src_lang}->{self.tgt_lang}); translate with "
                f"nmt-generate checkpoint={self.output}",
            ]
        langs = ", ".join(self.languages["ids"])
        return [
            *self.report.lines(),
            f"wrote {self.output} (languages {langs}; lang_tag={self.languages['style']}); "
            f"translate with nmt-generate checkpoint={self.output} tgt_lang=<language>",
        ]


def import_fairseq_checkpoint(cfg: ImportFairseqConfig) -> ImportResult:
    """Convert `cfg.checkpoint` (with its dictionaries and SentencePiece model(s)) and save
    the nmt checkpoint `cfg.output` (nmt.checkpoint.save_checkpoint: atomic)."""
    from nmt.checkpoint import check_checkpoint_output, save_checkpoint

    cfg.validate()
    output = Path(str(cfg.output))
    check_checkpoint_output(output, "output", "nmt-import-fairseq", "imported_from", cfg.overwrite)
    src_spm, tgt_spm = (
        (Path(cfg.spm), Path(cfg.spm))
        if cfg.spm
        else (Path(str(cfg.src_spm)), Path(str(cfg.tgt_spm)))
    )
    ckpt = read_fairseq_checkpoint(str(cfg.checkpoint))
    languages = fairseq_languages(ckpt.task, cfg.langs or None, cfg.lang_tag, str(ckpt.path))
    src_lang = cfg.src_lang or ckpt.source_lang
    tgt_lang = cfg.tgt_lang or ckpt.target_lang
    if languages is not None:  # dict.<lang>.txt of the first direction (a joint dict)
        first = languages.directions[0].split("-")
        src_lang, tgt_lang = src_lang or first[0], tgt_lang or first[1]
    data_dir = Path(cfg.data_dir) if cfg.data_dir else ckpt.path.parent
    dicts = []
    for key, given, lang in (("src", cfg.src_dict, src_lang), ("tgt", cfg.tgt_dict, tgt_lang)):
        if not given and not lang:
            raise NmtError(
                f"{key}_lang=null: the checkpoint does not name its languages; give "
                f"{key}_lang= (or {key}_dict=PATH/dict.<lang>.txt)"
            )
        dicts.append(Path(given) if given else data_dir / f"dict.{lang}.txt")

    nmt_ckpt, report = import_fairseq(
        ckpt,
        dicts[0],
        dicts[1],
        src_spm,
        tgt_spm,
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        languages=languages,
    )
    save_checkpoint(nmt_ckpt, output)
    data = nmt_ckpt["data"]
    return ImportResult(output, data["src_lang"], data["tgt_lang"], report, data.get("languages"))
