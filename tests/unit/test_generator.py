"""SequenceGenerator: hand-checked searches on a tiny Markov model, and invariants on a
randomly initialised Transformer (beam 1 = greedy, batch composition, forced-decoding
scores, cached = uncached, ensembles)."""

from __future__ import annotations

import math
from types import SimpleNamespace

import pytest
import torch
from rounding import gamma, logprob_tolerance, probability_sum_tolerance
from torch import nn

from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator, _Member
from nmt.model.transformer import EncoderOut, Transformer
from nmt.vocab import BOS, EOS, PAD, UNK
from tests.helpers import padded, random_sources, random_transformer

A, B, C = 4, 5, 6  # the Markov model's three words


pytestmark = pytest.mark.usefixtures("one_thread")

# The Markov model's log-probabilities: its logits are log(fp32 p) (3 U (1 + |log p|) each)
# and the search's fp32 log-softmax over V = 7 adds gamma(V + 4) (1 + the spread of the
# finite logits, |log 0.01| at most); a score averages such values. gamma(2 V + 8) *
# (1 + |log 0.01|) covers both (7e-6); a wrong path or length penalty is off by > 1e-2.
MARKOV = gamma(2 * 7 + 8) * (1 + abs(math.log(0.01)))


class _NoCache:
    length = 0

    def reorder(
        self,
        index: torch.Tensor,
        encoder_rows: torch.Tensor | None = None,
        *,
        groups_kept: bool | None = None,
    ) -> None:
        pass


class Markov(nn.Module):
    """A stand-in with the Transformer's decoding API whose next-token distribution
    depends only on the previous token: probabilities known by hand."""

    def __init__(self, table: dict[int, dict[int, float]], vocab: int = 7):
        super().__init__()
        probs = torch.full((vocab, vocab), 1.0 / vocab)
        for prev, row in table.items():
            probs[prev] = 0.0
            for tok, p in row.items():
                probs[prev, tok] = p
        self.register_buffer("logits", probs.log())
        self.cfg = SimpleNamespace(max_target_positions=64)
        self.anchor = nn.Parameter(torch.zeros(1))  # gives the model a device

    def encode(self, src_tokens: torch.Tensor, padded: bool | None = None) -> EncoderOut:
        return EncoderOut(torch.zeros(*src_tokens.shape, 1), src_tokens.eq(PAD), padded)

    def decode(self, prev_tokens, enc, cache=None, attn_layer=None):
        return self.logits[prev_tokens], None  # [B,T,V]

    def new_cache(self, **cache_args) -> _NoCache:
        return _NoCache()


# From the start: a .5, b .4, c .1; "a" ends with .4, "b" with .9, "c" always.
TABLE = {
    EOS: {A: 0.5, B: 0.4, C: 0.1},
    A: {EOS: 0.4, B: 0.3, C: 0.3},
    B: {EOS: 0.9, A: 0.05, C: 0.05},
    C: {EOS: 1.0},
}
SRC = torch.tensor([[A, EOS]])


def _run(model, src=SRC, prefix=None, **search):
    return SequenceGenerator([model], SearchConfig(**search)).generate(src, prefix)[0]


def test_beam_finds_what_greedy_misses():
    greedy = _run(Markov(TABLE), beam=1)
    assert [h.tokens.tolist() for h in greedy] == [[A, EOS]]  # .5 * .4 = .20
    best, second = _run(Markov(TABLE), beam=2, nbest=2)
    assert best.tokens.tolist() == [B, EOS]  # .4 * .9 = .36
    assert best.score == pytest.approx(math.log(0.36) / 2, abs=MARKOV)
    assert best.positional_scores.tolist() == pytest.approx(
        [math.log(0.4), math.log(0.9)], abs=MARKOV
    )
    assert second.tokens.tolist() == [A, EOS]
    assert second.score == pytest.approx(math.log(0.2) / 2, abs=MARKOV)


