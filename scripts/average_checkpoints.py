#!/usr/bin/env python
"""Average checkpoints: the old script's options over nmt-average's library call.

Prefer the console command, whose keys are the same options:

    nmt-average inputs=runs/m30k num_last=5 output=avg.pt
    python scripts/average_checkpoints.py --inputs runs/m30k --num-last 5 --output avg.pt
    python scripts/average_checkpoints.py --inputs runs/m30k --num-best 3   # needs checkpoint.keep_best>=3
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

See configs/average.yaml and nmt.training.averaging for what is selected and written.
"""

from __future__ import annotations

import argparse
import sys

from nmt.errors import NmtError
from nmt.training.averaging import average
from nmt.training.config import AverageConfig


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--inputs",
        nargs="+",
        required=True,
        help="a run dir (with --num-last/--num-best), or the checkpoint files to average",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--num-last", type=int, default=0, help="average the newest K numbered checkpoints"
    )
    group.add_argument("--num-best", type=int, default=0, help="average the K best checkpoints")
    parser.add_argument("-o", "--output", help="output file")
    args = parser.parse_args(argv)
    cfg = AverageConfig(
        inputs=args.inputs, num_last=args.num_last, num_best=args.num_best, output=args.output
    )
    try:
        result = average(cfg)
    except NmtError as exc:
        print(f"average_checkpoints: error: {exc}", file=sys.stderr)
        return 2
    names = ", ".join(p.name for p in result.inputs)
    print(f"averaged {len(result.inputs)} checkpoints ({names}) into {result.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
