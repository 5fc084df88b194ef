"""Scoring with sacrebleu: BLEU, chrF and TER with their signatures, shared by nmt-score,
nmt-generate (references) and validation during training.

Everything numeric is sacrebleu's own code: files are read the way the `sacrebleu` CLI
reads them (UTF-8, trailing whitespace stripped), so a corpus score here equals the CLI's
on the same files. This module adds the checks that turn user mistakes into one-line
errors, and the configuration dataclass of nmt-score.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Optional

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric, Score

from nmt.errors import NmtError

METRIC_NAMES = ("bleu", "chrf", "ter")


@dataclass
class BleuOptions:
    """sacrebleu BLEU options, under sacrebleu's own names."""

    tokenize: Optional[str] = None  # 13a (default), intl, zh, char, none, flores200, ...
    lowercase: bool = False  # compare lowercased text
    force: bool = False  # score text that looks already tokenized without a warning
    smooth_method: str = "exp"  # exp, floor, add-k or none
    smooth_value: Optional[float] = None  # for floor (0.1) and add-k (1); None = default
    max_ngram_order: int = 4  # highest n-gram order


@dataclass
class ChrfOptions:
    """sacrebleu chrF options (word_order=2 gives chrF++)."""

    char_order: int = 6  # character n-gram order
    word_order: int = 0  # word n-gram order; 2 = chrF++
    beta: int = 2  # weight of recall against precision
    lowercase: bool = False  # compare lowercased text
    whitespace: bool = False  # keep whitespace in character n-grams
    eps_smoothing: bool = False  # epsilon smoothing (chrF++.py, NLTK, Moses behaviour)


@dataclass
class TerOptions:
    """sacrebleu TER options (defaults replicate TERCOM)."""

    case_sensitive: bool = False  # TERCOM lowercases by default
    asian_support: bool = False  # tokenize Asian characters
    no_punct: bool = False  # remove punctuation
    normalized: bool = False  # normalize as in TERCOM's -N option


@dataclass
class ScoreConfig:
    """nmt-score: score a hypothesis file against one or more reference files."""

    hyp: Optional[str] = None  # hypothesis file, one sentence per line; "-" = stdin (required)
    refs: Any = None  # reference file, or a list of them [a.de,b.de] (required)
    metrics: list[str] = field(default_factory=lambda: ["bleu"])  # any of bleu, chrf, ter
    bleu: BleuOptions = field(default_factory=BleuOptions)  # BLEU options
    chrf: ChrfOptions = field(default_factory=ChrfOptions)  # chrF options
    ter: TerOptions = field(default_factory=TerOptions)  # TER options
    sentence_level: bool = False  # also give each sentence's score
    confidence: bool = False  # bootstrap 95% confidence interval of each corpus score
    confidence_n: int = 1000  # bootstrap resamples for `confidence`
    baseline: Optional[str] = (
        None  # a second system's file: paired significance test hyp vs baseline
    )
    paired_test: str = "bs"  # bs (paired bootstrap resampling) or ar (approximate randomization)
    paired_n: int = 0  # resamples (bs) or trials (ar); 0 = sacrebleu's default (1000 / 10000)
    format: str = "text"  # text or json
    width: int = 1  # decimals printed, as sacrebleu's --width
    debug: bool = False  # tracebacks instead of one-line errors


@dataclass
class MetricResult:
    """One corpus-level score, with what is needed to print or reproduce it."""

    name: str  # "BLEU", "chrF2", "TER"
    score: float
    signature: str  # sacrebleu's full signature string
    line: str  # sacrebleu's formatted line: "BLEU|nrefs:1|...|version:2.6.0 = 34.2 ..."
    details: str = ""  # BLEU's n-gram precisions, brevity penalty and lengths
    mean: Optional[float] = None  # bootstrap mean (confidence=true)
    ci: Optional[float] = None  # half-width of the bootstrap 95% interval


