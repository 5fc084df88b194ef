"""The running figures of training between two log lines, and the run's clock.

Per update only device tensors are touched (no host-device sync): this rank's summed loss,
nll and (R-Drop) KL, the summed gradient norm, and the first update whose gradient was not
finite.
They are read when a line is logged, a checkpoint saved or validation run.
"""

from __future__ import annotations

import time

import torch

from nmt import distributed
from nmt.errors import NmtError
from nmt.training.loss import per_token_base2, perplexity


class TrainMeter:
    """Loss, nll, gnorm, tokens and updates since the last log line; the run's clock."""

    def __init__(self, device: torch.device, precision: str, *, report_kl: bool = False) -> None:
        self.precision = precision  # named in the non-finite error
        self.report_kl = report_kl  # R-Drop: log the two passes' KL per token
        self.sums = torch.zeros(4, dtype=torch.float64, device=device)  # [loss, nll, kl, gnorm]
        self.nonfinite_at = torch.full((), -1, dtype=torch.long, device=device)
        self.tokens = 0  # target tokens of all ranks (skipped fp16 updates included)
        self.updates = 0  # updates made (skipped ones not counted)
        self.lr = 0.0  # learning rate of the latest update
        self.schedule_position = 0.0  # where the lr schedule stood at it (updates or budget share)
        self.run_start = self.interval_start = time.monotonic()

    def start_run(self) -> None:
        """The run's training time starts now (and so does the first interval)."""
        self.run_start = self.interval_start = time.monotonic()

    def run_seconds(self) -> float:
        """Seconds since start_run (earlier runs' time is the caller's)."""
        return time.monotonic() - self.run_start

    def exclude(self, seconds: float) -> None:
        """Keep `seconds` (validation) out of the current interval's tokens/s."""
        self.interval_start += seconds

    def add_losses(self, sums: torch.Tensor) -> None:
        """This rank's [loss, nll, kl] sums of one update (float64, on the device)."""
        self.sums[:3] += sums

    def add_update(self, gnorm: torch.Tensor, update: int) -> None:
        """A made update, numbered `update`, with its (unclipped) gradient norm."""
        self.updates += 1
        self.sums[3] += gnorm.double()
        # Remember the first update with a non-finite gradient without a device sync.
        self.nonfinite_at = torch.where(
            (self.nonfinite_at < 0) & ~torch.isfinite(gnorm),
            torch.full_like(self.nonfinite_at, update),
            self.nonfinite_at,
        )

    def check_finite(self) -> None:
        """NmtError naming the first update whose loss or gradient was NaN/inf (a sync)."""
        bad = int(self.nonfinite_at)
        if bad >= 0:
            raise NmtError(
                f"update {bad}: the loss or gradient is not finite (NaN/inf) in "
                f"precision={self.precision}; checkpoint_last.pt holds the last good "
                "state: lower optim.lr, set optim.clip_norm, or raise optim.warmup_updates"
            )

    def summary(self) -> dict[str, float]:
        """The interval's figures over all ranks, then a fresh interval (a collective).

        loss and nll are base 2 per target token, as fairseq logs them (with R-Drop the
        mean of the two passes'); gnorm is the mean over the interval's updates.
        """
        self.check_finite()
        sums = distributed.all_reduce_sum(self.sums[:3].clone()).tolist()
        gnorm_sum = float(self.sums[3])
        seconds = max(time.monotonic() - self.interval_start, 1e-9)
        nll = per_token_base2(sums[1], self.tokens)
        metrics = {
            "loss": per_token_base2(sums[0], self.tokens),
            "nll": nll,
            "ppl": perplexity(nll),
            "lr": self.lr,
            "gnorm": gnorm_sum / max(self.updates, 1),
            "tok_s": self.tokens / seconds,
            "tokens": self.tokens,
        }
        if self.report_kl:  # (KL(p1||p2) + KL(p2||p1)) / 2 per target token, base 2
            metrics["kl"] = per_token_base2(sums[2], self.tokens)
        self.sums.zero_()
        self.tokens = 0
        self.updates = 0
        self.interval_start = time.monotonic()
        return metrics
