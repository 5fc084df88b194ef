#!/usr/bin/env python
"""The benchmark suite: preprocessing, training and generation figures in one table.

    .venv/bin/python scripts/bench.py                      # ~10-15 min on the 2-core CPU
    .venv/bin/python scripts/bench.py --repeats 2 --gen-sentences 100   # a loaded machine
    .venv/bin/python scripts/bench.py --checkpoint runs/m30k/checkpoint_avg_last5.pt

Every measurement runs in its own subprocess (this script with --worker), so its peak
resident memory is that process's alone (os.wait4's ru_maxrss, and its own children's for
preprocessing's worker pool). Each figure is the median over --repeats subprocesses. The
measurements themselves are the existing benchmark scripts' functions, imported:
  preprocess   scripts/bench_preprocess.py: encode + binarize Multi30k with a trained 8k
               unigram model (SentencePiece training not timed): sentence pairs/s
  train        scripts/bench_train.py: transformer_small (fairseq peer shape), fp32 and bf16:
               target tokens/s, model FLOP/s, and the matmul peak of that dtype measured in
               the same process
  generate     scripts/bench_generate.py: beam 1 and 5, KV cache on and off, on the first
               --gen-sentences of test_2016_flickr.en: sentences/s and target tokens/s
Writes <out>/bench.md and <out>/bench.json and prints the Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))  # the bench_* scripts are imported as modules
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


# ---------------------------------------------------------------- workers (one per subprocess)


def work_preprocess(p: dict[str, Any]) -> dict[str, Any]:
    """One timed nmt-preprocess run reusing the suite's SentencePiece model."""
    import bench_preprocess

    from nmt.data import build_data_dir
    from nmt.data.config import SpmConfig

    with tempfile.TemporaryDirectory() as tmp:
        cfg = bench_preprocess.config(
            Path(p["raw"]), Path(tmp) / "out", p["workers"], SpmConfig(model=p["spm_model"])
        )
        start = time.perf_counter()
        report = build_data_dir(cfg)
        seconds = time.perf_counter() - start
        pairs = report.pairs
    return {"pairs": pairs, "seconds": seconds, "pairs_s": pairs / seconds}


