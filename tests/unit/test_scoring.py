"""nmt.scoring as a library: score(cfg) -> ScoreReport, its renderings, the report file,
and ScoreConfig.validate()'s messages (option=value: what is wrong; what to do)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from nmt.errors import NmtError
from nmt.scoring import (
    BleuOptions,
    ScoreConfig,
    corpus_bleu,
    read_hypotheses,
    score,
    write_report,
)

REF = ["the cat sat on the mat", "a dog runs in the park", "two men are talking"]
HYP = ["the cat sat on a mat", "a dog runs in a park", "two men talk"]
BASE = ["a cat", "the dog", "men"]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    out = {}
    for name, lines in (("ref", REF), ("hyp", HYP), ("base", BASE)):
        out[name] = tmp_path / f"{name}.txt"
        out[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return out


def _cfg(files: dict[str, Path], **options) -> ScoreConfig:
    return ScoreConfig(hyp=str(files["hyp"]), refs=[str(files["ref"])], **options)


def test_the_report_holds_sacrebleus_scores(files):
    report = score(_cfg(files, metrics=["bleu", "chrf", "ter"]))
    assert (report.hyp, report.refs, report.lines) == (str(files["hyp"]), [str(files["ref"])], 3)
    assert [r.name for r in report.scores] == ["BLEU", "chrF2", "TER"]
    bleu = corpus_bleu(HYP, [REF])  # the helper validation and nmt-generate use
    assert report.scores[0].score == bleu.score and report.scores[0].signature == bleu.signature
    assert report.sentences is None and report.paired is None
    assert report.to_text().splitlines() == [r.line for r in report.scores]


def test_a_single_reference_may_be_a_string(files):
    as_list = score(_cfg(files))
    as_str = score(ScoreConfig(hyp=str(files["hyp"]), refs=str(files["ref"])))
    assert as_list == as_str


def test_json_is_the_report_as_a_dict(files):
    report = score(_cfg(files, sentence_level=True, baseline=str(files["base"]), paired_n=50))
    parsed = json.loads(report.render("json"))
    assert parsed == report.to_dict()
    assert [row["line"] for row in parsed["sentences"]] == [1, 2, 3]
    assert parsed["paired_test"]["baseline"] == str(files["base"])
    result = parsed["paired_test"]["results"][0]
    assert result["system_score"] > result["baseline_score"]
    text = report.render("text").splitlines()
    assert text[0] == "line\tBLEU" and len(text) == 1 + 3 + 1 + 3  # table, score, paired test
    assert text[5].startswith("paired bootstrap resampling: BLEU|")


def test_sentence_scores_of_a_perfect_copy_are_100(files):
    report = score(
        ScoreConfig(hyp=str(files["ref"]), refs=[str(files["ref"])], sentence_level=True)
    )
    assert [row["BLEU"] for row in report.sentences or []] == [pytest.approx(100)] * 3


def test_write_report_to_a_file_or_stdout(files, tmp_path, capsys):
    report = score(_cfg(files, metrics=["bleu", "chrf"]))
    out = tmp_path / "report.json"
    write_report(report, str(out), "json")
    assert out.read_text(encoding="utf-8") == report.to_json() + "\n"
    write_report(report, "-", "text")
    assert capsys.readouterr().out == report.to_text() + "\n"
    out.write_text("old", encoding="utf-8")
    write_report(report, str(out), "text")  # replaced whole
    assert out.read_text(encoding="utf-8") == report.to_text() + "\n"
    assert sorted(p.name for p in tmp_path.iterdir()) == sorted(
        ["ref.txt", "hyp.txt", "base.txt", "report.json"]
    )  # no temporaries left


def test_a_bad_output_is_refused_before_scoring(files, tmp_path):
    with pytest.raises(NmtError, match=r"^output=.*: the folder .*missing does not exist; create"):
        score(_cfg(files, output=str(tmp_path / "missing" / "r.txt")))
    with pytest.raises(NmtError, match=r"^output=.*: is a directory; give a file name"):
        score(_cfg(files, output=str(tmp_path)))
    before = files["hyp"].read_bytes()
    with pytest.raises(NmtError, match=r"^output=.*hyp\.txt: is an input of this run"):
        score(_cfg(files, output=str(files["hyp"])))
    assert files["hyp"].read_bytes() == before


@pytest.mark.parametrize(
    "options, message",
    [
        (dict(hyp=None), "hyp=null: required; give the hypothesis file"),
        (dict(refs=None), "refs=null: no file given; pass refs=FILE or refs=[FILE1,FILE2]"),
        (dict(refs=[]), "refs=[]: no file given; pass refs=FILE"),
        (dict(refs=[3]), "refs=3: not a file name; pass refs=FILE"),
        (dict(metrics=[]), "metrics=[]: empty; choose from bleu, chrf, ter"),
        (dict(metrics="bleu"), "metrics=bleu: a list is needed; write metrics=[bleu]"),
        (
            dict(metrics=["bleu", "meteor"]),
            "metrics=[bleu,meteor]: unknown metric 'meteor'; choose from bleu, chrf, ter",
        ),
        (
            dict(bleu=BleuOptions(tokenize="nope")),
            "bleu.tokenize=nope: unknown tokenizer; use one of",
        ),
        (dict(bleu=BleuOptions(smooth_method="x")), "bleu.smooth_method=x: unknown; use one of"),
        (dict(bleu=BleuOptions(max_ngram_order=0)), "bleu.max_ngram_order=0: must be 1 or more"),
        (dict(format="xml"), "format=xml: unknown; use one of text, json"),
        (dict(confidence=True, confidence_n=1), "confidence_n=1: must be 2 or more"),
        (dict(paired_test="t"), "paired_test=t: unknown; use bs (paired bootstrap"),
        (dict(paired_n=-1), "paired_n=-1: must not be negative; use 0 for sacrebleu's default"),
        (dict(width=-1), "width=-1: must not be negative"),
        (dict(output=""), "output='': empty; give a file name, or - for stdout"),
        (dict(hyp="-", refs=["-"]), "refs=-: stdin is already read as hyp=-; give the other"),
    ],
)
def test_impossible_options_are_named_in_the_option_style(files, options, message):
    cfg = _cfg(files, **{k: v for k, v in options.items() if k not in ("hyp", "refs")})
    if "hyp" in options:
        cfg.hyp = options["hyp"]
    if "refs" in options:
        cfg.refs = options["refs"]
    with pytest.raises(NmtError, match="^" + re.escape(message)):
        cfg.validate()
    with pytest.raises(NmtError, match="^" + re.escape(message)):
        score(cfg)  # the library checks configs built in Python itself


def test_file_mistakes_name_the_file(files, tmp_path):
    missing = tmp_path / "missing.txt"
    with pytest.raises(NmtError, match=f"^{re.escape(str(missing))}: no such file; give a text"):
        score(ScoreConfig(hyp=str(missing), refs=[str(files["ref"])]))
    short = tmp_path / "short.txt"
    short.write_text("one line\n", encoding="utf-8")
    with pytest.raises(NmtError, match=r"ref\.txt: 3 lines, but the hypothesis file .* has 1"):
        score(ScoreConfig(hyp=str(short), refs=[str(files["ref"])]))
    with pytest.raises(NmtError, match=r"short\.txt: 1 lines, but the hypothesis file .* has 3"):
        score(_cfg(files, baseline=str(short)))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    with pytest.raises(NmtError, match=r"empty\.txt: the file is empty, nothing to score"):
        read_hypotheses(str(empty))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Stra\xdfe\n".encode("latin-1") * 3)
    with pytest.raises(
        NmtError, match=r"latin1\.txt:1: invalid UTF-8 \(.* at byte 5 of the line\); fix the line"
    ):
        score(ScoreConfig(hyp=str(latin1), refs=[str(files["ref"])]))
