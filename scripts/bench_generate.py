#!/usr/bin/env python
"""Beam-search speed of nmt-generate: sentences/s and target tokens/s, with and without the
KV cache, in the same run, excluding start-up (model loading, tokenizer training).

    .venv/bin/python scripts/bench_generate.py --checkpoint runs/m30k/checkpoint_best.pt
    .venv/bin/python scripts/bench_generate.py          # random transformer_small, capped lengths

Defaults follow the issue's benchmark: Multi30k test_2016_flickr.en (1,000 sentences),
beam 5, batches of 64 sentences, 2 threads, fp32. Without --checkpoint a randomly
initialised transformer_small (configs/model/transformer_small.yaml) with a joint 8k
SentencePiece model trained on Multi30k train is used. Such a model almost never emits
EOS, so every sentence decodes to its length cap: --max-len-a/--max-len-b (default
1.0 x source + 2) make the cap about a real translation's length, and the lengths it
produced are printed next to the references' so the comparison can be judged.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import torch
import yaml

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from nmt.checkpoint import InferenceBundle, load_for_inference  # noqa: E402
from nmt.data.tokenizer import Tokenizer, train_tokenizer  # noqa: E402
from nmt.generation.config import SearchConfig  # noqa: E402
from nmt.generation.io import SourceEncoder, read_text_lines  # noqa: E402
from nmt.generation.translator import Translator  # noqa: E402
from nmt.model.config import ModelConfig  # noqa: E402
from nmt.model.transformer import Transformer  # noqa: E402
from nmt.runtime import Runtime  # noqa: E402

MULTI30K = REPO.parent / "shared" / "data" / "multi30k"


def random_small(spm_cache: Path) -> InferenceBundle:
    """transformer_small with random weights and a joint 8k SentencePiece model."""
    if spm_cache.is_file():
        tok = Tokenizer.from_file(spm_cache)
    else:
        lines = []
        for lang in ("en", "de"):
            lines += (MULTI30K / f"train.{lang}").read_text(encoding="utf-8").splitlines()
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
        spm_cache.write_bytes(tok.model_bytes)
    preset = yaml.safe_load((REPO / "configs/model/transformer_small.yaml").read_text())
    cfg = ModelConfig(**preset)
    torch.manual_seed(1)
    model = Transformer(cfg, tok.vocab_size, tok.vocab_size).eval()
    return InferenceBundle(
        model=model, src_tokenizer=tok, tgt_tokenizer=tok, data={}, model_config=cfg
    )


def bench_translator(
    bundle: InferenceBundle, search: SearchConfig, batch: int, precision: str = "fp32"
) -> Translator:
    """A Translator of the bundle's model on the CPU, as nmt-generate builds one."""
    return Translator(
        [bundle.model],
        bundle.src_tokenizer,
        bundle.tgt_tokenizer,
        search=search,
        runtime=Runtime(torch.device("cpu"), precision),
        max_sentences=batch,
    )


def run(translator: Translator, sources: list, repeat: int) -> tuple[float, float, int]:
    """Best wall time of `repeat` passes over all sources, that pass's CPU time (all
    threads of this process: on a busy machine the work's own cost), and the target
    tokens produced (EOS included, as fairseq counts)."""
    best, cpu, tokens = float("inf"), 0.0, 0
    ids = [s.ids for s in sources]
    for _ in range(repeat):
        start, start_cpu = time.perf_counter(), time.process_time()
        results = translator.translate_ids(ids)
        wall = time.perf_counter() - start
        if wall < best:
            best, cpu = wall, time.process_time() - start_cpu
        tokens = sum(len(h[0].tokens) for h in results if h)
    return best, cpu, tokens


