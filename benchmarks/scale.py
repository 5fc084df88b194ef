"""Benchmark `scale`: nmt-preprocess and nmt-train start-up on big corpora (issue 19).

    python -m benchmarks.scale                          # 1M and 10M pairs (about 20 minutes)
    python -m benchmarks.scale --sizes 100000 1000000   # smaller
    python -m benchmarks.scale --fairseq-preprocess /tmp/fairseq-peer/venv/bin/fairseq-preprocess
    python -m benchmarks.scale --sizes 1000000 --preprocess-arg clean.dedup=true   # cleaning on

For each size, a synthetic corpus (benchmarks.make_corpus: WMT-like lengths, seeded) is
written once into --workdir and reused by later runs. Then, each as the real command in a
subprocess:
  - nmt-preprocess with a SentencePiece model trained on it (bpe, --vocab-size, on the
    default sample of spm.input_sentence_size sentences): wall time, pairs/s, CPU time and
    peak RSS of the main process and of its largest child (encoding workers, the
    SentencePiece trainer);
  - the corpus-dependent part of nmt-train's start-up alone (nmt.training.data: open the
    data dir, build epoch 1's batches; no torch): wall time and peak RSS;
  - nmt-train on the data dir (model=transformer_base, CPU, one update): wall time from
    the command's start to its first update starting and ending, and peak RSS;
  - with --fairseq-preprocess: fairseq-preprocess on the smallest corpus, encoded to
    pieces with the same SentencePiece model (encoding not timed), --workers alike.
Time should grow linearly with the corpus and memory stay flat; the targets of issue 19
(2 cores): 10M pairs preprocessed in <= 5 min with <= 2 GiB per process, the same RSS at
1M and 10M; nmt-train start to first update <= 10 s on 10M pairs, RSS within 0.1 GiB of
the 1M figure. The figures print as a Markdown table; --json FILE writes them as JSON (the schema of
benchmarks/common.py: machine, date, command, and these figures).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

from benchmarks import common
from benchmarks.make_corpus import write_corpus

NAME = "scale"

GIB = 1 << 30

# Runs a console command in this interpreter and reports its resource use on stderr:
# ru_maxrss of itself and the largest of its waited-for children (workers, trainer child).
_RUNNER = """
import json, os, resource, sys, time
command, argv = sys.argv[1], sys.argv[2:]
from nmt.cli import main
code = 0
try:
    main(command, argv)
except SystemExit as exc:
    code = exc.code if isinstance(exc.code, int) else 1
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print("SCALE-RUSAGE " + json.dumps({
    "code": code, "self_rss_kib": me.ru_maxrss, "child_rss_kib": kids.ru_maxrss,
    "cpu_s": me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime,
}), file=sys.stderr)
sys.exit(code)
"""


def run_command(command: str, argv: list[str], log: Path) -> dict[str, Any]:
    """`nmt-<command> argv` in a subprocess: wall time, CPU time and peak RSS (GiB)."""
    started = time.time()
    with open(log, "w") as out:
        proc = subprocess.run(
            [sys.executable, "-c", _RUNNER, command, *argv],
            stdout=out,
            stderr=subprocess.PIPE,
            text=True,
        )
    wall = time.time() - started
    usage = None
    for line in proc.stderr.splitlines():
        if line.startswith("SCALE-RUSAGE "):
            usage = json.loads(line.split(" ", 1)[1])
    if proc.returncode != 0 or usage is None:
        tail = proc.stderr.strip().splitlines()[-3:]
        raise common.BenchError(f"nmt-{command} failed ({proc.returncode}): {' / '.join(tail)}")
    return {
        "started": started,
        "wall_s": wall,
        "cpu_s": usage["cpu_s"],
        "rss_gib": usage["self_rss_kib"] * 1024 / GIB,
        "child_rss_gib": usage["child_rss_kib"] * 1024 / GIB,
    }


def corpus(workdir: Path, pairs: int, seed: int) -> Path:
    """<workdir>/corpus-<pairs>/{train,valid}.{en,de}, written once."""
    folder = workdir / f"corpus-{pairs}"
    done = folder / "complete"
    if not done.exists():
        shutil.rmtree(folder, ignore_errors=True)
        started = time.perf_counter()
        write_corpus(folder / "train", pairs, seed=seed)
        write_corpus(folder / "valid", 3000, seed=seed + 1)
        print(f"scale: wrote {pairs:,} pairs in {time.perf_counter() - started:.0f} s", flush=True)
        done.write_text("ok\n")
    return folder


def preprocess(folder: Path, dest: Path, args: argparse.Namespace, pairs: int) -> dict[str, Any]:
    argv = [
        f"data.trainpref={folder / 'train'}",
        f"data.validpref={folder / 'valid'}",
        "data.testpref=[]",
        f"data.dest={dest}",
        f"spm.vocab_size={args.vocab_size}",
        f"spm.model_type={args.model_type}",
        f"workers={args.workers}",
        "overwrite=true",
        *args.preprocess_arg,
    ]
    result = run_command("preprocess", argv, dest.parent / f"preprocess-{pairs}.log")
    result["pairs_per_s"] = pairs / result["wall_s"]
    return result


def train_startup(data: Path, args: argparse.Namespace, pairs: int) -> dict[str, Any]:
    """nmt-train for one update; the start-up is read from train.jsonl's event times."""
    save_dir = data.parent / f"run-{pairs}"
    shutil.rmtree(save_dir, ignore_errors=True)
    argv = [
        f"data={data}",
        f"save_dir={save_dir}",
        f"model={args.model}",
        "device=cpu",
        f"threads={args.workers}",
        "max_update=1",
        "logging.interval=1",
        "checkpoint.no_save=true",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
        "validation.split=''",
    ]
    result = run_command("train", argv, data.parent / f"train-{pairs}.log")
    events = [json.loads(line) for line in (save_dir / "train.jsonl").read_text().splitlines()]
    start = next(e["time"] for e in events if e["type"] == "start")
    first = next(e["time"] for e in events if e["type"] == "train")
    result["to_first_update_s"] = start - result["started"]
    result["first_update_end_s"] = first - result["started"]
    shutil.rmtree(save_dir, ignore_errors=True)
    return result


