#!/usr/bin/env python
"""Training throughput of nmt-train: target tokens/s and model FLOP/s, fp32 and bf16.

Trains with the real training step (nmt.training.build_training, nothing saved) for
`--updates` updates per precision on a data dir, the precisions taking turns of
`--log-interval` updates over the same batches, and times each interval, discarding the
warm-up intervals, like fairseq's "wps" (`--sequential`: each precision's whole
Trainer.run in turn, with the throughput the loop itself logs). In the same process it
measures the machine's matmul peak in fp32 and bf16, so the model FLOP/s can be read as a
fraction of what the hardware does.

The default shape is the one of ../shared/bench/fairseq_peer.sh (transformer_small with
shared embeddings, no attention/activation dropout, Adam + inverse_sqrt, max_tokens 4096),
for a paired comparison with fairseq on the same machine.

    nmt-preprocess data.trainpref=../shared/data/multi30k/train \\
        data.validpref=../shared/data/multi30k/val data.testpref=[] \\
        data.dest=/tmp/multi30k spm.vocab_size=8000
    python scripts/bench_train.py --data /tmp/multi30k --threads 2

Model FLOPs count the matmuls of forward and backward (3x forward) on the real (unpadded)
tokens of the measured batches: projections, FFN, attention scores and values (the causal
half included, as computed) and the output layer.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import torch


def matmul_peak(
    dtype: torch.dtype, n: int = 2048, seconds: float = 1.0, device: str = "cpu"
) -> float:
    """Best-of FLOP/s of an n x n x n matmul in `dtype` (threads as currently set)."""
    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):  # warm-up: kernel selection, AMX tile config, caches
        a @ b
    sync()
    best = float("inf")
    deadline = time.perf_counter() + seconds
    while time.perf_counter() < deadline:
        start = time.perf_counter()
        a @ b
        sync()
        best = min(best, time.perf_counter() - start)
    return 2.0 * n**3 / best


def batch_flops(model_cfg, vocab: int, src_lens: np.ndarray, tgt_lens: np.ndarray) -> float:
    """Training FLOPs (forward + backward = 3x forward) of one batch of real tokens."""
    d, f = model_cfg.embed_dim, model_cfg.ffn_dim
    s, t = src_lens.astype(np.float64), tgt_lens.astype(np.float64)
    enc = model_cfg.encoder_layers * ((4 * d * d + 2 * d * f) * s.sum() + 2 * d * (s**2).sum())
    dec_self = 4 * d * d * t.sum() + 2 * d * (t**2).sum()
    dec_cross = 2 * d * d * t.sum() + 2 * d * d * s.sum() + 2 * d * (s * t).sum()
    dec = model_cfg.decoder_layers * (dec_self + dec_cross + 2 * d * f * t.sum())
    output = d * vocab * t.sum()
    macs = enc + dec + output
    return 3 * 2 * macs


def _device(args: argparse.Namespace) -> str:
    # scripts/bench.py builds its own Namespace without --device: CPU, as before the option.
    return getattr(args, "device", "cpu")


def train_cfg(args: argparse.Namespace, precision: str, save_dir: Path, package: str = "nmt"):
    """The benchmark's TrainConfig, composed by `package`'s cli (bench_train_paired.py
    passes an older copy of nmt)."""
    import importlib

    cli = importlib.import_module(f"{package}.cli")
    overrides = [
        f"data={args.data}",
        f"save_dir={save_dir}",
        f"model={args.model}",
        "optim=adam_inverse_sqrt",
        "optim.lr=1e-3",
        "optim.warmup_updates=1000",
        "optim.weight_decay=0.0001",
        "label_smoothing=0.1",
        f"max_tokens={args.max_tokens}",
        f"precision={precision}",
        f"threads={args.threads}",
        f"device={_device(args)}",
        "seed=1",
        f"max_update={args.updates}",
        f"log_interval={args.log_interval}",
        "valid_split=''",
        "no_save=true",
        "tensorboard=false",
        "progress_bar=false",
    ]
    if args.fairseq_shape:
        overrides += [
            "model.share_all_embeddings=true",
            "model.attention_dropout=0.0",
            "model.activation_dropout=0.0",
            "model.dropout=0.3",
        ]
    return cli.to_dataclass(cli.compose_config("train", overrides))


def run(args: argparse.Namespace, precision: str) -> dict:
    from nmt.training import build_training

    with tempfile.TemporaryDirectory() as tmp:
        cfg = train_cfg(args, precision, Path(tmp))
        trainer = build_training(cfg)
        vocab = trainer.data.meta.tgt_vocab_size
        data = trainer.data.train
        batches = trainer.data.epoch_batches(1)
        if len(batches) < args.updates:
            raise SystemExit(
                f"--updates {args.updates}: the first epoch has only {len(batches)} batches"
            )
        result = trainer.run()
        events = [json.loads(line) for line in (Path(tmp) / "train.jsonl").read_text().splitlines()]
    train = [e for e in events if e["type"] == "train"]
    measured = [e for e in train if e["update"] > args.warmup]
    seconds = sum(e["tokens"] / e["tok_s"] for e in measured)
    tokens = sum(e["tokens"] for e in measured)
    first = (
        min(e["update"] for e in measured) - args.log_interval
    )  # updates before the measured ones
    flops = sum(
        batch_flops(cfg.model, vocab, data.src_sizes[b], data.tgt_sizes[b])
        for b in batches[first : result.num_updates]
    )
    return {
        "precision": precision,
        "tok_s_median": statistics.median(e["tok_s"] for e in measured),
        "tok_s_mean": tokens / seconds,
        "flop_s": flops / seconds,
        "intervals": len(measured),
        "losses": [(e["update"], round(e["loss"], 4)) for e in train],
    }


def run_interleaved(args: argparse.Namespace, precisions: list[str]) -> list[dict]:
    """`run`'s figures for several precisions trained in turns, one interval each.

    On a shared machine the speed drifts by 10-20% within minutes, so precisions run one
    after the other get different machines; in turns, drift hits them alike and their
    ratio holds. Each precision has its own Trainer and takes the same batches, in the
    order of the training loop's first epoch.
    """
    from nmt.training import build_training
    from nmt.training.checkpointing import rng_state, set_rng_state
    from nmt.training.loop import log_train

    with tempfile.TemporaryDirectory() as tmp:
        trainers, rngs = {}, {}
        for p in precisions:
            trainers[p] = build_training(train_cfg(args, p, Path(tmp) / p))  # seeds the RNGs
            rngs[p] = rng_state()  # each keeps its own dropout stream, as if trained alone
            trainers[p].meter.start_run()  # as run() does
        first = trainers[precisions[0]]
        data = first.data.train
        batches = first.data.epoch_batches(1)
        if len(batches) < args.updates:
            raise SystemExit(
                f"--updates {args.updates}: the first epoch has only {len(batches)} batches"
            )
        intervals: dict[str, list[float]] = {p: [] for p in precisions}  # seconds per interval
        tokens, flops = [], []
        for i, start in enumerate(range(0, args.updates, args.log_interval)):
            chunk = batches[start : start + args.log_interval]
            tokens.append(int(sum(data.tgt_sizes[b].sum() for b in chunk)))
            flops.append(
                sum(
                    batch_flops(
                        first.cfg.model,
                        first.data.meta.tgt_vocab_size,
                        data.src_sizes[b],
                        data.tgt_sizes[b],
                    )
                    for b in chunk
                )
            )
            for p in precisions if i % 2 == 0 else reversed(precisions):  # alternate who goes first
                set_rng_state(rngs[p])
                begin = time.perf_counter()
                for batch in chunk:
                    trainers[p].train_step([batch])
                intervals[p].append(time.perf_counter() - begin)
                log_train(trainers[p], epoch=1)  # the interval's loss to train.jsonl
                rngs[p] = rng_state()
        losses = {
            p: [
                (e["update"], round(e["loss"], 4))
                for e in map(json.loads, (Path(tmp) / p / "train.jsonl").read_text().splitlines())
                if e["type"] == "train"
            ]
            for p in precisions
        }
    skip = args.warmup // args.log_interval
    results = []
    for p in precisions:
        secs = intervals[p][skip:]
        results.append(
            {
                "precision": p,
                "tok_s_mean": sum(tokens[skip:]) / sum(secs),
                "tok_s_median": statistics.median(t / s for t, s in zip(tokens[skip:], secs)),
                "flop_s": sum(flops[skip:]) / sum(secs),
                "intervals": len(secs),
                "losses": losses[p],
            }
        )
    return results


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument(
        "--data", required=True, help="data dir from nmt-preprocess (Multi30k, 8k joint vocab)"
    )
    parser.add_argument("--model", default="transformer_small", help="configs/model preset")
    parser.add_argument("--threads", type=int, default=2, help="torch threads")
    parser.add_argument("--updates", type=int, default=80, help="updates per precision")
    parser.add_argument("--warmup", type=int, default=20, help="updates not measured (warm-up)")
    parser.add_argument(
        "--log-interval", type=int, default=10, help="updates per measured interval"
    )
    parser.add_argument("--max-tokens", type=int, default=4096)
    parser.add_argument(
        "--precisions", nargs="+", default=["fp32", "bf16"], help="fp32 bf16 fp16 (fp16: CUDA)"
    )
    parser.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU run")
    parser.add_argument(
        "--no-fairseq-shape",
        dest="fairseq_shape",
        action="store_false",
        help="use the preset as is (default: the fairseq peer script's settings)",
    )
    parser.add_argument(
        "--sequential",
        dest="interleave",
        action="store_false",
        help="run the precisions one after the other through Trainer.run (default: "
        "in turns, one interval each, so that the machine's drift cannot skew "
        "their ratio)",
    )
    args = parser.parse_args()
    if args.warmup % args.log_interval:
        raise SystemExit("--warmup must be a multiple of --log-interval")

    torch.set_num_threads(args.threads)
    where = (
        torch.cuda.get_device_name()
        if args.device.startswith("cuda")
        else f"{args.threads} threads"
    )
    print(
        f"# torch {torch.__version__}, {where}, load average {os.getloadavg()[0]:.2f} "
        f"(the machine is shared: other jobs lower these figures)"
    )
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    peaks = {
        p: matmul_peak(dtypes[p], device=args.device)
        for p in dict.fromkeys(["fp32", *args.precisions])
    }
    for name, value in peaks.items():
        print(f"matmul peak {name}: {value / 1e9:8.1f} GFLOP/s (2048^3, best of 1 s)")
    results = (
        run_interleaved(args, args.precisions)
        if args.interleave
        else [run(args, p) for p in args.precisions]
    )
    base = results[0]["tok_s_mean"]
    for r in results:
        peak = peaks[r["precision"]]
        print(
            f"{args.model} {r['precision']}: {r['tok_s_mean']:7.0f} target tok/s (median of "
            f"{r['intervals']} intervals {r['tok_s_median']:.0f}), {r['flop_s'] / 1e9:6.1f} model GFLOP/s "
            f"= {100 * r['flop_s'] / peak:4.1f}% of the {r['precision']} matmul peak, "
            f"{r['tok_s_mean'] / base:.2f}x {results[0]['precision']}"
        )
    for r in results:
        print(f"loss curve {r['precision']}: " + " ".join(f"{u}:{loss}" for u, loss in r["losses"]))
    print(f"# load average at the end {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
