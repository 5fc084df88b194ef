"""The records in docs/ stay what they promise to be.

docs/results.md holds what is true now (short, each table with its machine, date, commit
and command; no tuning table showing test BLEU), dated studies live in docs/journal/,
docs/reliability.md names only tests that exist, and docs/environment.md names exactly the
NMT_* variables the code reads.
"""

from __future__ import annotations

import ast
import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
DOCS = REPO / "docs"
RESULTS = DOCS / "results.md"
RELIABILITY = DOCS / "reliability.md"
ENVIRONMENT = DOCS / "environment.md"
JOURNAL = DOCS / "journal"

RESULTS_MAX_LINES = 300
RECORD_LINES = ("Machine:", "Date:", "Commit:", "Command:")
RELIABILITY_AREAS = [
    "Inputs",
    "Outputs and overwrite",
    "Signals and kills",
    "Checkpoints and resume",
    "Distributed",
    "Numerics",
]


def sections(text: str, level: int) -> dict[str, list[str]]:
    """Heading title -> its lines, for the headings of `level` (#'s) outside code blocks."""
    out: dict[str, list[str]] = {}
    current: list[str] | None = None
    fenced = False
    for line in text.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and re.match(rf"#{{1,{level}}} ", line):
            current = None
            if line.startswith("#" * level + " "):
                current = out.setdefault(line[level + 1 :].strip(), [])
                continue
        if current is not None:
            current.append(line)
    return out


def tables(lines: list[str]) -> list[list[list[str]]]:
    """The Markdown tables among `lines`: each a list of rows of stripped cells (the
    header first, the --- row left out)."""
    found: list[list[list[str]]] = []
    rows: list[list[str]] = []
    for line in [*lines, ""]:
        if line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split("|")]
            if not all(re.fullmatch(r":?-+:?", c) for c in cells):
                rows.append(cells)
        elif rows:
            found.append(rows)
            rows = []
    return found


def slug(title: str) -> str:
    """GitHub's anchor for a heading."""
    return re.sub(r"[^\w\- ]", "", title.strip().lower()).replace(" ", "-")


def test_results_is_short_and_speaks_of_what_is_true_now():
    text = RESULTS.read_text(encoding="utf-8")
    assert len(text.splitlines()) <= RESULTS_MAX_LINES, (
        "docs/results.md: keep what is true now; move dated studies to docs/journal/"
    )
    for stale in (r"\bissue \d+", r"\bthis change\b"):
        hits = [line for line in text.splitlines() if re.search(stale, line, re.IGNORECASE)]
        assert not hits, hits


def test_every_table_of_results_names_its_machine_date_commit_and_command():
    for title, lines in sections(RESULTS.read_text(encoding="utf-8"), 2).items():
        found = tables(lines)
        if not found:
            continue
        for label in RECORD_LINES:
            values = [line[len(label) :].strip() for line in lines if line.startswith(label)]
            assert values and values[0], f"results.md, {title!r}: no {label!r} line"
            if values[0].startswith("per row"):
                column = label[:-1].lower()
                for rows in found:
                    header = [cell.lower() for cell in rows[0]]
                    assert column in header, f"results.md, {title!r}: {label} per row, no column"


def test_no_tuning_table_shows_test_bleu():
    by_title = sections(RESULTS.read_text(encoding="utf-8"), 2)
    tried = by_title["Tried, not adopted"]
    assert tables(tried), "results.md: the 'Tried, not adopted' table is missing"
    for rows in tables(tried):
        header = [cell.lower() for cell in rows[0]]
        assert any(cell.startswith("δ val bleu") for cell in header), header
        assert not any("test" in cell for cell in header), header
        for row in rows[1:]:
            assert not any(re.search(r"\btest\b", cell, re.IGNORECASE) for cell in row), row
    for title, lines in by_title.items():
        for rows in tables(lines):
            header = " ".join(rows[0]).lower()
            assert not ("val" in header and "test" in header), (
                f"results.md, {title!r}: a table showing val and test BLEU side by side"
            )


def markdown_files() -> list[Path]:
    """Every document a reader follows links in: the README, the pages beside it, docs/
    and the journal."""
    top = [REPO / name for name in ("README.md", "CONTRIBUTING.md", "CHANGELOG.md")]
    return [*top, *sorted(DOCS.glob("*.md")), *sorted(JOURNAL.glob("*.md"))]


@pytest.mark.parametrize("page", markdown_files(), ids=lambda p: str(p.relative_to(REPO)))
def test_every_relative_link_resolves(page):
    text = page.read_text(encoding="utf-8")
    for target in re.findall(r"\]\(([^)\s]+)\)", text):
        if re.match(r"[a-z]+:", target):
            continue  # http:, https:, mailto:
        path, _, anchor = target.partition("#")
        linked = (page.parent / path).resolve() if path else page
        assert linked.is_file(), f"{page.name}: link to {target}: no such file"
        if anchor and linked.suffix == ".md":
            titles = re.findall(r"^#+ (.+)$", linked.read_text(encoding="utf-8"), re.MULTILINE)
            assert anchor in {slug(t) for t in titles}, f"{page.name}: no heading #{anchor}"


