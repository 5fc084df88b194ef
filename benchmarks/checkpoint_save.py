"""Checkpoint saves: what writing the extra names of a save costs.

Every checkpoint name of a run dir is a file of its own (never a hard link): a save that
writes checkpoint_last.pt, a numbered checkpoint, checkpoint_best.pt and a
checkpoint.best_* file serialises once and copies the file three times (in the kernel,
nmt.fsutil.atomic_copy). This times, on a model preset with its Adam state (what
nmt-train saves), a save to checkpoint_last.pt alone against a save to all four names, in
turns, each one durable (fsync) as nmt-train's, in a directory on the disk under test.

    .venv/bin/python -m benchmarks.checkpoint_save                       # transformer_base
    .venv/bin/python -m benchmarks.checkpoint_save --preset big --dir /scratch/bench
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import time
from pathlib import Path
from typing import Any

import torch

from benchmarks import common
from benchmarks.decoder import load_preset
from nmt.checkpoint import build_checkpoint
from nmt.model.transformer import Transformer
from nmt.training.checkpointing import CheckpointManager

NAME = "checkpoint_save"


def build_parser() -> argparse.ArgumentParser:
    ap = common.parser(NAME, __doc__)
    ap.add_argument("--preset", default="base", help="configs/model/transformer_<preset>.yaml")
    ap.add_argument("--vocab", type=common.positive_int, default=32000, help="joint vocabulary")
    ap.add_argument("--repeats", type=common.positive_int, default=3, help="turns of each save")
    ap.add_argument(
        "--dir",
        type=Path,
        default=common.WORK / NAME,
        help="where the checkpoints are written (emptied and removed at the end)",
    )
    return ap


def training_checkpoint(preset: str, vocab: int) -> dict[str, Any]:
    """A checkpoint as nmt-train saves it: weights and Adam's two moments per parameter."""
    torch.manual_seed(0)
    model = Transformer(load_preset(preset), vocab, vocab)
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4)
    for p in model.parameters():
        p.grad = torch.randn_like(p) * 1e-3
    optimizer.step()
    return build_checkpoint(
        model_state=model.state_dict(),
        model_config={},
        data={},
        src_tokenizer=b"spm",
        tgt_tokenizer=b"spm",
        train_state={"num_updates": 1, "optimizer": optimizer.state_dict()},
    )


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.dir.exists() and any(args.dir.iterdir()):
        raise common.BenchError(f"--dir {args.dir}: not empty; name a new or empty directory")
    ckpt = training_checkpoint(args.preset, args.vocab)
    args.dir.mkdir(parents=True, exist_ok=True)
    manager = CheckpointManager(args.dir, keep_last=1, keep_best=1, metric="loss", maximize=False)
    seconds: dict[str, list[float]] = {"last only": [], "4 names": []}
    try:
        for turn in range(args.repeats):
            for kind in common.balanced_orders(2)[turn % 2]:
                all_names = kind == 1
                start = time.perf_counter()
                written = manager.save(
                    ckpt,
                    epoch=1,
                    update=turn + 1,
                    numbered=all_names,
                    best_value=float(args.repeats - turn) if all_names else None,
                )
                seconds["4 names" if all_names else "last only"].append(time.perf_counter() - start)
                assert all(p.stat().st_nlink == 1 for p in written)
        size = (args.dir / "checkpoint_last.pt").stat().st_size
    finally:
        shutil.rmtree(args.dir, ignore_errors=True)
    one, four = (statistics.median(seconds[k]) for k in ("last only", "4 names"))
    figures = {
        "preset": args.preset,
        "vocab": args.vocab,
        "checkpoint_mb": round(size / 1e6, 1),
        "seconds": {k: [round(s, 3) for s in v] for k, v in seconds.items()},
        "median_last_only_s": round(one, 3),
        "median_4_names_s": round(four, 3),
        "per_extra_name_s": round((four - one) / 3, 3),
        "extra_name_vs_save": round((four - one) / 3 / one, 3),
    }
    print(
        f"transformer_{args.preset}, vocab {args.vocab}: checkpoint {size / 1e6:.0f} MB; "
        f"save to checkpoint_last.pt alone {one:.2f} s, to 4 names {four:.2f} s (median of "
        f"{args.repeats}): {figures['per_extra_name_s']:.2f} s per extra name, "
        f"{figures['extra_name_vs_save']:.0%} of a save"
    )
    return figures


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run))
