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
    kl: torch.Tensor | None = None  # R-Drop: the two passes' symmetric KL, summed, nats
    objective: torch.Tensor | None = None  # what training differentiates, when not `loss`

    @property
    def minimized(self) -> torch.Tensor:
        """The sum to differentiate: `objective` (R-Drop: loss + alpha * kl) or `loss`."""
        return self.loss if self.objective is None else self.objective


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
    dtype = _compute_dtype(features, weight)
    want_grad = torch.is_grad_enabled() and (hidden.requires_grad or weight.requires_grad)
    if block_elements is None:
        block_elements = block_elements_for(features.device)
    rows = max(1, block_elements // weight.size(0))
    loss, nll = _OutputLayerCrossEntropy.apply(
        hidden, weight, gold, epsilon, dtype, rows, want_grad, float(grad_scale)
    )
    return LossOutput(loss=loss, nll=nll)


def _compute_dtype(features: torch.Tensor, weight: torch.Tensor) -> torch.dtype:
    """The dtype the output projection runs in: autocast's, or the weight's."""
    device = features.device.type
    autocast = torch.amp.is_autocast_available(device) and torch.is_autocast_enabled(device)
    return torch.get_autocast_dtype(device) if autocast else weight.dtype


def _scaled_gradients(ctx, grad_out: torch.Tensor) -> tuple[torch.Tensor, ...]:
    """The gradients a fused forward saved (times grad_scale), times the incoming gradient
    of its sum, in the dtypes of the inputs they belong to."""
    if ctx.grad_scale != 1.0:
        grad_out = grad_out / ctx.grad_scale
    return tuple((g * grad_out).to(dtype) for g, dtype in zip(ctx.saved_tensors, ctx.dtypes))


def _no_autocast(device: str):
    """The blocks choose their dtypes themselves."""
    if torch.amp.is_autocast_available(device):
        return torch.autocast(device, enabled=False)
    return nullcontext()


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
        with _no_autocast(hidden.device.type):
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
        return (*_scaled_gradients(ctx, grad_loss), None, None, None, None, None, None)


def rdrop_output_layer_loss(
    features: torch.Tensor,
    weight: torch.Tensor,
    target: torch.Tensor,
    epsilon: float,
    ignore_index: int,
    alpha: float,
    block_elements: int | None = None,
    *,
    positions: torch.Tensor | None = None,
    grad_scale: float = 1.0,
) -> LossOutput:
    """R-Drop (Liang et al. 2021, fairseq's rdrop criterion): the label-smoothed loss of two
    passes of one batch plus `alpha` times the symmetric KL between their output
    distributions, fused with the output layer as output_layer_loss is.

    features [2B,T,D]: the decoder's last hidden states of the batch run twice (rows i and
    B + i hold the same pair, under different dropout); target [B,T]; `positions` [N]: the
    real positions of target (real_positions). Returns the sums over both passes: `loss`
    and `nll` (label-smoothed CE and nll, as output_layer_loss of the doubled batch), `kl`
    = sum over target tokens of (KL(p1||p2) + KL(p2||p1)) / 2, and `objective` = loss +
    alpha * kl, what training differentiates (fairseq divides it by twice the tokens).
    The [tokens, V] logits of neither pass are ever whole: each block of positions is
    projected for both passes, and its gradients computed, before the next.

    alpha = 0 is exactly output_layer_loss of the doubled batch (no KL is computed).
    """
    batch, length, dim = target.size(0), target.size(1), features.size(-1)
    if features.size(0) != 2 * batch:
        raise ValueError(
            f"features {tuple(features.shape)}: need the 2 x {batch} rows of two passes"
        )
    flat_target = target.reshape(-1)  # [B*T]
    if positions is None:
        positions = (flat_target != ignore_index).nonzero().squeeze(1)  # [N]
    if alpha == 0.0:
        both = torch.cat([positions, positions + batch * length])  # [2N]: pass 1, then pass 2
        return output_layer_loss(
            features,
            weight,
            torch.cat([target, target]),
            epsilon,
            ignore_index,
            block_elements,
            positions=both,
            grad_scale=grad_scale,
        )
    passes = features.reshape(2, batch * length, dim)  # [2,B*T,D]
    hidden1 = passes[0].index_select(0, positions)  # [N,D]
    hidden2 = passes[1].index_select(0, positions)  # [N,D]
    gold = flat_target.index_select(0, positions)  # [N]
    dtype = _compute_dtype(features, weight)
    want_grad = torch.is_grad_enabled() and (features.requires_grad or weight.requires_grad)
    if block_elements is None:
        block_elements = block_elements_for(features.device)
    rows = max(1, block_elements // (2 * weight.size(0)))  # 4 fp32 [rows,V] buffers, not 1
    objective, loss, nll, kl = _OutputLayerRDrop.apply(
        hidden1, hidden2, weight, gold, epsilon, alpha, dtype, rows, want_grad, float(grad_scale)
    )
    return LossOutput(loss=loss, nll=nll, kl=kl, objective=objective)


def _log_softmax_stats(
    z: torch.Tensor, probs: torch.Tensor, gold: torch.Tensor, epsilon: float
) -> tuple[torch.Tensor, torch.Tensor]:
    """For fp32 logits z [n,V] of rows with gold tokens gold [n,1]: turns z into the
    log-probabilities and fills `probs` [n,V] with the probabilities, in place; returns
    the rows' summed nll and sum over v of -log p_v (0 without smoothing)."""
    vocab = z.size(1)
    top = z.amax(dim=-1, keepdim=True)  # [n,1]
    gold_z = z.gather(1, gold)  # [n,1]
    smooth = (vocab * top - z.sum(dim=-1, keepdim=True)).sum() if epsilon else z.new_zeros(())
    torch.exp(z.sub_(top), out=probs)  # exp(z - top)
    total = probs.sum(dim=-1, keepdim=True)  # [n,1]
    log_total = total.log()  # [n,1]: lse - top
    probs.div_(total)
    z.sub_(log_total)  # log p = z - lse
    nll = (log_total + top - gold_z).sum()
    if epsilon:
        smooth = smooth + vocab * log_total.sum()
    return nll, smooth


class _OutputLayerRDrop(torch.autograd.Function):
    """R-Drop's sums of two passes hidden1, hidden2 [N,D] @ weight[V,D].T against gold [N].

    With p, q the two passes' distributions and d = log p - log q, the symmetric KL term
    D = KL(p||q) + KL(q||p) = sum_v (p - q) d has the logits' gradients
        dD/dz1 = p * (d - KL(p||q)) + p - q,    dD/dz2 = q * (-d - KL(q||p)) + q - p,
    to which each pass's label-smoothed CE gradient (see _OutputLayerCrossEntropy) adds.
    The objective is CE1 + CE2 + alpha * D / 2; the gradients are computed in the forward
    pass, block by block, times `grad_scale`, as in _OutputLayerCrossEntropy.
    """

    @staticmethod
    def forward(
        ctx, hidden1, hidden2, weight, gold, epsilon, alpha, dtype, rows, want_grad, grad_scale
    ):
        vocab = weight.size(0)
        eps_i = epsilon / (vocab - 1)
        gold_weight = 1.0 - epsilon - eps_i
        half = 0.5 * alpha * grad_scale  # d(alpha * D / 2) / dD, times grad_scale
        with _no_autocast(hidden1.device.type):
            w = weight.to(dtype)  # [V,D]
            h1, h2 = hidden1.to(dtype), hidden2.to(dtype)  # [N,D]
            n_all = h1.size(0)
            nll = torch.zeros((), dtype=torch.float32, device=hidden1.device)
            smooth = torch.zeros_like(nll)
            kl = torch.zeros_like(nll)
            grads = None
            if want_grad:
                grads = (
                    torch.empty(hidden1.shape, dtype=torch.float32, device=hidden1.device),
                    torch.empty(hidden2.shape, dtype=torch.float32, device=hidden1.device),
                    torch.zeros(weight.shape, dtype=torch.float32, device=hidden1.device),
                )
            size = min(rows, n_all)
            logits_buf = h1.new_empty(size, vocab)  # [rows,V] in the compute dtype
            grad_w_blk = w.new_empty(w.shape) if dtype != torch.float32 else None  # [V,D]
            # fp32 [rows,V]: log p (then d, then pass 2's gradient), log q (then scratch,
            # then pass 1's gradient), p, q
            lp_buf, lq_buf, p_buf, q_buf = (
                torch.empty(size, vocab, dtype=torch.float32, device=hidden1.device)
                for _ in range(4)
            )
            for start in range(0, n_all, rows):
                h1_blk, h2_blk = h1[start : start + rows], h2[start : start + rows]  # [n,D]
                g_blk = gold[start : start + rows, None]  # [n,1]
                n = h1_blk.size(0)
                lp, lq, p, q = lp_buf[:n], lq_buf[:n], p_buf[:n], q_buf[:n]
                for h_blk, z, probs in ((h1_blk, lp, p), (h2_blk, lq, q)):
                    z.copy_(torch.mm(h_blk, w.t(), out=logits_buf[:n]))  # fp32 logits
                    blk_nll, blk_smooth = _log_softmax_stats(z, probs, g_blk, epsilon)
                    nll += blk_nll
                    smooth += blk_smooth
                d = lp.sub_(lq)  # [n,V] log p - log q, in place of log p
                kl_pq = torch.mul(p, d, out=lq).sum(dim=-1, keepdim=True)  # [n,1] KL(p||q)
                kl_qp = torch.mul(q, d, out=lq).sum(dim=-1, keepdim=True).neg_()  # KL(q||p)
                kl += 0.5 * (kl_pq.sum() + kl_qp.sum())
                if grads is None:
                    continue
                grad_h1, grad_h2, grad_w = grads
                gold_grad = torch.full(g_blk.shape, -gold_weight * grad_scale, device=d.device)
                # pass 1: half * (p * (d - KL(p||q)) + p - q) + grad_scale * CE's (p - ...)
                g1 = torch.sub(d, kl_pq, out=lq).mul_(p).add_(p).sub_(q).mul_(half)
                g1.add_(p, alpha=grad_scale)
                # pass 2, in place of d: half * (q * (-d - KL(q||p)) + q - p) + CE's
                g2 = d.neg_().sub_(kl_qp).mul_(q).add_(q).sub_(p).mul_(half)
                g2.add_(q, alpha=grad_scale)
                for g, h_blk, grad_h in ((g1, h1_blk, grad_h1), (g2, h2_blk, grad_h2)):
                    if eps_i:
                        g.sub_(eps_i * grad_scale)
                    g.scatter_add_(1, g_blk, gold_grad)
                    if dtype != torch.float32:  # the projection's dtype, as the plain layer
                        g = logits_buf[:n].copy_(g)
                    grad_h[start : start + rows] = g @ w  # [n,D]
                    if dtype == torch.float32:  # [V,D], accumulated in fp32 in place
                        grad_w.addmm_(g.t(), h_blk)
                    else:
                        grad_w.add_(torch.mm(g.t(), h_blk, out=grad_w_blk))
        loss = gold_weight * nll + eps_i * smooth if epsilon else nll.clone()
        objective = loss + alpha * kl
        ctx.mark_non_differentiable(loss, nll, kl)
        if grads is not None:
            ctx.save_for_backward(*grads)
        ctx.dtypes = (hidden1.dtype, hidden2.dtype, weight.dtype)
        ctx.grad_scale = grad_scale
        return objective, loss, nll, kl

    @staticmethod
    def backward(ctx, grad_objective, *unused):
        nones = (None,) * 7  # gold, epsilon, alpha, dtype, rows, want_grad, grad_scale
        return (*_scaled_gradients(ctx, grad_objective), *nones)
