"""One optimizer update: forward/backward over this rank's share of the batches, loss
scaling, unscale, clip, the optimizer step; an out-of-memory batch or an fp16 overflow
skips the update.

An update consumes `world_size * update_freq` consecutive batches of the epoch's seeded
batch list; rank r runs every world_size-th of them. The loss of every micro-batch is a
sum over its target tokens divided by the update's total target tokens (known up front
from the sentence lengths, so no communication is needed), times world_size because DDP
averages gradients over ranks. Hence 2 ranks x update_freq 1 and 1 rank x update_freq 2
make the same update from the same batches, as fairseq does. In fp16 the sums are
multiplied by the loss scale instead (fairseq's way: the scale is tuned for sums), and
the division happens in fp32, when the gradients are unscaled.

The host never waits for the GPU during an fp32 or bf16 update: everything the host
decides on (the update's token count, the real target positions, whether sources are
padded) comes from the batch's host copy, and the figures the meter keeps stay on the
device. fp16 reads one value per update, whether the gradient norm is finite, since
an overflow must skip the update (and the update counter, the schedule and the scale
depend on it). Under DDP the ranks also agree, on the host (nmt.distributed.
all_reduce_host), whether any of them ran out of memory.
"""

from __future__ import annotations

from contextlib import nullcontext
from dataclasses import dataclass
from functools import partial

import numpy as np
import torch

from nmt import distributed
from nmt.data.batching import rank_share
from nmt.data.collate import Batch, collate
from nmt.errors import NmtError
from nmt.training.loss import output_layer_loss, rdrop_output_layer_loss, real_positions
from nmt.training.trainer import Trainer, training_seconds
from nmt.vocab import PAD

# What CUDA libraries say when an allocation of their own fails: cuBLAS and cuDNN raise a
# RuntimeError naming their status, not torch.OutOfMemoryError (the caching allocator's).
OUT_OF_MEMORY_MARKS = (
    "out of memory",
    "CUBLAS_STATUS_ALLOC_FAILED",
    "CUDNN_STATUS_ALLOC_FAILED",
    "CUSOLVER_STATUS_ALLOC_FAILED",
)


def is_out_of_memory(exc: BaseException) -> bool:
    """torch's OutOfMemoryError, or a CUDA library's allocation failure."""
    if isinstance(exc, torch.OutOfMemoryError):
        return True
    return isinstance(exc, RuntimeError) and any(m in str(exc) for m in OUT_OF_MEMORY_MARKS)


def free_cached_memory(device: torch.device) -> None:
    """Give the CUDA caching allocator's free blocks back (after an out-of-memory batch's
    tensors are gone), so that the next batch can use memory in one piece."""
    if device.type == "cuda":
        torch.cuda.empty_cache()


def train_step(t: Trainer, group: list[np.ndarray]) -> None:
    """One optimizer update from `group` (all ranks' batches of this update)."""
    model = t.ddp if t.ddp is not None else t.model
    model.train()
    # Target tokens of the whole update, over all ranks: known from the stored lengths.
    stored_tokens = int(t.data.train.tgt_sizes[np.concatenate(group)].sum())
    share = rank_share(group, t.env.rank, t.env.world_size)
    sums = forward_backward(t, model, group, share, stored_tokens)
    ranks_out_of_memory, total_tokens, clock = agree_on_update(t, sums, stored_tokens)
    if sums is None or ranks_out_of_memory:
        t.optimizer.zero_grad(set_to_none=True)
        skip_out_of_memory(t, group, stored_tokens, ranks_out_of_memory)
        return
    t.ooms_in_a_row = 0
    t.meter.add_losses(sums.losses)

    params = [p for p in t.model.parameters() if p.grad is not None]
    grads = [g for p in params if (g := p.grad) is not None]
    if total_tokens != stored_tokens and not t.scaler.enabled:
        # Target-side subword sampling: the losses were divided by the stored token count
        # (the one known before the batches were drawn); the update's mean is over the
        # tokens drawn, which the ranks just agreed on.
        torch._foreach_mul_(grads, stored_tokens / total_tokens)
    if t.scaler.enabled:  # fp16: gradients of the scaled sums -> of the update's mean loss
        t.scaler.unscale_(grads, t.env.world_size / total_tokens)
    gnorm = torch.nn.utils.get_total_norm(grads)  # of the true gradients, before clipping
    t.meter.lr = t.scheduler.step(t.progress.num_updates, clock)
    t.meter.schedule_position = t.scheduler.position(t.progress.num_updates, clock)
    if t.scaler.enabled:
        scale_before = t.scaler.scale
        overflow = not bool(torch.isfinite(gnorm))  # fp16's one read from the device
        t.scaler.update(overflow)
        if overflow:
            t.optimizer.zero_grad(set_to_none=True)
            t.meter.tokens += total_tokens
            report_overflow(t, scale_before)
            return
    if t.cfg.optim.clip_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(params, t.cfg.optim.clip_norm, gnorm)
    t.optimizer.step()
    t.optimizer.zero_grad(set_to_none=True)
    t.meter.tokens += total_tokens
    t.progress.num_updates += 1
    if t.ema is not None:
        t.ema.update()
    t.meter.add_update(gnorm, t.progress.num_updates)
    if t.device.type == "cpu":  # a sync is free on CPU: stop at the very update
        t.meter.check_finite()


