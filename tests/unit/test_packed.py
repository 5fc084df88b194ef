"""fp32 inference on oneDNN (nmt/model/packed.py): a PackedLinear is the fp32 layer to
within fp32's rounding on both of its paths, takes oneDNN's from ONEDNN_MIN_MACS on,
pack_fp32 swaps every linear layer and leaves the model's function as it was, and the
choice of GEMM follows the CPU unless NMT_FP32_GEMM names one (a bad name is one line).
Calls to oneDNN are padded to row buckets (a bounded set of shapes: its kernels are per
shape) and the padding never reaches the outputs.

These run oneDNN's kernels on whatever CPU runs the tests (any x86-64 has them), whether
or not fp32_gemm() would choose them there."""

from __future__ import annotations

import copy
from collections.abc import Callable
from dataclasses import replace

import pytest
import torch
from torch import nn

from nmt.errors import NmtError
from nmt.generation.config import SearchConfig
from nmt.generation.generator import SequenceGenerator
from nmt.model.layers import Kernels
from nmt.model.linear import linear_rows
from nmt.model.packed import (
    FP32_GEMM_ENV,
    ONEDNN_MIN_MACS,
    ROW_BUCKET_BITS,
    PackedLinear,
    fp32_gemm,
    onednn_fp32_available,
    pack_fp32,
    row_bucket,
)
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD
from tests.helpers import NO_DROPOUT, cached_and_whole_decoding

pytestmark = [
    pytest.mark.usefixtures("one_thread"),
    pytest.mark.skipif(not onednn_fp32_available(), reason="this torch has no oneDNN fp32 linear"),
]

FP32_UNIT = 2.0**-24  # fp32's unit roundoff


def _ops_run(module: Callable[[torch.Tensor], object], x: torch.Tensor) -> set[str]:
    """The names of the operators module(x) ran."""
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as prof:
        module(x)
    return {event.key for event in prof.key_averages()}


def _error_bound(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor | None) -> torch.Tensor:
    """|fp32 - exact| per output [M,N] of x W^T + b: K products and K sums, each rounding
    by at most a unit (gamma_{K+1} = (K+1)u / (1 - (K+1)u)) times the sum of magnitudes."""
    k = x.size(1) + 1
    gamma = k * FP32_UNIT / (1 - k * FP32_UNIT)
    magnitude = x.double().abs() @ weight.double().abs().t()  # [M,N]
    if bias is not None:
        magnitude = magnitude + bias.double().abs()
    return gamma * magnitude


@pytest.mark.parametrize("bias", [True, False])
@pytest.mark.parametrize("rows", [1, 3, 64])
def test_both_paths_are_the_fp32_layer_to_within_fp32_rounding(bias, rows):
    torch.manual_seed(0)
    layer = nn.Linear(192, 200, bias=bias)
    packed = PackedLinear.from_linear(layer)
    x = torch.randn(rows, 192) * torch.logspace(-2, 2, rows)[:, None]
    weight, b = layer.weight.detach(), None if layer.bias is None else layer.bias.detach()
    exact = x.double() @ weight.double().t() + (0 if b is None else b.double())
    bound = _error_bound(x, weight, b)
    for min_rows, op in ((0, "mkldnn::_linear_pointwise"), (rows + 1, "aten::linear")):
        packed.min_onednn_rows = min_rows  # oneDNN's path, then F.linear's
        with torch.no_grad():
            got = packed(x)
            assert op in _ops_run(packed, x)
        assert got.dtype == torch.float32 and got.shape == (rows, 200)
        assert ((got.double() - exact).abs() <= bound).all()


def test_a_call_goes_to_onednn_from_onednn_min_macs_multiply_adds():
    packed = PackedLinear(torch.randn(96, 64))
    first = packed.min_onednn_rows
    assert (first - 1) * 64 * 96 < ONEDNN_MIN_MACS <= first * 64 * 96
    with torch.no_grad():
        assert "mkldnn::_linear_pointwise" in _ops_run(packed, torch.randn(first, 64))
        below = _ops_run(packed, torch.randn(first - 1, 64))
        assert "aten::linear" in below and "mkldnn::_linear_pointwise" not in below
        # any leading shape: the rows are counted over all of them
        x = torch.randn(2, first, 64)
        assert "mkldnn::_linear_pointwise" in _ops_run(packed, x)
        assert packed(x).shape == (2, first, 96)


