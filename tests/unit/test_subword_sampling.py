"""Subword regularization (subword.src_alpha / subword.tgt_alpha): SentencePiece's own
segmentation without sampling, SentencePiece's own sampling distribution with it, the same
draws in every process, batches within max_tokens, and validation untouched."""

from __future__ import annotations

import collections
import json
import math
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import tiny_config

from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.subword_sampling import Segmenter
from nmt.data.tokenizer import Tokenizer, load_tokenizers
from nmt.training.data import load_train_data
from nmt.training.validation import validate

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture
def unigram_data_dir(preprocess_config, tmp_path: Path) -> Path:
    """The small demo corpus with a unigram model (the demo's default is BPE)."""
    build_data_dir(preprocess_config("spm.model_type=unigram", "spm.vocab_size=300"))
    return tmp_path / "out"


def _stored(data_dir: Path, lang: str) -> list[np.ndarray]:
    array = TokenArray(str(data_dir / f"train.{lang}"))
    return [array[i] for i in range(len(array))]


def test_without_sampling_bpe_gives_sentencepieces_own_segmentation(demo_data_dir: Path) -> None:
    """Dropout 0: the stored ids of every training sentence, so the merges, their order
    and the byte fallback are SentencePiece's. (Decoding the stored ids gives back the
    text preprocessing encoded.)"""
    for lang, tok in zip(("en", "de"), load_tokenizers(demo_data_dir)):
        segmenter = Segmenter(tok, 0.0, -1, "demo")
        stored = _stored(demo_data_dir, lang)
        assert not any((s == 3).any() for s in stored)  # no <unk>: every sentence is drawn
        rng = random.Random(0)
        texts = tok.decode_batch(stored)
        assert [segmenter.sample(t, rng) + [2] for t in texts] == [s.tolist() for s in stored]
        assert tok.encode_batch(texts) == [s[:-1].tolist() for s in stored]


def test_unigram_lattice_is_sentencepieces(unigram_data_dir: Path) -> None:
    """A huge alpha puts all the probability on the best segmentation: SentencePiece's
    Viterbi one, the stored ids (or, where two segmentations tie, the other one: the same
    pieces in another order, as "0" "00" and "00" "0")."""
    src, _ = load_tokenizers(unigram_data_dir)
    segmenter = Segmenter(src, 1e4, -1, "small")
    rng = random.Random(0)
    stored = _stored(unigram_data_dir, "en")
    drawn = [segmenter.sample(t, rng) + [2] for t in src.decode_batch(stored)]
    differ = [(d, s.tolist()) for d, s in zip(drawn, stored) if d != s.tolist()]
    assert len(differ) <= len(stored) // 100
    assert all(sorted(d) == sorted(s) for d, s in differ)


def _total_variation(a: collections.Counter, b: collections.Counter) -> float:
    n_a, n_b = sum(a.values()), sum(b.values())
    return 0.5 * sum(abs(a[k] / n_a - b[k] / n_b) for k in set(a) | set(b))


def _expected_total_variation(pooled: collections.Counter, n_a: int, n_b: int) -> float:
    """The total variation expected between two independent samples of n_a and n_b draws
    from the distribution `pooled` estimates: each outcome's difference of frequencies is
    about normal with variance p (1 - p) (1/n_a + 1/n_b), whose mean magnitude is its
    standard deviation times sqrt(2/pi); half their sum."""
    total = sum(pooled.values())
    spread = 2 / math.pi * (1 / n_a + 1 / n_b)
    return 0.5 * sum(math.sqrt(spread * c / total * (1 - c / total)) for c in pooled.values())


# The standard deviation of that total variation, at most, as a share of its expectation:
# one outcome's |difference| has mean sigma sqrt(2/pi) and deviation sigma sqrt(1 - 2/pi);
# the sum's deviation is at most the sum of theirs (outcomes moving together).
SPREAD_BOUND = math.sqrt(math.pi / 2 - 1)  # 0.755


