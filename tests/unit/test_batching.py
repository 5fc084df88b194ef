"""Token-budget batching, per-epoch shuffling, rank sharding and collation."""

import numpy as np
import pytest
import torch

from nmt.data.batching import epoch_batches, filter_by_size, fixed_batches, pack, rank_share
from nmt.data.collate import collate
from nmt.data.dataset import PairDataset
from nmt.errors import NmtError
from nmt.vocab import EOS, PAD


def _sizes(n=500, seed=0):
    rng = np.random.default_rng(seed)
    src = rng.integers(1, 60, n).astype(np.int64)
    tgt = np.clip(src + rng.integers(-5, 6, n), 1, None).astype(np.int64)
    return src, tgt


def _cost(batch, src, tgt):
    return len(batch) * int(max(src[batch].max(), tgt[batch].max()))


def test_batches_respect_budget_and_cover_every_sentence_once():
    src, tgt = _sizes()
    idx = np.arange(len(src))
    batches = epoch_batches(idx, src, tgt, max_tokens=300, max_sentences=0, seed=1, epoch=1)
    assert all(_cost(b, src, tgt) <= 300 for b in batches)
    assert sorted(np.concatenate(batches).tolist()) == idx.tolist()


def test_max_sentences_caps_batches():
    src, tgt = _sizes()
    batches = fixed_batches(np.arange(len(src)), src, tgt, max_tokens=10_000, max_sentences=7)
    assert max(len(b) for b in batches) == 7


def test_length_buckets_keep_padding_low():
    src, tgt = _sizes(2000)
    batches = epoch_batches(
        np.arange(2000), src, tgt, max_tokens=1000, max_sentences=0, seed=1, epoch=1
    )
    real = int(np.maximum(src, tgt).sum())
    padded = sum(_cost(b, src, tgt) for b in batches)
    assert real / padded > 0.9


def test_epoch_batches_are_a_pure_function_of_seed_and_epoch():
    src, tgt = _sizes()
    kw = dict(max_tokens=300, max_sentences=0)
    a = epoch_batches(np.arange(len(src)), src, tgt, seed=3, epoch=2, **kw)
    b = epoch_batches(np.arange(len(src)), src, tgt, seed=3, epoch=2, **kw)
    c = epoch_batches(np.arange(len(src)), src, tgt, seed=3, epoch=3, **kw)
    assert [x.tolist() for x in a] == [x.tolist() for x in b]
    assert [x.tolist() for x in a] != [x.tolist() for x in c]


def test_oversized_single_sentence_gets_its_own_batch():
    lengths = np.array([5, 5, 50, 5])
    batches = pack(np.array([0, 1, 3, 2]), lengths, max_tokens=20)
    assert [b.tolist() for b in batches] == [[0, 1, 3], [2]]


def test_filter_counts_what_it_drops():
    src = np.array([3, 200, 5, 8])
    tgt = np.array([3, 4, 150, 9])
    f = filter_by_size(src, tgt, max_source_positions=100, max_target_positions=100, max_tokens=8)
    assert f.kept.tolist() == [0]
    assert f.too_long == 2 and f.over_budget == 1


def test_rank_shares_partition_the_group_with_equal_counts():
    group = [np.array([i]) for i in range(5)]
    shares = [rank_share(group, r, 2) for r in range(2)]
    assert [len(s) for s in shares] == [3, 3]
    real = [b[0] for s in shares for b in s if b is not None]
    assert sorted(real) == list(range(5))
    assert shares[1][-1] is None  # the short rank runs one dummy pass
    assert [b[0] for b in rank_share(group, 0, 1)] == list(range(5))


def test_collate_shapes_and_shift():
    pairs = [
        (np.array([5, 6, EOS]), np.array([7, 8, 9, EOS])),
        (np.array([4, EOS]), np.array([7, EOS])),
    ]
    b = collate([10, 11], pairs)
    assert b.src_tokens.tolist() == [[5, 6, EOS], [4, EOS, PAD]]
    assert b.target.tolist() == [[7, 8, 9, EOS], [7, EOS, PAD, PAD]]
    assert b.prev_tokens.tolist() == [[EOS, 7, 8, 9], [EOS, 7, PAD, PAD]]
    assert b.src_lengths.tolist() == [3, 2] and b.ids.tolist() == [10, 11]
    assert b.ntokens == 6 and b.nsentences == 2
    assert int((b.target != PAD).sum()) == b.ntokens
    assert b.src_tokens.dtype == torch.int64


class _Seqs:
    def __init__(self, seqs):
        self.seqs = [np.asarray(s) for s in seqs]
        self.sizes = np.array([len(s) for s in seqs])

    def __len__(self):
        return len(self.seqs)

    def __getitem__(self, i):
        return self.seqs[i]


def test_pair_dataset_checks_alignment():
    ds = PairDataset(_Seqs([[1, 2], [3]]), _Seqs([[4], [5, 6, 7]]))
    assert ds.tgt_sizes.tolist() == [1, 3] and len(ds) == 2
    assert [p[1].tolist() for p in ds.pairs([1, 0])] == [[5, 6, 7], [4]]
    with pytest.raises(NmtError, match="source but"):
        PairDataset(_Seqs([[1]]), _Seqs([[1], [2]]), name="x/train")


