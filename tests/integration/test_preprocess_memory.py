"""nmt-preprocess's memory does not grow with the corpus: peak RSS of the command (its main
process, and the largest of its children: encoding workers, SentencePiece trainer) on a
corpus 5 times larger stays within a few MB, while training SentencePiece on every
sentence (the old default) grows with it, which shows the measurement can tell. Both
corpora are larger than the blocks the scan reads (4 MB), so the comparison is between
two sizes where only the corpus changes."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MIB = 1 << 20

_RUNNER = """
import json, resource, sys
from nmt.cli import main
try:
    main("preprocess", sys.argv[1:])
except SystemExit as exc:
    assert not exc.code, exc.code
me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
print(json.dumps([me.ru_maxrss * 1024, kids.ru_maxrss * 1024]))
"""


def _corpus(folder: Path, pairs: int) -> Path:
    subprocess.run(
        [
            sys.executable,
            "-m",
            "benchmarks.make_corpus",
            "--pairs",
            str(pairs),
            "--out",
            str(folder / "train"),
        ],
        cwd=REPO,
        check=True,
        capture_output=True,
    )
    return folder / "train"


def _peak_rss(prefix: Path, dest: Path, *extra: str) -> tuple[int, int]:
    """(main process, largest child) peak RSS in bytes."""
    argv = [
        f"data.trainpref={prefix}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest={dest}",
        "spm.vocab_size=500",
        "spm.input_sentence_size=4000",
        "workers=2",
        "chunk_lines=2000",
        *extra,
    ]
    proc = subprocess.run(
        [sys.executable, "-c", _RUNNER, *argv], capture_output=True, text=True, timeout=600
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    main, child = json.loads(proc.stdout.strip().splitlines()[-1])
    return main, child


def test_peak_memory_is_the_same_for_a_corpus_5_times_larger(tmp_path: Path) -> None:
    small = _corpus(tmp_path / "small", 40_000)  # ~6 MB a side
    large = _corpus(tmp_path / "large", 200_000)  # ~30 MB a side
    small_rss = _peak_rss(small, tmp_path / "d-small")
    large_rss = _peak_rss(large, tmp_path / "d-large")
    grown = [(b - a) / MIB for a, b in zip(small_rss, large_rss)]
    assert grown[0] < 16 and grown[1] < 16, f"main +{grown[0]:.1f} MiB, child +{grown[1]:.1f} MiB"
    # the control: SentencePiece on all 400,000 sentences holds them (the old default)
    everything = _peak_rss(large, tmp_path / "d-all", "spm.input_sentence_size=0")
    assert (everything[1] - large_rss[1]) / MIB > 40
