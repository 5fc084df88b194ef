"""Terminology constraints: coverage, BLEU and speed of constrained beam search.

The setting of Post & Vilar (2018): each test sentence gets 1-3 positive constraints drawn
at random from its reference (words or phrases of 1-3 words, never overlapping, outer
punctuation stripped), and the model translates with and without them. Reported:

- coverage: the share of positive constraints found in the output (as text);
- BLEU (sacreBLEU, test_2016_flickr by default) without and with the constraints;
- negative constraints: one word of each unconstrained output is forbidden, and the
  outputs that still contain it as a word are counted (the target is 0);
- speed: constrained over unconstrained search with exactly `--speed-constraints`
  constraints a sentence (2 by default), in sentences per CPU-second, at each `--beams`,
  with `--threads` threads (1 by default), both searches taking turns over the same
  batches (benchmarks.common.interleave), so the machine's drift hits both alike.

    .venv/bin/python -m benchmarks.constraints --checkpoint work/multi30k/avg.pt

The draw is seeded (`--seed`), so two runs constrain the same sentences with the same
phrases.
"""

from __future__ import annotations

import argparse
import random
import re
import unicodedata
from typing import Any

from benchmarks import common

NAME = "constraints"


def build_parser() -> argparse.ArgumentParser:
    p = common.parser(NAME, __doc__)
    p.add_argument("--checkpoint", type=common.existing_file, required=True)
    p.add_argument(
        "--source", type=common.existing_file, default=common.MULTI30K / "test_2016_flickr.en"
    )
    p.add_argument(
        "--reference", type=common.existing_file, default=common.MULTI30K / "test_2016_flickr.de"
    )
    p.add_argument("--lines", type=common.nonnegative_int, default=0, help="first N (0: all)")
    p.add_argument("--beams", default="5,1", help="comma-separated beam sizes")
    p.add_argument("--lenpen", type=float, default=None, help="default: the checkpoint's search")
    p.add_argument("--threads", type=common.positive_int, default=1)
    p.add_argument("--batch", type=common.positive_int, default=64, help="sentences per batch")
    p.add_argument("--speed-constraints", type=common.positive_int, default=2)
    p.add_argument("--passes", type=common.positive_int, default=2, help="timed passes per search")
    p.add_argument("--seed", type=int, default=1)
    return p


# ---------------------------------------------------------------- drawing constraints

_WORD = re.compile(r"\S+")


def strip_punctuation(word: str) -> str:
    """The word without the punctuation around it ("Hund." -> "Hund")."""
    start, end = 0, len(word)
    while start < end and unicodedata.category(word[start]).startswith("P"):
        start += 1
    while end > start and unicodedata.category(word[end - 1]).startswith("P"):
        end -= 1
    return word[start:end]


def draw_spans(words: list[str], count: int, rng: random.Random) -> list[range]:
    """Up to `count` non-overlapping runs of 1-3 consecutive word positions, in the order
    drawn; a run whose words are only punctuation is skipped."""
    free = set(range(len(words)))  # word positions not used by a span yet
    spans: list[range] = []
    for _ in range(count * 4):  # a few tries: a drawn span may overlap another
        if len(spans) == count or not free:
            break
        start = rng.choice(sorted(free))
        span = range(start, min(start + rng.randint(1, 3), len(words)))
        if all(i in free for i in span) and strip_punctuation(" ".join(words[i] for i in span)):
            spans.append(span)
            free -= set(span)
    return spans


def draw_phrases(reference: str, count: int, rng: random.Random) -> list[str]:
    """Up to `count` non-overlapping phrases of 1-3 words of `reference` (draw_spans), the
    punctuation around each stripped (inner punctuation kept: a phrase is a substring of
    the reference)."""
    words = _WORD.findall(reference)
    return [strip_punctuation(" ".join(words[i] for i in s)) for s in draw_spans(words, count, rng)]


def draw_forbidden(output: str, rng: random.Random) -> str | None:
    """One word of an unconstrained output (2+ letters) to forbid, or None."""
    words = [w for w in (strip_punctuation(w) for w in _WORD.findall(output)) if len(w) >= 2]
    return rng.choice(words) if words else None


def contains_word(text: str, word: str) -> bool:
    """`word` occurs in `text` as a whole word."""
    return re.search(rf"(?<!\w){re.escape(word)}(?!\w)", text) is not None


# ---------------------------------------------------------------- the benchmark


