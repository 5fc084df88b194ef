"""The code's own rules, checked on every test run (and so by CI): the layering of the
packages, ruff's lint and format, and mypy on nmt/."""

from __future__ import annotations

import ast
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CLI_LAYER = ("nmt/cli.py", "nmt/config.py", "nmt/config_errors.py", "nmt/commands/")
FORBIDDEN_IN_LIBRARY = ("hydra", "nmt.commands", "nmt.cli", "nmt.config")


def _imports(path: Path) -> list[str]:
    """Every module `path` imports, at any depth (function-level imports included)."""
    names = []
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names += [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names += [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
    return names


def _library_modules() -> list[Path]:
    return [
        p
        for p in sorted((REPO / "nmt").rglob("*.py"))
        if not p.relative_to(REPO).as_posix().startswith(CLI_LAYER)
    ]


def test_no_library_module_imports_the_cli_layer_or_hydra():
    offenders = [
        f"{path.relative_to(REPO)} imports {name}"
        for path in _library_modules()
        for name in _imports(path)
        if any(name == m or name.startswith(f"{m}.") for m in FORBIDDEN_IN_LIBRARY)
    ]
    assert not offenders, "\n".join(offenders)


def test_the_layering_check_sees_a_violation(tmp_path):
    bad = tmp_path / "bad.py"
    bad.write_text("def f():\n    from nmt.commands.generate import run\n    import hydra.utils\n")
    assert {"nmt.commands.generate", "hydra.utils"} <= set(_imports(bad))


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
