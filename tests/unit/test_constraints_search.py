"""Lexically constrained beam search (nmt/generation/constraints.py): hand-checked on a
Markov model, invariants on a random Transformer (required phrases appear exactly when
`constraints_met` says so, banned ones never, no constraints is the plain search bit for
bit, batches and caches change nothing) and the tiny trained model through
Translator.translate_ids, in fp32 and int8."""

from __future__ import annotations

import copy
import math
import random
from types import SimpleNamespace

import numpy as np
import pytest
import torch
from rounding import logprob_tolerance
from test_generator import TABLE, A, B, C, Markov

from nmt import Translator
from nmt.data.lexical import Shortlist
from nmt.data.tokenizer import Tokenizer
from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.constraints import TokenConstraints
from nmt.generation.generator import Hypothesis, SequenceGenerator
from nmt.generation.search import row_best
from nmt.model.quantize import quantize_int8
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD
from tests.helpers import padded, random_sources, random_transformer

pytestmark = pytest.mark.usefixtures("one_thread")

SEARCH = dict(beam=4, nbest=4, max_len_a=1.0, max_len_b=8)


def contains(tokens: list[int], phrase: tuple[int, ...]) -> bool:
    n = len(phrase)
    return any(tuple(tokens[i : i + n]) == phrase for i in range(len(tokens) - n + 1))


def words(h: Hypothesis) -> list[int]:
    return h.tokens.tolist()[:-1]  # EOS left out


def random_required(rng: random.Random, sentences: int) -> list[TokenConstraints | None]:
    """1-3 phrases of 1-3 random words per sentence; every fifth sentence has none."""
    return [
        None
        if i % 5 == 4
        else TokenConstraints(
            include=tuple(
                tuple(rng.randint(4, 39) for _ in range(rng.randint(1, 3)))
                for _ in range(rng.randint(1, 3))
            )
        )
        for i in range(sentences)
    ]


def same(a: list[list[Hypothesis]], b: list[list[Hypothesis]]) -> None:
    """Bit for bit: tokens, scores, token scores and constraints_met."""
    for x, y in zip(a, b, strict=True):
        assert [h.tokens.tolist() for h in x] == [h.tokens.tolist() for h in y]
        assert [h.score for h in x] == [h.score for h in y]
        assert [h.positional_scores.tolist() for h in x] == [
            h.positional_scores.tolist() for h in y
        ]
        assert [h.constraints_met for h in x] == [h.constraints_met for h in y]


def pairs(sources, found) -> list[tuple[list[int], list[int]]]:
    return [(s.tolist(), h.tokens.tolist()) for s, hyps in zip(sources, found) for h in hyps]


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_transformer()


@pytest.fixture(scope="module")
def other_model(model) -> Transformer:
    return random_transformer(seed=1)


@pytest.mark.parametrize("vocab", [7, 250, 8000, 8037])
def test_row_best_is_max_and_the_first_argmax(vocab):
    """search.row_best (each row's best token, a candidate of constrained steps): the
    values of max and the ids of argmax, ties (the first maximum) and -inf rows included."""
    g = torch.Generator().manual_seed(vocab)
    lprobs = torch.randint(-5, 3, (6, 3, vocab), generator=g).float()  # many ties
    lprobs[0, 0] = -math.inf
    lprobs[1, 2, -1] = 9.0  # in the tail past the last full block
    values, ids = row_best(lprobs)
    assert torch.equal(values, lprobs.amax(dim=2)) and torch.equal(ids, lprobs.argmax(dim=2))


# -- a Markov model, by hand ------------------------------------------------------------


class _Markov(Markov):
    def __init__(self, table):
        super().__init__(table)
        self.decoder = SimpleNamespace(embed_tokens=SimpleNamespace(num_embeddings=7))


