"""The fast kernels (nmt/model/kernels.py) compute what the plain layers (layers.Kernels)
compute: operation by operation, and for the whole model, outputs and gradients."""

from __future__ import annotations

import pytest
import torch
from rounding import float64_twin, gamma, less_accurate, probability_sum_tolerance

from nmt.model.config import ModelConfig
from nmt.model.kernels import MATMUL_ATTENTION_MAX_KEYS, FastKernels, FusedProjectionAttention
from nmt.model.layers import Kernels, MultiheadAttention
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD

V = 50

# ------------------------------------------------------------------- the whole model

# The fast kernels add the same terms in other orders and groupings (one stacked matmul for
# three, two matmuls around a softmax for flash attention's blocked online softmax); each of
# their results must be as close to float64 as the plain layers' (tests/rounding.py,
# less_accurate: within 4x, measured up to 1.8x). A wrong kernel (a scale, mask or head
# split off) is >= 1000x off (see below).

CASES = {
    # name: (training, source length, target length, source padding)
    "train-short": (True, 9, 8, True),  # CPU training's spelled-out attention
    "train-long": (True, 140, 131, True),  # past MATMUL_ATTENTION_MAX_KEYS: SDPA
    "inference-padded": (False, 9, 8, True),
    "inference-unpadded": (False, 9, 8, False),  # FastKernels drops the encoder's mask
}
VARIANTS = {
    "post-norm": {},
    "pre-norm-gelu-ln-emb": {
        "normalize_before": True,
        "activation_fn": "gelu",
        "layernorm_embedding": True,
    },
}


def _models(
    seed: int, fast_kernels: Kernels, **overrides
) -> tuple[Transformer, Transformer, Transformer]:
    """(fast fp32, plain fp32, plain float64): one function, the same parameters."""
    torch.manual_seed(seed)
    fields = dict(embed_dim=32, ffn_dim=64, attention_heads=4, encoder_layers=2, decoder_layers=2)
    cfg = ModelConfig(**fields, dropout=0.0, **overrides)
    fast = Transformer(cfg, V, V, kernels=fast_kernels)
    plain = Transformer(cfg, V, V, kernels=Kernels())
    plain.load_state_dict(fast.state_dict())
    return fast, plain, float64_twin(plain)


def _batch(src_len: int, tgt_len: int, src_padding: bool) -> tuple[torch.Tensor, torch.Tensor]:
    gen = torch.Generator().manual_seed(1)
    src = torch.randint(4, V, (3, src_len), generator=gen)
    if src_padding:
        src[1, src_len - 3 :] = PAD
    prev = torch.randint(4, V, (3, tgt_len), generator=gen)
    prev[:, 0] = EOS
    prev[0, tgt_len - 2 :] = PAD
    return src, prev


def _training_results(model: Transformer, src, prev) -> dict[str, torch.Tensor]:
    """The training forward's logits and every parameter's gradient, as float64."""
    model.train()
    model.zero_grad()
    logits = model(src, prev)  # [B,T,V]
    loss_weights = torch.randn(V, generator=torch.Generator().manual_seed(2))
    (logits * loss_weights.to(logits.dtype)).sum().backward()
    results = {"logits": logits.detach()}
    results.update({f"grad {name}": p.grad for name, p in model.named_parameters()})
    return {name: t.double() for name, t in results.items()}


def _inference_results(model: Transformer, src, prev) -> dict[str, torch.Tensor]:
    """Encoder states, decoder logits and attention, and cached decoding, as float64."""
    model.eval()
    with torch.no_grad():
        enc = model.encode(src)
        logits, attn = model.decode(prev, enc, attn_layer=-1)
        cache = model.new_cache()
        steps = [model.decode(prev[:, t : t + 1], enc, cache)[0] for t in range(prev.size(1))]
    results = {"encoder": enc.out, "logits": logits, "attention": attn}
    results["cached logits"] = torch.cat(steps, 1)
    return {name: t.double() for name, t in results.items()}


