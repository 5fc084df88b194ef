"""Label-smoothed cross-entropy with fairseq's semantics.

fairseq spreads the smoothing mass `epsilon` over the V-1 wrong classes:
    loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v),   eps_i = eps / (V - 1)
and ignores padding positions entirely. Both terms are returned as *sums* over target
tokens, so that the trainer can normalise by the total target tokens of an update
(across micro-batches and ranks), which is what makes gradient accumulation and DDP
give the same update.

Reported figures are per target token in base 2, as fairseq prints them:
loss/ln(2)/ntokens, nll likewise, and ppl = 2**nll.

Training computes the output layer and this loss together (`output_layer_loss`), a block
of target positions at a time, so that the [tokens, V] logits, their log-softmax and
their gradients never exist for the whole batch: on a CPU those 100+ MB blocks went back
to the kernel on every free and were page-faulted in again on every step.
"""

from __future__ import annotations

import math
from contextlib import nullcontext
from dataclasses import dataclass

import torch
import torch.nn.functional as F

LN2 = math.log(2.0)


@dataclass
class LossOutput:
    """Sums over the non-pad target tokens of one batch (0-dim tensors, float32)."""

    loss: torch.Tensor  # label-smoothed loss, summed, nats
    nll: torch.Tensor  # negative log-likelihood, summed, nats


def label_smoothed_nll_loss(
    logits: torch.Tensor, target: torch.Tensor, epsilon: float, ignore_index: int
) -> LossOutput:
    """logits [B,T,V] (any float dtype), target [B,T] -> summed loss and nll in fp32."""
    vocab = logits.size(-1)
    # [B,T,V] -> [B*T,V]: one flat row per target position; log-softmax in fp32 for bf16/fp16.
    lprobs = F.log_softmax(logits.reshape(-1, vocab).float(), dim=-1)
    flat_target = target.reshape(-1)  # [B*T]
    keep = flat_target != ignore_index  # [B*T]
    # Gather with a safe index at pad positions; they are masked out below anyway.
    safe_target = flat_target.masked_fill(~keep, 0).unsqueeze(-1)  # [B*T,1]
    nll = -lprobs.gather(dim=-1, index=safe_target).squeeze(-1)  # [B*T]
    nll = nll.masked_fill(~keep, 0.0).sum()
    if epsilon == 0.0:
        return LossOutput(loss=nll, nll=nll)
    smooth = (-lprobs.sum(dim=-1)).masked_fill(~keep, 0.0).sum()
    eps_i = epsilon / (vocab - 1)
    loss = (1.0 - epsilon - eps_i) * nll + eps_i * smooth
    return LossOutput(loss=loss, nll=nll)


def per_token_base2(total_nats: float, ntokens: int) -> float:
    """A summed loss in nats as fairseq reports it: base 2, per target token."""
    return total_nats / max(ntokens, 1) / LN2


def perplexity(nll_base2: float) -> float:
    """2**nll, capped so that a diverged run logs a large number instead of inf."""
    return 2.0 ** min(nll_base2, 100.0)


# Elements of a [rows, V] logits block in output_layer_loss. On a CPU a block stays near
# 16 MB for an 8k vocabulary, small enough for malloc to reuse instead of mmap afresh. On a
# GPU each block costs a dozen kernel launches, so blocks are as large as memory allows
# comfortably (2048 rows of a 32k vocabulary: ~13 blocks for a 25k-token batch, not ~200).
BLOCK_ELEMENTS = 4 * 1024 * 1024
GPU_BLOCK_ELEMENTS = 64 * 1024 * 1024


