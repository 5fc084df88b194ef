"""Label-smoothed cross-entropy with fairseq's semantics.

fairseq spreads the smoothing mass `epsilon` over the V-1 wrong classes:
    loss = (1 - eps - eps_i) * nll + eps_i * sum_v(-log p_v),   eps_i = eps / (V - 1)
and ignores padding positions entirely. Both terms are returned as *sums* over target
tokens, so that the trainer can normalise by the total target tokens of an update
(across micro-batches and ranks), which is what makes gradient accumulation and DDP
give the same update.

Reported figures are per target token in base 2, as fairseq prints them:
loss/ln(2)/ntokens, nll likewise, and ppl = 2**nll.
"""

from __future__ import annotations

import math
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