def test_length_penalty_changes_the_winner():
    # a c EOS (.15, length 3) loses to b EOS (.36) unless long outputs are favoured.
    table = {**TABLE, A: {EOS: 0.1, C: 0.9}, C: {EOS: 1.0}}  # a c EOS = .45
    hyp_long, hyp_short = (A, C, EOS), (B, EOS)
    for lenpen in (0.0, 1.0, 3.0):
        best = _run(Markov(table), beam=2, lenpen=lenpen)[0]
        expected = max(
            [(math.log(0.45) / 3**lenpen, hyp_long), (math.log(0.36) / 2**lenpen, hyp_short)]
        )
        assert tuple(best.tokens.tolist()) == expected[1]
        assert best.score == pytest.approx(expected[0], abs=MARKOV)


def test_min_len_prefix_and_max_len():
    best = _run(Markov(TABLE), beam=2, min_len=2)[0]  # a c EOS .15 beats a b EOS .135
    assert best.tokens.tolist() == [A, C, EOS]
    assert best.score == pytest.approx(math.log(0.15) / 3, abs=MARKOV)
    forced = _run(Markov(TABLE), beam=2, prefix=torch.tensor([[C]]))[0]
    assert forced.tokens.tolist() == [C, EOS]
    assert forced.score == pytest.approx(math.log(0.1) / 2, abs=MARKOV)
    looping = Markov({EOS: {A: 1.0}, A: {A: 0.99, EOS: 0.01}})
    for limit in (1, 4):
        out = _run(looping, beam=1, max_len_b=limit)[0]  # EOS never ranks first
        assert out.tokens.tolist() == [A] * limit + [EOS]
    # limits far beyond the model's positions are its positions (63 tokens, then EOS), not
    # an overflow: 1e308 * length is inf in float64, and 10**20 is no int64
    for huge in (dict(max_len_a=1e308), dict(max_len_b=10**20), dict(max_len_a=1e300)):
        out = _run(looping, beam=1, **huge)[0]
        assert out.tokens.tolist() == [A] * 63 + [EOS], huge


def test_unkpen_and_special_tokens():
    table = {EOS: {UNK: 0.5, BOS: 0.2, PAD: 0.1, A: 0.2}, UNK: {EOS: 1.0}, A: {EOS: 1.0}}
    assert _run(Markov(table), beam=1)[0].tokens.tolist() == [UNK, EOS]  # BOS, PAD never
    assert _run(Markov(table), beam=1, unkpen=1.0)[0].tokens.tolist() == [A, EOS]


def test_no_repeat_ngram_blocking():
    looping = Markov(
        {EOS: {A: 0.6, B: 0.4}, A: {A: 0.7, B: 0.2, EOS: 0.1}, B: {A: 0.7, B: 0.2, EOS: 0.1}}
    )
    assert _run(looping, beam=2, max_len_b=6)[0].tokens.tolist()[:3] == [A, A, A]
    out = _run(looping, beam=2, max_len_b=6, no_repeat_ngram_size=2)[0].tokens.tolist()
    bigrams = list(zip(out[:-1], out[1:]))
    assert len(bigrams) == len(set(bigrams))


def test_sampling_with_top1_is_greedy_and_seeded_sampling_repeats():
    model = Markov(TABLE)
    top1 = _run(model, beam=3, nbest=3, sampling=True, sampling_topk=1)
    assert all(h.tokens.tolist() == [A, EOS] for h in top1)
    src = SRC.expand(6, 2)
    runs = [
        SequenceGenerator([model], SearchConfig(beam=2, sampling=True, seed=7)).generate(src)
        for _ in range(2)
    ]
    assert [[h.tokens.tolist() for h in s] for s in runs[0]] == [
        [h.tokens.tolist() for h in s] for s in runs[1]
    ]


# -- a randomly initialised Transformer --------------------------------------------------


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_transformer()


def _pairs(sources: list[torch.Tensor], found) -> list[tuple[list[int], list[int]]]:
    """(source ids, hypothesis ids) of every hypothesis found for `sources`."""
    return [(s.tolist(), h.tokens.tolist()) for s, hyps in zip(sources, found) for h in hyps]


