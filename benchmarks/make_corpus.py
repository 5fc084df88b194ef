"""A synthetic parallel corpus of any size, for tests and benchmarks (no download needed).

    python -m benchmarks.make_corpus --pairs 10000000 --out /tmp/corpus/train
    python -m benchmarks.make_corpus --pairs 3000 --out /tmp/corpus/valid --seed 2 --compress gz

Writes `<out>.<src>` and `<out>.<tgt>` (plain, or .gz / .xz when asked), one sentence a line.
The text looks like real bitext to the tools that read it: each language has its own
lexicon of pseudo-words (syllables of its own, German with umlauts and ß), word frequencies
follow Zipf's law, sentence lengths are log-normal (about 22 words on average, a long tail
up to 200), the first word is capitalised, a sentence ends with a full stop, and the target
is a noisy word-by-word "translation" of the source (so lengths correlate as in real
bitext). About one pair in a thousand has an empty side and a few are over-long or badly
unbalanced, so nmt-preprocess's cleaning rules have work to do.

The corpus is a pure function of (seed, languages, line index): it is written in blocks of
100,000 pairs, each from random streams seeded by (seed, block), each stream drawn in pair
order, so the first N pairs of a larger corpus equal the corpus of N pairs. Everything is vectorized in numpy: 10M pairs
take a few minutes on one core.
"""

from __future__ import annotations

import argparse
import bz2
import gzip
import lzma
import sys
import time
from collections.abc import Callable
from contextlib import AbstractContextManager, nullcontext
from pathlib import Path
from typing import IO

import numpy as np

from benchmarks import common
from nmt.fsutil import atomic_write, remove_stale_temps

NAME = "make_corpus"

BLOCK = 100_000  # pairs per seeded block
WORDS = 60_000  # word types per language
MEAN_WORDS = 21.0  # average sentence length in words (WMT news is 20-25)

# Per language: syllable parts (onsets, nuclei, codas) for stems, and affixes. Words are
# stems with affixes (German also compounds), so that a subword model splits them the way
# it splits real words: frequent words whole, rare ones into a stem and an ending.
_LANGUAGES = {
    "en": {
        "onsets": "b c d f g h k l m n p r s t v w y bl br ch cl cr dr fl fr gr pl pr sh st th tr",
        "nuclei": "a e i o u a e i o u ai ea ee oo ou",
        "codas": "- - - n r s t d l m ng nd st ck ll",
        "prefixes": "- - - - - - - - un re in dis pre",
        "suffixes": "- - - - - - - - - s s ed ing er ly ion ness ment able ful ity",
    },
    "de": {
        "onsets": "b d f g h k l m n p r s t w z bl br dr fl fr gr kl kr pf sch schw sp st tr zw",
        "nuclei": "a e i o u a e i o u ä ö ü au ei eu ie",
        "codas": "- - - n r s t ch ck l m ng nd st tz ß ll nn",
        "prefixes": "- - - - - - - - un ver be ge ent",
        "suffixes": "- - - - - - - e en en er es te ung lich heit keit isch bar st",
    },
}


def _parts(lang: str) -> dict[str, list[str]]:
    """The language's parts ("-" is the empty string); others borrow English's sounds (their
    words still differ: another seed)."""
    table = _LANGUAGES.get(lang, _LANGUAGES["en"])
    return {key: [p.replace("-", "") for p in value.split()] for key, value in table.items()}


def make_lexicon(lang: str, seed: int, words: int = WORDS) -> list[str]:
    """`words` distinct words, most frequent first: function words of one syllable, then
    words made of a stem (one or two syllables, frequent stems first) with an optional
    prefix and ending; German joins two stems into a compound now and then."""
    parts = _parts(lang)
    rng = np.random.default_rng([seed, sum(map(ord, lang)), 7])

    def syllables(n: int) -> list[str]:
        picks = [rng.integers(0, len(parts[k]), n) for k in ("onsets", "nuclei", "codas")]
        return [
            parts["onsets"][a] + parts["nuclei"][b] + parts["codas"][c] for a, b, c in zip(*picks)
        ]

    out: list[str] = []
    seen: set[str] = set()
    for word in syllables(1000):  # function words
        if word and word not in seen and len(out) < 300:
            seen.add(word)
            out.append(word)
    stem_pool = syllables(12000)
    stems = list(
        dict.fromkeys(
            a + b if k % 4 == 3 else a
            for k, (a, b) in enumerate(zip(stem_pool[::2], stem_pool[1::2]))
        )
    )
    stem_cdf = _zipf_cdf(len(stems), exponent=0.9, offset=10.0)
    while len(out) < words:
        n = 4096
        stem = np.searchsorted(stem_cdf, rng.random(n))
        other = np.searchsorted(stem_cdf, rng.random(n))
        prefix = rng.integers(0, len(parts["prefixes"]), n)
        suffix = rng.integers(0, len(parts["suffixes"]), n)
        compound = rng.random(n) < (0.25 if lang == "de" else 0.0)
        for i in range(n):
            word = parts["prefixes"][prefix[i]] + stems[stem[i]]
            if compound[i]:
                word += stems[other[i]]
            word += parts["suffixes"][suffix[i]]
            if word not in seen:
                seen.add(word)
                out.append(word)
                if len(out) == words:
                    break
    return out


