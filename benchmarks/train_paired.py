"""Paired training throughput of two code versions, interleaved in one process.

Separate runs on a shared machine cannot tell a 5% gain from drift. This benchmark imports
a second copy of nmt from a git revision (benchmarks.common.import_revision, as the
package nmt_at_<commit>), builds one Trainer per version and precision in the same process
(nmt.training.build_training, or the Trainer class of revisions before issue 16, such as
f3ffaaf), and lets them train in turns on the same fresh batches, `--chunk` updates each.

    .venv/bin/python -m benchmarks.train_paired --data work/bench/data-bin --before f3ffaaf
    .venv/bin/python -m benchmarks.train_paired --data work/bench/data-bin --before HEAD  # A/A
    .venv/bin/python -m benchmarks.train_paired --data work/bench/data-bin --before none  # bf16/fp32

It prints target tokens/s per trainer, after/before per precision and bf16/fp32 per
version, each ratio with its noise: a 95% interval from the per-turn ratios (an A/A run,
`--before HEAD` on a clean tree, should contain 1.00). The shape is benchmarks.train's
(the fairseq peer's transformer_small).

How the turns are run, and why (an A/A run of the first version of this benchmark read
1.31 for bf16 in one run and 0.96 in another):
- the order of the trainers changes every turn in a balanced cycle (common.balanced_orders):
  each trainer is first, second, ... equally often and follows each other trainer equally
  often. Forward/backward alternation made the last trainer of a turn run again first in
  the next, always the same two trainers, one per precision;
- a warm-up of whole turns in that order, not one trainer's warm-up after the other: the
  trainers reach their steady state (optimizer moments allocated, the allocator's pools
  grown to every trainer's working set) together;
- each trainer draws its dropout masks from an RNG stream of its own, so the versions
  compute the same updates (and the same loss, printed at the end) as runs alone would;
- every ratio comes with its noise: a run whose interval is wider than the change it is
  meant to show has not shown it.
"""

from __future__ import annotations

import argparse
import random
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.train import train_overrides

NAME = "train_paired"


