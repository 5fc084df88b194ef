"""The pure search step and the logit processors on synthetic log-probabilities whose
answers are known by hand."""

from __future__ import annotations

import math

import pytest
import torch

from nmt.generation.config import SearchConfig
from nmt.generation.processors import (
    NEG_INF,
    ForcedTokens,
    LogitProcessors,
    MinLength,
    NeverGenerate,
    NoRepeatNgram,
    Temperature,
    UnkPenalty,
    block_repeated_ngrams,
    top_k,
    top_p,
)
from nmt.generation.search import (
    beam_candidates,
    length_penalty,
    sample_candidates,
    select_active,
)
from nmt.vocab import BOS, EOS, PAD, UNK


@pytest.mark.parametrize(
    "length,lenpen,expected",
    [(4, 1.0, 4.0), (4, 0.0, 1.0), (4, 0.5, 2.0), (8, 2.0, 64.0), (1, 3.0, 1.0)],
)
def test_length_penalty_at_points(length, lenpen, expected):
    assert length_penalty(length, lenpen) == pytest.approx(expected)
    assert float(length_penalty(torch.tensor(float(length)), lenpen)) == pytest.approx(expected)


def test_beam_candidates_rank_sums_of_scores_and_log_probs():
    scores = torch.tensor([[-1.0, -1.5]])  # [N=1,K=2]
    lprobs = torch.tensor(
        [
            [
                [-0.1, -1.0, -2.0, -3.0],  # beam 0: totals -1.1 -2.0 -3.0 -4.0
                [-0.6, -0.2, -4.0, -5.0],
            ]
        ]
    )  # beam 1: totals -2.1 -1.7 -5.5 -6.5
    cand_scores, tokens, origins = beam_candidates(lprobs, scores)
    assert cand_scores.shape == (1, 4)  # 2K candidates
    assert cand_scores[0].tolist() == pytest.approx([-1.1, -1.7, -2.0, -2.1])
    assert tokens[0].tolist() == [0, 1, 1, 0]
    assert origins[0].tolist() == [0, 1, 0, 1]


def test_beam_candidates_ignore_hypotheses_scored_minus_infinity():
    # First step: K copies of the start state, only the first may be extended.
    lprobs = torch.log(torch.tensor([[0.1, 0.2, 0.3, 0.4]])).expand(2, 3, 4)  # N=2,K=3
    scores = torch.tensor([[0.0, NEG_INF, NEG_INF]]).expand(2, 3)
    cand_scores, tokens, origins = beam_candidates(lprobs, scores)
    assert origins[:, :4].eq(0).all()  # 4 finite candidates, all from beam 0
    assert tokens[0, :4].tolist() == [3, 2, 1, 0]
    assert torch.isinf(cand_scores[:, 4:]).all()


def test_select_active_skips_eos_candidates_in_rank_order():
    cand_scores = torch.tensor([[-1.0, -2.0, -3.0, -4.0]])
    ended = torch.tensor([[True, False, True, False]])
    pick, scores = select_active(cand_scores, ended, beam=2)
    assert pick.tolist() == [[1, 3]]
    assert scores.tolist() == [[-2.0, -4.0]]


def test_select_active_pads_with_dead_placeholders():
    cand_scores = torch.tensor([[-1.0, -2.0]])
    ended = torch.tensor([[True, False]])  # only one continues; beam 2 asks for two
    pick, scores = select_active(cand_scores, ended, beam=2)
    assert pick[0, 0] == 1 and scores[0, 0] == -2.0
    assert scores[0, 1] == NEG_INF


@pytest.mark.parametrize("n,banned", [(1, {5, 6, 7}), (2, {7}), (3, {7}), (4, set()), (6, set())])
def test_block_repeated_ngrams(n, banned):
    history = torch.tensor([[5, 6, 7, 5, 6]])
    lprobs = torch.zeros(1, 10)
    block_repeated_ngrams(history, lprobs, n)
    assert {i for i in range(10) if lprobs[0, i] == NEG_INF} == banned


def test_block_repeated_ngrams_rows_are_independent():
    history = torch.tensor([[5, 6, 5], [7, 8, 9]])  # row 0 ends in "5", seen before "6"
    lprobs = torch.zeros(2, 10)
    block_repeated_ngrams(history, lprobs, 2)
    assert lprobs[0].eq(NEG_INF).nonzero().flatten().tolist() == [6]
    assert not lprobs[1].eq(NEG_INF).any()


def test_sampling_top1_is_argmax_and_score_adds_the_token_log_prob():
    lprobs = torch.log_softmax(torch.randn(3, 2, 7, generator=torch.Generator().manual_seed(0)), -1)
    scores = torch.tensor([[-1.0, -2.0]]).expand(3, 2)
    cand_scores, tokens, origins = sample_candidates(lprobs, scores, topk=1)
    assert torch.equal(tokens, lprobs.argmax(-1))
    assert torch.equal(origins, torch.tensor([[0, 1]]).expand(3, 2))
    assert torch.allclose(cand_scores, scores + lprobs.max(-1).values)


