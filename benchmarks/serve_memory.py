"""Benchmark `serve_memory`: resident memory and speed of fp32 CPU translation under a
steady mix of batch shapes, for each way of keeping oneDNN's per-shape kernels bounded.

    .venv/bin/python -m benchmarks.serve_memory [--batches 160] [--rounds 2] \\
        [--variants unbounded,bucketed,capped,small-on-torch,torch] [--generate-lines 1000,4000]

A server (or nmt-generate on a long file) meets a new matrix shape in nearly every batch:
a search step multiplies sentences x beam rows (fewer as sentences finish), the encoder
batch x source length rows. oneDNN compiles and caches a kernel per shape (nmt/model/
packed.py), so memory grew with every shape met. The variants, each in a process of its
own (the caches' capacities are read once per process):

  unbounded       oneDNN on the exact shapes (the code before the fix: row_bucket off)
  bucketed        oneDNN on rows padded up to row_bucket (the fix, the default)
  capped          exact shapes, both caches capped (ONEDNN_PRIMITIVE_CACHE_CAPACITY and
                  ideep's LRU_CACHE_CAPACITY = --cap)
  small-on-torch  exact shapes, products under --torch-rows rows on torch's GEMM
  torch           NMT_FP32_GEMM=torch: no oneDNN at all

Each child translates the same --batches batches (seeded: 1-32 Multi30k sentences, beam
1, 2, 4 or 5) with a random transformer_small (benchmarks.ctranslate2.random_checkpoint:
it never ends a sentence early, so each sentence runs to its own length limit) through
nmt.Translator on one thread, and reports its RSS (VmRSS) after the first eighth of the
batches (warmed up) and at the end, and its sentences/s. The variants take turns in a
balanced order each round, so the machine's drift hits all alike; speed is reported as
the median over rounds of each variant's ratio to `unbounded` in the same round, in wall
time and in the child's CPU time (which drifts less on a shared machine).

`--generate-lines N[,N2...]` also runs nmt-generate (the CLI, in the child) on the first
N lines of one file of varied lengths (Multi30k sentences joined 1-4 at a time) per
variant and count, and reports its peak RSS: memory that stays bounded does not grow with
the file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "serve_memory"
VARIANTS = ("unbounded", "bucketed", "capped", "small-on-torch", "torch")
SEARCH = dict(max_len_a=0.5, max_len_b=5)  # short outputs: many batches, many shapes


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument("--batches", type=common.positive_int, default=160)
    p.add_argument("--rounds", type=common.positive_int, default=2)
    p.add_argument("--variants", default=",".join(VARIANTS), type=variant_list)
    p.add_argument("--cap", type=common.positive_int, default=256, help="capped: cache entries")
    p.add_argument(
        "--torch-rows", type=common.positive_int, default=64, help="small-on-torch: rows below"
    )
    p.add_argument("--generate-lines", type=line_counts, default=[], help="N[,N2...]")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument(
        "--spm", type=Path, default=common.WORK / "multi30k-spm.model", help="8k SentencePiece"
    )
    p.add_argument("--child", default="", help=argparse.SUPPRESS)  # VARIANT,checkpoint,mode
    return p


def variant_list(value: str) -> list[str]:
    names = [v for v in value.split(",") if v]
    unknown = [v for v in names if v not in VARIANTS]
    if unknown or not names:
        raise argparse.ArgumentTypeError(f"{value!r}: use some of {','.join(VARIANTS)}")
    return names


def line_counts(value: str) -> list[int]:
    return [common.positive_int(v) for v in value.split(",") if v]


def rss_mib(pid: int | str = "self") -> float:
    """VmRSS of a process, MiB."""
    with open(f"/proc/{pid}/status", encoding="ascii") as status:
        for line in status:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise RuntimeError(f"no VmRSS in /proc/{pid}/status")


# ------------------------------------------------------------------------ the child side


def variant_environment(variant: str, args: argparse.Namespace) -> dict[str, str]:
    """The environment a variant's process starts with (read before oneDNN first runs)."""
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    if variant == "torch":
        env["NMT_FP32_GEMM"] = "torch"
    else:
        env["NMT_FP32_GEMM"] = "onednn"
    if variant == "capped":
        env["ONEDNN_PRIMITIVE_CACHE_CAPACITY"] = env["LRU_CACHE_CAPACITY"] = str(args.cap)
    return env


