"""Forced decoding: the log-probability a model (or an ensemble) gives to a given target,
token by token (fairseq's --score-reference, OpenNMT's -gold).

Shape legend: B sentence pairs, S source length, T target length (EOS included),
D model width, V target vocabulary, P real (non-pad) target positions of the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor

from nmt.data.collate import collate
from nmt.model.transformer import Transformer
from nmt.runtime import inference_mode
from nmt.vocab import PAD

# Target positions projected to the vocabulary at once: bounds the [positions, V] logits
# (64 sentences x 50 tokens x 32k vocabulary would be 400 MB in one piece).
BLOCK_POSITIONS = 2048


def forced_batch(
    sources: Sequence[np.ndarray], targets: Sequence[np.ndarray], device: torch.device
) -> tuple[Tensor, Tensor, Tensor]:
    """(src_tokens [B,S], prev_tokens [B,T], target [B,T]) exactly as training builds them
    (nmt.data.collate): prev_tokens = [EOS] + target[:-1], right-padded with PAD."""
    batch = collate(range(len(sources)), list(zip(sources, targets)))
    return batch.src_tokens.to(device), batch.prev_tokens.to(device), batch.target.to(device)


@inference_mode
def forced_log_probs(
    models: Sequence[Transformer], src_tokens: Tensor, prev_tokens: Tensor, target: Tensor
) -> Tensor:
    """log p(target[b,t] | source b, target[b,:t]) [B,T] in float32, 0 at padding.

    An ensemble averages the members' log-probabilities, as the generator does. The
    model's own distribution: no temperature, penalty or other search rule applies.
    Autocast (bf16/fp16) is the caller's context.
    """
    real = target.ne(PAD)  # [B,T]
    wanted = target[real]  # [P]
    total = torch.zeros(wanted.numel(), device=target.device)  # [P]
    for model in models:
        features = model(src_tokens, prev_tokens, features_only=True)[real]  # [P,D]
        weight = model.output_weight  # [V,D]
        for start in range(0, wanted.numel(), BLOCK_POSITIONS):
            block = slice(start, start + BLOCK_POSITIONS)
            logits = F.linear(features[block], weight).float()  # [p,V]
            lprobs = torch.log_softmax(logits, dim=-1, out=logits)
            total[block] += lprobs.gather(1, wanted[block, None]).squeeze(1)
    out = torch.zeros(target.shape, device=target.device)  # [B,T]
    out[real] = total / len(models)
    return out
