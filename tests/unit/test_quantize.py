"""int8 inference (nmt/model/quantize.py, precision=int8): each int8 layer stays within the
error its rounding allows, a row's result never depends on the other rows, the fused
projections equal the separate ones, and the options that cannot work are one-line errors.
Each holds for both int8 GEMMs (oneDNN's only on a CPU with VNNI, where it is the output
layer's)."""

from __future__ import annotations

import copy
from dataclasses import replace

import pytest
import torch
from torch import nn

from nmt.errors import NmtError
from nmt.model.layers import Kernels
from nmt.model.linear import linear_rows
from nmt.model.quantize import (
    ACTIVATION_LEVELS,
    GEMM_ENV,
    REDUCE_RANGE,
    WEIGHT_LEVELS,
    Int8Linear,
    int8_gemm,
    onednn_int8_available,
    quantize_int8,
)
from nmt.model.transformer import Transformer
from nmt.runtime import check_precision, int8_engine
from tests.helpers import NO_DROPOUT, cached_and_whole_decoding

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(int8_engine() is None, reason="this torch has no fbgemm int8 kernels"),
]

NO_VNNI = "oneDNN's int8 GEMM needs a CPU with VNNI (AVX512-VNNI or AMX)"
GEMMS = [
    pytest.param("onednn", marks=pytest.mark.skipif(not onednn_int8_available(), reason=NO_VNNI)),
    "fbgemm",
]


def _activation_half_step(gemm: str) -> float:
    """The input's rounding, as a share of its row's magnitude: each row is scaled to
    [-1, 1]; oneDNN's rows round to -127..127 (a step of 1/127), fbgemm's to 2**7
    (reduce_range, without VNNI) or 2**8 levels across [-1, 1]. An element is off by half
    a step."""
    if gemm == "onednn":
        return 0.5 / ACTIVATION_LEVELS
    return 1 / (127 if REDUCE_RANGE else 255)


def _error_bound(x: torch.Tensor, weight: torch.Tensor, gemm: str) -> torch.Tensor:
    """|int8 - exact| per output [M,N]: sum over k of |W| times x's rounding, |x| times W's
    (half a step of the channel's scale, absmax / levels), and their product; plus fp32."""
    row = x.abs().amax(1, keepdim=True)  # [M,1]
    dx = row * _activation_half_step(gemm)  # [M,1]
    dw = weight.abs().amax(1) / WEIGHT_LEVELS / 2  # [N]
    bound = dx * weight.abs().sum(1) + x.abs().sum(1, keepdim=True) * dw + x.size(1) * dx * dw
    return bound + 1e-5 * (x.abs() @ weight.abs().t())  # fp32 sums, generously


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("bias", [True, False])
def test_int8_linear_is_within_its_rounding_of_the_fp32_layer(bias, gemm):
    torch.manual_seed(0)
    layer = nn.Linear(64, 48, bias=bias)
    x = torch.randn(37, 64) * torch.rand(37, 1) * 10  # rows of very different magnitudes
    x[5] = 0.0  # an all-zero row
    int8 = Int8Linear.from_linear(layer, gemm)
    assert int8.gemm == gemm
    assert (int8.anchor is None) == (gemm == "onednn")  # fbgemm's range row, fbgemm's only
    with torch.no_grad():
        exact = layer(x.double().float())
        got = int8(x)
    error = (got - exact).abs()
    assert (error <= _error_bound(x, layer.weight.detach(), gemm)).all()
    assert got[5].equal(layer.bias.detach() if bias else torch.zeros(48))
    # and it is not fp32 by accident: int8 rounding is visible
    assert error.max() > 1e-4


@pytest.mark.parametrize("gemm", GEMMS)
def test_a_rows_result_never_depends_on_the_other_rows(gemm):
    torch.manual_seed(1)
    int8 = Int8Linear.from_linear(nn.Linear(32, 40), gemm)
    x = torch.randn(20, 32) * torch.logspace(-2, 2, 20)[:, None]
    with torch.no_grad():
        together = int8(x)
        for rows in (slice(0, 1), slice(3, 4), slice(19, 20), slice(5, 12)):
            assert int8(x[rows]).equal(together[rows])  # bit for bit
        assert int8(x.view(4, 5, 32)).equal(together.view(4, 5, 40))  # any leading shape
        assert int8(x.flip(0)).equal(together.flip(0))


@pytest.mark.parametrize("gemm", GEMMS)
def test_rows_of_an_int8_layer_compute_those_outputs(gemm):
    torch.manual_seed(2)
    linear = nn.Linear(16, 30, bias=False)
    int8 = Int8Linear.from_linear(linear, gemm)
    index = torch.tensor([0, 1, 2, 3, 7, 29])
    x = torch.randn(9, 16)
    with torch.no_grad():
        rows = linear_rows(int8, index)
        assert rows.gemm == gemm
        assert rows(x).equal(int8(x)[:, index])
        fp32 = linear_rows(linear, index)(x)
        assert torch.allclose(fp32, linear(x)[:, index], atol=1e-6)


