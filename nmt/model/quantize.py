"""int8 inference on the CPU: linear layers with int8 weights and torch's int8 GEMMs.

`quantize_int8(model)` turns every linear layer of a Transformer (the attention
projections, the fused q/k/v and k/v ones of FastKernels included, the FFN, the output
projection) into an `Int8Linear`, in place, at load time: no file format of its own.
Embeddings, LayerNorms, attention and the softmax stay fp32.

Shapes: M rows (tokens), K input features, N output features.

How a layer computes y = x W^T + b:
- W is quantized once, per output channel and symmetric: W[n] ~ scale[n] * Wq[n], Wq int8.
- x is quantized at every call, per row and symmetric, as CTranslate2 does: row m is
  divided by its largest magnitude r[m], so that every row spans [-1, 1]; the int8 GEMM
  multiplies the quantized rows in int32 and dequantizes; the result is scaled back by
  r[m] and the bias added. The integer products are exact and the rest is elementwise,
  so a row's result depends on that row alone: int8 translations never depend on the
  batch, as fp32 ones.
- Two GEMMs, chosen per layer by `int8_gemm` (NMT_INT8_GEMM=onednn|fbgemm names one for
  every layer instead):
  - "fbgemm" (quantized::linear_dynamic), every layer but the output projection: it picks
    one quantization range for the whole [M,K] input (per tensor), so an extra anchor row
    holding 1 and -1 fixes that range at [-1, 1] for every batch. With VNNI (AVX512-VNNI
    or AMX) the rows get 8 bits; on AVX2 without VNNI, u8 x s8 pairs are summed into
    saturating int16, so they get 7 bits (reduce_range) and no sum overflows.
  - "onednn" (oneDNN's qlinear, torch.ops.onednn.qlinear_pointwise), the output
    projection on CPUs with VNNI: the rows are rounded to 8 bits here (-127..127 of
    r[m] / 127, stored as unsigned bytes with zero point 128) at a scale fixed here. On a
    Zen 4 EPYC the recipe's output layer ran 1.2x (64 rows) to 1.8x (320) as fast as on
    fbgemm, while on the small layers the quantizing here cost more than it saved
    (docs/journal/2026-11-27-int8-onednn-vnni.md). Without VNNI it would
    saturate, as above.
"""

from __future__ import annotations

import warnings
from collections.abc import Callable
from typing import TypeVar

import torch
from torch import Tensor, nn

from nmt.model.kernels import FastKernels
from nmt.model.swap import gemm_named_by, swap_linear_layers
from nmt.runtime import check_precision, int8_engine

WEIGHT_LEVELS = 127  # symmetric int8 weights: -127..127 times the channel's scale
ACTIVATION_LEVELS = 127  # onednn: a row's elements round to -127..127 of its magnitude / 127
ONEDNN_ZERO_POINT = 128  # onednn: those levels stored as unsigned bytes 1..255
INT8_GEMMS = ("onednn", "fbgemm")
GEMM_ENV = "NMT_INT8_GEMM"  # names the GEMM instead of the automatic choice (int8_gemm)


def cpu_has_vnni() -> bool:
    """AVX512-VNNI (every AMX CPU has it too): u8 x s8 products summed in int32, where
    AVX2's instructions saturate their pair sums in int16."""
    return bool(getattr(torch.cpu, "_is_vnni_supported", lambda: False)())


REDUCE_RANGE = not cpu_has_vnni()  # fbgemm: 7-bit activations where int16 would saturate


def onednn_int8_available() -> bool:
    """Whether oneDNN's int8 GEMM runs here without int16 saturation: a CPU with VNNI and
    a torch with the onednn qlinear op."""
    return hasattr(torch.ops.onednn, "qlinear_pointwise") and cpu_has_vnni()


def int8_gemm(output_layer: bool = False) -> str:
    """The GEMM of a new Int8Linear: NMT_INT8_GEMM if set; else "onednn" for the output
    projection (`output_layer`) where it is available, "fbgemm" for everything else."""
    chosen = gemm_named_by(GEMM_ENV, INT8_GEMMS, "int8", _onednn_int8_missing)
    if not chosen:
        return "onednn" if output_layer and onednn_int8_available() else "fbgemm"
    return chosen


def _onednn_int8_missing() -> str:
    if onednn_int8_available():
        return ""
    return "needs a CPU with VNNI (AVX512-VNNI or AMX), where its u8 x s8 products cannot saturate"


