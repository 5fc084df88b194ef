"""One optimizer update: forward/backward over this rank's share of the batches, loss
scaling, unscale, clip, the optimizer step; an out-of-memory batch or an fp16 overflow
skips the update.

An update consumes `world_size * update_freq` consecutive batches of the epoch's seeded
batch list; rank r runs every world_size-th of them. The loss of every micro-batch is a
sum over its target tokens divided by the update's total target tokens (known up front
from the sentence lengths, so no communication is needed), times world_size because DDP
averages gradients over ranks. Hence 2 ranks x update_freq 1 and 1 rank x update_freq 2
make the same update from the same batches, as fairseq does.
"""

from __future__ import annotations

from contextlib import nullcontext
from typing import TYPE_CHECKING

import numpy as np
import torch

from nmt.data.batching import rank_share
from nmt.data.collate import collate
from nmt.data.vocab import PAD
from nmt.errors import NmtError
from nmt.training.loss import output_layer_loss

if TYPE_CHECKING:
    from nmt.training.trainer import Trainer


def train_step(t: Trainer, group: list[np.ndarray]) -> None:
    """One optimizer update from `group` (all ranks' batches of this update)."""
    model = t.ddp if t.ddp is not None else t.model
    model.train()
    # Target tokens of the whole update, over all ranks: known from the lengths alone.
    total_tokens = int(t.data.train.tgt_sizes[np.concatenate(group)].sum())
    share = rank_share(group, t.env.rank, t.env.world_size)
    try:
        loss_sums = forward_backward(t, model, group, share, total_tokens)
    except torch.OutOfMemoryError:
        skip_out_of_memory(t, group, total_tokens)
        return
    t.ooms_in_a_row = 0
    t.meter.add_losses(loss_sums)

    params = [p for p in t.model.parameters() if p.grad is not None]
    t.scaler.unscale_(t.optimizer)  # gnorm and clipping see the true gradients
    gnorm = torch.nn.utils.get_total_norm([g for p in params if (g := p.grad) is not None])
    if t.cfg.clip_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, t.cfg.clip_norm, gnorm)
    t.meter.lr = t.scheduler.step(t.progress.num_updates)
    if t.scaler.is_enabled():
        scale_before = t.scaler.get_scale()
        t.scaler.step(t.optimizer)
        t.scaler.update()
        skipped = t.scaler.get_scale() < scale_before
    else:
        t.optimizer.step()
        skipped = False
    t.optimizer.zero_grad(set_to_none=True)
    t.meter.tokens += total_tokens
    if skipped:
        report_overflow(t, scale_before)
        return
    t.progress.num_updates += 1
    t.meter.add_update(gnorm, t.progress.num_updates)
    if t.device.type == "cpu":  # a sync is free on CPU: stop at the very update
        t.meter.check_finite()


def forward_backward(
    t: Trainer, model: torch.nn.Module, group: list[np.ndarray], share: list, total_tokens: int
) -> torch.Tensor:
    """Gradients of this rank's share of an update; returns its [loss, nll] sums."""
    scale = t.env.world_size / total_tokens  # DDP divides the summed gradient by world_size
    sums = torch.zeros(2, dtype=torch.float64, device=t.device)
    pin = t.device.type == "cuda"
    for i, idx in enumerate(share):
        dummy = idx is None  # a short share: run a real batch with weight 0 to keep DDP in step
        rows = group[0] if dummy else idx
        batch = collate(rows, t.data.train.pairs(rows), pin_memory=pin).to(t.device)
        last = i == len(share) - 1
        sync = nullcontext() if (t.ddp is None or last) else t.ddp.no_sync()
        with sync:
            with t.runtime.autocast():
                features = model(batch.src_tokens, batch.prev_tokens, features_only=True)  # [B,T,D]
                out = output_layer_loss(
                    features, t.model.output_weight, batch.target, t.cfg.label_smoothing, PAD
                )
            t.scaler.scale(out.loss * (0.0 if dummy else scale)).backward()
        if not dummy:
            sums[0] += out.loss.detach()
            sums[1] += out.nll.detach()
    return sums


def skip_out_of_memory(t: Trainer, group: list[np.ndarray], tokens: int) -> None:
    """fairseq's behaviour: drop the update whose batch ran out of memory, count it, and
    go on; stop when it keeps happening (the batches are simply too big)."""
    t.optimizer.zero_grad(set_to_none=True)  # partial gradients of the failed update
    if t.device.type == "cuda":
        torch.cuda.empty_cache()
    sentences = sum(len(idx) for idx in group)
    update = t.progress.num_updates + 1
    where = f"update {update} ({sentences} sentences, {tokens} target tokens)"
    if t.env.is_distributed:  # the other ranks are already inside the gradient all-reduce
        raise NmtError(
            f"rank {t.env.rank}/{t.env.world_size}: out of memory in {where}; "
            "lower max_tokens (or raise update_freq to keep the effective batch)"
        )
    t.oom_skips += 1
    t.ooms_in_a_row += 1
    t.logger.event(
        "oom", update=update, sentences=sentences, tokens=tokens, skipped_total=t.oom_skips
    )
    t.logger.message(f"out of memory in {where}: skipped it ({t.oom_skips} skipped so far)")
    if t.ooms_in_a_row > t.cfg.max_oom_skips:
        raise NmtError(
            f"out of memory in {t.ooms_in_a_row} updates in a row, the last "
            f"{where}: lower max_tokens (or raise update_freq to keep the effective "
            f"batch); max_oom_skips={t.cfg.max_oom_skips}"
        )


def report_overflow(t: Trainer, scale_before: float) -> None:
    """An fp16 overflow skipped the update; the run stops once the scale is hopeless."""
    scale = t.scaler.get_scale()
    update = t.progress.num_updates + 1
    t.logger.message(
        f"fp16: gradient overflow in update {update}; skipped it, "
        f"loss scale {scale_before:g} -> {scale:g}"
    )
    if scale < t.cfg.fp16_min_scale:
        raise NmtError(
            f"precision=fp16: the loss scale fell below fp16_min_scale="
            f"{t.cfg.fp16_min_scale:g} at update {update}; the run "
            "diverges: lower optim.lr, set clip_norm, or use precision=bf16"
        )
