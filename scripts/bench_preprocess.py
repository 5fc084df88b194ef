#!/usr/bin/env python3
"""Benchmark: nmt-preprocess encode + binarize throughput (sentence pairs/s) on Multi30k.

SentencePiece training is excluded: a model is trained once, then every timed run reuses it
(`spm.model=...`), so a timed run is: scan and check the files, read, normalize, encode,
clean, write the binarized splits and meta.json, rename into place. The figure is the
median of --repeats runs of the whole command (wall clock), over all splits' pairs. It also
prints the CPU time used, which other load on a shared machine does not inflate.

usage: .venv/bin/python scripts/bench_preprocess.py [--data ../shared/data/multi30k]
           [--workers 2] [--repeats 3] [--model-type unigram] [--vocab-size 8000]
"""

from __future__ import annotations

import argparse
import os
import platform
import statistics
import tempfile
import time
from pathlib import Path

from nmt.data import build_data_dir
from nmt.data.config import DataConfig, ModelType, PreprocessConfig, SpmConfig
from nmt.data.meta import load_meta

REPO = Path(__file__).resolve().parent.parent


def config(data: Path, dest: Path, workers: int, spm: SpmConfig) -> PreprocessConfig:
    return PreprocessConfig(
        data=DataConfig(
            src="en",
            tgt="de",
            trainpref=str(data / "train"),
            validpref=str(data / "val"),
            testpref=[str(data / "test_2016_flickr")],
            dest=str(dest),
        ),
        spm=spm,
        workers=workers,
        overwrite=True,
    )


def _cpu_seconds() -> float:
    """User + system time of this process and its finished children (the pool's workers).

    Other programs running on the same machine slow the wall clock down but not this, so
    it tells what the machine would do for nmt alone: pairs/s ~ pairs per CPU-second x cores.
    """
    t = os.times()
    return t.user + t.system + t.children_user + t.children_system


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--data", type=Path, default=REPO.parent / "shared" / "data" / "multi30k")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--model-type", choices=[m.value for m in ModelType], default="unigram")
    parser.add_argument("--vocab-size", type=int, default=8000)
    args = parser.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        model_type = ModelType(args.model_type)
        started = time.perf_counter()
        build_data_dir(
            config(
                args.data,
                base / "trained",
                args.workers,
                SpmConfig(model_type=model_type, vocab_size=args.vocab_size),
            )
        )
        train_s = time.perf_counter() - started
        model = base / "trained" / "spm.model"
        times, cpu_times = [], []
        for _ in range(args.repeats):
            started, cpu_started = time.perf_counter(), _cpu_seconds()
            build_data_dir(
                config(args.data, base / "timed", args.workers, SpmConfig(model=str(model)))
            )
            times.append(time.perf_counter() - started)
            cpu_times.append(_cpu_seconds() - cpu_started)
        meta = load_meta(base / "timed")

    pairs = sum(s.lines for s in meta.splits.values())
    median = statistics.median(times)
    print(
        f"machine: {platform.machine()}, {os.cpu_count()} CPUs, {platform.processor() or '?'}; "
        f"load average at the end {os.getloadavg()[0]:.1f}"
    )
    print(
        f"corpus: {args.data} ({pairs} pairs over {len(meta.splits)} splits); "
        f"SentencePiece {args.model_type} {args.vocab_size}, trained once in {train_s:.1f} s "
        "(not timed below)"
    )
    print(f"runs: {', '.join(f'{t:.2f}' for t in times)} s")
    print(
        f"CPU time (this process and its workers): "
        f"{', '.join(f'{t:.2f}' for t in cpu_times)} s; "
        f"{pairs / statistics.median(cpu_times):,.0f} pairs per CPU-second"
    )
    print(
        f"encode+binarize: {pairs / median:,.0f} pairs/s "
        f"(median of {args.repeats}, workers={args.workers})"
    )


if __name__ == "__main__":
    main()