def _quantized_call(fn: Callable[[], object]) -> object:
    """Run fn with torch's deprecation warnings about quantized tensors silenced: the
    kernels are what int8 inference is for, the warning is for torch.ao's users."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*quantiz.*", category=UserWarning)
        warnings.filterwarnings("ignore", category=DeprecationWarning)
        return fn()


class Int8Linear(nn.Module):
    """An inference-only nn.Linear with int8 weights (see the module docstring); `gemm`
    is one of INT8_GEMMS (default: int8_gemm()). It SelectsRows (nmt.model.linear)."""

    weight_int8: Tensor  # [N,K] int8
    scale: Tensor  # [N] fp32
    bias: Tensor | None  # [N] fp32
    anchor: Tensor | None  # [K]: 1, 0, ..., 0, -1 (fbgemm); None (onednn)

    def __init__(
        self, weight_int8: Tensor, scale: Tensor, bias: Tensor | None, gemm: str | None = None
    ):
        """weight_int8 [N,K] int8, scale [N] fp32 (W ~ scale[:, None] * weight_int8),
        bias [N] fp32 or None."""
        super().__init__()
        self.out_features, self.in_features = weight_int8.shape
        self.gemm = gemm or int8_gemm()
        if self.gemm not in INT8_GEMMS:
            raise ValueError(f"gemm={self.gemm!r}: use one of {INT8_GEMMS}")
        self.register_buffer("weight_int8", weight_int8)
        self.register_buffer("scale", scale)
        self.register_buffer("bias", bias)
        zeros = torch.zeros(self.out_features, dtype=torch.long)
        self._zero_points = zeros  # [N] the weights' (symmetric)
        anchor = None  # fbgemm only: the row that fixes its range (_fbgemm)
        if self.gemm == "onednn":
            # oneDNN's blocked layout of the weights
            self._packed = torch.ops.onednn.qlinear_prepack(weight_int8, None)
        else:
            anchor = torch.zeros(self.in_features)
            anchor[0], anchor[-1] = 1.0, -1.0

            def pack() -> object:
                q = torch._make_per_channel_quantized_tensor(weight_int8, scale.double(), zeros, 0)
                return torch.ops.quantized.linear_prepack(q, None)

            self._packed = _quantized_call(pack)  # fbgemm's packed layout of the weights
        self.register_buffer("anchor", anchor, persistent=False)  # [K] | None

    @classmethod
    def from_float(
        cls, weight: Tensor, bias: Tensor | None = None, gemm: str | None = None
    ) -> Int8Linear:
        """Quantize fp32 weights [N,K] per output channel (symmetric, round to nearest)."""
        weight = weight.detach().float().cpu()
        scale = weight.abs().amax(dim=1).clamp(min=1e-12) / WEIGHT_LEVELS  # [N]
        q = torch.round(weight / scale[:, None]).clamp_(-WEIGHT_LEVELS, WEIGHT_LEVELS)
        b = None if bias is None else bias.detach().float().cpu().clone()
        return cls(q.to(torch.int8), scale, b, gemm)

    @classmethod
    def from_linear(cls, linear: nn.Linear, gemm: str | None = None) -> Int8Linear:
        return cls.from_float(linear.weight, linear.bias, gemm)

    def rows(self, index: Tensor) -> Int8Linear:
        """The layer computing only outputs `index` [N'] (a vocabulary shortlist)."""
        bias = None if self.bias is None else self.bias[index]
        return Int8Linear(self.weight_int8[index], self.scale[index], bias, self.gemm)

    def forward(self, x: Tensor) -> Tensor:
        """x [...,K] fp32 -> [...,N] fp32."""
        flat = x.reshape(-1, self.in_features)  # [M,K]
        magnitude = flat.abs().amax(dim=1, keepdim=True).clamp_(min=1e-30)  # [M,1]
        if self.gemm == "onednn":
            out = self._onednn(flat, magnitude)
        else:
            out = self._fbgemm(flat, magnitude)
        if self.bias is None:
            out.mul_(magnitude)
        else:
            torch.addcmul(self.bias, out, magnitude, out=out)
        return out.view(*x.shape[:-1], self.out_features)

    def _onednn(self, flat: Tensor, magnitude: Tensor) -> Tensor:
        """flat [M,K] fp32, its rows' magnitudes [M,1] -> [M,N] fp32 of the rows scaled to
        [-1, 1]: 8-bit rows at a scale fixed here, so no row sees another."""
        levels = flat * (ACTIVATION_LEVELS / magnitude)  # [M,K] within -127..127
        rows = levels.round_().add_(ONEDNN_ZERO_POINT).to(torch.uint8)  # [M,K] 1..255
        return torch.ops.onednn.qlinear_pointwise(
            rows, 1.0 / ACTIVATION_LEVELS, ONEDNN_ZERO_POINT, self._packed, self.scale,
            self._zero_points, None, 1.0, 0, torch.float32, "none", [], "",
        )  # fmt: skip

    def _fbgemm(self, flat: Tensor, magnitude: Tensor) -> Tensor:
        """As _onednn, on fbgemm's dynamic linear (which picks its range per call)."""
        m = flat.size(0)
        rows = flat.new_empty(m + 1, self.in_features)  # [M+1,K]: the rows, then the anchor
        torch.div(flat, magnitude, out=rows[:m])
        assert self.anchor is not None
        rows[m].copy_(self.anchor)  # the range is [-1, 1], whatever the batch
        return torch.ops.quantized.linear_dynamic(rows, self._packed, REDUCE_RANGE)[:m]  # [M,N]

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, int8 ({self.gemm})"
        )


ModelT = TypeVar("ModelT", bound=nn.Module)


def quantize_int8(model: ModelT, gemm: str | None = None) -> ModelT:
    """Every nn.Linear of `model` (in eval mode, on the CPU) becomes an Int8Linear, in
    place, on `gemm` (default: int8_gemm's choice for each: the decoder's output projection
    is the output layer); attention modules with fused projections (FastKernels) get int8
    versions of those. Returns the model. Inference only: the int8 layers have no
    gradients."""
    check_precision("int8", torch.device("cpu"), inference=True)
    engine = int8_engine()
    assert engine is not None
    torch.backends.quantized.engine = engine
    output_gemm = gemm or int8_gemm(output_layer=True)  # (an NMT_INT8_GEMM error: here, once)
    gemm = gemm or int8_gemm()
    kernels = getattr(model, "kernels", None)
    if isinstance(kernels, FastKernels):  # int8 rounding would amplify padding's 1e-7
        kernels.rows_alone = True

    def make(weight: Tensor, bias: Tensor | None, output_layer: bool) -> Int8Linear:
        return Int8Linear.from_float(weight, bias, output_gemm if output_layer else gemm)

    swap_linear_layers(model, make)
    return model.eval()
