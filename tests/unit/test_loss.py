"""Label-smoothed cross-entropy: fairseq's formula, padding ignored, sums that add up."""

import math

import pytest
import torch
import torch.nn.functional as F

from nmt.training.loss import (
    BLOCK_ELEMENTS,
    GPU_BLOCK_ELEMENTS,
    block_elements_for,
    label_smoothed_nll_loss,
    output_layer_loss,
    per_token_base2,
    perplexity,
    rdrop_output_layer_loss,
    real_positions,
)

PAD = 1


def _fairseq_reference(
    logits: torch.Tensor, target: torch.Tensor, eps: float
) -> tuple[float, float]:
    """fairseq's label_smoothed_nll_loss written out per token, in plain Python loops."""
    lprobs = F.log_softmax(logits.double(), dim=-1)
    vocab = logits.size(-1)
    loss = nll = 0.0
    for b in range(target.size(0)):
        for t in range(target.size(1)):
            y = int(target[b, t])
            if y == PAD:
                continue
            token_nll = -float(lprobs[b, t, y])
            smooth = -float(lprobs[b, t].sum())
            eps_i = eps / (vocab - 1)
            loss += (1 - eps - eps_i) * token_nll + eps_i * smooth
            nll += token_nll
    return loss, nll


def _batch(seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(3, 5, 11, generator=g)
    target = torch.randint(2, 11, (3, 5), generator=g)
    target[0, 3:] = PAD
    target[2, 1:] = PAD
    return logits, target


def test_matches_fairseq_formula():
    logits, target = _batch()
    out = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    ref_loss, ref_nll = _fairseq_reference(logits, target, 0.1)
    assert math.isclose(out.loss.item(), ref_loss, rel_tol=1e-5)
    assert math.isclose(out.nll.item(), ref_nll, rel_tol=1e-5)


def test_no_smoothing_is_cross_entropy_sum_over_non_pad():
    logits, target = _batch(1)
    out = label_smoothed_nll_loss(logits, target, 0.0, PAD)
    ce = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    assert torch.allclose(out.loss, ce) and torch.allclose(out.nll, ce)


def test_padding_positions_do_not_matter():
    logits, target = _batch(2)
    changed = logits.clone()
    changed[target == PAD] = torch.randn_like(changed[target == PAD]) * 100
    a = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    b = label_smoothed_nll_loss(changed, target, 0.1, PAD)
    assert torch.equal(a.loss, b.loss) and torch.equal(a.nll, b.nll)


def test_sums_over_split_batches_add_up():
    # the trainer relies on sums: two halves of a batch give the whole batch's loss
    logits, target = _batch(3)
    whole = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    halves = [
        label_smoothed_nll_loss(logits[i : i + 1], target[i : i + 1], 0.1, PAD) for i in range(3)
    ]
    assert torch.allclose(whole.loss, sum(h.loss for h in halves))


def test_bf16_logits_give_fp32_loss_close_to_fp32():
    logits, target = _batch(4)
    out32 = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    out16 = label_smoothed_nll_loss(logits.bfloat16(), target, 0.1, PAD)
    assert out16.loss.dtype == torch.float32
    assert math.isclose(out16.loss.item(), out32.loss.item(), rel_tol=2e-2)


def test_gradient_flows_and_ignores_pad_rows():
    logits, target = _batch(5)
    logits.requires_grad_(True)
    label_smoothed_nll_loss(logits, target, 0.1, PAD).loss.backward()
    assert torch.all(logits.grad[target == PAD] == 0)
    assert torch.all(logits.grad[target != PAD].abs().sum(-1) > 0)


def test_reported_figures_are_base2_per_token():
    nats = 10 * math.log(8)  # 10 tokens, each with probability 1/8
    assert math.isclose(per_token_base2(nats, 10), 3.0)
    assert math.isclose(perplexity(3.0), 8.0)
    assert math.isfinite(perplexity(1e9))


def _features(seed: int = 6, vocab: int = 11, dim: int = 8):
    g = torch.Generator().manual_seed(seed)
    features = torch.randn(3, 5, dim, generator=g, requires_grad=True)
    weight = torch.randn(vocab, dim, generator=g, requires_grad=True)
    _, target = _batch(seed)
    return features, weight, target


def _loss_and_grads(fn, features, weight):
    features.grad = weight.grad = None
    out = fn()
    (3.0 * out.loss).backward()  # a scaled loss, as under GradScaler or 1/ntokens
    return out.loss.item(), out.nll.item(), features.grad.clone(), weight.grad.clone()


# fp32 unit roundoff: every fp32 operation is exact up to a relative error of U.
U = 2.0**-24


def _float64_loss_and_grads(features, weight, target, eps):
    """The loss, nll and gradients of (3 * loss) in float64, and the magnitudes that bound an
    fp32 computation's rounding error: sum |terms| of each result (see the test below)."""
    f = features.detach().double().requires_grad_(True)
    w = weight.detach().double().requires_grad_(True)
    keep = target.reshape(-1) != PAD
    z = (f.reshape(-1, f.size(-1)) @ w.t())[keep]  # [N,V]
    lprobs = torch.log_softmax(z, dim=-1)
    vocab = z.size(-1)
    eps_i = eps / (vocab - 1)
    nll = -lprobs.gather(1, target.reshape(-1)[keep, None]).sum()
    loss = (1 - eps - eps_i) * nll + eps_i * (-lprobs.sum()) if eps else nll
    (3.0 * loss).backward()
    # d(3 loss)/dz = 3 (p - eps_i - (1 - eps - eps_i) onehot); its rounding stays within a few
    # U of |p| + |onehot| + eps_i, and the matmuls that spread it onto features and weight
    # add U per term of their sums.
    with torch.no_grad():
        dz_size = 3.0 * (
            lprobs.exp()
            + eps_i
            + torch.zeros_like(z).scatter_(1, target.reshape(-1)[keep, None], 1.0)
        )
        h = f.reshape(-1, f.size(-1))[keep]
        grad_f_size = torch.zeros_like(f).reshape(-1, f.size(-1))
        grad_f_size[keep] = dz_size @ w.abs()
        sizes = (
            (z.abs().sum() + z.abs().amax(1).sum()) * (1 + eps),  # the loss: lse and gold terms
            grad_f_size.view_as(f),
            dz_size.t() @ h.abs(),
        )
    return (loss.item(), nll.item(), f.grad.float(), w.grad.float()), sizes


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block_elements", [11, 33, 1 << 20])  # 1 row, 3 rows, all rows
def test_fused_output_layer_loss_equals_logits_then_loss(eps, block_elements):
    """Both fp32 paths agree with float64 within the rounding fp32 arithmetic allows.

    The paths sum the same terms in different orders, which differs from CPU to CPU (vector
    widths, blocking). A sum of n terms computed in fp32, in any order, is within
    n * U * sum|terms| of the exact sum, and softmax adds a few U per element; so each result
    must lie within (V + N + D + 8) * U times its sum of |terms| of the float64 value, on any
    machine. A real mistake (a missing eps_i, a gradient row off by one) is orders larger.
    """
    features, weight, target = _features()
    plain = _loss_and_grads(
        lambda: label_smoothed_nll_loss(features @ weight.t(), target, eps, PAD), features, weight
    )
    fused = _loss_and_grads(
        lambda: output_layer_loss(
            features, weight, target, eps, PAD, block_elements=block_elements
        ),
        features,
        weight,
    )
    exact, (loss_size, grad_f_size, grad_w_size) = _float64_loss_and_grads(
        features, weight, target, eps
    )
    n_terms = weight.size(0) + int((target != PAD).sum()) + weight.size(1) + 8
    gamma = n_terms * U
    for result in (plain, fused):
        assert abs(result[0] - exact[0]) <= gamma * loss_size
        assert abs(result[1] - exact[1]) <= gamma * loss_size
        assert torch.all((result[2] - exact[2]).abs() <= gamma * grad_f_size.float())
        assert torch.all((result[3] - exact[3]).abs() <= gamma * grad_w_size.float())
    assert torch.all(fused[2][target == PAD] == 0)  # padding positions get no gradient


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_output_layer_loss_under_bf16_autocast_is_as_accurate_as_plain_autocast(seed):
    features, weight, target = _features(seed, vocab=300, dim=32)
    exact = _loss_and_grads(
        lambda: label_smoothed_nll_loss(features @ weight.t(), target, 0.1, PAD), features, weight
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        plain = _loss_and_grads(
            lambda: label_smoothed_nll_loss(
                torch.nn.functional.linear(features, weight), target, 0.1, PAD
            ),
            features,
            weight,
        )
        fused = _loss_and_grads(
            lambda: output_layer_loss(features, weight, target, 0.1, PAD), features, weight
        )
    assert math.isclose(fused[0], plain[0], rel_tol=1e-5)  # the same bf16 logits
    assert features.grad.dtype == weight.grad.dtype == torch.float32
    for i in (2, 3):  # gradients of features and weight: bf16 rounding, no worse than plain's
        assert (fused[i] - exact[i]).abs().max() <= 1.25 * (plain[i] - exact[i]).abs().max()


def test_fused_output_layer_loss_without_gradients():
    features, weight, target = _features()
    with torch.no_grad():
        out = output_layer_loss(features, weight, target, 0.1, PAD)
    expected = label_smoothed_nll_loss(features.detach() @ weight.detach().t(), target, 0.1, PAD)
    assert math.isclose(out.loss.item(), expected.loss.item(), rel_tol=1e-6)
    assert not out.loss.requires_grad


def test_the_host_given_positions_give_the_same_loss_and_gradients():
    """positions from real_positions (the host's copy of the batch, no device read) give
    bitwise what finding the non-pad positions on the device gives."""
    features, weight, target = _features()
    found = _loss_and_grads(
        lambda: output_layer_loss(features, weight, target, 0.1, PAD), features, weight
    )
    given = _loss_and_grads(
        lambda: output_layer_loss(
            features, weight, target, 0.1, PAD, positions=real_positions(target, PAD)
        ),
        features,
        weight,
    )
    assert found[:2] == given[:2]
    assert torch.equal(found[2], given[2]) and torch.equal(found[3], given[3])


def test_fp16_logit_gradients_carry_the_loss_scale_before_rounding():
    """fp16 (subnormals below 6e-8): a confident model's probabilities of ~1e-8 vanish if
    the logits' gradient p - onehot is rounded to fp16 before the loss scale multiplies
    it. With grad_scale the gradient of the weights' rows of those unlikely tokens keeps
    fp16's precision (relative error ~1e-3, not ~1)."""
    g = torch.Generator().manual_seed(3)
    vocab, dim, n, scale = 64, 16, 24, 2.0**16
    hidden = torch.randn(1, n, dim, generator=g) * 0.1
    hidden[..., 0] = 4.0
    weight = torch.randn(vocab, dim, generator=g) * 0.1
    weight[5, 0] = 4.5  # token 5 (every target) is ~e**18 times likelier than the others
    target = torch.full((1, n), 5)
    features = hidden.clone().requires_grad_(True)
    w = weight.clone().requires_grad_(True)
    with torch.autocast("cpu", dtype=torch.float16):
        out = output_layer_loss(features, w, target, 0.0, PAD, grad_scale=scale)
    (out.loss * scale).backward()  # scaled, as fp16 training scales it
    # float64 reference from the same fp16 logits (the fp16 matmul rounds them)
    h16, w16 = hidden.reshape(n, dim).half(), weight.half()
    p = torch.softmax(torch.mm(h16, w16.t()).double(), dim=-1)  # [n,V]
    assert p[:, :5].max() < 1e-7  # below fp16's smallest normal number, 6.1e-5
    dz = p - torch.nn.functional.one_hot(target.reshape(-1), vocab).double()
    want = dz.t() @ h16.double()  # [V,D]
    got = w.grad.double() / scale  # unscaled, as the loss scaler will
    others = torch.arange(vocab) != 5
    # (the gold row's p - 1 cancels in fp32 already, on any device; not fp16's doing)
    assert (got[others] - want[others]).norm() / want[others].norm() < 1e-2


def test_blocks_are_sized_for_the_device(monkeypatch):
    """Few large blocks on a GPU (kernel launches), ~16 MB ones on a CPU (malloc reuse)."""
    assert block_elements_for(torch.device("cpu")) == BLOCK_ELEMENTS
    memory = {"total": 80 * 2**30}
    monkeypatch.setattr(
        torch.cuda,
        "get_device_properties",
        lambda device: type("Properties", (), {"total_memory": memory["total"]})(),
    )
    on_h100 = block_elements_for(torch.device("cuda", 0))
    assert on_h100 == GPU_BLOCK_ELEMENTS
    assert math.ceil(25_000 / (on_h100 // 32_768)) <= 13  # blocks of a 25k-token batch, 32k vocab
    memory["total"] = 16 * 2**30
    assert BLOCK_ELEMENTS < block_elements_for(torch.device("cuda", 0)) < GPU_BLOCK_ELEMENTS
    memory["total"] = 2 * 2**30
    assert block_elements_for(torch.device("cuda", 0)) == BLOCK_ELEMENTS


# ------------------------------------------------------------------------------ R-Drop


def _two_passes(seed: int = 8, vocab: int = 11, dim: int = 8, dtype=torch.float32):
    """features [2B,T,D] of two passes (rows i and B + i: the same pair), weight, target [B,T]."""
    g = torch.Generator().manual_seed(seed)
    _, target = _batch(seed)
    features = torch.randn(2 * target.size(0), target.size(1), dim, generator=g, dtype=dtype)
    weight = torch.randn(vocab, dim, generator=g, dtype=dtype)
    return features.requires_grad_(True), weight.requires_grad_(True), target


def _rdrop_reference(logits, target, eps, alpha):
    """fairseq's rdrop criterion, unfused: label-smoothed loss of both passes plus alpha x
    (KL(p2||p1) + KL(p1||p2)) / 2 summed over the non-pad positions; (objective, loss, nll, kl)."""
    batch = target.size(0)
    ce = label_smoothed_nll_loss(logits, torch.cat([target, target]), eps, PAD)
    lprobs = F.log_softmax(logits.double(), dim=-1)
    p, q = lprobs[:batch], lprobs[batch:]
    kl = F.kl_div(p, q, log_target=True, reduction="none") + F.kl_div(
        q, p, log_target=True, reduction="none"
    )
    kl = (kl.sum(-1) * (target != PAD)).sum() / 2
    return ce.loss + alpha * kl, ce.loss, ce.nll, kl


def _grads(objective, *tensors):
    for t in tensors:
        t.grad = None
    objective.backward()
    return [t.grad.clone() for t in tensors]


def test_rdrop_with_alpha_0_is_the_plain_loss_of_both_passes_bitwise():
    features, weight, target = _two_passes()
    rdrop = rdrop_output_layer_loss(features, weight, target, 0.1, PAD, 0.0)
    rdrop_grads = _grads(rdrop.minimized, features, weight)
    plain = output_layer_loss(features, weight, torch.cat([target, target]), 0.1, PAD)
    plain_grads = _grads(plain.loss, features, weight)
    assert torch.equal(rdrop.loss, plain.loss) and torch.equal(rdrop.nll, plain.nll)
    assert rdrop.kl is None and rdrop.minimized is rdrop.loss
    assert all(torch.equal(a, b) for a, b in zip(rdrop_grads, plain_grads))


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block_elements", [22, 66, 1 << 20])  # 1 row, 3 rows, all rows
def test_fused_rdrop_equals_the_unfused_criterion(eps, block_elements):
    """The fused objective, loss, nll, kl and gradients against fairseq's criterion computed
    from whole logits in float64, within the rounding of fp32 arithmetic: a sum of n fp32
    terms in any order is within n * U * sum|terms| of the exact sum; the KL gradient's
    terms are p * (|log p| + |log q| + KL) + p + q, times alpha / 2 (see the docstring of
    _OutputLayerRDrop), added to the CE's p + eps_i + onehot."""
    alpha = 5.0
    features, weight, target = _two_passes()
    fused = rdrop_output_layer_loss(
        features, weight, target, eps, PAD, alpha, block_elements=block_elements
    )
    fused_grads = _grads(3.0 * fused.minimized, features, weight)
    f64 = features.detach().double().requires_grad_(True)
    w64 = weight.detach().double().requires_grad_(True)
    exact = _rdrop_reference(f64 @ w64.t(), target, eps, alpha)
    exact_grads = _grads(3.0 * exact[0], f64, w64)
    with torch.no_grad():  # the magnitudes that bound the rounding
        keep = torch.cat([target, target]).reshape(-1) != PAD
        z = (f64 @ w64.t()).reshape(-1, weight.size(0))  # [2BT,V]
        lp = torch.log_softmax(z, -1)
        probs = lp.exp()
        n = z.size(0) // 2
        swapped = torch.cat([lp[n:], lp[:n]])  # each row's other pass
        kl_rows = (probs * (lp - swapped)).sum(-1, keepdim=True).abs()
        onehot = torch.zeros_like(z).scatter_(
            1, torch.cat([target, target]).reshape(-1, 1).clamp(min=0), 1.0
        )
        vocab = z.size(-1)
        dz_size = (
            3.0
            * (
                probs
                + eps / (vocab - 1)
                + onehot
                + alpha / 2 * (probs * (lp.abs() + swapped.abs() + kl_rows) + probs + swapped.exp())
            )
            * keep[:, None]
        )
        h = f64.detach().reshape(-1, f64.size(-1))
        size_f = (dz_size @ w64.detach().abs()).view_as(f64)
        size_w = dz_size.t() @ h.abs()
        size_loss = (z.abs().sum(-1) + z.abs().amax(-1))[keep].sum() * (1 + eps + alpha)
    gamma = (weight.size(0) + int(keep.sum()) + weight.size(1) + 8) * U
    for got, want in zip((fused.minimized, fused.loss, fused.nll, fused.kl), exact):
        assert abs(got.item() - want.item()) <= gamma * size_loss.item()
    assert torch.all((fused_grads[0].double() - exact_grads[0]).abs() <= gamma * size_f)
    assert torch.all((fused_grads[1].double() - exact_grads[1]).abs() <= gamma * size_w)
    pads = torch.cat([target, target]) == PAD
    assert torch.all(fused_grads[0][pads] == 0)  # padding positions get no gradient
    assert fused.kl.item() > 0.01  # the passes differ: the KL term is really there


def test_rdrop_on_a_tiny_model_matches_the_unfused_criterion():
    """Through a real Transformer with dropout: the doubled batch's two passes get their own
    dropout masks, and every parameter's gradient of the fused objective equals that of
    fairseq's criterion on the model's logits (float64 model; the fused blocks compute in
    fp32, whose relative rounding, ~(V + D) * U = 2e-5 of the logits' gradient, bounds the
    difference; a wiring mistake is of the order of the gradient itself)."""
    from dataclasses import replace

    from helpers import TINY_MODEL

    from nmt.model.transformer import Transformer

    torch.manual_seed(0)
    model = Transformer(replace(TINY_MODEL, dropout=0.3), 40, 40).double().train()
    g = torch.Generator().manual_seed(1)
    src = torch.randint(4, 40, (3, 6), generator=g)
    target = torch.randint(4, 40, (3, 5), generator=g)
    target[1, 3:] = PAD
    target[:, -1][target[:, -1] != PAD] = 2
    prev = torch.cat([torch.full((3, 1), 2), target[:, :-1]], dim=1).masked_fill(
        torch.cat([torch.zeros(3, 1, dtype=torch.bool), target[:, 1:] == PAD], 1), PAD
    )
    src2, prev2 = torch.cat([src, src]), torch.cat([prev, prev])
    params = [p for p in model.parameters()]

    torch.manual_seed(7)
    features = model(src2, prev2, features_only=True)  # [2B,T,D]
    fused = rdrop_output_layer_loss(features, model.output_weight, target, 0.1, PAD, 5.0)
    fused_grads = _grads(fused.minimized, *params)
    torch.manual_seed(7)  # the same dropout masks
    reference = _rdrop_reference(model(src2, prev2), target, 0.1, 5.0)
    reference_grads = _grads(reference[0], *params)
    assert fused.objective.item() == pytest.approx(reference[0].item(), rel=1e-5)
    assert fused.kl.item() == pytest.approx(reference[3].item(), rel=1e-4)
    assert fused.kl.item() > 0.01  # dropout made the passes differ
    # The rounding enters at the logits and flows on linearly: it is bounded by the size of
    # the whole gradient, not by that of a parameter whose own gradient nearly cancels.
    total = torch.stack([b.norm() for b in reference_grads]).norm()
    for p, a, b in zip(params, fused_grads, reference_grads):
        assert (a - b).norm() <= 1e-4 * total, p.shape
    assert (
        max(
            (a - b).norm() / b.norm()
            for a, b in zip(fused_grads, reference_grads)
            if b.norm() > 1e-3 * total
        )
        < 1e-4
    )


@pytest.mark.parametrize("seed", [0, 1])
def test_fused_rdrop_under_bf16_autocast_is_as_accurate_as_unfused_autocast(seed):
    features, weight, target = _two_passes(seed, vocab=300, dim=32)
    exact = _grads(
        _rdrop_reference(features.double() @ weight.double().t(), target, 0.1, 5.0)[0],
        features,
        weight,
    )
    with torch.autocast("cpu", dtype=torch.bfloat16):
        unfused_out = _rdrop_reference(F.linear(features, weight), target, 0.1, 5.0)
        unfused = _grads(unfused_out[0], features, weight)
        fused_out = rdrop_output_layer_loss(features, weight, target, 0.1, PAD, 5.0)
        fused = _grads(fused_out.minimized, features, weight)
    assert fused_out.objective.item() == pytest.approx(unfused_out[0].item(), rel=1e-4)
    assert features.grad.dtype == weight.grad.dtype == torch.float32
    for i in (0, 1):  # bf16 rounding of the logits and the projections, no worse than unfused
        assert (fused[i] - exact[i]).abs().max() <= 1.25 * (unfused[i] - exact[i]).abs().max()