def _less_accurate(fast: dict, plain: dict, exact: dict) -> list[str]:
    """The results whose fast error (the norm of the difference to float64, over the whole
    tensor) exceeds 4 times the plain layers' (tests/rounding.py, less_accurate)."""
    worse = []
    for name, want in exact.items():
        if less_accurate(fast[name], plain[name], want):
            fast_error = (fast[name] - want).norm().item()
            plain_error = (plain[name] - want).norm().item()
            worse.append(f"{name}: fast {fast_error:.2e} vs plain {plain_error:.2e}")
    return worse


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("variant", VARIANTS)
def test_fast_kernels_compute_the_plain_layers_function(case, variant):
    """Outputs and gradients of the default (fast) model equal the plain model's, to within
    fp32 rounding: each is as close to the float64 result as the plain model is."""
    training, src_len, tgt_len, src_padding = CASES[case]
    models = _models(0, FastKernels(), **VARIANTS[variant])
    src, prev = _batch(src_len, tgt_len, src_padding)
    results = _training_results if training else _inference_results
    fast, plain, exact = (results(model, src, prev) for model in models)
    assert not _less_accurate(fast, plain, exact)


class _ScaleOffByAThousandth(FastKernels):
    def attention(self, q, k, v, mask=None, is_causal=False, dropout_p=0.0):
        return super().attention(q * (1 + 1e-3), k, v, mask, is_causal, dropout_p)


def test_the_comparison_catches_a_kernel_that_is_slightly_wrong():
    """The check above is no formality: an attention scale off by 0.1% changes the logits by
    less than 1e-3, which a fixed tolerance of that size would let through."""
    models = _models(0, _ScaleOffByAThousandth())
    src, prev = _batch(9, 8, True)
    wrong, plain, exact = (_training_results(model, src, prev) for model in models)
    assert (wrong["logits"] - plain["logits"]).abs().max() < 1e-3
    worse = _less_accurate(wrong, plain, exact)
    assert "logits" in " ".join(worse) and len(worse) > len(exact) // 2


def test_transformer_is_built_with_the_fast_kernels_unless_told_otherwise():
    cfg = ModelConfig(embed_dim=16, ffn_dim=32, attention_heads=2, encoder_layers=2)
    default = Transformer(cfg, V, V)
    assert isinstance(default.kernels, FastKernels)
    attentions = [m for m in default.modules() if isinstance(m, MultiheadAttention)]
    assert len(attentions) == 2 + 2 * cfg.decoder_layers
    assert all(isinstance(m, FusedProjectionAttention) for m in attentions)
    users = [m for m in default.modules() if hasattr(m, "kernels")]
    assert len(users) > len(attentions) and all(m.kernels is default.kernels for m in users)
    plain = Transformer(cfg, V, V, kernels=Kernels())
    assert type(plain.kernels) is Kernels
    assert not any(isinstance(m, FusedProjectionAttention) for m in plain.modules())
    # the same parameters, with fairseq's names and shapes: checkpoints load either way
    assert {k: v.shape for k, v in plain.state_dict().items()} == {
        k: v.shape for k, v in default.state_dict().items()
    }


# --------------------------------------------------------------------------- attention


@pytest.mark.parametrize("causal", [False, True])
def test_spelled_out_attention_equals_sdpa(causal):
    """The spelled-out attention (the weights path; FastKernels' CPU training attention up
    to MATMUL_ATTENTION_MAX_KEYS keys) is SDPA's: same outputs and gradients in fp32, with a
    key padding mask and with causal masking."""
    torch.manual_seed(0)
    q, k, v = (torch.randn(3, 4, 6, 8, requires_grad=True) for _ in range(3))
    mask = torch.ones(3, 1, 1, 6, dtype=torch.bool)
    mask[1, ..., 4:] = False  # row 1 has two padding keys
    out, probs = Kernels().attention_with_weights(q, k, v, mask, causal, 0.0)
    sdpa = torch.nn.functional.scaled_dot_product_attention
    want = sdpa(q, k, v, attn_mask=mask, is_causal=causal)
    q64, k64, v64 = (t.detach().double().requires_grad_(True) for t in (q, k, v))
    exact = sdpa(q64, k64, v64, attn_mask=mask, is_causal=causal)
    # as close to float64 as SDPA's own fp32 result (tests/rounding.py)
    assert not less_accurate(out, want, exact)
    ones = torch.ones(3, 4, 6)
    assert torch.allclose(probs.sum(-1), ones, rtol=0, atol=probability_sum_tolerance(6))
    assert probs[1, ..., 4:].eq(0).all()
    grads = torch.autograd.grad(out.square().sum(), (q, k, v))
    wanted = torch.autograd.grad(want.square().sum(), (q, k, v))
    exact_grads = torch.autograd.grad(exact.square().sum(), (q64, k64, v64))
    assert not any(map(less_accurate, grads, wanted, exact_grads))
    # FastKernels' CPU training attention takes that path: bitwise the same
    assert k.size(-2) <= MATMUL_ATTENTION_MAX_KEYS
    assert torch.equal(FastKernels().attention(q, k, v, mask, causal, 0.0), out)