def _model(kernels: Kernels | None = None, **overrides) -> Transformer:
    torch.manual_seed(3)
    cfg = replace(NO_DROPOUT, encoder_layers=2, decoder_layers=2, **overrides)
    return Transformer(cfg, 40, 50, kernels=kernels).eval()


@pytest.mark.parametrize("gemm", GEMMS)
@pytest.mark.parametrize("normalize_before", [False, True])
def test_every_linear_layer_is_int8_and_the_model_stays_close(normalize_before, gemm):
    fp32 = _model(normalize_before=normalize_before)
    int8 = quantize_int8(copy.deepcopy(fp32), gemm)
    assert not any(isinstance(m, nn.Linear) for m in int8.modules())
    assert {m.gemm for m in int8.modules() if isinstance(m, Int8Linear)} == {gemm}
    assert isinstance(int8.decoder.output_projection, Int8Linear)
    # int8 attends padded rows on their own (FastKernels.rows_alone); fp32 needs not
    assert int8.kernels.rows_alone and not fp32.kernels.rows_alone
    src = torch.randint(4, 40, (3, 7))
    prev = torch.randint(4, 50, (3, 6))
    with torch.no_grad():
        want = torch.log_softmax(fp32(src, prev), -1)
        got = torch.log_softmax(int8(src, prev), -1)
    # int8 moves log-probs by a few hundredths on this random model; a wrong scale or a
    # transposed weight moves them by whole units
    assert (got - want).abs().max() < 0.3
    assert (got.argmax(-1) == want.argmax(-1)).float().mean() > 0.9


@pytest.mark.parametrize("gemm", GEMMS)
def test_fused_projections_equal_the_plain_layers_in_int8(gemm):
    """FastKernels' stacked q/k/v projection in int8 is the plain layers' three: weights are
    quantized per output row and inputs per input row, so stacking changes nothing."""
    fast = _model()
    plain = _model(kernels=Kernels())
    plain.load_state_dict(fast.state_dict())
    quantize_int8(fast, gemm)
    quantize_int8(plain, gemm)
    src = torch.randint(4, 40, (2, 9))
    prev = torch.randint(4, 50, (2, 5))
    with torch.no_grad():
        assert torch.allclose(fast(src, prev), plain(src, prev), atol=1e-4)


@pytest.mark.parametrize("gemm", GEMMS)
def test_incremental_decoding_equals_the_whole_prefix_in_int8(gemm):
    model = quantize_int8(_model(), gemm)
    steps, whole = cached_and_whole_decoding(model)
    assert torch.allclose(steps, whole, atol=1e-5)


def test_int8_is_for_translation_on_the_cpu_only():
    cpu, cuda = torch.device("cpu"), torch.device("cuda", 0)
    check_precision("int8", cpu, inference=True)
    with pytest.raises(NmtError, match=r"^precision=int8: for translation only .* train with"):
        check_precision("int8", cpu)
    # (a torch.device names a GPU without one being there: the check needs no CUDA)
    with pytest.raises(NmtError, match=r"^precision=int8: runs on the CPU only .*use device=cpu"):
        check_precision("int8", cuda, inference=True)
    with pytest.raises(NmtError, match=r"^precision=int4: unknown; use one of .*int8"):
        check_precision("int4", cpu, inference=True)


def test_the_output_layer_is_onednns_where_the_cpu_has_vnni_and_the_environment_may_name_one(
    monkeypatch,
):
    monkeypatch.delenv(GEMM_ENV, raising=False)
    output_gemm = "onednn" if onednn_int8_available() else "fbgemm"
    assert (int8_gemm(), int8_gemm(output_layer=True)) == ("fbgemm", output_gemm)
    model = quantize_int8(_model())
    layers = {n: m.gemm for n, m in model.named_modules() if isinstance(m, Int8Linear)}
    assert layers.pop("decoder.output_projection") == output_gemm
    assert layers and set(layers.values()) == {"fbgemm"}
    monkeypatch.setenv(GEMM_ENV, "fbgemm")  # one GEMM for every layer
    assert int8_gemm(output_layer=True) == "fbgemm"
    assert quantize_int8(_model()).decoder.output_projection.gemm == "fbgemm"
    monkeypatch.setenv(GEMM_ENV, "mkl")
    with pytest.raises(
        NmtError, match=rf"^{GEMM_ENV}=mkl: unknown int8 GEMM; use onednn or fbgemm$"
    ):
        quantize_int8(_model())
    # oneDNN's u8 x s8 products saturate in int16 without VNNI: refused there by name
    monkeypatch.setattr("nmt.model.quantize.onednn_int8_available", lambda: False)
    monkeypatch.setenv(GEMM_ENV, "onednn")
    with pytest.raises(NmtError, match=rf"^{GEMM_ENV}=onednn: needs a CPU with VNNI"):
        int8_gemm()
    monkeypatch.delenv(GEMM_ENV)
    assert int8_gemm(output_layer=True) == "fbgemm"
