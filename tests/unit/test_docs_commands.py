"""The documents' command lines work: every `nmt-*` line in the README and docs/ composes
and validates its config, as `--cfg` does (no torch, no files read), with today's option
names; docs/commands.md is what scripts/commands_doc.py makes of configs/; and every
option of every command is on that page.

The journal (docs/journal/) is history: its commands are the ones that ran then.
"""

from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

import pytest

from nmt.cli import compose_config, expand_sweep, parse_args, rewrite_deprecated, to_dataclass
from nmt.config import COMMANDS, option_names

REPO = Path(__file__).resolve().parents[2]
DOCUMENTS = [REPO / "README.md", REPO / "CONTRIBUTING.md", *sorted((REPO / "docs").glob("*.md"))]
FENCE = re.compile(r"^```(?P<lang>\S*)\n(?P<body>.*?)^```", re.MULTILINE | re.DOTALL)
# a command: a path before it (.venv/bin/, $BIN/) is allowed; what follows it up to a pipe,
# a redirection, a comment or the next command is its arguments
COMMAND = re.compile(
    r"(?:^|[\s|;&(])(?:[\w$./{}-]*/)?nmt-(?P<name>[a-z][a-z-]*)(?P<args>[^|>#;&]*)"
)
SHELL_VARIABLE = re.compile(r"\$\{?(\w+)\}?")


@dataclass(frozen=True)
class CommandLine:
    document: str
    line: int
    command: str  # the COMMANDS name: import_fairseq
    argv: tuple[str, ...]

    def __str__(self) -> str:
        return f"{self.document}:{self.line}: nmt-{self.command.replace('_', '-')} {' '.join(self.argv)}"


def command_lines(path: Path) -> list[CommandLine]:
    """Each nmt-* command in the shell blocks of a Markdown file, continuation lines joined
    and shell variables replaced by a word (validation reads no file)."""
    text = path.read_text(encoding="utf-8")
    found = []
    for block in FENCE.finditer(text):
        if block["lang"] not in ("", "sh", "bash", "shell", "console"):
            continue
        first_line = text[: block.start("body")].count("\n") + 1
        lines = block["body"].split("\n")
        joined: list[tuple[int, str]] = []
        pending = ""
        for offset, line in enumerate(lines):
            start = first_line + offset - pending.count("\n")
            if line.rstrip().endswith("\\"):
                pending += line.rstrip()[:-1] + " \n"
                continue
            joined.append((start, (pending + line).replace("\n", "")))
            pending = ""
        for number, line in joined:
            for match in COMMAND.finditer(_without_comment(line)):
                name = match["name"].replace("-", "_")
                if name not in COMMANDS:
                    continue
                args = SHELL_VARIABLE.sub(lambda m: m[1].lower(), match["args"])
                found.append(
                    CommandLine(str(path.relative_to(REPO)), number, name, tuple(shlex.split(args)))
                )
    return found


def _without_comment(line: str) -> str:
    """The line up to a shell comment: a # after a blank, outside quotes."""
    quote = ""
    for i, char in enumerate(line):
        if quote:
            quote = "" if char == quote else quote
        elif char in "'\"":
            quote = char
        elif char == "#" and (i == 0 or line[i - 1].isspace()):
            return line[:i]
    return line


def is_whole(line: CommandLine) -> bool:
    """A line that elides arguments (`nmt-train ... max_time=1`) shows a fragment, and one
    with a --config-dir outside the repository needs the user's own configs."""
    if "..." in line.argv:
        return False
    args = parse_args(list(line.argv))
    return args.user_dir is None or (REPO / args.user_dir).is_dir()


ALL_LINES = [line for path in DOCUMENTS for line in command_lines(path)]
WHOLE_LINES = [line for line in ALL_LINES if is_whole(line)]


def test_the_documents_have_command_lines():
    readme = [line for line in ALL_LINES if line.document == "README.md"]
    assert {line.command for line in readme} >= {
        "preprocess", "train", "average", "generate", "score", "serve",
    }  # fmt: skip


@pytest.mark.parametrize("line", WHOLE_LINES, ids=str)
def test_every_command_line_composes_and_validates(line: CommandLine):
    """As `nmt-<command> ... --cfg` would, and with no deprecated name."""
    args = parse_args(list(line.argv))
    if args.show_help:
        return
    _, renamed = rewrite_deprecated(line.command, args.overrides)
    assert not renamed, f"{line}: {renamed}"
    runs = expand_sweep(args.overrides) if args.multirun else [(args.overrides, [])]
    for overrides, _ in runs:
        notes: list[str] = []
        cfg = compose_config(line.command, overrides, args.user_dir, args.config_name, notes)
        to_dataclass(cfg, line.command)
        assert not notes, f"{line}: {notes}"


def test_the_command_line_reader_finds_what_a_shell_would_run(tmp_path):
    page = tmp_path / "page.md"
    page.write_text(
        "```\n"
        "nmt-train data=$D save_dir=runs/x \\\n    model=transformer_tiny  # the tiny one\n"
        'echo "hi" | .venv/bin/nmt-generate checkpoint=c.pt > out.txt\n'
        "torchrun --nproc_per_node 2 --no-python nmt-train data=d save_dir=s\n"
        "nmt-unknown x=1\n"
        "source .venv/bin/activate  # puts nmt-train on PATH\n"
        "```\n"
        "```python\nnmt-score hyp=not-a-shell-line\n```\n"
    )
    original = globals()["REPO"]
    globals()["REPO"] = tmp_path
    try:
        found = command_lines(page)
    finally:
        globals()["REPO"] = original
    assert [(c.line, c.command, c.argv) for c in found] == [
        (2, "train", ("data=d", "save_dir=runs/x", "model=transformer_tiny")),
        (4, "generate", ("checkpoint=c.pt",)),
        (5, "train", ("data=d", "save_dir=s")),
    ]


def _commands_doc():
    spec = importlib.util.spec_from_file_location(
        "commands_doc", REPO / "scripts" / "commands_doc.py"
    )
    assert spec and spec.loader
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)
    return module


def test_commands_md_is_current():
    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    assert page == _commands_doc().render(), (
        "docs/commands.md is out of date; run: .venv/bin/python scripts/commands_doc.py"
    )


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_option_is_on_the_commands_page(command):
    page = (REPO / "docs" / "commands.md").read_text(encoding="utf-8")
    names = option_names(COMMANDS[command]().schema)
    leaves = [name for name in names if not any(n.startswith(f"{name}.") for n in names)]
    missing = [name for name in leaves if f"`{name}`" not in page]
    assert not missing, f"nmt-{command}: options missing from docs/commands.md: {missing}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_help_lists_every_option(command):
    """`nmt-<command> --help`, which the errors point to, shows each option with its
    default: the leaf keys of the schema, each as `key:` at its depth of the YAML."""
    from nmt.cli import help_text

    text = help_text(command)
    names = option_names(COMMANDS[command]().schema)
    leaves = [n for n in names if not any(m.startswith(f"{n}.") for m in names)]
    missing = [
        name
        for name in leaves
        if not name.startswith(("model.", "optim."))  # the groups: their presets, below
        and not re.search(rf"^ {{{2 * name.count('.')}}}{name.rsplit('.', 1)[-1]}:", text, re.M)
    ]
    assert not missing, f"nmt-{command} --help lacks {missing}"
    if command == "train":
        assert "model=: transformer_base, transformer_big" in text