class RngStream:
    """One trainer's own torch/numpy/python RNG state, swapped in around its turn."""

    def __init__(self) -> None:
        self.state = self.capture()

    @staticmethod
    def capture() -> tuple[Any, Any, Any]:
        import numpy as np
        import torch

        return torch.get_rng_state(), np.random.get_state(), random.getstate()

    def __enter__(self) -> RngStream:
        import numpy as np
        import torch

        torch_state, np_state, py_state = self.state
        torch.set_rng_state(torch_state)
        np.random.set_state(np_state)
        random.setstate(py_state)
        return self

    def __exit__(self, *exc: object) -> None:
        self.state = self.capture()


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument("--data", type=common.data_dir, required=True, help="data dir (Multi30k)")
    p.add_argument(
        "--before",
        default="HEAD",
        help="git revision to compare the working tree with; 'none': only the working "
        "tree, its precisions interleaved (a drift-free bf16/fp32)",
    )
    p.add_argument("--model", default="transformer_small")
    p.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--max-tokens", type=common.positive_int, default=4096)
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an nmt-train override on top of the benchmark's, for both versions (repeatable)",
    )
    p.add_argument(
        "--warmup-turns",
        type=common.nonnegative_int,
        default=4,
        help="turns not measured, each of --chunk updates per trainer",
    )
    p.add_argument("--chunk", type=common.positive_int, default=2, help="updates per turn")
    p.add_argument(
        "--turns",
        type=common.positive_int,
        default=16,
        help="measured turns per trainer (a multiple of the order's cycle: the number "
        "of trainers, twice that when it is odd)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    waiting = common.passive_openmp()  # before torch loads
    import torch

    if len(set(args.precisions)) != len(args.precisions):
        raise common.BenchError(f"--precisions {' '.join(args.precisions)}: each at most once")
    before = None if args.before == "none" else common.revision_id(args.before)
    versions = ["nmt"] if before is None else [f"nmt_at_{before}", "nmt"]
    keys = [(version, p) for version in versions for p in args.precisions]
    cycle = len(common.balanced_orders(len(keys)))
    if args.turns % cycle or args.warmup_turns % cycle:
        raise common.BenchError(
            f"--turns {args.turns} / --warmup-turns {args.warmup_turns}: must be multiples "
            f"of {cycle}, the balanced order's cycle for {len(keys)} trainers (or 0 warm-up)"
        )
    torch.set_num_threads(args.threads)
    print(f"# {waiting}")
    labels = {"nmt": f"after ({common.worktree_id()})"}
    if before is not None:
        labels[versions[0]] = f"before ({before})"
        common.import_revision(before)

    tmp = tempfile.TemporaryDirectory()
    handles, streams = {}, {}
    for key in keys:
        version, precision = key
        overrides = train_overrides(
            data=args.data.resolve(),
            save_dir=Path(tmp.name) / f"{version}-{precision}",
            precision=precision,
            model=args.model,
            threads=args.threads,
            max_tokens=args.max_tokens,
            extra=args.set,
        )
        handles[key] = common.TrainerHandle.build(version, common.train_config(version, overrides))
        streams[key] = RngStream()  # each trainer's build seeded the RNGs: keep that state
    current = handles[("nmt", args.precisions[0])].trainer  # the working tree's API
    data = current.data.train
    batches = current.data.epoch_batches(1)  # every version's seeded list is the same
    total = args.chunk * (args.warmup_turns + args.turns)
    if len(batches) < total:
        raise common.BenchError(
            f"the data dir's first epoch has {len(batches)} batches; this run needs {total}"
        )
    chunks = [batches[i : i + args.chunk] for i in range(0, total, args.chunk)]
    tokens = [int(sum(data.tgt_sizes[b].sum() for b in chunk)) for chunk in chunks]

    def contestant(key: tuple[str, str]):
        handle, stream = handles[key], streams[key]

        def turn(t: int) -> None:
            with stream:
                for batch in chunks[t]:
                    handle.step([batch])

        return turn

    def progress(turn: int, timings: list[common.Timing]) -> None:
        measured = turn - args.warmup_turns
        what = f"turn {measured + 1}/{args.turns}" if measured >= 0 else "warm-up turn"
        rates = ", ".join(
            f"{side(v, p)} {tokens[turn] / t.wall:,.0f}" for (v, p), t in zip(keys, timings)
        )
        print(f"  {what}: target tok/s {rates}", flush=True)

    timings = common.interleave(
        [contestant(k) for k in keys], args.warmup_turns + args.turns, on_turn=progress
    )
    measured_tokens = sum(tokens[args.warmup_turns :])
    measured = {key: ts[args.warmup_turns :] for key, ts in zip(keys, timings)}
    wall = {key: sum(t.wall for t in ts) for key, ts in measured.items()}
    cpu = {key: sum(t.cpu for t in ts) for key, ts in measured.items()}
    rate = {key: measured_tokens / s for key, s in wall.items()}
    for (version, p), r in rate.items():
        print(
            f"{labels[version]:>28} {p}: {r:7.0f} target tok/s "
            f"({wall[(version, p)]:.1f} s wall, {cpu[(version, p)]:.1f} s CPU)"
        )
    ratios: dict[str, dict[str, common.PairedRatio]] = {}
    if len(versions) == 2:
        for p in args.precisions:
            ratios[f"{p} after/before"] = common.paired_ratios(
                measured[(versions[0], p)], measured[("nmt", p)]
            )
    base = args.precisions[0]
    for version in versions:
        for p in args.precisions[1:]:
            ratios[f"{labels[version]} {p}/{base}"] = common.paired_ratios(
                measured[(version, base)], measured[(version, p)]
            )
    for name, pair in ratios.items():
        print(f"{name}: wall {pair['wall']}")
        print(f"{'':>{len(name)}}  CPU  {pair['cpu']}")
    losses = {side(v, p): mean_loss(handles[(v, p)].trainer) for v, p in keys}
    shown = ", ".join(f"{k} {v:.6f}" for k, v in losses.items() if v is not None)
    if shown:
        print(
            f"mean training loss over all updates (equal when the versions compute alike): {shown}"
        )
    tmp.cleanup()
    return {
        "before": before,
        "after": labels["nmt"].removeprefix("after (").removesuffix(")"),
        "model": args.model,
        "chunk": args.chunk,
        "warmup_turns": args.warmup_turns,
        "turns": args.turns,
        "tokens": measured_tokens,
        "openmp_waiting": waiting,
        "tok_s": {side(v, p): r for (v, p), r in rate.items()},
        "wall_seconds": {side(v, p): s for (v, p), s in wall.items()},
        "cpu_seconds": {side(v, p): c for (v, p), c in cpu.items()},
        "per_turn": {
            side(v, p): [{"wall": t.wall, "cpu": t.cpu} for t in ts]
            for (v, p), ts in measured.items()
        },
        "ratios": ratios,
        "mean_loss": losses,
    }


def side(version: str, precision: str) -> str:
    """'after/bf16', 'before/fp32': a trainer's name in the report."""
    return f"{'after' if version == 'nmt' else 'before'}/{precision}"


def mean_loss(trainer: Any) -> float | None:
    """The trainer's training loss per target token (base 2) over all its updates (its
    meter is never read here): the same for both versions when they compute alike."""
    meter = getattr(trainer, "meter", None)
    if meter is not None:  # the library's Trainer
        return float(meter.sums[0]) / max(meter.tokens, 1) / 0.6931471805599453
    interval = getattr(trainer, "_interval", None)  # Trainer of revisions before issue 16
    if interval is not None:
        return float(interval[0]) / max(trainer._interval_tokens, 1) / 0.6931471805599453
    return None


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