def test_markov_required_and_banned_phrases():
    """From the start a .5, b .4, c .1; a ends .4 (b .3, c .3), b ends .9, c always."""
    gen = SequenceGenerator([_Markov(TABLE)], SearchConfig(beam=2, nbest=2))
    src = torch.tensor([[A, EOS]])

    def best(**constraints) -> Hypothesis:
        return gen.generate(src, constraints=[TokenConstraints(**constraints)])[0][0]

    assert gen.generate(src)[0][0].tokens.tolist() == [B, EOS]  # .36
    # with c: a c EOS (.15, 3 tokens) beats c EOS (.1, 2 tokens), b c EOS (.02)
    with_c = best(include=((C,),))
    assert with_c.tokens.tolist() == [A, C, EOS] and with_c.constraints_met
    assert with_c.score == pytest.approx(math.log(0.15) / 3, abs=1e-5)
    # with b a: a b a EOS (log .003 / 4) beats b a EOS (log .008 / 3)
    assert best(include=((B, A),)).tokens.tolist() == [A, B, A, EOS]
    # without b: a c EOS (log .15 / 3) beats a EOS (log .2 / 2) and c EOS (log .1 / 2)
    assert best(exclude=((B,),)).tokens.tolist() == [A, C, EOS]
    assert best(exclude=((A, C), (B,))).tokens.tolist() == [A, EOS]
    assert best(include=((C,),), exclude=((A,),)).tokens.tolist() == [C, EOS]
    # every path banned: the empty hypothesis at -inf, which lacks the required phrase
    nothing = best(include=((A,),), exclude=((A,), (B,), (C,)))
    assert nothing.tokens.tolist() == [EOS] and nothing.score == -math.inf
    assert not nothing.constraints_met
    assert best(exclude=((A,), (B,), (C,))).constraints_met  # nothing was required


# -- invariants on a random Transformer -------------------------------------------------


@pytest.mark.parametrize("beam", [1, 4])
def test_met_exactly_when_every_required_phrase_appears(model, beam):
    """Over many sentences and random phrase sets: a hypothesis has constraints_met
    exactly when each of its required phrases is in it, and the best one has them all
    (the length limits leave room); n-best lists put met hypotheses first."""
    rng = random.Random(0)
    sources = random_sources([rng.randint(3, 12) for _ in range(40)], seed=1)
    constraints = random_required(rng, len(sources))
    gen = SequenceGenerator([model], SearchConfig(**dict(SEARCH, beam=beam, nbest=beam)))
    found = gen.generate(padded(sources), constraints=constraints)
    met_by_search = 0
    for c, hyps in zip(constraints, found):
        include = () if c is None else c.include
        for h in hyps:
            assert h.constraints_met == all(contains(words(h), p) for p in include)
        assert hyps[0].constraints_met
        assert len({tuple(h.tokens.tolist()) for h in hyps}) == len(hyps)  # no repeats
        flags = [h.constraints_met for h in hyps]
        assert flags == sorted(flags, reverse=True)
        met_by_search += bool(include)
    assert met_by_search >= 30


def test_banned_phrases_never_appear(model):
    """Phrases the plain search produces (one and two words), banned: no hypothesis of
    the n-best has them, with and without required phrases beside them."""
    sources = random_sources([5, 9, 12, 4, 7, 10], seed=2)
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    plain = gen.generate(padded(sources))
    rng = random.Random(1)
    banned = []
    for hyps in plain:
        tokens = words(hyps[0])
        i = rng.randrange(len(tokens) - 1)
        banned.append((tuple(tokens[i : i + 2]), (tokens[0],), (rng.randint(4, 39),)))
    for include in (False, True):
        constraints = [
            TokenConstraints(include=((rng.randint(4, 39),),) if include else (), exclude=ex)
            for ex in banned
        ]
        found = gen.generate(padded(sources), constraints=constraints)
        for ex, hyps in zip(banned, found):
            assert len(hyps) == 4
            for h in hyps:
                assert not any(contains(words(h), p) for p in ex), (ex, words(h))


def test_no_constraints_is_the_plain_search_bit_for_bit(model):
    sources = random_sources([6, 11, 3, 8], seed=3)
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    plain = gen.generate(padded(sources))
    for none in (None, [None] * 4, [TokenConstraints()] * 4):
        same(gen.generate(padded(sources), constraints=none), plain)


def test_a_sentence_without_constraints_decodes_as_without_them(model):
    """In a batch with constrained sentences, a sentence without constraints gets the
    plain search's hypotheses of the same batch bit for bit, and those it gets alone."""
    sources = random_sources([6, 11, 3, 8, 9, 5], seed=4)
    constraints = random_required(random.Random(2), len(sources))
    constraints[1] = constraints[3] = None
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    plain = gen.generate(padded(sources))
    mixed = gen.generate(padded(sources), constraints=constraints)
    tolerance = logprob_tolerance(model, pairs(sources, plain))
    for i in (1, 3, 4):
        same([mixed[i]], [plain[i]])
        alone = gen.generate(sources[i][None])[0]
        assert [h.tokens.tolist() for h in mixed[i]] == [h.tokens.tolist() for h in alone]
        assert [h.score for h in mixed[i]] == pytest.approx([h.score for h in alone], abs=tolerance)


