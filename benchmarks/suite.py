"""The benchmark suite: preprocessing, training and generation figures in one table.

    .venv/bin/python -m benchmarks.suite                    # ~10-15 min on the 2-core CPU
    .venv/bin/python -m benchmarks.suite --repeats 2 --gen-sentences 100   # a loaded machine
    .venv/bin/python -m benchmarks.suite --checkpoint runs/m30k/checkpoint_avg_last5.pt

Every measurement runs in its own subprocess (this module with --worker), so its peak
resident memory is that process's alone (os.wait4's ru_maxrss, its own children's
included, as preprocessing's worker pool). Each figure is the median over --repeats
subprocesses. The measurements are the other benchmarks' functions:
  preprocess   benchmarks.preprocess: encode + binarize Multi30k with a trained 8k
               unigram model (SentencePiece training not timed): sentence pairs/s
  train        benchmarks.train: transformer_small (fairseq peer shape), fp32 and bf16:
               target tokens/s, model FLOP/s, and the matmul peak of that dtype measured in
               the same process
  generate     benchmarks.generate: beam 1 and 5, KV cache on and off, on the first
               --gen-sentences of test_2016_flickr.en: sentences/s and target tokens/s
Writes <out>/bench.md and <out>/bench.json (the report of --json, plus the table) and
prints the Markdown table.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import json
import sys
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "suite"


# ---------------------------------------------------------------- workers (one per subprocess)


def work_preprocess(p: dict[str, Any]) -> dict[str, Any]:
    """One timed build_data_dir run reusing the suite's SentencePiece model."""
    from benchmarks.preprocess import config
    from nmt.data import build_data_dir
    from nmt.data.config import SpmConfig

    with tempfile.TemporaryDirectory() as tmp:
        cfg = config(
            Path(p["raw"]), Path(tmp) / "out", p["workers"], SpmConfig(model=p["spm_model"])
        )
        with common.timed() as t:
            report = build_data_dir(cfg)
    return {"pairs": report.pairs, "seconds": t.wall, "pairs_s": report.pairs / t.wall}


def work_train(p: dict[str, Any]) -> dict[str, Any]:
    """The matmul peak of one dtype, then benchmarks.train's measured run in it."""
    import torch

    from benchmarks import train

    torch.set_num_threads(p["threads"])
    dtype = {"fp32": torch.float32, "bf16": torch.bfloat16}[p["precision"]]
    peak = train.matmul_peak(dtype)
    args = train.build_parser().parse_args(
        [
            "--data",
            p["data"],
            "--threads",
            str(p["threads"]),
            "--updates",
            str(p["updates"]),
            "--warmup",
            str(p["warmup"]),
            "--log-interval",
            str(p["log_interval"]),
        ]
    )
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        r = train.run_sequential(args, p["precision"])
    return {
        "tok_s": r["tok_s"],
        "flop_s": r["flop_s"],
        "matmul_peak_flop_s": peak,
        "peak_fraction": r["flop_s"] / peak,
    }


def work_generate(p: dict[str, Any]) -> dict[str, Any]:
    """benchmarks.generate's timed pass over the first N test sentences, one beam/cache
    setting."""
    import torch

    from benchmarks import generate
    from nmt.generation.config import SearchConfig

    torch.set_num_threads(p["threads"])
    bundle = generate.load_bundle(p["checkpoint"], Path(p["spm_cache"]))
    if p["checkpoint"]:
        max_len_a, max_len_b = 0.0, 200  # nmt-generate's defaults: a trained model stops by itself
    else:
        max_len_a, max_len_b = 1.0, 2  # a random model never emits EOS: cap near a real length
    search = SearchConfig(
        beam=p["beam"], max_len_a=max_len_a, max_len_b=max_len_b, use_cache=p["use_cache"]
    )
    translator = generate.bench_translator(bundle, search, 64)
    sources = generate.source_ids(translator, p["input"], p["sentences"])
    translator.translate_ids(sources[:8])  # warm-up: first-call allocations
    out = generate.timed_passes(translator, sources, 1)
    return {k: out[k] for k in ("sentences", "seconds", "cpu_seconds", "sent_s", "tok_s")}


WORKERS = {"preprocess": work_preprocess, "train": work_train, "generate": work_generate}


