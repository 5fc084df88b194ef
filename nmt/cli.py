"""Console entry points: `nmt-preprocess`, `nmt-train`, `nmt-generate`, `nmt-score`.

Each composes its config with Hydra's compose API (configs/<command>.yaml, the groups
under configs/, an optional user config dir, command-line overrides), validates it
against the command's dataclass, and calls `commands/<command>.run(cfg)`.

Hydra's compose API is used rather than `@hydra.main` so that nothing is written to
`outputs/DATE/TIME/`, the working directory never changes, and every configuration
mistake is one line on stderr naming the key, with a non-zero exit.

Usage, as Hydra users expect:
    nmt-train data=data-bin/demo model=transformer_tiny optim.lr=1e-3
    nmt-train --config-dir my_configs --config-name my_train
    nmt-train --cfg            # print the composed config and exit
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import re
import sys
from collections.abc import Mapping, MutableMapping, Sequence
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, ListConfig, OmegaConf

from nmt.errors import NmtError, setting
from nmt.processes import Terminated

USAGE = """usage: nmt-{name} [--config-dir DIR] [--config-name NAME] [--cfg] [KEY=VALUE ...]

  KEY=VALUE          override a config value (Hydra syntax: a.b=1, +new=x, ~drop, group=option)
  --config-dir DIR   also search DIR for configs (it takes precedence over the built-in ones)
  --config-name NAME the primary config to compose (default: {name})
  --cfg              print the composed, validated config and exit
  debug=true         show full tracebacks instead of one-line errors

Built-in configs: {config_dir}
"""


def config_dir() -> Path:
    """The built-in configs: the checkout's configs/ folder, or nmt/configs in a wheel."""
    checkout = Path(__file__).resolve().parent.parent / "configs"
    if (checkout / "train.yaml").exists() or (checkout / "preprocess.yaml").exists():
        return checkout
    from importlib.resources import files

    return Path(str(files("nmt.configs")))


def _fail(prog: str, message: str, code: int = 2) -> NoReturn:
    first_line = " ".join(str(message).strip().splitlines()[:1]) or "unknown error"
    print(f"{prog}: error: {first_line}", file=sys.stderr)
    _exit(code)


def _exit(code: int) -> NoReturn:
    """sys.exit(code), except in a rank of a torch.distributed job: that one flushes its
    output and leaves at once (os._exit), without the interpreter's teardown.

    After a peer died, gloo's C++ threads can still be alive when the interpreter is torn
    down, and std::terminate then killed a rank that had already printed its one-line
    error ("terminate called without an active exception", SIGABRT instead of exit 2; 3
    of 64 runs of the DDP tests under load, docs/reliability.md item 12b). Nothing is
    left unwritten: a run's checkpoints and train.jsonl are written and closed, and its
    process group left, before its error gets here; the OS releases the run's lock."""
    joined = sys.modules.get("nmt.distributed")  # never imported: no job was joined
    if joined is not None and joined.joined_a_job():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to flush
                pass
        os._exit(code)
    sys.exit(code)


