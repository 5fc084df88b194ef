#!/usr/bin/env python
"""Paired generation speed: nmt-generate against fairseq-generate on the same weights.

fairseq 0.12 (the venv that ../shared/bench/fairseq_peer.sh builds) trains a
transformer_small (3+3 layers, 256 dim, 1024 FFN, shared joint 8k SentencePiece vocab) for
`--updates` updates; `nmt-import-fairseq` converts that checkpoint; then both command-line
tools translate Multi30k test_2016_flickr with the same beam, batch size, length limits and
threads, alternating, `--repeats` times each. Each tool's own timing line is used: both
exclude start-up and model loading (fairseq's covers only its inference steps, nmt's also
tokenization and writing, so the comparison slightly favours fairseq).

    bash ../shared/bench/fairseq_peer.sh 21          # once: builds /tmp/fairseq-peer/venv
    .venv/bin/python -m benchmarks.fairseq_generate

With the default --updates 1 the model is untrained: it never chooses EOS, so every
hypothesis runs to the length limit (--max-len-a x source + --max-len-b), which is then
the same work for both tools; the printed token counts show it. fairseq-fixed 0.12.3 under
this torch leaves some sentences out of its output; its rate is over the ones it printed.
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import sys
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "fairseq_generate"
MULTI30K = common.MULTI30K
ARCH = [
    "--arch",
    "transformer",
    "--encoder-layers",
    "3",
    "--decoder-layers",
    "3",
    "--encoder-embed-dim",
    "256",
    "--decoder-embed-dim",
    "256",
    "--encoder-ffn-embed-dim",
    "1024",
    "--decoder-ffn-embed-dim",
    "1024",
    "--encoder-attention-heads",
    "4",
    "--decoder-attention-heads",
    "4",
    "--share-all-embeddings",
]
FAIRSEQ_LINE = re.compile(
    r"Translated ([\d,]+) sentences \(([\d,]+) tokens\) in ([\d.]+)s "
    r"\(([\d.]+) sentences/s, ([\d.]+) tokens/s\)"
)
NMT_LINE = re.compile(
    r"translated (\d+) sentences \((\d+) target tokens\) in ([\d.]+)s: "
    r"([\d.]+) sentences/s, (\d+) tokens/s"
)


def run_peer(cmd: list[str], env: dict, cwd: Path | None = None) -> common.Completed:
    """A peer command to its end (a BenchError quoting its stderr if it fails)."""
    name = Path(cmd[0]).name if cmd[0] != sys.executable else "nmt"
    return common.run_subprocess(cmd, env=env, cwd=cwd, check=name)


def prepare(peer: Path, work: Path, updates: int, env: dict) -> Path:
    """Binarized test split and a fairseq checkpoint in `work`; returns the imported nmt one."""
    import sentencepiece as spm

    imported = work / f"nmt_{updates}.pt"
    if imported.exists():
        return imported
    sp = spm.SentencePieceProcessor(model_file=str(peer / "spm.model"))
    for lang in ("en", "de"):
        lines = (MULTI30K / f"test_2016_flickr.{lang}").read_text(encoding="utf-8").splitlines()
        (work / f"test.sp.{lang}").write_text(
            "".join(" ".join(sp.encode(line.strip(), out_type=str)) + "\n" for line in lines),
            encoding="utf-8",
        )
    fs = peer / "venv" / "bin"
    if not (work / "bin" / "test.en-de.en.bin").exists():
        run_peer(
            [
                str(fs / "fairseq-preprocess"),
                "--source-lang",
                "en",
                "--target-lang",
                "de",
                "--trainpref",
                str(peer / "train.sp"),
                "--testpref",
                "test.sp",
                "--destdir",
                "bin",
                "--joined-dictionary",
                "--srcdict",
                str(peer / "dict.txt"),
                "--workers",
                "2",
            ],
            env,
            work,
        )
    ckpt = work / f"ckpt_{updates}" / "checkpoint_last.pt"
    if not ckpt.exists():
        run_peer(
            [
                str(fs / "fairseq-train"),
                "bin",
                "--cpu",
                *ARCH,
                "--source-lang",
                "en",
                "--target-lang",
                "de",
                "--dropout",
                "0.3",
                "--optimizer",
                "adam",
                "--adam-betas",
                "(0.9,0.98)",
                "--lr",
                "1e-3",
                "--lr-scheduler",
                "inverse_sqrt",
                "--warmup-updates",
                "1000",
                "--criterion",
                "label_smoothed_cross_entropy",
                "--label-smoothing",
                "0.1",
                "--max-tokens",
                "4096",
                "--save-dir",
                ckpt.parent.name,
                "--no-epoch-checkpoints",
                "--disable-validation",
                "--max-update",
                str(updates),
                "--seed",
                "1",
                "--num-workers",
                "0",
            ],
            env,
            work,
        )
    run_peer(
        common.python_cli(
            "import_fairseq",
            [
                f"checkpoint={ckpt}",
                f"data_dir={work / 'bin'}",
                f"spm={peer / 'spm.model'}",
                f"output={imported}",
                "overwrite=true",
            ],
        ),
        env,
    )
    return imported


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument(
        "--peer",
        type=Path,
        default=Path("/tmp/fairseq-peer"),
        help="fairseq_peer.sh's work dir (venv, spm.model, dict.txt, train.sp.*)",
    )
    p.add_argument("--work", type=Path, default=common.WORK / "fairseq_generate")
    p.add_argument(
        "--updates", type=common.positive_int, default=1, help="fairseq updates of the model"
    )
    p.add_argument("--beam", type=common.positive_int, default=5)
    p.add_argument("--batch", type=common.positive_int, default=64, help="sentences per batch")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=2)
    p.add_argument(
        "--dtype", default="fp32", choices=["fp32", "bf16"], help="nmt's (fairseq: fp32)"
    )
    p.add_argument("--repeats", type=common.positive_int, default=2)
    p.add_argument(
        "--prepare-only",
        action="store_true",
        help="build the data, the fairseq model and its import, and stop (time later)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    if not (args.peer / "venv" / "bin" / "fairseq-generate").exists():
        raise common.BenchError(
            f"--peer {args.peer}: no fairseq venv there; run "
            "bash ../shared/bench/fairseq_peer.sh first"
        )
    args.work.mkdir(parents=True, exist_ok=True)
    # fairseq 0.12 loads its own checkpoints with torch.load's old default; OMP threads as
    # asked, and passive OpenMP waits so that idle workers do not spin on a shared machine.
    env = {
        **os.environ,
        "TORCH_FORCE_NO_WEIGHTS_ONLY_LOAD": "1",
        "OMP_NUM_THREADS": str(args.threads),
        "OMP_WAIT_POLICY": "PASSIVE",
    }
    imported = prepare(args.peer, args.work, args.updates, env)
    if args.prepare_only:
        print(
            f"prepared {args.work}: fairseq checkpoint ckpt_{args.updates}/, nmt import {imported.name}"
        )
        return {"prepared": str(args.work), "imported": str(imported)}
    limits = ["--max-len-a", str(args.max_len_a), "--max-len-b", str(args.max_len_b)]
    fairseq_cmd = [
        str(args.peer / "venv" / "bin" / "fairseq-generate"),
        "bin",
        "--path",
        f"ckpt_{args.updates}/checkpoint_last.pt",
        "--gen-subset",
        "test",
        "--beam",
        str(args.beam),
        "--batch-size",
        str(args.batch),
        "--cpu",
        *limits,
    ]
    nmt_cmd = common.python_cli(
        "generate",
        [
            f"checkpoint={imported}",
            f"input={MULTI30K / 'test_2016_flickr.en'}",
            f"output={args.work / 'nmt.hyp.de'}",
            f"beam={args.beam}",
            f"max_sentences={args.batch}",
            f"max_len_a={args.max_len_a}",
            f"max_len_b={args.max_len_b}",
            f"threads={args.threads}",
            f"precision={args.dtype}",
            "device=cpu",
            "progress=false",
        ],
    )
    results: dict[str, list[tuple[int, int, float]]] = {"fairseq": [], "nmt": []}
    for i in range(args.repeats):
        for name, cmd, pattern in (
            ("fairseq", fairseq_cmd, FAIRSEQ_LINE),
            ("nmt", nmt_cmd, NMT_LINE),
        ):
            done = run_peer(cmd, env, args.work)
            found = pattern.search(done.stdout + done.stderr)
            if not found:
                raise common.BenchError(f"no timing line in {name}'s output")
            sents, tokens, secs = (
                int(found.group(1).replace(",", "")),
                int(found.group(2).replace(",", "")),
                float(found.group(3)),
            )
            results[name].append((sents, tokens, secs))
            print(
                f"run {i + 1} {name:8s} {sents} sentences, {tokens} tokens in {secs:.1f} s: "
                f"{sents / secs:.1f} sentences/s, {tokens / secs:.0f} tokens/s",
                flush=True,
            )
    rate = {name: statistics.median(s / t for s, _, t in runs) for name, runs in results.items()}
    pairs = [(n[0] / n[2]) / (f[0] / f[2]) for f, n in zip(results["fairseq"], results["nmt"])]
    print(
        f"beam {args.beam}, batch {args.batch}, {args.threads} threads, max_len {args.max_len_a} "
        f"x src + {args.max_len_b}, nmt {args.dtype}, fairseq fp32; load average "
        f"{common.load_average():.1f}"
    )
    print(
        f"median sentences/s: fairseq {rate['fairseq']:.1f}, nmt {rate['nmt']:.1f}: "
        f"nmt = {rate['nmt'] / rate['fairseq']:.2f}x fairseq-generate "
        f"(per pair: {', '.join(f'{r:.2f}' for r in pairs)})"
    )
    return {
        "beam": args.beam,
        "batch": args.batch,
        "threads": args.threads,
        "max_len": [args.max_len_a, args.max_len_b],
        "nmt_dtype": args.dtype,
        "runs": {
            name: [{"sentences": s, "tokens": t, "seconds": sec} for s, t, sec in runs]
            for name, runs in results.items()
        },
        "sent_s": rate,
        "nmt_over_fairseq": rate["nmt"] / rate["fairseq"],
        "per_pair": pairs,
    }


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
