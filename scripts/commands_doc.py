"""Writes docs/commands.md, the reference of every command and option, from configs/.

Each command's YAML file (configs/<command>.yaml) states every option of its dataclass
with its default and a comment, and tests/integration/test_config_contract.py keeps those
defaults equal to the dataclass's; this script turns the files into one page, so the page
cannot drift from the code. tests/unit/test_commands_doc.py fails when the page is stale.

usage: .venv/bin/python scripts/commands_doc.py [--check]
  (no option)  rewrite docs/commands.md
  --check      exit 1, naming the command to run, when docs/commands.md is out of date
"""

from __future__ import annotations

import ast
import re
import sys
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
CONFIGS = REPO / "configs"
PAGE = REPO / "docs" / "commands.md"

# The commands in the order a user meets them (nmt.config.COMMANDS holds the same names).
ORDER = (
    "preprocess", "train", "average", "generate", "score", "shortlist", "serve", "export",
    "import_fairseq",
)  # fmt: skip
GROUPS = ("model", "optim", "experiment")

KEY_LINE = re.compile(
    r"^(?P<indent> *)(?P<key>[A-Za-z_][\w]*):(?P<value>[^#]*?)\s*(#\s?(?P<doc>.*))?$"
)
COMMENT_LINE = re.compile(r"^(?P<indent> *)#\s?(?P<doc>.*)$")


@dataclass
class Option:
    key: str  # dotted: validation.bleu.beam
    default: str  # as the YAML writes it
    doc: list[str] = field(default_factory=list)


@dataclass
class Section:
    title: str  # the comment heading a block of options ('' before the first)
    options: list[Option] = field(default_factory=list)


@dataclass
class ConfigFile:
    header: list[str]  # the comment lines before the first key
    sections: list[Section]

    def options(self) -> list[Option]:
        return [option for section in self.sections for option in section.options]


def parse(path: Path) -> ConfigFile:
    """The header, and the options of a commented YAML config in file order: a nested node
    (`validation:` on its own) prefixes the keys indented under it; a comment-only line
    indented under a key continues that key's comment; one at column 0 starts a section."""
    header: list[str] = []
    sections = [Section("")]
    parents: list[tuple[int, str]] = []  # (indent, name) of the open nested nodes
    last: Option | None = None
    in_header, in_defaults = True, False
    lines = [raw.rstrip() for raw in path.read_text(encoding="utf-8").splitlines()]
    for number, line in enumerate(lines):
        if not line.strip():
            last = None
            continue
        if in_defaults:
            if line.startswith((" ", "-")):
                continue
            in_defaults = False
        comment = COMMENT_LINE.match(line)
        if comment:
            text = comment["doc"].strip()
            if in_header:
                header.append(comment["doc"].rstrip())
            elif last is not None and comment["indent"]:
                last.doc.append(text)
            elif not comment["indent"]:
                sections.append(Section(text.strip("- ")))
                last = None
            continue
        match = KEY_LINE.match(line)
        if match is None:  # a value continued on the next line (a YAML list or mapping)
            continue
        in_header = False
        indent, key, value = len(match["indent"]), match["key"], match["value"].strip()
        if key == "defaults" and not indent:
            in_defaults = True
            continue
        if key == "_self_":
            continue
        closed = False
        while parents and parents[-1][0] >= indent:
            parents.pop()
            closed = True
        if closed and sections[-1].title.split(":")[0] not in [n for _, n in parents]:
            sections.append(Section(""))  # the keys after a node are not part of it
        dotted = ".".join([name for _, name in parents] + [key])
        if not value and _opens_node(lines, number, indent):  # its keys follow, indented
            parents.append((indent, key))
            if match["doc"]:
                sections.append(Section(f"{dotted}: {match['doc'].strip()}"))
            last = None
            continue
        last = Option(dotted, value or "{}", [match["doc"].strip()] if match["doc"] else [])
        sections[-1].options.append(last)
    if header and header[0].startswith("@package"):
        header = header[1:]
    return ConfigFile(header, [s for s in sections if s.options])


def _opens_node(lines: list[str], number: int, indent: int) -> bool:
    """Whether the key on line `number` holds the keys indented under it (a nested node)."""
    for line in lines[number + 1 :]:
        match = KEY_LINE.match(line)
        if match:
            return len(match["indent"]) > indent
    return False


def _cell(text: str) -> str:
    return text.replace("|", "\\|")


def _doc(option: Option) -> str:
    return _cell(" ".join(part for part in option.doc if part))


def render_command(name: str) -> list[str]:
    parsed = parse(CONFIGS / f"{name}.yaml")
    prog = f"nmt-{name.replace('_', '-')}"
    lines = [f"## {prog}", ""]
    summary, examples = _split_header(parsed.header)
    lines += [" ".join(summary), ""] if summary else []
    if examples:
        lines += ["```", *examples, "```", ""]
    for section in parsed.sections:
        if section.title:
            lines += [f"**{_cell(section.title)}**", ""]
        lines += ["| option | default | meaning |", "| --- | --- | --- |"]
        for option in section.options:
            lines.append(f"| `{option.key}` | `{_cell(option.default)}` | {_doc(option)} |")
        lines.append("")
    return lines


