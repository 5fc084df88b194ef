"""The distillation recipe: its student composes into the Multi30k run with the student's
depth, bad inputs stop it in one line, and (slow) scripts/distill.sh runs end to end in
SMOKE mode and reuses its finished steps when run again."""

from __future__ import annotations

import json
import math
import os
import subprocess
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from nmt.checkpoint import load_checkpoint
from nmt.cli import compose_config, to_dataclass

REPO = Path(__file__).resolve().parents[2]
MULTI30K = REPO.parent / "shared" / "data" / "multi30k"
PYTHON = REPO / ".venv" / "bin" / "python"
MODELS = [
    "teacher.fp32",
    "student_distilled.fp32",
    "student_distilled.int8",
    "student_references.fp32",
    "student_references.int8",
]


def compose_train(*overrides: str):
    return to_dataclass(
        compose_config("train", ["data=/nonexistent/data", "save_dir=/nonexistent/run", *overrides])
    )


def test_student_is_the_recipe_model_with_a_deep_encoder_and_one_decoder_layer():
    recipe = asdict(compose_train("+experiment=multi30k").model)
    student = compose_train("+experiment=multi30k", "model=transformer_student")
    # the command line's preset replaces the experiment's transformer_small; the
    # experiment's width, dropout and tying agree with the preset, so only the depth differs
    assert asdict(student.model) == {**recipe, "encoder_layers": 6, "decoder_layers": 1}
    assert (student.max_time, student.optim.schedule_unit) == (1.0, "time")  # the same budget


def run_recipe(tmp_path: Path, **env: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        ["bash", "scripts/distill.sh"],
        cwd=REPO,
        env={**os.environ, "WORK": str(tmp_path), "PYTHON": str(PYTHON), **env},
        capture_output=True,
        text=True,
        timeout=3600,
    )


def test_missing_raw_data_is_one_line(tmp_path):
    proc = run_recipe(tmp_path, RAW=str(tmp_path / "nowhere"))
    assert proc.returncode == 2
    assert proc.stderr == (
        f"distill: error: {tmp_path}/nowhere/train.en: missing; set RAW to the Multi30k task 1"
        " raw folder (download commands: scripts/multi30k_recipe.sh)\n"
    )


@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_missing_teacher_is_one_line(tmp_path):
    work = tmp_path / "work"
    proc = run_recipe(work, RAW=str(MULTI30K), TEACHER=str(tmp_path / "none.pt"))
    assert proc.returncode == 2
    assert proc.stderr.count("\n") == 1
    assert proc.stderr.startswith(f"distill: error: TEACHER={tmp_path}/none.pt: no such checkpoint")
    assert not work.exists()


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_smoke_mode_runs_end_to_end_and_reuses_its_steps(tmp_path):
    proc = run_recipe(tmp_path, RAW=str(MULTI30K), SMOKE="1")
    assert proc.returncode == 0, proc.stderr[-3000:]
    results = json.loads((tmp_path / "results.json").read_text())
    assert sorted(results["models"]) == sorted(MODELS)
    for name, row in results["models"].items():
        assert row["sentences"] == 100, name
        assert math.isfinite(row["bleu"]) and 0 <= row["bleu"] <= 100, name
        assert row["sentences_per_s"] > 0, name
        model, precision = name.split(".")
        hyps = (tmp_path / "eval" / f"{model}.{precision}.de").read_text(encoding="utf-8")
        assert len(hyps.splitlines()) == 100
    for line in ("teacher ", "student_distilled ", "student_references "):
        assert line in proc.stdout  # the table
    # the teacher translated every (SMOKE) training source: the distilled targets
    distilled = (tmp_path / "raw_distilled" / "train.de").read_text(encoding="utf-8")
    assert len(distilled.splitlines()) == 500
    # both students really are 6+1 layers, at the recipe's width
    for data in ("distilled", "references"):
        ckpt = load_checkpoint(tmp_path / "runs" / f"student_{data}" / "checkpoint_avg_last3.pt")
        layers = {k.split(".")[2] for k in ckpt["model"] if k.startswith("encoder.layers.")}
        assert len(layers) == 6
        layers = {k.split(".")[2] for k in ckpt["model"] if k.startswith("decoder.layers.")}
        assert layers == {"0"}
    teacher_took = time.perf_counter()
    again = run_recipe(tmp_path, RAW=str(MULTI30K), SMOKE="1")
    assert again.returncode == 0, again.stderr[-3000:]
    assert time.perf_counter() - teacher_took < 120  # nothing trained or translated again
    assert "exists, reusing it" in again.stderr
    assert json.loads((tmp_path / "results.json").read_text()) == results
