"""Validation: loss over the valid split and BLEU of decoded valid sentences.

`validate(t)` is what the training loop calls (the figures of t's current weights, its time
kept out of the training time); `evaluate` computes them from plain arguments.

A multilingual run validates each direction on its own part of the valid split
(TrainData.valid_sets, tagged as in training; with lang_tag=decoder the decode is forced to
start with the target's tag): its figures go under `directions` ({"en-de": {"loss": ..},
..}), and the entry's own loss, nll, ppl and bleu are the means over directions.
`tracked_value` is the figure the best checkpoint and patience follow: the mean, or
validation.direction's.

Decoding for BLEU goes through `decode_for_validation` only, so the search can be swapped
(nmt-generate's SequenceGenerator, greedy by default). Each rank decodes its share of the
sentences; the hypotheses are gathered and scored with sacrebleu (nmt.scoring) on every rank.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any

import numpy as np
import torch

from nmt import distributed
from nmt.data.batching import fixed_batches
from nmt.data.collate import Batch, collate
from nmt.data.dataset import PairDataset
from nmt.distributed import DistEnv
from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator
from nmt.model.transformer import Transformer
from nmt.runtime import Runtime
from nmt.scoring import corpus_bleu
from nmt.training.config import TrainConfig
from nmt.training.data import TrainData, ValidSet
from nmt.training.loss import output_layer_loss, per_token_base2, perplexity
from nmt.training.trainer import Trainer
from nmt.vocab import EOS, PAD


def validate(t: Trainer) -> dict[str, Any]:
    """Valid loss (and BLEU) of t's current weights, over all ranks; the seconds it took
    are left out of the training time."""
    t.meter.check_finite()
    start = time.monotonic()
    metrics = evaluate(t.model, t.data, t.cfg, t.runtime, t.env)
    metrics["seconds"] = round(time.monotonic() - start, 2)
    t.meter.exclude(time.monotonic() - start)  # validation is not training time
    return metrics


def evaluate(
    model: Transformer, data: TrainData, cfg: TrainConfig, runtime: Runtime, env: DistEnv
) -> dict[str, Any]:
    """Valid loss/nll/ppl, and BLEU with its signature when cfg.validation.bleu.enabled, of
    each valid set (per direction, then their means, in a multilingual run); each rank
    takes its share of the valid batches and the figures are reduced over ranks. The model
    is left in training mode."""
    if not data.valid_sets:
        raise ValueError("evaluate: the run has no valid split")
    model.eval()
    try:
        figures = {
            v.direction: _evaluate_set(model, v, data, cfg, runtime, env) for v in data.valid_sets
        }
    finally:
        model.train()
    if data.languages is None:
        return figures[""]
    return mean_over_directions(figures)


def _evaluate_set(
    model: Transformer,
    valid: ValidSet,
    data: TrainData,
    cfg: TrainConfig,
    runtime: Runtime,
    env: DistEnv,
) -> dict[str, Any]:
    metrics: dict[str, Any] = valid_loss(
        model,
        valid.dataset,
        valid.batches[env.rank :: env.world_size],
        device=runtime.device,
        autocast=runtime.autocast,
        label_smoothing=cfg.loss.label_smoothing,
    )
    if cfg.validation.bleu.enabled:
        metrics["bleu"], metrics["bleu_signature"] = valid_bleu(
            model,
            valid.dataset,
            valid.bleu_indices,
            data.tgt_tokenizer(),
            device=runtime.device,
            autocast=runtime.autocast,
            max_tokens=cfg.validation.max_tokens or cfg.max_tokens,
            rank=env.rank,
            world_size=env.world_size,
            beam=cfg.validation.bleu.beam,
            len_a=cfg.validation.bleu.len_a,
            len_b=cfg.validation.bleu.len_b,
            target_prefix=valid.target_prefix,
            never=tuple(data.languages.ids.values()) if data.languages is not None else (),
        )
    return metrics


def mean_over_directions(figures: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """The entry of a multilingual validation: the means of loss, nll and bleu over
    directions (ppl that of the mean nll), the tokens of all, and each direction's figures
    under `directions`."""
    first = next(iter(figures.values()))
    metrics: dict[str, Any] = {}
    for key in ("loss", "nll", "bleu"):
        if key in first:
            metrics[key] = sum(f[key] for f in figures.values()) / len(figures)
    metrics["ppl"] = perplexity(metrics["nll"])
    metrics["ntokens"] = sum(f["ntokens"] for f in figures.values())
    if "bleu_signature" in first:
        metrics["bleu_signature"] = first["bleu_signature"]
    metrics["directions"] = {
        d: {k: v for k, v in f.items() if k != "bleu_signature"} for d, f in figures.items()
    }
    return metrics


def tracked_value(metrics: dict[str, Any], cfg: TrainConfig) -> float:
    """The figure the best checkpoint and patience follow: validation.best_metric of
    validation.direction when set, else of the entry (a multilingual run's mean)."""
    if cfg.validation.direction:
        return float(metrics["directions"][cfg.validation.direction][cfg.validation.best_metric])
    return float(metrics[cfg.validation.best_metric])


def tracked_name(cfg: TrainConfig) -> str:
    """What tracked_value is, for the log: "loss", or "loss of en-de"."""
    of = f" of {cfg.validation.direction}" if cfg.validation.direction else ""
    return f"{cfg.validation.best_metric}{of}"


def decode_for_validation(
    model: Transformer,
    batch: Batch,
    *,
    beam: int,
    len_a: float,
    len_b: int,
    target_prefix: tuple[int, ...] = (),
    never: tuple[int, ...] = (),
) -> list[list[int]]:
    """The one place validation chooses its search: nmt-generate's beam search (beam 1 =
    greedy) with fairseq's length limit len_a * source length + len_b, each target forced
    to start with `target_prefix` (a decoder language tag), never choosing `never` (the
    language tags, as the Translator). Target ids per sentence, without the prefix and the
    final EOS."""
    generator = SequenceGenerator(
        [model], SearchConfig(beam=beam, max_len_a=len_a, max_len_b=len_b), never=never
    )
    prefix = None
    if target_prefix:
        rows = batch.src_tokens.size(0)
        prefix = torch.tensor([list(target_prefix)] * rows, device=batch.src_tokens.device)  # [B,P]
    hyps = generator.generate(batch.src_tokens, prefix_tokens=prefix)
    best = [h[0].tokens.tolist()[len(target_prefix) :] for h in hyps]
    return [[t for t in ids if t != EOS] for ids in best]


@torch.no_grad()
def valid_loss(
    model: Transformer,
    dataset: PairDataset,
    batches: list[np.ndarray],
    *,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
    label_smoothing: float,
) -> dict[str, float]:
    """loss/nll/ppl (base 2, per token) over all ranks' shares of `batches`."""
    sums = torch.zeros(3, dtype=torch.float64, device=device)  # loss, nll, ntokens
    for idx in batches:
        batch = collate(idx, dataset.pairs(idx)).to(device)
        with autocast():
            features = model(batch.src_tokens, batch.prev_tokens, features_only=True)  # [B,T,D]
            out = output_layer_loss(
                features, model.output_weight, batch.target, label_smoothing, PAD
            )
        sums += torch.stack(
            [
                out.loss.double(),
                out.nll.double(),
                torch.tensor(float(batch.ntokens), dtype=torch.float64, device=device),
            ]
        )
    loss, nll, ntokens = distributed.all_reduce_sum(sums).tolist()
    nll2 = per_token_base2(nll, int(ntokens))
    return {
        "loss": per_token_base2(loss, int(ntokens)),
        "nll": nll2,
        "ppl": perplexity(nll2),
        "ntokens": int(ntokens),
    }


@torch.no_grad()
def valid_bleu(
    model: Transformer,
    dataset: PairDataset,
    indices: np.ndarray,
    tgt_tokenizer,
    *,
    device: torch.device,
    autocast: Callable[[], AbstractContextManager],
    max_tokens: int,
    rank: int,
    world_size: int,
    beam: int,
    len_a: float,
    len_b: int,
    target_prefix: tuple[int, ...] = (),
    never: tuple[int, ...] = (),
) -> tuple[float, str]:
    """Corpus BLEU of decoded `indices` against their detokenized targets, and its
    signature; `target_prefix`, `never`: as decode_for_validation takes them."""
    batches = fixed_batches(indices, dataset.src_sizes, dataset.tgt_sizes, max_tokens=max_tokens)
    mine: list[tuple[int, str]] = []
    for idx in batches[rank::world_size]:
        batch = collate(idx, dataset.pairs(idx)).to(device)
        with autocast():
            hyps = decode_for_validation(
                model,
                batch,
                beam=beam,
                len_a=len_a,
                len_b=len_b,
                target_prefix=target_prefix,
                never=never,
            )
        mine.extend((int(i), tgt_tokenizer.decode(h)) for i, h in zip(idx, hyps))
    gathered = sorted(pair for part in distributed.all_gather_objects(mine) for pair in part)
    texts = [text for _, text in gathered]
    skip = len(target_prefix)  # a reference's tag is not text either
    refs = [tgt_tokenizer.decode(dataset.tgt[i].tolist()[skip:]) for i, _ in gathered]
    result = corpus_bleu(texts, [refs])
    return result.score, result.signature
