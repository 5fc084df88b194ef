"""Scoring with sacrebleu: BLEU, chrF and TER with their signatures, shared by nmt-score,
nmt-generate (references) and validation during training.

Everything numeric is sacrebleu's own code: files are read the way the `sacrebleu` CLI
reads them (UTF-8, trailing whitespace stripped), so a corpus score here equals the CLI's
on the same files. This module adds the checks that turn user mistakes into one-line
errors, the configuration dataclass of nmt-score, and its library call:

    report = score(ScoreConfig(hyp="out.de", refs=["ref.de"], metrics=["bleu", "chrf"]))
    print(report.to_text())            # or report.to_json(), or write_report(report, path)
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Optional, cast

from sacrebleu.metrics import BLEU, CHRF, TER
from sacrebleu.metrics.base import Metric, Score

from nmt.errors import NmtError, choice_error, option_error

if TYPE_CHECKING:
    from sacrebleu.significance import Result
from nmt.fsutil import atomic_write_text, check_not_an_input, check_text_output
from nmt.textlines import TextLines, check_input_errors

METRIC_NAMES = ("bleu", "chrf", "ter")
FORMATS = ("text", "json")
PAIRED_TESTS = {"bs": "paired bootstrap resampling", "ar": "approximate randomization"}
STDIO = "-"


@dataclass
class BleuOptions:
    """sacrebleu BLEU options, under sacrebleu's own names."""

    tokenize: Optional[str] = None  # 13a (default), intl, zh, char, none, flores200, ...
    lowercase: bool = False  # compare lowercased text
    force: bool = False  # score text that looks already tokenized without a warning
    smooth_method: str = "exp"  # exp, floor, add-k or none
    smooth_value: Optional[float] = None  # for floor (0.1) and add-k (1); None = default
    max_ngram_order: int = 4  # highest n-gram order

    def validate(self) -> None:
        if self.tokenize is not None and self.tokenize not in BLEU.TOKENIZERS:
            raise option_error(
                "bleu.tokenize",
                self.tokenize,
                "unknown tokenizer",
                f"use one of {', '.join(sorted(BLEU.TOKENIZERS))} (null: 13a)",
            )
        if self.smooth_method not in BLEU.SMOOTH_DEFAULTS:
            raise choice_error("bleu.smooth_method", self.smooth_method, list(BLEU.SMOOTH_DEFAULTS))
        if self.smooth_value is not None and self.smooth_value < 0:
            raise option_error(
                "bleu.smooth_value",
                self.smooth_value,
                "must not be negative",
                "use null for sacrebleu's default",
            )
        if self.max_ngram_order < 1:
            raise option_error(
                "bleu.max_ngram_order", self.max_ngram_order, "must be 1 or more", "BLEU uses 4"
            )


@dataclass
class ChrfOptions:
    """sacrebleu chrF options (word_order=2 gives chrF++)."""

    char_order: int = 6  # character n-gram order
    word_order: int = 0  # word n-gram order; 2 = chrF++
    beta: int = 2  # weight of recall against precision
    lowercase: bool = False  # compare lowercased text
    whitespace: bool = False  # keep whitespace in character n-grams
    eps_smoothing: bool = False  # epsilon smoothing (chrF++.py, NLTK, Moses behaviour)

    def validate(self) -> None:
        for key, value, least, usual in (
            ("char_order", self.char_order, 1, "6"),
            ("word_order", self.word_order, 0, "0, or 2 for chrF++"),
            ("beta", self.beta, 1, "2"),
        ):
            if value < least:
                raise option_error(
                    f"chrf.{key}", value, f"must be {least} or more", f"chrF uses {usual}"
                )


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
    output: str = "-"  # where the report goes: a file (written atomically), or "-" = stdout
    input_errors: str = "strict"  # invalid UTF-8 in hyp/refs/baseline: strict (error) or replace
    debug: bool = False  # tracebacks instead of one-line errors

    def validate(self) -> None:
        """Raise NmtError naming the first option that cannot work (files are read later)."""
        if not self.hyp:
            raise option_error(
                "hyp",
                self.hyp,
                "required",
                "give the hypothesis file (hyp=FILE, or hyp=- to read stdin)",
            )
        refs = as_path_list(self.refs, "refs")
        check_metric_names(self.metrics)
        self.bleu.validate()
        self.chrf.validate()
        check_format(self.format)
        if self.confidence and self.confidence_n < 2:
            raise option_error(
                "confidence_n", self.confidence_n, "must be 2 or more", "sacrebleu uses 1000"
            )
        check_paired_test(self.paired_test, self.paired_n)
        if self.width < 0:
            raise option_error("width", self.width, "must not be negative", "sacrebleu prints 1")
        if not self.output:
            raise option_error("output", self.output, "empty", "give a file name, or - for stdout")
        check_input_errors(self.input_errors)
        inputs = [("hyp", self.hyp), *(("refs", r) for r in refs)]
        if self.baseline:
            inputs.append(("baseline", self.baseline))
        from_stdin = [key for key, path in inputs if path == STDIO]
        if len(from_stdin) > 1:
            raise option_error(
                from_stdin[1],
                STDIO,
                f"stdin is already read as {from_stdin[0]}=-",
                "give the other files by name",
            )


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


