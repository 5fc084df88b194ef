#!/usr/bin/env python
"""Average the weights of several checkpoints of one run into one that nmt-generate loads.

    python scripts/average_checkpoints.py --inputs runs/m30k --num-last 5 --output avg.pt
    python scripts/average_checkpoints.py --inputs runs/m30k --num-best 3   # needs keep_best>=3
    python scripts/average_checkpoints.py --inputs a.pt b.pt c.pt --output avg.pt

The options follow fairseq's scripts/average_checkpoints.py. With a run dir, --num-last
takes the newest numbered checkpoints (checkpoint_<epoch>_<update>.pt, kept: keep_last) and
--num-best the best ones (checkpoint.best_<metric>_<value>.pt, kept: keep_best). The output
(default: <run dir>/checkpoint_avg_last<K>.pt or ..._best<K>.pt) has no training state:
start a new run from it with finetune_from=<output>.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from nmt.checkpoint import save_checkpoint
from nmt.errors import NmtError
from nmt.training.checkpointing import CheckpointManager, average_checkpoints


def select(run_dir: Path, last: int | None, best: int | None) -> list[Path]:
    """The checkpoints to average, newest (or best) first."""
    if not run_dir.is_dir():
        raise NmtError(f"{run_dir}: no such run dir")
    if last is not None:
        found = [
            p
            for _, p in CheckpointManager(
                run_dir, keep_last=-1, keep_best=0, metric="", maximize=False
            ).numbered()
        ]
        what = "numbered checkpoints (checkpoint_<epoch>_<update>.pt)"
        want = last
    else:
        found = []
        for metric, maximize in (("loss", False), ("nll", False), ("bleu", True)):
            found += [
                p
                for _, p in CheckpointManager(
                    run_dir, keep_last=-1, keep_best=0, metric=metric, maximize=maximize
                ).best_k()
            ]
        what = "checkpoint.best_<metric>_<value>.pt files (see keep_best)"
        want = best
    if len(found) < want:
        raise NmtError(f"{run_dir}: asked for {want} but found {len(found)} {what}")
    return found[:want]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--inputs",
        nargs="+",
        type=Path,
        required=True,
        help="a run dir (with --num-last/--num-best), or the checkpoint files to average",
    )
    group = parser.add_mutually_exclusive_group()
    group.add_argument(
        "--num-last", type=int, help="average the newest K numbered checkpoints of the run dir"
    )
    group.add_argument("--num-best", type=int, help="average the K best checkpoints of the run dir")
    parser.add_argument("-o", "--output", type=Path, help="output file")
    args = parser.parse_args(argv)
    try:
        k = args.num_last if args.num_last is not None else args.num_best
        if k is None:
            paths = list(args.inputs)
            if any(p.is_dir() for p in paths):
                raise NmtError("--inputs: a run dir needs --num-last K or --num-best K")
            output = args.output or paths[0].with_name("checkpoint_avg.pt")
        else:
            if len(args.inputs) != 1 or not args.inputs[0].is_dir():
                raise NmtError("--num-last/--num-best: give exactly one run dir in --inputs")
            if k < 1:
                raise NmtError(
                    f"--num-{'last' if args.num_last is not None else 'best'} {k}: must be 1 or more"
                )
            run_dir = args.inputs[0]
            paths = select(run_dir, args.num_last, args.num_best)
            kind = "last" if args.num_last is not None else "best"
            output = args.output or run_dir / f"checkpoint_avg_{kind}{k}.pt"
        save_checkpoint(average_checkpoints(paths), output)
    except NmtError as exc:
        print(f"average_checkpoints: error: {exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