def work_train(p: dict[str, Any]) -> dict[str, Any]:
    """The matmul peak of one dtype, then bench_train's measured training run in it."""
    import bench_train
    import torch

    torch.set_num_threads(p["threads"])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[p["precision"]]
    peak = bench_train.matmul_peak(dtype)
    args = argparse.Namespace(
        data=p["data"],
        model="transformer_small",
        threads=p["threads"],
        updates=p["updates"],
        warmup=p["warmup"],
        log_interval=p["log_interval"],
        max_tokens=4096,
        fairseq_shape=True,
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        r = bench_train.run(args, p["precision"])
    return {
        "tok_s": r["tok_s_mean"],
        "flop_s": r["flop_s"],
        "matmul_peak_flop_s": peak,
        "peak_fraction": r["flop_s"] / peak,
    }


def work_generate(p: dict[str, Any]) -> dict[str, Any]:
    """bench_generate's timed pass over the first N test sentences, one beam/cache setting."""
    import bench_generate
    import torch

    from nmt.checkpoint import load_for_inference
    from nmt.generation.config import SearchConfig
    from nmt.generation.io import SourceEncoder, read_text_lines

    torch.set_num_threads(p["threads"])
    if p["checkpoint"]:
        bundle = load_for_inference(p["checkpoint"], torch.device("cpu"))
        max_len_a, max_len_b = 0.0, 200  # nmt-generate's defaults: a trained model stops by itself
    else:
        bundle = bench_generate.random_small(Path(p["spm_cache"]))
        max_len_a, max_len_b = 1.0, 2  # a random model never emits EOS: cap near a real length
    model = bundle.model
    nfkc = bool(bundle.data.get("normalization", {}).get("nfkc", False))
    encoder = SourceEncoder(
        bundle.src_tokenizer, nfkc, model.cfg.max_source_positions, "truncate", p["input"]
    )
    lines = list(read_text_lines(p["input"]))[: p["sentences"]]
    sources = encoder.encode(lines, 0)
    search = SearchConfig(
        beam=p["beam"], max_len_a=max_len_a, max_len_b=max_len_b, use_cache=p["use_cache"]
    )
    translator = bench_generate.bench_translator(bundle, search, 64)
    translator.translate_ids([s.ids for s in sources[:8]])  # warm-up: first-call allocations
    seconds, cpu_seconds, tokens = bench_generate.run(translator, sources, 1)
    return {
        "sentences": len(sources),
        "seconds": seconds,
        "cpu_seconds": cpu_seconds,
        "sent_s": len(sources) / seconds,
        "tok_s": tokens / seconds,
        "tokens_per_sentence": tokens / len(sources),
    }


WORKERS = {"preprocess": work_preprocess, "train": work_train, "generate": work_generate}


def worker_main(kind: str, params: str, result: str) -> None:
    out = WORKERS[kind](json.loads(params))
    # Preprocessing's encoding pool runs in grandchildren: report their peak too (KiB on Linux).
    out["children_maxrss_kib"] = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss
    Path(result).write_text(json.dumps(out))


# ---------------------------------------------------------------- driver


def measure(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """Run one worker subprocess; its result plus its peak RSS in MiB."""
    with tempfile.NamedTemporaryFile(suffix=".json", delete=False) as f:
        result = Path(f.name)
    try:
        proc = subprocess.Popen(
            [
                sys.executable,
                __file__,
                "--worker",
                kind,
                "--params",
                json.dumps(params),
                "--result",
                str(result),
            ],
            cwd=REPO,
        )
        _, status, usage = os.wait4(proc.pid, 0)  # this child's own rusage, not all children's
        proc.returncode = os.waitstatus_to_exitcode(status)
        if proc.returncode != 0:
            raise SystemExit(f"bench: the {kind} worker {params} failed (exit {proc.returncode})")
        out = json.loads(result.read_text())
    finally:
        result.unlink(missing_ok=True)
    out["peak_rss_mib"] = max(usage.ru_maxrss, out.pop("children_maxrss_kib")) / 1024
    return out


def median_of(runs: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of every numeric field over the runs, and the raw runs."""
    keys = [k for k, v in runs[0].items() if isinstance(v, (int, float))]
    return {**{k: statistics.median(r[k] for r in runs) for k in keys}, "runs": runs}


def prepare_data(raw: Path, dest: Path) -> Path:
    """The suite's Multi30k data dir (joint 8k unigram), built once and reused."""
    if not (dest / "meta.json").is_file():
        cmd = [
            sys.executable,
            "-c",
            "import sys; from nmt.cli import main; main('preprocess', sys.argv[1:])",
            "data.src=en",
            "data.tgt=de",
            f"data.trainpref={raw / 'train'}",
            f"data.validpref={raw / 'val'}",
            f"data.testpref=[{raw / 'test_2016_flickr'}]",
            f"data.dest={dest}",
            "spm.joint=true",
            "spm.model_type=unigram",
            "spm.vocab_size=8000",
            "overwrite=true",
        ]
        subprocess.run(cmd, check=True, cwd=REPO, stdout=subprocess.DEVNULL)
    return dest


def machine() -> dict[str, Any]:
    import torch

    cpu = platform.processor() or platform.machine()
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "torch": torch.__version__,
        "python": platform.python_version(),
    }


def markdown(report: dict[str, Any]) -> str:
    m, rows = report["machine"], []
    pre = report["preprocess"]
    rows.append(
        f"| preprocess (encode+binarize, {report['params']['preprocess_workers']} workers) | "
        f"{pre['pairs_s']:,.0f} pairs/s | | | {pre['peak_rss_mib']:.0f} |"
    )
    for prec, r in report["train"].items():
        rows.append(
            f"| train transformer_small {prec} | {r['tok_s']:,.0f} target tok/s | "
            f"{r['flop_s'] / 1e9:.1f} GFLOP/s | {r['matmul_peak_flop_s'] / 1e9:.1f} GFLOP/s "
            f"({100 * r['peak_fraction']:.1f}%) | {r['peak_rss_mib']:.0f} |"
        )
    for name, r in report["generate"].items():
        rows.append(
            f"| generate {name} | {r['sent_s']:.1f} sent/s, {r['tok_s']:,.0f} target tok/s | | | "
            f"{r['peak_rss_mib']:.0f} |"
        )
    p = report["params"]
    return "\n".join(
        [
            f"Benchmark suite (scripts/bench.py), {report['date']}, {m['cpu']}, {m['cores']} CPUs, "
            f"torch {m['torch']}, {report['params']['threads']} torch threads; load average {report['load_before']:.1f} before, {report['load_after']:.1f} "
            f"after; median of {p['repeats']} subprocess runs each ({p['train_repeats']} for training: "
            f"{p['train_updates']} updates of 4096 tokens, the first {p['train_warmup']} not measured); "
            f"{report['wall_s'] / 60:.1f} min in all.",
            f"Generation: first {p['gen_sentences']} sentences of test_2016_flickr.en, batches of 64, "
            f"{p['gen_model']}.",
            "",
            "| measurement | throughput | model FLOP/s | matmul peak (same run) | peak RSS MiB |",
            "| --- | --- | --- | --- | --- |",
            *rows,
            "",
        ]
    )


def main() -> None:
    ap = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("--raw", type=Path, default=MULTI30K, help="Multi30k task 1 raw folder")
    ap.add_argument(
        "--out",
        type=Path,
        default=REPO / "work" / "bench",
        help="bench.md, bench.json and the data dir",
    )
    ap.add_argument(
        "--repeats", type=int, default=3, help="subprocess runs per figure (the median is reported)"
    )
    ap.add_argument(
        "--threads", type=int, default=2, help="torch threads for training and generation"
    )
    ap.add_argument("--preprocess-workers", type=int, default=2)
    ap.add_argument("--train-updates", type=int, default=30, help="updates per training run")
    ap.add_argument("--train-warmup", type=int, default=10, help="of which not measured")
    ap.add_argument(
        "--train-log-interval", type=int, default=10, help="updates per measured interval"
    )
    ap.add_argument(
        "--train-repeats", type=int, default=0, help="runs per training figure; 0 = --repeats"
    )
    ap.add_argument(
        "--data",
        type=Path,
        default=None,
        help="an existing Multi30k en-de data dir (joint 8k unigram); default: built under --out",
    )
    ap.add_argument("--precisions", nargs="+", default=["fp32", "bf16"])
    ap.add_argument(
        "--checkpoint",
        default="",
        help="a trained checkpoint for generation (default: random "
        "transformer_small, output capped at source length + 2)",
    )
    ap.add_argument(
        "--gen-sentences", type=int, default=200, help="test sentences per generation run"
    )
    ap.add_argument("--beams", nargs="+", type=int, default=[1, 5])
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker_main(args.worker, args.params, args.result)
        return
    if (
        args.repeats < 1
        or args.train_warmup % args.train_log_interval
        or args.train_updates <= args.train_warmup
    ):
        raise SystemExit(
            "bench: --repeats >= 1; --train-warmup: a multiple of --train-log-interval, "
            "below --train-updates"
        )

    started, load_before = time.perf_counter(), os.getloadavg()[0]
    args.out.mkdir(parents=True, exist_ok=True)
    data = (
        args.data.resolve()
        if args.data
        else prepare_data(args.raw.resolve(), (args.out / "data-bin").resolve())
    )

    def repeat(kind: str, params: dict[str, Any], label: str, times: int = 0) -> dict[str, Any]:
        runs, times = [], times or args.repeats
        for i in range(times):
            runs.append(measure(kind, params))
            print(
                f"bench: {label} run {i + 1}/{times}: "
                + ", ".join(f"{k}={v:.4g}" for k, v in runs[-1].items() if isinstance(v, float)),
                file=sys.stderr,
                flush=True,
            )
        return median_of(runs)

    report: dict[str, Any] = {
        "date": datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "machine": machine(),
        "load_before": load_before,
    }
    report["preprocess"] = repeat(
        "preprocess",
        {
            "raw": str(args.raw.resolve()),
            "workers": args.preprocess_workers,
            "spm_model": str(data / "spm.model"),
        },
        "preprocess",
    )
    report["train"] = {
        prec: repeat(
            "train",
            {
                "data": str(data),
                "precision": prec,
                "threads": args.threads,
                "updates": args.train_updates,
                "warmup": args.train_warmup,
                "log_interval": args.train_log_interval,
            },
            f"train {prec}",
            args.train_repeats,
        )
        for prec in args.precisions
    }
    report["generate"] = {}
    for beam in args.beams:
        for use_cache in (True, False):
            name = f"beam {beam}, {'KV cache' if use_cache else 'no cache'}"
            report["generate"][name] = repeat(
                "generate",
                {
                    "checkpoint": args.checkpoint,
                    "spm_cache": str(data / "spm.model"),
                    "threads": args.threads,
                    "input": str(args.raw.resolve() / "test_2016_flickr.en"),
                    "sentences": args.gen_sentences,
                    "beam": beam,
                    "use_cache": use_cache,
                },
                f"generate {name}",
            )
    report["load_after"] = os.getloadavg()[0]
    report["wall_s"] = time.perf_counter() - started
    report["params"] = {
        "repeats": args.repeats,
        "train_repeats": args.train_repeats or args.repeats,
        "threads": args.threads,
        "preprocess_workers": args.preprocess_workers,
        "train_updates": args.train_updates,
        "train_warmup": args.train_warmup,
        "gen_sentences": args.gen_sentences,
        "gen_model": args.checkpoint or "random transformer_small (max_len 1.0 x src + 2)",
    }
    table = markdown(report)
    (args.out / "bench.json").write_text(json.dumps(report, indent=1) + "\n")
    (args.out / "bench.md").write_text(table)
    print(table)
    print(f"bench: wrote {args.out / 'bench.md'} and {args.out / 'bench.json'}", file=sys.stderr)


if __name__ == "__main__":
    main()