def read_lines(
    path: str | os.PathLike, key: str, errors: str = "strict", notes: list[str] | None = None
) -> list[str]:
    """The lines of a UTF-8 text file ("-": stdin), as the sacrebleu CLI reads them (rstripped).

    `key` is the option that named the file (hyp, refs, baseline), for error messages;
    `errors` is input_errors (strict: invalid UTF-8 is an error naming the line; replace:
    U+FFFD, and a line about it is appended to `notes`).
    """
    if str(path) != STDIO:
        p = Path(path)
        if not p.is_file():
            why = "is a directory" if p.is_dir() else "no such file"
            raise NmtError(f"{p}: {why}; give a text file as {key}=")
    # A byte-order mark (editors on Windows write one) is dropped: sacrebleu would count
    # it as part of the first word.
    text = TextLines(str(path), errors)
    try:
        lines = [line.rstrip() for line in text]
    except OSError as exc:
        raise NmtError(
            f"{path}: cannot read ({exc.strerror or exc}); check the file's permissions"
        ) from exc
    text.check()
    note = text.replacement_note()
    if note is not None and notes is not None:
        notes.append(note)
    return lines


def as_path_list(value: Any, key: str) -> list[str]:
    """A config value that is one path or a list of paths, as a non-empty list."""
    if value is None or value == "" or (isinstance(value, (list, tuple)) and not value):
        raise option_error(key, value, "no file given", f"pass {key}=FILE or {key}=[FILE1,FILE2]")
    paths = list(value) if isinstance(value, (list, tuple)) else [value]
    for p in paths:
        if not isinstance(p, (str, os.PathLike)) or not str(p):
            raise option_error(key, p, "not a file name", f"pass {key}=FILE or {key}=[FILE1,FILE2]")
    return [str(p) for p in paths]


def read_references(
    paths: Sequence[str],
    n_hyps: int,
    hyp_name: str,
    errors: str = "strict",
    notes: list[str] | None = None,
) -> list[list[str]]:
    """Reference streams (one list per file), each checked to have `n_hyps` lines
    (`errors`, `notes`: as read_lines)."""
    streams = []
    for path in paths:
        lines = read_lines(path, "refs", errors, notes)
        if len(lines) != n_hyps:
            raise NmtError(
                f"{path}: {len(lines)} lines, but the hypothesis file {hyp_name} has "
                f"{n_hyps}; give line-aligned references"
            )
        streams.append(lines)
    return streams


def read_hypotheses(
    path: str, key: str = "hyp", errors: str = "strict", notes: list[str] | None = None
) -> list[str]:
    lines = read_lines(path, key, errors, notes)
    if not lines:
        raise NmtError(f"{path}: the file is empty, nothing to score; check {key}=")
    return lines


def check_format(fmt: str) -> None:
    if fmt not in FORMATS:
        raise choice_error("format", fmt, FORMATS)


