"""The fallback of constrained beam search (nmt/generation/constraints.py, generator.py):
a sentence whose required phrases are not met within its length limit gets the list the
plain search would have made of what it found: the hypotheses that ended by the model's
choice (their EOS among the sentence's top K candidates, the first K of them, as the plain
search files its own) and, in the slots those left free, the ones the length limit ended,
by score, all with `constraints_met` False; met hypotheses still come first.

The exact invariant: a required phrase that is also banned never enters the beam (its
first token is never a candidate, so every row stays in bank 0), and the beam is then the
plain search's at every step: the sentence's n-best list is the plain search's (with the
same banned phrase). A phrase that does enter the beam takes slots of it, and
what ends in the others differs from the plain search: a Markov model checks that case by
hand, random and trained models that the list is ordered, complete where it can be, and
scored as the model scores it."""

from __future__ import annotations

import random
from dataclasses import replace
from types import SimpleNamespace

import pytest
import torch
from rounding import logprob_tolerance
from test_constraints_search import (
    batching_changes_nothing,
    contains,
    cuda_matches_cpu,
    pairs,
    random_required,
    stop_two_of_five,
    words,
)
from test_generator import TABLE, A, B, C, Markov

from nmt import Translator
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import TokenConstraints
from nmt.generation.generator import Hypothesis, SequenceGenerator
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD
from tests.helpers import padded, random_sources, random_transformer

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, nbest=4, max_len_a=1.0, max_len_b=8)


def eos_biased(seed: int = 0, bias: float = 2.4) -> Transformer:
    """A random Transformer whose EOS logit gets `bias` added, so that about half of its
    translations end before the length limit (a plain random one almost never chooses
    EOS). The bias goes through a hidden unit held at 1 (the last decoder layer's final
    layer norm gives it weight 0 and bias 1) that only the EOS logit reads."""
    model = random_transformer(seed=seed)
    with torch.no_grad():
        norm = model.decoder.layers[-1].final_layer_norm
        norm.weight[0], norm.bias[0] = 0.0, 1.0
        out = model.decoder.output_projection.weight
        out[:, 0] = 0.0
        out[EOS, 0] = bias
    return model


@pytest.fixture(scope="module")
def model() -> Transformer:
    return eos_biased()


def limits(gen: SequenceGenerator, sources: list[torch.Tensor]) -> list[int]:
    """Each sentence's length limit (tokens before EOS)."""
    return gen.max_lengths(torch.tensor([len(s) for s in sources])).tolist()


def never_in_the_beam(tokens: list[int | None]) -> list[TokenConstraints | None]:
    """A required phrase of one token that is banned too, per sentence (None: none)."""
    return [
        None if t is None else TokenConstraints(include=((t,),), exclude=((t,),)) for t in tokens
    ]


def alike(a: list[Hypothesis], b: list[Hypothesis], tolerance: float) -> None:
    """The same hypotheses: tokens and constraints_met exactly, scores within rounding
    (sentences leave two such batches at different steps, and the decoder's products
    of other shapes round differently)."""
    assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
    assert [h.constraints_met for h in a] == [h.constraints_met for h in b]
    assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)
    for x, y in zip(a, b):
        assert x.positional_scores.tolist() == pytest.approx(
            y.positional_scores.tolist(), abs=tolerance
        )


def banned_only(constraints: list[TokenConstraints | None]) -> list[TokenConstraints | None]:
    return [None if c is None else TokenConstraints(exclude=c.exclude) for c in constraints]


# -- the exact invariant: a phrase that never enters the beam ------------------------------