@dataclass
class ShareSums:
    """What this rank's share of an update adds up to."""

    losses: torch.Tensor  # [loss, nll, kl] sums over its target tokens (float64, on the device)
    tokens: int = 0  # its target tokens (those drawn, with target-side subword sampling)


def agree_on_update(
    t: Trainer, sums: ShareSums | None, stored_tokens: int
) -> tuple[int, int, float]:
    """(ranks that ran out of memory, the update's target tokens, the training clock in
    seconds), the same on every rank. Under DDP all come from the one host all-reduce an
    update already makes: all ranks skip the update or none, the loss is a mean over the
    tokens of all ranks, and a time-based schedule sets the same learning rate everywhere
    (the ranks' clocks, averaged to the microsecond)."""
    clock = training_seconds(t)
    tokens = stored_tokens if sums is None else sums.tokens
    if not t.env.is_distributed:
        return int(sums is None), tokens, clock
    ranks, total, micros = distributed.all_reduce_host(
        [int(sums is None), tokens, round(clock * 1e6)]
    )
    return ranks, total, micros / t.env.world_size / 1e6


def forward_backward(
    t: Trainer, model: torch.nn.Module, group: list[np.ndarray], share: list, total_tokens: int
) -> ShareSums | None:
    """Gradients of this rank's share of an update, its losses divided by `total_tokens`
    (the update's stored target tokens); returns the share's sums, or None when a batch
    ran out of memory (its gradients are then dropped).

    Under DDP a rank that ran out of memory still takes part in the update's gradient
    all-reduce, with one sentence of weight 0, so that the other ranks are not left
    waiting; the ranks then skip the update together (train_step). This is impossible
    only when memory runs out inside that all-reduce's backward pass.
    """
    if t.scaler.enabled:
        weight = t.scaler.scale  # fp16: scaled sums, divided by the tokens when unscaled
    else:
        weight = t.env.world_size / total_tokens  # DDP divides the summed gradient by world_size
    sums = ShareSums(torch.zeros(3, dtype=torch.float64, device=t.device))
    last = len(share) - 1
    for i, idx in enumerate(share):
        # A short share runs one real sentence with weight 0, to keep DDP in step.
        rows, w = (group[0][:1], 0.0) if idx is None else (idx, weight)
        failed = micro_batch(t, model, rows, w, None if idx is None else sums, sync=i == last)
        if failed is not None:
            break
    else:
        return sums
    t.optimizer.zero_grad(set_to_none=True)  # partial gradients of the failed update
    free_cached_memory(t.device)  # the failed batch's tensors went with micro_batch's frame
    if t.ddp is None:
        return None
    if failed == "backward" and i == last:
        raise NmtError(
            f"rank {t.env.rank}/{t.env.world_size}: out of memory in update "
            f"{t.progress.num_updates + 1} while its gradients were being exchanged with the "
            "other ranks, where it cannot be skipped; lower max_tokens (or raise update_freq "
            "to keep the effective batch)"
        )
    # The other ranks wait in the gradient all-reduce of their last batch: join it.
    if micro_batch(t, model, group[0][:1], 0.0, None, sync=True) is not None:
        raise NmtError(
            f"rank {t.env.rank}/{t.env.world_size}: out of memory in update "
            f"{t.progress.num_updates + 1}, even for one sentence; lower max_tokens, or "
            "free the GPU of other processes"
        )
    t.optimizer.zero_grad(set_to_none=True)
    return None


