"""Label-smoothed cross-entropy: fairseq's formula, padding ignored, sums that add up."""

import math
from dataclasses import dataclass

import pytest
import torch
import torch.nn.functional as F
from rounding import U_BF16, U_FP16, U_FP32, gamma, matmul_error_bound

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


# ------------------------------------------------ what rounding allows (tests/rounding.py)
#
# Every fp32 result below is compared with the float64 value of the same formula, within a
# bound derived from the operations the computation performs, whatever their order: so the
# tests hold on any CPU (the fused-loss test failed on an AMD EPYC under a fixed atol
# of 1e-6, at 1.49e-6). The bounds are first order in the unit roundoff; the assertions
# allow twice them (TWICE), which covers the second-order terms while every relative error
# stays far below 1. A real mistake (eps / V instead of eps / (V - 1), a gradient row off)
# lies far outside them: test_the_bounds_catch_a_slightly_wrong_loss.

TWICE = 2.0


@dataclass
class Exact:
    """float64 results of one batch, each with a bound on an fp32 computation's error."""

    loss: float
    nll: float
    loss_bound: float
    nll_bound: float
    grad_h: torch.Tensor | None = None  # [N,D] of scale * loss, real positions
    grad_w: torch.Tensor | None = None  # [V,D]
    grad_h_bound: torch.Tensor | None = None
    grad_w_bound: torch.Tensor | None = None

    def admits(self, loss: float, nll: float) -> bool:
        return (
            abs(loss - self.loss) <= TWICE * self.loss_bound
            and abs(nll - self.nll) <= TWICE * self.nll_bound
        )

    def admits_gradients(self, grad_h: torch.Tensor, grad_w: torch.Tensor) -> bool:
        assert self.grad_h is not None and self.grad_w is not None
        return bool(
            torch.all((grad_h.double() - self.grad_h).abs() <= TWICE * self.grad_h_bound)
            and torch.all((grad_w.double() - self.grad_w).abs() <= TWICE * self.grad_w_bound)
        )


