"""Preprocessing throughput: nmt.data.build_data_dir's encode + binarize, sentence pairs/s,
on Multi30k.

SentencePiece training is excluded: a model is trained once, then every timed run reuses it
(`spm.model=...`), so a timed run is: scan and check the files, read, normalize, encode,
clean, write the binarized splits and meta.json, rename into place. The figure is the
median of --repeats runs (wall clock), over all splits' pairs. It also prints the CPU time
used (this process and its worker pool), which other load on a shared machine does not
inflate.

    .venv/bin/python -m benchmarks.preprocess [--data ../shared/data/multi30k] [--workers 2]
    .venv/bin/python -m benchmarks.preprocess --keep work/bench/data-bin   # keep the data dir

--keep saves the first data dir built (with its trained SentencePiece model) where the
training benchmarks can use it.
"""

from __future__ import annotations

import argparse
import shutil
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "preprocess"


def config(raw: Path, dest: Path, workers: int, spm: Any) -> Any:
    """The PreprocessConfig of Multi30k en-de (train, val, test_2016_flickr) into `dest`."""
    from nmt.data.config import DataConfig, PreprocessConfig

    return PreprocessConfig(
        data=DataConfig(
            src="en",
            tgt="de",
            trainpref=str(raw / "train"),
            validpref=str(raw / "val"),
            testpref=[str(raw / "test_2016_flickr")],
            dest=str(dest),
        ),
        spm=spm,
        workers=workers,
        overwrite=True,
    )


def check_raw(raw: Path) -> None:
    for name in ("train", "val", "test_2016_flickr"):
        for lang in ("en", "de"):
            if not (raw / f"{name}.{lang}").is_file():
                raise common.BenchError(
                    f"--data {raw}: no {name}.{lang}; name a folder with Multi30k's task-1 files"
                )


def build_multi30k(raw: Path, dest: Path, workers: int = 2) -> Path:
    """A Multi30k en-de data dir with a joint 8k unigram vocabulary (the benchmarks'),
    built once: an existing one is kept."""
    from nmt.data import build_data_dir
    from nmt.data.config import ModelType, SpmConfig

    if not (dest / "meta.json").is_file():
        check_raw(raw)
        dest.parent.mkdir(parents=True, exist_ok=True)
        spm = SpmConfig(model_type=ModelType.unigram, vocab_size=8000, joint=True)
        build_data_dir(config(raw, dest, workers, spm))
    return dest


def build_parser() -> argparse.ArgumentParser:
    from nmt.data.config import ModelType

    p = common.parser(NAME, __doc__)
    p.add_argument("--data", type=Path, default=common.MULTI30K, help="Multi30k task-1 folder")
    p.add_argument("--workers", type=common.positive_int, default=2)
    p.add_argument("--repeats", type=common.positive_int, default=3)
    p.add_argument("--model-type", choices=[m.value for m in ModelType], default="unigram")
    p.add_argument("--vocab-size", type=common.positive_int, default=8000)
    p.add_argument("--keep", type=Path, help="also keep the data dir here (replacing one)")
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    from nmt.data import build_data_dir
    from nmt.data.config import ModelType, SpmConfig
    from nmt.data.meta import load_meta

    check_raw(args.data)
    with tempfile.TemporaryDirectory() as tmp:
        base = Path(tmp)
        spm = SpmConfig(model_type=ModelType(args.model_type), vocab_size=args.vocab_size)
        with common.timed() as training:
            build_data_dir(config(args.data, base / "trained", args.workers, spm))
        model = base / "trained" / "spm.model"
        runs = []
        for _ in range(args.repeats):
            with common.timed() as t:
                report = build_data_dir(
                    config(args.data, base / "timed", args.workers, SpmConfig(model=str(model)))
                )
            runs.append(t)
        meta = load_meta(base / "timed")
        if args.keep is not None:
            from nmt.fsutil import atomic_directory

            with atomic_directory(args.keep) as kept:
                shutil.copytree(base / "trained", kept, dirs_exist_ok=True)
    pairs = report.pairs
    wall = common.spread([t.wall for t in runs])
    cpu = common.spread([t.cpu for t in runs])
    print(
        f"corpus: {args.data} ({pairs} pairs over {len(meta.splits)} splits); SentencePiece "
        f"{args.model_type} {args.vocab_size}, trained once in {training.wall:.1f} s (not timed)"
    )
    print(f"runs: {', '.join(f'{t.wall:.2f}' for t in runs)} s")
    print(
        f"CPU time (this process and its workers): {', '.join(f'{t.cpu:.2f}' for t in runs)} "
        f"s; {pairs / cpu.median:,.0f} pairs per CPU-second"
    )
    print(
        f"encode+binarize: {pairs / wall.median:,.0f} pairs/s "
        f"(median of {args.repeats}, workers={args.workers})"
    )
    if args.keep is not None:
        print(f"kept the data dir in {args.keep}")
    return {
        "corpus": str(args.data),
        "pairs": pairs,
        "workers": args.workers,
        "spm": {"model_type": args.model_type, "vocab_size": args.vocab_size},
        "spm_training_seconds": training.wall,
        "seconds": wall,
        "cpu_seconds": cpu,
        "pairs_s": pairs / wall.median,
        "pairs_per_cpu_s": pairs / cpu.median,
    }


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
