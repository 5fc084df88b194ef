"""nmt-train: train a Transformer on a data dir (see configs/train.yaml)."""

from __future__ import annotations

import sys

from nmt.training.config import TrainConfig


def run(cfg: TrainConfig) -> int | None:
    """Train, or resume from <save_dir>/checkpoint_last.pt when it exists.

    Interrupted by SIGINT/SIGTERM, the run saves checkpoint_last.pt and exits with
    128 + the signal number, so `nmt-train ... && nmt-generate ...` does not go on.
    """
    from nmt.training import train

    result = train(cfg)
    if result.stop_reason == "signal" and result.signal:
        print(
            f"nmt-train: interrupted at update {result.num_updates}; "
            f"{cfg.save_dir}/checkpoint_last.pt is saved: run the same command to resume",
            file=sys.stderr,
        )
        return 128 + result.signal
    return None
