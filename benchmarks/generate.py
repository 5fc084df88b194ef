"""Beam-search speed: sentences/s and target tokens/s of nmt.Translator (what nmt-generate
runs), with and without the KV cache, in the same run, start-up excluded (model loading,
tokenizer training).

    .venv/bin/python -m benchmarks.generate --checkpoint runs/m30k/checkpoint_best.pt
    .venv/bin/python -m benchmarks.generate          # random transformer_small, capped lengths

Defaults follow the issue's benchmark: Multi30k test_2016_flickr.en (1,000 sentences),
beam 5, batches of 64 sentences, 2 threads, fp32, on the CPU (`--device cuda` for a GPU,
set up as nmt-generate sets it up: runtime.setup). Without --checkpoint a randomly
initialised transformer_small (configs/model/transformer_small.yaml) with a joint 8k
SentencePiece model trained on Multi30k train is used. Such a model almost never emits
EOS, so every sentence decodes to its length cap: --max-len-a/--max-len-b (default
1.0 x source + 2) make the cap about a real translation's length, and the lengths it
produced are printed next to the references' so the comparison can be judged.
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "generate"


def random_small(spm_cache: Path, seed: int = 1) -> Any:
    """An InferenceBundle: transformer_small with random weights and a joint 8k
    SentencePiece model trained on Multi30k train (cached in `spm_cache`)."""
    import torch

    from benchmarks.decoder import load_preset
    from nmt.data.tokenizer import Tokenizer, train_tokenizer
    from nmt.generation.loading import InferenceBundle
    from nmt.model.transformer import Transformer

    if spm_cache.is_file():
        tok = Tokenizer.from_file(spm_cache)
    else:
        lines: list[str] = []
        for lang in ("en", "de"):
            train = common.MULTI30K / f"train.{lang}"
            if not train.is_file():
                raise common.BenchError(
                    f"{train}: no such file; the random model's vocabulary is trained on "
                    "Multi30k (or give --checkpoint)"
                )
            lines += train.read_text(encoding="utf-8").splitlines()
        tok = train_tokenizer(
            lines,
            vocab_size=8000,
            model_type="unigram",
            character_coverage=1.0,
            byte_fallback=False,
            input_sentence_size=0,
            user_defined_symbols=[],
            num_threads=2,
            seed=1,
            what="Multi30k train",
        )
        from nmt.fsutil import atomic_write_bytes

        spm_cache.parent.mkdir(parents=True, exist_ok=True)
        atomic_write_bytes(spm_cache, tok.model_bytes)
    cfg = load_preset("small")
    torch.manual_seed(seed)
    model = Transformer(cfg, tok.vocab_size, tok.vocab_size).eval()
    return InferenceBundle(
        model=model, src_tokenizer=tok, tgt_tokenizer=tok, data={}, model_config=cfg
    )


def bench_translator(
    bundle: Any, search: Any, batch: int, precision: str = "fp32", runtime: Any = None
) -> Any:
    """A Translator of the bundle's model, as nmt-generate builds one: on `runtime`'s
    device (a runtime.Runtime; default the CPU)."""
    import torch

    from nmt.generation.translator import Translator
    from nmt.runtime import Runtime

    nfkc = bool(bundle.data.get("normalization", {}).get("nfkc", False))
    return Translator(
        [bundle.model],
        bundle.src_tokenizer,
        bundle.tgt_tokenizer,
        search=search,
        runtime=runtime or Runtime(torch.device("cpu"), precision),
        nfkc=nfkc,
        max_sentences=batch,
    )


def load_bundle(checkpoint: str | None, spm_cache: Path, device: Any = None) -> Any:
    """The checkpoint's InferenceBundle (or random_small's) on `device` (default: cpu)."""
    import torch

    from nmt.generation.loading import load_for_inference

    device = device or torch.device("cpu")
    if checkpoint:
        return load_for_inference(checkpoint, device)
    bundle = random_small(spm_cache)
    bundle.model.to(device)
    return bundle


def source_ids(translator: Any, path: str | Path, limit: int = 0) -> list[Any]:
    """The input file's sentences as the translator's source ids (EOS included)."""
    from nmt.generation.io import read_text_lines

    lines = list(read_text_lines(str(path)))
    lines = lines[:limit] if limit else lines
    encoder = translator.source_encoder(str(path))
    texts = encoder.normalize(lines)
    return [encoder.fit(ids, i) for i, ids in enumerate(encoder.to_ids(texts))]


def timed_passes(translator: Any, sources: list[Any], repeat: int) -> dict[str, float]:
    """Best wall time of `repeat` passes over all sources, that pass's CPU time (all
    threads of this process: on a busy machine the work's own cost), and the target
    tokens produced (EOS included, as fairseq counts)."""
    best: common.Timing | None = None
    tokens = 0
    for _ in range(repeat):
        with common.timed() as t:
            results = translator.translate_ids(sources)
        if best is None or t.wall < best.wall:
            best = t
        tokens = sum(len(h[0].tokens) for h in results if h)
    assert best is not None
    return {
        "sentences": len(sources),
        "seconds": best.wall,
        "cpu_seconds": best.cpu,
        "tokens": tokens,
        "sent_s": len(sources) / best.wall,
        "tok_s": tokens / best.wall,
        "tokens_per_sentence": tokens / max(len(sources), 1),
    }


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument("--checkpoint", help="an nmt checkpoint (default: random transformer_small)")
    p.add_argument(
        "--input", type=common.existing_file, default=common.MULTI30K / "test_2016_flickr.en"
    )
    p.add_argument("--lines", type=common.nonnegative_int, default=0, help="first N (0: all)")
    p.add_argument(
        "--ref",
        type=common.existing_file,
        default=None,
        help="references, only to print their average length in tokens "
        "(default: the input's .de beside it, when there is one)",
    )
    p.add_argument("--beam", type=common.positive_int, default=5)
    p.add_argument("--batch", type=common.positive_int, default=64, help="sentences per batch")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16", "fp16"], help="fp16: CUDA")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N")
    p.add_argument(
        "--max-len-a",
        type=float,
        default=None,
        help="default: 1.0 for the random model, fairseq's 0 for a checkpoint",
    )
    p.add_argument(
        "--max-len-b",
        type=int,
        default=None,
        help="default: 2 for the random model, fairseq's 200 for a checkpoint",
    )
    p.add_argument(
        "--uncached-sentences",
        type=common.nonnegative_int,
        default=0,
        help="time the uncached search on only the first N sentences (0 = all); "
        "the cached search is timed on the same N for the ratio",
    )
    p.add_argument(
        "--repeat", type=common.positive_int, default=1, help="passes per measurement; best counts"
    )
    p.add_argument(
        "--spm-cache",
        type=Path,
        default=common.WORK / "multi30k-spm.model",
        help="the random model's SentencePiece model (trained once, then reused)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch

    from nmt.errors import NmtError
    from nmt.generation.config import SearchConfig
    from nmt.generation.io import read_text_lines
    from nmt.runtime import setup

    if args.checkpoint and not Path(args.checkpoint).is_file():
        raise common.BenchError(f"--checkpoint {args.checkpoint}: no such file")
    try:  # as nmt-generate: exact fp32 (no TF32), cuDNN attention off on a GPU
        runtime = setup(
            args.device,
            args.dtype,
            threads=args.threads,
            tf32=False,
            inference=True,
            device_key="--device",
        )
    except NmtError as exc:
        raise common.BenchError(str(exc)) from None
    torch.set_num_threads(args.threads)
    bundle = load_bundle(args.checkpoint, args.spm_cache, runtime.device)
    random_model = not args.checkpoint
    max_len_a = args.max_len_a if args.max_len_a is not None else (1.0 if random_model else 0.0)
    max_len_b = args.max_len_b if args.max_len_b is not None else (2 if random_model else 200)

    def translator(use_cache: bool) -> Any:
        search = SearchConfig(
            beam=args.beam, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache
        )
        return bench_translator(bundle, search, args.batch, runtime=runtime)

    cached = translator(True)
    sources = source_ids(cached, args.input, args.lines)
    ref = args.ref or Path(args.input).with_suffix(".de")
    ref_lines = list(read_text_lines(str(ref))) if Path(ref).is_file() else []
    ref_lines = ref_lines[: args.lines] if args.lines else ref_lines
    ref_tokens = [len(bundle.tgt_tokenizer.encode(r.strip())) + 1 for r in ref_lines]
    params = sum(p.numel() for p in bundle.model.parameters())
    print(
        f"model: {'random transformer_small' if random_model else args.checkpoint} "
        f"({params / 1e6:.1f}M parameters), {args.input} ({len(sources)} sentences), beam "
        f"{args.beam}, batches of {args.batch}, {args.threads} threads, {args.dtype} on "
        f"{runtime.device}, "
        f"max_len = {max_len_a} * src + {max_len_b}"
    )
    start = time.perf_counter()
    cached.translate_ids(sources[: args.batch])  # warm-up: first-call allocations
    warmup_s = time.perf_counter() - start
    full = timed_passes(cached, sources, args.repeat)
    refs = f", references {sum(ref_tokens) / len(ref_tokens):.1f}" if ref_tokens else ""
    print(
        f"cached:   {full['sent_s']:7.1f} sentences/s  {full['tok_s']:8.0f} target tokens/s  "
        f"({full['seconds']:.2f} s wall, {full['cpu_seconds']:.2f} s CPU; "
        f"{full['tokens_per_sentence']:.1f} tokens/sentence{refs})"
    )
    subset = sources[: args.uncached_sentences] if args.uncached_sentences else sources
    sub = full
    if len(subset) != len(sources):
        sub = timed_passes(cached, subset, args.repeat)
        print(
            f"cached on the first {len(subset)}: {sub['sent_s']:7.1f} sentences/s "
            f"({sub['seconds']:.2f} s wall, {sub['cpu_seconds']:.2f} s CPU)"
        )
    uncached = timed_passes(translator(False), subset, args.repeat)
    print(
        f"uncached: {uncached['sent_s']:7.1f} sentences/s  {uncached['tok_s']:8.0f} target "
        f"tokens/s  ({uncached['seconds']:.2f} s wall, {uncached['cpu_seconds']:.2f} s CPU on "
        f"{len(subset)} sentences)"
    )
    speedup_wall = uncached["seconds"] / sub["seconds"]
    speedup_cpu = uncached["cpu_seconds"] / sub["cpu_seconds"]
    print(f"KV cache speed-up: {speedup_wall:.2f}x wall, {speedup_cpu:.2f}x CPU time")
    return {
        "model": args.checkpoint or "random transformer_small",
        "input": str(args.input),
        "beam": args.beam,
        "batch": args.batch,
        "dtype": args.dtype,
        "device": str(runtime.device),
        "max_len": [max_len_a, max_len_b],
        "warmup_seconds": warmup_s,
        "cached": full,
        "cached_subset": sub,
        "uncached": uncached,
        "kv_cache_speedup_wall": speedup_wall,
        "kv_cache_speedup_cpu": speedup_cpu,
        "reference_tokens_per_sentence": sum(ref_tokens) / len(ref_tokens) if ref_tokens else None,
    }


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
