"""nmt-score: agreement with the sacrebleu CLI, statistics invariants, one-line errors."""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.cli import main

SACREBLEU = str(Path(sys.executable).parent / "sacrebleu")
WORDS = (
    "ein Mann eine Frau Hund läuft über die Straße im Park , . mit einem roten Ball spielt".split()
)


def _corpus(seed: int, n: int = 60) -> list[str]:
    rng = random.Random(seed)
    return [" ".join(rng.choice(WORDS) for _ in range(rng.randint(3, 12))) for _ in range(n)]


def _noisy(lines: list[str], seed: int, p: float) -> list[str]:
    """Each word dropped with probability p: a worse system the larger p is."""
    rng = random.Random(seed)
    return [" ".join(w for w in line.split() if rng.random() >= p) for line in lines]


@pytest.fixture
def files(tmp_path: Path) -> dict[str, Path]:
    ref = _corpus(1)
    out = {
        "ref": ref,
        "ref2": _noisy(ref, 2, 0.2),
        "hyp": _noisy(ref, 3, 0.1),
        "base": _noisy(ref, 4, 0.5),
    }
    paths = {}
    for name, lines in out.items():
        paths[name] = tmp_path / f"{name}.de"
        paths[name].write_text("\n".join(lines) + "\n", encoding="utf-8")
    return paths


def _score_json(capsys, *args: str) -> dict:
    main("score", [*args, "format=json"])
    return json.loads(capsys.readouterr().out)


def _sacrebleu_json(hyp: Path, refs: list[Path], *options: str) -> list[dict]:
    proc = subprocess.run(
        [SACREBLEU, *map(str, refs), "-i", str(hyp), "-f", "json", "-w", "6", *options],
        capture_output=True,
        text=True,
        check=True,
    )
    parsed = json.loads(proc.stdout)
    return parsed if isinstance(parsed, list) else [parsed]


@pytest.mark.parametrize(
    "extra,options",
    [
        ([], []),
        (
            ["bleu.tokenize=intl", "bleu.lowercase=true", "chrf.word_order=2"],
            ["--tokenize", "intl", "--lowercase", "--chrf-word-order", "2"],
        ),
    ],
)
def test_corpus_scores_equal_sacrebleu_cli(files, capsys, extra, options):
    refs = [files["ref"], files["ref2"]]
    ours = _score_json(
        capsys,
        f"hyp={files['hyp']}",
        f"refs=[{refs[0]},{refs[1]}]",
        "metrics=[bleu,chrf,ter]",
        *extra,
    )["scores"]
    theirs = _sacrebleu_json(files["hyp"], refs, "-m", "bleu", "chrf", "ter", *options)
    assert [s["name"] for s in ours] == [s["name"] for s in theirs]
    for mine, cli in zip(ours, theirs):
        assert round(mine["score"], 6) == pytest.approx(cli["score"], abs=1e-6)
        assert mine["signature"] == cli["signature"]


def test_text_output_has_signature_and_score(files, capsys):
    main("score", [f"hyp={files['hyp']}", f"refs={files['ref']}"])
    line = capsys.readouterr().out.strip()
    assert line.startswith("BLEU|nrefs:1|case:mixed|eff:no|tok:13a|smooth:exp|version:")
    assert " = " in line and "BP = " in line


def test_sentence_level_one_row_per_line_and_perfect_match_is_100(files, tmp_path, capsys):
    out = _score_json(
        capsys,
        f"hyp={files['ref']}",
        f"refs={files['ref']}",
        "sentence_level=true",
        "metrics=[bleu,chrf]",
    )
    assert len(out["sentences"]) == out["lines"] == 60
    assert all(
        row["BLEU"] == pytest.approx(100) and row["chrF2"] == pytest.approx(100)
        for row in out["sentences"]
    )
    # Corpus BLEU is unaffected by the sentence-level effective order.
    assert out["scores"][0]["signature"].split("|")[2] == "eff:no"


def test_bootstrap_interval_brackets_the_score(files, capsys):
    score = _score_json(
        capsys, f"hyp={files['hyp']}", f"refs={files['ref']}", "confidence=true", "confidence_n=200"
    )["scores"][0]
    assert score["ci"] > 0
    assert abs(score["mean"] - score["score"]) < 2 * score["ci"]
    assert "bs:200" in score["signature"]


