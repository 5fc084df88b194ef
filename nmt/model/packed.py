"""fp32 inference on the CPU through oneDNN's GEMM, on weights packed once at load time.

torch multiplies fp32 matrices with MKL, whose fast kernels check for an Intel CPU: on an
AMD CPU with AVX-512 it runs its AVX2 ones, at half the width. oneDNN (the op torch.compile's
CPU backend emits for a linear layer, torch.ops.mkldnn._linear_pointwise) uses AVX-512 on
any vendor, and reads weights reordered once into its blocked layout. On a 2-vCPU Zen 5
EPYC one thread multiplied 50 rows through a 192x768 layer 2.1x, and through an 8,000-word
output layer 2.5x, as fast as F.linear (docs/journal/2026-11-28-fp32-onednn-zen5.md).
CTranslate2 chooses the same way: MKL on Intel CPUs, oneDNN elsewhere.

oneDNN costs a few microseconds more per call, which MKL undercuts on the smallest
products (a single row through a 192x192 layer): a PackedLinear sends a call of M rows
to oneDNN when M*K*N reaches ONEDNN_MIN_MACS and to F.linear below. The two round
differently (to fp32's ~1e-7), as any two GEMMs do; translations stay fp32 translations.

oneDNN JIT-compiles a kernel for each shape it multiplies and keeps it in two caches
(oneDNN's primitive cache and ideep's, 1,024 entries each): a search's products have M =
sentences x beam rows, shrinking as sentences finish, and the encoder's M = batch x
source length, so nearly every batch brings new shapes, and a server's memory grew with
the kernels of every shape it had met, never returned. A PackedLinear therefore pads M
up to a bucket (row_bucket: 8 per doubling, at most 1/8 more rows), which bounds the
distinct shapes by the logarithm of the largest M and compiles fewer kernels (capping
the caches instead would compile a shape again each time it came back). A row's outputs
are its own dot products: the padded rows (zeros, sliced off) never reach the others,
and only the kernel oneDNN picks for the padded shape could round differently from the
exact shape's, within fp32's rounding (tests/unit/test_packed.py).

`pack_fp32(model)` swaps every linear layer of a Transformer for a PackedLinear, in place,
where `fp32_gemm()` says "onednn" (NMT_FP32_GEMM=onednn|torch overrides the choice).
Training never sees these layers: they are inference only.

Shapes: M rows (tokens), K input features, N output features.
"""

from __future__ import annotations

from functools import cache
from typing import TypeVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from nmt.model.swap import gemm_named_by, swap_linear_layers

FP32_GEMMS = ("onednn", "torch")
FP32_GEMM_ENV = "NMT_FP32_GEMM"  # names the GEMM instead of the automatic choice (fp32_gemm)
# Multiply-adds from which a call goes to oneDNN. On the Zen 5 EPYC oneDNN won from 16-32
# rows of a 192x192 layer, 4-8 rows of 192x576 and 192x768, 1 row of 192x8000; this sends
# a 192x192 layer there from 15 rows, 192x768 from 4, the output layer always.
ONEDNN_MIN_MACS = 1 << 19
# Rows a call to oneDNN is padded up to (row_bucket) keep this many bits below the leading
# one: 2**3 = 8 buckets per doubling of M, so a product computes at most 1/8 more rows
# than it needs, and M up to 2**16 meets at most 16 + 8 * 12 shapes per layer shape.
ROW_BUCKET_BITS = 3


