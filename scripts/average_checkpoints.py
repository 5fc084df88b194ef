#!/usr/bin/env python
"""Average the weights of several checkpoints of one run into one that nmt-generate loads.

    python scripts/average_checkpoints.py runs/m30k --last 5            # newest 5 numbered
    python scripts/average_checkpoints.py runs/m30k --best 3 -o avg.pt  # 3 best (keep_best>=3)
    python scripts/average_checkpoints.py --inputs a.pt b.pt -o avg.pt  # explicit files

Numbered checkpoints are checkpoint_<epoch>_<update>.pt (kept: keep_last); the best ones
are checkpoint.best_<metric>_<value>.pt (kept: keep_best). The output has no training
state: resume from it with finetune_from=<output>.
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
        found = [p for _, p in CheckpointManager(run_dir, keep_last=-1, keep_best=0, metric="",
                                                 maximize=False).numbered()]
        what = "numbered checkpoints (checkpoint_<epoch>_<update>.pt)"
        want = last
    else:
        found = []
        for metric, maximize in (("loss", False), ("nll", False), ("bleu", True)):
            found += [p for _, p in CheckpointManager(run_dir, keep_last=-1, keep_best=0, metric=metric,
                                                      maximize=maximize).best_k()]
        what = "checkpoint.best_<metric>_<value>.pt files (see keep_best)"
        want = best
    if len(found) < want:
        raise NmtError(f"{run_dir}: asked for {want} but found {len(found)} {what}")
    return found[:want]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run_dir", nargs="?", type=Path, help="the training run's save_dir")
    group = parser.add_mutually_exclusive_group(required=True)
    group.add_argument("--last", type=int, help="average the newest K numbered checkpoints")
    group.add_argument("--best", type=int, help="average the K best checkpoints")
    group.add_argument("--inputs", nargs="+", type=Path, help="average exactly these files")
    parser.add_argument("-o", "--output", type=Path, help="output file (default: in run_dir)")
    args = parser.parse_args(argv)
    try:
        if args.inputs:
            paths = args.inputs
            output = args.output or paths[0].with_name("checkpoint_avg.pt")
        else:
            if args.run_dir is None:
                raise NmtError("give the run dir, or --inputs FILE ...")
            k = args.last if args.last is not None else args.best
            if k < 1:
                raise NmtError(f"--{'last' if args.last is not None else 'best'} {k}: must be 1 or more")
            paths = select(args.run_dir, args.last, args.best)
            kind = "last" if args.last is not None else "best"
            output = args.output or args.run_dir / f"checkpoint_avg_{kind}{k}.pt"
        save_checkpoint(average_checkpoints(paths), output)
    except NmtError as exc:
        print(f"average_checkpoints: error: {exc}", file=sys.stderr)
        return 2
    print(f"averaged {len(paths)} checkpoints ({', '.join(p.name for p in paths)}) into {output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