def micro_batch(
    t: Trainer,
    model: torch.nn.Module,
    rows: np.ndarray,
    weight: float,
    sums: ShareSums | None,
    *,
    sync: bool,
) -> str | None:
    """Forward and backward of the batch of `rows`, its loss multiplied by `weight`; adds
    its sums to `sums` (unless None). Under DDP, `sync` is the batch whose backward
    all-reduces the gradients. Returns None, or where memory ran out: "forward" or
    "backward" (the batch's tensors are freed when this returns).

    R-Drop (loss.rdrop_alpha > 0) runs the batch twice in one forward pass, the copies under
    different dropout; its objective counts both, so it is halved: the update's loss stays
    a mean over the batch's tokens (fairseq divides by twice the tokens)."""
    batch, positions, padded = to_device(t, rows)
    alpha = t.cfg.loss.rdrop_alpha
    src, prev = batch.src_tokens, batch.prev_tokens
    if alpha:
        src, prev = torch.cat([src, src]), torch.cat([prev, prev])  # [2B,S], [2B,T]
    context = nullcontext() if (t.ddp is None or sync) else t.ddp.no_sync()
    with context:
        try:
            with t.runtime.autocast():
                features = model(src, prev, features_only=True, src_padded=padded)  # [B or 2B,T,D]
                loss_fn = (
                    partial(rdrop_output_layer_loss, alpha=alpha) if alpha else output_layer_loss
                )
                out = loss_fn(
                    features,
                    t.model.output_weight,
                    batch.target,
                    t.cfg.loss.label_smoothing,
                    PAD,
                    positions=positions,
                    grad_scale=t.scaler.scale,
                )
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return "forward"
        passes = 2 if alpha else 1
        try:
            (out.minimized * (weight / passes)).backward()
        except Exception as exc:
            if not is_out_of_memory(exc):
                raise
            return "backward"
    if sums is not None:
        sums.losses[0] += out.loss.detach() / passes
        sums.losses[1] += out.nll.detach() / passes
        if out.kl is not None:
            sums.losses[2] += out.kl.detach()
        sums.tokens += batch.ntokens
    return None


def to_device(t: Trainer, rows: np.ndarray) -> tuple[Batch, torch.Tensor, bool]:
    """The batch of `rows` on the training device, with what the host knows about it
    without asking the device: its real target positions [N] (see
    nmt.training.loss.real_positions) and whether any source row is padded."""
    pin = t.device.type == "cuda"  # pinned host memory: the copies run asynchronously
    batch = collate(rows, t.data.train_pairs(rows, t.progress.epoch), pin_memory=pin)
    positions = real_positions(batch.target, PAD)  # [N]
    padded = int(batch.src_lengths.min()) < batch.src_tokens.size(1)
    if pin:
        positions = positions.pin_memory()
    return batch.to(t.device), positions.to(t.device, non_blocking=pin), padded


def skip_out_of_memory(t: Trainer, group: list[np.ndarray], tokens: int, ranks: int) -> None:
    """fairseq's behaviour: drop the update whose batch ran out of memory (on `ranks`
    ranks: all of them drop it), count it, and go on; stop when it keeps happening (the
    batches are simply too big)."""
    sentences = sum(len(idx) for idx in group)
    update = t.progress.num_updates + 1
    where = f"update {update} ({sentences} sentences, {tokens} target tokens)"
    if t.env.is_distributed:
        where += f" on {ranks} of {t.env.world_size} ranks"
    t.oom_skips += 1
    t.ooms_in_a_row += 1
    t.logger.event(
        "oom",
        update=update,
        sentences=sentences,
        tokens=tokens,
        ranks=ranks,
        skipped_total=t.oom_skips,
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
    scale = t.scaler.scale
    update = t.progress.num_updates + 1
    t.logger.message(
        f"fp16: gradient overflow in update {update}; skipped it, "
        f"loss scale {scale_before:g} -> {scale:g}"
    )
    if scale < t.cfg.fp16.min_scale:
        raise NmtError(
            f"precision=fp16: the loss scale fell below fp16.min_scale="
            f"{t.cfg.fp16.min_scale:g} at update {update}; the run "
            "diverges: lower optim.lr, set optim.clip_norm, or use precision=bf16"
        )