class _Lexicon:
    """Word variants as byte strings: plain, Capitalised, and each followed by a space or by
    ".\n" (the end of a sentence). Variant v of word w is entry 4 * w + v."""

    def __init__(self, words: list[str]) -> None:
        self.entries: list[bytes] = []
        for word in words:
            cap = word[:1].upper() + word[1:]
            for text in (word + " ", cap + " ", word + ".\n", cap + ".\n"):
                self.entries.append(text.encode("utf-8"))

    def render(self, variants: np.ndarray) -> bytes:
        """The bytes of a token sequence (variant ids), concatenated."""
        return b"".join(map(self.entries.__getitem__, variants.tolist()))


def _zipf_cdf(words: int, exponent: float = 1.07, offset: float = 2.7) -> np.ndarray:
    weights = 1.0 / (np.arange(words) + offset) ** exponent
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


class CorpusMaker:
    """Blocks of sentence pairs as bytes; see the module docstring."""

    def __init__(self, seed: int = 1, src: str = "en", tgt: str = "de") -> None:
        self.seed = seed
        self.src = _Lexicon(make_lexicon(src, seed))
        self.tgt = _Lexicon(make_lexicon(tgt, seed))
        self.cdf = _zipf_cdf(WORDS)
        # the "translation" of source word w: a target word of about the same frequency
        # (a permutation that moves a word by about 30% of its rank)
        rng = np.random.default_rng([seed, 99])
        rank = np.arange(WORDS)
        self.translation = np.argsort(rank * rng.lognormal(0.0, 0.3, WORDS), kind="stable")

    def _words(self, rng: np.random.Generator, n: int) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cdf, rng.random(n)), WORDS - 1)

    def block(self, index: int, pairs: int) -> tuple[bytes, bytes]:
        """Pairs [index * BLOCK, index * BLOCK + pairs) as (source bytes, target bytes).

        Each quantity has a random stream of its own, drawn in pair order, so the pairs of
        a shorter block are the first pairs of a longer one."""
        streams = [np.random.default_rng([self.seed, index, k]) for k in range(6)]
        sigma = 0.55
        mu = np.log(MEAN_WORDS) - sigma**2 / 2
        src_len = np.clip(np.rint(streams[0].lognormal(mu, sigma, pairs)), 1, 200).astype(np.int64)
        ratio = streams[1].lognormal(0.0, 0.12, pairs)
        odd = streams[2].random(pairs)
        ratio[odd < 0.002] *= 4.0  # a few badly unbalanced pairs
        tgt_len = np.clip(np.rint(src_len * ratio), 1, 250).astype(np.int64)
        empty = odd > 0.999  # an empty target line (0 words) now and then
        tgt_len[empty] = 0

        src_words = self._words(streams[3], int(src_len.sum()))
        # target token j of a sentence translates source token floor(j * Ls / Lt), or is
        # another word (20%): lengths and content correlate as in real bitext
        t_total = int(tgt_len.sum())
        t_sentence = np.repeat(np.arange(pairs), tgt_len)
        t_first = np.cumsum(tgt_len) - tgt_len
        j = np.arange(t_total) - t_first[t_sentence]
        s_first = np.cumsum(src_len) - src_len
        aligned = s_first[t_sentence] + (j * src_len[t_sentence]) // np.maximum(
            tgt_len[t_sentence], 1
        )
        tgt_words = self.translation[src_words[aligned]]
        other = streams[4].random(t_total) < 0.2
        tgt_words[other] = self._words(streams[5], int(other.sum()))

        src_bytes = self.src.render(_variants(src_words, src_len))
        tgt_bytes = self.tgt.render(_variants(tgt_words, tgt_len))
        # an empty target sentence is an empty line
        tgt_bytes = _insert_empty_lines(tgt_bytes, tgt_len)
        return src_bytes, tgt_bytes