def read_lines(path: str | os.PathLike, what: str) -> list[str]:
    """The lines of a UTF-8 text file ("-": stdin), as the sacrebleu CLI reads them (rstripped)."""
    if str(path) == "-":
        lines = [line.rstrip() for line in sys.stdin]
        return [lines[0].lstrip("\ufeff"), *lines[1:]] if lines else lines
    p = Path(path)
    if not p.is_file():
        raise NmtError(f"{what} {p}: no such file")
    try:
        # utf-8-sig drops a leading byte-order mark (editors on Windows write one); sacrebleu
        # would count it as part of the first word
        with open(p, encoding="utf-8-sig", newline="\n") as f:
            return [line.rstrip() for line in f]
    except UnicodeDecodeError as exc:
        raise NmtError(
            f"{what} {p}: not UTF-8 text (byte {exc.start}); convert it to UTF-8"
        ) from exc
    except OSError as exc:
        raise NmtError(f"{what} {p}: cannot read ({exc.strerror or exc})") from exc


def as_path_list(value: Any, key: str) -> list[str]:
    """A config value that is one path or a list of paths, as a non-empty list."""
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        raise NmtError(f"{key}: no file given; pass {key}=FILE or {key}=[FILE1,FILE2]")
    paths = [value] if isinstance(value, (str, os.PathLike)) else list(value)
    for p in paths:
        if not isinstance(p, (str, os.PathLike)):
            raise NmtError(f"{key}: {p!r} is not a file name")
    return [str(p) for p in paths]


def read_references(paths: Sequence[str], n_hyps: int, hyp_name: str) -> list[list[str]]:
    """Reference streams (one list per file), each checked to have `n_hyps` lines."""
    streams = []
    for path in paths:
        lines = read_lines(path, "reference")
        if len(lines) != n_hyps:
            raise NmtError(
                f"reference {path}: {len(lines)} lines, but hypothesis {hyp_name} has "
                f"{n_hyps}; they must be line-aligned"
            )
        streams.append(lines)
    return streams


def read_hypotheses(path: str, what: str = "hypothesis") -> list[str]:
    lines = read_lines(path, what)
    if not lines:
        raise NmtError(f"{what} {path}: the file is empty; nothing to score")
    return lines


def build_metrics(
    names: Sequence[str],
    bleu: BleuOptions | None = None,
    chrf: ChrfOptions | None = None,
    ter: TerOptions | None = None,
    sentence_level: bool = False,
) -> dict[str, Metric]:
    """sacrebleu metric objects by lowercase name, options checked with one-line errors."""
    bleu, chrf, ter = bleu or BleuOptions(), chrf or ChrfOptions(), ter or TerOptions()
    if not names:
        raise NmtError(f"metrics: empty; choose from {list(METRIC_NAMES)}")
    metrics: dict[str, Metric] = {}
    for name in names:
        key = str(name).lower()
        if key not in METRIC_NAMES:
            raise NmtError(f"metrics: unknown metric {name!r}; choose from {list(METRIC_NAMES)}")
        if key == "bleu":
            if bleu.tokenize is not None and bleu.tokenize not in BLEU.TOKENIZERS:
                raise NmtError(
                    f"bleu.tokenize: unknown tokenizer {bleu.tokenize!r}; choose from "
                    f"{sorted(BLEU.TOKENIZERS)}"
                )
            if bleu.smooth_method not in BLEU.SMOOTH_DEFAULTS:
                raise NmtError(
                    f"bleu.smooth_method: {bleu.smooth_method!r}; choose from "
                    f"{list(BLEU.SMOOTH_DEFAULTS)}"
                )
            if bleu.max_ngram_order < 1:
                raise NmtError("bleu.max_ngram_order: must be at least 1")
            # Sentence BLEU needs effective order, as the sacrebleu CLI sets it.
            metrics[key] = BLEU(
                lowercase=bleu.lowercase,
                force=bleu.force,
                tokenize=bleu.tokenize,
                smooth_method=bleu.smooth_method,
                smooth_value=bleu.smooth_value,
                max_ngram_order=bleu.max_ngram_order,
                effective_order=sentence_level,
            )
        elif key == "chrf":
            if chrf.char_order < 1 or chrf.word_order < 0 or chrf.beta < 1:
                raise NmtError("chrf: char_order and beta must be >= 1 and word_order >= 0")
            metrics[key] = CHRF(
                char_order=chrf.char_order,
                word_order=chrf.word_order,
                beta=chrf.beta,
                lowercase=chrf.lowercase,
                whitespace=chrf.whitespace,
                eps_smoothing=chrf.eps_smoothing,
            )
        else:
            metrics[key] = TER(
                case_sensitive=ter.case_sensitive,
                asian_support=ter.asian_support,
                no_punct=ter.no_punct,
                normalized=ter.normalized,
            )
    return metrics


