"""Turn a list of sentence pairs into one padded, batch-first training batch.

Both sides are right-padded with PAD. The decoder input is the target shifted right with
EOS in front (fairseq's convention): prev_tokens = [EOS] + target[:-1].
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

from nmt.vocab import EOS, PAD


@dataclass
class Batch:
    """One batch of sentence pairs, batch-first."""

    ids: torch.Tensor  # [B] int64: sentence indices in the split
    src_tokens: torch.Tensor  # [B,S] int64, right-padded with PAD
    src_lengths: torch.Tensor  # [B] int64
    prev_tokens: torch.Tensor  # [B,T] int64: decoder input, EOS + target[:-1]
    target: torch.Tensor  # [B,T] int64, right-padded with PAD
    ntokens: int  # non-pad target tokens (what the loss is normalised by)
    nsentences: int  # B

    def to(self, device: torch.device | str) -> Batch:
        non_blocking = torch.device(device).type == "cuda"
        move = lambda t: t.to(device, non_blocking=non_blocking)  # noqa: E731
        return Batch(
            ids=self.ids,
            src_tokens=move(self.src_tokens),
            src_lengths=move(self.src_lengths),
            prev_tokens=move(self.prev_tokens),
            target=move(self.target),
            ntokens=self.ntokens,
            nsentences=self.nsentences,
        )


def _pad(seqs: Sequence[np.ndarray], pad: int) -> np.ndarray:
    out = np.full((len(seqs), max(len(s) for s in seqs)), pad, dtype=np.int64)
    for row, seq in enumerate(seqs):
        out[row, : len(seq)] = seq
    return out


def collate(
    ids: Sequence[int] | np.ndarray,
    pairs: Sequence[tuple[np.ndarray, np.ndarray]],
    *,
    pad: int = PAD,
    eos: int = EOS,
    pin_memory: bool = False,
) -> Batch:
    """pairs[i] = (source ids, target ids), each ending in EOS."""
    src = _pad([p[0] for p in pairs], pad)  # [B,S]
    tgt = _pad([p[1] for p in pairs], pad)  # [B,T]
    prev = np.full_like(tgt, pad)
    prev[:, 0] = eos
    prev[:, 1:] = tgt[:, :-1]
    # The shift moves the last real token of shorter rows into a pad slot of target; those
    # slots are padding on the target side, so mask them on the input side too.
    prev[:, 1:][tgt[:, 1:] == pad] = pad
    lengths = np.array([len(p[0]) for p in pairs], dtype=np.int64)
    tensors = [torch.from_numpy(a) for a in (src, lengths, prev, tgt)]
    if pin_memory:  # every tensor Batch.to copies: a pageable one may make it wait
        tensors = [t.pin_memory() for t in tensors]
    src_t, lengths_t, prev_t, tgt_t = tensors
    return Batch(
        ids=torch.as_tensor(np.asarray(ids, dtype=np.int64)),
        src_tokens=src_t,
        src_lengths=lengths_t,
        prev_tokens=prev_t,
        target=tgt_t,
        ntokens=int(sum(len(p[1]) for p in pairs)),
        nsentences=len(pairs),
    )
