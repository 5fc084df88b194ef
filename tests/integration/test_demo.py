"""scripts/demo.sh end to end, shortened: preprocess, a few training updates, greedy
translation of the whole test split, scoring. The full demo (BLEU >= 90) is the same
script with its defaults."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def test_demo_pipeline_runs_and_ends_with_bleu(tmp_path):
    work = tmp_path / "demo"
    env = {
        **os.environ,
        "NMT_BIN": str(Path(sys.executable).parent),
        "DEMO_EPOCHS": "1",
        "DEMO_MAX_UPDATE": "8",
        "DEMO_BEAM": "1",
        "DEMO_THREADS": "1",
    }
    proc = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh"), str(work)],
        env=env,
        capture_output=True,
        text=True,
        timeout=600,
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    out = proc.stdout
    for stage in ("== 1/4 preprocess", "== 2/4 train", "== 3/4 translate", "== 4/4 score"):
        assert stage in out
    tests = (REPO / "data" / "demo" / "test.en").read_text(encoding="utf-8").splitlines()
    hyps = (work / "test.hyp.de").read_text(encoding="utf-8").splitlines()
    assert len(hyps) == len(tests)  # one translation per test line
    last = out.strip().splitlines()
    bleu = [line for line in last if line.startswith("BLEU|nrefs:1|")]
    assert len(bleu) == 1 and "version:" in bleu[0]
    assert "translated 500 sentences" in proc.stderr
    # The Python API on the demo's checkpoint gives nmt-generate's translations, line for line
    from nmt import Translator

    translator = Translator.from_checkpoint(
        work / "checkpoint_best.pt", device="cpu", threads=1, beam=1, max_len_a=1.5, max_len_b=10
    )
    assert translator.translate(tests) == hyps
    # Running again replaces the demo's own directory; a foreign directory is refused.
    foreign = tmp_path / "mine"
    foreign.mkdir()
    again = subprocess.run(
        ["bash", str(REPO / "scripts" / "demo.sh"), str(foreign)],
        env=env,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert again.returncode == 2 and "not made by demo.sh" in again.stderr
