"""Import a second copy of nmt from a git revision, for benchmarks that interleave two code
versions in one process (bench_train_paired.py, bench_generate_paired.py).

On a shared machine the speed drifts by 10-20% within minutes, more than most changes
gain; running both versions in turns, in one process, makes the drift hit them alike.
"""

from __future__ import annotations

import re
import subprocess
import sys
import tarfile
import tempfile
from io import BytesIO
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]


def export_revision(rev: str, dest: Path) -> None:
    """Write nmt/ and configs/ of `rev` under dest, with nmt renamed to nmt_before."""
    done = subprocess.run(
        ["git", "-C", str(REPO), "archive", rev, "nmt", "configs"], capture_output=True
    )
    if done.returncode != 0:
        sys.exit(
            f"--before {rev}: not a revision of this repository "
            f"({done.stderr.decode(errors='replace').strip().splitlines()[-1]})"
        )
    archive = done.stdout
    with tarfile.open(fileobj=BytesIO(archive)) as tar:
        tar.extractall(dest, filter="data")
    (dest / "nmt").rename(dest / "nmt_before")
    for path in (dest / "nmt_before").rglob("*.py"):
        text = re.sub(r"\b(from|import) nmt\b", r"\1 nmt_before", path.read_text())
        path.write_text(re.sub(r'"nmt\.', '"nmt_before.', text))


def import_both(rev: str) -> None:
    """Make `nmt_before` (revision `rev`) and `nmt` (the working tree) importable."""
    tmp = Path(tempfile.mkdtemp())
    export_revision(rev, tmp)
    sys.path[:0] = [str(tmp), str(REPO), str(REPO / "scripts")]
