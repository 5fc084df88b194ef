"""Training throughput: target tokens/s and model FLOP/s, fp32 and bf16.

Trains with the real training step (nmt.training.build_training, nothing saved) for
`--updates` updates per precision on a data dir. By default the precisions take turns of
`--log-interval` updates over the same batches (benchmarks.common.interleave), each with a
Trainer and a dropout RNG stream of its own, so that the machine's drift hits them alike;
the first `--warmup` updates are not measured, like fairseq's "wps". `--sequential` runs
each precision's whole training loop (nmt.training.run) in turn and reads the throughput
the loop logs. In the same process it measures the machine's matmul peak per precision, so
the model FLOP/s can be read as a fraction of what the hardware does.

The default shape is the one of ../shared/bench/fairseq_peer.sh (transformer_small with
shared embeddings, no attention/activation dropout, Adam + inverse_sqrt, max_tokens 4096),
for a paired comparison with fairseq on the same machine.

    .venv/bin/python -m benchmarks.preprocess --keep work/bench/data-bin   # a data dir, once
    .venv/bin/python -m benchmarks.train --data work/bench/data-bin --threads 2

`--profile` then runs one more interval of each precision under torch's profiler and
prints its operators by self time and where the time went (common.time_breakdown: matrix
products, attention kernels, other operators, Python and dispatch), e.g. the recipe's
step (docs/results.md, "Training speed on CPUs and GPUs"):

    .venv/bin/python -m benchmarks.train --data work/multi30k/data-bin/en_de_both \
        --set model.embed_dim=192 --set model.ffn_dim=768 --set model.dropout=0.2 \
        --max-tokens 2048 --precisions bf16 --updates 60 --warmup 20 --profile

Model FLOPs are the usual estimate (issue 20): 6 x (encoder parameters x source tokens
+ (decoder parameters + output projection parameters) x target tokens), forward and
backward of every weight once per real (unpadded) token; the embeddings are lookups and
not counted, attention's own scores and values neither (about 1.26 GFLOP per target
token for transformer_big with a 32k joint vocabulary and sources as long as targets).
MFU (model FLOPs utilisation) is the model FLOP/s as a fraction of the device's dense
bf16 peak (DENSE_BF16_PEAK_TFLOPS by device name; `--peak-tflops` for another device,
or for the CPU, where MFU is n/a otherwise), for every precision alike. On CUDA each
clock is read after torch.cuda.synchronize, so the timings cover the queued GPU work.
"""

from __future__ import annotations

import argparse
import json
import statistics
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "train"
DTYPES = ("fp32", "bf16", "fp16")


def matmul_peak(dtype: Any, n: int = 2048, seconds: float = 1.0, device: str = "cpu") -> float:
    """Best-of FLOP/s of an n x n x n matmul in `dtype` (threads as currently set)."""
    import torch

    a = torch.randn(n, n, device=device).to(dtype)
    b = torch.randn(n, n, device=device).to(dtype)
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    for _ in range(3):  # warm-up: kernel selection, caches
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


@dataclass(frozen=True)
class ModelParams:
    """The parameters whose matmuls training runs per token, by where they act."""

    encoder: int  # the encoder's layers and LayerNorms: per source token
    decoder: int  # the decoder's layers and LayerNorms: per target token
    output: int  # the output projection [V,D] (tied or not): per target token

    def training_flops(self, src_tokens: float, tgt_tokens: float) -> float:
        """Forward + backward FLOPs (6 per parameter and token) of a batch of real tokens."""
        return 6.0 * (self.encoder * src_tokens + (self.decoder + self.output) * tgt_tokens)


def model_params(model_cfg: Any, src_vocab: int, tgt_vocab: int) -> ModelParams:
    """ModelParams of nmt's Transformer with `model_cfg`, counted on a model built on the
    meta device (no memory): token and position embeddings excluded (lookups)."""
    import torch

    from nmt.model.transformer import Transformer

    with torch.device("meta"):
        model = Transformer(model_cfg, src_vocab, tgt_vocab)

    def count(module: Any, skip: tuple[str, ...]) -> int:
        return sum(p.numel() for n, p in module.named_parameters() if not n.startswith(skip))

    lookups = ("embed_tokens.", "embed_positions.")
    return ModelParams(
        encoder=count(model.encoder, lookups),
        decoder=count(model.decoder, (*lookups, "output_projection.")),
        output=model.output_weight.numel(),
    )


