"""scripts/backtranslate.sh: (slow) the SMOKE run end to end, and its rerun that reuses every
step; its one-line errors for bad settings and missing inputs."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import time
from pathlib import Path

import pytest
import sentencepiece as spm

REPO = Path(__file__).resolve().parents[2]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
TAG = "<BT>"


def run_recipe(env: dict[str, str]) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/backtranslate.sh"],
        cwd=REPO,
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=1800,
    )


def digests(folder: Path) -> dict[str, str]:
    return {
        str(p.relative_to(folder)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(folder.rglob("*"))
        if p.is_file()
    }


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_smoke_run_back_translates_with_a_tag_and_reruns_without_change(tmp_path):
    env = {
        "SMOKE": "1",
        "WORK": str(tmp_path),
        "RAW": str(MULTI30K),
        "PYTHON": str(REPO / ".venv" / "bin" / "python"),
    }
    start = time.monotonic()
    proc = run_recipe(env)
    first_seconds = time.monotonic() - start
    assert proc.returncode == 0, proc.stderr[-2000:]

    results = json.loads((tmp_path / "results.json").read_text())
    assert (results["direction"], results["test"], results["test_lines"]) == (
        "en-de",
        "test_2016_flickr",
        100,
    )
    assert results["smoke"] is True
    base, bt = results["baseline_bleu"], results["backtranslation_bleu"]
    assert 0 <= base <= 100 and 0 <= bt <= 100
    assert results["gain"] == round(bt - base, 2)
    assert results["signature"].startswith("nrefs:1|case:mixed|eff:no|tok:13a")
    assert results["settings"] == {
        "bt_search": "beam",
        "tag": True,
        "bt_weight": 1.0,
        "avg": 3,
        "beam": 5,
        "lenpen": 1.6,
        "vocab": 8000,
        "train_args": [],
    }
    # the first half of train is parallel, the second half's German side is the monolingual text
    en = (MULTI30K / "train.en").read_text(encoding="utf-8").splitlines(keepends=True)
    de = (MULTI30K / "train.de").read_text(encoding="utf-8").splitlines(keepends=True)
    half = len(en) // 2
    text = tmp_path / "text"
    assert (text / "half.en").read_text(encoding="utf-8") == "".join(en[:half])
    assert (text / "half.de").read_text(encoding="utf-8") == "".join(de[:half])
    assert (text / "mono.de").read_text(encoding="utf-8") == "".join(de[half:])
    assert results["parallel_pairs"] == half and results["monolingual_lines"] == 200

    # every synthetic source line starts with the tag; its target is a monolingual line, in order
    sources = (text / "synthetic.beam_tag.en").read_text(encoding="utf-8").splitlines()
    targets = (text / "synthetic.beam_tag.de").read_text(encoding="utf-8").splitlines()
    assert 0 < len(sources) == len(targets) == results["synthetic_pairs"] <= 200
    assert all(line.startswith(TAG + " ") and line != TAG + " " for line in sources)
    mono = iter(line.rstrip("\n") for line in de[half : half + 200])
    assert all(target in mono for target in targets)  # a subsequence: only empty ones dropped

    # the tag is one piece of the forward model's SentencePiece model, and only of that one
    bt_spm = spm.SentencePieceProcessor(
        model_file=str(tmp_path / "data-bin" / "en_de_bt_beam_tag" / "spm.model")
    )
    assert bt_spm.piece_to_id(TAG) != bt_spm.unk_id()
    assert TAG in bt_spm.encode(sources[0], out_type=str)
    base_spm = spm.SentencePieceProcessor(
        model_file=str(tmp_path / "data-bin" / "en_de" / "spm.model")
    )
    assert base_spm.piece_to_id(TAG) == base_spm.unk_id()

    for run in ("en_de", "en_de_bt_beam_tag_w1"):
        hyps = (tmp_path / "runs" / run / "test_2016_flickr.hyp.de").read_text(encoding="utf-8")
        assert len(hyps.splitlines()) == 100
    assert "baseline (half parallel)" in proc.stdout and "+ back-translation" in proc.stdout

    # the same command again reuses every step: nothing retrained, retranslated or rewritten
    before = digests(tmp_path)
    start = time.monotonic()
    again = run_recipe(env)
    assert again.returncode == 0, again.stderr[-2000:]
    assert time.monotonic() - start < first_seconds / 3
    assert digests(tmp_path) == before
    assert "training into" not in again.stderr and "translating" not in again.stderr
    assert again.stdout.splitlines()[-4:] == proc.stdout.splitlines()[-4:]  # the same table


@pytest.mark.parametrize(
    ("setting", "message"),
    [
        ("BT_SEARCH=greedy", "BT_SEARCH=greedy: use beam or sampling"),
        ("TAG=yes", "TAG=yes: use 1 (tagged back-translation) or 0"),
        (
            "BT_WEIGHT=0",
            "BT_WEIGHT=0: give a positive number (1: each synthetic pair once an epoch)",
        ),
        (
            "BT_WEIGHT=x",
            "BT_WEIGHT=x: give a positive number (1: each synthetic pair once an epoch)",
        ),
        ("AVG=0", "AVG=0: give a positive whole number"),
    ],
)
def test_a_bad_setting_is_one_line_and_writes_nothing(tmp_path, setting, message):
    key, value = setting.split("=")
    proc = run_recipe({key: value, "WORK": str(tmp_path / "work")})
    assert (proc.returncode, proc.stderr) == (2, f"backtranslate: error: {message}\n")
    assert not (tmp_path / "work").exists()


def test_a_missing_input_is_named_in_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("train.en", "train.de", "val.en", "val.de", "test_2016_flickr.en"):
        (raw / name).write_text("a\nb\n", encoding="utf-8")
    proc = run_recipe({"RAW": str(raw), "WORK": str(tmp_path / "work")})
    assert proc.returncode == 2
    assert proc.stderr.startswith(f"backtranslate: error: {raw}/test_2016_flickr.de: missing;")
    assert proc.stderr.count("\n") == 1
    assert not (tmp_path / "work").exists()


def test_train_files_of_different_lengths_are_refused_in_one_line(tmp_path):
    raw = tmp_path / "raw"
    raw.mkdir()
    for name in ("val.en", "val.de", "test_2016_flickr.en", "test_2016_flickr.de", "train.en"):
        (raw / name).write_text("a\nb\n", encoding="utf-8")
    (raw / "train.de").write_text("a\nb\nc\n", encoding="utf-8")
    proc = run_recipe({"RAW": str(raw), "WORK": str(tmp_path / "work")})
    assert (proc.returncode, proc.stderr) == (
        2,
        f"backtranslate: error: {raw}/train.en has 2 lines but {raw}/train.de has 3;"
        " give line-aligned files\n",
    )