def apply_variant(variant: str, torch_rows: int) -> None:
    """In the child, before the model loads: switch the fix off where the variant says."""
    import nmt.model.packed as packed

    if variant in ("unbounded", "capped", "small-on-torch"):
        packed.row_bucket = lambda rows: rows  # type: ignore[assignment]
    if variant == "small-on-torch":
        real_init = packed.PackedLinear.__init__

        def init(self: Any, *a: Any, **kw: Any) -> None:
            real_init(self, *a, **kw)
            self.min_onednn_rows = max(self.min_onednn_rows, torch_rows)

        packed.PackedLinear.__init__ = init  # type: ignore[method-assign]


def child_translate(checkpoint: str, args: argparse.Namespace) -> dict[str, Any]:
    """Translate the seeded batches; RSS when warmed up and at the end, sentences/s."""
    from nmt.generation.translator import Translator

    translator = Translator.from_checkpoint(checkpoint, device="cpu", threads=1, **SEARCH)
    lines = sentences()
    rng = random.Random(args.seed)
    plan = [
        (rng.sample(lines, rng.randint(1, 32)), rng.choice([1, 2, 4, 5]))
        for _ in range(args.batches)
    ]
    loaded = rss_mib()
    warm = len(plan) // 8
    warmed = 0.0
    count, start, cpu = 0, time.perf_counter(), time.process_time()
    for i, (batch, beam) in enumerate(plan):
        translator.translate(batch, beam=beam)
        count += len(batch)
        if i + 1 == warm:
            warmed = rss_mib()
    seconds = time.perf_counter() - start
    cpu_seconds = time.process_time() - cpu
    return dict(
        loaded_mib=loaded,
        warmed_mib=warmed,
        end_mib=rss_mib(),
        sentences=count,
        seconds=seconds,
        sentences_per_s=count / seconds,
        sentences_per_cpu_s=count / cpu_seconds,
    )


def child_generate(checkpoint: str, lines_file: str) -> dict[str, Any]:
    """nmt-generate on the file, in this process; its peak RSS."""
    import resource

    from nmt.cli import main

    with open(os.devnull, "w", encoding="utf-8") as sink:
        stdout, sys.stdout = sys.stdout, sink
        try:
            main(
                "generate",
                [
                    f"checkpoint={checkpoint}",
                    f"input={lines_file}",
                    "device=cpu",
                    "threads=1",
                    *(f"{k}={v}" for k, v in SEARCH.items()),
                ],
            )
        except SystemExit as exc:
            if exc.code:
                raise
        finally:
            sys.stdout = stdout
    return dict(peak_mib=resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)


def sentences() -> list[str]:
    path = common.MULTI30K / "train.en"
    if not path.is_file():
        raise common.BenchError(f"{path}: no such file (Multi30k's sentences are the input)")
    return path.read_text(encoding="utf-8").splitlines()[:20000]


# ----------------------------------------------------------------------- the parent side