def _result(score: Score, metric: Metric, width: int) -> MetricResult:
    signature = metric.get_signature().format()
    has_ci = score._mean > 0  # sacrebleu marks "no bootstrap" with -1
    return MetricResult(
        name=score.name,
        score=float(score.score),
        signature=signature,
        line=score.format(width=width, signature=signature),
        details=score._verbose or "",
        mean=float(score._mean) if has_ci else None,
        ci=float(score._ci) if has_ci else None,
    )


def corpus_scores(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    metrics: dict[str, Metric],
    n_bootstrap: int = 1,
    width: int = 1,
) -> list[MetricResult]:
    """Corpus-level scores, in the order of `metrics`; n_bootstrap > 1 adds a 95% CI."""
    return [
        _result(
            m.corpus_score(list(hyps), [list(r) for r in refs], n_bootstrap=n_bootstrap), m, width
        )
        for m in metrics.values()
    ]


def corpus_bleu(
    hyps: Sequence[str],
    refs: Sequence[Sequence[str]],
    tokenize: Optional[str] = None,
    lowercase: bool = False,
) -> MetricResult:
    """BLEU of `hyps` against reference streams, with its signature (generation, validation)."""
    metric = build_metrics(["bleu"], BleuOptions(tokenize=tokenize, lowercase=lowercase))
    return corpus_scores(hyps, refs, metric)[0]


def sentence_scores(
    hyps: Sequence[str], refs: Sequence[Sequence[str]], metric: Metric
) -> list[float]:
    """One score per hypothesis (BLEU with effective order: see build_metrics)."""
    return [float(metric.sentence_score(h, list(rs)).score) for h, *rs in zip(hyps, *refs)]


@dataclass
class PairedResult:
    """A paired significance test of one system against a baseline, for one metric."""

    metric: str
    signature: str
    baseline_score: float
    system_score: float
    p_value: float
    baseline_mean: Optional[float]  # bootstrap means and 95% CI half-widths (None for ar
    baseline_ci: Optional[float]  # without confidence resamples)
    system_mean: Optional[float]
    system_ci: Optional[float]


def paired_test(
    baseline: tuple[str, Sequence[str]],
    system: tuple[str, Sequence[str]],
    refs: Sequence[Sequence[str]],
    metrics: dict[str, Metric],
    test_type: str = "bs",
    n_samples: int = 0,
) -> list[PairedResult]:
    """sacrebleu's paired bootstrap resampling (`bs`) or approximate randomization (`ar`).

    The seed is sacrebleu's (SACREBLEU_SEED, default 12345), so results are reproducible
    and identical to `sacrebleu --paired-bs/--paired-ar`.
    """
    from sacrebleu.significance import PairedTest

    if test_type not in ("bs", "ar"):
        raise NmtError(
            f"paired_test: {test_type!r}; use bs (bootstrap) or ar (approximate randomization)"
        )
    if n_samples < 0:
        raise NmtError("paired_n: must be >= 0 (0 = sacrebleu's default)")
    test = PairedTest(
        [(baseline[0], list(baseline[1])), (system[0], list(system[1]))],
        metrics,
        references=[list(r) for r in refs],
        test_type=test_type,
        n_samples=n_samples,
        n_ar_confidence=-1,
    )
    signatures, table = test()
    results = []
    for metric_name, signature in signatures.items():
        base, sys_ = table[metric_name]
        results.append(
            PairedResult(
                metric=metric_name,
                signature=signature.format(),
                baseline_score=float(base.score),
                system_score=float(sys_.score),
                p_value=float(sys_.p_value),
                baseline_mean=None if base.mean is None else float(base.mean),
                baseline_ci=None if base.ci is None else float(base.ci),
                system_mean=None if sys_.mean is None else float(sys_.mean),
                system_ci=None if sys_.ci is None else float(sys_.ci),
            )
        )
    return results
