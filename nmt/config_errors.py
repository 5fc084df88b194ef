"""One-line messages for the mistakes of a command line: an override Hydra's grammar cannot
read, a key the command lacks, and every error of composing the config.

Hydra's and OmegaConf's errors are multi-line and chained, and most carry the fix: the
options of a config group, the `+` that adds a group, how to write a list. Each describer
below recognizes one kind and writes it in nmt's style, `option=value: what is wrong; what
to do`, keeping that fix; a misspelled key gets the closest option of the command's schema
(`nmt.config.option_names`, derived from the dataclasses).
"""

from __future__ import annotations

import dataclasses
import difflib
import re
from collections.abc import Sequence
from typing import Any

from omegaconf import DictConfig, ListConfig, OmegaConf

from nmt.config import (
    COMMANDS,
    DEPRECATED_KEYS,
    RENAMED_KEYS,
    closest_option,
    config_dir,
    option_names,
)
from nmt.errors import NmtError, setting


def describe_config_error(exc: Exception, command: str = "", overrides: Sequence[str] = ()) -> str:
    """One line for a Hydra/OmegaConf error (they are multi-line and chained) that keeps
    the fix Hydra's own message had: the options of a config group, the `+` to add a group,
    the closest option to a misspelled key, how to write a list or a sweep."""
    chain: list[BaseException] = []
    seen: BaseException | None = exc
    while seen is not None and len(chain) < 8:
        chain.append(seen)
        seen = seen.__cause__ or seen.__context__
    context = _ErrorContext(command, list(overrides))
    for describe in (
        _renamed_key,
        _unknown_key,
        _unknown_group_option,
        _group_not_in_defaults,
        _group_added_twice,
        _several_values,
        _wrong_type,
        _missing_value,
    ):
        message = describe(chain, context)
        if message:
            return message
    return "invalid configuration: " + _hydra_lines(chain)


@dataclasses.dataclass
class _ErrorContext:
    """What an error's description may need: the command, the overrides as typed."""

    command: str
    overrides: list[str]

    @property
    def prog(self) -> str:
        return f"nmt-{self.command.replace('_', '-')}"

    def typed(self, key: str) -> str | None:
        """The override the user typed for `key` (with its + or ++), if any."""
        for override in self.overrides:
            if re.sub(r"^(~|\+{1,2})", "", override).split("=", 1)[0] == key:
                return override
        return None

    def value(self, key: str) -> str | None:
        typed = self.typed(key)
        return typed.split("=", 1)[1] if typed and "=" in typed else None

    def options(self) -> list[str]:
        """The command's options (dotted) and its config groups (model, optim, experiment)."""
        if self.command not in COMMANDS:
            return []
        return option_names(COMMANDS[self.command]().schema) + config_groups()


def _hydra_lines(chain: list[BaseException]) -> str:
    """The first line of each error in the chain, and Hydra's own hints ("To append to
    your default list use ..."), with the key each one names."""
    parts: list[str] = []
    for error in chain:
        lines = [ln.strip() for ln in str(error).strip().splitlines() if ln.strip()]
        head = lines[0] if lines else type(error).__name__
        key = getattr(error, "full_key", None)
        if key and key not in head:
            head = f"{head} (key: {key})"
        hints = [ln for ln in lines[1:] if ln.startswith(("To ", "Either ", "Or "))]
        for part in (head, *hints):
            if part.rstrip(".") not in parts and "$VALUE" not in part:
                parts.append(part.rstrip("."))
    return ": ".join(parts[:4])


def _full_key(chain: Sequence[BaseException]) -> str | None:
    """The dotted key an OmegaConf error in the chain names."""
    keys = (getattr(e, "full_key", None) for e in chain)
    return next((str(k) for k in keys if k), None)


def _renamed_key(chain: list[BaseException], context: _ErrorContext) -> str | None:
    # a deprecated name in a config file (the command line's are rewritten before composing)
    renamed = {
        old: (new, f"its old name works on the command line until {removal}")
        for old, (new, removal) in DEPRECATED_KEYS.get(context.command, {}).items()
    }
    renamed.update(RENAMED_KEYS.get(context.command, {}))
    key = _full_key(chain) or _overridden_key(chain)
    if key in renamed:
        new, why = renamed[key]
        return f"{key}: renamed to {new} ({why}); write {new}=... instead"
    return None


def _overridden_key(chain: list[BaseException]) -> str | None:
    match = re.search(r"Could not override '([^']+)'", str(chain[0]))
    return match.group(1) if match else None


