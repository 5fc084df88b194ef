"""The search step on log-probabilities: pure tensor functions, no model inside.

Shape legend: N sentences still being decoded, K hypotheses per sentence (the beam),
V target vocabulary, C candidates per sentence, t tokens generated so far.

Every function works on the whole batch at once (no Python loop over sentences), so
the per-step cost of the search does not grow with the number of sentences. The
generator (generator.py) calls them once per decoding step.
"""

from __future__ import annotations

import math

import torch
from torch import Tensor

NEG_INF = -math.inf


def length_penalty(length: int | float | Tensor, lenpen: float) -> float | Tensor:
    """The divisor of a finished hypothesis' summed log-probability: length ** lenpen.

    `length` counts the generated tokens including the final EOS (fairseq). lenpen > 1
    favours longer hypotheses, < 1 shorter ones, 0 turns normalization off.
    """
    return length ** lenpen


def block_repeated_ngrams(history: Tensor, lprobs: Tensor, n: int) -> Tensor:
    """Forbid (-inf, in place) every token that would repeat an n-gram of its row.

    history [R,t] holds the tokens generated so far (without the leading EOS), lprobs
    [R,V] the next-token log-probabilities of the same rows.
    """
    rows, t = history.shape
    if n <= 0 or t < n:  # no complete n-gram yet, nothing can repeat
        return lprobs
    vocab = lprobs.size(1)
    windows = history.unfold(1, n, 1)  # [R, t-n+1, n]: every n-gram of the row
    suffix = history[:, t - n + 1:]  # [R, n-1]: what the next token would extend
    match = (windows[:, :, :-1] == suffix[:, None, :]).all(dim=2)  # [R, t-n+1]
    # Banned next tokens; non-matching windows point at a spare column V that is dropped.
    banned = torch.where(match, windows[:, :, -1], vocab)  # [R, t-n+1]
    mask = torch.zeros(rows, vocab + 1, dtype=torch.bool, device=lprobs.device)
    mask.scatter_(1, banned, True)
    return lprobs.masked_fill_(mask[:, :vocab], NEG_INF)


def row_topk(x: Tensor, k: int, block: int = 100) -> tuple[Tensor, Tensor]:
    """x.topk(k, dim=1) for x [R,V] (values and indices [R,k], best first), faster on a CPU.

    torch's CPU top-k scans every element of a row serially, ~4x slower than a vectorized
    max. So each row is cut into blocks of `block` values: only the k blocks with the
    highest maxima can hold the row's k best values (a block holding one of them has a
    maximum at least the k-th best value, and at most k blocks do), so top-k runs on the
    block maxima and then on those k blocks (plus the last V % block values). Ties may be
    broken differently from torch.topk. Elsewhere (CUDA, small V) it is torch.topk.
    """
    rows, vocab = x.shape
    blocks = vocab // block
    if x.device.type != "cpu" or blocks < 4 * k:
        return x.topk(k, dim=1)
    full = blocks * block
    chunks = x[:, :full].view(rows, blocks, block)  # [R,blocks,block]
    best = chunks.amax(dim=2).topk(k, dim=1).indices  # [R,k] the blocks to search
    picked = chunks[torch.arange(rows, device=x.device).unsqueeze(1), best]  # [R,k,block]
    ids = best.unsqueeze(2) * block + torch.arange(block, device=x.device)  # [R,k,block]
    values, ids = picked.view(rows, -1), ids.view(rows, -1)  # [R,k*block]
    if full < vocab:  # the tail that fills no block is always searched
        values = torch.cat([values, x[:, full:]], dim=1)
        ids = torch.cat([ids, torch.arange(full, vocab, device=x.device).expand(rows, -1)], dim=1)
    top, where = values.topk(k, dim=1)
    return top, ids.gather(1, where)