def run_child(variant: str, checkpoint: Path, mode: str, args: argparse.Namespace) -> dict:
    argv = [sys.executable, "-m", f"benchmarks.{NAME}", "--child", f"{variant},{checkpoint},{mode}"]
    argv += ["--batches", str(args.batches), "--seed", str(args.seed)]
    argv += ["--cap", str(args.cap), "--torch-rows", str(args.torch_rows)]
    done = subprocess.run(
        argv,
        env=variant_environment(variant, args),
        cwd=common.REPO,
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode:
        raise common.BenchError(f"{variant} ({mode}) failed: {done.stderr.strip()[-500:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def long_file(path: Path, count: int, seed: int) -> Path:
    """`count` lines of 1-4 Multi30k sentences each: lengths from a few tokens to ~100."""
    rng = random.Random(seed)
    lines = sentences()
    path.write_text(
        "".join(" ".join(rng.sample(lines, rng.randint(1, 4))) + "\n" for _ in range(count)),
        encoding="utf-8",
    )
    return path


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.child:
        variant, checkpoint, mode = args.child.split(",")
        apply_variant(variant, args.torch_rows)
        figures = (
            child_translate(checkpoint, args)
            if mode == "translate"
            else (child_generate(checkpoint, mode))
        )
        print(json.dumps(figures))
        sys.exit(0)

    from benchmarks.ctranslate2 import random_checkpoint
    from benchmarks.generate import random_small

    tmp = tempfile.TemporaryDirectory()
    if not args.spm.is_file():
        random_small(args.spm)  # trains and caches the SentencePiece model
    checkpoint = random_checkpoint("small", args.spm, Path(tmp.name) / "random.pt")
    runs: dict[str, list[dict]] = {v: [] for v in args.variants}
    orders = common.balanced_orders(len(args.variants))
    for round_ in range(args.rounds):
        for i in orders[round_ % len(orders)]:
            variant = args.variants[i]
            result = run_child(variant, checkpoint, "translate", args)
            runs[variant].append(result)
            print(
                f"round {round_ + 1} {variant:>14}: RSS loaded {result['loaded_mib']:.0f} MiB, "
                f"warmed {result['warmed_mib']:.0f}, end {result['end_mib']:.0f} "
                f"({result['end_mib'] / result['warmed_mib']:.2f}x warmed); "
                f"{result['sentences_per_s']:.1f} sentences/s, "
                f"{result['sentences_per_cpu_s']:.1f} per CPU second",
                flush=True,
            )
    base = "unbounded" if "unbounded" in runs else args.variants[0]
    figures: dict[str, Any] = {"batches": args.batches, "rounds": args.rounds, "variants": {}}
    rows = []
    for variant, results in runs.items():
        summary = {
            "warmed_mib": statistics.median(r["warmed_mib"] for r in results),
            "end_mib": statistics.median(r["end_mib"] for r in results),
            "growth": statistics.median(r["end_mib"] / r["warmed_mib"] for r in results),
            "sentences_per_s": statistics.median(r["sentences_per_s"] for r in results),
            # same-round ratios to the base variant: wall time, and CPU time (steadier on
            # a shared machine)
            f"speed_vs_{base}": statistics.median(
                r["sentences_per_s"] / b["sentences_per_s"] for r, b in zip(results, runs[base])
            ),
            f"cpu_speed_vs_{base}": statistics.median(
                r["sentences_per_cpu_s"] / b["sentences_per_cpu_s"]
                for r, b in zip(results, runs[base])
            ),
            "runs": results,
        }
        figures["variants"][variant] = summary
        rows.append(
            [
                variant,
                f"{summary['warmed_mib']:.0f}",
                f"{summary['end_mib']:.0f}",
                f"{summary['growth']:.2f}x",
                f"{summary['sentences_per_s']:.1f}",
                f"{summary[f'speed_vs_{base}']:.3f}",
                f"{summary[f'cpu_speed_vs_{base}']:.3f}",
            ]
        )
    header = ["variant", "warmed MiB", "end MiB", "end/warmed", "sentences/s"]
    header += [f"speed vs {base} (wall)", "(CPU time)"]
    for count in args.generate_lines:
        header.append(f"nmt-generate peak MiB ({count} lines)")
        text = long_file(Path(tmp.name) / f"long{count}.txt", count, args.seed)
        for row, variant in zip(rows, runs):
            peak = run_child(variant, checkpoint, str(text), args)["peak_mib"]
            figures["variants"][variant][f"generate_{count}_lines_peak_mib"] = peak
            row.append(f"{peak:.0f}")
    print(common.markdown_table(header, rows))
    return figures


if __name__ == "__main__":
    sys.exit(common.main(NAME, build_parser, run))
