"""The one exception type that reaches the user as a one-line message, and its style.

Raise `NmtError` for anything the user can fix (a missing file, a bad option, a
corrupted checkpoint). The CLI prints `nmt-<command>: error: <message>` and exits
non-zero, without a traceback unless `debug=true`.

A bad option reads `option=value: what is wrong; what to do`: build it with
`option_error(key, value, problem, fix)`, so that every config writes values the way
the user types them on the command line (`setting`).
"""

from __future__ import annotations

from typing import Any


class NmtError(Exception):
    """A user-facing error: its message is printed as one line, without a traceback."""


def setting(key: str, value: Any) -> str:
    """`key=value` as it is written on the command line (the start of every message)."""
    if value is None:
        text = "null"
    elif isinstance(value, bool):
        text = str(value).lower()
    elif isinstance(value, str):
        text = value if value else "''"
    elif isinstance(value, (list, tuple)):
        text = "[" + ",".join(str(v) for v in value) + "]"
    elif hasattr(value, "value") and isinstance(value.value, str):  # a str Enum option
        text = value.value
    else:
        text = str(value)
    return f"{key}={text}"


def option_error(key: str, value: Any, problem: str, fix: str) -> NmtError:
    """`option=value: problem; fix`, the one style of a bad option's error."""
    return NmtError(f"{setting(key, value)}: {problem}; {fix}")


def choice_error(key: str, value: Any, choices: tuple[str, ...] | list[str]) -> NmtError:
    """The error for a value outside a fixed set of choices."""
    return option_error(key, value, "unknown", f"use one of {', '.join(map(str, choices))}")
