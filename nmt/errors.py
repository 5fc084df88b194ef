"""The one exception type that reaches the user as a one-line message, and its style.

Raise `NmtError` for anything the user can fix (a missing file, a bad option, a
corrupted checkpoint). The CLI prints `nmt-<command>: error: <message>` and exits
non-zero, without a traceback unless `debug=true`.

A bad option reads `option=value: what is wrong; what to do`: build it with
`option_error(key, value, problem, fix)`, so that every config writes values the way
the user types them on the command line (`setting`).
"""

from __future__ import annotations

from collections.abc import Mapping
from enum import Enum
from typing import Any


class NmtError(Exception):
    """A user-facing error: its message is printed as one line, without a traceback."""


def setting(key: str, value: Any) -> str:
    """`key=value` as it is written on the command line (the start of every message)."""
    return f"{key}={_written(value)}"


def _written(value: Any) -> str:
    """A value as Hydra reads it back: null, true, '' for an empty string, [a,b], {a:1}."""
    if value is None:
        return "null"
    if isinstance(value, bool):
        return str(value).lower()
    if isinstance(value, Enum):  # a str Enum option: its value, as the user wrote it
        return str(value.value)
    if isinstance(value, str):
        return value if value else "''"
    if isinstance(value, Mapping):
        return "{" + ",".join(f"{k}:{_written(v)}" for k, v in value.items()) + "}"
    if isinstance(value, (list, tuple)):
        return "[" + ",".join(_written(v) for v in value) + "]"
    return str(value)


def option_error(key: str, value: Any, problem: str, fix: str, *, unit: str = "") -> NmtError:
    """`option=value: problem; fix`, the one style of a bad option's error.

    A quantity's `unit` (hours, seconds, tokens) is named after the problem, `(in hours)`,
    so that a value given in another unit (minutes for hours) shows what was read."""
    if unit:
        problem = f"{problem} (in {unit})"
    return NmtError(f"{setting(key, value)}: {problem}; {fix}")


def choice_error(key: str, value: Any, choices: tuple[str, ...] | list[str]) -> NmtError:
    """The error for a value outside a fixed set of choices."""
    return option_error(key, value, "unknown", f"use one of {', '.join(map(str, choices))}")