@pytest.mark.parametrize("beam", [1, 4])
def test_a_phrase_never_in_the_beam_gives_the_plain_search_list(model, beam):
    """Its sentence gets the plain search's n-best list (with the phrase's token banned),
    unmet: the best that ended by the model's choice where the plain
    search's best did, and the one the length limit ended where the plain search's did
    (after fewer than K such endings). The batch's other sentences are not affected."""
    rng = random.Random(beam)
    sources = random_sources([rng.randint(3, 12) for _ in range(30)], seed=1)
    constraints = never_in_the_beam(
        [None if i % 6 == 5 else rng.randint(4, 39) for i in range(len(sources))]
    )
    gen = SequenceGenerator([model], SearchConfig(**dict(SEARCH, beam=beam, nbest=beam)))
    plain = gen.generate(padded(sources), constraints=banned_only(constraints))
    found = gen.generate(padded(sources), constraints=constraints)
    tolerance = logprob_tolerance(model, pairs(sources, plain))
    for c, a, b in zip(constraints, found, plain):
        assert [h.constraints_met for h in a] == [c is None] * len(a)
        alike(a, [replace(h, constraints_met=c is None) for h in b], tolerance)
    ended = [len(h[0].tokens) <= limit for h, limit in zip(plain, limits(gen, sources))]
    assert ended.count(True) >= 10 and ended.count(False) >= 2  # both cases are covered


def test_the_fallback_is_not_the_hypothesis_cut_at_the_limit(model):
    """(What the search gave before fallbacks: the hypotheses the length limit ended.) A
    sentence whose plain search ends every hypothesis before the limit lists no
    hypothesis of the limit's length."""
    sources = random_sources([5, 9, 7, 11, 6, 8, 4, 10], seed=2)
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    constraints = never_in_the_beam([13] * len(sources))
    plain = gen.generate(padded(sources), constraints=banned_only(constraints))
    found = gen.generate(padded(sources), constraints=constraints)
    checked = 0
    for limit, a, b in zip(limits(gen, sources), found, plain):
        if all(len(h.tokens) <= limit for h in b):
            assert all(len(h.tokens) <= limit and not h.constraints_met for h in a)
            checked += 1
    assert checked >= 4


# -- a phrase in the beam: by hand on a Markov model ------------------------------------


class _Markov(Markov):
    def __init__(self, table):
        super().__init__(table)
        self.decoder = SimpleNamespace(embed_tokens=SimpleNamespace(num_embeddings=7))


@pytest.mark.parametrize(
    ("beam", "limit", "expected"),
    [
        # b EOS (.36) and a EOS (.2) end at step 1, both among the top 2: the 2 slots
        # are theirs, the length limit's endings (b a EOS, a b a EOS) are not listed
        (2, 3, [([B], 0.36), ([A], 0.2)]),
        # the same two at step 1; at the limit (step 2) the rows a b, b a, a c end, and
        # the best of them, a c EOS (.15), takes the one slot they left free
        (3, 2, [([B], 0.36), ([A, C], 0.15), ([A], 0.2)]),
        # greedy: a (.5) then a EOS (.2) (b .3 < .4), as the plain search
        (1, 3, [([A], 0.2)]),
    ],
)
def test_markov_a_phrase_too_long_for_the_limit(beam, limit, expected):
    """From the start a .5, b .4, c .1; a ends .4 (b .3, c .3), b ends .9, c always.
    Required: a b a b a b, longer than the limit; its rows (a, a b, a b a, ...) take
    beam slots from the plain search's, yet the endings found early are the plain
    search's: the list is the plain search's, every hypothesis unmet."""
    gen = SequenceGenerator(
        [_Markov(TABLE)], SearchConfig(beam=beam, nbest=beam, max_len_a=0, max_len_b=limit)
    )
    src = torch.tensor([[A, EOS]])
    found = gen.generate(src, constraints=[TokenConstraints(include=((A, B) * 3,))])[0]
    assert [words(h) for h in found] == [w for w, _ in expected]
    assert [h.constraints_met for h in found] == [False] * len(expected)
    for h, (w, p) in zip(found, expected):
        assert h.score == pytest.approx(torch.tensor(p).log().item() / (len(w) + 1), abs=1e-5)
    plain = gen.generate(src)[0]
    assert [h.tokens.tolist() for h in found] == [h.tokens.tolist() for h in plain]


