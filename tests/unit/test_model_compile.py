"""The model under bf16 autocast and torch.compile (and on CUDA where there is one)."""

from __future__ import annotations

import pytest
import torch
from rounding import float64_twin, less_accurate, probability_sum_tolerance

from nmt.model.config import ModelConfig
from nmt.model.kernels import FastKernels
from nmt.model.layers import Kernels
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD


def make_model(kernels: Kernels | None = None, **overrides) -> Transformer:
    torch.manual_seed(0)
    fields = dict(
        embed_dim=32,
        ffn_dim=64,
        attention_heads=4,
        encoder_layers=2,
        decoder_layers=2,
        dropout=0.1,
        attention_dropout=0.1,
    )
    fields.update(overrides)
    return Transformer(ModelConfig(**fields), 40, 40, kernels=kernels)


def batch(device: str = "cpu") -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 7), generator=gen)
    src[1, 5:] = PAD
    prev = torch.randint(4, 40, (3, 6), generator=gen)
    prev[:, 0] = EOS
    prev[2, 4:] = PAD
    return src.to(device), prev.to(device)


@pytest.mark.parametrize("kernels", [FastKernels, Kernels], ids=["fast", "plain"])
def test_training_forward_has_no_graph_breaks(kernels):
    model = make_model(kernels()).train()
    explanation = torch._dynamo.explain(model)(*batch())
    assert explanation.graph_break_count == 0, explanation.break_reasons
    assert explanation.graph_count == 1


@pytest.mark.parametrize("group", [1, 3], ids=["rows", "beam-group"])
def test_bf16_autocast_forward_and_cached_decoding(group):
    """Under bf16 autocast the model's forward and its cached decoding are as close to the
    float64 result as the plain layers' bf16 forward (torch's own autocast) is; a fixed
    tolerance would follow one machine's bf16 kernels (tests/rounding.py)."""
    model = make_model(normalize_before=True).eval()
    plain = make_model(Kernels(), normalize_before=True).eval()
    plain.load_state_dict(model.state_dict())
    src, prev = batch()
    with torch.no_grad():
        exact = float64_twin(plain)(src, prev)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            logits = model(src, prev)
            reference = plain(src, prev)
            enc = model.encode(src)
            cache = model.new_cache(group=group)
            steps = [model.decode(prev[:, t : t + 1], enc, cache, attn_layer=-1) for t in range(6)]
    assert logits.dtype == torch.bfloat16
    assert torch.isfinite(logits).all()
    real = prev.ne(PAD)
    assert not less_accurate(logits[real], reference[real], exact[real])
    cached = torch.cat([s[0] for s in steps], 1)
    assert not less_accurate(cached[real], reference[real], exact[real])
    attn = steps[-1][1]
    assert attn.dtype == torch.float32
    sums, ones = attn.sum(-1), torch.ones(3, 1)
    assert torch.allclose(sums, ones, rtol=0, atol=probability_sum_tolerance(7, heads=4))


def test_bf16_autocast_backward():
    model = make_model().train()
    with torch.autocast("cpu", dtype=torch.bfloat16):
        logits = model(*batch())
    logits.float().logsumexp(-1).mean().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in model.parameters())


@pytest.mark.slow
def test_compiled_fullgraph_matches_eager():
    """Inductor compile of the training forward and backward (about 2 minutes on 2 cores)."""
    model = make_model(dropout=0.0, attention_dropout=0.0).train()
    src, prev = batch()
    eager = model(src, prev)
    compiled = torch.compile(model, fullgraph=True)(src, prev)
    assert (compiled - eager).abs().max() < 1e-4
    compiled.sum().backward()
    assert all(p.grad is not None for p in model.parameters())


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("group", [1, 3], ids=["rows", "beam-group"])
def test_cuda_bf16_and_cached_decoding(group):
    model = make_model(dropout=0.0, attention_dropout=0.0).cuda().eval()
    src, prev = batch("cuda")
    with torch.no_grad():
        full = model(src, prev)
        enc = model.encode(src)
        cache = model.new_cache(group=group)
        steps = torch.cat([model.decode(prev[:, t : t + 1], enc, cache)[0] for t in range(6)], 1)
        with torch.autocast("cuda", dtype=torch.bfloat16):
            half = model(src, prev)
    assert (steps - full).abs().max() < 1e-4  # TF32/fused kernels: looser than on CPU
    real = prev.ne(PAD)
    assert (half.float()[real] - full[real]).abs().max() < 0.1