@pytest.mark.parametrize("model", ["bpe", "unigram"])
def test_draws_follow_sentencepieces_own_sampling(
    model: str, demo_data_dir: Path, unigram_data_dir: Path
) -> None:
    """40,000 draws of one word, ours and SentencePiece's (enable_sampling, whose draws
    differ from process to process): the two empirical distributions over its ~100
    segmentations are as close as two samples of one distribution are expected to be.

    The bound is that expectation plus 6 of its largest possible standard deviations
    (SPREAD_BOUND): 0.082 for BPE's word here (expected 0.015, simulated deviation 0.002)
    and 0.015 for the unigram model's (0.0027, 0.0016), where alpha 0.6 instead of 0.3
    gives 0.55 and 0.14. (A fixed 0.02 margin failed on a Zen 5 EPYC at 0.0209: it was
    about the expectation itself.)"""
    data_dir = demo_data_dir if model == "bpe" else unigram_data_dir
    tok = load_tokenizers(data_dir)[0]
    word, alpha, n = "hundred", 0.3, 40_000
    rng = random.Random(1)
    segmenter = Segmenter(tok, alpha, -1, model)
    ours = collections.Counter(tuple(segmenter.sample(word, rng)) for _ in range(n))

    def theirs() -> collections.Counter:
        ids = tok._sp.encode([word] * n, enable_sampling=True, alpha=alpha, nbest_size=-1)
        return collections.Counter(tuple(x) for x in ids)

    first = theirs()
    assert len(ours) >= 5  # a word with many segmentations: the test can tell them apart
    expected = _expected_total_variation(ours + first, n, n)
    assert _total_variation(ours, first) <= expected * (1 + 6 * SPREAD_BOUND), expected


def test_nbest_sampling_draws_among_the_k_best(unigram_data_dir: Path) -> None:
    tok = load_tokenizers(unigram_data_dir)[0]
    segmenter = Segmenter(tok, 0.5, 4, "small")
    rng = random.Random(0)
    best4 = [tuple(x) for x in tok.nbest_encode("hundred thousand", 4)]
    drawn = collections.Counter(
        tuple(segmenter.sample("hundred thousand", rng)) for _ in range(400)
    )
    assert set(drawn) <= set(best4) and len(drawn) > 1


DRAW = """
import json, sys
sys.path.insert(0, sys.argv[1])
from pathlib import Path
from helpers import tiny_config
from nmt.training.data import load_train_data
data = load_train_data(tiny_config(Path(sys.argv[2]), Path(sys.argv[3]),
                                   subword={"src_alpha": 0.1, "tgt_alpha": 0.1}))
rows = data.epoch_batches(3)[2]
print(json.dumps([[s.tolist(), t.tolist()] for s, t in data.train_pairs(rows, 3)]))
"""


def test_a_batch_draws_the_same_segmentations_in_every_process(
    demo_data_dir: Path, tmp_path: Path
) -> None:
    """A function of (seed, epoch, the batch's sentences): a resumed run and every DDP rank
    draw what an uninterrupted run draws (SentencePiece's own sampling does not: its seeded
    generator is salted per process)."""
    tests = Path(__file__).resolve().parents[1]
    out = subprocess.run(
        [sys.executable, "-c", DRAW, str(tests), str(demo_data_dir), str(tmp_path / "other")],
        capture_output=True,
        text=True,
        timeout=120,
        check=True,
    ).stdout
    data = load_train_data(
        tiny_config(demo_data_dir, tmp_path / "run", subword={"src_alpha": 0.1, "tgt_alpha": 0.1})
    )
    rows = data.epoch_batches(3)[2]
    data.train_pairs(data.epoch_batches(3)[0], 3)  # other draws before: no matter
    here = [[s.tolist(), t.tolist()] for s, t in data.train_pairs(rows, 3)]
    assert json.loads(out) == here
    stored = [[s.tolist(), t.tolist()] for s, t in data.train.pairs(rows)]
    changed = np.mean([a[k] != b[k] for a, b in zip(here, stored) for k in (0, 1)])
    assert changed > 0.5  # dropout 0.1: most sentences are cut differently
    next_epoch = [[s.tolist(), t.tolist()] for s, t in data.train_pairs(rows, 4)]
    assert np.mean([a[k] != b[k] for a, b in zip(here, next_epoch) for k in (0, 1)]) > 0.5
    # the same sentences, only cut differently
    src_tok, tgt_tok = load_tokenizers(demo_data_dir)
    for (src, tgt), (s_src, s_tgt) in zip(here, stored):
        assert src[-1] == tgt[-1] == 2
        assert src_tok.decode(src) == src_tok.decode(s_src)
        assert tgt_tok.decode(tgt) == tgt_tok.decode(s_tgt)


