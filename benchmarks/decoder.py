"""The incremental decoder, the hot path of beam search.

Times one beam-search-shaped decoder step (batch x beam rows, one new token, a beam
reorder of the cache) with the KV cache, against re-running the whole prefix without
one, and reports where the cached step's time goes. `--cache grouped` (the default) is
the generator's cache: the beams of a sentence form a group whose keys/values stay in
place at a reorder, the encoder keys/values are kept once per sentence, and the buffers
are reserved up front and reused from batch to batch; `--cache rows` is the plain cache
(one row per beam, moved at every reorder).

    .venv/bin/python -m benchmarks.decoder                      # transformer_small, CPU
    .venv/bin/python -m benchmarks.decoder --preset base --device cuda --steps 60
    .venv/bin/python -m benchmarks.decoder --kernels plain     # the textbook layers
"""

from __future__ import annotations

import argparse
import time
from typing import Any, cast

import torch

from benchmarks import common
from nmt.model.cache import CacheMemory
from nmt.model.config import ModelConfig
from nmt.model.kernels import FastKernels
from nmt.model.layers import Kernels
from nmt.model.transformer import Transformer
from nmt.vocab import EOS, PAD

NAME = "decoder"
KERNELS = {"fast": FastKernels, "plain": Kernels}


def load_preset(name: str) -> ModelConfig:
    """configs/model/transformer_<name>.yaml as a ModelConfig."""
    from omegaconf import OmegaConf

    path = common.REPO / "configs" / "model" / f"transformer_{name}.yaml"
    if not path.is_file():
        presets = sorted(p.stem.removeprefix("transformer_") for p in path.parent.glob("*.yaml"))
        raise common.BenchError(f"--preset {name}: no {path.name}; one of {', '.join(presets)}")
    merged = OmegaConf.merge(OmegaConf.structured(ModelConfig), OmegaConf.load(path))
    return cast(ModelConfig, OmegaConf.to_object(merged))


def sync(device: str) -> None:
    if device.startswith("cuda"):
        torch.cuda.synchronize()


def build_parser() -> argparse.ArgumentParser:
    ap = common.parser(NAME, __doc__)
    ap.add_argument("--preset", default="small")
    ap.add_argument("--vocab", type=common.positive_int, default=8000)
    ap.add_argument("--batch", type=common.positive_int, default=64, help="sentences")
    ap.add_argument("--beam", type=common.positive_int, default=5)
    ap.add_argument("--src-len", type=common.positive_int, default=25)
    ap.add_argument(
        "--steps", type=common.positive_int, default=30, help="decoder steps (target length)"
    )
    ap.add_argument("--device", default="cpu")
    ap.add_argument(
        "--threads", type=common.nonnegative_int, default=0, help="torch threads (0: default)"
    )
    ap.add_argument(
        "--cache",
        choices=["grouped", "rows"],
        default="grouped",
        help="grouped: the generator's cache (DecoderCache groups); rows: one row per beam",
    )
    ap.add_argument(
        "--kernels",
        choices=KERNELS,
        default="fast",
        help="the model's kernels: fast (nmt's default) or plain (layers.Kernels)",
    )
    return ap


def run(args: argparse.Namespace) -> dict[str, Any]:
    if args.src_len < 2:
        raise common.BenchError(f"--src-len {args.src_len}: must be 2 or more")
    if args.device.startswith("cuda") and not torch.cuda.is_available():
        raise common.BenchError(f"--device {args.device}: CUDA is not available; use cpu")
    if args.threads:
        torch.set_num_threads(args.threads)
    dev = args.device

    torch.manual_seed(0)
    cfg = load_preset(args.preset)
    model = Transformer(cfg, args.vocab, args.vocab, kernels=KERNELS[args.kernels]())
    model = model.to(dev).eval()
    rows = args.batch * args.beam
    lengths = torch.randint(args.src_len // 2, args.src_len + 1, (args.batch,))
    src = torch.full((args.batch, args.src_len), PAD)
    for i, n in enumerate(lengths.tolist()):
        src[i, :n] = torch.randint(4, args.vocab, (n,))
    src = src.to(dev)
    expand = torch.arange(args.batch, device=dev).repeat_interleave(args.beam)
    tokens = torch.randint(4, args.vocab, (rows, args.steps), device=dev)
    tokens[:, 0] = EOS
    # A beam reorder per step: each row takes a random beam of its own sentence.
    base = expand * args.beam
    orders = [base + torch.randint(0, args.beam, (rows,), device=dev) for _ in range(args.steps)]

    grouped = args.cache == "grouped"
    memory = CacheMemory()  # reused by every run, as the generator reuses it per batch

    def cached_run(profile: dict | None = None) -> None:
        enc = model.encode(src)  # [B,S,D]: one row per sentence, shared by its beams
        if grouped:
            cache = model.new_cache(group=args.beam, capacity=args.steps, memory=memory)
        else:
            enc = enc.reorder(expand)  # one row per beam
            cache = model.new_cache()
        for t in range(args.steps):
            model.decode(tokens[:, t : t + 1], enc, cache)
            if profile is not None:
                sync(dev)
                t0 = time.perf_counter()
            cache.reorder(orders[t])
            if profile is not None:
                sync(dev)
                profile["reorder"] += time.perf_counter() - t0

    def uncached_run() -> None:
        enc = model.encode(src).reorder(expand)
        for t in range(args.steps):
            model.decode(tokens[:, : t + 1], enc)

    with torch.inference_mode():
        cached_run()  # warm-up (allocator, kernel selection)
        sync(dev)
        t0 = time.perf_counter()
        cached_run()
        sync(dev)
        cached = time.perf_counter() - t0
        profile = {"reorder": 0.0}
        cached_run(profile)
        t0 = time.perf_counter()
        uncached_run()
        sync(dev)
        uncached = time.perf_counter() - t0

        # The output projection alone, for the same number of rows and steps.
        hidden = torch.randn(rows, 1, cfg.embed_dim, device=dev)
        sync(dev)
        t0 = time.perf_counter()
        for _ in range(args.steps):
            model.decoder.output_projection(hidden)
        sync(dev)
        projection = time.perf_counter() - t0

    steps = args.steps
    print(
        f"device={dev} threads={torch.get_num_threads()} kernels={args.kernels} cache={args.cache} "
        f"preset={args.preset} vocab={args.vocab} "
        f"rows={args.batch}x{args.beam}={rows} src_len<={args.src_len} steps={steps}"
    )
    print(
        f"cached decoder:   {cached / steps * 1e3:8.2f} ms/step  "
        f"{rows * steps / cached:10.0f} rows*tokens/s (incl. encoder and reorder)"
    )
    print(
        f"uncached decoder: {uncached / steps * 1e3:8.2f} ms/step  "
        f"{rows * steps / uncached:10.0f} rows*tokens/s  (cached is {uncached / cached:.1f}x faster)"
    )
    print(
        f"  of a cached step: output projection {projection / steps * 1e3:.2f} ms, "
        f"cache reorder {profile['reorder'] / steps * 1e3:.2f} ms"
    )
    return {
        "device": dev,
        "kernels": args.kernels,
        "cache": args.cache,
        "preset": args.preset,
        "vocab": args.vocab,
        "rows": rows,
        "src_len": args.src_len,
        "steps": steps,
        "cached_ms_per_step": cached / steps * 1e3,
        "uncached_ms_per_step": uncached / steps * 1e3,
        "cache_speedup": uncached / cached,
        "output_projection_ms_per_step": projection / steps * 1e3,
        "cache_reorder_ms_per_step": profile["reorder"] / steps * 1e3,
    }


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