def check_paired_test(test_type: str, n_samples: int) -> None:
    if test_type not in PAIRED_TESTS:
        raise option_error(
            "paired_test",
            test_type,
            "unknown",
            "use bs (paired bootstrap resampling) or ar (approximate randomization)",
        )
    if n_samples < 0:
        raise option_error(
            "paired_n",
            n_samples,
            "must not be negative",
            "use 0 for sacrebleu's default (1000 resamples, 10000 trials)",
        )


def check_metric_names(names: Sequence[str]) -> None:
    if isinstance(names, str):
        raise option_error("metrics", names, "a list is needed", f"write metrics=[{names}]")
    choose = f"choose from {', '.join(METRIC_NAMES)}"
    if not names:
        raise option_error("metrics", list(names), "empty", choose)
    for name in names:
        if str(name).lower() not in METRIC_NAMES:
            raise option_error("metrics", list(names), f"unknown metric {name!r}", choose)


def build_metrics(
    names: Sequence[str],
    bleu: BleuOptions | None = None,
    chrf: ChrfOptions | None = None,
    ter: TerOptions | None = None,
    sentence_level: bool = False,
) -> dict[str, Metric]:
    """sacrebleu metric objects by lowercase name, options checked with one-line errors."""
    bleu, chrf, ter = bleu or BleuOptions(), chrf or ChrfOptions(), ter or TerOptions()
    check_metric_names(names)
    metrics: dict[str, Metric] = {}
    for name in names:
        key = str(name).lower()
        if key == "bleu":
            bleu.validate()
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
            chrf.validate()
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


def _result(result: Score, metric: Metric, width: int) -> MetricResult:
    signature = metric.get_signature().format()
    has_ci = result._mean > 0  # sacrebleu marks "no bootstrap" with -1
    return MetricResult(
        name=result.name,
        score=float(result.score),
        signature=signature,
        line=result.format(width=width, signature=signature),
        details=result._verbose or "",
        mean=float(result._mean) if has_ci else None,
        ci=float(result._ci) if has_ci else None,
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

    check_paired_test(test_type, n_samples)
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
        # each metric's row: the baseline's Result, then the system's (sacrebleu types them
        # as str | Result because its text table shares the structure)
        base, sys_ = cast("list[Result]", table[metric_name])
        assert sys_.p_value is not None  # sacrebleu tests every system but the baseline
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


# ------------------------------------------------------------------------ nmt-score's call


@dataclass
class PairedReport:
    """A paired significance test of hyp against a baseline, for every metric."""

    type: str  # "bs" or "ar"
    baseline: str  # the baseline's file
    results: list[PairedResult]


@dataclass
class ScoreReport:
    """Everything nmt-score reports, renderable as sacrebleu-style text or as JSON."""

    hyp: str
    refs: list[str]
    lines: int  # hypotheses scored
    scores: list[MetricResult]  # corpus scores, in the order of `metrics`
    sentences: Optional[list[dict[str, Any]]] = None  # {line, <metric>: score}, sentence_level
    paired: Optional[PairedReport] = None  # with a baseline
    width: int = 1  # decimals in the text rendering
    notes: list[str] = field(default_factory=list)  # input_errors=replace: lines replaced

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "hyp": self.hyp,
            "refs": self.refs,
            "lines": self.lines,
            "scores": [asdict(r) for r in self.scores],
        }
        if self.sentences is not None:
            out["sentences"] = self.sentences
        if self.paired is not None:
            out["paired_test"] = asdict(self.paired)
        return out

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), indent=1, ensure_ascii=False)

    def to_text(self) -> str:
        """sacrebleu's lines (signature = score ...), after the sentence table if any."""
        w = self.width
        out = []
        if self.sentences is not None:
            names = [r.name for r in self.scores]
            out.append("line\t" + "\t".join(names))
            out += [
                f"{row['line']}\t" + "\t".join(f"{row[n]:.{w}f}" for n in names)
                for row in self.sentences
            ]
        out += [r.line for r in self.scores]
        if self.paired is not None:
            out += self._paired_lines()
        return "\n".join(out)

    def _paired_lines(self) -> list[str]:
        assert self.paired is not None
        w = self.width

        def ci(mean: float | None, half: float | None) -> str:
            return "" if mean is None or half is None else f" (μ = {mean:.{w}f} ± {half:.{w}f})"

        lines = []
        for r in self.paired.results:
            verdict = "significant" if r.p_value < 0.05 else "not significant"
            lines += [
                f"{PAIRED_TESTS[self.paired.type]}: {r.metric}|{r.signature}",
                f"  baseline {self.paired.baseline}: {r.metric} = {r.baseline_score:.{w}f}"
                f"{ci(r.baseline_mean, r.baseline_ci)}",
                f"  system   {self.hyp}: {r.metric} = {r.system_score:.{w}f}"
                f"{ci(r.system_mean, r.system_ci)} p = {r.p_value:.4f} ({verdict} at p < 0.05)",
            ]
        return lines

    def render(self, fmt: str) -> str:
        check_format(fmt)
        return self.to_json() if fmt == "json" else self.to_text()