def _describe_config_error(exc: Exception, command: str = "", overrides: Sequence[str] = ()) -> str:
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
        from nmt.config import COMMANDS, option_names

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
    from nmt.config import RENAMED_KEYS

    renamed = RENAMED_KEYS.get(context.command, {})
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
    from nmt.config import closest_option

    value = context.value(key)
    shown = f"{key}={value}" if value is not None else key
    close = closest_option(key, context.options())
    prog = context.prog
    if close is None:
        return f"{shown}: not an option of {prog}; remove it ({prog} --cfg lists every option)"
    suggestion = f"{close}={value}" if value is not None else close
    return (
        f"{shown}: not an option of {prog}; did you mean {suggestion}? "
        f"({prog} --cfg lists every option)"
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
    from nmt.config import COMMANDS

    node: Any = COMMANDS[command]().schema() if command in COMMANDS else None
    for name in key.split("."):
        node = getattr(node, name, None)
    return node


def config_groups() -> list[str]:
    """The config groups of the built-in configs (model, optim, experiment)."""
    return sorted(p.name for p in config_dir().iterdir() if p.is_dir() and any(p.glob("*.yaml")))


def parse_args(argv: list[str]) -> tuple[str | None, str | None, bool, bool, list[str]]:
    user_dir = None
    config_name = None
    print_cfg = False
    show_help = False
    overrides: list[str] = []
    it = iter(argv)
    pending: str | None = None
    for arg in it:
        if pending == "--cfg" and arg in ("job", "hydra", "all"):
            pending = None  # Hydra's `--cfg job|hydra|all`: nmt prints the job's config
            continue
        pending = arg
        if arg in ("-h", "--help"):
            show_help = True
        elif arg == "--cfg":
            print_cfg = True
        elif arg in ("--config-dir", "-cd"):
            user_dir = next(it, None)
        elif arg.startswith("--config-dir="):
            user_dir = arg.split("=", 1)[1]
        elif arg in ("--config-name", "-cn"):
            config_name = next(it, None)
        elif arg.startswith("--config-name="):
            config_name = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise NmtError(f"unknown option {arg!r}; overrides are written KEY=VALUE (see --help)")
        else:
            overrides.append(arg)
    return user_dir, config_name, print_cfg, show_help, overrides


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
        items = [_quoted(v) for v in value[1:-1].split(",")]
        suggestion = f"{key}=[{','.join(items)}]"
    else:
        suggestion = f"{key}={_quoted(value)}"
    outer = "'" if '"' in suggestion else '"'  # the shell's quotes around Hydra's
    return (
        f"{override}: Hydra cannot read {what} unquoted; quote the value for Hydra and the "
        f"whole for the shell: {outer}{suggestion}{outer}"
    )


def _quoted(value: str) -> str:
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


def rewrite_deprecated(name: str, overrides: list[str]) -> tuple[list[str], list[str]]:
    """(overrides with each deprecated key renamed, one note per rename).

    `old=value` (also `+old=`, `++old=`, `~old`) becomes `new=value`, and the note says so
    and names the release that drops the old name (nmt.config.DEPRECATED_KEYS)."""
    from nmt.config import DEPRECATED_KEYS

    aliases = DEPRECATED_KEYS.get(name, {})
    rewritten: list[str] = []
    notes: list[str] = []
    for override in overrides:
        match = re.match(r"^(~|\+{0,2})([^=@]+)(.*)$", override, re.DOTALL)
        key = match.group(2) if match else ""
        if key in aliases:
            new, removal = aliases[key]
            override = f"{match.group(1)}{new}{match.group(3)}"  # type: ignore[union-attr]
            notes.append(f"{key}= is deprecated, renamed to {new}= (removed in {removal})")
        rewritten.append(override)
    return rewritten, notes


def compose_config(
    name: str,
    overrides: list[str],
    user_dir: str | None = None,
    config_name: str | None = None,
    notes: list[str] | None = None,
) -> DictConfig:
    """Compose and validate `configs/<name>.yaml` with overrides (also used by tests).

    Deprecated keys are renamed first; their notes go to `notes`, or to stderr."""
    from hydra import compose, initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    from nmt.config import COMMANDS, register

    overrides, renamed = rewrite_deprecated(name, overrides)
    if notes is not None:
        notes.extend(renamed)
    else:
        for note in renamed:
            print(f"nmt-{name.replace('_', '-')}: note: {note}", file=sys.stderr)
    check_override_syntax(overrides)
    spec = COMMANDS[name]()
    register(spec)
    extra = list(overrides)
    if user_dir is not None:
        path = Path(user_dir).expanduser().resolve()
        if not path.is_dir():
            raise NmtError(f"--config-dir {user_dir}: no such directory")
        extra.append(f"hydra.searchpath=[file://{path}]")
        primary = str(path)
        search_builtin = True
    else:
        primary = str(config_dir())
        search_builtin = False
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=primary, job_name=f"nmt-{name}"):
            if search_builtin:
                extra[-1] = f"hydra.searchpath=[file://{config_dir()}]"
            cfg = compose(config_name=config_name or name, overrides=extra)
    except NmtError:
        raise
    except Exception as exc:  # Hydra and OmegaConf raise many types; all are user mistakes here
        raise NmtError(_describe_config_error(exc, name, overrides)) from exc
    finally:
        GlobalHydra.instance().clear()
    check_known_keys(cfg, name, overrides)
    return cfg