@pytest.mark.parametrize("beam", [1, 4])
def test_batch_composition_never_changes_a_constrained_translation(model, beam):
    """Alone, in a batch of mixed lengths (sentences finishing and leaving at different
    steps), or in reverse order: the same hypotheses."""
    rng = random.Random(3)
    sources = random_sources([6, 11, 3, 8, 14, 6, 4, 5, 9], seed=5)
    constraints = [
        TokenConstraints(include=c.include, exclude=((rng.randint(4, 39),),)) if c else None
        for c in random_required(rng, len(sources))
    ]
    gen = SequenceGenerator([model], SearchConfig(**dict(SEARCH, beam=beam, nbest=beam)))
    batching_changes_nothing(gen, model, sources, constraints)


def batching_changes_nothing(
    gen: SequenceGenerator,
    model: Transformer,
    sources: list[torch.Tensor],
    constraints: list[TokenConstraints | None],
) -> None:
    """Each sentence alone, in the batch of them all, or in reverse order: the same
    hypotheses (scores within the model's rounding)."""
    together = gen.generate(padded(sources), constraints=constraints)
    reordered = gen.generate(padded(sources[::-1]), constraints=constraints[::-1])[::-1]
    tolerance = logprob_tolerance(model, pairs(sources, together))
    for i, src in enumerate(sources):
        alone = gen.generate(src[None], constraints=[constraints[i]])[0]
        for other in (together[i], reordered[i]):
            assert [h.tokens.tolist() for h in other] == [h.tokens.tolist() for h in alone]
            assert [h.constraints_met for h in other] == [h.constraints_met for h in alone]
            assert [h.score for h in other] == pytest.approx(
                [h.score for h in alone], abs=tolerance
            )


@pytest.mark.parametrize("case", ["one", "ensemble", "prefix", "attention"])
def test_cached_equals_uncached(model, other_model, case):
    models = [model, other_model] if case == "ensemble" else [model]
    prefix = torch.tensor([[7, 8], [PAD, PAD], [9, PAD]]) if case == "prefix" else None
    attn_layer = -1 if case == "attention" else None
    sources = random_sources([5, 13, 8], seed=6)
    constraints = [
        TokenConstraints(include=((8, 12), (20,)), exclude=((30,),)),
        None,
        TokenConstraints(include=((15, 16, 17),)),
    ]
    cached, uncached = (
        SequenceGenerator(models, SearchConfig(**SEARCH, use_cache=use_cache)).generate(
            padded(sources), prefix, attn_layer=attn_layer, constraints=constraints
        )
        for use_cache in (True, False)
    )
    tolerance = max(logprob_tolerance(m, pairs(sources, cached)) for m in models)
    for a, b, c in zip(cached, uncached, constraints):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=tolerance)
        if c is not None:
            assert a[0].constraints_met
            assert all(contains(words(a[0]), p) for p in c.include)
        if attn_layer is not None:
            assert all(h.attention.shape == (len(h.tokens), 13) for h in a)


def test_prefix_tokens_count_toward_constraints(model):
    """A required phrase the forced prefix holds is met by it; one it starts is finished
    right after it."""
    sources = random_sources([6, 9], seed=7)
    prefix = torch.tensor([[11, 12, 13], [21, 22, PAD]])
    constraints = [
        TokenConstraints(include=((12, 13),)),
        TokenConstraints(include=((22, 23, 24),)),
    ]
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    plain = gen.generate(padded(sources), prefix)
    found = gen.generate(padded(sources), prefix, constraints=constraints)
    same([found[0]], [plain[0]])  # met from the start: nothing else changes
    assert len({tuple(h.tokens.tolist()) for h in found[1]}) == 4  # no repeats
    for h in found[1]:
        assert words(h)[:2] == [21, 22]
    assert words(found[1][0])[:4] == [21, 22, 23, 24] and found[1][0].constraints_met


def test_stopped_sentences_leave_and_the_others_decode_alike(model):
    """Sentences no longer wanted (`stopped`) leave a constrained batch at once; the
    phrase states of those that stay follow them."""
    sources = random_sources([6, 11, 3, 8, 9], seed=12)
    gen = SequenceGenerator([model], SearchConfig(**SEARCH))
    stop_two_of_five(gen, model, sources, random_required(random.Random(6), len(sources)))


