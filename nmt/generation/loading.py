"""Loading checkpoints for inference: the model and tokenizers a checkpoint file holds.

    bundle = load_for_inference("runs/demo/checkpoint_best.pt", "cpu")
    bundle.model, bundle.src_tokenizer, bundle.tgt_tokenizer, bundle.data

The file itself (its format, checksum, safe read) is nmt.checkpoint's; this module builds
the Transformer and the tokenizers from it, for the Translator, nmt-export and benchmarks.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass, fields
from typing import Any

import torch

from nmt.checkpoint import load_checkpoint, tensor_to_bytes
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.model.config import ModelConfig
from nmt.model.transformer import Transformer


def model_config_from_dict(d: dict[str, Any]) -> ModelConfig:
    """Rebuild ModelConfig, ignoring nothing silently: unknown keys are an error."""
    known = {f.name for f in fields(ModelConfig)}
    unknown = sorted(set(d) - known)
    if unknown:
        raise NmtError(f"checkpoint model_config has keys this nmt does not know: {unknown}")
    return ModelConfig(**d)


@dataclass
class InferenceBundle:
    """Everything generation needs, rebuilt from one checkpoint file."""

    model: Transformer
    src_tokenizer: Tokenizer
    tgt_tokenizer: Tokenizer
    data: dict[str, Any]  # src_lang, tgt_lang, vocab sizes, special_ids, normalization
    model_config: ModelConfig


def load_for_inference(
    path: str | os.PathLike, device: str | torch.device = "cpu"
) -> InferenceBundle:
    """Load model weights, config and tokenizers from a checkpoint, in eval mode."""
    ckpt = load_checkpoint(path)
    cfg = model_config_from_dict(ckpt["model_config"])
    data = ckpt.get("data") or {}
    try:
        model = Transformer(
            cfg,
            src_vocab_size=data["src_vocab_size"],
            tgt_vocab_size=data["tgt_vocab_size"],
            pad_id=data["special_ids"]["pad"],
        )
        tokenizers = ckpt["tokenizers"]
        src_tok = Tokenizer.from_bytes(tensor_to_bytes(tokenizers["src"]))
        tgt_tok = Tokenizer.from_bytes(tensor_to_bytes(tokenizers["tgt"]))
    except KeyError as exc:
        raise NmtError(
            f"{path}: checkpoint lacks {exc.args[0]!r}; it was not written by nmt"
        ) from exc
    try:
        model.load_state_dict(ckpt["model"], strict=True)
    except RuntimeError as exc:
        lines = [ln.strip() for ln in str(exc).splitlines() if ln.strip()]
        detail = lines[1] if len(lines) > 1 else lines[0]  # line 0 is torch's generic heading
        raise NmtError(
            f"{path}: weights do not fit the model config stored with them: {detail[:300]}"
        ) from exc
    model.to(device).eval()
    return InferenceBundle(
        model=model, src_tokenizer=src_tok, tgt_tokenizer=tgt_tok, data=data, model_config=cfg
    )


def load_ensemble(paths: Sequence[str], device: torch.device) -> list[InferenceBundle]:
    """The bundle of every checkpoint; all must share the first one's tokenizers."""
    bundles = [load_for_inference(p, device) for p in paths]
    first = bundles[0]
    for path, b in zip(paths[1:], bundles[1:]):
        for side in ("src", "tgt"):
            mine = getattr(b, f"{side}_tokenizer").model_bytes
            if mine != getattr(first, f"{side}_tokenizer").model_bytes:
                raise NmtError(
                    f"{path}: its {side} SentencePiece model differs from {paths[0]}'s; "
                    "an ensemble needs checkpoints trained on the same data dir"
                )
    return bundles
