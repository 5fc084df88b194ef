"""Transformer building blocks with fairseq's semantics and parameter names.

Shape legend (batch-first everywhere):
    B batch, S source length, T target length (new tokens only when decoding with a cache),
    K key length (S for encoder-decoder attention, cached prefix + T for decoder
    self-attention), D embed_dim, H attention heads, Dh = D // H head width.

Attention masks follow torch's scaled_dot_product_attention: a boolean mask is True
where a query may attend; `None` means attend everywhere, which lets SDPA use its fused
kernels without materialising a mask.
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
        return table[first:end]  # [T, D]


class LearnedPositionalEmbedding(nn.Embedding):
    """Learned positions laid out as fairseq's (rows 0..padding_idx unused by real tokens)."""

    def __init__(self, embedding_dim: int, padding_idx: int, max_positions: int, config_key: str):
        super().__init__(max_positions + padding_idx + 1, embedding_dim, padding_idx=padding_idx)
        self.max_positions = max_positions
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
        first = self.padding_idx + 1 + start
        return self.weight[first : first + length]  # [T, D]


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


def dropout(x: Tensor, p: float, training: bool) -> Tensor:
    """F.dropout with a cheaper mask on CPU (same distribution to within 2**-16 in p).

    torch's CPU dropout draws one double per element from its serial RNG (a fifth of a
    training step). Here each 64-bit draw gives the keep/drop decisions of four elements
    (16 bits each; 64-bit draws cost a third of 32-bit ones per bit), which is several
    times cheaper forward and backward. The mask keeps an element with probability
    1 - round(p * 2**16) / 2**16 and scales by its inverse, so the expectation is exact.
    CUDA keeps F.dropout (its RNG is parallel), and so does torch.compile, which fuses
    dropout with its own generator.
    """
    if not training or p == 0.0:
        return x
    if x.device.type != "cpu" or p >= 1.0 or torch.compiler.is_compiling():
        return F.dropout(x, p, training)
    drop = round(p * 65536)  # dropped values out of 2**16
    n = x.numel()
    bits = torch.empty((n + 3) // 4, dtype=torch.int64).random_(-(2**63), None)  # full 64 bits
    keep = bits.view(torch.int16)[:n].view(x.shape) >= drop - 32768  # P = 1 - drop / 2**16
    return x * (keep.to(x.dtype) * (65536 / (65536 - drop)))


# Key lengths up to which CPU training spells attention out (`matmul_attention`): it beat
# SDPA's CPU flash kernels forward and backward up to ~150 keys, in fp32 and bf16.
MATMUL_ATTENTION_MAX_KEYS = 128


def _sdpa(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, dropout_p: float, is_causal: bool
) -> Tensor:
    """F.scaled_dot_product_attention [B,H,T,Dh] -> [B,H,T,Dh], with CPU training's own paths.

    When gradients are needed on a CPU, torch's flash attention is slow for NMT's short
    sequences: 10-30% slower than two matmuls around a softmax in fp32 (forward plus
    backward), 2-4x slower in bf16, whose flash backward is ~3x slower than fp32's. So
    up to MATMUL_ATTENTION_MAX_KEYS keys, attention is `matmul_attention` (its [B,H,T,K]
    scores are small there); beyond, bf16 runs the flash kernels in fp32. CUDA and
    inference use SDPA as is.
    """
    if q.device.type != "cpu" or not torch.is_grad_enabled():
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    if k.size(-2) <= MATMUL_ATTENTION_MAX_KEYS:
        return matmul_attention(q, k, v, mask, is_causal, dropout_p)[0]
    if q.dtype != torch.bfloat16:
        return F.scaled_dot_product_attention(
            q, k, v, attn_mask=mask, dropout_p=dropout_p, is_causal=is_causal
        )
    with torch.autocast("cpu", enabled=False):
        out = F.scaled_dot_product_attention(
            q.float(),
            k.float(),
            v.float(),
            attn_mask=mask,
            dropout_p=dropout_p,
            is_causal=is_causal,
        )
    return out.to(torch.bfloat16)


def matmul_attention(
    q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, dropout_p: float
) -> tuple[Tensor, Tensor]:
    """Attention spelled out: q [B,H,T,Dh], k/v [B,H,K,Dh] -> (out [B,H,T,Dh], the attention
    probabilities [B,H,T,K] in fp32, before dropout). `mask` and `is_causal` as SDPA's."""
    scores = torch.matmul(q * q.size(-1) ** -0.5, k.transpose(-2, -1)).float()  # [B,H,T,K]
    if is_causal:  # top-left aligned, as SDPA's
        t, k_len = scores.shape[-2:]
        ahead = torch.ones(t, k_len, dtype=torch.bool, device=q.device).triu(1)
        scores = scores.masked_fill(ahead, float("-inf"))
    if mask is not None:
        scores = scores.masked_fill(~mask, float("-inf"))
    probs = torch.softmax(scores, dim=-1)  # fp32, so that weights sum to 1
    out = torch.matmul(dropout(probs.to(v.dtype), dropout_p, dropout_p > 0), v)  # [B,H,T,Dh]
    return out, probs


class MultiheadAttention(nn.Module):
    """Multi-head attention on F.scaled_dot_product_attention.

    Keys and values are projected apart from queries (`project_kv`) so that callers can
    cache them: the decoder appends self-attention keys per step and computes the
    encoder's once per source. Self-attention projects q, k and v in one matmul
    (`project_qkv`): one bigger matmul is faster than three small ones, and under autocast
    the input is cast to bf16 once instead of three times. The parameters stay fairseq's
    separate q_proj/k_proj/v_proj; their concatenation is built per forward in training
    (its gradient splits back for free) and kept between calls in inference.
    """

    def __init__(self, embed_dim: int, num_heads: int, dropout: float):
        super().__init__()
        self.num_heads = num_heads
        self.head_dim = embed_dim // num_heads
        self.dropout = dropout
        self.q_proj = nn.Linear(embed_dim, embed_dim)
        self.k_proj = nn.Linear(embed_dim, embed_dim)
        self.v_proj = nn.Linear(embed_dim, embed_dim)
        self.out_proj = nn.Linear(embed_dim, embed_dim)
        # fairseq's init: scaled Xavier for q/k/v (their biases keep torch's default).
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            nn.init.xavier_uniform_(proj.weight, gain=1 / math.sqrt(2))
        nn.init.xavier_uniform_(self.out_proj.weight)
        nn.init.zeros_(self.out_proj.bias)
        self._joint_cache: dict[str, tuple[tuple, Tensor, Tensor]] = {}

    def _joint(self, name: str, projs: tuple[nn.Linear, ...]) -> tuple[Tensor, Tensor]:
        """The projections stacked into one: (weight [n*D,D], bias [n*D])."""
        if torch.is_grad_enabled():  # training: rebuilt each time so the gradient flows
            return (torch.cat([p.weight for p in projs]), torch.cat([p.bias for p in projs]))
        # Inference: reuse until a parameter changes. A load or an in-place edit bumps its
        # version, a move to another device or dtype changes its storage; a fused
        # optimizer step does neither, so `train()` (called for every training step, and
        # by `eval()`) empties the cache as well.
        params = [t for p in projs for t in (p.weight, p.bias)]
        key = tuple((t._version, t.data_ptr(), t.dtype, t.device) for t in params)
        cached = self._joint_cache.get(name)
        if cached is None or cached[0] != key:
            weight = torch.cat([p.weight for p in projs]).detach()
            bias = torch.cat([p.bias for p in projs]).detach()
            cached = self._joint_cache[name] = (key, weight, bias)
        return cached[1], cached[2]

    def train(self, mode: bool = True) -> MultiheadAttention:
        self._joint_cache.clear()
        return super().train(mode)

    def _heads(self, x: Tensor) -> Tensor:
        batch, length, _ = x.shape
        return x.view(batch, length, self.num_heads, self.head_dim).transpose(1, 2)  # [B,H,L,Dh]

    def project_kv(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """Keys and values of x [B,K,D] as [B,H,K,Dh] each."""
        kv = F.linear(x, *self._joint("kv", (self.k_proj, self.v_proj)))  # [B,K,2D]
        k, v = kv.chunk(2, dim=-1)
        return self._heads(k), self._heads(v)

    def project_qkv(self, x: Tensor) -> tuple[Tensor, Tensor, Tensor]:
        """Queries, keys and values of x [B,T,D] as [B,H,T,Dh] each (self-attention)."""
        qkv = F.linear(x, *self._joint("qkv", (self.q_proj, self.k_proj, self.v_proj)))  # [B,T,3D]
        q, k, v = qkv.chunk(3, dim=-1)
        return self._heads(q), self._heads(k), self._heads(v)

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
        return self.attend(
            self._heads(self.q_proj(query)), key, value, mask, is_causal, need_weights
        )

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
        if need_weights:
            out, weights = self._attend_with_weights(q, key, value, mask, is_causal, p)
        else:
            out = _sdpa(q, key, value, mask, p, is_causal)
            weights = None
        if group > 1:  # back to [B,H,T,Dh]
            out = out.view(-1, self.num_heads, group, length, self.head_dim).transpose(1, 2)
            out = out.reshape(batch, self.num_heads, length, self.head_dim)
            weights = None if weights is None else weights.reshape(batch, length, -1)
        return self.output(out), weights

    def output(self, heads: Tensor) -> Tensor:
        """Attention output per head [B,H,T,Dh] -> the layer's output [B,T,D]."""
        batch, _, length, _ = heads.shape
        return self.out_proj(heads.transpose(1, 2).reshape(batch, length, -1))

    def _attend_with_weights(
        self, q: Tensor, k: Tensor, v: Tensor, mask: Tensor | None, is_causal: bool, p: float
    ) -> tuple[Tensor, Tensor]:
        out, probs = matmul_attention(q, k, v, mask, is_causal, p)
        return out, probs.mean(dim=1)  # weights averaged over heads: [B,T,K]


class _Layer(nn.Module):
    """What encoder and decoder layers share: self-attention and the FFN sub-layer."""

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
    ):
        super().__init__()
        self.normalize_before = normalize_before
        self.dropout = dropout
        self.activation_dropout = activation_dropout
        self.activation_fn = activation(activation_fn)
        self.self_attn = MultiheadAttention(embed_dim, heads, attention_dropout)
        self.self_attn_layer_norm = nn.LayerNorm(embed_dim)
        self.fc1 = xavier_linear(embed_dim, ffn_dim)
        self.fc2 = xavier_linear(ffn_dim, embed_dim)
        self.final_layer_norm = nn.LayerNorm(embed_dim)

    def residual(self, x: Tensor, sublayer_out: Tensor, norm: nn.LayerNorm) -> Tensor:
        """Dropout, residual add, and (post-norm only) the sub-layer's LayerNorm."""
        x = x + dropout(sublayer_out, self.dropout, self.training)
        return x if self.normalize_before else norm(x)

    def pre_norm(self, x: Tensor, norm: nn.LayerNorm) -> Tensor:
        return norm(x) if self.normalize_before else x

    def ffn(self, x: Tensor) -> Tensor:
        """The position-wise FFN sub-layer, residual and norm included: [B,L,D] -> [B,L,D]."""
        h = self.activation_fn(self.fc1(self.pre_norm(x, self.final_layer_norm)))  # [B,L,F]
        h = dropout(h, self.activation_dropout, self.training)
        return self.residual(x, self.fc2(h), self.final_layer_norm)


class TransformerEncoderLayer(_Layer):
    """Self-attention over the source, then the FFN."""

    def forward(self, x: Tensor, mask: Tensor | None) -> Tensor:
        """x [B,S,D], mask [B,1,1,S] (True = real token) or None -> [B,S,D]."""
        h = self.pre_norm(x, self.self_attn_layer_norm)
        q, k, v = self.self_attn.project_qkv(h)  # [B,H,S,Dh] each
        h, _ = self.self_attn.attend(q, k, v, mask)
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
        )
        self.encoder_attn = MultiheadAttention(embed_dim, heads, attention_dropout)
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
            h = self.self_attn.output(cache.self_attention(layer_idx, q, k, v))
        else:
            h, _ = self.self_attn.attend(q, k, v, is_causal=x.size(1) > 1)
        x = self.residual(x, h, self.self_attn_layer_norm)

        h = self.pre_norm(x, self.encoder_attn_layer_norm)
        h, attn = self.encoder_attn(h, enc_k, enc_v, enc_mask, need_weights=need_attn)
        x = self.residual(x, h, self.encoder_attn_layer_norm)
        return self.ffn(x), attn