def exact_with_bounds(
    z: torch.Tensor,
    gold: torch.Tensor,
    eps: float,
    rows: int,
    logit_error: torch.Tensor | float = 0.0,
    h: torch.Tensor | None = None,
    w: torch.Tensor | None = None,
    scale: float = 3.0,
    input_unit: float = 0.0,
    grad_unit: float = 0.0,
) -> Exact:
    """The label-smoothed loss and nll of the exact logits z [N,V] (the N real positions)
    against gold [N] in float64, with bounds on an fp32 computation's distance from them.

    `logit_error` [N,V]: how far the computed logits may be from z (0 when the logits are
    the input; gamma(D) |h| @ |w|.T when fp32 computes h @ w.T; more under bf16). `rows`:
    the rows the computation's sums run over (padding included). Given h [N,D] and w [V,D]
    (z = h @ w.T), also the gradients of scale * loss, where `input_unit` is the rounding of
    h and w to the compute dtype and `grad_unit` that of the logits' gradient and of the
    gradients' matmul outputs (0 in fp32; U_BF16 under bf16 autocast).

    Row by row, with m the row's largest logit and lse its log-sum-exp:
    - lse moves by at most the largest logit error (its gradient, softmax, sums to 1);
    - computing lse rounds z - m, V exponentials (1 ulp = 2U each), a sum of V terms, a log
      and + m: gamma(V + 4) * (1 + max|z - m| + 2 |lse - m| + |lse|) covers them;
    - a log-probability z_j - lse adds its logit's error and U |z_j - lse|;
    - the nll and smoothing sums add gamma(terms) * sum|terms|, the smoothing counting the
      V |m|, sum|z| and V |lse - m| terms the fused path adds;
    - the logits' gradient scale * (p - eps_i - (1 - eps - eps_i) onehot): p = exp(z - lse)
      carries the log-probability's error relatively, the rest adds gamma(4) of its terms;
    - the gradients are matmuls of it: its error through |w| (|h|), plus gamma(V) (gamma(N))
      and the input and output roundings of |dz| @ |w| (|dz|.T @ |h|).
    """
    z, gold = z.double(), gold.reshape(-1)
    vocab = z.size(-1)
    eps_i = eps / (vocab - 1)
    gold_weight = 1.0 - eps - eps_i
    onehot = F.one_hot(gold, vocab).double()  # [N,V]
    logit_error = torch.as_tensor(logit_error, dtype=torch.float64).expand_as(z)
    top = z.amax(-1, keepdim=True)  # [N,1]
    lse = torch.logsumexp(z, -1, keepdim=True)  # [N,1]
    lprobs = z - lse  # [N,V]
    spread = (z - top).abs().amax(-1, keepdim=True)  # [N,1]
    lse_rounding = gamma(vocab + 4) * (1 + spread + 2 * (lse - top).abs() + lse.abs())
    lse_error = logit_error.amax(-1, keepdim=True) + lse_rounding  # [N,1]
    lprob_error = logit_error + lse_error + U_FP32 * lprobs.abs()  # [N,V]

    gold_lprob = (lprobs * onehot).sum(-1)  # [N]
    nll = -gold_lprob.sum().item()
    nll_bound = (lprob_error * onehot).sum().item() + gamma(rows) * gold_lprob.abs().sum().item()
    smooth = -lprobs.sum().item()
    smooth_terms = vocab * (top.abs() + (lse - top).abs()).sum() + z.abs().sum()
    smooth_bound = (
        lprob_error.sum() + gamma(vocab + rows + 2) * (smooth_terms + lprobs.abs().sum())
    ).item()
    if eps:
        loss = gold_weight * nll + eps_i * smooth
        loss_bound = (
            gold_weight * nll_bound
            + eps_i * smooth_bound
            + 2 * U_FP32 * (gold_weight * abs(nll) + eps_i * abs(smooth))
        )
    else:
        loss, loss_bound = nll, nll_bound
    exact = Exact(loss, nll, loss_bound, nll_bound)
    if h is None or w is None:
        return exact

    h, w = h.double(), w.double()
    p = lprobs.exp()  # [N,V]
    dz = scale * (p - eps_i - gold_weight * onehot)  # [N,V]
    p_relative_error = lprob_error + gamma(vocab + 4) * (1 + 2 * spread)
    dz_error = scale * (p * p_relative_error + gamma(4) * (p + eps_i + gold_weight * onehot))
    rounding = input_unit + 2 * grad_unit
    exact.grad_h = dz @ w  # [N,D]
    exact.grad_w = dz.t() @ h  # [V,D]
    exact.grad_h_bound = dz_error @ w.abs() + (gamma(vocab + 2) + rounding) * (dz.abs() @ w.abs())
    exact.grad_w_bound = dz_error.t() @ h.abs() + (gamma(rows + 2) + rounding) * (
        dz.abs().t() @ h.abs()
    )
    return exact