@pytest.mark.parametrize("length", [5, 130], ids=["short-matmuls", "long-fp32-flash"])
def test_cpu_bf16_training_attention_is_close_to_fp32(length):
    """Under CPU bf16 autocast with gradients, FastKernels' attention is spelled out for
    short sequences and fp32 flash attention for long ones (torch's bf16 flash backward on
    CPU is slow): bf16 out, as close to float64 as the plain layers' bf16 attention."""
    torch.manual_seed(0)
    attn = FastKernels().multihead_attention(32, 4, dropout=0.0)
    plain = Kernels().multihead_attention(32, 4, dropout=0.0)
    plain.load_state_dict(attn.state_dict())
    exact_attn = float64_twin(plain)
    x = torch.randn(2, length, 32)
    mask = torch.ones(2, 1, 1, length, dtype=torch.bool)
    mask[1, ..., -2:] = False
    with torch.no_grad():
        exact = exact_attn(x.double(), *exact_attn.project_kv(x.double()), mask)[0]
    with torch.autocast("cpu", dtype=torch.bfloat16):
        out, _ = attn(x, *attn.project_kv(x), mask)
        reference, _ = plain(x, *plain.project_kv(x), mask)
    assert out.dtype == torch.bfloat16
    assert not less_accurate(out.detach(), reference.detach(), exact)
    out.float().sum().backward()
    assert all(p.grad is not None and torch.isfinite(p.grad).all() for p in attn.parameters())


def test_attention_mask_is_dropped_only_without_padding():
    padding = torch.zeros(2, 5, dtype=torch.bool)
    assert FastKernels().attention_mask(padding) is None
    assert torch.equal(Kernels().attention_mask(padding), torch.ones(2, 1, 1, 5, dtype=torch.bool))
    padding[1, 3:] = True
    for kernels in (Kernels(), FastKernels()):
        mask = kernels.attention_mask(padding)  # [B,1,1,S], True = attend
        assert mask.shape == (2, 1, 1, 5) and torch.equal(mask[:, 0, 0], ~padding)


# -------------------------------------------------------------------------- projections


def test_joint_projections_equal_the_separate_ones_and_follow_weight_changes():
    """project_qkv/project_kv run q_proj, k_proj, v_proj as one matmul; in inference the
    stacked weight is kept, and must be rebuilt whenever a parameter changes."""
    torch.manual_seed(0)
    attn = FastKernels().multihead_attention(32, 4, dropout=0.0)
    assert isinstance(attn, FusedProjectionAttention)
    x = torch.randn(2, 5, 32)

    projections = (attn.q_proj, attn.k_proj, attn.v_proj)

    def separate():
        return [attn.split_heads(p(x)) for p in projections]

    def same(got: list[torch.Tensor], want: list[torch.Tensor], used=projections) -> bool:
        """Two fp32 computations of x @ W.T + b: each within gamma(D + 1) (|x| @ |W|.T +
        |b|) of the exact value (tests/rounding.py), so within twice that of each other. A
        stale stacked weight (the k_proj change below) is off by ~|x| @ 1, 1e4 times more."""
        for g, w, p in zip(got, want, used):
            exact_size = x.abs() @ p.weight.detach().abs().t() + p.bias.detach().abs()
            bound = attn.split_heads(2 * gamma(x.size(-1) + 1) * exact_size)
            if not torch.all((g - w).abs() <= bound):
                return False
        return True

    with torch.no_grad():
        assert same(attn.project_qkv(x), separate())
        attn.k_proj.weight.add_(1.0)  # an optimizer step: in place, under no_grad
        attn.v_proj.bias.mul_(2.0)
        assert same(attn.project_qkv(x), separate())
        assert same(attn.project_kv(x), separate()[1:], projections[1:])
    # A fused Adam step changes the weights without bumping their version; the trainer
    # calls train() before it and eval() before validating.
    optimizer = torch.optim.Adam(attn.parameters(), lr=0.1, fused=True)
    attn.train()
    sum(p.sum() for p in attn.project_qkv(x)).backward()
    optimizer.step()
    attn.eval()
    with torch.no_grad():
        assert same(attn.project_qkv(x), separate())
    other = Kernels().multihead_attention(32, 4, dropout=0.0)  # the plain module's parameters
    attn.load_state_dict(other.state_dict())  # a checkpoint load
    with torch.inference_mode():
        assert same(attn.project_qkv(x), separate())
    attn.double()  # a dtype move
    x = x.double()
    attn.zero_grad()
    with torch.no_grad():
        assert attn.project_qkv(x)[0].dtype == torch.float64
    # With gradients, each projection gets its own gradient through the stacked weight.
    q, k, v = attn.project_qkv(x)
    (q.sum() + 2 * k.sum() + 3 * v.sum()).backward()
    for proj, factor in ((attn.q_proj, 1), (attn.k_proj, 2), (attn.v_proj, 3)):
        assert torch.allclose(proj.bias.grad, torch.full((32,), factor * 10.0, dtype=torch.float64))


