"""Transformer building blocks with fairseq's semantics and parameter names.

This module is the textbook Transformer ("Attention Is All You Need", as fairseq writes it):
positions, multi-head attention on scaled dot-product attention, the position-wise FFN,
post-norm or pre-norm residual sub-layers, and the encoder and decoder layers built from
them. The few operations whose speed matters (dropout, attention, the attention masks and
the q/k/v projections) go through a `Kernels` object given to each layer: `Kernels` below
computes them as written in the paper; nmt.model.kernels.FastKernels computes the same
functions faster, and is what `Transformer` uses unless told otherwise.

Shape legend (batch-first everywhere):
    B batch, S source length, T target length (new tokens only when decoding with a cache),
    K key length (S for encoder-decoder attention, cached prefix + T for decoder
    self-attention), D embed_dim, F ffn_dim, H attention heads, Dh = D // H head width.

Attention masks follow torch's scaled_dot_product_attention: a boolean mask is True
where a query may attend; `None` means attend everywhere.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import TYPE_CHECKING

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.errors import NmtError

if TYPE_CHECKING:
    from nmt.model.cache import DecoderCache


# ------------------------------------------------------------------------------ positions


def sinusoidal_table(num_embeddings: int, embedding_dim: int, padding_idx: int) -> Tensor:
    """fairseq's SinusoidalPositionalEmbedding table [num_embeddings, D].

    Row p holds sin(p * w_i) in its first half and cos(p * w_i) in its second half, with
    w_i = exp(-i * ln(10000) / (D/2 - 1)); an odd D gets a zero last column and the
    padding row is zero. Real tokens use rows padding_idx + 1, padding_idx + 2, ...
    """
    half_dim = embedding_dim // 2
    step = math.log(10000) / (half_dim - 1)
    freqs = torch.exp(torch.arange(half_dim, dtype=torch.float) * -step)  # [D/2]
    angles = torch.arange(num_embeddings, dtype=torch.float).unsqueeze(1) * freqs.unsqueeze(0)
    table = torch.cat([torch.sin(angles), torch.cos(angles)], dim=1)  # [N, 2 * (D/2)]
    if embedding_dim % 2 == 1:
        table = torch.cat([table, torch.zeros(num_embeddings, 1)], dim=1)
    table[padding_idx, :] = 0
    return table


class SinusoidalPositionalEmbedding(nn.Module):
    """Fixed positions; `forward(start, length)` gives rows for positions start.. of a
    right-padded batch, numerically equal to fairseq's at every non-pad position."""

    weights: Tensor  # [max_positions + padding_idx + 1, D], a buffer

    def __init__(self, embedding_dim: int, padding_idx: int, max_positions: int):
        super().__init__()
        self.embedding_dim = embedding_dim
        self.padding_idx = padding_idx
        # Not persistent: it is a function of the config, so checkpoints need not carry it.
        self.register_buffer(
            "weights",
            sinusoidal_table(max_positions + padding_idx + 1, embedding_dim, padding_idx),
            persistent=False,
        )

    def forward(self, start: int, length: int) -> Tensor:
        first = self.padding_idx + 1 + start
        end = first + length
        table = self.weights
        if end > table.size(0):  # longer than configured: extend on the fly, as fairseq does
            table = sinusoidal_table(end, self.embedding_dim, self.padding_idx).to(table)
        return table[first:end]  # [T,D]


class LearnedPositionalEmbedding(nn.Embedding):
    """Learned positions laid out as fairseq's (rows 0..padding_idx unused by real tokens)."""

    def __init__(self, embedding_dim: int, padding_idx: int, max_positions: int, config_key: str):
        super().__init__(max_positions + padding_idx + 1, embedding_dim, padding_idx=padding_idx)
        self.max_positions = max_positions
        self.first_row = padding_idx + 1  # the row of position 0
        self.config_key = config_key  # named in the error for a too-long input
        nn.init.normal_(self.weight, mean=0.0, std=embedding_dim**-0.5)
        nn.init.zeros_(self.weight[padding_idx])

    def forward(self, start: int, length: int) -> Tensor:  # type: ignore[override]
        if start + length > self.max_positions:
            raise NmtError(
                f"{self.config_key}: a sequence of {start + length} tokens exceeds "
                f"the model's {self.max_positions} learned positions; shorten or "
                "filter the input"
            )
        first = self.first_row + start
        return self.weight[first : first + length]  # [T,D]