def test_the_weights_are_shared_and_inputs_that_need_gradients_take_f_linear():
    layer = nn.Linear(64, 2048)
    packed = PackedLinear.from_linear(layer)
    assert packed.weight.data_ptr() == layer.weight.data_ptr()  # tied embeddings stay one
    x = torch.randn(8, 64, requires_grad=True)
    assert "mkldnn::_linear_pointwise" not in _ops_run(packed, x)
    with pytest.raises(ValueError, match="fp32 CPU weights"):
        PackedLinear(torch.randn(4, 4, dtype=torch.float64))


def test_rows_of_a_packed_layer_compute_those_outputs():
    torch.manual_seed(2)
    linear = nn.Linear(64, 3000)
    packed = PackedLinear.from_linear(linear)
    index = torch.tensor([0, 1, 2, 3, 700, 2999])
    x = torch.randn(400, 64)
    with torch.no_grad():
        rows = linear_rows(packed, index)
        assert isinstance(rows, PackedLinear) and rows.out_features == 6
        want = linear(x)[:, index]
        assert (
            (rows(x) - want).abs() <= _error_bound(x, linear.weight[index], None) * 2 + 1e-6
        ).all()


def test_row_buckets_are_few_and_add_at_most_an_eighth():
    buckets = [row_bucket(m) for m in range(1, (1 << 16) + 1)]
    exact = 2 << ROW_BUCKET_BITS  # 1..16 stay as they are
    assert buckets[:exact] == list(range(1, exact + 1))
    for m, bucket in enumerate(buckets, start=1):
        assert m <= bucket <= m + m / (1 << ROW_BUCKET_BITS)
        assert row_bucket(bucket) == bucket
    assert buckets == sorted(buckets)
    assert len(set(buckets)) == exact + (1 << ROW_BUCKET_BITS) * (16 - 4)


def _onednn_input_shapes(module: Callable[[torch.Tensor], object], xs) -> set[tuple]:
    """The input shapes of the oneDNN calls module(x) made over xs."""
    with torch.profiler.profile(
        activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True
    ) as prof:
        for x in xs:
            module(x)
    return {
        tuple(event.input_shapes[0])
        for event in prof.events()
        if event.name == "mkldnn::_linear_pointwise"
    }


def test_onednn_meets_one_shape_per_row_bucket_and_the_padding_never_leaks():
    torch.manual_seed(4)
    layer = nn.Linear(64, 96)
    packed = PackedLinear.from_linear(layer)
    packed.min_onednn_rows = 0
    x = torch.randn(300, 64) * torch.logspace(-2, 2, 300)[:, None]
    weight, bias = layer.weight.detach(), layer.bias.detach()
    with torch.no_grad():
        shapes = _onednn_input_shapes(packed, [x[:m] for m in range(1, 301)])
        assert shapes == {(row_bucket(m), 64) for m in range(1, 301)}
        for m in (1, 17, 19, 100, 257, 300):
            got = packed(x[:m])
            assert got.shape == (m, 96) and got.is_contiguous()
            # the bucket's other rows are zeros here and real rows there: a row's outputs
            # are its own, to the bit, whatever the rows below it
            whole = packed(x[: row_bucket(m)]) if row_bucket(m) <= 300 else None
            if whole is not None:
                assert torch.equal(got, whole[:m])
            exact = x[:m].double() @ weight.double().t() + bias.double()
            assert ((got.double() - exact).abs() <= _error_bound(x[:m], weight, bias)).all()
            # as oneDNN computes the same rows on their own shape, to fp32's rounding
            alone = torch.ops.mkldnn._linear_pointwise(x[:m], packed._packed, bias, "none", [], "")
            assert ((got - alone).abs() <= 2 * _error_bound(x[:m], weight, bias)).all()


def _model(kernels: Kernels | None = None, **overrides) -> Transformer:
    torch.manual_seed(3)
    cfg = replace(NO_DROPOUT, encoder_layers=2, decoder_layers=2, **overrides)
    return Transformer(cfg, 40, 50, kernels=kernels).eval()