def stop_two_of_five(
    gen: SequenceGenerator,
    model: Transformer,
    sources: list[torch.Tensor],
    constraints: list[TokenConstraints | None],
) -> list[list[Hypothesis]]:
    """Sentences 1 and 3 of five are no longer wanted from the third step on: the others
    get what they get in the full batch (checked). Returns the hypotheses of that run."""
    full = gen.generate(padded(sources), constraints=constraints)
    gone = torch.tensor([False, True, False, True, False])
    calls = []

    def stopped() -> torch.Tensor | None:
        calls.append(1)
        return gone if len(calls) > 2 else None

    found = gen.generate(padded(sources), constraints=constraints, stopped=stopped)
    tolerance = logprob_tolerance(model, pairs(sources, full))
    for i in (0, 2, 4):
        assert [h.tokens.tolist() for h in found[i]] == [h.tokens.tolist() for h in full[i]]
        assert [h.constraints_met for h in found[i]] == [h.constraints_met for h in full[i]]
        assert [h.score for h in found[i]] == pytest.approx(
            [h.score for h in full[i]], abs=tolerance
        )
    return found


def test_a_constraint_beyond_the_length_limit(model):
    """A phrase longer than the limit: hypotheses with constraints_met False, and no
    crash; its sentence's neighbours are not affected. (This random model never chooses
    EOS, so all three are those the limit ended; test_constraints_fallback.py has the
    hypotheses that end by the model's choice.)"""
    sources = random_sources([4, 6], seed=8)
    gen = SequenceGenerator([model], SearchConfig(beam=3, nbest=3, max_len_a=0, max_len_b=5))
    too_long = TokenConstraints(include=(tuple(range(10, 17)),))  # 7 words, limit 5
    found = gen.generate(padded(sources), constraints=[too_long, None])
    assert len(found[0]) == 3
    for h in found[0]:
        assert not h.constraints_met and len(h.tokens) == 6 and h.tokens[-1] == EOS
    assert found[0][0].score >= found[0][1].score >= found[0][2].score
    same([found[1]], [gen.generate(padded(sources))[1]])


def test_a_shortlist_keeps_each_sentence_constraint_tokens(model):
    """Required ids outside a sentence's shortlist candidates join them: the phrase is
    met, every other token is a candidate, and an unconstrained sentence decodes as with
    the shortlist alone."""
    always = np.arange(4, 20)
    shortlist = Shortlist({(5,): np.array([30, 31])}, always, "test")
    sources = random_sources([6, 9, 7], seed=9)
    constraints = [
        TokenConstraints(include=((35, 36),), exclude=((10,),)),
        None,
        TokenConstraints(include=((38,),)),
    ]
    gen = SequenceGenerator([model], SearchConfig(**SEARCH), shortlist=shortlist)
    plain = gen.generate(padded(sources))
    found = gen.generate(padded(sources), constraints=constraints)
    same([found[1]], [plain[1]])
    for src, c, hyps in zip(sources, constraints, found):
        allowed = set(shortlist.candidates(src.numpy()).tolist())
        if c is not None:
            allowed |= {t for p in c.include for t in p}
            assert hyps[0].constraints_met
        for h in hyps:
            assert set(words(h)) <= allowed
            assert not (c and c.exclude) or 10 not in words(h)


def test_int8_meets_constraints(model):
    int8 = quantize_int8(copy.deepcopy(model))
    rng = random.Random(4)
    sources = random_sources([rng.randint(3, 12) for _ in range(12)], seed=10)
    constraints = random_required(rng, len(sources))
    found = SequenceGenerator([int8], SearchConfig(**SEARCH)).generate(
        padded(sources), constraints=constraints
    )
    for c, hyps in zip(constraints, found):
        assert hyps[0].constraints_met
        for h in hyps:
            assert h.constraints_met == all(contains(words(h), p) for p in (c.include if c else ()))


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_matches_cpu(model):
    sources = random_sources([6, 12, 9, 4, 7], seed=13)
    rng = random.Random(7)
    constraints = [
        TokenConstraints(include=c.include, exclude=((rng.randint(4, 39),),)) if c else None
        for c in random_required(rng, len(sources))
    ]
    cuda_matches_cpu(model, sources, constraints)


def cuda_matches_cpu(
    model: Transformer, sources: list[torch.Tensor], constraints: list[TokenConstraints | None]
) -> None:
    """The same hypotheses on the GPU as on the CPU (scores within 1e-3)."""
    search = SearchConfig(**SEARCH)
    on_cpu = SequenceGenerator([model], search).generate(padded(sources), constraints=constraints)
    on_gpu = SequenceGenerator([copy.deepcopy(model).cuda()], search).generate(
        padded(sources).cuda(), constraints=constraints
    )
    for a, b in zip(on_cpu, on_gpu):
        assert [h.tokens.tolist() for h in a] == [h.tokens.tolist() for h in b]
        assert [h.constraints_met for h in a] == [h.constraints_met for h in b]
        assert [h.score for h in a] == pytest.approx([h.score for h in b], abs=1e-3)