# Dense (no sparsity) bf16 tensor-core peaks, TFLOP/s, by a part of torch's device name;
# the first match counts, None: not known (give --peak-tflops).
DENSE_BF16_PEAK_TFLOPS: tuple[tuple[str, float | None], ...] = (
    ("H100 PCIe", None),
    ("H100 NVL", None),
    ("H100", 989.0),  # SXM
    ("H200", 989.0),
    ("A100", 312.0),
)


def device_peak_tflops(device_name: str) -> float | None:
    """The dense bf16 peak of a GPU by its name (DENSE_BF16_PEAK_TFLOPS), None if unknown."""
    for part, peak in DENSE_BF16_PEAK_TFLOPS:
        if part.lower() in device_name.lower():
            return peak
    return None


def mfu_text(flop_s: float, peak_tflops: float | None) -> str:
    """'12.3%' of the peak, or 'n/a' without one."""
    return "n/a" if not peak_tflops else f"{100 * flop_s / (peak_tflops * 1e12):.1f}%"


def train_overrides(
    *,
    data: str | Path,
    save_dir: str | Path,
    precision: str,
    model: str = "transformer_small",
    threads: int = 2,
    max_tokens: int = 4096,
    device: str = "cpu",
    updates: int = 0,
    log_interval: int = 10,
    fairseq_shape: bool = True,
    extra: Sequence[str] = (),
) -> list[str]:
    """nmt-train overrides of the benchmark's run (`updates` 0: no limit), then `extra`
    (KEY=VALUE), in the working tree's key names (common.train_config renames them for
    revisions before TrainConfig's sections, back to f3ffaaf: benchmarks.train_paired)."""
    overrides = [
        f"data={data}",
        f"save_dir={save_dir}",
        f"model={model}",
        "optim=adam_inverse_sqrt",
        "optim.lr=1e-3",
        "optim.warmup_updates=1000",
        "optim.weight_decay=0.0001",
        "loss.label_smoothing=0.1",
        f"max_tokens={max_tokens}",
        f"precision={precision}",
        f"threads={threads}",
        f"device={device}",
        "seed=1",
        f"max_update={updates}",
        f"logging.interval={log_interval}",
        "validation.split=''",
        "checkpoint.no_save=true",
        "logging.tensorboard=false",
        "logging.progress_bar=false",
    ]
    if fairseq_shape:
        overrides += [
            "model.share_all_embeddings=true",
            "model.attention_dropout=0.0",
            "model.activation_dropout=0.0",
            "model.dropout=0.3",
        ]
    return overrides + list(extra)


def _overrides(args: argparse.Namespace, precision: str, save_dir: Path) -> list[str]:
    return train_overrides(
        data=args.data,
        save_dir=save_dir,
        precision=precision,
        model=args.model,
        threads=args.threads,
        max_tokens=args.max_tokens,
        device=args.device,
        updates=args.updates,
        log_interval=args.log_interval,
        fairseq_shape=args.fairseq_shape,
        extra=args.set,
    )


def _losses(save_dir: Path) -> list[tuple[int, float]]:
    """(update, loss) of every train line the run logged."""
    events = map(json.loads, (save_dir / "train.jsonl").read_text().splitlines())
    return [(e["update"], round(e["loss"], 4)) for e in events if e["type"] == "train"]


def _check_epoch(batches: list, updates: int) -> None:
    if len(batches) < updates:
        raise common.BenchError(
            f"--updates {updates}: the data dir's first epoch has only {len(batches)} batches"
        )