# Opens a data dir as nmt-train does and builds epoch 1's batches, without torch: the part
# of the start-up that depends on the corpus (the rest, importing torch and building the
# model, does not).
_DATA_RUNNER = """
import json, resource, sys, time
started = time.perf_counter()
from nmt.training.config import TrainConfig, ValidationConfig
from nmt.training.data import load_train_data
imported = time.perf_counter()
data = load_train_data(TrainConfig(data=sys.argv[1], validation=ValidationConfig(split="")))
batches = data.epoch_batches(1)
done = time.perf_counter()
print(json.dumps({"import_s": imported - started, "data_s": done - imported,
                  "rss_gib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20,
                  "batches": len(batches), "pairs": batches.pairs()}))
"""


def train_data_startup(data: Path) -> dict[str, Any]:
    """The corpus-dependent part of nmt-train's start-up: time and peak RSS."""
    proc = subprocess.run(
        [sys.executable, "-c", _DATA_RUNNER, str(data)], capture_output=True, text=True
    )
    if proc.returncode != 0:
        raise common.BenchError(f"opening {data} failed: {proc.stderr.strip()[-300:]}")
    return json.loads(proc.stdout.strip().splitlines()[-1])


def fairseq_preprocess(
    folder: Path, data: Path, executable: str, args: argparse.Namespace, pairs: int
) -> dict[str, Any]:
    """fairseq-preprocess on the corpus as SentencePiece pieces (nmt's model), timed alone."""
    from nmt.data.tokenizer import Tokenizer

    work = data.parent / f"fairseq-{pairs}"
    shutil.rmtree(work, ignore_errors=True)
    work.mkdir(parents=True)
    tok = Tokenizer.from_file(data / "spm.model")
    for split in ("train", "valid"):
        for lang in ("en", "de"):
            with (
                open(folder / f"{split}.{lang}", encoding="utf-8") as f,
                open(work / f"{split}.sp.{lang}", "w", encoding="utf-8") as out,
            ):
                batch: list[str] = []
                for line in f:
                    batch.append(" ".join(line.split()))
                    if len(batch) == 10000:
                        out.writelines(" ".join(p) + "\n" for p in _pieces(tok, batch))
                        batch = []
                out.writelines(" ".join(p) + "\n" for p in _pieces(tok, batch))
    command = [
        executable,
        "--source-lang", "en", "--target-lang", "de",
        "--trainpref", str(work / "train.sp"), "--validpref", str(work / "valid.sp"),
        "--destdir", str(work / "bin"), "--joined-dictionary", "--workers", str(args.workers),
    ]  # fmt: skip
    started = time.time()
    with open(work / "preprocess.log", "w") as out:
        proc = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT)
        _, status, usage = os.wait4(proc.pid, 0)
    wall = time.time() - started
    if os.waitstatus_to_exitcode(status) != 0:
        raise common.BenchError(f"fairseq-preprocess failed: see {work / 'preprocess.log'}")
    return {
        "wall_s": wall,
        "pairs_per_s": pairs / wall,
        "cpu_s": usage.ru_utime + usage.ru_stime,
        "rss_gib": usage.ru_maxrss * 1024 / GIB,
    }


def _pieces(tok: Any, lines: list[str]) -> list[list[str]]:
    return [tok.encode_as_pieces(line) for line in lines]