def to_dataclass(cfg: DictConfig, command: str = ""):
    """The composed config as its plain dataclass, checked by its own `validate()`."""
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:
        raise NmtError(_describe_config_error(exc, command)) from exc
    validate = getattr(obj, "validate", None)
    if callable(validate):
        validate()
    return obj


# libgomp, torch's CPU thread pool on Linux, lets an idle worker spin 300,000 times before it
# sleeps. Beside another process on the same cores that spinning made a 100-line translation
# take up to 8x its time alone; 10,000 spins kept the speed alone and the speed side by side
# (docs/results.md, "OpenMP waiting in the console commands").
OPENMP_SPIN_COUNT = "10000"


def bound_openmp_spinning(
    environ: MutableMapping[str, str] = os.environ, modules: Mapping[str, Any] = sys.modules
) -> None:
    """GOMP_SPINCOUNT=OPENMP_SPIN_COUNT, unless the user chose how OpenMP waits
    (OMP_WAIT_POLICY or GOMP_SPINCOUNT set) or torch is loaded already: libgomp reads the
    variable once, when torch loads it, so the console commands call this first."""
    if "torch" in modules or environ.get("OMP_WAIT_POLICY") or environ.get("GOMP_SPINCOUNT"):
        return
    environ["GOMP_SPINCOUNT"] = OPENMP_SPIN_COUNT


def main(name: str, argv: list[str] | None = None) -> None:
    prog = f"nmt-{name.replace('_', '-')}"
    bound_openmp_spinning()
    argv = sys.argv[1:] if argv is None else argv
    debug = any(a.lower() in ("debug=true", "debug=1", "+debug=true") for a in argv) or bool(
        os.environ.get("NMT_DEBUG")
    )
    try:
        user_dir, config_name, print_cfg, show_help, overrides = parse_args(argv)
        if show_help:
            print(USAGE.format(name=name, config_dir=config_dir()))
            return
        cfg = compose_config(name, overrides, user_dir, config_name)
        checked = to_dataclass(cfg, name)  # an invalid config fails here, --cfg or not
        if print_cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return
        from nmt.config import COMMANDS

        code = COMMANDS[name]().run(checked)
        if code:
            _exit(code)
    except NmtError as exc:
        if debug:
            raise
        _fail(prog, str(exc))
    except KeyboardInterrupt:
        print(f"{prog}: interrupted", file=sys.stderr)
        _exit(130)
    except Terminated as exc:
        print(f"{prog}: {exc}", file=sys.stderr)
        _exit(128 + exc.signum)
    except BrokenPipeError:
        # `nmt-generate ... | head`: the reader went away; that is not an error.
        sys.stderr.close()
        sys.exit(0)
    except OSError as exc:  # unreadable or unwritable paths, full disks, ...
        if debug:
            raise
        where = f"{exc.filename}: " if exc.filename else ""
        _fail(prog, f"{where}{exc.strerror or exc}", 1)
    except Exception as exc:  # an unexpected bug: still one line, unless debug=true
        if debug:
            raise
        _fail(prog, f"{type(exc).__name__}: {exc} (run again with debug=true for the traceback)", 1)


def preprocess_main() -> None:
    main("preprocess")


def score_main() -> None:
    main("score")


def generate_main() -> None:
    main("generate")


def shortlist_main() -> None:
    main("shortlist")


def export_main() -> None:
    main("export")


def import_fairseq_main() -> None:
    main("import_fairseq")


def train_main() -> None:
    main("train")


def average_main() -> None:
    main("average")


def serve_main() -> None:
    main("serve")