def score(cfg: ScoreConfig) -> ScoreReport:
    """Score `cfg.hyp` against `cfg.refs` as nmt-score does (the report is not written:
    see `write_report`). A file `cfg.output` is checked first, so that a mistake there does
    not come after a long bootstrap."""
    cfg.validate()
    hyp = str(cfg.hyp)  # validate() made sure it is given
    ref_paths = as_path_list(cfg.refs, "refs")
    inputs = [("hyp", hyp), *(("refs", r) for r in ref_paths)]
    check_output(cfg.output, inputs + ([("baseline", cfg.baseline)] if cfg.baseline else []))
    notes: list[str] = []
    hyps = read_hypotheses(hyp, "hyp", cfg.input_errors, notes)
    refs = read_references(ref_paths, len(hyps), hyp, cfg.input_errors, notes)
    metrics = build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter)
    n_bootstrap = cfg.confidence_n if cfg.confidence else 1
    results = corpus_scores(hyps, refs, metrics, n_bootstrap=n_bootstrap, width=cfg.width)

    sentences = None
    if cfg.sentence_level:
        # Sentence BLEU uses effective order (as sacrebleu's CLI); the corpus score above does not.
        per_metric = build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter, sentence_level=True)
        columns = {
            r.name: sentence_scores(hyps, refs, m) for r, m in zip(results, per_metric.values())
        }
        sentences = [
            {"line": i + 1, **{k: v[i] for k, v in columns.items()}} for i in range(len(hyps))
        ]

    paired = None
    if cfg.baseline:
        base_hyps = read_hypotheses(cfg.baseline, "baseline", cfg.input_errors, notes)
        if len(base_hyps) != len(hyps):
            raise NmtError(
                f"{cfg.baseline}: {len(base_hyps)} lines, but the hypothesis file {hyp} "
                f"has {len(hyps)}; give a baseline that translates the same input"
            )
        results_paired = paired_test(
            (cfg.baseline, base_hyps),
            (hyp, hyps),
            refs,
            build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter),
            test_type=cfg.paired_test,
            n_samples=cfg.paired_n,
        )
        paired = PairedReport(cfg.paired_test, cfg.baseline, results_paired)
    return ScoreReport(
        hyp=hyp,
        refs=ref_paths,
        lines=len(hyps),
        scores=results,
        sentences=sentences,
        paired=paired,
        width=cfg.width,
        notes=notes,
    )


def check_output(output: str, inputs: Sequence[tuple[str, str]]) -> None:
    """NmtError unless a report can be written to `output` ("-": stdout) without harm."""
    if output == STDIO:
        return
    path = Path(output)
    if path.is_dir():
        raise option_error("output", output, "is a directory", "give a file name")
    if not path.parent.is_dir():
        raise option_error(
            "output",
            output,
            f"the folder {path.parent} does not exist",
            "create it or choose another output",
        )
    check_not_an_input("output", output, list(inputs))
    check_text_output(path, "output", "nmt-score")


def write_report(report: ScoreReport, output: str = STDIO, fmt: str = "text") -> None:
    """The report as `fmt` (text or json) to stdout ("-") or to a file, written atomically."""
    text = report.render(fmt) + "\n"
    if output == STDIO:
        sys.stdout.write(text)
        sys.stdout.flush()
    else:
        atomic_write_text(output, text)