def table(figures: dict[str, Any]) -> str:
    header = ["pairs", "step", "wall (s)", "pairs/s", "CPU (s)", "peak RSS main (GiB)"]
    header.append("largest child (GiB)")
    rows: list[list[str]] = []
    for size in figures["sizes"]:
        pairs = f"{size['pairs']:,}"
        p = size["preprocess"]
        rows.append(
            [pairs, "nmt-preprocess", f"{p['wall_s']:.1f}", f"{p['pairs_per_s']:,.0f}"]
            + [f"{p['cpu_s']:.0f}", f"{p['rss_gib']:.2f}", f"{p['child_rss_gib']:.2f}"]
        )
        d = size.get("train_data")
        if d:
            rows.append(
                [pairs, "training data: open + epoch 1 batches", f"{d['data_s']:.1f}", "", ""]
                + [f"{d['rss_gib']:.3f}", ""]
            )
        t = size.get("train")
        if t:
            rows.append(
                [pairs, "nmt-train to 1st update (ends)"]
                + [f"{t['to_first_update_s']:.1f} ({t['first_update_end_s']:.1f})", ""]
                + [f"{t['cpu_s']:.0f}", f"{t['rss_gib']:.2f}", f"{t['child_rss_gib']:.2f}"]
            )
        f = size.get("fairseq")
        if f:
            rows.append(
                [pairs, "fairseq-preprocess (pieces given)", f"{f['wall_s']:.1f}"]
                + [f"{f['pairs_per_s']:,.0f}", f"{f['cpu_s']:.0f}", f"{f['rss_gib']:.2f}", ""]
            )
    return common.markdown_table(header, rows)


def build_parser() -> argparse.ArgumentParser:
    parser = common.parser(NAME, __doc__)
    parser.add_argument(
        "--sizes", type=common.positive_int, nargs="+", default=[1_000_000, 10_000_000]
    )
    parser.add_argument("--workdir", type=Path, default=Path(tempfile.gettempdir()) / "nmt-scale")
    parser.add_argument("--workers", type=common.positive_int, default=2)
    parser.add_argument("--vocab-size", type=common.positive_int, default=8000)
    parser.add_argument("--model-type", choices=["bpe", "unigram"], default="bpe")
    parser.add_argument("--model", default="transformer_base", help="nmt-train model preset")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--no-train", action="store_true", help="skip the nmt-train start-up")
    parser.add_argument("--fairseq-preprocess", help="fairseq-preprocess executable (peer)")
    parser.add_argument("--keep", action="store_true", help="keep the data dirs")
    parser.add_argument(
        "--preprocess-arg",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an nmt-preprocess override, after the benchmark's own (repeat for more), "
        "e.g. clean.dedup=true",
    )
    return parser


def run(args: argparse.Namespace) -> dict[str, Any]:
    """The benchmark (common.main's `run`): every size in turn; the figures."""
    if args.fairseq_preprocess and shutil.which(args.fairseq_preprocess) is None:
        raise common.BenchError(
            f"--fairseq-preprocess {args.fairseq_preprocess}: no such executable; "
            "build the peer with ../shared/bench/fairseq_peer.sh"
        )
    try:
        args.workdir.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise common.BenchError(f"--workdir {args.workdir}: {exc.strerror}") from None
    figures: dict[str, Any] = {
        "settings": {
            "workers": args.workers,
            "spm": f"{args.model_type} {args.vocab_size}",
            "model": args.model,
            "preprocess_args": list(args.preprocess_arg),
        },
        "sizes": [],
    }
    print(f"scale: {common.cpu_model()}, load average {common.load_average():.2f}", flush=True)
    for pairs in sorted(args.sizes):
        folder = corpus(args.workdir, pairs, args.seed)
        data = args.workdir / f"data-{pairs}"
        size: dict[str, Any] = {"pairs": pairs, "preprocess": preprocess(folder, data, args, pairs)}
        print(f"scale: preprocess {pairs:,}: {json.dumps(size['preprocess'])}", flush=True)
        if not args.no_train:
            size["train_data"] = train_data_startup(data)
            print(f"scale: train data {pairs:,}: {json.dumps(size['train_data'])}", flush=True)
            size["train"] = train_startup(data, args, pairs)
            print(f"scale: train {pairs:,}: {json.dumps(size['train'])}", flush=True)
        if args.fairseq_preprocess and pairs == min(args.sizes):
            size["fairseq"] = fairseq_preprocess(folder, data, args.fairseq_preprocess, args, pairs)
            print(f"scale: fairseq {pairs:,}: {json.dumps(size['fairseq'])}", flush=True)
        if not args.keep:
            shutil.rmtree(data, ignore_errors=True)
        figures["sizes"].append(size)
    print(table(figures))
    return figures


def main(argv: list[str] | None = None) -> int:
    return common.main(NAME, build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