@pytest.mark.parametrize("kernels", [None, Kernels()], ids=["fused", "plain"])
def test_every_linear_layer_is_packed_and_the_model_computes_the_same(kernels, monkeypatch):
    monkeypatch.setattr("nmt.model.packed.ONEDNN_MIN_MACS", 1)  # oneDNN for every call
    fp32 = _model(kernels)
    packed = pack_fp32(copy.deepcopy(fp32), "onednn")
    assert not any(isinstance(m, nn.Linear) for m in packed.modules())
    assert isinstance(packed.decoder.output_projection, PackedLinear)
    src = torch.randint(4, 40, (3, 7))
    prev = torch.randint(4, 50, (3, 6))
    with torch.no_grad():
        want = torch.log_softmax(fp32(src, prev), -1)
        got = torch.log_softmax(packed(src, prev), -1)
        assert "mkldnn::_linear_pointwise" in _ops_run(lambda s: packed(s, prev), src)
    # two fp32 GEMMs differ by rounding (~1e-6 here); a transposed weight or a lost bias
    # moves log-probs by units
    assert torch.allclose(got, want, atol=1e-4, rtol=0)
    untouched = pack_fp32(copy.deepcopy(fp32), "torch")
    assert not any(isinstance(m, PackedLinear) for m in untouched.modules())


def test_incremental_decoding_equals_the_whole_prefix_on_onednn(monkeypatch):
    monkeypatch.setattr("nmt.model.packed.ONEDNN_MIN_MACS", 1)
    model = pack_fp32(_model(), "onednn")
    steps, whole = cached_and_whole_decoding(model)
    assert torch.allclose(steps, whole, atol=1e-5)


def test_translations_are_the_same_with_and_without_row_buckets(monkeypatch):
    """Beam search on oneDNN for every product (rows shrinking as sentences finish): the
    buckets' padding changes no translation. Each row's products are its own dot
    products, so only the kernel oneDNN picks for a shape could round differently (not
    on the CPUs measured, where they are bitwise equal): scores within fp32 rounding."""
    monkeypatch.setattr("nmt.model.packed.ONEDNN_MIN_MACS", 1)
    model = pack_fp32(_model(), "onednn")
    torch.manual_seed(5)
    src = torch.randint(4, 40, (7, 9))
    for i, length in enumerate([9, 3, 5, 8, 2, 6, 7]):
        src[i, length - 1], src[i, length:] = EOS, PAD
    search = SearchConfig(beam=3, max_len_a=1.0, max_len_b=3, nbest=3)
    bucketed = SequenceGenerator([model], search).generate(src)
    monkeypatch.setattr("nmt.model.packed.row_bucket", lambda rows: rows)
    exact = SequenceGenerator([model], search).generate(src)
    for mine, theirs in zip(bucketed, exact, strict=True):
        for a, b in zip(mine, theirs, strict=True):
            assert torch.equal(a.tokens, b.tokens)
            assert torch.allclose(a.positional_scores, b.positional_scores, atol=1e-5, rtol=0)


def test_the_gemm_follows_the_cpu_and_the_environment_may_name_one(monkeypatch):
    monkeypatch.delenv(FP32_GEMM_ENV, raising=False)
    for vendor, isa, want in (
        ("AuthenticAMD", "AVX512", "onednn"),  # MKL would run its AVX2 kernels
        ("HygonGenuine", "AVX512", "onednn"),
        ("GenuineIntel", "AVX512", "torch"),  # MKL's own
        ("AuthenticAMD", "AVX2", "torch"),  # not measured: left as it was
        ("", "AVX512", "torch"),  # unknown (not Linux)
    ):
        monkeypatch.setattr("nmt.model.packed.cpu_vendor", lambda v=vendor: v)
        monkeypatch.setattr(torch.backends.cpu, "get_cpu_capability", lambda i=isa: i)
        assert fp32_gemm() == want, (vendor, isa)
    for name in ("onednn", "torch"):
        monkeypatch.setenv(FP32_GEMM_ENV, name)
        assert fp32_gemm() == name
    monkeypatch.setenv(FP32_GEMM_ENV, "mkl")
    with pytest.raises(
        NmtError, match=rf"^{FP32_GEMM_ENV}=mkl: unknown fp32 GEMM; use onednn or torch$"
    ):
        fp32_gemm()
    monkeypatch.setattr("nmt.model.packed.onednn_fp32_available", lambda: False)
    monkeypatch.setenv(FP32_GEMM_ENV, "onednn")
    with pytest.raises(NmtError, match=rf"^{FP32_GEMM_ENV}=onednn: this build of torch has no"):
        fp32_gemm()
