"""Decoding over a target-vocabulary shortlist: the output layer computes only the likely
target tokens of a batch (the shortlist file and its candidates: nmt.data.lexical).

`SequenceGenerator` with a shortlist computes the output projection of a batch over the
union of its sentences' candidates only (`BatchVocab`), runs the search in that reduced
vocabulary and maps the chosen tokens back to their ids. Unlike CTranslate2, where the
batch's union is every sentence's vocabulary, each sentence keeps its own candidates (the
others are -inf before the softmax), so a translation never depends on its batch. The
softmax is over the candidates, so scores are those of the reduced vocabulary; a
shortlist that lists every token gives exactly the full vocabulary's search.

Shapes: B sentences, N active sentences, K beam, R = N*K rows, V' the batch's candidates.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
from torch import Tensor

from nmt.data.lexical import SPECIALS, Shortlist
from nmt.vocab import PAD


def batch_vocab(
    shortlist: Shortlist,
    src_tokens: Tensor,
    prefix_tokens: Tensor | None = None,
    required: Sequence[np.ndarray] | None = None,
) -> BatchVocab:
    """The candidates of a batch: src_tokens [B,S] and prefix_tokens [B,P] | None
    (both right-padded with PAD), on their device; `required`: per sentence, target ids
    it must be able to produce (its constraints' phrases), candidates too."""
    sources = src_tokens.cpu().numpy()
    prefixes = None if prefix_tokens is None else prefix_tokens.cpu().numpy()
    own = []
    for b, row in enumerate(sources):
        forced = [] if prefixes is None else [prefixes[b][prefixes[b] != PAD]]
        if required is not None:
            forced.append(required[b])
        own.append(
            shortlist.candidates(row[row != PAD], np.concatenate(forced) if forced else None)
        )
    return BatchVocab.of(own, src_tokens.device)


class BatchVocab:
    """The target ids one batch decodes over, and which of them each sentence may use."""

    def __init__(self, ids: Tensor, columns: Tensor, blocked: Tensor | None):
        self.ids = ids  # [V'] long, ascending; the specials 0..3 first, so their column = id
        self.columns = columns  # [max id + 1] long: the column of each target id, -1 if absent
        self.blocked = blocked  # [N,V'] bool: True = not a candidate of that sentence | None

    @classmethod
    def of(cls, own: list[np.ndarray], device: torch.device) -> BatchVocab:
        """From each sentence's sorted candidate ids (each holding the specials)."""
        union = np.unique(np.concatenate(own))  # [V']
        assert np.array_equal(union[: len(SPECIALS)], SPECIALS)
        blocked = None
        if any(len(ids) != len(union) for ids in own):  # some sentence has fewer
            mask = np.ones((len(own), len(union)), dtype=bool)
            for b, mine in enumerate(own):
                mask[b, np.searchsorted(union, mine)] = False
            blocked = torch.from_numpy(mask).to(device)
        ids = torch.from_numpy(union).to(device)
        columns = torch.full((int(union[-1]) + 1,), -1, dtype=torch.long, device=device)
        columns[ids] = torch.arange(len(union), device=device)
        return cls(ids, columns, blocked)

    @property
    def size(self) -> int:
        return self.ids.numel()

    def to_columns(self, tokens: Tensor) -> Tensor:
        """Target ids (each a candidate of the batch) -> their columns, same shape."""
        return self.columns[tokens]

    def to_ids(self, columns: Tensor) -> Tensor:
        """Columns -> target ids, same shape."""
        return self.ids[columns]

    def restrict(self, logits: Tensor, beam: int) -> None:
        """-inf, in place, where a row's sentence does not have the candidate: logits
        [R,V'] with R = N*beam rows, sentence-major."""
        if self.blocked is not None:
            logits.view(self.blocked.size(0), beam, -1).masked_fill_(
                self.blocked.unsqueeze(1), float("-inf")
            )

    def keep(self, kept: Tensor) -> None:
        """Only the sentences `kept` [N'] stay in the batch."""
        if self.blocked is not None:
            self.blocked = self.blocked[kept]