# ------------------------------------------------------------------ parameters, activation


def token_embedding(num_embeddings: int, embedding_dim: int, padding_idx: int) -> nn.Embedding:
    """Token embeddings initialised as fairseq's: N(0, D^-0.5), pad row zero."""
    emb = nn.Embedding(num_embeddings, embedding_dim, padding_idx=padding_idx)
    nn.init.normal_(emb.weight, mean=0.0, std=embedding_dim**-0.5)
    nn.init.zeros_(emb.weight[padding_idx])
    return emb


def xavier_linear(in_features: int, out_features: int) -> nn.Linear:
    """fairseq's `Linear` helper: Xavier-uniform weight, zero bias."""
    layer = nn.Linear(in_features, out_features)
    nn.init.xavier_uniform_(layer.weight)
    nn.init.zeros_(layer.bias)
    return layer


def activation(name: str) -> Callable[[Tensor], Tensor]:
    return F.gelu if name == "gelu" else F.relu


# -------------------------------------------------------------------------------- kernels


class Kernels:
    """The operations the layers compute through, as the paper writes them.

    A subclass may compute any of them faster, provided it computes the same function
    (nmt.model.kernels.FastKernels). Each layer is built with one `Kernels` object and
    asks it for these operations only; instances hold no state.
    """

    def dropout(self, x: Tensor, p: float, training: bool) -> Tensor:
        """Zero each element with probability p and scale the rest by 1 / (1 - p)."""
        return F.dropout(x, p, training)

    def attention(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> Tensor:
        """softmax(q k^T / sqrt(Dh)) v: q [B,H,T,Dh], k/v [B,H,K,Dh] -> [B,H,T,Dh].

        `mask` is boolean, True = may attend, broadcastable to [B,H,T,K]; `is_causal`
        lets query i see keys 0..i only (top-left aligned); `dropout_p` drops attention
        probabilities.
        """
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )

    def attention_with_weights(
        self,
        q: Tensor,
        k: Tensor,
        v: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        dropout_p: float = 0.0,
    ) -> tuple[Tensor, Tensor]:
        """`attention` spelled out, which also gives its probabilities: (out [B,H,T,Dh],
        probabilities [B,H,T,K] in fp32, before dropout)."""
        scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1)).float()  # [B,H,T,K]
        if is_causal:  # top-left aligned, as SDPA's
            t, k_len = scores.shape[-2:]
            ahead = torch.ones(t, k_len, dtype=torch.bool, device=q.device).triu(1)  # [T,K]
            scores = scores.masked_fill(ahead, float("-inf"))
        if mask is not None:
            scores = scores.masked_fill(~mask, float("-inf"))
        probs = torch.softmax(scores, dim=-1)  # fp32, so that weights sum to 1
        out = torch.matmul(self.dropout(probs.to(v.dtype), dropout_p, dropout_p > 0), v)
        return out, probs  # [B,H,T,Dh], [B,H,T,K]

    def attention_mask(self, padding_mask: Tensor, padded: bool | None = None) -> Tensor | None:
        """[B,K] key padding mask (True = pad) -> attention mask [B,1,1,K] (True = attend).

        `padded` (whether any row is padded, when the caller knows) is a hint a faster
        subclass may use to return None; the mask is right either way.
        """
        return ~padding_mask[:, None, None, :]

    def multihead_attention(
        self, embed_dim: int, num_heads: int, dropout: float
    ) -> MultiheadAttention:
        """The attention module of the layers (a subclass may project q/k/v differently)."""
        return MultiheadAttention(embed_dim, num_heads, dropout, self)


# ------------------------------------------------------------------------------ attention