def main() -> None:
    p = argparse.ArgumentParser(
        description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument("--checkpoint", help="an nmt checkpoint (default: random transformer_small)")
    p.add_argument("--input", default=str(MULTI30K / "test_2016_flickr.en"))
    p.add_argument(
        "--ref",
        default=str(MULTI30K / "test_2016_flickr.de"),
        help="references, only to print their average length in tokens",
    )
    p.add_argument("--beam", type=int, default=5)
    p.add_argument("--batch", type=int, default=64, help="sentences per batch")
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
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
        type=int,
        default=0,
        help="time the uncached search on only the first N sentences (0 = all); "
        "the cached search is timed on the same N for the ratio",
    )
    p.add_argument("--repeat", type=int, default=1, help="passes per measurement; the best counts")
    p.add_argument("--spm-cache", default="/tmp/nmt-bench-multi30k-spm.model")
    args = p.parse_args()

    torch.set_num_threads(args.threads)
    bundle = (
        load_for_inference(args.checkpoint)
        if args.checkpoint
        else random_small(Path(args.spm_cache))
    )
    random_model = args.checkpoint is None
    max_len_a = args.max_len_a if args.max_len_a is not None else (1.0 if random_model else 0.0)
    max_len_b = args.max_len_b if args.max_len_b is not None else (2 if random_model else 200)
    model = bundle.model
    nfkc = bool(bundle.data.get("normalization", {}).get("nfkc", False))
    encoder = SourceEncoder(
        bundle.src_tokenizer, nfkc, model.cfg.max_source_positions, "truncate", args.input
    )
    lines = list(read_text_lines(args.input))
    sources = encoder.encode(lines, 0)
    ref_tokens = [
        len(bundle.tgt_tokenizer.encode(r.strip())) + 1 for r in read_text_lines(args.ref)
    ]

    def translator(use_cache: bool) -> Translator:
        search = SearchConfig(
            beam=args.beam, max_len_a=max_len_a, max_len_b=max_len_b, use_cache=use_cache
        )
        return bench_translator(bundle, search, args.batch, args.dtype)

    print(
        f"model: {'random ' if random_model else ''}{args.checkpoint or 'transformer_small'} "
        f"({sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters), "
        f"{args.input} ({len(sources)} sentences), beam {args.beam}, batches of {args.batch}, "
        f"{args.threads} threads, {args.dtype}, max_len = {max_len_a} * src + {max_len_b}"
    )
    cached = translator(True)
    cached.translate_ids(
        [s.ids for s in sources[: args.batch]]
    )  # warm-up: first-call allocations and kernel selection
    seconds, cpu, tokens = run(cached, sources, args.repeat)
    print(
        f"cached:   {len(sources) / seconds:7.1f} sentences/s  {tokens / seconds:8.0f} target tokens/s"
        f"  ({seconds:.2f} s wall, {cpu:.2f} s CPU; {tokens / len(sources):.1f} tokens/sentence, "
        f"references {sum(ref_tokens) / len(ref_tokens):.1f})"
    )
    subset = sources[: args.uncached_sentences] if args.uncached_sentences else sources
    if len(subset) != len(sources):
        sub_seconds, sub_cpu, _ = run(cached, subset, args.repeat)
        print(
            f"cached on the first {len(subset)}: {len(subset) / sub_seconds:7.1f} sentences/s "
            f"({sub_seconds:.2f} s wall, {sub_cpu:.2f} s CPU)"
        )
    else:
        sub_seconds, sub_cpu = seconds, cpu
    un_seconds, un_cpu, un_tokens = run(translator(False), subset, args.repeat)
    print(
        f"uncached: {len(subset) / un_seconds:7.1f} sentences/s  {un_tokens / un_seconds:8.0f} target "
        f"tokens/s  ({un_seconds:.2f} s wall, {un_cpu:.2f} s CPU on {len(subset)} sentences)"
    )
    print(
        f"KV cache speed-up: {un_seconds / sub_seconds:.2f}x wall, {un_cpu / sub_cpu:.2f}x CPU time"
    )


if __name__ == "__main__":
    main()