@pytest.mark.parametrize("test_type", ["bs", "ar"])
def test_paired_test(files, capsys, test_type):
    n = "paired_n=200"
    better = _score_json(
        capsys,
        f"hyp={files['hyp']}",
        f"baseline={files['base']}",
        f"refs={files['ref']}",
        f"paired_test={test_type}",
        n,
    )["paired_test"]
    result = better["results"][0]
    assert result["system_score"] > result["baseline_score"]
    assert result["p_value"] < 0.05
    # Two systems with the same noise level (different draws) do not differ significantly
    # (sacrebleu gives identical systems the smallest p by design, so not those).
    near = files["hyp"].with_name("near.de")
    ref = files["ref"].read_text(encoding="utf-8").splitlines()
    near.write_text("\n".join(_noisy(ref, 5, 0.1)) + "\n", encoding="utf-8")
    same = _score_json(
        capsys,
        f"hyp={near}",
        f"baseline={files['hyp']}",
        f"refs={files['ref']}",
        f"paired_test={test_type}",
        n,
    )["paired_test"]
    assert same["results"][0]["p_value"] > 0.05


def _error(capsys, *args: str) -> str:
    with pytest.raises(SystemExit) as exc:
        main("score", list(args))
    assert exc.value.code == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and err.startswith("nmt-score: error: ")
    return err


def test_errors_are_one_line(files, tmp_path, capsys):
    missing = tmp_path / "missing.de"
    assert str(missing) in _error(capsys, f"hyp={missing}", f"refs={files['ref']}")
    assert str(missing) in _error(capsys, f"hyp={files['hyp']}", f"refs={missing}")

    short = tmp_path / "short.de"
    short.write_text("ein Mann\n", encoding="utf-8")
    err = _error(capsys, f"hyp={short}", f"refs={files['ref']}")
    assert "60 lines" in err and "has 1" in err and str(short) in err

    empty = tmp_path / "empty.de"
    empty.write_text("", encoding="utf-8")
    assert "empty" in _error(capsys, f"hyp={empty}", f"refs={files['ref']}")

    assert "refs" in _error(capsys, f"hyp={files['hyp']}")
    assert "meteor" in _error(
        capsys, f"hyp={files['hyp']}", f"refs={files['ref']}", "metrics=[bleu,meteor]"
    )
    assert "bleu.tokenize" in _error(
        capsys, f"hyp={files['hyp']}", f"refs={files['ref']}", "bleu.tokenize=nope"
    )


def test_output_file_holds_what_stdout_would_and_what_the_library_gives(files, tmp_path, capsys):
    from nmt.scoring import ScoreConfig, score

    args = [f"hyp={files['hyp']}", f"refs={files['ref']}", "metrics=[bleu,chrf]"]
    for fmt in ("text", "json"):
        main("score", [*args, f"format={fmt}"])
        stdout = capsys.readouterr().out
        out = tmp_path / f"report.{fmt}"
        main("score", [*args, f"format={fmt}", f"output={out}"])
        captured = capsys.readouterr()
        assert captured.out == "" and captured.err == f"nmt-score: wrote {out}\n"
        assert out.read_text(encoding="utf-8") == stdout
        report = score(
            ScoreConfig(hyp=str(files["hyp"]), refs=str(files["ref"]), metrics=["bleu", "chrf"])
        )
        assert stdout == report.render(fmt) + "\n"


def test_a_bad_output_is_one_line_and_writes_nothing(files, tmp_path, capsys):
    before = {p.name: p.read_bytes() for p in tmp_path.iterdir()}
    err = _error(capsys, f"hyp={files['hyp']}", f"refs={files['ref']}", f"output={files['hyp']}")
    assert f"output={files['hyp']}: is an input of this run" in err
    err = _error(
        capsys, f"hyp={files['hyp']}", f"refs={files['ref']}", f"output={tmp_path / 'no' / 'r'}"
    )
    assert "does not exist" in err
    assert {p.name: p.read_bytes() for p in tmp_path.iterdir()} == before


def test_option_mistakes_name_the_option_and_value(files, capsys):
    args = [f"hyp={files['hyp']}", f"refs={files['ref']}"]
    assert "format=xml: unknown; use one of text, json" in _error(capsys, *args, "format=xml")
    err = _error(capsys, *args, "confidence=true", "confidence_n=1")
    assert "confidence_n=1: must be 2 or more" in err
    assert "chrf.beta=0: must be 1 or more" in _error(capsys, *args, "chrf.beta=0")