def test_sampling_respects_topk_and_topp():
    probs = torch.tensor([0.5, 0.3, 0.15, 0.05])
    lprobs = probs.log().expand(1, 4000, 4)  # 4000 independent draws
    rng = torch.Generator().manual_seed(1)
    _, tokens, _ = sample_candidates(lprobs, torch.zeros(1, 4000), topk=2, generator=rng)
    assert set(tokens.unique().tolist()) == {0, 1}
    # topp=0.7: mass before token 1 is 0.5 < 0.7 (kept), before token 2 is 0.8 (dropped).
    _, tokens, _ = sample_candidates(lprobs, torch.zeros(1, 4000), topp=0.7, generator=rng)
    assert set(tokens.unique().tolist()) == {0, 1}
    share = tokens.eq(0).float().mean().item()
    assert share == pytest.approx(0.5 / 0.8, abs=0.05)  # renormalized over the kept set
    _, tokens, _ = sample_candidates(lprobs, torch.zeros(1, 4000), generator=rng)
    assert set(tokens.unique().tolist()) == {0, 1, 2, 3}
    assert math.isclose(tokens.eq(3).float().mean().item(), 0.05, abs_tol=0.02)


def test_sampling_takes_the_likeliest_allowed_token_when_the_rest_underflow():
    """At a low temperature every token but the likeliest has probability 0 in fp32; a
    rule that forbids that one (min_len's EOS) leaves the next likeliest, as greedy does."""
    logits = torch.tensor([[[2.0, 5.0, 3.0, 1.0]]]) / 1e-4  # [1,1,4]
    lprobs = torch.log_softmax(logits, dim=-1)
    lprobs[..., 1] = -math.inf  # the likeliest token forbidden
    assert lprobs.exp().sum() == 0
    rng = torch.Generator().manual_seed(1)
    scores, tokens, _ = sample_candidates(lprobs, torch.zeros(1, 1), generator=rng)
    assert tokens.tolist() == [[2]] and scores.item() == lprobs[0, 0, 2].item()


@pytest.mark.parametrize("vocab", [8000, 8003, 1001, 37])
@pytest.mark.parametrize("beam", [1, 2, 5])
def test_sentence_topk_equals_topk_of_the_sums(vocab, beam):
    from nmt.generation.search import sentence_topk

    torch.manual_seed(vocab + beam)
    c = 2 * beam
    lprobs = torch.randn(6, beam, vocab) * 5  # [N,K,V]
    scores = torch.randn(6, beam) * 3  # [N,K]
    lprobs[0] = float("-inf")  # a sentence with nothing allowed: any indices, all -inf
    lprobs[1, :] = float("-inf")
    lprobs[1, :, vocab - 1] = 3.0  # forced rows: one finite value each
    lprobs[2, 0, torch.randperm(vocab)[:c]] += 100.0  # the best values clustered in few blocks
    lprobs[3, -1, :c] = 50.0 + torch.arange(c)  # all in one block of the last hypothesis
    scores[4, 1:] = NEG_INF  # first step: only the first hypothesis may be extended
    want_values, want_ids = (scores.unsqueeze(2) + lprobs).view(6, -1).topk(c, dim=1)
    values, ids = sentence_topk(lprobs, scores, c)
    assert torch.equal(values, want_values)  # the same sums, not merely close ones
    # -inf values tie: sentences 0 and 1 may name other indices for them
    assert torch.equal(ids[2:], want_ids[2:])
    assert ids[1, :beam].remainder(vocab).eq(vocab - 1).all()
    sums = (scores.unsqueeze(2) + lprobs).view(6, -1)
    assert torch.equal(sums.gather(1, ids), values)


def test_log_softmax_in_place_equals_log_softmax():
    """The generator turns each step's logits into log-probs in place (out=logits)."""
    logits = torch.randn(7, 1003) * 4
    want = torch.log_softmax(logits, dim=-1)
    assert torch.equal(torch.log_softmax(logits, dim=-1, out=logits), want)
    assert torch.equal(logits, want)


# -- logit processors: each does its one job, and they compose -------------------------


def _lprobs(rows: int = 4, vocab: int = 12, seed: int = 0) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.log_softmax(torch.randn(rows, vocab, generator=g), dim=-1)  # [R,V]


def _changed(before: torch.Tensor, after: torch.Tensor) -> set[tuple[int, int]]:
    return {tuple(i) for i in (before != after).nonzero().tolist()}


HISTORY = torch.tensor([[EOS, 5, 6, 5], [EOS, 7, 8, 9], [EOS, 4, 4, 4], [EOS, 9, 5, 6]])