# ------------------------------------------------------------------------------ dropout


@pytest.mark.parametrize("p", [0.1, 0.3, 0.5])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_cpu_dropout_drops_p_and_keeps_the_expectation(p, dtype):
    dropout = FastKernels().dropout
    torch.manual_seed(0)
    x = torch.ones(1000, 1000, dtype=dtype, requires_grad=True)  # 1e6 draws: std of the rate ~5e-4
    y = dropout(x, p, training=True)
    kept = y.detach() != 0
    assert abs(1 - kept.float().mean().item() - p) < 3e-3
    assert torch.allclose(y.detach()[kept].float(), torch.tensor(1 / (1 - p)), rtol=1e-2)
    assert abs(y.detach().float().mean().item() - 1.0) < 1e-2  # unbiased
    y.sum().backward()  # the gradient flows exactly through the kept elements, scaled
    assert torch.equal(x.grad != 0, kept) and torch.equal(x.grad, y.detach())
    assert dropout(x, p, training=False) is x and dropout(x, 0.0, training=True) is x


def test_cpu_dropout_masks_are_independent_and_follow_the_seed():
    dropout = FastKernels().dropout
    x = torch.ones(4, 999)  # not a multiple of 4: the last 64-bit draw is partly used
    torch.manual_seed(3)
    a, b = dropout(x, 0.5, True), dropout(x, 0.5, True)
    torch.manual_seed(3)
    assert torch.equal(dropout(x, 0.5, True), a)  # reproducible from the seed (resume relies on it)
    assert not torch.equal(a, b)
    # four neighbouring elements share a 64-bit draw but not their decisions
    kept = (a != 0).view(-1)[:3996].view(-1, 4)  # [draws, 4]
    for lane in (1, 2, 3):
        same = kept[:, 0] == kept[:, lane]
        assert 0.44 < same.float().mean().item() < 0.56


def test_inference_attention_over_padded_keys_is_each_rows_own():
    """With rows_alone (int8 sets it: nmt.model.quantize), CPU inference attends each run
    of rows over exactly its real keys: a row's output is bit for bit what it is in a
    batch of its own, and equals masked attention to fp32 rounding. Other masks go to
    SDPA unchanged, and without rows_alone (fp32) every mask does."""
    torch.manual_seed(0)
    kernels = FastKernels(rows_alone=True)
    lengths = [7, 7, 5, 3, 3, 3]
    q, k, v = (torch.randn(len(lengths), 2, 7, 8) for _ in range(3))
    mask = (torch.arange(7) < torch.tensor(lengths)[:, None])[:, None, None, :]
    with torch.inference_mode():
        got = kernels.attention(q, k, v, mask)
        for row, n in enumerate(lengths):
            alone = kernels.attention(
                q[row : row + 1, :, :n], k[row : row + 1, :, :n], v[row : row + 1, :, :n]
            )
            assert torch.equal(got[row, :, :n], alone[0])
        masked = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=mask)
        assert torch.allclose(got, masked, atol=1e-6)
        holes = mask.clone()
        holes[0, 0, 0, 2] = False  # not right padding: SDPA with the mask as given
        want = torch.nn.functional.scaled_dot_product_attention(q, k, v, attn_mask=holes)
        assert torch.equal(kernels.attention(q, k, v, holes), want)
        assert torch.equal(FastKernels().attention(q, k, v, mask), masked)
