"""The encoder-decoder Transformer with fairseq TransformerModel's semantics.

Shape legend: B batch, S source length, T target length (only the new tokens when
decoding with a cache), D embed_dim, V target vocabulary size.

Parameter names follow fairseq's (`encoder.layers.0.self_attn.q_proj.weight`,
`decoder.output_projection.weight`, ...), so a fairseq checkpoint converts by renaming
little or nothing. Batches are right-padded: token t of every row sits at position t.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import NamedTuple, cast

from torch import Tensor, nn

from nmt.errors import NmtError
from nmt.model.cache import CacheMemory, DecoderCache
from nmt.model.config import ModelConfig
from nmt.model.kernels import FastKernels
from nmt.model.layers import (
    Kernels,
    LearnedPositionalEmbedding,
    SinusoidalPositionalEmbedding,
    TransformerDecoderLayer,
    TransformerEncoderLayer,
    token_embedding,
)
from nmt.model.linear import linear_rows
from nmt.vocab import PAD


class EncoderOut(NamedTuple):
    """What the decoder reads from the encoder."""

    out: Tensor  # [B,S,D] final encoder states
    padding_mask: Tensor  # [B,S] bool, True = pad
    padded: bool | None = None  # any row padded? False: attention needs no mask; None: unknown

    def reorder(self, index: Tensor) -> EncoderOut:
        """Rows index[i] of both tensors (index [B'] long), e.g. to expand to beams."""
        # see DecoderCache.reorder; rows of an unpadded batch stay unpadded
        return EncoderOut(self.out[index], self.padding_mask[index], self.padded)


def _positions(cfg: ModelConfig, pad_id: int, max_positions: int, key: str) -> nn.Module:
    if cfg.learned_pos:
        return LearnedPositionalEmbedding(cfg.embed_dim, pad_id, max_positions, key)
    return SinusoidalPositionalEmbedding(cfg.embed_dim, pad_id, max_positions)


def _layer_args(cfg: ModelConfig, kernels: Kernels) -> dict:
    return dict(
        embed_dim=cfg.embed_dim,
        ffn_dim=cfg.ffn_dim,
        heads=cfg.attention_heads,
        dropout=cfg.dropout,
        attention_dropout=cfg.attention_dropout,
        activation_dropout=cfg.activation_dropout,
        activation_fn=cfg.activation_fn,
        normalize_before=cfg.normalize_before,
        kernels=kernels,
    )


class TransformerEncoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, pad_id: int, kernels: Kernels):
        super().__init__()
        self.kernels = kernels
        self.pad_id = pad_id
        self.dropout = cfg.dropout
        self.embed_scale = math.sqrt(cfg.embed_dim) if cfg.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = _positions(
            cfg, pad_id, cfg.max_source_positions, "model.max_source_positions"
        )
        self.layernorm_embedding = nn.LayerNorm(cfg.embed_dim) if cfg.layernorm_embedding else None
        self.layers = nn.ModuleList(
            TransformerEncoderLayer(**_layer_args(cfg, kernels)) for _ in range(cfg.encoder_layers)
        )
        self.layer_norm = nn.LayerNorm(cfg.embed_dim) if cfg.normalize_before else None

    def forward(self, src_tokens: Tensor, padded: bool | None = None) -> EncoderOut:
        """src_tokens [B,S] (right-padded) -> EncoderOut; `padded`: see Transformer.encode."""
        padding_mask = src_tokens.eq(self.pad_id)  # [B,S]
        x = self.embed_scale * self.embed_tokens(src_tokens)  # [B,S,D]
        x = x + self.embed_positions(0, src_tokens.size(1))  # [S,D] broadcast over B
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.kernels.dropout(x, self.dropout, self.training)
        mask = self.kernels.attention_mask(padding_mask, padded)  # [B,1,1,S] | None
        for layer in self.layers:
            x = layer(x, mask)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        return EncoderOut(x, padding_mask, padded)


class TransformerDecoder(nn.Module):
    def __init__(self, cfg: ModelConfig, embed_tokens: nn.Embedding, pad_id: int, kernels: Kernels):
        super().__init__()
        self.kernels = kernels
        self.dropout = cfg.dropout
        self.embed_scale = math.sqrt(cfg.embed_dim) if cfg.scale_embedding else 1.0
        self.embed_tokens = embed_tokens
        self.embed_positions = _positions(
            cfg, pad_id, cfg.max_target_positions, "model.max_target_positions"
        )
        self.layernorm_embedding = nn.LayerNorm(cfg.embed_dim) if cfg.layernorm_embedding else None
        self.layers = nn.ModuleList(
            TransformerDecoderLayer(**_layer_args(cfg, kernels)) for _ in range(cfg.decoder_layers)
        )
        self.layer_norm = nn.LayerNorm(cfg.embed_dim) if cfg.normalize_before else None
        vocab_size, dim = embed_tokens.weight.shape
        self.output_projection = nn.Linear(dim, vocab_size, bias=False)
        if cfg.shares_output_embed:
            self.output_projection.weight = embed_tokens.weight
        else:
            nn.init.normal_(self.output_projection.weight, mean=0.0, std=dim**-0.5)

    def forward(
        self,
        prev_tokens: Tensor,
        enc: EncoderOut,
        cache: DecoderCache | None = None,
        attn_layer: int | None = None,
        features_only: bool = False,
        output: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """See `Transformer.decode`; features_only: return the hidden states [B,T,D]
        instead of the logits; `output`: the output layer to use instead of
        output_projection (Transformer.output_layer)."""
        start = 0 if cache is None else cache.length
        length = prev_tokens.size(1)
        x = self.embed_scale * self.embed_tokens(prev_tokens)  # [B,T,D]
        x = x + self.embed_positions(start, length)  # [T,D] broadcast over B
        if self.layernorm_embedding is not None:
            x = self.layernorm_embedding(x)
        x = self.kernels.dropout(x, self.dropout, self.training)

        if cache is None:
            enc_mask = self.kernels.attention_mask(enc.padding_mask, enc.padded)
        else:
            if not cache.has_encoder_kv:
                cache.enc_mask = self.kernels.attention_mask(enc.padding_mask, enc.padded)
            enc_mask = cache.enc_mask
        want = self._attn_layer_index(attn_layer)

        attn = None
        layers = cast("list[TransformerDecoderLayer]", self.layers)
        for i, layer in enumerate(layers):
            if cache is not None and cache.has_encoder_kv:
                enc_k, enc_v = cache.encoder_kv(i)
            else:
                enc_k, enc_v = layer.encoder_attn.project_kv(enc.out)  # [B,H,S,Dh] each
                if cache is not None:
                    cache.set_encoder_kv(i, enc_k, enc_v)
            x, layer_attn = layer(x, enc_k, enc_v, enc_mask, cache, i, need_attn=i == want)
            if layer_attn is not None:
                attn = layer_attn.float()
        if cache is not None:
            cache.advance(length)
        if self.layer_norm is not None:
            x = self.layer_norm(x)
        if features_only:
            return x, attn  # [B,T,D], [B,T,S] | None
        project = self.output_projection if output is None else output
        return project(x), attn  # [B,T,V] (or [B,T,V'] over a shortlist), [B,T,S] | None

    def _attn_layer_index(self, attn_layer: int | None) -> int | None:
        if attn_layer is None:
            return None
        n = len(self.layers)
        if not -n <= attn_layer < n:
            raise NmtError(
                f"attention layer {attn_layer}: the decoder has {n} layers; use "
                f"0..{n - 1}, or -1 for the last"
            )
        return attn_layer % n


class Transformer(nn.Module):
    """Encoder-decoder Transformer (docs/ARCHITECTURE.md, "Model")."""

    def __init__(
        self,
        cfg: ModelConfig,
        src_vocab_size: int,
        tgt_vocab_size: int,
        pad_id: int = PAD,
        *,
        kernels: Kernels | None = None,
    ):
        """`kernels`: how the layers compute dropout, attention and the q/k/v projections;
        FastKernels() by default (nmt.model.kernels), Kernels() for the plain textbook
        operations. Either computes the same function with the same parameters."""
        super().__init__()
        cfg.validate(src_vocab_size, tgt_vocab_size, pad_id)
        self.cfg = cfg
        self.pad_id = pad_id
        self.kernels = FastKernels() if kernels is None else kernels
        src_embed = token_embedding(src_vocab_size, cfg.embed_dim, pad_id)
        tgt_embed = (
            src_embed
            if cfg.share_all_embeddings
            else token_embedding(tgt_vocab_size, cfg.embed_dim, pad_id)
        )
        self.encoder = TransformerEncoder(cfg, src_embed, pad_id, self.kernels)
        self.decoder = TransformerDecoder(cfg, tgt_embed, pad_id, self.kernels)

    def encode(self, src_tokens: Tensor, padded: bool | None = None) -> EncoderOut:
        """src_tokens [B,S] right-padded with pad_id -> EncoderOut(out [B,S,D], padding_mask).

        `padded` says whether any row holds padding, when the caller knows it from the
        host (the lengths): False lets attention run without a mask, so that SDPA may pick
        its flash kernels, and on a GPU finding it out here would wait for the device.
        None: unknown (the kernels check on a CPU, and mask on a GPU).
        """
        return self.encoder(src_tokens, padded)

    def decode(
        self,
        prev_tokens: Tensor,
        enc: EncoderOut,
        cache: DecoderCache | None = None,
        attn_layer: int | None = None,
        output: Callable[[Tensor], Tensor] | None = None,
    ) -> tuple[Tensor, Tensor | None]:
        """prev_tokens [B,T] -> (logits [B,T,V], attn [B,T,S] float or None).

        Without a cache, prev_tokens is the whole decoder input ([EOS] + target[:-1]) and
        attention is causal. With a cache, prev_tokens holds only the new token(s): their
        positions continue from `cache.length`, their keys/values are appended, the
        encoder's keys/values are projected on the first call and reused afterwards (`enc`
        is not read again), and only the new positions are projected to the vocabulary.
        `attn_layer` (negative counts from the end) asks for that decoder layer's
        encoder-decoder attention, averaged over heads. `output`: the output layer, when
        not the whole vocabulary's (`output_layer(vocab)`: logits [B,T,V'] of a shortlist).
        """
        return self.decoder(prev_tokens, enc, cache, attn_layer, output=output)

    def output_layer(self, vocab: Tensor | None = None) -> Callable[[Tensor], Tensor]:
        """The output projection [..,D] -> [..,V], or with `vocab` [V'] (target ids, a
        shortlist) the one computing only those logits: [..,D] -> [..,V'] (for decode's
        `output`; built once per batch, it holds those rows of the weights)."""
        projection = self.decoder.output_projection
        if vocab is None or vocab.numel() == self.decoder.embed_tokens.num_embeddings:
            return projection  # (a shortlist of every id is the whole vocabulary, in order)
        return linear_rows(projection, vocab)

    def forward(
        self,
        src_tokens: Tensor,
        prev_tokens: Tensor,
        features_only: bool = False,
        src_padded: bool | None = None,
    ) -> Tensor:
        """Training: src_tokens [B,S], prev_tokens [B,T] -> logits [B,T,V], or with
        features_only the decoder's last hidden states [B,T,D], which training feeds to
        nmt.training.loss.output_layer_loss together with `output_weight`. `src_padded`:
        `padded` of encode (the target side needs no mask: its attention is causal, and
        padded positions are not in the loss)."""
        enc = self.encoder(src_tokens, src_padded)
        out, _ = self.decoder(prev_tokens, enc, features_only=features_only)
        return out

    @property
    def output_weight(self) -> Tensor:
        """[V,D] the output projection (tied to the target embeddings when shared)."""
        return self.decoder.output_projection.weight

    def new_cache(
        self, group: int = 1, capacity: int = 0, memory: CacheMemory | None = None
    ) -> DecoderCache:
        """An empty cache for incremental decoding of one batch: see DecoderCache."""
        return DecoderCache(len(self.decoder.layers), group, capacity, memory)