def _split_header(header: list[str]) -> tuple[list[str], list[str]]:
    """The header's prose, and its indented example command lines."""
    summary, examples = [], []
    for line in header:
        if line.startswith("  ") and (examples or line.strip().startswith(("nmt-", "curl", "#"))):
            examples.append(line[2:])
        elif examples and line.startswith(" "):
            examples.append(line[2:])
        else:
            summary.append(line.strip())
    if summary and summary[0].startswith("nmt-"):
        summary[0] = summary[0].split(":", 1)[-1].strip()
        summary[0] = summary[0][:1].upper() + summary[0][1:]
    return [s for s in summary if s], examples


# The schemas of the groups whose presets state only what differs from them.
GROUP_SCHEMAS = {
    "model": ("nmt/model/config.py", "ModelConfig"),
    "optim": ("nmt/training/config.py", "OptimConfig"),
}


def schema_options(path: str, name: str) -> list[Option]:
    """The fields of dataclass `name` in `path`, each with its default and the comment
    after it (or the comment lines just above it), read from the source with ast."""
    source = (REPO / path).read_text(encoding="utf-8")
    lines = source.splitlines()
    (cls,) = [
        n for n in ast.walk(ast.parse(source)) if isinstance(n, ast.ClassDef) and n.name == name
    ]
    options = []
    for node in cls.body:
        if not (isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)):
            continue
        line = lines[node.lineno - 1]
        doc = line.split("  # ", 1)[1].strip() if "  # " in line else ""
        above = node.lineno - 2
        while not doc and above >= 0 and lines[above].strip().startswith("#"):
            doc = lines[above].strip().lstrip("# ") + (" " + doc if doc else "")
            above -= 1
        options.append(Option(node.target.id, _default(node.value), [doc]))
    return options


def _default(value: ast.expr | None) -> str:
    """A field's default as YAML writes it: 1.0e-4 style numbers aside, Python's literal."""
    if value is None:
        return ""
    if isinstance(value, ast.Call) and value.keywords:  # field(default_factory=lambda: ...)
        factory = value.keywords[0].value
        value = factory.body if isinstance(factory, ast.Lambda) else factory
    literal = ast.literal_eval(value)
    if isinstance(literal, bool):
        return str(literal).lower()
    if literal is None:
        return "null"
    return str(literal).replace("'", "").replace(" ", "")


def render_group(group: str) -> list[str]:
    lines = [f"### `{group}=` presets (configs/{group}/)", ""]
    if group in GROUP_SCHEMAS:
        path, name = GROUP_SCHEMAS[group]
        lines += [
            f"Every `{group}.KEY` option ({name}, {path}): a preset below states only the "
            "keys it sets differently.",
            "",
            "| option | default | meaning |",
            "| --- | --- | --- |",
        ]
        for option in schema_options(path, name):
            lines.append(f"| `{group}.{option.key}` | `{option.default}` | {_doc(option)} |")
        lines.append("")
    for path in sorted((CONFIGS / group).glob("*.yaml")):
        parsed = parse(path)
        choose = f"+experiment={path.stem}" if group == "experiment" else f"{group}={path.stem}"
        prose = []
        for line in parsed.header:  # up to the boilerplate every group file repeats
            if line.strip().startswith("Group file"):
                break
            prose.append(line.strip())
        lines += [f"**`{choose}`**: {_cell(' '.join(prose))}", ""]
        options = parsed.options()
        if options:
            lines += ["| option | value | why |", "| --- | --- | --- |"]
            for option in options:
                key = option.key if group == "experiment" else f"{group}.{option.key}"
                lines.append(f"| `{key}` | `{_cell(option.default)}` | {_doc(option)} |")
            lines.append("")
    return lines


def render() -> str:
    lines = [
        "# Commands and options",
        "",
        "<!-- Generated by scripts/commands_doc.py from configs/*.yaml: edit the YAML "
        "comments, then run `.venv/bin/python scripts/commands_doc.py`. -->",
        "",
        "Every command takes `key=value` overrides (Hydra's syntax: `a.b=1`, `group=option`,",
        "`+experiment=NAME`), `--cfg` (print the composed, validated config and exit),",
        "`--config-dir DIR` / `--config-name NAME` (configs of your own, which may extend the",
        "built-in ones) and `debug=true` (a traceback instead of the one-line error).",
        "`nmt-train -m KEY=A,B ...` runs a sweep (docs/training.md). Unquoted values may hold",
        "ASCII letters, digits and `/-\\+.$%*@?|:` only: quote anything else for Hydra and",
        "for the shell, `\"data.dest='données'\"`.",
        "",
        "Commands: "
        + ", ".join(f"[nmt-{n.replace('_', '-')}](#nmt-{n.replace('_', '-')})" for n in ORDER)
        + ".",
        "",
    ]
    for name in ORDER:
        lines += render_command(name)
        if name == "train":
            for group in GROUPS:
                lines += render_group(group)
    return "\n".join(lines).rstrip() + "\n"


def main(argv: list[str]) -> int:
    page = render()
    if argv[1:] == ["--check"]:
        if PAGE.read_text(encoding="utf-8") != page:
            print(
                f"{PAGE.relative_to(REPO)} is out of date; run: .venv/bin/python "
                "scripts/commands_doc.py",
                file=sys.stderr,
            )
            return 1
        return 0
    if argv[1:]:
        print(__doc__.strip().splitlines()[-3], file=sys.stderr)
        return 2
    PAGE.write_text(page, encoding="utf-8")
    print(f"wrote {PAGE.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv))