def test_the_journal_index_lists_every_entry():
    index = (JOURNAL / "README.md").read_text(encoding="utf-8")
    listed = set(re.findall(r"\]\(([\w.-]+\.md)\)", index))
    entries = {p.name for p in JOURNAL.glob("*.md")} - {"README.md"}
    assert entries, "docs/journal/ holds no entry"
    assert entries == listed, (sorted(entries - listed), sorted(listed - entries))
    for name in entries:
        assert re.fullmatch(r"\d{4}-\d{2}-\d{2}-[a-z0-9-]+\.md", name), name


def test_the_commits_results_names_exist():
    try:
        subprocess.run(["git", "rev-parse", "HEAD"], cwd=REPO, capture_output=True, check=True)
    except (OSError, subprocess.CalledProcessError):
        pytest.skip("not a git checkout")
    shallow = subprocess.run(
        ["git", "rev-parse", "--is-shallow-repository"], cwd=REPO, capture_output=True, text=True
    )
    if shallow.stdout.strip() == "true":
        pytest.skip("a shallow clone lacks the history results.md names")
    commits = set(re.findall(r"`([0-9a-f]{7,40})`", RESULTS.read_text(encoding="utf-8")))
    assert commits
    for commit in sorted(commits):
        found = subprocess.run(
            ["git", "cat-file", "-e", f"{commit}^{{commit}}"], cwd=REPO, capture_output=True
        )
        assert found.returncode == 0, f"results.md names commit {commit}, which git lacks"


def functions_in(path: Path) -> set[str]:
    """`name` of each test function and `Class::name` of each test method in `path`."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    names: set[str] = set()
    for node in tree.body:
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            names.add(node.name)
        elif isinstance(node, ast.ClassDef):
            names.update(
                f"{node.name}::{item.name}"
                for item in node.body
                if isinstance(item, (ast.FunctionDef, ast.AsyncFunctionDef))
            )
    return names


TEST_REFERENCE = re.compile(r"`(tests/[\w/]+\.py)::(\w+(?:::\w+)?)(?:\[[^\]`]*\])?`")


def test_reliability_is_a_catalogue_by_area():
    titles = list(sections(RELIABILITY.read_text(encoding="utf-8"), 2))
    assert [t for t in titles if t in RELIABILITY_AREAS] == RELIABILITY_AREAS, titles
    assert "Known limits" in titles and "Running them" in titles, titles


def test_every_guarantee_names_tests_that_exist():
    by_title = sections(RELIABILITY.read_text(encoding="utf-8"), 2)
    named = 0
    for area in RELIABILITY_AREAS:
        found = tables(by_title[area])
        assert found, f"reliability.md, {area}: no table"
        for rows in found:
            assert [cell.lower() for cell in rows[0]] == ["case", "guarantee", "test"], rows[0]
            for row in rows[1:]:
                references = TEST_REFERENCE.findall(row[2])
                assert references, f"reliability.md, {area}: {row[0]!r} names no test"
                for file, name in references:
                    path = REPO / file
                    assert path.is_file(), f"reliability.md names {file}, which does not exist"
                    assert name in functions_in(path), f"reliability.md: no {file}::{name}"
                    named += 1
    assert named > 0


# How code reads a variable: a Python string that is exactly its name (os.environ.get(
# "NMT_X"), X_ENV = "NMT_X"), ${NMT_X} or $NMT_X in a shell script, oc.env:NMT_X in a config.
NMT_NAME = r"NMT_[A-Z0-9_]+"


def variables_read() -> dict[str, set[str]]:
    """NMT_* name -> the files that read it, in nmt/, scripts/, benchmarks/ and configs/."""
    found: dict[str, set[str]] = {}

    def add(name: str, path: Path) -> None:
        found.setdefault(name, set()).add(str(path.relative_to(REPO)))

    for folder in ("nmt", "scripts", "benchmarks"):
        for path in (REPO / folder).rglob("*.py"):
            for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Constant) and isinstance(node.value, str):
                    if re.fullmatch(NMT_NAME, node.value):
                        add(node.value, path)
    for path in (REPO / "scripts").rglob("*.sh"):
        for name in re.findall(rf"\$\{{?({NMT_NAME})", path.read_text(encoding="utf-8")):
            add(name, path)
    for path in (REPO / "configs").rglob("*.yaml"):
        for name in re.findall(rf"oc\.env:({NMT_NAME})", path.read_text(encoding="utf-8")):
            add(name, path)
    return found


def test_environment_names_every_variable_the_code_reads_and_no_other():
    read = variables_read()
    assert "NMT_DEBUG" in read and "NMT_TORCH" in read, read  # the scan itself works
    documented = set(re.findall(NMT_NAME, ENVIRONMENT.read_text(encoding="utf-8")))
    missing = {name: sorted(files) for name, files in read.items() if name not in documented}
    assert not missing, f"docs/environment.md lacks {missing}"
    assert documented <= set(read), (
        f"docs/environment.md names {sorted(documented - set(read))}, which no code reads"
    )
