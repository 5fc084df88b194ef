"""nmt-average: average the weights of several checkpoints (see configs/average.yaml)."""

from __future__ import annotations

from nmt.training.config import AverageConfig


def run(cfg: AverageConfig) -> None:
    """Average the selected checkpoints into `output` and say which ones."""
    from nmt.training.averaging import average

    result = average(cfg)
    names = ", ".join(p.name for p in result.inputs)
    print(f"averaged {len(result.inputs)} checkpoints ({names}) into {result.output}")
