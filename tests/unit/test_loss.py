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