# -- invariants on the random model ------------------------------------------------------


@pytest.mark.parametrize("beam", [1, 4])
def test_met_first_then_the_fallbacks_by_score(model, beam):
    """Random required phrases, some too long for the limit: a hypothesis has
    constraints_met exactly when it holds every phrase; met ones come first; each group
    is best first; every hypothesis ended by the model's choice or at the limit; a
    sentence with a phrase that cannot fit has none met."""
    rng = random.Random(10 + beam)
    sources = random_sources([rng.randint(3, 12) for _ in range(30)], seed=3)
    constraints = random_required(rng, len(sources))
    for i in range(0, len(sources), 4):  # 21+ words: longer than any limit (20)
        constraints[i] = TokenConstraints(include=(tuple(range(4, 25)),))
    gen = SequenceGenerator([model], SearchConfig(**dict(SEARCH, beam=beam, nbest=beam)))
    found = gen.generate(padded(sources), constraints=constraints)
    fallbacks = 0
    for c, hyps, limit in zip(constraints, found, limits(gen, sources)):
        include = () if c is None else c.include
        flags = [h.constraints_met for h in hyps]
        assert flags == [all(contains(words(h), p) for p in include) for h in hyps]
        assert flags == sorted(flags, reverse=True)
        for met in (True, False):
            scores = [h.score for h in hyps if h.constraints_met == met]
            assert scores == sorted(scores, reverse=True)
        assert all(len(h.tokens) <= limit + 1 and h.tokens[-1] == EOS for h in hyps)
        assert len({tuple(h.tokens.tolist()) for h in hyps}) == len(hyps)
        if any(len(p) > limit for p in include):
            assert not any(flags)
        fallbacks += sum(not h.constraints_met and len(h.tokens) <= limit for h in hyps)
    assert fallbacks >= 5


@pytest.mark.parametrize("beam", [1, 4])
def test_batch_composition_never_changes_a_fallback(model, beam):
    """Alone, in a batch of mixed lengths, or in reverse order: the same hypotheses."""
    rng = random.Random(20)
    sources = random_sources([6, 11, 3, 8, 14, 6, 4, 5, 9], seed=4)
    constraints = never_in_the_beam([rng.randint(4, 39) for _ in sources])
    constraints[2] = TokenConstraints(include=(tuple(range(4, 25)),))
    constraints[5] = None
    gen = SequenceGenerator([model], SearchConfig(**dict(SEARCH, beam=beam, nbest=beam)))
    batching_changes_nothing(gen, model, sources, constraints)


@pytest.mark.parametrize("case", ["one", "ensemble", "prefix", "attention", "min_len"])
def test_cached_equals_uncached_and_rules_hold(model, case):
    """The fallbacks alike with and without the KV cache; they keep the search's rules:
    a forced prefix (no ending inside it), a minimum length; attention when asked."""
    models = [model, eos_biased(seed=1)] if case == "ensemble" else [model]
    prefix = torch.tensor([[7, 8], [PAD, PAD], [9, PAD]]) if case == "prefix" else None
    attn_layer = -1 if case == "attention" else None
    min_len = 3 if case == "min_len" else 0
    sources = random_sources([5, 13, 8], seed=5)
    constraints = [
        TokenConstraints(include=((8, 12), (20,)), exclude=((20,),)),
        None,
        TokenConstraints(include=(tuple(range(4, 25)),)),
    ]
    cached, uncached = (
        SequenceGenerator(
            models, SearchConfig(**SEARCH, use_cache=use_cache, min_len=min_len)
        ).generate(padded(sources), prefix, attn_layer=attn_layer, constraints=constraints)
        for use_cache in (True, False)
    )
    tolerance = max(logprob_tolerance(m, pairs(sources, cached)) for m in models)
    for i, (a, b) in enumerate(zip(cached, uncached)):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)
        assert [h.constraints_met for h in a] == [i == 1] * len(a)
        for h in a:
            assert len(h.tokens) > min_len
            if prefix is not None:
                forced = [t for t in prefix[i].tolist() if t != PAD]
                assert words(h)[: len(forced)] == forced
            if attn_layer is not None:
                assert h.attention is not None and h.attention.shape == (len(h.tokens), 13)