def test_one_side_only(demo_data_dir: Path, tmp_path: Path) -> None:
    data = load_train_data(tiny_config(demo_data_dir, tmp_path / "run", subword={"src_alpha": 0.1}))
    rows = data.epoch_batches(1)[0]
    sampled, stored = data.train_pairs(rows, 1), data.train.pairs(rows)
    assert all(np.array_equal(a[1], b[1]) for a, b in zip(sampled, stored))
    assert any(not np.array_equal(a[0], b[0]) for a, b in zip(sampled, stored))


def test_sampled_batches_keep_within_max_tokens(demo_data_dir: Path, tmp_path: Path) -> None:
    """Batches are packed on the stored lengths shrunk by the sampled growth; the drawn
    batch (rows x longest side) stays within max_tokens, and few pairs need their stored
    segmentation to fit."""
    cfg = tiny_config(
        demo_data_dir,
        tmp_path / "run",
        max_tokens=300,
        subword={"src_alpha": 0.1, "tgt_alpha": 0.1},
    )
    data = load_train_data(cfg)
    assert data.sampler is not None
    factor = data.sampler.packing_factor(data.train, data.train_indices)
    assert factor > 1.1  # dropout 0.1 draws longer segmentations
    assert data.packing_tokens == int(300 / factor)
    assert any("packed to" in note for note in data.notes)
    plain = load_train_data(tiny_config(demo_data_dir, tmp_path / "plain", max_tokens=300))
    assert len(data.epoch_batches(1)) > len(plain.epoch_batches(1))
    for rows in data.epoch_batches(1):
        pairs = data.train_pairs(rows, 1)
        assert len(pairs) * max(max(len(s), len(t)) for s, t in pairs) <= 300
    assert data.sampler.pairs_sampled == len(data.train)
    assert data.sampler.pairs_kept <= 0.02 * data.sampler.pairs_sampled


def test_validation_never_samples(demo_data_dir: Path, tmp_path: Path) -> None:
    from nmt.training import build_training

    figures = []
    for alpha in (0.0, 0.1):
        cfg = tiny_config(
            demo_data_dir,
            tmp_path / f"run{alpha}",
            validation={"split": "test"},
            subword={"src_alpha": alpha, "tgt_alpha": alpha},
        )
        figures.append(validate(build_training(cfg)))
    for key in ("loss", "nll", "ntokens"):
        assert figures[0][key] == figures[1][key]


def test_a_model_it_cannot_sample_is_one_line(demo_data_dir: Path, tmp_path: Path) -> None:
    from sentencepiece import sentencepiece_model_pb2

    from nmt.errors import NmtError

    proto = sentencepiece_model_pb2.ModelProto()
    proto.ParseFromString((demo_data_dir / "spm.model").read_bytes())
    proto.trainer_spec.model_type = 3  # WORD
    with pytest.raises(NmtError, match=r"^x: subword sampling needs a unigram or BPE"):
        Segmenter(Tokenizer(proto.SerializeToString()), 0.1, -1, "x")