def block_elements_for(device: torch.device) -> int:
    """The block size of output_layer_loss on `device`: BLOCK_ELEMENTS on a CPU; on a GPU
    GPU_BLOCK_ELEMENTS, or less on a small GPU (a block and its fp32 copy stay under
    1/128 of its memory)."""
    if device.type != "cuda":
        return BLOCK_ELEMENTS
    total = torch.cuda.get_device_properties(device).total_memory  # bytes; cached by torch
    return max(BLOCK_ELEMENTS, min(GPU_BLOCK_ELEMENTS, total // (128 * 6)))


def real_positions(target: torch.Tensor, ignore_index: int) -> torch.Tensor:
    """[N] flat indices of the non-pad positions of target [B,T], for output_layer_loss.

    Call it on the batch's host copy before it moves to a GPU: finding them on the GPU
    would make the host wait for the device (the number of positions sets a shape).
    """
    return (target.reshape(-1) != ignore_index).nonzero().squeeze(1)


def output_layer_loss(
    features: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int,
    block_elements: int | None = None,
    *,
    positions: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> LossOutput:
    """The output projection and label_smoothed_nll_loss in one pass over blocks of rows.

    features [B,T,D]: the decoder's last hidden states (before the output projection);
    weight [V,D]: the output projection; target [B,T]. Returns the same sums as
    label_smoothed_nll_loss(features @ weight.T, ...), with gradients for features and
    weight, computed under autocast in its dtype as the plain output layer would be.
    Padding positions are dropped before the projection, so they cost nothing.

    `positions` [N] (on features' device): the flat indices of the non-pad positions,
    from `real_positions` on the host; without them they are found here, which on a GPU
    waits for the device. `block_elements`: see block_elements_for (the default).
    `grad_scale`: the factor the loss's gradient will arrive with in backward (fp16's
    loss scale): the logits' gradient is multiplied by it before it is rounded to fp16,
    so that small probabilities do not underflow, and divided back in backward.
    """
    dim = features.size(-1)
    flat_target = target.reshape(-1)  # [B*T]
    if positions is None:
        positions = (flat_target != ignore_index).nonzero().squeeze(1)  # [N]
    hidden = features.reshape(-1, dim).index_select(0, positions)  # [N,D] real positions
    gold = flat_target.index_select(0, positions)  # [N]
    device = features.device.type
    autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
    dtype = torch.get_autocast_dtype(device) if autocast else weight.dtype
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if block_elements is None:
        block_elements = block_elements_for(features.device)
    rows = max(1, block_elements // weight.size(0))
    loss, nll = _OutputLayerCrossEntropy.apply(
        hidden, weight, gold, epsilon, dtype, rows, want_grad, float(grad_scale)
    )
    return LossOutput(loss=loss, nll=nll)


class _OutputLayerCrossEntropy(torch.autograd.Function):
    """Loss and nll sums of hidden [N,D] @ weight[V,D].T against gold [N].

    The gradients are computed in the forward pass, block by block, while each block's
    logits are at hand; backward only scales them. With p = softmax(z) and
    eps_i = eps / (V - 1), the loss's gradient for logits z of a row with gold token g is
    p - eps_i - (1 - eps - eps_i) * onehot(g) (the p terms of nll and smoothing add up
    to exactly p). It is kept multiplied by `grad_scale`, which backward divides out.
    """

    @staticmethod
    def forward(ctx, hidden, weight, gold, epsilon, dtype, rows, want_grad, grad_scale):
        vocab = weight.size(0)
        eps_i = epsilon / (vocab - 1)
        gold_weight = 1.0 - epsilon - eps_i
        device = hidden.device.type
        no_autocast = (
            torch.autocast(device, enabled=False)
            if torch.amp.is_autocast_available(device)
            else nullcontext()
        )
        with no_autocast:
            w = weight.to(dtype)  # [V,D]
            h = hidden.to(dtype)  # [N,D]
            nll = torch.zeros((), dtype=torch.float32, device=hidden.device)
            smooth = torch.zeros_like(nll)
            grad_h = (
                torch.empty(hidden.shape, dtype=torch.float32, device=hidden.device)
                if want_grad
                else None
            )
            grad_w = (
                torch.zeros(weight.shape, dtype=torch.float32, device=hidden.device)
                if want_grad
                else None
            )
            # One [rows,V] buffer for the logits in the compute dtype and one in fp32 (the
            # same one for fp32), reused by every block: a fresh 16 MB tensor per block
            # was page-faulted in again each time, and cast at half the speed.
            logits_buf = h.new_empty(min(rows, h.size(0)), vocab)
            work_buf = (
                logits_buf
                if dtype == torch.float32
                else torch.empty_like(logits_buf, dtype=torch.float32)
            )
            grad_w_blk = (
                w.new_empty(w.shape) if want_grad and dtype != torch.float32 else None
            )  # [V,D]
            for start in range(0, h.size(0), rows):
                h_blk = h[start : start + rows]  # [n,D]
                g_blk = gold[start : start + rows, None]  # [n,1]
                n = h_blk.size(0)
                logits = torch.mm(h_blk, w.t(), out=logits_buf[:n])  # [n,V]
                z = work_buf[:n] if dtype == torch.float32 else work_buf[:n].copy_(logits)  # fp32
                # logsumexp by hand, so that its exponentials are computed once and then
                # become the softmax in place (one pass over [n,V] less).
                top = z.amax(dim=-1, keepdim=True)  # [n,1]
                gold_z = z.gather(1, g_blk)  # [n,1]
                if epsilon:
                    smooth += (vocab * top - z.sum(dim=-1, keepdim=True)).sum()
                e = z.sub_(top).exp_()  # [n,V] exp(z - top), in place of z
                total = e.sum(dim=-1, keepdim=True)  # [n,1]
                lse = total.log() + top  # [n,1]
                nll += (lse - gold_z).sum()
                if epsilon:
                    smooth += vocab * (lse - top).sum()
                if want_grad:
                    # p (times grad_scale), in place of z; scaled before any cast to fp16
                    inverse = total.reciprocal() if grad_scale == 1.0 else grad_scale / total
                    grad_z = e.mul_(inverse)
                    if eps_i:
                        grad_z.sub_(eps_i * grad_scale)
                    grad_z.scatter_add_(
                        1,
                        g_blk,
                        torch.full(g_blk.shape, -gold_weight * grad_scale, device=z.device),
                    )
                    if dtype != torch.float32:  # back into the logits' buffer, now free
                        grad_z = logits.copy_(grad_z)
                    grad_h[start : start + rows] = grad_z @ w  # [n,D]
                    if dtype == torch.float32:  # [V,D], accumulated in fp32 in place
                        grad_w.addmm_(grad_z.t(), h_blk)
                    else:
                        grad_w.add_(torch.mm(grad_z.t(), h_blk, out=grad_w_blk))
        loss = gold_weight * nll + eps_i * smooth if epsilon else nll.clone()
        ctx.mark_non_differentiable(nll)
        if want_grad:
            ctx.save_for_backward(grad_h, grad_w)
        ctx.dtypes = (hidden.dtype, weight.dtype)
        ctx.grad_scale = grad_scale
        return loss, nll

    @staticmethod
    def backward(ctx, grad_loss, grad_nll):
        grad_h, grad_w = ctx.saved_tensors
        h_dtype, w_dtype = ctx.dtypes
        if ctx.grad_scale != 1.0:
            grad_loss = grad_loss / ctx.grad_scale
        return (
            (grad_h * grad_loss).to(h_dtype),
            (grad_w * grad_loss).to(w_dtype),
            None,
            None,
            None,
            None,
            None,
            None,
        )