def run_sequential(args: argparse.Namespace, precision: str) -> dict[str, Any]:
    """One precision's whole training loop; tokens/s as the loop logs it (train.jsonl)."""
    from nmt.training import build_training, run

    with tempfile.TemporaryDirectory() as tmp:
        cfg = common.train_config("nmt", _overrides(args, precision, Path(tmp)))
        trainer = build_training(cfg)
        data = trainer.data.train
        batches = trainer.data.epoch_batches(1)
        _check_epoch(batches, args.updates)
        result = run(trainer)
        events = [json.loads(line) for line in (Path(tmp) / "train.jsonl").read_text().splitlines()]
        losses = _losses(Path(tmp))
    train = [e for e in events if e["type"] == "train"]
    measured = [e for e in train if e["update"] > args.warmup]
    seconds = sum(e["tokens"] / e["tok_s"] for e in measured)
    tokens = sum(e["tokens"] for e in measured)
    first = min(e["update"] for e in measured) - args.log_interval  # updates not measured
    meta = trainer.data.meta
    params = model_params(cfg.model, meta.src_vocab_size, meta.tgt_vocab_size)
    flops = sum(
        params.training_flops(float(data.src_sizes[b].sum()), float(data.tgt_sizes[b].sum()))
        for b in batches[first : result.num_updates]
    )
    return {
        "precision": precision,
        "tok_s": tokens / seconds,
        "tok_s_median": statistics.median(e["tok_s"] for e in measured),
        "flop_s": flops / seconds,
        "intervals": len(measured),
        "losses": losses,
    }


def device_sync(device: str) -> Callable[[], None] | None:
    """torch.cuda.synchronize on a CUDA device (read before each clock), else None."""
    import torch

    return torch.cuda.synchronize if torch.device(device).type == "cuda" else None


def run_interleaved(args: argparse.Namespace, precisions: list[str]) -> list[dict[str, Any]]:
    """`run_sequential`'s figures for the precisions trained in turns, one interval each.

    Each precision has its own Trainer and takes the same batches, in the order of the
    training loop's first epoch, with its own RNG stream (its dropout masks are those of
    a run alone, so its loss curve is too).
    """
    from nmt.training import build_training
    from nmt.training.checkpointing import rng_state, set_rng_state
    from nmt.training.loop import log_train
    from nmt.training.step import train_step

    with tempfile.TemporaryDirectory() as tmp:
        trainers, rngs = [], []
        for p in precisions:
            cfg = common.train_config("nmt", _overrides(args, p, Path(tmp) / p))
            trainers.append(build_training(cfg))  # seeds the RNGs
            rngs.append(rng_state())
            trainers[-1].meter.start_run()
        first = trainers[0]
        data, meta = first.data.train, first.data.meta
        params = model_params(first.cfg.model, meta.src_vocab_size, meta.tgt_vocab_size)
        batches = first.data.epoch_batches(1)
        profiled = args.log_interval if args.profile else 0  # one more interval, profiled
        _check_epoch(batches, args.updates + profiled)
        chunks = [
            batches[start : start + args.log_interval]
            for start in range(0, args.updates + profiled, args.log_interval)
        ]
        timed_chunks = len(chunks) - (1 if profiled else 0)
        tokens = [
            int(sum(data.tgt_sizes[b].sum() for b in chunk)) for chunk in chunks[:timed_chunks]
        ]
        flops = [
            params.training_flops(
                float(sum(data.src_sizes[b].sum() for b in c)),
                float(sum(data.tgt_sizes[b].sum() for b in c)),
            )
            for c in chunks[:timed_chunks]
        ]

        def contestant(i: int):
            def interval(turn: int) -> None:
                set_rng_state(rngs[i])
                for batch in chunks[turn]:
                    train_step(trainers[i], [batch])
                rngs[i] = rng_state()
                log_train(trainers[i], epoch=1)  # the interval's loss to train.jsonl

            return interval

        def progress(turn: int, timings: list[common.Timing]) -> None:
            rates = ", ".join(
                f"{p} {tokens[turn] / t.wall:,.0f}" for p, t in zip(precisions, timings)
            )
            print(f"  interval {turn + 1}/{timed_chunks}: target tok/s {rates}", flush=True)

        timings = common.interleave(
            [contestant(i) for i in range(len(precisions))],
            timed_chunks,
            on_turn=progress,
            sync=device_sync(args.device),
        )
        profiles = [
            common.print_profile(
                f"where a {p} training step's time goes ({args.log_interval} updates, "
                f"{args.threads} threads)",
                f"{p}, {args.log_interval} updates",
                lambda i=i: contestant(i)(timed_chunks),
            )
            for i, p in enumerate(precisions)
            if profiled
        ]
        losses = [_losses(Path(tmp) / p) for p in precisions]
    skip = args.warmup // args.log_interval
    results: list[dict[str, Any]] = []
    for i, p in enumerate(precisions):
        secs = [t.wall for t in timings[i][skip:]]
        results.append(
            {
                "precision": p,
                "tok_s": sum(tokens[skip:]) / sum(secs),
                "tok_s_median": statistics.median(n / s for n, s in zip(tokens[skip:], secs)),
                "flop_s": sum(flops[skip:]) / sum(secs),
                "intervals": len(secs),
                "cpu_s": sum(t.cpu for t in timings[i][skip:]),
                "wall_s": sum(secs),
                "wall_per_interval": secs,
                "losses": losses[i],
                **({"profile": profiles[i]} if profiles else {}),
            }
        )
    if len(precisions) > 1:
        for r in results[1:]:
            r["ratio_to_first"] = common.paired_ratio(
                results[0]["wall_per_interval"], r["wall_per_interval"]
            )
    return results