def _greedy(model: Transformer, src: torch.Tensor, max_len: int) -> list[int]:
    """Reference greedy decoding of one sentence: full decoder pass at every step."""
    enc = model.encode(src[None])
    out = [EOS]
    with torch.no_grad():
        for step in range(max_len + 1):
            lp = torch.log_softmax(model.decode(torch.tensor([out]), enc)[0][0, -1], -1)
            lp[[PAD, BOS]] = -math.inf
            if step < 1:  # min_len=1
                lp[EOS] = -math.inf
            token = EOS if step == max_len else int(lp.argmax())
            out.append(token)
            if token == EOS:
                break
    return out[1:]


def test_beam1_equals_greedy(model):
    sources = random_sources([5, 9, 3, 12])
    hyps = SequenceGenerator([model], SearchConfig(beam=1, max_len_b=10)).generate(padded(sources))
    for src, h in zip(sources, hyps):
        assert h[0].tokens.tolist() == _greedy(model, src, 10)


@pytest.mark.parametrize("beam", [1, 4])
def test_output_does_not_depend_on_the_batch(model, beam):
    # Length limits of 1 x source + 2 end the sentences at different steps, so finished
    # ones idle in the batch for a while and then leave it (both paths are exercised).
    sources = random_sources([6, 11, 3, 8, 14, 6, 4, 5, 9], seed=1)
    gen = SequenceGenerator(
        [model], SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=2)
    )
    together = gen.generate(padded(sources))
    reordered = gen.generate(padded(sources[::-1]))[::-1]
    tolerance = logprob_tolerance(model, _pairs(sources, together))  # see tests/rounding.py
    for i, src in enumerate(sources):
        alone = gen.generate(src[None])[0]
        for other in (together[i], reordered[i]):
            assert [h.tokens.tolist() for h in other] == [h.tokens.tolist() for h in alone]
            scores = [h.score for h in other]  # means of log-probabilities (lenpen 1)
            assert scores == pytest.approx([h.score for h in alone], abs=tolerance)


@pytest.mark.parametrize("lenpen,sampling", [(1.0, False), (0.6, False), (1.0, True)])
def test_reported_score_is_the_forced_decoding_score(model, lenpen, sampling):
    sources = random_sources([7, 4, 10], seed=2)
    temperature = 0.8 if sampling else 1.0
    gen = SequenceGenerator(
        [model],
        SearchConfig(
            beam=3, nbest=3, lenpen=lenpen, max_len_b=9, sampling=sampling, temperature=temperature
        ),
    )
    found = gen.generate(padded(sources))
    # both sides' log-probabilities (of logits / temperature <= 1: errors grow by 1/0.8)
    tolerance = logprob_tolerance(model, _pairs(sources, found)) / temperature
    for src, hyps in zip(sources, found):
        for h in hyps:
            prev = torch.cat([torch.tensor([EOS]), h.tokens[:-1]])[None]  # [1,T]
            with torch.no_grad():
                lp = torch.log_softmax(model(src[None], prev)[0].float() / temperature, -1)  # [T,V]
            token_lp = lp.gather(1, h.tokens[:, None]).squeeze(1)
            assert h.positional_scores.tolist() == pytest.approx(token_lp.tolist(), abs=tolerance)
            # a sum of T such values, divided by T**lenpen, and summed in fp32 (gamma(T))
            length = len(h.tokens)
            score_tolerance = (length * tolerance + gamma(length) * float(token_lp.abs().sum())) / (
                length**lenpen
            )
            assert h.score == pytest.approx(
                float(token_lp.sum()) / length**lenpen, abs=score_tolerance
            )


@pytest.fixture(scope="module")
def other_model(model) -> Transformer:
    torch.manual_seed(1)
    return Transformer(model.cfg, src_vocab_size=40, tgt_vocab_size=40).eval()