def worker_main(kind: str, params: str, result: str) -> None:
    out = WORKERS[kind](json.loads(params))
    Path(result).write_text(json.dumps(out))


# ---------------------------------------------------------------- driver


def measure(kind: str, params: dict[str, Any]) -> dict[str, Any]:
    """One worker subprocess: its result, plus its peak RSS in MiB (its children's
    included: preprocessing's pool)."""
    with tempfile.TemporaryDirectory() as tmp:
        result = Path(tmp) / "result.json"
        cmd = [sys.executable, "-m", "benchmarks.suite", "--worker", kind]
        cmd += ["--params", json.dumps(params), "--result", str(result)]
        done = common.run_subprocess(cmd, cwd=common.REPO, check=f"the {kind} worker")
        out = json.loads(result.read_text())
    out["peak_rss_mib"] = done.peak_rss_mib
    return out


def markdown(report: dict[str, Any]) -> str:
    """The suite's table, with a header naming the machine, date and settings."""
    m, p, f = report["machine"], report["figures"]["params"], report["figures"]
    rows = []
    pre = f["preprocess"]
    rows.append(
        [
            f"preprocess (encode+binarize, {p['preprocess_workers']} workers)",
            f"{pre['pairs_s']:,.0f} pairs/s",
            "",
            "",
            f"{pre['peak_rss_mib']:.0f}",
        ]
    )
    for prec, r in f["train"].items():
        rows.append(
            [
                f"train transformer_small {prec}",
                f"{r['tok_s']:,.0f} target tok/s",
                f"{r['flop_s'] / 1e9:.1f} GFLOP/s",
                f"{r['matmul_peak_flop_s'] / 1e9:.1f} GFLOP/s ({100 * r['peak_fraction']:.1f}%)",
                f"{r['peak_rss_mib']:.0f}",
            ]
        )
    for name, r in f["generate"].items():
        rows.append(
            [
                f"generate {name}",
                f"{r['sent_s']:.1f} sent/s, {r['tok_s']:,.0f} target tok/s",
                "",
                "",
                f"{r['peak_rss_mib']:.0f}",
            ]
        )
    table = common.markdown_table(
        ["measurement", "throughput", "model FLOP/s", "matmul peak (same run)", "peak RSS MiB"],
        rows,
    )
    return "\n".join(
        [
            f"Benchmark suite (python -m benchmarks.suite), {report['date']}, "
            f"{common.describe_machine(m)}; median of {p['repeats']} subprocess runs each "
            f"({p['train_repeats']} for training: {p['train_updates']} updates of 4096 tokens, "
            f"the first {p['train_warmup']} not measured); {report['wall_seconds'] / 60:.1f} min "
            "in all.",
            f"Generation: first {p['gen_sentences']} sentences of test_2016_flickr.en, batches of "
            f"64, {p['gen_model']}.",
            "",
            table,
            "",
        ]
    )


