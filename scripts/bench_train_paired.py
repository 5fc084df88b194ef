#!/usr/bin/env python
"""Paired training throughput of two code versions, interleaved in one process.

Separate runs on a shared machine cannot tell a 5% gain from drift (paired_revision.py).
This script imports a second copy of nmt from a git revision (as the package
`nmt_before`), builds one Trainer per version and precision in the same process, and runs
them in turns on the same fresh batches, `--chunk` updates each.

    python scripts/bench_train_paired.py --data <Multi30k data dir> --before HEAD~1
    python scripts/bench_train_paired.py --data <Multi30k data dir> --before none   # bf16/fp32

It prints target tokens/s per trainer, after/before per precision, and bf16/fp32 per
version. The shape is bench_train.py's (the fairseq peer's transformer_small).
"""

from __future__ import annotations

import argparse
import importlib
import tempfile
import time
from pathlib import Path

import torch
from paired_revision import import_both


def make_trainer(package: str, precision: str, args: argparse.Namespace):
    """(trainer, its one-update function) of `package`: the library's build_training, or
    the Trainer class of revisions from before it (`--before` may name one)."""
    from bench_train import train_cfg

    cfg = train_cfg(args, precision, Path(tempfile.mkdtemp()), package)
    training = importlib.import_module(f"{package}.training")
    if hasattr(training, "build_training"):
        trainer = training.build_training(cfg)
        return trainer, trainer.train_step
    trainer = importlib.import_module(f"{package}.training.trainer").Trainer(cfg)
    return trainer, trainer._train_step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", required=True, help="data dir from nmt-preprocess")
    parser.add_argument(
        "--before",
        default="HEAD",
        help="git revision to compare the working tree with; 'none': only the "
        "working tree, its precisions interleaved (a drift-free bf16/fp32)",
    )
    parser.add_argument("--model", default="transformer_small")
    parser.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--warmup", type=int, default=10, help="updates per trainer before measuring"
    )
    parser.add_argument("--chunk", type=int, default=5, help="updates per turn")
    parser.add_argument("--rounds", type=int, default=8, help="turns per trainer")
    args = parser.parse_args()
    # bench_train.train_cfg's fields: its default shape, run with no update limit here
    args.updates, args.log_interval, args.fairseq_shape, args.device = 0, 50, True, "cpu"
    torch.set_num_threads(args.threads)

    versions = ["nmt"] if args.before == "none" else ["nmt_before", "nmt"]
    if args.before != "none":
        import_both(args.before)
    keys = [(version, p) for version in versions for p in args.precisions]
    made = {key: make_trainer(*key, args) for key in keys}
    steps = {key: train_step for key, (_, train_step) in made.items()}
    current = made[("nmt", args.precisions[0])][0]  # the working tree's Trainer
    data = current.data.train
    batches = current.data.epoch_batches(1)  # both versions' seeded lists are the same
    needed = args.warmup + args.chunk * args.rounds
    if len(batches) < needed:
        raise SystemExit(f"the first epoch has {len(batches)} batches; this run needs {needed}")
    for train_step in steps.values():
        for batch in batches[: args.warmup]:
            train_step([batch])
    seconds = dict.fromkeys(keys, 0.0)
    tokens = 0
    for turn in range(args.rounds):
        start = args.warmup + turn * args.chunk
        chunk = batches[start : start + args.chunk]
        tokens += sum(int(data.tgt_sizes[b].sum()) for b in chunk)
        for key in keys if turn % 2 == 0 else reversed(keys):  # alternate who goes first
            begin = time.perf_counter()
            for batch in chunk:
                steps[key]([batch])
            seconds[key] += time.perf_counter() - begin
    rate = {key: tokens / s for key, s in seconds.items()}
    label = {"nmt_before": f"before ({args.before})", "nmt": "after (working tree)"}
    for (version, p), r in rate.items():
        print(f"{label[version]:>24} {p}: {r:7.0f} target tok/s")
    for p in args.precisions if len(versions) == 2 else []:
        print(f"{p}: after/before {rate[('nmt', p)] / rate[('nmt_before', p)]:.3f}")
    for version in versions:
        for p in args.precisions[1:]:
            print(
                f"{label[version]}: {p}/{args.precisions[0]} "
                f"{rate[(version, p)] / rate[(version, args.precisions[0])]:.2f}"
            )


if __name__ == "__main__":
    main()