class MultiheadAttention(nn.Module):
    """Multi-head attention: queries, keys and values projected by q_proj/k_proj/v_proj,
    split into H heads, scaled dot-product attention per head, heads joined by out_proj.

    Keys and values are projected apart from queries (`project_kv`) so that callers can
    keep them: the decoder appends self-attention keys per step (DecoderCache) and
    projects the encoder's once per source. `project_qkv` projects all three for
    self-attention; `attend` takes projected queries.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float, kernels: Kernels):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.kernels = kernels
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # fairseq's init: scaled Xavier for q/k/v (their biases keep torch's default).
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)

    def split_heads(self, x: Tensor) -> Tensor:
        """[B,L,D] -> [B,H,L,Dh]."""
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x [B,K,D] as [B,H,K,Dh] each."""
        return self.split_heads(self.k_proj(x)), self.split_heads(self.v_proj(x))

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x [B,T,D] as [B,H,T,Dh] each (self-attention)."""
        q = self.split_heads(self.q_proj(x))
        return (q, *self.project_kv(x))

    def forward(
        self,
        query: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """query [B,T,D] attends to key/value [B,H,K,Dh] -> ([B,T,D], weights [B,T,K] | None).

        See `attend`, which takes queries already projected.
        """
        q = self.split_heads(self.q_proj(query))  # [B,H,T,Dh]
        return self.attend(q, key, value, mask, is_causal, need_weights)

    def attend(
        self,
        q: Tensor,
        key: Tensor,
        value: Tensor,
        mask: Tensor | None = None,
        is_causal: bool = False,
        need_weights: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """Projected queries q [B,H,T,Dh] attend to key/value [B,H,K,Dh] -> ([B,T,D],
        weights [B,T,K] | None).

        `mask` is boolean, True = may attend, broadcastable to [B,H,T,K]. The weights are
        averaged over heads and computed only when asked for, on a separate path.

        Key/value may also hold one row per G consecutive query rows ([B/G,H,K,Dh], mask
        broadcastable to [B/G,H,1,K]): the K beams of a sentence then share its encoder
        keys/values, and their queries are attended together as one [G*T] block.
        """
        batch, _, length, _ = q.shape
        group = batch // key.size(0)
        if group > 1:  # [B,H,T,Dh] -> [B/G,H,G*T,Dh]: one row per key row
            q = q.view(-1, group, self.num_heads, length, self.head_dim).transpose(1, 2)
            q = q.reshape(-1, self.num_heads, group * length, self.head_dim)
        p = self.dropout if self.training else 0.0
        weights = None
        if need_weights:
            out, probs = self.kernels.attention_with_weights(q, key, value, mask, is_causal, p)
            weights = probs.mean(dim=1)  # averaged over heads: [B,T,K]
        else:
            out = self.kernels.attention(q, key, value, mask, is_causal, p)
        if group > 1:  # back to [B,H,T,Dh]
            out = out.view(-1, self.num_heads, group, length, self.head_dim).transpose(1, 2)
            out = out.reshape(batch, self.num_heads, length, self.head_dim)
            weights = None if weights is None else weights.reshape(batch, length, -1)
        return self.output(out), weights

    def output(self, heads: Tensor) -> Tensor:
        """Attention output per head [B,H,T,Dh] -> the layer's output [B,T,D]."""
        batch, _, length, _ = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(batch, length, -1))  # [B,T,D]


# --------------------------------------------------------------------------------- layers


