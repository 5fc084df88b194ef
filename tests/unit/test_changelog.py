"""CHANGELOG.md keeps its promise: every deprecated name the CLI still rewrites is listed
with its new name and the release that removes it, the release under way is the package's
version, and no deprecated name outlives its removal release."""

from __future__ import annotations

import re
from pathlib import Path

import nmt
from nmt.config import DEPRECATED_KEYS

REPO = Path(__file__).resolve().parents[2]
CHANGELOG = (REPO / "CHANGELOG.md").read_text(encoding="utf-8")


def _version(text: str) -> tuple[int, ...]:
    return tuple(int(part) for part in text.split("."))


def test_the_first_release_listed_is_the_package_version():
    first = re.search(r"^## (\d+\.\d+\.\d+)", CHANGELOG, re.MULTILINE)
    assert first, "CHANGELOG.md has no '## X.Y.Z' release heading"
    pyproject = (REPO / "pyproject.toml").read_text(encoding="utf-8")
    project = re.search(r'^version = "([^"]+)"', pyproject, re.MULTILINE)  # no tomllib on 3.10
    assert project and first.group(1) == nmt.__version__ == project.group(1)


def test_every_deprecated_name_is_listed_with_its_new_name_and_removal():
    rows = set(
        re.findall(r"^\| (?:nmt-\S+ )?`([^`]+)` \| `([^`]+)`[^|]* \| (\S+) \|$", CHANGELOG, re.M)
    )
    missing = [
        f"{command}: {old} -> {new} (removed in {removal})"
        for command, aliases in DEPRECATED_KEYS.items()
        for old, (new, removal) in aliases.items()
        if (old, new, removal) not in rows
    ]
    assert not missing, f"CHANGELOG.md lacks a row for: {missing}"


def test_no_deprecated_name_outlives_its_removal_release():
    overdue = [
        f"{command}: {old}"
        for command, aliases in DEPRECATED_KEYS.items()
        for old, (_, removal) in aliases.items()
        if _version(nmt.__version__) >= _version(removal)
    ]
    assert not overdue, f"remove these deprecated names (their release is here): {overdue}"