def run(args: argparse.Namespace) -> dict[str, Any]:
    waiting = common.passive_openmp()  # before torch loads
    import sacrebleu
    import torch

    from nmt.generation.io import read_text_lines
    from nmt.generation.translator import Translator

    torch.set_num_threads(args.threads)
    print(f"# {waiting}")
    try:
        beams = [int(b) for b in args.beams.split(",")]
    except ValueError:
        raise common.BenchError(
            f"--beams {args.beams}: give comma-separated whole numbers"
        ) from None
    sources = list(read_text_lines(str(args.source)))
    references = list(read_text_lines(str(args.reference)))
    if len(sources) != len(references):
        raise common.BenchError(
            f"--reference {args.reference}: {len(references)} lines for {len(sources)} sources"
        )
    if args.lines:
        sources, references = sources[: args.lines], references[: args.lines]
    options: dict[str, Any] = {} if args.lenpen is None else {"lenpen": args.lenpen}
    translator = Translator.from_checkpoint(
        args.checkpoint, device="cpu", max_sentences=args.batch, **options
    )
    rng = random.Random(args.seed)
    drawn = [draw_phrases(ref, rng.randint(1, 3), rng) for ref in references]
    for_speed = [draw_phrases(ref, args.speed_constraints, rng) for ref in references]

    figures: dict[str, Any] = {
        "checkpoint": str(args.checkpoint),
        "source": str(args.source),
        "sentences": len(sources),
        "threads": args.threads,
        "seed": args.seed,
        "openmp_waiting": waiting,
        "quality": {},
        "speed": {},
    }
    for beam in beams:
        free = translator.translate(sources, beam=beam)
        constrained = translator.translate_batch(sources, constraints=drawn, beam=beam)
        outputs = [t[0].text for t in constrained]
        wanted = sum(len(p) for p in drawn)
        found = sum(p in out for phrases, out in zip(drawn, outputs) for p in phrases)
        unmet = sum(not t[0].constraints_met for t in constrained)
        forbidden = [draw_forbidden(out, rng) for out in free]
        negative = [{"exclude": [w]} if w else None for w in forbidden]
        avoided = translator.translate(sources, constraints=negative, beam=beam)
        produced = sum(
            w is not None and contains_word(out, w) for w, out in zip(forbidden, avoided)
        )
        quality = {
            "bleu_free": sacrebleu.corpus_bleu(free, [references]).score,
            "bleu_constrained": sacrebleu.corpus_bleu(outputs, [references]).score,
            "constraints": wanted,
            "coverage": found / max(wanted, 1),
            "sentences_unmet": unmet,
            "forbidden_words": sum(w is not None for w in forbidden),
            "forbidden_produced": produced,
        }
        figures["quality"][beam] = quality
        print(
            f"beam {beam}: BLEU {quality['bleu_free']:.2f} free, "
            f"{quality['bleu_constrained']:.2f} with 1-3 reference constraints; coverage "
            f"{found}/{wanted} = {100 * quality['coverage']:.2f}% ({unmet} sentences unmet); "
            f"forbidden words produced {produced} of {quality['forbidden_words']}"
        )
        figures["speed"][beam] = speed(translator, sources, for_speed, beam, args)
    return figures


def speed(
    translator: Any,
    sources: list[str],
    phrases: list[list[str]],
    beam: int,
    args: argparse.Namespace,
) -> dict[str, Any]:
    """Sentences per CPU-second of free and constrained search taking turns per batch."""
    batches = [
        range(i, min(i + args.batch, len(sources))) for i in range(0, len(sources), args.batch)
    ]
    translator.translate(sources[: args.batch], beam=beam)  # warm-up

    def contestant(constrained: bool):
        def turn(t: int) -> None:
            rows = batches[t % len(batches)]
            texts = [sources[i] for i in rows]
            extra = {"constraints": [phrases[i] for i in rows]} if constrained else {}
            translator.translate(texts, beam=beam, **extra)

        return turn

    turns = args.passes * len(batches)
    free, constrained = common.interleave([contestant(False), contestant(True)], turns)
    ratios = common.paired_ratios(free, constrained)  # > 1: constrained faster
    n = args.passes * len(sources)
    rates = {
        "free": n / sum(t.cpu for t in free),
        "constrained": n / sum(t.cpu for t in constrained),
    }
    print(
        f"beam {beam}, {args.speed_constraints} constraints a sentence, {args.threads} "
        f"thread(s): {rates['free']:.1f} free and {rates['constrained']:.1f} constrained "
        f"sentences per CPU-second; constrained/free CPU {ratios['cpu']}"
    )
    return {"sent_per_cpu_s": rates, "constrained_over_free": ratios}


if __name__ == "__main__":
    raise SystemExit(common.main(NAME, build_parser, run, passive=True))