@pytest.mark.parametrize(
    "rule, step, expected",
    [
        (NeverGenerate((PAD, BOS)), 3, {(r, c) for r in range(4) for c in (PAD, BOS)}),
        (UnkPenalty(2.0), 3, {(r, UNK) for r in range(4)}),
        (MinLength(4), 3, {(r, EOS) for r in range(4)}),
        (MinLength(3), 3, set()),  # three tokens generated: EOS is allowed now
        (NoRepeatNgram(2), 3, {(0, 6), (2, 4)}),  # "5 6" seen, ends in 5; "4 4" seen
    ],
    ids=["never", "unkpen", "min_len", "min_len_reached", "ngram"],
)
def test_each_rule_does_its_one_job(rule, step, expected):
    lp = _lprobs()
    before = lp.clone()
    rule(lp, step, HISTORY)
    assert _changed(before, lp) == expected
    for r, c in expected:
        if isinstance(rule, UnkPenalty):
            assert lp[r, c] == pytest.approx(float(before[r, c]) - 2.0)
        else:
            assert lp[r, c] == NEG_INF


def test_temperature_divides_the_logits_in_place():
    logits = torch.randn(3, 7)
    want = logits / 0.5
    out = Temperature(0.5)(logits)
    assert out.data_ptr() == logits.data_ptr() and torch.equal(out, want)
    processors = LogitProcessors([], temperature=0.5)
    logits = torch.randn(3, 7)
    assert torch.equal(
        processors.log_probs(logits.clone()), torch.log_softmax(logits / 0.5, dim=-1)
    )


def test_forced_tokens_pin_prefixes_then_eos_at_the_limit():
    prefix = torch.tensor([[7, 8], [9, PAD]])  # sentence 1's prefix is one token
    forced = ForcedTokens(prefix, max_lens=torch.tensor([3, 1]), beam=2)  # rows 0,1 | 2,3
    rows, tokens = forced.at(0)
    assert rows.tolist() == [0, 1, 2, 3] and tokens.tolist() == [7, 7, 9, 9]
    rows, tokens = forced.at(1)  # sentence 1 is at its limit: EOS wins over nothing
    assert rows.tolist() == [0, 1, 2, 3] and tokens.tolist() == [8, 8, EOS, EOS]
    rows, tokens = forced.at(2)  # sentence 1 stays at its limit, sentence 0 is free
    assert rows.tolist() == [2, 3] and tokens.tolist() == [EOS, EOS]
    rows, tokens = forced.at(3)
    assert rows.tolist() == [0, 1, 2, 3] and tokens.tolist() == [EOS] * 4
    forced.keep(torch.tensor([0]), torch.tensor([3]))  # sentence 1 left the batch
    assert forced.at(2) is None
    rows, tokens = forced.at(3)
    assert rows.tolist() == [0, 1] and tokens.tolist() == [EOS, EOS]
    with pytest.raises(ValueError, match="EOS or BOS"):
        ForcedTokens(torch.tensor([[5, EOS]]), torch.tensor([4]), beam=1)


def test_processors_compose_in_order_and_pins_keep_the_models_log_prob():
    search = SearchConfig(beam=2, min_len=5, unkpen=1.5, no_repeat_ngram_size=2, temperature=2.0)
    processors = LogitProcessors.from_search(search)
    kinds = [type(r) for r in processors.rules]
    assert kinds == [NeverGenerate, UnkPenalty, MinLength, NoRepeatNgram]
    assert processors.temperature is not None and processors.temperature.temperature == 2.0
    assert [type(r) for r in LogitProcessors.from_search(SearchConfig(min_len=0)).rules] == [
        NeverGenerate
    ]
    lp = _lprobs()
    one_by_one = lp.clone()
    for rule in (NeverGenerate(), UnkPenalty(1.5), MinLength(5), NoRepeatNgram(2)):
        rule(one_by_one, 3, HISTORY)
    composed = lp.clone()
    processors(composed, 3, HISTORY)
    assert torch.equal(composed, one_by_one)
    # Pinned rows: sentence 0 (rows 0,1) must say UNK (its prefix), sentence 1 (rows 2,3)
    # is at its length limit (EOS) although min_len forbids EOS: the pin wins, with the
    # model's own log-prob, unpenalized.
    forced = ForcedTokens(torch.tensor([[PAD, PAD, PAD, UNK], [PAD] * 4]), torch.tensor([9, 3]), 2)
    pinned = lp.clone()
    processors(pinned, 3, HISTORY, forced)
    for row, token in ((0, UNK), (1, UNK), (2, EOS), (3, EOS)):
        assert pinned[row, token] == lp[row, token]
        assert pinned[row].isfinite().sum() == 1


def test_top_k_and_top_p_narrow_the_sampling_candidates():
    lp = torch.tensor([[0.5, 0.3, 0.15, 0.05]]).log()
    values, ids = top_k(lp, 2)
    assert ids.tolist() == [[0, 1]] and torch.equal(values, lp[:, :2])
    values, ids = top_k(lp, 0)  # all, sorted
    assert ids.tolist() == [[0, 1, 2, 3]]
    probs = values.exp()
    assert top_p(probs, 0.7).gt(0).tolist() == [[True, True, False, False]]
    assert top_p(probs, 0.1).gt(0).tolist() == [[True, False, False, False]]  # first stays
    assert top_p(probs, 1.0) is probs