def row_bucket(rows: int) -> int:
    """The row count a oneDNN call of `rows` rows computes: `rows` rounded up to keep
    ROW_BUCKET_BITS + 1 significant bits (1..16 stay as they are; 17 -> 18, 100 -> 104)."""
    step = 1 << max(0, rows.bit_length() - 1 - ROW_BUCKET_BITS)
    return -(-rows // step) * step


@cache
def onednn_fp32_available() -> bool:
    """Whether this torch has oneDNN's fp32 linear op with packed weights, and it runs."""
    ops = torch.ops.mkldnn
    if not torch.backends.mkldnn.is_available():
        return False
    if not (hasattr(ops, "_linear_pointwise") and hasattr(ops, "_reorder_linear_weight")):
        return False
    try:  # a build may register the op without the kernels for this CPU
        weight = torch.ones(3, 2)
        out = ops._linear_pointwise(
            torch.ones(1, 2), ops._reorder_linear_weight(weight, None), None, "none", [], ""
        )
    except RuntimeError:
        return False
    return bool(torch.equal(out, torch.full((1, 3), 2.0)))


def cpu_vendor() -> str:
    """The CPU's vendor string (GenuineIntel, AuthenticAMD, ...), "" where unknown."""
    try:
        with open("/proc/cpuinfo", encoding="utf-8", errors="replace") as info:
            for line in info:
                if line.startswith("vendor_id"):
                    return line.split(":", 1)[1].strip()
    except OSError:
        pass
    return ""


def fp32_gemm() -> str:
    """The GEMM of fp32 CPU inference: NMT_FP32_GEMM if set; else "onednn" on a non-Intel
    x86 CPU with AVX-512 (where MKL runs its AVX2 kernels), "torch" (F.linear) elsewhere."""
    chosen = gemm_named_by(FP32_GEMM_ENV, FP32_GEMMS, "fp32", _onednn_fp32_missing)
    if chosen:
        return chosen
    avx512 = torch.backends.cpu.get_cpu_capability().startswith("AVX512")
    vendor = cpu_vendor()
    if avx512 and vendor and vendor != "GenuineIntel" and onednn_fp32_available():
        return "onednn"
    return "torch"


def _onednn_fp32_missing() -> str:
    return "" if onednn_fp32_available() else "this build of torch has no oneDNN fp32 linear op"


class PackedLinear(nn.Module):
    """An inference-only nn.Linear whose weights oneDNN holds packed (see the module
    docstring): y = x W^T + b in fp32, on oneDNN from ONEDNN_MIN_MACS multiply-adds. It
    SelectsRows (nmt.model.linear)."""

    weight: Tensor  # [N,K] fp32, for F.linear's calls and rows()
    bias: Tensor | None  # [N] fp32

    def __init__(self, weight: Tensor, bias: Tensor | None = None) -> None:
        """weight [N,K] fp32 (shared, not copied), bias [N] fp32 or None."""
        super().__init__()
        if weight.dtype != torch.float32 or weight.device.type != "cpu":
            raise ValueError(
                f"PackedLinear takes fp32 CPU weights, not {weight.dtype} on {weight.device}"
            )
        self.out_features, self.in_features = weight.shape
        self.register_buffer("weight", weight.detach())
        self.register_buffer("bias", None if bias is None else bias.detach())
        self._packed: Tensor | None = None  # the weights in oneDNN's layout
        self._pack()
        # the fewest rows that oneDNN takes
        self.min_onednn_rows = -(-ONEDNN_MIN_MACS // (self.in_features * self.out_features))

    def _pack(self) -> None:
        """(Re)pack the weights for oneDNN; None where they are not fp32 on the CPU (after
        .double() or .to(device): F.linear then computes every call)."""
        weight = self.weight
        usable = weight.dtype == torch.float32 and weight.device.type == "cpu"
        self._packed = torch.ops.mkldnn._reorder_linear_weight(weight, None) if usable else None

    def _apply(self, fn, recurse=True):  # .to(), .double(), ...: the buffers changed
        super()._apply(fn, recurse)
        self._pack()
        return self

    def __getstate__(self) -> dict:  # copy.deepcopy, pickle: oneDNN's tensor has no storage
        return {**self.__dict__, "_packed": None}

    def __setstate__(self, state: dict) -> None:
        super().__setstate__(state)
        self._pack()

    @classmethod
    def from_linear(cls, linear: nn.Linear) -> PackedLinear:
        return cls(linear.weight, linear.bias)

    def rows(self, index: Tensor) -> PackedLinear:
        """The layer computing only outputs `index` [N'] (a vocabulary shortlist)."""
        bias = None if self.bias is None else self.bias[index]
        return PackedLinear(self.weight[index], bias)

    def forward(self, x: Tensor) -> Tensor:
        """x [...,K] fp32 -> [...,N] fp32."""
        flat = x.reshape(-1, self.in_features)  # [M,K]
        packed = self._packed
        small = flat.size(0) < self.min_onednn_rows
        if packed is None or small or x.dtype != torch.float32 or x.requires_grad:
            out = F.linear(flat, self.weight, self.bias)
        else:
            out = self._onednn(flat, packed)
        return out.view(*x.shape[:-1], self.out_features)

    def _onednn(self, flat: Tensor, packed: Tensor) -> Tensor:
        """flat [M,K] -> [M,N] on oneDNN, computed as row_bucket(M) rows (zeros below):
        oneDNN's kernels, and the memory they hold, are per shape (module docstring)."""
        rows = flat.size(0)
        padding = row_bucket(rows) - rows
        if padding:
            flat = F.pad(flat, (0, 0, 0, padding))  # [M',K], copies
        out = torch.ops.mkldnn._linear_pointwise(
            flat.contiguous(), packed, self.bias, "none", [], ""
        )  # [M',N]
        return out[:rows]  # [M,N], the leading rows of a contiguous tensor: contiguous

    def extra_repr(self) -> str:
        return f"in_features={self.in_features}, out_features={self.out_features}, fp32 (onednn)"


ModelT = TypeVar("ModelT", bound=nn.Module)


def pack_fp32(model: ModelT, gemm: str | None = None) -> ModelT:
    """Every nn.Linear of `model` (fp32, on the CPU, for inference) becomes a PackedLinear,
    in place, when `gemm` (default: fp32_gemm()) is "onednn"; with "torch" the model is
    left as it is. Returns the model, in eval mode."""
    gemm = gemm or fp32_gemm()
    if gemm not in FP32_GEMMS:
        raise ValueError(f"gemm={gemm!r}: use one of {FP32_GEMMS}")
    if gemm == "onednn":
        swap_linear_layers(model, lambda weight, bias, output_layer: PackedLinear(weight, bias))
    return model.eval()