def beam_candidates(lprobs: Tensor, scores: Tensor) -> tuple[Tensor, Tensor, Tensor]:
    """The 2K best one-token extensions of each sentence's K hypotheses.

    lprobs [N,K,V] next-token log-probs, scores [N,K] cumulative log-probs of the
    hypotheses (-inf for a hypothesis that must not be extended, e.g. the K-1 copies of
    the start state at the first step). Returns (scores, tokens, origins), each [N,C]
    with C = min(2K, K*V), best first; origins are beam indices 0..K-1. Twice the beam
    is kept so that K candidates that do not end in EOS remain after EOS ones are set
    aside as finished.
    """
    n, k, v = lprobs.shape
    # A sentence's best 2K extensions lie among each hypothesis' own best 2K tokens, so
    # rank those K*2K instead of all K*V (the same candidates; ~1.4x less CPU time).
    per_row = min(2 * k, v)
    row_lprobs, row_tokens = row_topk(lprobs.reshape(n * k, v), per_row)  # [N*K,c]
    row_lprobs, row_tokens = row_lprobs.view(n, k, per_row), row_tokens.view(n, k, per_row)
    total = (scores.unsqueeze(2) + row_lprobs).view(n, k * per_row)  # [N, K*c]
    cand_scores, flat = total.topk(min(2 * k, k * per_row), dim=1)  # [N,C]
    tokens = row_tokens.view(n, k * per_row).gather(1, flat)
    return cand_scores, tokens, torch.div(flat, per_row, rounding_mode="floor")


def sample_candidates(lprobs: Tensor, scores: Tensor, topk: int = 0, topp: float = 1.0,
                      generator: torch.Generator | None = None) -> tuple[Tensor, Tensor, Tensor]:
    """One sampled token per hypothesis (K independent samples per sentence).

    lprobs [N,K,V] (temperature already applied), scores [N,K]. Sampling is restricted
    to the `topk` most likely tokens (0 = all) and then to the smallest set whose
    probability reaches `topp` (1.0 = all). The score added is the token's unrenormalized
    log-probability, as in fairseq. Returns (scores, tokens, origins) [N,K].
    """
    n, k, v = lprobs.shape
    flat = lprobs.reshape(n * k, v)  # [N*K,V]
    if topk > 0:
        kept, kept_ids = flat.topk(min(topk, v), dim=1)  # [N*K,k'], sorted
    else:
        kept, kept_ids = flat.sort(dim=1, descending=True)  # [N*K,V]
    probs = kept.exp()
    if topp < 1.0:
        # Keep a token while the mass before it is below topp (so the first always stays).
        before = probs.cumsum(dim=1) - probs
        probs = probs.masked_fill(before >= topp, 0.0)
    choice = torch.multinomial(probs, 1, generator=generator)  # [N*K,1]
    tokens = kept_ids.gather(1, choice).view(n, k)
    step_lprobs = lprobs.gather(2, tokens.unsqueeze(2)).squeeze(2)  # [N,K]
    origins = torch.arange(k, device=lprobs.device).expand(n, k)
    return scores + step_lprobs, tokens, origins


def select_active(cand_scores: Tensor, ended: Tensor, beam: int) -> tuple[Tensor, Tensor]:
    """The hypotheses to continue: per sentence, the first `beam` candidates that do not
    end (ended [N,C] bool: the candidate's token is EOS), in rank order.

    Returns (pick, scores), both [N,K]: pick holds candidate columns. If fewer than `beam`
    candidates continue (sampling, tiny vocabularies), the rest are placeholders with
    score -inf, which can never be extended into a finite score.
    """
    c = cand_scores.size(1)
    rank = torch.arange(c, device=cand_scores.device)
    key = ended.to(torch.long) * c + rank  # [N,C]: continuing candidates first, best first
    pick = key.topk(beam, dim=1, largest=False).indices  # [N,K], ascending key
    return pick, cand_scores.gather(1, pick).masked_fill(ended.gather(1, pick), NEG_INF)