def _variants(words: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Variant ids: the first word of each sentence capitalised, the last one ending it."""
    v = 4 * words
    ends = np.cumsum(lengths)[lengths > 0]
    firsts = ends - lengths[lengths > 0]
    v[firsts] += 1
    v[ends - 1] += 2
    return v


def _insert_empty_lines(text: bytes, lengths: np.ndarray) -> bytes:
    """Rendered sentences skip zero-length ones: put an empty line where each belongs."""
    if (lengths > 0).all():
        return text
    lines = text.split(b"\n")[:-1]  # the text ends with "\n"
    out: list[bytes] = []
    it = iter(lines)
    for n in lengths.tolist():
        out.append(next(it) if n else b"")
    return b"\n".join(out) + b"\n"


# the compressing writer over an open binary file (fast settings: a test corpus)
OPENERS: dict[str, Callable[[IO[bytes]], AbstractContextManager[IO[bytes]]]] = {
    "none": lambda f: nullcontext(f),  # (closing it is atomic_write's)
    "gz": lambda f: gzip.GzipFile(fileobj=f, mode="wb", compresslevel=1, mtime=0),
    "xz": lambda f: lzma.LZMAFile(f, "wb", preset=0),
    "bz2": lambda f: bz2.BZ2File(f, "wb", compresslevel=1),
}


def write_corpus(
    out: str | Path,
    pairs: int,
    *,
    seed: int = 1,
    src: str = "en",
    tgt: str = "de",
    compress: str = "none",
    progress: Callable[[int], object] | None = None,
) -> tuple[Path, Path]:
    """Write `<out>.<src>` and `<out>.<tgt>` (with .gz/.xz/.bz2 added when compressed),
    each through nmt.fsutil.atomic_write: a file appears only complete, and what a killed
    run left is removed by the next one."""
    if pairs < 0:
        raise ValueError(f"pairs={pairs}: must not be negative")
    suffix = "" if compress == "none" else f".{compress}"
    paths = (Path(f"{out}.{src}{suffix}"), Path(f"{out}.{tgt}{suffix}"))
    paths[0].parent.mkdir(parents=True, exist_ok=True)
    for path in paths:
        remove_stale_temps(path)
    maker = CorpusMaker(seed, src, tgt)
    opener = OPENERS[compress]
    with (
        atomic_write(paths[0], "wb") as raw_s,
        atomic_write(paths[1], "wb") as raw_t,
        opener(raw_s) as fs,
        opener(raw_t) as ft,
    ):
        for index, start in enumerate(range(0, pairs, BLOCK)):
            n = min(BLOCK, pairs - start)
            s, t = maker.block(index, n)
            fs.write(s)
            ft.write(t)
            if progress is not None:
                progress(start + n)
    return paths


def build_parser() -> argparse.ArgumentParser:
    parser = common.parser(NAME, __doc__)
    parser.add_argument(
        "--pairs", type=common.nonnegative_int, required=True, help="sentence pairs"
    )
    parser.add_argument("--out", required=True, help="file prefix: writes <out>.<src>, <out>.<tgt>")
    parser.add_argument("--seed", type=int, default=1)
    parser.add_argument("--src", default="en")
    parser.add_argument("--tgt", default="de")
    parser.add_argument("--compress", choices=sorted(OPENERS), default="none")
    return parser


def run(args: argparse.Namespace) -> dict:
    """Write the corpus (common.main's `run`); what was written, and how fast."""
    if args.src == args.tgt:
        raise common.BenchError(f"--tgt {args.tgt}: the same as --src; give two languages")
    started = time.perf_counter()

    def report(done: int) -> None:
        rate = done / max(time.perf_counter() - started, 1e-9)
        print(f"\r{done:,} pairs ({rate:,.0f} pairs/s)", end="", file=sys.stderr, flush=True)

    paths = write_corpus(
        args.out,
        args.pairs,
        seed=args.seed,
        src=args.src,
        tgt=args.tgt,
        compress=args.compress,
        progress=report if sys.stderr.isatty() else None,
    )
    wall = time.perf_counter() - started
    if sys.stderr.isatty():
        print(file=sys.stderr)
    print(f"wrote {paths[0]} and {paths[1]}: {args.pairs:,} pairs in {wall:.1f} s")
    return {
        "pairs": args.pairs,
        "seed": args.seed,
        "compress": args.compress,
        "paths": [str(p) for p in paths],
        "wall_s": wall,
        "pairs_per_s": args.pairs / wall if wall > 0 else None,
    }


def main(argv: list[str] | None = None) -> int:
    return common.main(NAME, build_parser, run, argv)


if __name__ == "__main__":
    sys.exit(main())
