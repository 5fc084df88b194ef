"""SequenceGenerator's `stopped` hook and Translator.translate_ids' `cancelled`: sentences
no longer wanted leave the batch at the next step, and the other sentences' hypotheses
are bitwise what they are without it."""

from __future__ import annotations

import pytest
import torch

from nmt.generation.config import SearchConfig
from nmt.generation.generator import Hypothesis, SequenceGenerator
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD
from tests.helpers import random_transformer

pytestmark = pytest.mark.usefixtures("one_thread")


@pytest.fixture(scope="module")
def model() -> Transformer:
    return random_transformer()


def _batch(lengths: list[int], seed: int = 3) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    out = torch.full((len(lengths), max(lengths)), PAD)
    for i, n in enumerate(lengths):
        out[i, : n - 1] = torch.randint(4, 40, (n - 1,), generator=g)
        out[i, n - 1] = EOS
    return out


class _CancelAt:
    """A `stopped` hook that cancels `rows` from step `step` on, counting its calls."""

    def __init__(self, batch: int, rows: list[int], step: int):
        self.mask = torch.zeros(batch, dtype=torch.bool)
        self.mask[rows] = True
        self.step, self.calls = step, 0

    def __call__(self) -> torch.Tensor | None:
        self.calls += 1
        return self.mask if self.calls > self.step else None


def _same(a: list[Hypothesis], b: list[Hypothesis]) -> bool:
    """Bitwise equal hypotheses: tokens, scores, per-token scores, attention."""
    return len(a) == len(b) and all(
        torch.equal(x.tokens, y.tokens)
        and x.score == y.score
        and torch.equal(x.positional_scores, y.positional_scores)
        and (x.attention is None) == (y.attention is None)
        and (x.attention is None or torch.equal(x.attention, y.attention))
        for x, y in zip(a, b)
    )


@pytest.mark.parametrize("beam,cancel", [(1, [2]), (4, [1, 4, 6]), (4, [0]), (2, [7])])
def test_cancelling_sentences_mid_batch_leaves_the_others_bitwise_equal(model, beam, cancel):
    # max_len 1 x source + 4: the sentences end at different steps, so finished ones
    # idle and leave around the cancelled ones (both paths of the reorder). (Beam search
    # only: a sampling batch draws from one random stream, so its rows depend on each
    # other; a server decodes each sampling request alone and cancels all of it.)
    search = SearchConfig(beam=beam, nbest=beam, max_len_a=1.0, max_len_b=4)
    src = _batch([9, 14, 5, 12, 7, 11, 6, 10])
    want = SequenceGenerator([model], search).generate(src, attn_layer=1)
    stop = _CancelAt(len(src), cancel, step=3)
    got = SequenceGenerator([model], search).generate(src, attn_layer=1, stopped=stop)
    assert stop.calls > 4  # the batch went on after the cancellation
    for i in range(len(src)):
        if i not in cancel:
            assert _same(got[i], want[i]), i


@pytest.mark.parametrize("sampling", [False, True])
def test_a_batch_whose_sentences_are_all_cancelled_stops_at_once(model, sampling):
    search = SearchConfig(beam=4, max_len_a=0.0, max_len_b=30, min_len=30, sampling=sampling)
    src = _batch([9, 14, 5])
    stop = _CancelAt(len(src), [0, 1, 2], step=2)
    found = SequenceGenerator([model], search).generate(src, stopped=stop)
    assert stop.calls == 3  # asked before steps 0, 1, 2: no decoder step after the last
    assert len(found) == 3  # each with what it finished (nothing: min_len 30)
    # one cancelled sentence of a long batch costs one more step at most: it leaves the
    # batch at once instead of idling (rows counted by the decoder's input)
    rows: list[int] = []
    real_step = SequenceGenerator._step

    def counting(self, state, step, attn_layer):
        rows.append(state.tokens.size(0))
        return real_step(self, state, step, attn_layer)

    generator = SequenceGenerator([model], search)
    generator._step = counting.__get__(generator)  # type: ignore[method-assign]
    generator.generate(src, stopped=_CancelAt(len(src), [1], step=2))
    assert rows[:3] == [3 * 4] * 3 and set(rows[3:]) == {2 * 4}
