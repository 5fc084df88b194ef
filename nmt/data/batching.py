"""Token-budget batches built from length buckets, reshuffled per epoch, sharded by rank.

Everything here is a pure function of the sentence lengths, the seed and the epoch, so
that a resumed run rebuilds exactly the batch list it was interrupted in and skips to the
saved position, and every DDP rank builds the same list and takes its own share of it.

The cost of a batch is `sentences x longest side` (padding included), as in fairseq.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np


@dataclass(frozen=True)
class SizeFilter:
    """Which sentence pairs can be used, and how many could not (and why)."""

    kept: np.ndarray  # int64 indices of usable pairs, ascending
    too_long: int  # pairs longer than the model's positions
    over_budget: int  # pairs whose own cost exceeds max_tokens


def filter_by_size(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_source_positions: int,
    max_target_positions: int,
    max_tokens: int,
) -> SizeFilter:
    """Drop pairs the model cannot embed, or that alone exceed the token budget."""
    fits_model = (src_sizes <= max_source_positions) & (tgt_sizes <= max_target_positions)
    fits_budget = np.maximum(src_sizes, tgt_sizes) <= max_tokens
    kept = np.flatnonzero(fits_model & fits_budget).astype(np.int64)
    return SizeFilter(
        kept=kept,
        too_long=int((~fits_model).sum()),
        over_budget=int((fits_model & ~fits_budget).sum()),
    )


def pack(
    order: np.ndarray, lengths: np.ndarray, *, max_tokens: int, max_sentences: int = 0
) -> list[np.ndarray]:
    """Greedily cut `order` (indices sorted by length) into batches within the budget.

    `lengths[i]` is the longer side of pair i. A pair longer than max_tokens still gets a
    batch of its own (callers filter those out on train).
    """
    batches: list[np.ndarray] = []
    start = 0
    longest = 0
    lens = lengths[order].tolist()
    for pos, length in enumerate(lens):
        count = pos - start + 1
        longest_if_added = max(longest, length)
        too_big = count * longest_if_added > max_tokens or (max_sentences and count > max_sentences)
        if too_big and pos > start:
            batches.append(order[start:pos])
            start, longest_if_added = pos, length
        longest = longest_if_added
    if start < len(order):
        batches.append(order[start:])
    return batches


def length_sorted(
    indices: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """`indices` sorted by longer side, then target, then source length.

    With `rng`, ties are broken randomly (the buckets change composition every epoch).
    """
    if rng is not None:
        indices = indices[rng.permutation(len(indices))]
    src, tgt = src_sizes[indices], tgt_sizes[indices]
    # np.lexsort is stable and sorts by its last key first.
    return indices[np.lexsort((src, tgt, np.maximum(src, tgt)))]


def epoch_batches(
    indices: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_tokens: int,
    max_sentences: int,
    seed: int,
    epoch: int,
) -> list[np.ndarray]:
    """The training batch list of `epoch`: a pure function of (sizes, seed, epoch)."""
    rng = np.random.default_rng([seed, epoch])
    order = length_sorted(indices, src_sizes, tgt_sizes, rng)
    batches = pack(
        order, np.maximum(src_sizes, tgt_sizes), max_tokens=max_tokens, max_sentences=max_sentences
    )
    return [batches[i] for i in rng.permutation(len(batches))]


def fixed_batches(
    indices: np.ndarray,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_tokens: int,
    max_sentences: int = 0,
) -> list[np.ndarray]:
    """Validation batches: length-sorted, no shuffling."""
    order = length_sorted(indices, src_sizes, tgt_sizes)
    return pack(
        order, np.maximum(src_sizes, tgt_sizes), max_tokens=max_tokens, max_sentences=max_sentences
    )


def rank_share(group: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray | None]:
    """This rank's batches of one update's group: every world_size-th, starting at rank.

    Ranks must run the same number of forward/backward passes per update (DDP syncs on
    the last one), so a short share is padded with None: a dummy pass whose loss counts 0.
    """
    mine: list[np.ndarray | None] = list(group[rank::world_size])
    per_rank = -(-len(group) // world_size)  # ceil
    return mine + [None] * (per_rank - len(mine))
