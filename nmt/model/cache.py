"""DecoderCache: what incremental decoding keeps between steps, for a batch of rows.

Shapes: B rows, G rows per group (the beams of one sentence; 1 outside beam search),
N = B / G groups, L decoder layers, H heads, C capacity >= cached length, S source
length, Dh head width, T new positions in this call.

Beam search reorders its rows after every step, and copying every row's cached keys and
values at each reorder cost more than attention itself. So the cache never moves them
within a group: self-attention keys/values live in one preallocated buffer
[L, 2, N, H, C, G, Dh] where slot (p, g) holds what row g of the group computed at
position p, and `ancestry` [N, G, C] tells which slot of position p holds row g's own
prefix. A reorder within groups only gathers `ancestry`. Attention scores each query
against all G slots of every position of its group (a matmul, G queries per key: as cheap
as reading the keys once), then keeps the scores of its own slots. Rows move between
groups only when groups leave the batch (finished sentences), which copies the buffer.

Encoder-decoder keys/values [E, L, 2, H, S, Dh] are projected once per source, on the
first step, and kept with the source's attention mask; E is B, or N when the rows of a
group share their source's rows (see MultiheadAttention).
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch import Tensor


def causal_mask(start: int, length: int, device: torch.device) -> Tensor:
    """[T,K] bool, True where new query start+i may see key j (j <= start+i)."""
    query_pos = torch.arange(start, start + length, device=device)[:, None]  # [T,1]
    key_pos = torch.arange(start + length, device=device)[None, :]  # [1,K]
    return key_pos <= query_pos


class CacheMemory:
    """Memory for the key/value buffers of successive caches (one batch after another).

    glibc serves blocks over 32 MB with a fresh mmap and unmaps them on free, so each new
    buffer was page-faulted in 4 KB at a time as its positions were first written: on a
    CPU, writing a step's keys cost 10x a copy. A generator keeps one CacheMemory per
    model and hands it to each batch's cache, which takes its buffers from here. Two
    slots, because a cache that grows or drops rows copies from one buffer to another.
    Only the latest cache may use the memory.
    """

    def __init__(self) -> None:
        self._slots: list[Tensor | None] = [None, None]

    def empty(self, slot: int, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """An uninitialised tensor of `shape`, with like's dtype and device, in `slot`."""
        numel = math.prod(shape)
        flat = self._slots[slot]
        if (
            flat is None
            or flat.numel() < numel
            or flat.dtype != like.dtype
            or flat.device != like.device
        ):
            flat = self._slots[slot] = like.new_empty(numel)
        return flat[:numel].view(shape)


