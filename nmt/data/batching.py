"""Token-budget batches built from length buckets, reshuffled per epoch, sharded by rank.

Everything here is a pure function of the sentence lengths, the seed and the epoch, so
that a resumed run rebuilds exactly the batch list it was interrupted in and skips to the
saved position, and every DDP rank builds the same list and takes its own share of it.

The cost of a batch is `sentences x longest side` (padding included), as in fairseq.

Memory: an epoch's batch list is a `BatchList` (the length-sorted indices and the batch
bounds as numpy arrays), built in chunks, so a corpus of 10M pairs costs about 10 bytes a
pair while the list is built and 6 once it is (compact sizes plus int32 indices), and no
Python object per pair or per batch; nor a loop over pairs in Python.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

import numpy as np


@dataclass(frozen=True)
class SizeFilter:
    """Which sentence pairs can be used, and how many could not (and why)."""

    kept: np.ndarray | None  # indices of usable pairs, ascending; None: every pair
    too_long: int  # pairs longer than the model's positions
    over_budget: int  # pairs whose own cost exceeds max_tokens

    def count(self, n: int) -> int:
        """Usable pairs out of `n`."""
        return n if self.kept is None else len(self.kept)


def filter_by_size(
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_source_positions: int,
    max_target_positions: int,
    max_tokens: int,
) -> SizeFilter:
    """Drop pairs the model cannot embed, or that alone exceed the token budget (in chunks:
    no temporaries the size of the corpus; no index array when every pair is usable)."""
    n = len(src_sizes)
    too_long = over_budget = 0
    dropped: list[np.ndarray] = []
    for start in range(0, n, _CHUNK):
        src, tgt = src_sizes[start : start + _CHUNK], tgt_sizes[start : start + _CHUNK]
        fits_model = (src <= max_source_positions) & (tgt <= max_target_positions)
        fits_budget = np.maximum(src, tgt) <= max_tokens
        too_long += int((~fits_model).sum())
        over_budget += int((fits_model & ~fits_budget).sum())
        bad = np.flatnonzero(~(fits_model & fits_budget))
        if len(bad):
            dropped.append(bad + start)
    if not dropped:
        return SizeFilter(kept=None, too_long=0, over_budget=0)
    keep = np.ones(n, dtype=bool)
    keep[np.concatenate(dropped)] = False
    kept = np.flatnonzero(keep).astype(index_dtype(n))
    return SizeFilter(kept=kept, too_long=too_long, over_budget=over_budget)


def pack(
    order: np.ndarray, lengths: np.ndarray, *, max_tokens: int, max_sentences: int = 0
) -> list[np.ndarray]:
    """Greedily cut `order` (indices, usually sorted by length) into batches within the budget.

    `lengths[i]` is the longer side of pair i. A pair longer than max_tokens still gets a
    batch of its own (callers filter those out on train). Orders whose lengths never
    decrease (the training and validation batches) are cut without a loop over pairs.
    """
    lens = lengths[order]
    if len(lens) and bool((lens[1:] >= lens[:-1]).all()):
        bounds = _pack_bounds(lens, max_tokens, max_sentences)
        return [order[a:b] for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist())]
    batches: list[np.ndarray] = []
    start = 0
    longest = 0
    for pos, length in enumerate(lens.tolist()):
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


def _pack_bounds(lens: np.ndarray, max_tokens: int, max_sentences: int) -> np.ndarray:
    """`pack`'s greedy cuts for lengths that never decrease, as batch bounds (int64, 0 ...
    len(lens)): batch k is positions bounds[k]:bounds[k+1]."""
    changes = np.flatnonzero(lens[1:] != lens[:-1]) + 1
    starts = np.concatenate([[0], changes]).astype(np.int64) if len(lens) else changes
    sizes = np.diff(np.append(starts, len(lens)))
    return _pack_runs(lens[starts], sizes, max_tokens, max_sentences)


def _pack_runs(
    values: np.ndarray, sizes: np.ndarray, max_tokens: int, max_sentences: int
) -> np.ndarray:
    """Greedy cuts of a length-sorted order given as runs: `sizes[k]` pairs of length
    `values[k]`, the values increasing. Returns the batch bounds (int64, 0 ... n).

    With lengths that never decrease, the pair being added is always the batch's longest,
    so a batch may hold at most `cap(L) = min(max_tokens // L, max_sentences)` pairs once it
    reaches length L. The loop runs over runs of equal length (a few hundred), not pairs.
    """
    n = int(np.sum(sizes))
    cuts: list[np.ndarray] = [np.zeros(1, dtype=np.int64)]
    open_start = 0  # where the batch being filled starts
    run_start = 0
    for length, size in zip(values.tolist(), sizes.tolist()):
        run_end = run_start + size
        cap = max_tokens // length if length else n  # empty rows cost nothing
        if max_sentences:
            cap = min(cap, max_sentences)
        if run_start > open_start:  # the open batch holds shorter pairs of earlier runs
            if run_start - open_start + 1 > cap:  # not even this run's first pair fits
                open_start = run_start
                cuts.append(np.array([run_start], dtype=np.int64))
            elif open_start + cap >= run_end:  # the whole run fits into the open batch
                run_start = run_end
                continue
            else:
                open_start += cap
                cuts.append(np.array([open_start], dtype=np.int64))
        step = max(cap, 1)  # a pair over the budget gets a batch of its own
        full = np.arange(open_start + step, run_end, step, dtype=np.int64)
        if len(full):
            cuts.append(full)
            open_start = int(full[-1])
        run_start = run_end
    cuts.append(np.array([n], dtype=np.int64))
    bounds = np.concatenate(cuts)
    return bounds if n else bounds[:1]


def index_dtype(n: int) -> np.dtype:
    """The smallest dtype that holds indices 0..n-1 (int32 halves an epoch's index memory)."""
    return np.dtype(np.int32) if n <= np.iinfo(np.int32).max else np.dtype(np.int64)


def length_sorted(
    indices: np.ndarray | None,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    rng: np.random.Generator | None = None,
) -> np.ndarray:
    """`indices` (None: every pair) sorted by longer side, then target, then source length.

    Without `rng` the sort is stable (ties keep the order of `indices`). With `rng`, the
    pairs of each (longer, target, source) length are shuffled among themselves, so the
    buckets change composition every epoch. A counting sort in chunks: memory stays at
    the index arrays themselves (int32 for up to 2^31 pairs), no corpus-sized int64
    temporaries, and no shuffle of the whole corpus (whose random memory accesses took
    seconds on 10M pairs): each run of equal lengths is shuffled where it lies.
    """
    return _length_sorted_runs(indices, src_sizes, tgt_sizes, rng)[0]


def _length_sorted_runs(
    indices: np.ndarray | None,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    rng: np.random.Generator | None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """`length_sorted`'s order, and its runs of equal longer side: (order, lengths, sizes)."""
    n = len(src_sizes) if indices is None else len(indices)
    items = np.arange(n, dtype=index_dtype(n)) if indices is None else indices
    order, key_sizes, lengths, sizes = _stable_sort_by_length(
        items, src_sizes, tgt_sizes, every_pair=indices is None
    )
    if rng is not None:
        ends = np.cumsum(key_sizes)
        for start, end in zip(
            (ends - key_sizes)[key_sizes > 1].tolist(), ends[key_sizes > 1].tolist()
        ):
            rng.shuffle(order[start:end])
    return order, lengths, sizes


_CHUNK = 1 << 18  # pairs handled at a time by the counting sort
_MAX_TABLE = 1 << 22  # (longest length + 1)^2 above this: fall back to np.lexsort


def _stable_sort_by_length(
    items: np.ndarray, src_sizes: np.ndarray, tgt_sizes: np.ndarray, *, every_pair: bool
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """`items` (pair indices) stably sorted by (max(src, tgt), tgt, src) of each pair.

    Returns (order, pairs per key in key order, the distinct max(src, tgt), pairs per max).
    `every_pair`: items is a permutation of all pairs (their key counts are read in order).
    """
    empty = np.zeros(0, dtype=np.int64)
    if len(items) == 0:
        return items.copy(), empty, empty, empty
    width = int(max(src_sizes.max(initial=0), tgt_sizes.max(initial=0))) + 1
    if width * width > _MAX_TABLE:
        src, tgt = src_sizes[items].astype(np.int64), tgt_sizes[items].astype(np.int64)
        longest = np.maximum(src, tgt)
        order = np.lexsort((src, tgt, longest))
        _, key_sizes = np.unique(
            np.stack([longest, tgt, src])[:, order], axis=1, return_counts=True
        )
        values, sizes = np.unique(longest, return_counts=True)
        return items[order], key_sizes, values, sizes
    # rank[t * width + s]: the place of key (max(s, t), t, s) among all possible keys
    keys = width * width
    t_grid, s_grid = np.divmod(np.arange(keys, dtype=np.int64), width)
    rank_dtype = np.uint16 if keys <= 1 << 16 else np.int32  # uint16: argsort is a radix sort
    rank = np.empty(keys, dtype=rank_dtype)
    order_of_keys = np.argsort((np.maximum(s_grid, t_grid) * width + t_grid) * width + s_grid)
    rank[order_of_keys] = np.arange(keys, dtype=rank_dtype)
    longest_of_rank = np.maximum(s_grid, t_grid)[order_of_keys]  # non-decreasing
    del t_grid, s_grid, order_of_keys

    def ranks(src: np.ndarray, tgt: np.ndarray) -> np.ndarray:
        return rank[tgt.astype(np.int64) * width + src]

    # how many items have each key: read the sizes in file order (sequential, cheap)
    counts = np.zeros(keys, dtype=np.int64)
    counted = None if every_pair else np.sort(items)  # sorted: the reads go forward
    for start in range(0, len(items), _CHUNK):
        if counted is None:
            part = slice(start, start + _CHUNK)
            r = ranks(src_sizes[part], tgt_sizes[part])
        else:
            chunk = counted[start : start + _CHUNK]
            r = ranks(src_sizes[chunk], tgt_sizes[chunk])
        counts += np.bincount(r, minlength=keys)
    del counted
    next_free = np.cumsum(counts) - counts  # where the next item of each key goes
    out = np.empty_like(items)
    for start in range(0, len(items), _CHUNK):
        chunk = items[start : start + _CHUNK]
        r = ranks(src_sizes[chunk], tgt_sizes[chunk])
        within = np.argsort(r, kind="stable")  # this chunk's items grouped by key, in order
        sorted_r = r[within]
        run_starts = np.flatnonzero(np.diff(sorted_r, prepend=sorted_r[:1] - 1))
        run_lengths = np.diff(run_starts, append=len(chunk))
        place = np.arange(len(chunk)) - np.repeat(run_starts, run_lengths)  # rank within key
        out[next_free[sorted_r] + place] = chunk[within]
        next_free[sorted_r[run_starts]] += run_lengths
    # pairs per longer side: the keys of one length are consecutive ranks
    values, first = np.unique(longest_of_rank, return_index=True)
    sizes = np.add.reduceat(counts, first)
    present = sizes > 0
    return out, counts[counts > 0], values[present], sizes[present]


class BatchList(Sequence[np.ndarray]):
    """An epoch's batches without a Python object per batch: batch k is
    `order[bounds[b]:bounds[b + 1]]` with `b = batch_order[k]` (a view, no copy).

    Indexing with a slice returns a list of batches, as slicing a list of arrays would.
    """

    def __init__(
        self, order: np.ndarray, bounds: np.ndarray, batch_order: np.ndarray | None = None
    ) -> None:
        self.order = order  # pair indices, length-sorted
        self.bounds = bounds  # int64, one more than there are batches
        self.batch_order = batch_order  # None: batches in length order

    def __len__(self) -> int:
        return len(self.bounds) - 1

    @overload
    def __getitem__(self, k: int) -> np.ndarray: ...

    @overload
    def __getitem__(self, k: slice) -> list[np.ndarray]: ...

    def __getitem__(self, k: int | slice) -> np.ndarray | list[np.ndarray]:
        if isinstance(k, slice):
            return [self[i] for i in range(*k.indices(len(self)))]
        n = len(self)
        if k < 0:
            k += n
        if not 0 <= k < n:
            raise IndexError(f"batch {k} out of range for {n} batches")
        b = int(self.batch_order[k]) if self.batch_order is not None else k
        return self.order[self.bounds[b] : self.bounds[b + 1]]

    def __iter__(self) -> Iterator[np.ndarray]:
        return (self[k] for k in range(len(self)))

    def pairs(self) -> int:
        """Sentence pairs over all batches."""
        return len(self.order)


def epoch_batches(
    indices: np.ndarray | None,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_tokens: int,
    max_sentences: int,
    seed: int,
    epoch: int,
) -> BatchList:
    """The training batch list of `epoch`: a pure function of (sizes, seed, epoch).

    `indices`: the pairs to use (None: all). Pairs are sorted by length, those of equal
    lengths shuffled among themselves (so the buckets change every epoch), packed greedily,
    and the batches shuffled.
    """
    rng = np.random.default_rng([seed, epoch])
    order, lengths, sizes = _length_sorted_runs(indices, src_sizes, tgt_sizes, rng)
    bounds = _pack_runs(lengths, sizes, max_tokens, max_sentences)
    return BatchList(order, bounds, rng.permutation(len(bounds) - 1))


def fixed_batches(
    indices: np.ndarray | None,
    src_sizes: np.ndarray,
    tgt_sizes: np.ndarray,
    *,
    max_tokens: int,
    max_sentences: int = 0,
) -> BatchList:
    """Validation batches: length-sorted, no shuffling."""
    order, lengths, sizes = _length_sorted_runs(indices, src_sizes, tgt_sizes, None)
    return BatchList(order, _pack_runs(lengths, sizes, max_tokens, max_sentences))


def rank_share(group: list[np.ndarray], rank: int, world_size: int) -> list[np.ndarray | None]:
    """This rank's batches of one update's group: every world_size-th, starting at rank.

    Ranks must run the same number of forward/backward passes per update (DDP syncs on
    the last one), so a short share is padded with None: a dummy pass whose loss counts 0.
    """
    mine: list[np.ndarray | None] = list(group[rank::world_size])
    per_rank = -(-len(group) // world_size)  # ceil
    return mine + [None] * (per_rank - len(mine))
