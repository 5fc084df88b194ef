"""Paired beam-search speed of two code versions, interleaved in one process.

Separate runs on a shared machine cannot tell a 5% gain from drift. This benchmark imports
a second copy of nmt from a git revision (benchmarks.common.import_revision, as the
package nmt_at_<commit>), loads the same checkpoint with each version's translation core
(nmt.Translator, or nmt.commands.generate.Translator in revisions before issue 16), and
lets the two translate the input's length-sorted batches in turns, in a balanced order
(benchmarks.common.interleave), so that drift hits both alike. It prints after/before
with its noise (a 95% interval from the per-turn ratios; an A/A run, `--before HEAD` on
a clean tree, should contain 1.00), and checks that both versions produce the same
translations.

    .venv/bin/python -m benchmarks.generate_paired --checkpoint work/bench/bench_model.pt \\
        --before f3ffaaf

Defaults are the issue's benchmark shape: Multi30k test_2016_flickr.en, beam 5, batches
of 64 sentences, 2 threads, fp32, with benchmarks.fairseq_generate's length limit (1.0 x
source + 2), which an untrained model always reaches. `--checkpoint random` saves a random
transformer_small (benchmarks.ctranslate2.random_checkpoint's: it never ends a sentence
early) and uses that.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

from benchmarks import common

NAME = "generate_paired"


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument(
        "--checkpoint",
        required=True,
        help="an nmt checkpoint, or 'random' (a random transformer_small over the "
        "Multi30k SentencePiece model of --spm)",
    )
    p.add_argument("--before", default="HEAD", help="git revision to compare the working tree with")
    p.add_argument(
        "--input", type=common.existing_file, default=common.MULTI30K / "test_2016_flickr.en"
    )
    p.add_argument("--lines", type=common.nonnegative_int, default=0, help="first N (0: all)")
    p.add_argument("--beam", type=common.positive_int, default=5)
    p.add_argument("--batch", type=common.positive_int, default=64, help="sentences per batch")
    p.add_argument("--threads", type=common.positive_int, default=2)
    p.add_argument("--max-len-a", type=float, default=1.0)
    p.add_argument("--max-len-b", type=int, default=2)
    p.add_argument("--dtype", default="fp32", choices=["fp32", "bf16"])
    p.add_argument(
        "--passes",
        type=common.positive_int,
        default=2,
        help="passes over the input per version (even: each batch first in each version's "
        "turn equally often)",
    )
    p.add_argument(
        "--spm",
        type=Path,
        default=common.WORK / "multi30k-spm.model",
        help="with --checkpoint random: the SentencePiece model (trained on Multi30k if missing)",
    )
    return p


def run(args: argparse.Namespace) -> dict[str, Any]:
    waiting = common.passive_openmp()  # before torch loads
    import torch

    from benchmarks.ctranslate2 import random_checkpoint
    from benchmarks.generate import random_small, source_ids
    from nmt.generation.translator import Translator

    torch.set_num_threads(args.threads)
    print(f"# {waiting}")
    tmp = tempfile.TemporaryDirectory()
    checkpoint = Path(args.checkpoint)
    if args.checkpoint == "random":
        if not args.spm.is_file():
            random_small(args.spm)  # trains and caches the SentencePiece model
        checkpoint = random_checkpoint("small", args.spm, Path(tmp.name) / "random.pt")
    elif not checkpoint.is_file():
        raise common.BenchError(f"--checkpoint {args.checkpoint}: no such file")
    before = common.revision_id(args.before)
    package = common.import_revision(before).__name__
    after = common.worktree_id()

    encoder = Translator.from_checkpoint(
        checkpoint, device="cpu", max_sentences=args.batch
    )  # only to encode the input and batch it the way nmt-generate does
    sources = source_ids(encoder, args.input, args.lines)
    batches = [[sources[i] for i in batch] for batch in encoder_batches(sources, args.batch)]
    options = dict(
        beam=args.beam,
        max_len_a=args.max_len_a,
        max_len_b=args.max_len_b,
        max_sentences=args.batch,
        precision=args.dtype,
    )
    versions = {
        "before": common.translator_of(package, checkpoint, **options),
        "after": common.translator_of("nmt", checkpoint, **options),
    }
    outputs: dict[str, dict[int, list[int]]] = {name: {} for name in versions}
    for translate in versions.values():
        translate(batches[0])  # warm-up: first-call allocations and kernel selection
    turns = pass_turns(args.passes, len(batches))

    def contestant(name: str):
        translate = versions[name]

        def turn(t: int) -> None:
            _, i = turns[t]
            start = sum(len(b) for b in batches[:i])
            for k, tokens in enumerate(translate(batches[i])):
                outputs[name][start + k] = tokens

        return turn

    timings = dict(zip(versions, common.interleave([contestant(n) for n in versions], len(turns))))
    wall = {n: sum(t.wall for t in ts) for n, ts in timings.items()}
    cpu = {n: sum(t.cpu for t in ts) for n, ts in timings.items()}
    ratios = common.paired_ratios(timings["before"], timings["after"])
    sentences = args.passes * len(sources)
    rates = {n: sentences / s for n, s in wall.items()}
    labels = {"before": f"before ({before})", "after": f"after ({after})"}
    for name in versions:
        print(
            f"{labels[name]:>28}: {rates[name]:6.1f} sentences/s "
            f"({wall[name]:.1f} s wall, {cpu[name]:.1f} s CPU)"
        )
    print(f"after/before: wall {ratios['wall']}")
    print(f"              CPU  {ratios['cpu']}")
    same = sum(outputs["after"][i] == outputs["before"].get(i) for i in outputs["after"])
    print(f"identical translations: {same} of {len(outputs['after'])}")
    tmp.cleanup()
    return {
        "before": before,
        "after": after,
        "checkpoint": args.checkpoint,
        "input": str(args.input),
        "sentences": len(sources),
        "passes": args.passes,
        "beam": args.beam,
        "batch": args.batch,
        "dtype": args.dtype,
        "max_len": [args.max_len_a, args.max_len_b],
        "openmp_waiting": waiting,
        "sent_s": rates,
        "wall_seconds": wall,
        "cpu_seconds": cpu,
        "after_over_before": ratios,
        "identical_translations": same,
    }


def pass_turns(passes: int, batches: int) -> list[tuple[int, int]]:
    """(pass, batch) of each turn: odd passes go through the batches backwards.

    With two versions the turn orders alternate (before first, then after first), so in
    passes taken forwards alone a batch would meet the same order in every pass (with an
    even number of batches): one version would always go first on the even batches, the
    other on the odd ones, which are not the same work (the batches are length-sorted).
    Backwards, every batch meets the other order in the next pass: over an even number
    of passes each batch is run first by each version equally often."""
    return [
        (p, i)
        for p in range(passes)
        for i in (range(batches) if p % 2 == 0 else reversed(range(batches)))
    ]


def encoder_batches(sources: list[Any], batch: int) -> list[Any]:
    """nmt-generate's batches: length-sorted, at most `batch` sentences."""
    import numpy as np

    from nmt.generation.encoding import length_batches

    lengths = np.array([len(s) for s in sources], dtype=np.int64)
    return length_batches(lengths, 0, batch)


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