def _unknown_key(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`max_tokns=2048` (Hydra: "Key 'max_tokns' not in 'TrainConfig'", or "... is not in
    struct"): the closest option instead of Hydra's hint to add the key with +."""
    from omegaconf.errors import ConfigAttributeError, ConfigKeyError

    missing = [e for e in chain if isinstance(e, (ConfigAttributeError, ConfigKeyError))]
    if not missing or not re.search(r"Key '[^']+' (is )?not in", str(missing[0])):
        return None
    key = _overridden_key(chain) or _full_key(missing)  # optm.lr, not just optm
    return unknown_option_message(key, context) if key else None


def unknown_option_message(key: str, context: _ErrorContext) -> str:
    value = context.value(key)
    shown = f"{key}={value}" if value is not None else key
    close = closest_option(key, context.options())
    prog = context.prog
    if close is None:
        return f"{shown}: not an option of {prog}; remove it ({prog} --help lists every option)"
    suggestion = f"{close}={value}" if value is not None else close
    return (
        f"{shown}: not an option of {prog}; did you mean {suggestion}? "
        f"({prog} --help lists every option)"
    )


def _unknown_group_option(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`model=transformer_smal`: the group's options, and the closest one."""
    from hydra.errors import MissingConfigException

    missing = next((e for e in chain if isinstance(e, MissingConfigException)), None)
    if missing is None or not missing.missing_cfg_file or "/" not in missing.missing_cfg_file:
        return None
    group, _, option = missing.missing_cfg_file.rpartition("/")
    typed = context.typed(group) or f"{group}={option}"
    choices = [str(o) for o in missing.options or []]
    if not choices:
        close = difflib.get_close_matches(group, config_groups(), n=1)
        fix = (
            f"did you mean {close[0]}?"
            if close
            else f"the config groups are {', '.join(config_groups())}"
        )
        return f"{typed}: {group} is not a config group; {fix}"
    close = difflib.get_close_matches(option, choices, n=1)
    plus = "+" * (len(typed) - len(typed.lstrip("+")))
    guess = f"did you mean {plus}{group}={close[0]}? " if close else ""
    return (
        f"{typed}: no such {group} config; {guess}{group} is one of {', '.join(choices)} "
        f"(or a file of your own: --config-dir DIR with {group}/NAME.yaml)"
    )


def _group_not_in_defaults(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`experiment=x`: a group the defaults list lacks is added with +, as Hydra says."""
    match = re.search(
        r"Could not override '([^']+)'\. No match in the defaults list\.\s*"
        r"To append to your default list use (\S+)",
        str(chain[0]),
    )
    if not match:
        return None
    group, added = match.groups()
    typed = context.typed(group) or added[1:]
    return f"{typed}: {group} is not in {context.prog}'s defaults list; add it with +: {added}"


def _group_added_twice(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`+model=x` where the defaults list has model already: drop the +."""
    match = re.search(r"Multiple values for ([^.\s]+)\.", str(chain[0]))
    if not match:
        return None
    group = match.group(1)
    typed = context.typed(group) or f"+{group}"
    plain = re.sub(r"^\+{1,2}", "", typed)
    return f"{typed}: {group} is chosen in the defaults list already; drop the +: {plain}"


def _several_values(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`optim.lr=1e-3,2e-3` without -m: a sweep (nmt-train), a list or a quoted string."""
    match = re.search(r"Ambiguous value for argument '([^']+)'", str(chain[0]))
    if not match:
        return None
    typed = match.group(1)
    key, _, value = re.sub(r"^\+{1,2}", "", typed).partition("=")
    sweep = (
        "run one training per value with -m (--multirun), or " if context.command == "train" else ""
    )
    return (
        f"{typed}: several values; {sweep}write a list as {key}=[{value}] or a string as "
        f"{key}='{value}'"
    )


# OmegaConf's type errors, and what to write instead (DEFAULT: the option's default)
_TYPE_FIXES = (
    (r"could not be converted to Integer", "not a whole number", "give one such as DEFAULT"),
    (r"could not be converted to Float", "not a number", "give one such as DEFAULT"),
    (r"is not a valid bool", "not true or false", "write true or false"),
    (r"is not Optional", "cannot be null", "give a value such as DEFAULT"),
    (r"is not a ListConfig, list or tuple", "not a list", "write a list: KEY=[VALUE]"),
    (
        r"Cannot convert '(list|dict)' to string",
        "not one value",
        "give one, quoted if it has a comma",
    ),
)


def _wrong_type(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """`max_tokens=lots`: what kind of value the option takes."""
    from omegaconf.errors import ValidationError

    error = next((e for e in chain if isinstance(e, ValidationError) and e.full_key), None)
    if error is None:
        return None
    key, text = str(error.full_key), str(error).splitlines()[0]
    value = context.value(key)
    if value is None:
        found = re.search(r"[Vv]alue '([^']*)'", text)
        value = found.group(1) if found else "..."
    choices = re.search(r"expected one of \[([^\]]*)\]", text)
    if choices:
        return f"{key}={value}: unknown; use one of {choices.group(1)}"
    for pattern, problem, fix in _TYPE_FIXES:
        if re.search(pattern, text):
            default = setting(key, _schema_default(context.command, key)).split("=", 1)[1]
            if default in ("null", "''", "???"):  # no default worth showing
                fix = fix.replace(" such as DEFAULT", "")
            fix = fix.replace("KEY", key).replace("VALUE", value).replace("DEFAULT", default)
            return f"{key}={value}: {problem}; {fix}"
    return f"{key}={value}: {text.rstrip('.')}; check the value ({context.prog} --cfg shows the defaults)"


def _missing_value(chain: list[BaseException], context: _ErrorContext) -> str | None:
    """A mandatory option (???) left unset."""
    from omegaconf.errors import MissingMandatoryValue

    error = next((e for e in chain if isinstance(e, MissingMandatoryValue)), None)
    if error is None or not error.full_key:
        return None
    return f"{error.full_key}=???: required; give {error.full_key}=..."


def _schema_default(command: str, key: str) -> Any:
    """The default of a dotted option in the command's dataclass (None if not found)."""
    node: Any = COMMANDS[command]().schema() if command in COMMANDS else None
    for name in key.split("."):
        node = getattr(node, name, None)
    return node


def config_groups() -> list[str]:
    """The config groups of the built-in configs (model, optim, experiment)."""
    return sorted(p.name for p in config_dir().iterdir() if p.is_dir() and any(p.glob("*.yaml")))


def check_override_syntax(overrides: list[str]) -> None:
    """NmtError naming the first override Hydra's grammar cannot read, and how to quote it.

    Hydra reads unquoted values made of ASCII letters, digits, spaces and / - \\ + . $ % *
    @ ? | : only; anything else (é, 日, #, &, ~, <, !) needs quotes around the value, inside
    the shell's quotes: "data.dest='données'".
    """
    from hydra.core.override_parser.overrides_parser import OverridesParser

    parser = OverridesParser.create()
    for override in overrides:
        try:
            parser.parse_override(override)
        except Exception as exc:
            raise NmtError(_syntax_message(override, str(exc))) from exc


def _syntax_message(override: str, error: str) -> str:
    key, sep, value = override.partition("=")
    bad = re.search(r"token recognition error at: '(.)", error)
    if not sep or (bad and bad.group(1) in key):
        what = f"the character {bad.group(1)!r}" if bad else "it"
        return f"{override}: not a KEY=VALUE override ({what} cannot be in a key); check it"
    what = f"the character {bad.group(1)!r}" if bad else "this value"
    if value.startswith("[") and value.endswith("]"):
        items = [quoted(v) for v in value[1:-1].split(",")]
        suggestion = f"{key}=[{','.join(items)}]"
    else:
        suggestion = f"{key}={quoted(value)}"
    outer = "'" if '"' in suggestion else '"'  # the shell's quotes around Hydra's
    return (
        f"{override}: Hydra cannot read {what} unquoted; quote the value for Hydra and the "
        f"whole for the shell: {outer}{suggestion}{outer}"
    )


def quoted(value: str) -> str:
    if value[:1] in "'\"" and value[:1] == value[-1:] and len(value) > 1:
        return value  # quoted already
    return f'"{value}"' if "'" in value else f"'{value}'"


def _unknown_keys(node: Any, path: str) -> list[str]:
    """Keys below `node` that its dataclass lacks (added with +key=value), as full names."""
    if isinstance(node, ListConfig):
        return [k for i, item in enumerate(node) for k in _unknown_keys(item, f"{path}[{i}]")]
    if not isinstance(node, DictConfig) or node._is_none() or node._is_missing():
        return []
    kind = OmegaConf.get_type(node)
    names = {f.name for f in dataclasses.fields(kind)} if dataclasses.is_dataclass(kind) else None
    unknown = []
    for key in map(str, node.keys()):
        full = f"{path}.{key}" if path else key
        if names is not None and key not in names:
            unknown.append(full)
        else:
            unknown += _unknown_keys(node._get_node(key), full)
    return unknown


def check_known_keys(cfg: DictConfig, command: str, overrides: Sequence[str] = ()) -> None:
    """NmtError for a key the command does not have: Hydra lets `+key=value` add any."""
    unknown = _unknown_keys(cfg, "")
    if unknown:
        raise NmtError(unknown_option_message(unknown[0], _ErrorContext(command, list(overrides))))