def test_bad_constraints_are_refused(model):
    src = padded(random_sources([5, 6], seed=11))
    gen = SequenceGenerator([model], SearchConfig(beam=2))
    cases = [
        ([TokenConstraints(include=((),)), None], r"^constraints\[0\]: an empty include phrase"),
        ([None, TokenConstraints(exclude=((5, EOS),))], r"^constraints\[1\]: exclude phrase"),
        ([TokenConstraints(include=((40,),)), None], r"holds 40, not a target word id"),
        ([None, TokenConstraints(include=(("Hund",),))], r"holds 'Hund', not a target word"),
        ([None], r"^constraints: 1 of them for 2 sentences"),
    ]
    for constraints, message in cases:
        with pytest.raises(NmtError, match=message):
            gen.generate(src, constraints=constraints)
    sampling = SequenceGenerator([model], SearchConfig(beam=2, sampling=True))
    with pytest.raises(NmtError, match=r"constraints need beam search \(sampling=false\)"):
        sampling.generate(src, constraints=[TokenConstraints(include=((5,),)), None])
    assert len(sampling.generate(src, constraints=[None, None])) == 2  # none: no refusal


# -- the tiny trained model, through the Translator --------------------------------------


@pytest.fixture(scope="module")
def references(demo_data_dir, demo_corpus):
    """(sources, reference target ids without EOS) of 12 test sentences."""
    tokenizer = Tokenizer.from_file(demo_data_dir / "spm.model")
    src = (demo_corpus / "test.en").read_text(encoding="utf-8").splitlines()[:12]
    tgt = (demo_corpus / "test.de").read_text(encoding="utf-8").splitlines()[:12]
    return src, [tokenizer.encode(t) for t in tgt]


@pytest.mark.parametrize("precision", ["fp32", "int8"])
def test_reference_phrases_through_translate_ids(tiny_trained_checkpoint, references, precision):
    """Constraints drawn from the references (1-2 phrases of 1-2 pieces, as Post & Vilar
    draw them) are all met, whatever the batching; the plain translation's first piece,
    banned, never appears; translate_ids checks the entries before decoding."""
    texts, refs = references
    rng = random.Random(5)
    constraints = []
    for ref in refs:
        include = []
        for _ in range(rng.randint(1, 2)):
            n = rng.randint(1, 2)
            i = rng.randrange(len(ref) - n + 1)
            include.append(tuple(ref[i : i + n]))
        constraints.append(TokenConstraints(include=tuple(include)))
    kw = dict(device="cpu", precision=precision, beam=4, nbest=2, max_len_a=1.2, max_len_b=10)
    translator = Translator.from_checkpoint(tiny_trained_checkpoint, **kw)
    sources = [translator.src_tokenizer.encode(t) + [EOS] for t in texts]
    found = translator.translate_ids(sources, constraints=constraints)
    for c, hyps in zip(constraints, found):
        assert hyps[0].constraints_met
        assert all(contains(words(h), p) for h in hyps for p in c.include if h.constraints_met)
    one_by_one = Translator.from_checkpoint(tiny_trained_checkpoint, max_sentences=1, **kw)
    assert [[h.tokens.tolist() for h in hyps] for hyps in found] == [
        [h.tokens.tolist() for h in hyps]
        for hyps in one_by_one.translate_ids(sources, constraints=constraints)
    ]
    plain = translator.translate_ids(sources)
    banned = [TokenConstraints(exclude=((words(h[0])[0],),)) for h in plain]
    for b, hyps in zip(banned, translator.translate_ids(sources, constraints=banned)):
        assert all(b.exclude[0][0] not in words(h) for h in hyps)
    with pytest.raises(NmtError, match=r"^constraints\[1\]: an empty include phrase"):
        translator.translate_ids(sources[:2], constraints=[None, TokenConstraints(((),))])
    with pytest.raises(NmtError, match=r"^constraints: 1 of them for 2 sources"):
        translator.translate_ids(sources[:2], constraints=[None])
    with pytest.raises(NmtError, match=r"^sampling=true: constraints need beam search"):
        translator.translate_ids(sources[:2], constraints=constraints[:2], sampling=True)
