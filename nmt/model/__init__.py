"""The Transformer: tensors in, tensors out.

config.py       ModelConfig: the hyperparameters, with fairseq's names
layers.py       attention, FFN, layers, positions, and the plain Kernels they compute through
kernels.py      FastKernels: faster versions of those operations (the default)
cache.py        DecoderCache: what incremental decoding keeps between steps
transformer.py  Transformer: the encoder, the decoder and the output layer
linear.py       the protocol every linear-layer kind shares (a shortlist's rows)
swap.py         swapping a model's linear layers for inference-only ones
quantize.py     int8 CPU inference: Int8Linear, quantize_int8
packed.py       fp32 CPU inference on oneDNN's GEMM: PackedLinear, pack_fp32

Kept empty so that importing `nmt.model.config` (as the CLI does) does not import torch.
"""
