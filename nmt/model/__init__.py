"""The Transformer: config.py (ModelConfig), layers.py (attention, FFN, layers, positions, and
the plain `Kernels` they compute through), kernels.py (FastKernels: faster versions of those
operations, the default), cache.py (DecoderCache for incremental decoding), transformer.py
(Transformer).

Kept empty so that importing `nmt.model.config` (as the CLI does) does not import torch.
"""
