"""int8 inference on the CPU: linear layers with int8 weights and torch's fbgemm kernels.

`quantize_int8(model)` turns every linear layer of a Transformer (the attention
projections, the fused q/k/v and k/v ones of FastKernels included, the FFN, the output
projection) into an `Int8Linear`, in place, at load time: no file format of its own.
Embeddings, LayerNorms, attention and the softmax stay fp32.

Shapes: M rows (tokens), K input features, N output features.

How a layer computes y = x W^T + b:
- W is quantized once, per output channel and symmetric: W[n] ~ scale[n] * Wq[n], Wq int8.
- x is quantized at every call, per row and symmetric, as CTranslate2 does: row m is
  divided by its largest magnitude r[m], so that every row spans [-1, 1]; fbgemm's dynamic
  linear (quantized::linear_dynamic) quantizes the rows to 8-bit integers, multiplies
  in int32 and dequantizes; the result is scaled back by r[m] and the bias added.
- fbgemm picks one quantization range for the whole [M,K] input (per tensor). Had it
  seen the raw rows, a sentence's rounding would depend on the other sentences of its
  batch. An extra anchor row holding 1 and -1 fixes that range at [-1, 1] for every
  batch, so a row's result depends on that row alone: int8 translations never depend on
  the batch, as fp32 ones (the integer products are exact, the rest is elementwise).
- On AVX2 without VNNI, fbgemm multiplies u8 x s8 pairs into saturating int16 sums; 7-bit
  activations (reduce_range) keep every pair sum in range.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from functools import partial
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.kernels import FastKernels
from nmt.runtime import check_precision, int8_engine

WEIGHT_LEVELS = 127  # symmetric int8 weights: -127..127 times the channel's scale
REDUCE_RANGE = True  # 7-bit activations: no int16 saturation on AVX2 (see the docstring)


def _quantized_call(fn: Callable[[], object]) -> object:
    """Run fn with torch's deprecation warnings about quantized tensors silenced: the
    kernels are what int8 inference is for, the warning is for torch.ao's users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return fn()


class Int8Linear(nn.Module):
    """An inference-only nn.Linear with int8 weights (see the module docstring)."""

    weight_int8: Tensor  # [N,K] int8
    scale: Tensor  # [N] fp32
    bias: Tensor | None  # [N] fp32
    anchor: Tensor  # [K]: 1, 0, ..., 0, -1

    def __init__(self, weight_int8: Tensor, scale: Tensor, bias: Tensor | None):
        """weight_int8 [N,K] int8, scale [N] fp32 (W ~ scale[:, None] * weight_int8),
        bias [N] fp32 or None."""
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        zeros = torch.zeros(self.out_features, dtype=torch.long)

        def pack() -> object:
            q = torch._make_per_channel_quantized_tensor(weight_int8, scale.double(), zeros, 0)
            return torch.ops.quantized.linear_prepack(q, None)

        self._packed = _quantized_call(pack)  # fbgemm's packed layout of the weights
        anchor = torch.zeros(self.in_features)
        anchor[0], anchor[-1] = 1.0, -1.0
        self.register_buffer("anchor", anchor, persistent=False)  # [K]

    @classmethod
    def from_float(cls, weight: Tensor, bias: Tensor | None = None) -> Int8Linear:
        """Quantize fp32 weights [N,K] per output channel (symmetric, round to nearest)."""
        weight = weight.detach().float().cpu()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / WEIGHT_LEVELS  # [N]
        q = torch.round(weight / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS)
        b = None if bias is None else bias.detach().float().cpu().clone()
        return cls(q.to(torch.int8), scale, b)

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> Int8Linear:
        return cls.from_float(linear.weight, linear.bias)

    def rows(self, index: Tensor) -> Int8Linear:
        """The layer computing only outputs `index` [N'] (a vocabulary shortlist)."""
        bias = None if self.bias is None else self.bias[index]
        return Int8Linear(self.weight_int8[index], self.scale[index], bias)

    def forward(self, x: Tensor) -> Tensor:
        """x [...,K] fp32 -> [...,N] fp32."""
        flat = x.reshape(-1, self.in_features)  # [M,K]
        m = flat.size(0)
        magnitude = flat.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)  # [M,1]
        rows = flat.new_empty(m + 1, self.in_features)  # [M+1,K]: the rows, then the anchor
        torch.div(flat, magnitude, out=rows[:m])
        rows[m].copy_(self.anchor)  # the range is [-1, 1], whatever the batch
        out = torch.ops.quantized.linear_dynamic(rows, self._packed, REDUCE_RANGE)[:m]  # [M,N]
        if self.bias is None:
            out.mul_(magnitude)
        else:
            torch.addcmul(self.bias, out, magnitude, out=out)
        return out.view(*x.shape[:-1], self.out_features)

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, int8"


def linear_rows(layer: nn.Module, index: Tensor) -> Callable[[Tensor], Tensor]:
    """`layer` (nn.Linear or Int8Linear) computing only its outputs `index` [N']: the
    output projection over a shortlist of the vocabulary."""
    if isinstance(layer, Int8Linear):
        return layer.rows(index)
    assert isinstance(layer, nn.Linear)
    weight = layer.weight.detach()[index]  # [N',K]
    bias = None if layer.bias is None else layer.bias.detach()[index]
    return partial(F.linear, weight=weight, bias=bias)


ModelT = TypeVar("ModelT", bound=nn.Module)


def quantize_int8(model: ModelT) -> ModelT:
    """Every nn.Linear of `model` (in eval mode, on the CPU) becomes an Int8Linear, in
    place; attention modules with fused projections (FastKernels) get int8 versions of
    those. Returns the model. Inference only: the int8 layers have no gradients."""
    check_precision("int8", torch.device("cpu"), inference=True)
    engine = int8_engine()
    assert engine is not None
    torch.backends.quantized.engine = engine
    kernels = getattr(model, "kernels", None)
    if isinstance(kernels, FastKernels):  # int8 rounding would amplify padding's 1e-7
        kernels.rows_alone = True
    for module in list(model.modules()):
        fuse = getattr(module, "quantize_fused_projections", None)
        if fuse is not None:  # before its linear layers are replaced below
            fuse(Int8Linear.from_float)
    for module in list(model.modules()):
        for name, child in list(module.named_children()):
            # a layer of one input feature has no second column for the anchor row
            if isinstance(child, nn.Linear) and child.in_features > 1:
                setattr(module, name, Int8Linear.from_linear(child))
    return model.eval()