def build_parser() -> argparse.ArgumentParser:
    ap = common.parser(NAME, __doc__)
    ap.add_argument("--raw", type=Path, default=common.MULTI30K, help="Multi30k task 1 folder")
    ap.add_argument(
        "--out", type=Path, default=common.WORK, help="bench.md, bench.json and the data dir"
    )
    ap.add_argument(
        "--repeats",
        type=common.positive_int,
        default=3,
        help="subprocess runs per figure (the median is reported)",
    )
    ap.add_argument(
        "--threads", type=common.positive_int, default=2, help="torch threads (train, generate)"
    )
    ap.add_argument("--preprocess-workers", type=common.positive_int, default=2)
    ap.add_argument(
        "--train-updates", type=common.positive_int, default=30, help="updates per training run"
    )
    ap.add_argument(
        "--train-warmup", type=common.nonnegative_int, default=10, help="of which not measured"
    )
    ap.add_argument(
        "--train-log-interval",
        type=common.positive_int,
        default=10,
        help="updates per measured interval",
    )
    ap.add_argument(
        "--train-repeats",
        type=common.nonnegative_int,
        default=0,
        help="runs per training figure; 0 = --repeats",
    )
    ap.add_argument(
        "--data",
        type=common.data_dir,
        default=None,
        help="an existing Multi30k en-de data dir (joint 8k unigram); default: built under --out",
    )
    ap.add_argument("--precisions", nargs="+", choices=["fp32", "bf16"], default=["fp32", "bf16"])
    ap.add_argument(
        "--checkpoint",
        default="",
        help="a trained checkpoint for generation (default: random transformer_small, "
        "output capped at source length + 2)",
    )
    ap.add_argument(
        "--gen-sentences",
        type=common.positive_int,
        default=200,
        help="test sentences per generation run",
    )
    ap.add_argument("--beams", nargs="+", type=common.positive_int, default=[1, 5])
    ap.add_argument("--worker", choices=sorted(WORKERS), help=argparse.SUPPRESS)
    ap.add_argument("--params", help=argparse.SUPPRESS)
    ap.add_argument("--result", help=argparse.SUPPRESS)
    return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
    from benchmarks.preprocess import build_multi30k, check_raw

    if args.train_warmup % args.train_log_interval or args.train_updates <= args.train_warmup:
        raise common.BenchError(
            f"--train-warmup {args.train_warmup}: must be a multiple of --train-log-interval "
            f"({args.train_log_interval}) and below --train-updates ({args.train_updates})"
        )
    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise common.BenchError(f"--checkpoint {args.checkpoint}: no such file")
    raw = args.raw.resolve()
    check_raw(raw)
    args.out.mkdir(parents=True, exist_ok=True)
    data = (
        args.data.resolve()
        if args.data
        else build_multi30k(raw, (args.out / "data-bin").resolve(), args.preprocess_workers)
    )

    def repeat(kind: str, params: dict[str, Any], label: str, times: int = 0) -> dict[str, Any]:
        runs, times = [], times or args.repeats
        for i in range(times):
            runs.append(measure(kind, params))
            shown = ", ".join(f"{k}={v:.4g}" for k, v in runs[-1].items() if isinstance(v, float))
            print(f"suite: {label} run {i + 1}/{times}: {shown}", file=sys.stderr, flush=True)
        return common.median_fields(runs)

    figures: dict[str, Any] = {}
    figures["preprocess"] = repeat(
        "preprocess",
        {"raw": str(raw), "workers": args.preprocess_workers, "spm_model": str(data / "spm.model")},
        "preprocess",
    )
    figures["train"] = {
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
    figures["generate"] = {}
    for beam in args.beams:
        for use_cache in (True, False):
            name = f"beam {beam}, {'KV cache' if use_cache else 'no cache'}"
            figures["generate"][name] = repeat(
                "generate",
                {
                    "checkpoint": args.checkpoint,
                    "spm_cache": str(data / "spm.model"),
                    "threads": args.threads,
                    "input": str(raw / "test_2016_flickr.en"),
                    "sentences": args.gen_sentences,
                    "beam": beam,
                    "use_cache": use_cache,
                },
                f"generate {name}",
            )
    figures["params"] = {
        "repeats": args.repeats,
        "train_repeats": args.train_repeats or args.repeats,
        "threads": args.threads,
        "preprocess_workers": args.preprocess_workers,
        "train_updates": args.train_updates,
        "train_warmup": args.train_warmup,
        "gen_sentences": args.gen_sentences,
        "gen_model": args.checkpoint or "random transformer_small (max_len 1.0 x src + 2)",
    }
    return figures


def main(argv: list[str] | None = None) -> int:
    """The suite, or (--worker) one of its measurements in this subprocess."""
    command_line = argv is None
    argv = list(sys.argv[1:] if argv is None else argv)
    args = build_parser().parse_args(argv)
    if command_line and not args.worker:
        common.passive_environment()  # for the workers: see common.passive_openmp
    if args.worker:
        worker_main(args.worker, args.params, args.result)
        return 0
    report_path = args.json
    if report_path is None:  # the suite always keeps its report
        args.out.mkdir(parents=True, exist_ok=True)
        report_path = args.out / "bench.json"
        argv += ["--json", str(report_path)]
    code = common.main(NAME, build_parser, run, argv)
    if code == 0:
        from nmt.fsutil import atomic_write_text

        table = markdown(json.loads(Path(report_path).read_text()))
        atomic_write_text(args.out / "bench.md", table)
        print(table)
        print(f"suite: wrote {args.out / 'bench.md'} and {report_path}", file=sys.stderr)
    return code


if __name__ == "__main__":
    raise SystemExit(main())