class DecoderCache:
    """Per-layer keys/values of the decoded prefix; see `Transformer.decode`.

    `group` > 1 declares that rows come in groups of that many consecutive rows whose
    reorders stay within the group (beam search: the beams of a sentence). `capacity`:
    positions to make room for at once (the longest decoding expected); `memory`: where
    the buffers come from (see CacheMemory; default: a memory of this cache's own).
    """

    def __init__(
        self,
        num_layers: int,
        group: int = 1,
        capacity: int = 0,
        memory: CacheMemory | None = None,
        chunk: int = 16,
    ):
        self.num_layers = num_layers
        self.group = group
        self.capacity = capacity
        self.memory = memory or CacheMemory()
        self._slot = 0  # memory slot of the buffer in use
        self.chunk = chunk  # capacity grows by this many positions at a time
        self.length = 0  # positions already cached; the next token's position is this
        self._self_kv: Tensor | None = None  # [L, 2, N, H, C, G, Dh]
        self._ancestry: Tensor | None = None  # [N, G, C] long: the slot of row g's prefix at p
        self._enc_kv: Tensor | None = None  # [E, L, 2, H, S, Dh]
        self._enc_layers_set = 0
        self.enc_mask: Tensor | None = None  # [E,1,1,S], True = real source token; or None

    # -- self-attention ---------------------------------------------------------------
    def self_attention(self, layer: int, q: Tensor, k: Tensor, v: Tensor) -> Tensor:
        """This step's queries/keys/values [B,H,T,Dh] -> attention output [B,H,T,Dh].

        The new keys/values are stored after the prefix; each query attends to its row's
        prefix and to the new positions up to its own. `advance` commits the step.
        """
        batch, heads, steps, head_dim = k.shape
        start, end, g = self.length, self.length + steps, self.group
        groups = batch // g
        self._reserve(k, end)
        buf = self._self_kv
        assert buf is not None
        # [B,H,T,Dh] -> [N,H,T,G,Dh]: row g of a group goes to slot g of each new position
        buf[layer, 0, :, :, start:end] = k.view(groups, g, heads, steps, head_dim).permute(
            0, 2, 3, 1, 4
        )
        buf[layer, 1, :, :, start:end] = v.view(groups, g, heads, steps, head_dim).permute(
            0, 2, 3, 1, 4
        )
        keys, values = buf[layer, 0, :, :, :end], buf[layer, 1, :, :, :end]  # [N,H,end,G,Dh]
        if g == 1:  # each row has its own slots: plain attention
            keys, values = keys.squeeze(3), values.squeeze(3)  # [B,H,end,Dh]
            mask = None if start == 0 or steps == 1 else causal_mask(start, steps, k.device)
            return F.scaled_dot_product_attention(
                q, keys, values, attn_mask=mask, is_causal=start == 0 and steps > 1
            )
        assert self._ancestry is not None
        if layer == 0:  # the new positions are each row's own slots (the same in every layer)
            self._ancestry[:, :, start:end] = torch.arange(g, device=k.device)[None, :, None]
        own = self._ancestry[:, None, :, None, :end, None]  # [N,1,G,1,end,1]
        own = own.expand(groups, heads, g, steps, end, 1)  # [N,H,G,T,end,1]
        # The G queries of a group against all G*end slots of its keys: [N,H,G*T,G*end]
        q = q.view(groups, g, heads, steps, head_dim).transpose(1, 2) * head_dim**-0.5
        scores = torch.matmul(
            q.reshape(groups, heads, g * steps, head_dim), keys.flatten(2, 3).transpose(2, 3)
        )
        scores = (
            scores.view(groups, heads, g, steps, end, g).gather(5, own).squeeze(5)
        )  # [N,H,G,T,end]
        if steps > 1:
            scores = scores.masked_fill(~causal_mask(start, steps, k.device), float("-inf"))
        probs = torch.softmax(scores.float(), dim=-1).to(values.dtype)  # [N,H,G,T,end]
        # Back onto the slots: the weight of each position on its own slot, zero elsewhere.
        spread = probs.new_zeros(groups, heads, g, steps, end, g).scatter_(
            5, own, probs.unsqueeze(5)
        )
        out = torch.matmul(spread.view(groups, heads, g * steps, end * g), values.flatten(2, 3))
        out = out.view(groups, heads, g, steps, head_dim).transpose(1, 2)  # [N,G,H,T,Dh]
        return out.reshape(batch, heads, steps, head_dim)

    def advance(self, steps: int) -> None:
        """Called once per decoder call, after every layer attended over `steps` positions."""
        self.length += steps

    def _reserve(self, like: Tensor, needed: int) -> None:
        buf = self._self_kv
        if buf is not None and buf.size(4) >= needed:
            return
        batch, heads, _, head_dim = like.shape
        groups = batch // self.group
        if groups * self.group != batch:
            raise ValueError(f"{batch} rows do not split into groups of {self.group}")
        capacity = -(-max(needed, self.capacity) // self.chunk) * self.chunk  # whole chunks
        new = self._empty((self.num_layers, 2, groups, heads, capacity, self.group, head_dim), like)
        ancestry = torch.empty(groups, self.group, capacity, dtype=torch.long, device=like.device)
        if buf is not None and self.length:
            new[:, :, :, :, : self.length] = buf[:, :, :, :, : self.length]
            assert self._ancestry is not None
            ancestry[:, :, : self.length] = self._ancestry[:, :, : self.length]
        self._self_kv, self._ancestry = new, ancestry

    def _empty(self, shape: tuple[int, ...], like: Tensor) -> Tensor:
        """A buffer in the memory slot not in use (the one in use may be copied from)."""
        self._slot = 1 - self._slot if self._self_kv is not None else self._slot
        return self.memory.empty(self._slot, shape, like)

    # -- encoder-decoder attention ----------------------------------------------------
    @property
    def has_encoder_kv(self) -> bool:
        return self._enc_layers_set == self.num_layers

    def set_encoder_kv(self, layer: int, k: Tensor, v: Tensor) -> None:
        """Keep `layer`'s projected encoder states k/v [E,H,S,Dh] for later steps."""
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
    def reorder(
        self,
        index: Tensor,
        encoder_rows: Tensor | None = None,
        *,
        groups_kept: bool | None = None,
    ) -> None:
        """Make row i the old row index[i] (index [B'] long; B' may differ from B).

        With groups, index must keep each group of G new rows inside one old group (the
        beams of a sentence extend that sentence's beams); groups may be dropped,
        repeated or reordered. The encoder-decoder keys/values and mask have their own
        rows: one per group when the rows of a group share them (the generator's way),
        or one per row. With `encoder_rows` they become those old rows; None leaves them
        as they are, which is right while the groups stay the same.

        `groups_kept=True` tells that new group n comes from old group n for every n (beam
        search while no sentence leaves): then nothing is copied, and the index need not
        be read to find that out, which on a GPU would wait for the device. Whether rows
        stay within their groups is checked on CPU tensors only, for the same reason.
        """
        if self._self_kv is not None:
            self._reorder_self(index, groups_kept)
        if encoder_rows is None:
            return
        # Advanced indexing rather than index_select for these contiguous tensors: on two
        # busy CPU cores, index_select's contiguous kernel stalled for seconds.
        if self._enc_kv is not None:
            self._enc_kv = self._enc_kv[encoder_rows]
        if self.enc_mask is not None:
            self.enc_mask = self.enc_mask[encoder_rows]

    def _reorder_self(self, index: Tensor, groups_kept: bool | None) -> None:
        g, filled = self.group, self.length
        buf, ancestry = self._self_kv, self._ancestry
        assert buf is not None and ancestry is not None
        if index.numel() % g:
            raise ValueError(f"reorder: {index.numel()} rows do not split into groups of {g}")
        old_group = torch.div(index, g, rounding_mode="floor").view(-1, g)  # [N',G]
        groups = old_group[:, 0]  # [N'] the old group each new group comes from
        if g > 1 and index.device.type == "cpu" and not bool(old_group.eq(groups[:, None]).all()):
            raise ValueError(
                "reorder: with groups of rows, each new group must take all its "
                "rows from one old group"
            )
        moved = groups.numel() != buf.size(2)
        if not moved and groups_kept is None:
            moved = not torch.equal(groups, torch.arange(groups.numel(), device=groups.device))
        elif not moved:
            moved = not groups_kept
        if moved:
            # Groups left or moved: copy their slots (the only copy of cached keys/values).
            new = self._empty((*buf.shape[:2], groups.numel(), *buf.shape[3:]), buf)
            torch.index_select(buf[:, :, :, :, :filled], 2, groups, out=new[:, :, :, :, :filled])
            self._self_kv = new
            ancestry = ancestry[groups]
        if g > 1:
            origin = index.view(-1, g) - groups[:, None] * g  # [N',G] row within the old group
            ancestry[:, :, :filled] = ancestry[:, :, :filled].gather(
                1, origin[:, :, None].expand(-1, -1, filled)
            )
        self._ancestry = ancestry
