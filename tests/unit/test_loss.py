"""Label-smoothed cross-entropy: fairseq's formula, padding ignored, sums that add up."""

import math

import torch
import torch.nn.functional as F

from nmt.training.loss import label_smoothed_nll_loss, per_token_base2, perplexity

PAD = 1


def _fairseq_reference(logits: torch.Tensor, target: torch.Tensor, eps: float) -> tuple[float, float]:
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
    ce = F.cross_entropy(logits.reshape(-1, 11), target.reshape(-1), ignore_index=PAD, reduction="sum")
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
    halves = [label_smoothed_nll_loss(logits[i:i + 1], target[i:i + 1], 0.1, PAD) for i in range(3)]
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
