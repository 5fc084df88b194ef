"""scripts/multi30k_multilingual.sh: (slow) the SMOKE run end to end with its results.json,
a rerun that trains nothing more, and its one-line errors for bad settings and missing
files."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
DIRECTIONS = ["en-de", "en-fr", "de-en", "de-fr", "fr-en", "fr-de"]


def run_recipe(env: dict[str, str], *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/multi30k_multilingual.sh", *args],
        cwd=REPO,
        env={**os.environ, "PYTHON": str(REPO / ".venv" / "bin" / "python"), **env},
        capture_output=True,
        text=True,
        timeout=1800,
    )


def stops(run: Path) -> list[dict]:
    events = [json.loads(line) for line in (run / "train.jsonl").open(encoding="utf-8")]
    return [e for e in events if e["type"] == "stop"]


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.fr").is_file(), reason="needs ../shared/data/multi30k")
def test_smoke_run_scores_every_direction_and_reruns_without_training(tmp_path):
    env = {"SMOKE": "1", "WORK": str(tmp_path), "RAW": str(MULTI30K)}
    proc = run_recipe(env)
    assert proc.returncode == 0, proc.stderr[-3000:]

    results = json.loads((tmp_path / "results.json").read_text())
    run = tmp_path / "runs" / "multilingual"
    assert results["checkpoint"] == str(run / "checkpoint_avg_last3.pt")
    assert Path(results["checkpoint"]).is_file()
    assert sorted(results["bleu"]) == sorted(DIRECTIONS) == sorted(results["off_target"])
    assert all(0 <= b <= 100 for b in results["bleu"].values())
    assert all(0 <= share <= 1 for share in results["off_target"].values())
    assert results["lines"] == dict.fromkeys(DIRECTIONS, 100)
    for direction in DIRECTIONS:  # the table printed is the file's
        line = next(x for x in proc.stdout.splitlines() if x.startswith(direction + " "))
        assert f"{results['bleu'][direction]:.1f}" in line
    meta = json.loads((tmp_path / "data-bin" / "multilingual" / "meta.json").read_text())
    assert meta["langs"] == ["en", "de", "fr"] and sorted(meta["directions"]) == sorted(DIRECTIONS)
    valid = [
        json.loads(line)
        for line in (run / "train.jsonl").open(encoding="utf-8")
        if '"valid"' in line
    ]
    assert valid and sorted(valid[-1]["directions"]) == sorted(DIRECTIONS)

    # a rerun reuses the data dir and the finished run: not one update more
    updates = stops(run)[-1]["update"]
    again = run_recipe(env)
    assert again.returncode == 0, again.stderr[-3000:]
    assert "exists, reusing it" in again.stderr
    assert stops(run)[-1]["update"] == updates


@pytest.mark.parametrize(
    ("env", "message"),
    [
        ({"LANGS": "en"}, "LANGS=en: give two or more language codes"),
        ({"VOCAB": "8k"}, "VOCAB=8k: give a positive whole number"),
        ({"LANG_TAG": "source"}, "LANG_TAG=source: use tgt, src_tgt or decoder"),
        ({"LANGS": "en xx"}, "/train.xx: missing; every language of LANGS needs"),
    ],
)
def test_bad_settings_are_one_line_errors(tmp_path, env, message):
    proc = run_recipe({"WORK": str(tmp_path / "work"), "RAW": str(MULTI30K), **env})
    assert proc.returncode == 2
    lines = proc.stderr.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("multi30k_multilingual: error: ")
    assert message in lines[0]
    assert not (tmp_path / "work").exists()