def test_stopped_sentences_keep_no_later_fallback(model):
    """A sentence no longer wanted leaves with what it had; the others are unchanged."""
    sources = random_sources([6, 11, 3, 8, 9], seed=6)
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    found = stop_two_of_five(gen, model, sources, never_in_the_beam([11, 12, 13, 14, 15]))
    for i in (1, 3):  # only what ended in its first two steps
        assert all(len(h.tokens) <= 2 for h in found[i] if h.score > float("-inf"))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_fallbacks_match_cpu(model):
    rng = random.Random(30)
    sources = random_sources([6, 12, 9, 4, 7, 10], seed=7)
    constraints = never_in_the_beam([rng.randint(4, 39) for _ in sources])
    constraints[1] = TokenConstraints(include=(tuple(range(4, 25)),))
    cuda_matches_cpu(model, sources, constraints)


# -- the tiny trained model, through the Translator ---------------------------------------


def test_trained_model_fallbacks(tiny_trained_checkpoint, demo_corpus):
    """A one-piece phrase that is banned too: each sentence's n-best list is the plain
    search's (that piece banned), unmet, batched or one by one. A phrase of 50 pieces
    (the limits are 28 at most) enters the beam, so what ends differs from the plain
    search (no theorem here, what this model does): each best is unmet, ended by the
    model's choice wherever the plain search's did (before fallbacks: at the limit),
    with the model's own token scores, EOS included (forced decoding)."""
    texts = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:16]
    kw = dict(device="cpu", beam=4, nbest=4, max_len_a=1.2, max_len_b=10)
    translator = Translator.from_checkpoint(tiny_trained_checkpoint, **kw)
    sources = [translator.src_tokenizer.encode(t) + [EOS] for t in texts]
    tensors = [torch.tensor(s) for s in sources]
    plain = translator.translate_ids(sources)
    constraints = never_in_the_beam([words(h[0])[0] for h in plain])
    banned = translator.translate_ids(sources, constraints=banned_only(constraints))
    found = translator.translate_ids(sources, constraints=constraints)
    tolerance = logprob_tolerance(translator.models[0], pairs(tensors, banned))
    for a, b in zip(found, banned):
        assert not any(h.constraints_met for h in a)
        alike(a, [replace(h, constraints_met=False) for h in b], tolerance)
    one_by_one = Translator.from_checkpoint(tiny_trained_checkpoint, max_sentences=1, **kw)
    assert [[h.tokens.tolist() for h in hyps] for hyps in found] == [
        [h.tokens.tolist() for h in hyps]
        for hyps in one_by_one.translate_ids(sources, constraints=constraints)
    ]

    too_long = [TokenConstraints(include=(tuple(range(10, 60)),))] * len(sources)
    found = translator.translate_ids(sources, constraints=too_long)
    limit = translator.generator.max_lengths(torch.tensor([len(s) for s in sources])).tolist()
    best = [hyps[0] for hyps in found]
    complete = 0
    for h, p, n in zip(best, plain, limit):
        assert not h.constraints_met
        if len(p[0].tokens) <= n:  # the plain search's best ended by the model's choice
            assert len(h.tokens) <= n  # and so did the fallback
            complete += 1
    assert complete >= 12
    scored = translator.score_ids(sources, [h.tokens for h in best])
    tolerance = logprob_tolerance(translator.models[0], pairs(tensors, [[h] for h in best]))
    for h, s in zip(best, scored):
        assert h.positional_scores.tolist() == pytest.approx(
            s.positional_scores.tolist(), abs=tolerance
        )
        assert h.score == pytest.approx(s.score, abs=tolerance)
