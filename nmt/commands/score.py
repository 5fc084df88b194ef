"""nmt-score: BLEU / chrF / TER of a hypothesis file against reference files, with
sacrebleu signatures, optional sentence scores, bootstrap confidence intervals and a
paired significance test against a baseline system. Text or JSON on stdout.
"""

from __future__ import annotations

import json
from dataclasses import asdict
from typing import Any

from nmt.errors import NmtError
from nmt.scoring import (
    PairedResult,
    ScoreConfig,
    as_path_list,
    build_metrics,
    corpus_scores,
    paired_test,
    read_hypotheses,
    read_references,
    sentence_scores,
)


def _check(cfg: ScoreConfig) -> None:
    if not cfg.hyp:
        raise NmtError("hyp: no hypothesis file given; pass hyp=FILE (or hyp=- for stdin)")
    if cfg.format not in ("text", "json"):
        raise NmtError(f"format: {cfg.format!r}; use text or json")
    if cfg.confidence and cfg.confidence_n < 2:
        raise NmtError("confidence_n: needs at least 2 bootstrap resamples")
    if cfg.paired_test not in ("bs", "ar"):
        raise NmtError(
            f"paired_test: {cfg.paired_test!r}; use bs (bootstrap) or ar (approximate randomization)"
        )
    if cfg.width < 0:
        raise NmtError("width: must be >= 0")


def _paired_text(
    results: list[PairedResult], baseline: str, hyp: str, test: str, width: int
) -> list[str]:
    name = "paired bootstrap resampling" if test == "bs" else "approximate randomization"
    lines = []
    for r in results:

        def ci(mean: float | None, half: float | None) -> str:
            return "" if mean is None else f" (μ = {mean:.{width}f} ± {half:.{width}f})"

        verdict = "significant" if r.p_value < 0.05 else "not significant"
        lines += [
            f"{name}: {r.metric}|{r.signature}",
            f"  baseline {baseline}: {r.metric} = {r.baseline_score:.{width}f}"
            f"{ci(r.baseline_mean, r.baseline_ci)}",
            f"  system   {hyp}: {r.metric} = {r.system_score:.{width}f}"
            f"{ci(r.system_mean, r.system_ci)} p = {r.p_value:.4f} ({verdict} at p < 0.05)",
        ]
    return lines


def run(cfg: ScoreConfig) -> None:
    _check(cfg)
    hyps = read_hypotheses(cfg.hyp)
    ref_paths = as_path_list(cfg.refs, "refs")
    refs = read_references(ref_paths, len(hyps), cfg.hyp)
    metrics = build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter)
    results = corpus_scores(
        hyps, refs, metrics, n_bootstrap=cfg.confidence_n if cfg.confidence else 1, width=cfg.width
    )

    sentences: list[dict[str, Any]] = []
    if cfg.sentence_level:
        # Sentence BLEU uses effective order (as sacrebleu's CLI); the corpus score above does not.
        per_metric = build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter, sentence_level=True)
        columns = {
            r.name: sentence_scores(hyps, refs, m) for r, m in zip(results, per_metric.values())
        }
        sentences = [
            {"line": i + 1, **{k: v[i] for k, v in columns.items()}} for i in range(len(hyps))
        ]

    paired: list[PairedResult] = []
    if cfg.baseline:
        base_hyps = read_hypotheses(cfg.baseline, "baseline")
        if len(base_hyps) != len(hyps):
            raise NmtError(
                f"baseline {cfg.baseline}: {len(base_hyps)} lines, but hypothesis "
                f"{cfg.hyp} has {len(hyps)}; both systems must translate the same input"
            )
        paired = paired_test(
            (cfg.baseline, base_hyps),
            (cfg.hyp, hyps),
            refs,
            build_metrics(cfg.metrics, cfg.bleu, cfg.chrf, cfg.ter),
            test_type=cfg.paired_test,
            n_samples=cfg.paired_n,
        )

    if cfg.format == "json":
        out: dict[str, Any] = {
            "hyp": cfg.hyp,
            "refs": ref_paths,
            "lines": len(hyps),
            "scores": [asdict(r) for r in results],
        }
        if cfg.sentence_level:
            out["sentences"] = sentences
        if cfg.baseline:
            out["paired_test"] = {
                "type": cfg.paired_test,
                "baseline": cfg.baseline,
                "results": [asdict(p) for p in paired],
            }
        print(json.dumps(out, indent=1, ensure_ascii=False))
        return
    if cfg.sentence_level:
        names = [r.name for r in results]
        print("line\t" + "\t".join(names))
        for row in sentences:
            print(f"{row['line']}\t" + "\t".join(f"{row[n]:.{cfg.width}f}" for n in names))
    for r in results:
        print(r.line)
    if cfg.baseline:
        print("\n".join(_paired_text(paired, cfg.baseline, cfg.hyp, cfg.paired_test, cfg.width)))