def positive_float(value: str) -> float:
    try:
        number = float(value)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{value!r} is not a number") from None
    if not number > 0:
        raise argparse.ArgumentTypeError(f"{value} must be above 0")
    return number


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument(
        "--data",
        type=common.data_dir,
        required=True,
        help="data dir from nmt-preprocess (Multi30k en-de, 8k joint vocab)",
    )
    p.add_argument("--model", default="transformer_small", help="configs/model preset")
    p.add_argument("--threads", type=common.positive_int, default=2, help="torch threads")
    p.add_argument("--updates", type=common.positive_int, default=80, help="per precision")
    p.add_argument("--warmup", type=common.nonnegative_int, default=20, help="updates not measured")
    p.add_argument(
        "--log-interval", type=common.positive_int, default=10, help="updates per interval"
    )
    p.add_argument("--max-tokens", type=common.positive_int, default=4096)
    p.add_argument(
        "--precisions",
        nargs="+",
        choices=DTYPES,
        default=["fp32", "bf16"],
        help="fp16 needs CUDA",
    )
    p.add_argument("--device", default="cpu", help="cpu, or cuda for a GPU run")
    p.add_argument(
        "--peak-seconds",
        type=float,
        default=1.0,
        help="time the matmul peak of each precision this long (0: skip it)",
    )
    p.add_argument(
        "--peak-tflops",
        type=positive_float,
        default=None,
        help="the device's dense bf16 peak in TFLOP/s, for MFU (default: by GPU name, "
        "H100 SXM/H200 989, A100 312; none on a CPU: MFU n/a)",
    )
    p.add_argument(
        "--no-fairseq-shape",
        dest="fairseq_shape",
        action="store_false",
        help="use the preset as is (default: the fairseq peer script's settings)",
    )
    p.add_argument(
        "--set",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="an nmt-train override on top of the benchmark's (repeatable)",
    )
    p.add_argument(
        "--sequential",
        dest="interleave",
        action="store_false",
        help="run the precisions one after the other through nmt.training.run (default: in "
        "turns, one interval each, so that the machine's drift cannot skew their ratio)",
    )
    p.add_argument(
        "--profile",
        action="store_true",
        help="then run one more interval of each precision under torch's profiler and print "
        "where its time goes (CPU, interleaved mode)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    if args.warmup % args.log_interval or args.warmup >= args.updates:
        raise common.BenchError(
            f"--warmup {args.warmup}: must be a multiple of --log-interval "
            f"({args.log_interval}) and below --updates ({args.updates})"
        )
    if len(set(args.precisions)) != len(args.precisions):
        raise common.BenchError(f"--precisions {' '.join(args.precisions)}: each at most once")
    cuda = args.device.startswith("cuda")
    if args.profile and (cuda or not args.interleave):
        raise common.BenchError(
            "--profile: profiles the CPU's operators in the interleaved mode; "
            + ("drop --sequential" if not args.interleave else "use --device cpu")
            + " (or drop --profile)"
        )
    if cuda and not torch.cuda.is_available():
        raise common.BenchError(f"--device {args.device}: CUDA is not available; use cpu")
    if cuda and not args.interleave:
        raise common.BenchError(
            "--sequential: reads the training loop's own clock, which does not wait for "
            "the GPU; on CUDA use the default (interleaved) mode"
        )
    torch.set_num_threads(args.threads)
    device_name = torch.cuda.get_device_name(args.device) if cuda else common.cpu_model()
    peak_tflops = args.peak_tflops or (device_peak_tflops(device_name) if cuda else None)
    where = device_name if cuda else f"{args.threads} threads"
    print(f"# torch {torch.__version__}, {where}, load average {common.load_average():.2f}")
    print(
        "# MFU against a dense bf16 peak of "
        + (
            f"{peak_tflops:g} TFLOP/s"
            if peak_tflops
            else f"n/a ({device_name}: not known; give --peak-tflops)"
        )
    )
    dtypes = {"fp32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}
    peaks: dict[str, float | None] = dict.fromkeys(["fp32", *args.precisions])
    if args.peak_seconds > 0:
        # A GPU needs big products to reach its peak (2048^3 is ~20 us on an H100), and
        # training's fp32 runs on TF32 there (nmt.runtime): so is the fp32 peak measured.
        size = 8192 if cuda else 2048
        if cuda:
            from nmt.runtime import enable_tf32

            enable_tf32(torch.device(args.device))
        for name in peaks:
            peaks[name] = best = matmul_peak(
                dtypes[name], n=size, seconds=args.peak_seconds, device=args.device
            )
            print(
                f"matmul peak {name}{' (TF32)' if cuda and name == 'fp32' else ''}: "
                f"{best / 1e9:8.1f} GFLOP/s ({size}^3, best of {args.peak_seconds:g} s)"
            )
    results = (
        run_interleaved(args, args.precisions)
        if args.interleave
        else [run_sequential(args, p) for p in args.precisions]
    )
    base = results[0]
    for r in results:
        peak = peaks[r["precision"]]
        share = (
            f" ({100 * r['flop_s'] / peak:.1f}% of the {r['precision']} matmul peak measured here)"
            if peak
            else ""
        )
        print(
            f"{args.model} {r['precision']}: {r['tok_s']:7.0f} target tok/s (median of "
            f"{r['intervals']} intervals {r['tok_s_median']:.0f}), {r['flop_s'] / 1e9:6.1f} "
            f"model GFLOP/s, MFU {mfu_text(r['flop_s'], peak_tflops)}{share}, "
            f"{r['tok_s'] / base['tok_s']:.2f}x {base['precision']}"
        )
        r["matmul_peak_flop_s"] = peak
        r["mfu"] = r["flop_s"] / (peak_tflops * 1e12) if peak_tflops else None
    for r in results[1:]:
        if "ratio_to_first" in r:
            print(f"{r['precision']}/{base['precision']} (interleaved): {r['ratio_to_first']}")
    for r in results:
        print(f"loss curve {r['precision']}: " + " ".join(f"{u}:{v}" for u, v in r["losses"]))
    print(f"# load average at the end {common.load_average():.2f}")
    return {
        "model": args.model,
        "updates": args.updates,
        "warmup": args.warmup,
        "log_interval": args.log_interval,
        "max_tokens": args.max_tokens,
        "interleaved": args.interleave,
        "device": device_name,
        "peak_tflops": peak_tflops,
        "flops_per_target_token": base["flop_s"] / base["tok_s"],  # the batches' mix
        "results": results,
    }


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
