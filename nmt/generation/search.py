"""The search step on log-probabilities: pure tensor functions, no model inside.

Shape legend: N sentences still being decoded, K hypotheses per sentence (the beam),
V target vocabulary, C candidates per sentence, t tokens generated so far.

Every function works on the whole batch at once (no Python loop over sentences), so
the per-step cost of the search does not grow with the number of sentences. The
generator (generator.py) calls them once per decoding step.
"""

from __future__ import annotations

import torch
from torch import Tensor

from nmt.generation.processors import NEG_INF, top_k, top_p


def length_penalty(length: int | float | Tensor, lenpen: float) -> float | Tensor:
    """The divisor of a finished hypothesis' summed log-probability: length ** lenpen.

    `length` counts the generated tokens including the final EOS (fairseq). lenpen > 1
    favours longer hypotheses, < 1 shorter ones, 0 turns normalization off.
    """
    return length**lenpen


def sentence_topk(
    lprobs: Tensor, scores: Tensor, c: int, block: int = 100
) -> tuple[Tensor, Tensor]:
    """(scores[n,j] + lprobs[n,j,t]).topk(c) over all (j, t) of each sentence n, faster on
    a CPU: lprobs [N,K,V], scores [N,K] -> (values [N,c] best first, flat indices j*V + t).

    torch's CPU top-k scans each row serially, at ~1.3 us per row even for short rows, and
    adding the scores to all K*V log-probs is another full pass. So each hypothesis' V
    log-probs are cut into blocks of `block`: only the c blocks of a sentence with the
    highest maxima (plus score) can hold its c best sums (a block holding one of them has
    a maximum at least the c-th best sum, and at most c blocks do), so the scores are
    added to the block maxima, then to the values of those c blocks (plus the last
    V % block values of each hypothesis), and top-k runs once per sentence on each. The
    sums are computed as in the direct way, so the values are identical; ties may be
    broken differently. Elsewhere (CUDA, small V) it is the direct top-k.
    """
    n, k, v = lprobs.shape
    blocks = v // block
    if lprobs.device.type != "cpu" or blocks * k < 4 * c:
        return (scores.unsqueeze(2) + lprobs).view(n, k * v).topk(c, dim=1)
    full = blocks * block
    chunks = lprobs[:, :, :full].unflatten(2, (blocks, block))  # [N,K,blocks,block], a view
    block_best = (chunks.amax(dim=3) + scores.unsqueeze(2)).view(n, k * blocks)  # [N,K*blocks]
    best = block_best.topk(c, dim=1).indices  # [N,c] the blocks to search
    hyp, blk = torch.div(best, blocks, rounding_mode="floor"), best % blocks  # [N,c] each
    sentence = torch.arange(n, device=lprobs.device).unsqueeze(1)  # [N,1]
    offsets = torch.arange(block, device=lprobs.device)  # [block]
    values = chunks[sentence, hyp, blk] + scores.gather(1, hyp).unsqueeze(2)  # [N,c,block]
    ids = (hyp * v + blk * block).unsqueeze(2) + offsets  # [N,c,block]
    values, ids = values.view(n, -1), ids.view(n, -1)  # [N,c*block]
    if full < v:  # each hypothesis' tail that fills no block is always searched
        tail = (lprobs[:, :, full:] + scores.unsqueeze(2)).view(n, -1)  # [N,K*(V-full)]
        tail_ids = (
            (
                torch.arange(k, device=lprobs.device).unsqueeze(1) * v
                + torch.arange(full, v, device=lprobs.device)
            )
            .view(1, -1)
            .expand(n, -1)
        )
        values, ids = torch.cat([values, tail], dim=1), torch.cat([ids, tail_ids], dim=1)
    top, where = values.topk(c, dim=1)
    return top, ids.gather(1, where)


def row_best(lprobs: Tensor, block: int = 100) -> tuple[Tensor, Tensor]:
    """Each row's best token: lprobs [..,V] -> (values [..], ids [..]), the first
    maximum as argmax gives it. On a CPU argmax over long rows is several times slower
    than a max without indices, so the maxima of blocks of `block` values are found
    first, then the first block holding the row's maximum is searched (the first
    maximum of the first such block is the row's first maximum)."""
    v = lprobs.size(-1)
    blocks = v // block
    if lprobs.device.type != "cpu" or blocks < 2:
        return lprobs.max(dim=-1)
    rows = lprobs.reshape(-1, v)  # [R,V]
    full = blocks * block
    block_best = rows[:, :full].unflatten(1, (blocks, block)).amax(dim=2)  # [R,blocks]
    if full < v:  # the tail that fills no block is a block of its own
        block_best = torch.cat([block_best, rows[:, full:].amax(dim=1, keepdim=True)], dim=1)
    first = block_best.argmax(dim=1, keepdim=True) * block  # [R,1] where its block starts
    offsets = torch.arange(block, device=lprobs.device)  # [block]
    columns = (first + offsets).clamp(max=v - 1)  # [R,block] (a short tail repeats its last)
    values, where = rows.gather(1, columns).max(dim=1)  # [R] each
    ids = columns.gather(1, where.unsqueeze(1)).squeeze(1)
    return values.view(lprobs.shape[:-1]), ids.view(lprobs.shape[:-1])


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
    cand_scores, flat = sentence_topk(lprobs, scores, min(2 * k, k * v))  # [N,C]
    return cand_scores, flat % v, torch.div(flat, v, rounding_mode="floor")


def sample_candidates(
    lprobs: Tensor,
    scores: Tensor,
    topk: int = 0,
    topp: float = 1.0,
    generator: torch.Generator | None = None,
) -> tuple[Tensor, Tensor, Tensor]:
    """One sampled token per hypothesis (K independent samples per sentence).

    lprobs [N,K,V] (temperature already applied), scores [N,K]. Sampling is restricted
    to the `topk` most likely tokens (0 = all) and then to the smallest set whose
    probability reaches `topp` (1.0 = all). The score added is the token's unrenormalized
    log-probability, as in fairseq. Returns (scores, tokens, origins) [N,K].
    """
    n, k, v = lprobs.shape
    kept, kept_ids = top_k(lprobs.reshape(n * k, v), topk)  # [N*K,C], best first
    probs = top_p(kept.exp(), topp)
    # A low temperature leaves every allowed token at probability 0 when a rule forbids
    # the likeliest one (min_len's EOS): take the likeliest allowed one, as greedy would.
    underflow = probs.sum(dim=1, keepdim=True).le(0)  # [N*K,1]
    best = torch.zeros_like(probs)
    best[:, 0] = 1.0
    probs = torch.where(underflow, best, probs)
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
