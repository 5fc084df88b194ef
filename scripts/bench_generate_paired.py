#!/usr/bin/env python
"""Paired beam-search speed of two code versions, interleaved in one process.

Separate runs on a shared machine cannot tell a 5% gain from drift (paired_revision.py).
This script imports a second copy of nmt from a git revision (as the package
`nmt_before`), loads the same checkpoint with each version, and lets the two translate
the input's length-sorted batches in turns (who goes first alternates), so that drift
hits both alike. It also checks that both versions produce the same translations.

    python scripts/bench_generate_paired.py --checkpoint work/bench/fairseq_generate/nmt_1.pt \
        --before HEAD~1

Defaults are the issue's benchmark shape: Multi30k test_2016_flickr.en, beam 5, batches
of 64 sentences, 2 threads, fp32, with bench_fairseq_generate.py's length limit (1.0 x
source + 2), which an untrained model always reaches.
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import sys
import time
from pathlib import Path

import torch
from paired_revision import REPO, import_both


def translator(package: str, args: argparse.Namespace):
    """(translate, sources, batches) of one code version; translate(batch of Sources)
    -> {source index: hypotheses}."""
    checkpoint = importlib.import_module(f"{package}.checkpoint")
    config = importlib.import_module(f"{package}.generation.config")
    io = importlib.import_module(f"{package}.generation.io")
    bundle = checkpoint.load_for_inference(args.checkpoint)
    model = bundle.model
    encoder = io.SourceEncoder(
        bundle.src_tokenizer, False, model.cfg.max_source_positions, "truncate", args.input
    )
    sources = encoder.encode(list(io.read_text_lines(args.input)), 0)
    batches = io.make_batches(sources, 0, args.batch)
    search = dict(beam=args.beam, max_len_a=args.max_len_a, max_len_b=args.max_len_b)
    if importlib.util.find_spec(f"{package}.generation.translator") is None:
        # Revisions before the Translator library: nmt.commands.generate.Translator.
        generate = importlib.import_module(f"{package}.commands.generate")
        generator = importlib.import_module(f"{package}.generation.generator")
        cfg = config.GenerateConfig(**search, max_sentences=args.batch, dtype=args.dtype)
        old = generate.Translator(
            generator.SequenceGenerator([model], cfg), cfg, torch.device("cpu"), None
        )
        return old, sources, batches
    library = importlib.import_module(f"{package}.generation.translator")
    runtime = importlib.import_module(f"{package}.runtime")
    core = library.Translator(
        [model],
        bundle.src_tokenizer,
        bundle.tgt_tokenizer,
        search=config.SearchConfig(**search),
        runtime=runtime.Runtime(torch.device("cpu"), args.dtype),
        max_sentences=args.batch,
    )

    def translate(batch: list) -> dict:
        return dict(zip((s.index for s in batch), core.translate_ids([s.ids for s in batch])))

    return translate, sources, batches


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True, help="an nmt checkpoint")
    parser.add_argument(
        "--before", default="HEAD", help="git revision to compare the working tree with"
    )
    parser.add_argument(
        "--input", default=str(REPO.parent / "shared/data/multi30k/test_2016_flickr.en")
    )
    parser.add_argument("--beam", type=int, default=5)
    parser.add_argument("--batch", type=int, default=64, help="sentences per batch")
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--max-len-a", type=float, default=1.0)
    parser.add_argument("--max-len-b", type=int, default=2)
    parser.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    parser.add_argument("--passes", type=int, default=2, help="passes over the input per version")
    args = parser.parse_args()
    for flag, path in (("--checkpoint", args.checkpoint), ("--input", args.input)):
        if not Path(path).is_file():
            sys.exit(f"bench_generate_paired: {flag} {path}: no such file")
    torch.set_num_threads(args.threads)
    import_both(args.before)

    versions = {"nmt_before": translator("nmt_before", args), "nmt": translator("nmt", args)}
    for translate, _, batches in versions.values():
        translate(batches[0])  # warm-up: first-call allocations and kernel selection
    seconds = dict.fromkeys(versions, 0.0)
    outputs: dict[str, dict[int, list[int]]] = {name: {} for name in versions}
    order = list(versions)
    turn = 0
    for _ in range(args.passes):
        for i in range(len(versions["nmt"][2])):
            for name in order if turn % 2 == 0 else reversed(order):
                translate, _, batches = versions[name]
                begin = time.perf_counter()
                hyps = translate(batches[i])
                seconds[name] += time.perf_counter() - begin
                outputs[name].update((idx, h[0].tokens.tolist()) for idx, h in hyps.items())
            turn += 1
    sentences = args.passes * len(versions["nmt"][1])
    for name, label in (("nmt_before", f"before ({args.before})"), ("nmt", "after (working tree)")):
        print(f"{label:>24}: {sentences / seconds[name]:6.1f} sentences/s")
    print(f"after/before: {seconds['nmt_before'] / seconds['nmt']:.3f}")
    same = sum(outputs["nmt"][i] == outputs["nmt_before"].get(i) for i in outputs["nmt"])
    print(f"identical translations: {same} of {len(outputs['nmt'])}")


if __name__ == "__main__":
    main()
