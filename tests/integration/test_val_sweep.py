"""scripts/multi30k_val_sweep.sh: which run it scores, and its one-line errors.

The sweep's translations need a trained run (the slow recipe test makes one); these tests
give it no choice to score (AVGS=" "), so they check only how it finds the run dir.
"""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def sweep(work, **env_vars: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "WORK": str(work), "AVGS": " ", **env_vars}
    return subprocess.run(
        ["bash", "scripts/multi30k_val_sweep.sh"], cwd=REPO, env=env, capture_output=True, text=True
    )


def make_runs(work, *names: str) -> None:
    for name in names:
        run = work / "runs" / name
        run.mkdir(parents=True)
        (run / "checkpoint_last.pt").touch()


@pytest.mark.parametrize(
    ("direction", "both_ways", "runs", "chosen"),
    [
        ("en-de", {}, ["en_de_both"], "en_de_both"),  # the recipe's default run
        ("de-en", {}, ["en_de_both"], "en_de_both"),  # the same model translates de-en
        ("de-en", {}, ["en_de_both", "de_en_both"], "de_en_both"),  # its own direction's first
        ("de-en", {"BOTH_WAYS": "0"}, ["en_de_both", "de_en"], "de_en"),  # a one-way run
    ],
)
def test_the_sweep_scores_the_run_the_recipe_made(tmp_path, direction, both_ways, runs, chosen):
    make_runs(tmp_path, *runs)
    proc = sweep(tmp_path, DIRECTION=direction, **both_ways)
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == f"== multi30k_val_sweep [{direction}]: {tmp_path}/runs/{chosen}\n"


def test_a_missing_run_is_a_one_line_error(tmp_path):
    make_runs(tmp_path, "en_de")  # a one-way run does not serve the default (both ways)
    proc = sweep(tmp_path)
    assert proc.returncode == 2
    assert proc.stderr == (
        f"multi30k_val_sweep: error: {tmp_path}/runs/en_de_both/checkpoint_last.pt: missing;"
        " run scripts/multi30k_recipe.sh first\n"
    )


def test_a_bad_both_ways_is_a_one_line_error(tmp_path):
    proc = sweep(tmp_path, BOTH_WAYS="yes")
    assert proc.returncode == 2
    assert proc.stderr == "multi30k_val_sweep: error: BOTH_WAYS=yes: use 1 (both directions) or 0\n"