class _Layer(nn.Module):
    """What encoder and decoder layers share: self-attention, the position-wise FFN, and
    the residual connection around each sub-layer.

    Post-norm (the paper, fairseq's default): x = LayerNorm(x + Dropout(sublayer(x))).
    Pre-norm (`normalize_before`): x = x + Dropout(sublayer(LayerNorm(x))).
    """

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        heads: int,
        dropout: float,
        attention_dropout: float,
        activation_dropout: float,
        activation_fn: str,
        normalize_before: bool,
        kernels: Kernels,
    ):
        super().__init__()
        self.normalize_before = normalize_before
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.activation_fn = activation(activation_fn)
        self.kernels = kernels
        self.self_attn = kernels.multihead_attention(embed_dim, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = xavier_linear(embed_dim, ffn_dim)
        self.fc2 = xavier_linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def pre_norm(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        """A sub-layer's input: LayerNorm(x) with pre-norm, x itself with post-norm."""
        return norm(x) if self.normalize_before else x

    def residual(self, x: Tensor, sublayer_out: Tensor, norm: nn.LayerNorm) -> Tensor:
        """Dropout, residual add, and (post-norm only) the sub-layer's LayerNorm."""
        x = x + self.kernels.dropout(sublayer_out, self.dropout, self.training)
        return x if self.normalize_before else norm(x)

    def ffn(self, x: Tensor) -> Tensor:
        """The position-wise FFN sub-layer, fc2(act(fc1(x))), with its residual and norm:
        [B,L,D] -> [B,L,D]."""
        h = self.activation_fn(self.fc1(self.pre_norm(x, self.final_layer_norm)))  # [B,L,F]
        h = self.kernels.dropout(h, self.activation_dropout, self.training)
        return self.residual(x, self.fc2(h), self.final_layer_norm)


class TransformerEncoderLayer(_Layer):
    """Self-attention over the source, then the FFN."""

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,S,D], mask [B,1,1,S] (True = real token) or None -> [B,S,D]."""
        h = self.pre_norm(x, self.self_attn_layer_norm)
        q, k, v = self.self_attn.project_qkv(h)  # [B,H,S,Dh] each
        h, _ = self.self_attn.attend(q, k, v, mask)  # [B,S,D]
        x = self.residual(x, h, self.self_attn_layer_norm)
        return self.ffn(x)


class TransformerDecoderLayer(_Layer):
    """Causal self-attention, encoder-decoder attention, then the FFN."""

    def __init__(
        self,
        embed_dim: int,
        ffn_dim: int,
        heads: int,
        dropout: float,
        attention_dropout: float,
        activation_dropout: float,
        activation_fn: str,
        normalize_before: bool,
        kernels: Kernels,
    ):
        super().__init__(
            embed_dim,
            ffn_dim,
            heads,
            dropout,
            attention_dropout,
            activation_dropout,
            activation_fn,
            normalize_before,
            kernels,
        )
        self.encoder_attn = kernels.multihead_attention(embed_dim, heads, attention_dropout)
        self.encoder_attn_layer_norm = nn.LayerNorm(embed_dim)

    def forward(
        self,
        x: Tensor,
        enc_k: Tensor,
        enc_v: Tensor,
        enc_mask: Tensor | None,
        cache: DecoderCache | None = None,
        layer_idx: int = 0,
        need_attn: bool = False,
    ) -> tuple[Tensor, Tensor | None]:
        """x [B,T,D] -> ([B,T,D], encoder attention [B,T,S] averaged over heads | None).

        `enc_k`/`enc_v` [B,H,S,Dh] are the projected encoder states. Without a cache, x
        is the whole target prefix and self-attention is causal; with one, x holds the new
        positions, whose keys/values the cache keeps, and the cache attends over the
        prefix (inference only: no attention dropout).
        """
        h = self.pre_norm(x, self.self_attn_layer_norm)
        q, k, v = self.self_attn.project_qkv(h)  # [B,H,T,Dh] each
        if cache is not None:
            h = self.self_attn.output(cache.self_attention(layer_idx, q, k, v))  # [B,T,D]
        else:
            h, _ = self.self_attn.attend(q, k, v, is_causal=x.size(1) > 1)  # [B,T,D]
        x = self.residual(x, h, self.self_attn_layer_norm)

        h = self.pre_norm(x, self.encoder_attn_layer_norm)
        h, attn = self.encoder_attn(h, enc_k, enc_v, enc_mask, need_weights=need_attn)
        x = self.residual(x, h, self.encoder_attn_layer_norm)
        return self.ffn(x), attn