# --- at scale: the vectorized batching against the plain greedy definition ---


def _greedy_pack(order, lengths, max_tokens, max_sentences=0):
    """pack's definition, one pair at a time (the loop the vectorized packer replaces)."""
    batches, start, longest = [], 0, 0
    for pos, length in enumerate(lengths[order].tolist()):
        count = pos - start + 1
        longest_if_added = max(longest, length)
        too_big = count * longest_if_added > max_tokens or (max_sentences and count > max_sentences)
        if too_big and pos > start:
            batches.append(order[start:pos].tolist())
            start, longest_if_added = pos, length
        longest = longest_if_added
    if start < len(order):
        batches.append(order[start:].tolist())
    return batches


def _random_case(rng):
    n = int(rng.integers(0, 2000))
    top = int(rng.choice([5, 60, 300, 3000]))  # 3000: the lexsort fallback
    src = rng.integers(1, top, n).astype(np.uint16)
    tgt = np.clip(src.astype(np.int64) + rng.integers(-5, 6, n), 1, None).astype(np.uint16)
    indices = None
    if n and rng.random() < 0.5:  # a size-filtered subset, with repeats (corpus weights)
        indices = np.sort(rng.choice(n, n // 2, replace=False))
        indices = np.concatenate([indices, indices[: len(indices) // 3]])
    budget = dict(
        max_tokens=int(rng.choice([10, 100, 300, 4096])), max_sentences=int(rng.choice([0, 1, 7]))
    )
    return src, tgt, indices, budget


def _keys(order, src, tgt):
    s, t = src[order].astype(np.int64), tgt[order].astype(np.int64)
    return np.maximum(s, t) * 10**8 + t * 10**4 + s


def test_validation_batches_equal_the_stable_sort_and_greedy_pack():
    rng = np.random.default_rng(0)
    for _ in range(60):
        src, tgt, indices, budget = _random_case(rng)
        items = np.arange(len(src)) if indices is None else indices
        expected_order = items[np.argsort(_keys(items, src, tgt), kind="stable")]
        expected = _greedy_pack(expected_order, np.maximum(src, tgt).astype(np.int64), **budget)
        got = fixed_batches(indices, src, tgt, **budget)
        assert [b.tolist() for b in got] == expected


def test_epoch_batches_are_length_sorted_greedy_packs_of_every_pair():
    rng = np.random.default_rng(1)
    for epoch in range(60):
        src, tgt, indices, budget = _random_case(rng)
        items = np.arange(len(src)) if indices is None else indices
        got = epoch_batches(indices, src, tgt, seed=3, epoch=epoch, **budget)
        order = got.order
        assert sorted(order.tolist()) == sorted(items.tolist())  # every pair (copy) once
        assert (np.diff(_keys(order, src, tgt)) >= 0).all()  # sorted by (longer, tgt, src)
        expected = _greedy_pack(order, np.maximum(src, tgt).astype(np.int64), **budget)
        assert sorted(b.tolist() for b in got) == sorted(expected)  # packed greedily
        assert len(got) == len(expected)


def test_ties_are_shuffled_anew_each_epoch():
    src = np.full(1000, 7, dtype=np.uint8)  # one length bucket: only the shuffle orders it
    tgt = src.copy()
    one, two = (
        epoch_batches(None, src, tgt, max_tokens=70, max_sentences=0, seed=1, epoch=e)
        for e in (1, 2)
    )
    assert one.order.tolist() != two.order.tolist()
    assert one.order.tolist() != list(range(1000))
    again = epoch_batches(None, src, tgt, max_tokens=70, max_sentences=0, seed=1, epoch=1)
    assert [b.tolist() for b in again] == [b.tolist() for b in one]


def test_pack_accepts_any_order():
    rng = np.random.default_rng(2)
    for _ in range(40):
        n = int(rng.integers(0, 300))
        lengths = rng.integers(0, 40, n)
        order = rng.permutation(n)
        if rng.random() < 0.5:
            order = order[np.argsort(lengths[order], kind="stable")]  # the vectorized path
        for max_tokens, max_sentences in ((50, 0), (200, 3)):
            got = pack(order, lengths, max_tokens=max_tokens, max_sentences=max_sentences)
            assert [b.tolist() for b in got] == _greedy_pack(
                order, lengths, max_tokens, max_sentences
            )


def test_a_batch_list_indexes_and_slices_like_a_list():
    src, tgt = _sizes()
    batches = epoch_batches(None, src, tgt, max_tokens=300, max_sentences=0, seed=1, epoch=1)
    as_list = list(batches)
    assert len(as_list) == len(batches)
    assert [b.tolist() for b in batches[2:9:3]] == [b.tolist() for b in as_list[2:9:3]]
    assert batches[-1].tolist() == as_list[-1].tolist()
    assert batches.order.dtype == np.int32  # half the memory of int64 indices
    with pytest.raises(IndexError):
        batches[len(batches)]
