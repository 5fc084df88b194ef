"""Rounding-error bounds for the tests that compare floating-point results.

Two computations of one function in floating point differ by rounding, and by how much
depends on the order of their sums: another CPU (AVX2, AVX-512, AMX; MKL, oneDNN) or
another thread count blocks and vectorizes a sum differently. A tolerance must therefore
follow from the arithmetic, never from the differences one machine happened to show.

The arithmetic (Higham, "Accuracy and Stability of Numerical Algorithms", ch. 3): with
unit roundoff u (every operation exact up to a relative error u), a sum of n terms computed
in any order, blocked or with FMA, is within gamma(n) * sum|terms| of the exact sum, where
gamma(n) = n u / (1 - n u). A matrix product is a sum per element: |fl(A @ B) - A @ B| <=
gamma(k) * |A| @ |B| for an inner dimension k. A value rounded to a narrower type moves by
at most u times itself.
"""

from __future__ import annotations

import torch

from nmt.vocab import EOS

U_FP32 = 2.0**-24  # float32: 24 significant bits
U_BF16 = 2.0**-8  # bfloat16: 8 significant bits
U_FP16 = 2.0**-11  # float16: 11 significant bits
U_FP64 = 2.0**-53  # float64: 53 significant bits

# How much farther from float64 one fp32 computation may be than another of the same
# function (less_accurate).
FACTOR = 4.0


def gamma(n: int, u: float = U_FP32) -> float:
    """The bound factor of a sum of n terms: n u / (1 - n u)."""
    assert n * u < 1, "n u must stay below 1 for the bound to hold"
    return n * u / (1 - n * u)


def matmul_error_bound(a: torch.Tensor, b: torch.Tensor, u: float = U_FP32) -> torch.Tensor:
    """A bound on |fl(a @ b) - a @ b|, elementwise, for any summation order: gamma(k) *
    |a| @ |b| (k: the inner dimension), computed in float64."""
    return gamma(a.size(-1), u) * (a.double().abs() @ b.double().abs())


def float64_twin(model: torch.nn.Module) -> torch.nn.Module:
    """A float64 copy of `model` (same parameters): the reference whose own rounding
    (u = 1.1e-16) is 2**29 times below fp32's."""
    import copy

    return copy.deepcopy(model).double()


def less_accurate(
    got: torch.Tensor, reference: torch.Tensor, exact: torch.Tensor, factor: float = FACTOR
) -> bool:
    """Whether `got` is farther from the float64 result `exact` than `factor` times the
    `reference` computation is (both fp32 computations of one function, in other orders).

    Both obey the same rounding bound, so their errors against float64 are of one size;
    which order is luckier varies from tensor to tensor. Over a whole tensor (the error's
    norm, a sum over many elements) the ratio of the two stays near 1 on any machine;
    `factor` 4 leaves room for that (ratios up to 1.8 were measured). A logic error (a
    wrong position, mask, scale or row) is orders of magnitude larger. U * |exact| lets a
    result pass that is exact up to its own final rounding to fp32.
    """
    exact = exact.double()
    got_error = (got.double() - exact).norm().item()
    reference_error = (reference.double() - exact).norm().item()
    return got_error > factor * reference_error + U_FP32 * exact.norm().item()


def assert_same_function(got: torch.Tensor, want: torch.Tensor, exact: torch.Tensor) -> None:
    """got and want: fp32 results of one function computed two ways (cached and full
    decoding, a row alone and in a batch, padded and not); exact: the float64 twin's.

    The two differ by fp32 rounding in orders that vary from CPU to CPU, so no fixed
    tolerance is right on every machine: got must be as close to float64 as want is
    (less_accurate). A logic error (a wrong position, row or mask) moves the result by
    orders of magnitude more."""
    got_error = (got.double() - exact).norm().item()
    want_error = (want.double() - exact).norm().item()
    assert not less_accurate(got, want, exact), f"{got_error:.2e} vs {want_error:.2e}"


def logprob_tolerance(model: torch.nn.Module, pairs: list[tuple[list[int], list[int]]]) -> float:
    """How far two fp32 computations of `model`'s log-probabilities (one search batched two
    ways, cached or not; a search and a forced decoding) may lie apart.

    Each lies within the model's fp32 rounding of the float64 value, which is measured here:
    the largest |fp32 - float64| over every log-probability (all V of every position) of
    the teacher-forced (source ids, target ids) pairs, against the float64 twin. It is this
    machine's rounding, in this machine's summation orders; any other order's errors are
    of the same size (less_accurate: within 4x, with room to spare here since the largest
    of thousands of errors is compared with single ones). Twice that: both sides. A mean of
    such values, or one divided by a length**lenpen >= 1, stays within it."""
    twin = float64_twin(model)
    worst = 0.0
    with torch.no_grad():
        for src, tgt in pairs:
            source = torch.tensor([src])
            prev = torch.tensor([[EOS] + tgt[:-1]])  # as the decoder sees the target
            fp32 = torch.log_softmax(model(source, prev).float(), -1).double()  # [1,T,V]
            exact = torch.log_softmax(twin(source, prev), -1)  # [1,T,V]
            worst = max(worst, (fp32 - exact).abs().max().item())
    return 2 * FACTOR * worst


def text_logprob_tolerance(translator, sources: list[str], targets: list[str]) -> float:
    """logprob_tolerance of a Translator's (first) model on (source, target) texts."""
    from nmt.data.tokenizer import normalize_text

    def ids(tokenizer, text: str) -> list[int]:
        return tokenizer.encode(normalize_text(text, False)) + [EOS]

    pairs = [
        (ids(translator.src_tokenizer, s), ids(translator.tgt_tokenizer, t))
        for s, t in zip(sources, targets)
    ]
    return logprob_tolerance(translator.models[0], pairs)


def sum_tolerance(values: list[float], each: float, lenpen: float = 1.0) -> float:
    """How far sum(values) / len**lenpen may move when each value is within `each`: the
    sum of the errors, and gamma(len) of the values for each side's summing and dividing
    in fp32 (lenpen=0: the sum itself; 1: the mean)."""
    n = len(values)
    return (n * each + 2 * gamma(n) * sum(abs(v) for v in values)) / n**lenpen


def probability_sum_tolerance(keys: int, heads: int = 1) -> float:
    """How far from 1 the fp32 sum of a row of attention weights may be, whatever the
    rounding of the scores they came from.

    softmax computes e_j / s with s the computed sum of the K exponentials e_j, so the K
    quotients add up to 1 within gamma(K) (the sum s) and K U (the divisions); a mean over
    H heads adds gamma(H), and summing the row again in the test gamma(K)."""
    return gamma(3 * keys + heads)


def rounded_once(got: torch.Tensor, exact: torch.Tensor) -> bool:
    """Whether `got` (fp32) is the float64 value `exact` rounded once to fp32: within
    U_FP32 |exact|, plus the few float64 roundings (gamma(4, U_FP64)) that computed exact
    and got's own float64 steps. An fp32 computation (a sum of n checkpoints in fp32) is
    up to n times farther."""
    exact = exact.double()
    bound = (U_FP32 + 2 * gamma(4, U_FP64)) * exact.abs()
    return bool(torch.all((got.double() - exact).abs() <= bound))