def _real(logits: torch.Tensor, target: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """The logits [N,V] and gold tokens [N] of the non-pad positions of a [B,T,V] batch."""
    keep = target.reshape(-1) != PAD
    return logits.reshape(-1, logits.size(-1))[keep], target.reshape(-1)[keep]


def _exact_of_logits(logits, target, eps, logit_error=0.0) -> Exact:
    z, gold = _real(logits.detach(), target)
    return exact_with_bounds(z, gold, eps, target.numel(), logit_error)


def test_matches_fairseq_formula():
    logits, target = _batch()
    out = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    ref_loss, ref_nll = _fairseq_reference(logits, target, 0.1)
    exact = _exact_of_logits(logits, target, 0.1)
    # the bounds' float64 values are fairseq's formula (to float64 rounding: ~1e-15)
    assert math.isclose(exact.loss, ref_loss, rel_tol=1e-12)
    assert math.isclose(exact.nll, ref_nll, rel_tol=1e-12)
    assert exact.admits(out.loss.item(), out.nll.item())


def test_no_smoothing_is_cross_entropy_sum_over_non_pad():
    logits, target = _batch(1)
    out = label_smoothed_nll_loss(logits, target, 0.0, PAD)
    ce = F.cross_entropy(
        logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum"
    )
    # two fp32 computations of one sum: each within its bound of float64
    exact = _exact_of_logits(logits, target, 0.0)
    assert exact.admits(out.loss.item(), out.nll.item()) and exact.admits(ce.item(), ce.item())


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
    parts = [_exact_of_logits(logits[i : i + 1], target[i : i + 1], 0.1) for i in range(3)]
    whole_exact = _exact_of_logits(logits, target, 0.1)
    assert math.isclose(whole_exact.loss, sum(p.loss for p in parts), rel_tol=1e-12)
    # fp32: the whole and each part within their bounds, and the sum of 3 parts adds gamma(3)
    sum_of_parts = sum(h.loss.item() for h in halves)
    allowed = TWICE * (whole_exact.loss_bound + sum(p.loss_bound for p in parts))
    allowed += gamma(3) * sum(abs(h.loss.item()) for h in halves)
    assert abs(whole.loss.item() - sum_of_parts) <= allowed


def test_bf16_logits_give_fp32_loss_close_to_fp32():
    logits, target = _batch(4)
    out32 = label_smoothed_nll_loss(logits, target, 0.1, PAD)
    out16 = label_smoothed_nll_loss(logits.bfloat16(), target, 0.1, PAD)
    assert out16.loss.dtype == torch.float32
    assert _exact_of_logits(logits, target, 0.1).admits(out32.loss.item(), out32.nll.item())
    # bf16 logits: each rounded by at most U_BF16 of itself, then the same fp32 arithmetic
    z, _ = _real(logits, target)
    bf16 = _exact_of_logits(logits, target, 0.1, logit_error=U_BF16 * z.double().abs())
    assert bf16.admits(out16.loss.item(), out16.nll.item())


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


def _exact_of_features(features, weight, target, eps, unit: float = 0.0) -> Exact:
    """The float64 loss and gradients of features @ weight.T, with the bounds of an fp32
    computation (unit=0) or of one under autocast to a type of unit roundoff `unit` (the
    operands and the logits rounded to it, the logits' gradient and the gradients'
    matmul outputs too)."""
    keep = target.reshape(-1) != PAD
    h = features.detach().reshape(-1, features.size(-1))[keep]  # [N,D]
    w = weight.detach()  # [V,D]
    # float64 products of fp32 numbers are exact, their sums of D terms almost (2**-53)
    z = h.double() @ w.double().t()  # [N,V]
    logit_error = matmul_error_bound(h, w.t()) + (2 * unit * (h.abs() @ w.abs().t())).double()
    logit_error = logit_error + unit * z.abs()
    gold = target.reshape(-1)[keep]
    return exact_with_bounds(
        z,
        gold,
        eps,
        target.numel(),
        logit_error,
        h=h,
        w=w,
        input_unit=unit,
        grad_unit=unit,
    )


def _padded(grad_h: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    """The [B,T,D] gradient of the features holds [N,D] at the real positions."""
    return grad_h.reshape(-1, grad_h.size(-1))[target.reshape(-1) != PAD]


@pytest.mark.parametrize("eps", [0.0, 0.1])
@pytest.mark.parametrize("block_elements", [11, 33, 1 << 20])  # 1 row, 3 rows, all rows
def test_fused_output_layer_loss_equals_logits_then_loss(eps, block_elements):
    """Both fp32 paths (logits then loss; the fused blocks) lie within the rounding bounds
    of fp32 arithmetic of the float64 result, for the loss, the nll and both gradients.

    The paths sum the same terms in different orders, which also differ from CPU to CPU
    (vector widths, blocking); the bounds hold for every order (see exact_with_bounds)."""
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
    exact = _exact_of_features(features, weight, target, eps)
    for loss, nll, grad_f, grad_w in (plain, fused):
        assert exact.admits(loss, nll)
        assert exact.admits_gradients(_padded(grad_f, target), grad_w)
    assert torch.all(plain[2][target == PAD] == 0)  # padding positions get no gradient
    assert torch.all(fused[2][target == PAD] == 0)


def test_the_bounds_catch_a_slightly_wrong_loss():
    """The bounds are no formality: a smoothing spread over V classes instead of V - 1
    (a 10% change of eps_i here, 1e-3 of the loss) falls outside them, and so does a
    gradient without the smoothing term, or with one row of another token's."""
    features, weight, target = _features()
    exact = _exact_of_features(features, weight, target, 0.1)
    logits = features.detach() @ weight.detach().t()  # [B,T,V]
    vocab = logits.size(-1)
    out = label_smoothed_nll_loss(logits, target, 0.1 * (vocab - 1) / vocab, PAD)
    assert not exact.admits(out.loss.item(), out.nll.item())
    z, gold = _real(logits, target)
    dz = 3.0 * (torch.softmax(z, -1) - F.one_hot(gold, vocab) * (1 - 0.1))  # no eps_i
    h = _real(features.detach(), target)[0]
    assert not exact.admits_gradients(dz @ weight.detach(), dz.t() @ h)
    eps_i = 0.1 / (vocab - 1)
    right = 3.0 * (torch.softmax(z, -1) - eps_i - F.one_hot(gold, vocab) * (1 - 0.1 - eps_i))
    assert exact.admits_gradients(right @ weight.detach(), right.t() @ h)
    swapped = right.clone()
    swapped[0] = right[1]  # one position's gradient from another
    assert not exact.admits_gradients(swapped @ weight.detach(), swapped.t() @ h)


@pytest.mark.parametrize("seed", [0, 1, 2])
def test_fused_output_layer_loss_under_bf16_autocast_is_as_accurate_as_plain_autocast(seed):
    """Under bf16 autocast both paths round the operands, the logits and the logits'
    gradient to bf16 and compute the loss in fp32: both lie within bf16's bounds of the
    float64 result, and the gradients come back as fp32."""
    features, weight, target = _features(seed, vocab=300, dim=32)
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
    assert features.grad.dtype == weight.grad.dtype == torch.float32
    exact = _exact_of_features(features, weight, target, 0.1, unit=U_BF16)
    for loss, nll, grad_f, grad_w in (plain, fused):
        assert exact.admits(loss, nll)
        assert exact.admits_gradients(_padded(grad_f, target), grad_w)


def test_fused_output_layer_loss_without_gradients():
    features, weight, target = _features()
    with torch.no_grad():
        out = output_layer_loss(features, weight, target, 0.1, PAD)
    assert _exact_of_features(features, weight, target, 0.1).admits(out.loss.item(), out.nll.item())
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
    z16 = torch.mm(h16, w16.t()).double()  # [n,V]
    p = torch.softmax(z16, dim=-1)  # [n,V]
    assert p[:, :5].max() < 1e-7  # below fp16's smallest normal number, 6.1e-5
    dz = p - torch.nn.functional.one_hot(target.reshape(-1), vocab).double()  # [n,V]
    want = dz.t() @ h16.double()  # [V,D]
    got = w.grad.double() / scale  # unscaled, as the loss scaler will
    others = torch.arange(vocab) != 5
    # What fp16 allows: the scaled gradient scale * dz (fp32, from the same fp16 logits: the
    # same torch.mm of the same operands) is rounded to fp16, multiplied by the fp16 h with
    # fp32 sums, and the product rounded to fp16. Rounding to fp16 moves x by at most
    # max(U_FP16 |x|, 2**-25) (half the spacing of its subnormals); the fp32 softmax and
    # sums add gamma(V + n + 4) (1 + 2 * spread) of |dz|. Unscaled by 1 / scale.
    spread = (z16.amax(-1, keepdim=True) - z16).amax()
    terms = dz.abs().t() @ h16.double().abs()  # [V,D]
    fp32_part = gamma(vocab + n + 4) * (1 + 2 * spread.item()) * terms
    fp16_part = U_FP16 * (2 * terms) + 2**-25 * (h16.double().abs().sum(0) + 1) / scale
    bound = fp32_part + fp16_part
    assert torch.all((got - want)[others].abs() <= TWICE * bound[others])
    # ... which is fp16's precision: a relative error of ~1e-3, where rounding p to fp16
    # before scaling would lose all of it (p < 6e-8 underflows to 0: relative error 1)
    assert (TWICE * bound[others]).norm() < 1e-2 * want[others].norm()
    # (the gold row's p - 1 cancels in fp32 already, on any device; not fp16's doing)


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