@pytest.mark.parametrize(
    "case",
    [
        dict(beam=4, nbest=2, no_repeat_ngram_size=3),
        dict(beam=3, nbest=3, sampling=True, sampling_topk=8, temperature=0.8, seed=5),
        dict(beam=3, nbest=2, prefix=True, min_len=3),
        dict(beam=3, nbest=2, ensemble=True),
        dict(beam=2, nbest=2, prefix=True, ensemble=True, attention=True),
    ],
    ids=["beam", "sampling", "prefix", "ensemble", "ensemble-prefix-attention"],
)
def test_cached_equals_uncached(model, other_model, case):
    """Every phase of the search sees the same log-probabilities with the KV cache as
    with the whole prefix decoded again: beam and sampling selection, forced prefixes,
    ensembles, attention; and sentences finish and leave the batch alike."""
    kw = dict(case, max_len_a=1.0, max_len_b=3)
    prefix = torch.tensor([[7, 8], [PAD, PAD], [9, PAD]]) if kw.pop("prefix", False) else None
    models = [model, other_model] if kw.pop("ensemble", False) else [model]
    attn_layer = -1 if kw.pop("attention", False) else None
    sources = random_sources([5, 13, 8], seed=3)
    cached, full = (
        SequenceGenerator(models, SearchConfig(**kw, use_cache=use_cache)).generate(
            padded(sources), prefix, attn_layer=attn_layer
        )
        for use_cache in (True, False)
    )
    # (of logits / temperature <= 1: errors grow by 1/temperature)
    tolerance = max(logprob_tolerance(m, _pairs(sources, cached)) for m in models)
    tolerance /= kw.get("temperature", 1.0)
    for a, b in zip(cached, full):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)
        if attn_layer is not None:
            for x, y in zip(a, b):
                assert torch.allclose(x.attention, y.attention, atol=1e-5)
    if prefix is not None:
        for hyps, pre in zip(cached, prefix.tolist()):
            forced = [t for t in pre if t != PAD]
            assert all(h.tokens.tolist()[: len(forced)] == forced for h in hyps)


def test_ensemble_of_one_model_twice_is_the_model(model):
    src = padded(random_sources([6, 9], seed=4))
    single = SequenceGenerator([model], SearchConfig(beam=3, max_len_b=8)).generate(src)
    double = SequenceGenerator([model, model], SearchConfig(beam=3, max_len_b=8)).generate(src)
    # the ensemble's mean of two equal log-probabilities (logsumexp - log 2) rounds anew
    tolerance = logprob_tolerance(model, _pairs(random_sources([6, 9], seed=4), single))
    for a, b in zip(single, double):
        assert a[0].tokens.tolist() == b[0].tokens.tolist()
        assert a[0].score == pytest.approx(b[0].score, abs=tolerance)


def test_limits_prefix_and_attention(model):
    sources = random_sources([4, 10], seed=5)
    prefix = torch.tensor([[7, 8], [9, PAD]])
    gen = SequenceGenerator(
        [model], SearchConfig(beam=3, nbest=3, min_len=4, max_len_a=1.0, max_len_b=2), attn_layer=-1
    )
    for src, hyps, pre in zip(sources, gen.generate(padded(sources), prefix), prefix.tolist()):
        assert len(hyps) == 3
        for h in hyps:
            tokens = h.tokens.tolist()
            assert 4 + 1 <= len(tokens) <= len(src) + 2 + 1  # min_len .. max_len, + EOS
            assert tokens[-1] == EOS and EOS not in tokens[:-1]
            assert tokens[: len([p for p in pre if p != PAD])] == [p for p in pre if p != PAD]
            assert h.attention.shape == (len(tokens), max(len(s) for s in sources))
            sums, ones = h.attention[:, : len(src)].sum(1), torch.ones(len(tokens))
            tolerance = probability_sum_tolerance(len(src), heads=model.cfg.attention_heads)
            assert torch.allclose(sums, ones, rtol=0, atol=tolerance)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu_and_runs_in_half_precision(model):
    src = padded(random_sources([6, 12, 9], seed=6))
    search = SearchConfig(beam=4, nbest=2, max_len_b=10)
    on_cpu = SequenceGenerator([model], search).generate(src)
    gpu_model = Transformer(model.cfg, 40, 40).cuda().eval()
    gpu_model.load_state_dict(model.state_dict())
    on_gpu = SequenceGenerator([gpu_model], search).generate(src.cuda())
    for a, b in zip(on_cpu, on_gpu):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-3)
    for dtype in (torch.float16, torch.bfloat16):
        with torch.autocast("cuda", dtype=dtype):
            half = SequenceGenerator([gpu_model], search).generate(src.cuda())
        assert all(len(h) == 2 and h[0].tokens[-1] == EOS for h in half)


