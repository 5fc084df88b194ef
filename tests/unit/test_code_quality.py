"""The code's own rules, checked on every test run (and so by CI): ruff's lint and format,
and mypy on nmt/. The layering of the packages (Hydra only in the CLI layer among them) is
tests/unit/test_layers.py's."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def _tool(name: str) -> str:
    found = shutil.which(name, path=str(Path(sys.executable).parent)) or shutil.which(name)
    if found is None:
        pytest.fail(f"{name} is not installed; run scripts/setup.sh (it installs the test extras)")
    return found


@pytest.mark.parametrize(
    "command",
    [["ruff", "check", "."], ["ruff", "format", "--check", "."], ["mypy"]],
    ids=["ruff-lint", "ruff-format", "mypy"],
)
def test_lint_format_and_types(command):
    """ruff with pyproject.toml's rules; mypy on nmt/ (pyproject.toml's [tool.mypy])."""
    done = subprocess.run(
        [_tool(command[0]), *command[1:]], cwd=REPO, capture_output=True, text=True
    )
    assert done.returncode == 0, (done.stdout + done.stderr)[-3000:]
