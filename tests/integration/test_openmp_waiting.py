"""The console commands bound OpenMP's spinning before torch loads libgomp (nmt.cli,
OPENMP_SPIN_COUNT), and leave a user's own choice alone."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.cli import OPENMP_SPIN_COUNT, bound_openmp_spinning

REPO = Path(__file__).resolve().parents[2]

# Runs nmt-generate's main() in a fresh interpreter and prints GOMP_SPINCOUNT as it was at
# the moment torch (and with it libgomp, which reads the variable once) was first imported.
PROBE = """
import importlib.abc, os, sys
seen = []
class Watch(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name == "torch" and not seen:
            seen.append(os.environ.get("GOMP_SPINCOUNT", "unset"))
        return None
sys.meta_path.insert(0, Watch())
from nmt import cli
try:
    cli.main("generate", sys.argv[1:])
finally:
    print("GOMP_SPINCOUNT at torch import:", seen[0] if seen else "torch never imported")
"""


@pytest.mark.parametrize(
    ("environ", "expected"),
    [
        ({}, OPENMP_SPIN_COUNT),
        ({"OMP_WAIT_POLICY": "ACTIVE"}, None),
        ({"OMP_WAIT_POLICY": "PASSIVE"}, None),
        ({"GOMP_SPINCOUNT": "300000"}, "300000"),
    ],
)
def test_the_spin_count_is_set_only_where_the_user_chose_nothing(environ, expected):
    bound_openmp_spinning(environ, modules={})
    assert environ.get("GOMP_SPINCOUNT") == expected


def test_nothing_is_set_once_torch_is_loaded():
    environ: dict[str, str] = {}
    bound_openmp_spinning(environ, modules={"torch": object()})
    assert environ == {}  # too late for libgomp: it read the variable when torch loaded


@pytest.mark.parametrize(
    ("extra_env", "expected"),
    [({}, OPENMP_SPIN_COUNT), ({"OMP_WAIT_POLICY": "PASSIVE"}, "unset")],
)
def test_nmt_generate_sets_it_before_torch_loads(
    tiny_trained_checkpoint, tmp_path, extra_env, expected
):
    source = tmp_path / "in.txt"
    source.write_text("one two three\nfour five\n", encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if k not in ("OMP_WAIT_POLICY", "GOMP_SPINCOUNT")}
    env.update(extra_env, PYTHONPATH=str(REPO))
    out = tmp_path / "out.txt"
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            PROBE,
            f"checkpoint={tiny_trained_checkpoint}",
            f"input={source}",
            f"output={out}",
            "beam=2",
            "device=cpu",
            "threads=1",
            "progress=false",
        ],
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert done.returncode == 0, done.stderr
    assert f"GOMP_SPINCOUNT at torch import: {expected}" in done.stdout
    assert len(out.read_text(encoding="utf-8").splitlines()) == 2  # it translated