def test_nbest_and_attention_per_call(model):
    """generate(nbest=, attn_layer=) override the generator's own settings for one call."""
    src = padded(random_sources([6, 9, 4], seed=7))
    gen = SequenceGenerator([model], SearchConfig(beam=4, nbest=1, max_len_b=8))
    default = gen.generate(src)
    more = gen.generate(src, nbest=3, attn_layer=-1)
    for one, three in zip(default, more):
        assert len(one) == 1 and len(three) == 3 and one[0].attention is None
        assert one[0].tokens.tolist() == three[0].tokens.tolist()
        assert all(h.attention.shape == (len(h.tokens), src.size(1)) for h in three)
    assert all(h[0].attention is None for h in gen.generate(src))  # nothing sticks


def _weight_casts(model: Transformer, search: SearchConfig, src: torch.Tensor, outer) -> tuple:
    """(hypotheses, how many times the [V, D] output weights were copied) of a bf16 search
    run inside the context `outer`."""
    shape = list(model.decoder.output_projection.weight.shape)
    with outer, torch.autocast("cpu", dtype=torch.bfloat16):
        with torch.profiler.profile(record_shapes=True) as prof:
            found = SequenceGenerator([model], search).generate(src)
    casts = sum(
        e.count
        for e in prof.key_averages(group_by_input_shape=True)
        if e.key == "aten::copy_" and e.input_shapes[:1] == [shape]
    )
    return found, casts


def test_under_autocast_the_output_weights_are_cast_once_per_search(model):
    """torch.inference_mode turns autocast's cache of bf16 weight casts off, so the output
    projection's [V, D] weights were cast again at every step (nmt.runtime.inference_mode
    runs the search under no_grad instead). The cached casts are the same values: the
    search finds bitwise the same hypotheses as with the cache off (an outer
    inference_mode, which no_grad inside it does not leave)."""
    src = padded(random_sources([6, 12, 9], seed=6))
    search = SearchConfig(beam=4, nbest=2, max_len_b=10)
    cached, casts = _weight_casts(model, search, src, torch.no_grad())
    uncached, steps = _weight_casts(model, search, src, torch.inference_mode())
    assert casts == 1 and steps > 3  # one per decoding step without the cache
    for a, b in zip(cached, uncached):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.score for h in a] == [h.score for h in b]


def test_bf16_logits_buffer_reused_across_steps_changes_nothing(model, monkeypatch):
    """Under autocast each member casts its step's logits into one float32 buffer reused
    at every step (rows shrink as sentences finish). The search finds bitwise the same
    hypotheses as with a fresh float32 tensor a step, for one model and for an ensemble
    (a buffer each), with sentences of different lengths finishing at different steps."""
    src = padded(random_sources([3, 12, 7, 5], seed=8))
    search = SearchConfig(beam=4, nbest=2, max_len_a=1.0, max_len_b=2)
    twin = Transformer(model.cfg, 40, 40).eval()
    torch.manual_seed(9)
    for p in twin.parameters():
        torch.nn.init.normal_(p, std=0.3)

    def run(models):
        with torch.autocast("cpu", dtype=torch.bfloat16):
            return SequenceGenerator(models, search).generate(src)

    reused = [run([model]), run([model, twin])]
    monkeypatch.setattr(_Member, "float_logits", lambda self, logits: logits.float())
    fresh = [run([model]), run([model, twin])]
    for got, want in zip(reused, fresh):
        assert len({len(h[0].tokens) for h in got}) > 1  # sentences ended at different steps
        for a, b in zip(got, want):
            assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
            assert [h.score for h in a] == [h.score for h in b]
