"""Docs that are tested: every package's docstring lists the modules that exist, one line
each (`name.py  its job`, a subpackage or folder as `name/`), and the console commands
are the ones nmt.config.COMMANDS lists."""

from __future__ import annotations

import ast
import importlib.metadata
import re
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
PACKAGES = sorted(p.parent for p in (REPO / "nmt").rglob("__init__.py"))
# a docstring line that names a module or folder, then says its job
LISTED = re.compile(r"^(\w+\.py|\w+/) {2,}\S")


def listed(docstring: str) -> list[str]:
    return [m.group(1) for line in docstring.splitlines() if (m := LISTED.match(line))]


def on_disk(package: Path) -> set[str]:
    modules = {p.name for p in package.glob("*.py") if p.name != "__init__.py"}
    folders = {f"{p.name}/" for p in package.iterdir() if p.is_dir() and p.name != "__pycache__"}
    return modules | folders


def test_every_folder_under_nmt_with_python_is_a_package():
    loose = sorted(
        str(folder.relative_to(REPO))
        for folder in {p.parent for p in (REPO / "nmt").rglob("*.py")}
        if not (folder / "__init__.py").is_file()
    )
    assert not loose, f"add an __init__.py (its docstring lists the modules): {loose}"


@pytest.mark.parametrize("package", PACKAGES, ids=lambda p: str(p.relative_to(REPO)))
def test_the_package_docstring_lists_the_modules_that_exist(package):
    init = package / "__init__.py"
    doc = ast.get_docstring(ast.parse(init.read_text(encoding="utf-8"))) or ""
    names = listed(doc)
    assert len(names) == len(set(names)), f"{init.relative_to(REPO)}: a module listed twice"
    missing, stale = on_disk(package) - set(names), set(names) - on_disk(package)
    assert not missing and not stale, (
        f"{init.relative_to(REPO)}: its docstring must list each module on its own line "
        f"('name.py  its job'); not listed: {sorted(missing)}; listed but gone: {sorted(stale)}"
    )


def test_the_listing_pattern_reads_module_lines_only():
    doc = "Intro text.py here\n\nbuild.py   builds\njob.py io.py  two on a line\nstatic/  page\n"
    assert listed(doc) == ["build.py", "static/"]


def test_each_command_has_its_module_entry_point_and_console_script():
    from nmt import cli
    from nmt.config import COMMANDS

    # sweep.py is nmt-train -m, the one module of the layer that is not a command
    modules = {p.stem for p in (REPO / "nmt" / "commands").glob("*.py")} - {"__init__", "sweep"}
    assert modules == set(COMMANDS)
    scripts = {
        ep.name: ep.value
        for ep in importlib.metadata.distribution("nmt").entry_points
        if ep.group == "console_scripts"
    }
    assert scripts == {f"nmt-{name.replace('_', '-')}": f"nmt.cli:{name}_main" for name in COMMANDS}
    assert all(callable(getattr(cli, f"{name}_main", None)) for name in COMMANDS)
