"""ModelConfig: the Transformer's hyperparameters, mirroring fairseq's TransformerModel.

The field names are a contract (docs/ARCHITECTURE.md): checkpoints store this dataclass as
a dict, and the presets in configs/model/ set exactly these keys under `model:`.
"""

from __future__ import annotations

from dataclasses import dataclass

from nmt.errors import NmtError, choice_error, option_error

ACTIVATIONS = ("relu", "gelu")


@dataclass
class ModelConfig:
    """Encoder-decoder Transformer; the defaults are the paper's base model."""

    embed_dim: int = 512  # d_model: width of embeddings, attention and residual stream
    ffn_dim: int = 2048  # inner width of the position-wise feed-forward network
    attention_heads: int = 8  # heads per attention layer; must divide embed_dim
    encoder_layers: int = 6  # depth of the encoder stack
    decoder_layers: int = 6  # depth of the decoder stack
    dropout: float = 0.1  # on embeddings and on every sub-layer output before the residual add
    attention_dropout: float = 0.0  # on attention probabilities
    activation_dropout: float = 0.0  # inside the FFN, after the activation
    activation_fn: str = "relu"  # FFN activation: "relu" or "gelu" (exact, erf-based)
    normalize_before: bool = False  # pre-norm (LayerNorm before each sub-layer, final LayerNorm)
    max_source_positions: int = 1024  # longest source (tokens incl. eos) the model accepts
    max_target_positions: int = 1024  # longest target prefix the decoder accepts
    learned_pos: bool = False  # learned position embeddings instead of fixed sinusoids
    scale_embedding: bool = True  # multiply token embeddings by sqrt(embed_dim)
    layernorm_embedding: bool = False  # LayerNorm on token+position embeddings
    share_decoder_input_output_embed: bool = False  # tie decoder embeddings and output layer
    share_all_embeddings: bool = False  # one matrix for encoder, decoder and output (joint vocab)

    def validate(self, src_vocab_size: int, tgt_vocab_size: int, pad_id: int) -> None:
        """Raise NmtError naming the `model.<key>` that cannot build a model."""
        positive = (
            "embed_dim",
            "ffn_dim",
            "attention_heads",
            "encoder_layers",
            "decoder_layers",
            "max_source_positions",
            "max_target_positions",
        )
        for key in positive:
            value = getattr(self, key)
            if not isinstance(value, int) or value < 1:
                raise option_error(
                    f"model.{key}", value, "not a positive integer", "set it to 1 or more"
                )
        if self.embed_dim % self.attention_heads:
            raise option_error(
                "model.attention_heads",
                self.attention_heads,
                f"does not divide model.embed_dim={self.embed_dim}",
                "choose a divisor of embed_dim",
            )
        if not self.learned_pos and self.embed_dim < 4:
            raise option_error(
                "model.embed_dim",
                self.embed_dim,
                "too small for sinusoidal positions",
                "use 4 or more, or model.learned_pos=true",
            )
        for key in ("dropout", "attention_dropout", "activation_dropout"):
            value = getattr(self, key)
            if not 0.0 <= value < 1.0:
                raise option_error(
                    f"model.{key}", value, "not a probability", "use a value in [0, 1)"
                )
        if self.activation_fn not in ACTIVATIONS:
            raise choice_error("model.activation_fn", self.activation_fn, ACTIVATIONS)
        for side, size in (("source", src_vocab_size), ("target", tgt_vocab_size)):
            if size <= pad_id:
                raise NmtError(
                    f"{side} vocabulary size {size} does not contain the pad id "
                    f"{pad_id}; check the data dir's meta.json"
                )
        if self.share_all_embeddings and src_vocab_size != tgt_vocab_size:
            raise option_error(
                "model.share_all_embeddings",
                self.share_all_embeddings,
                f"needs a joint vocabulary, but the source has {src_vocab_size} entries and "
                f"the target {tgt_vocab_size}",
                "set model.share_all_embeddings=false or preprocess with a joint vocab",
            )

    @property
    def shares_output_embed(self) -> bool:
        """share_all_embeddings implies the decoder input/output tie, as in fairseq."""
        return self.share_decoder_input_output_embed or self.share_all_embeddings
