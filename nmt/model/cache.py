"""DecoderCache: what incremental decoding keeps between steps, for a batch of rows.

Shapes: B rows (sentences x beams), L decoder layers, H heads, C capacity >= cached
length, S source length, Dh head width.

Self-attention keys/values of every layer live in one preallocated buffer
[B, L, 2, H, C, Dh]: a step writes its new positions in place (no concatenation of the
prefix) and attention reads a view of the filled part. The capacity grows in chunks, so
a step copies nothing but its own keys/values, and a beam reorder is one row gather of
the filled positions, for all layers at once, into a second buffer that is then swapped
in. Encoder-decoder keys/values [E, L, 2, H, S, Dh] are projected once per source, on
the first step, and kept with the source's attention mask; E is B, or B/K when the K
beams of each sentence share their source's rows (see MultiheadAttention).
"""

from __future__ import annotations

import torch
from torch import Tensor


class DecoderCache:
    """Per-layer keys/values of the decoded prefix; see `Transformer.decode`."""

    def __init__(self, num_layers: int, chunk: int = 16):
        self.num_layers = num_layers
        self.chunk = chunk  # capacity grows by this many positions at a time
        self.length = 0  # positions already cached; the next token's position is this
        self._self_kv: Tensor | None = None  # [B, L, 2, H, C, Dh]
        self._spare: Tensor | None = None  # same shape: what reorder gathers into
        self._enc_kv: Tensor | None = None  # [B, L, 2, H, S, Dh]
        self._enc_layers_set = 0
        self.enc_mask: Tensor | None = None  # [B,1,1,S], True = real source token; or None

    # -- self-attention ---------------------------------------------------------------
    def append(self, layer: int, k: Tensor, v: Tensor) -> tuple[Tensor, Tensor]:
        """Store this step's k/v [B,H,T,Dh] after the prefix; return [B,H,length+T,Dh]
        views of the whole cached sequence for `layer`. `advance` commits the step."""
        start = self.length
        end = start + k.size(2)
        self._reserve(k, end)
        buf = self._self_kv
        assert buf is not None
        buf[:, layer, 0, :, start:end] = k
        buf[:, layer, 1, :, start:end] = v
        return buf[:, layer, 0, :, :end], buf[:, layer, 1, :, :end]

    def advance(self, steps: int) -> None:
        """Called once per decoder call, after every layer appended `steps` positions."""
        self.length += steps

    def _reserve(self, like: Tensor, needed: int) -> None:
        buf = self._self_kv
        if buf is not None and buf.size(4) >= needed:
            return
        batch, heads, _, head_dim = like.shape
        capacity = -(-needed // self.chunk) * self.chunk  # round up to a whole chunk
        new = like.new_empty(batch, self.num_layers, 2, heads, capacity, head_dim)
        if buf is not None and self.length:
            new[..., : self.length, :] = buf[..., : self.length, :]
        self._self_kv = new

    # -- encoder-decoder attention ----------------------------------------------------
    @property
    def has_encoder_kv(self) -> bool:
        return self._enc_layers_set == self.num_layers

    def set_encoder_kv(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Keep `layer`'s projected encoder states k/v [B,H,S,Dh] for later steps."""
        if self._enc_kv is None:
            batch, heads, length, head_dim = k.shape
            self._enc_kv = k.new_empty(batch, self.num_layers, 2, heads, length, head_dim)
        self._enc_kv[:, layer, 0] = k
        self._enc_kv[:, layer, 1] = v
        self._enc_layers_set += 1

    def encoder_kv(self, layer: int) -> tuple[Tensor, Tensor]:
        assert self._enc_kv is not None, "encoder keys/values are set on the first step"
        return self._enc_kv[:, layer, 0], self._enc_kv[:, layer, 1]

    # -- beam search --------------------------------------------------------------------
    def reorder(self, index: Tensor, encoder_rows: Tensor | None = None) -> None:
        """Make row i the old row index[i] (index [B'] long; B' may differ from B).

        The encoder-decoder keys/values and mask have their own rows: one per source when
        the beams of a sentence share them (the generator's way), or one per row. With
        `encoder_rows` they become those old rows; None leaves them as they are, which is
        right while the sources stay the same (beams reordered within their sentence): it
        saves copying L x S keys/values per row at every beam step.
        """
        buf = self._self_kv
        if buf is not None:
            # Gather the filled positions into a second buffer and swap the two: reusing
            # memory matters, as a fresh 60 MB buffer per step costs ~4x the copy itself
            # in page faults (64x5 rows of transformer_small, CPU).
            rows = index.numel()
            spare = self._spare
            if spare is None or spare.size(0) != rows or spare.size(4) != buf.size(4):
                spare = buf.new_empty(rows, *buf.shape[1:])
            filled = self.length
            torch.index_select(buf[..., :filled, :], 0, index, out=spare[..., :filled, :])
            # A shrinking batch keeps using the first rows of the old buffer.
            self._self_kv, self._spare = spare, buf[:rows] if buf.size(0) >= rows else None
        if encoder_rows is None:
            return
        # Advanced indexing rather than index_select for these contiguous tensors: on two
        # busy CPU cores, index_select's contiguous kernel stalled for seconds.
        if self._enc_kv is not None:
            self._enc_kv = self._enc_kv[encoder_rows]
        if self.enc_mask is not None:
            self.enc_mask = self.enc_mask[encoder_rows]
