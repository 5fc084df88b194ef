"""Token-budget batching, per-epoch shuffling, rank sharding and collation."""

import numpy as np
import pytest
import torch

from nmt.data.batching import epoch_batches, filter_by_size, fixed_batches, pack, rank_share
from nmt.data.collate import collate
from nmt.data.dataset import PairDataset
from nmt.data.vocab import EOS, PAD
from nmt.errors import NmtError


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
