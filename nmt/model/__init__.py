"""The Transformer: config.py (ModelConfig), layers.py (attention, FFN, layers, positions),
cache.py (DecoderCache for incremental decoding), transformer.py (Transformer).

Kept empty so that importing `nmt.model.config` (as the CLI does) does not import torch.
"""
