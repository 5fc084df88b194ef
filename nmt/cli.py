"""Console entry points: one per command of `nmt.config.COMMANDS`, `<command>_main` here,
installed as `nmt-<command>` (pyproject.toml's [project.scripts], `_` written `-`).

Each composes its config with Hydra's compose API (configs/<command>.yaml, the groups
under configs/, an optional user config dir, command-line overrides), validates it
against the command's dataclass, and calls `commands/<command>.run(cfg)`.

Hydra's compose API is used rather than `@hydra.main` so that nothing is written to
`outputs/DATE/TIME/`, the working directory never changes, and every configuration
mistake is one line on stderr naming the key, with a non-zero exit (nmt.config_errors).

Usage, as Hydra users expect:
    nmt-train data=data-bin/demo save_dir=runs/demo model=transformer_tiny optim.lr=1e-3
    nmt-train --config-dir my_configs --config-name my_train
    nmt-train --help           # every option, its default and what it does
    nmt-train --cfg data=d save_dir=r   # print the composed, validated config and exit
    nmt-train -m data=d save_dir=runs/sweep optim.lr=1e-3,2e-3 model=transformer_tiny,transformer_small
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import sys
from collections.abc import Iterator, Mapping, MutableMapping
from contextlib import contextmanager
from pathlib import Path
from typing import Any, NoReturn

from omegaconf import DictConfig, OmegaConf

from nmt.config import config_dir
from nmt.config_errors import check_known_keys, check_override_syntax, describe_config_error, quoted
from nmt.errors import NmtError
from nmt.processes import Terminated

USAGE = """usage: nmt-{name} [--config-dir DIR] [--config-name NAME] [--cfg] [-m] [KEY=VALUE ...]

  KEY=VALUE          override a config value (Hydra syntax: a.b=1, +new=x, ~drop, group=option)
  --config-dir DIR   also search DIR for configs (it takes precedence over the built-in ones)
  --config-name NAME the primary config to compose (default: {name})
  --cfg              print the composed, validated config and exit
  -m, --multirun     nmt-train: a sweep, one training per combination of the values given as
                     a,b or range(1,4) (Hydra's syntax), each in save_dir/<its values>, one
                     after another; ends with a table, also written to save_dir/sweep.json
  debug=true         show full tracebacks instead of one-line errors
  -h, --help         this help, then every option with its default and meaning

Built-in configs: {config_dir}
"""


def help_text(name: str) -> str:
    """The usage, then the command's commented YAML config (every option, its default
    and what it does), and the presets of its config groups."""
    path = config_dir() / f"{name}.yaml"
    lines = path.read_text(encoding="utf-8").splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith("defaults:"))
    end = next(i for i in range(start + 1, len(lines)) if not lines[i].startswith(" "))
    options = "\n".join(lines[:start] + lines[end:]).strip("\n")  # the defaults list dropped
    groups = [
        f"  {group}=: {', '.join(sorted(p.stem for p in (config_dir() / group).glob('*.yaml')))}"
        for group in ("model", "optim", "experiment")
        if name == "train"
    ]
    presets = "\nPresets (configs/<group>/):\n" + "\n".join(groups) + "\n" if groups else ""
    usage = USAGE.format(name=name.replace("_", "-"), config_dir=config_dir())
    return f"{usage}{presets}\nOptions ({path.name}):\n{options}\n"


def _fail(prog: str, message: str, code: int = 2) -> NoReturn:
    first_line = " ".join(str(message).strip().splitlines()[:1]) or "unknown error"
    print(f"{prog}: error: {first_line}", file=sys.stderr)
    _exit(code)


def _exit(code: int) -> NoReturn:
    """sys.exit(code), except in a rank of a torch.distributed job: that one flushes its
    output and leaves at once (os._exit), without the interpreter's teardown.

    gloo's C++ threads can still be alive when the interpreter is torn down, and
    std::terminate then kills a rank that has done its work ("terminate called without
    an active exception", SIGABRT instead of its exit code): seen after a peer died (3 of
    64 runs of the DDP tests under load) and once after a clean end
    (docs/journal/2026-11-26-reliability-diary.md, 12b; pytorch/pytorch#179291). Nothing
    is left unwritten: a run's checkpoints and train.jsonl are written and closed, and its
    process group left, before it gets here; the OS releases the run's lock."""
    if _is_a_rank():
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):  # a closed or broken stream: nothing to flush
                pass
        os._exit(code)
    sys.exit(code)


def _is_a_rank() -> bool:
    """Whether this process joined a torch.distributed job (see _exit)."""
    joined = sys.modules.get("nmt.distributed")  # never imported: no job was joined
    return joined is not None and joined.joined_a_job()


@dataclasses.dataclass
class CommandLine:
    """A console command's arguments: Hydra's options and the overrides."""

    user_dir: str | None = None  # --config-dir
    config_name: str | None = None  # --config-name
    print_cfg: bool = False  # --cfg
    show_help: bool = False  # -h, --help
    multirun: bool = False  # -m, --multirun: a sweep (nmt-train)
    overrides: list[str] = dataclasses.field(default_factory=list)


def parse_args(argv: list[str]) -> CommandLine:
    args = CommandLine()
    it = iter(argv)
    pending: str | None = None
    for arg in it:
        if pending == "--cfg" and arg in ("job", "hydra", "all"):
            pending = None  # Hydra's `--cfg job|hydra|all`: nmt prints the job's config
            continue
        pending = arg
        if arg in ("-h", "--help"):
            args.show_help = True
        elif arg == "--cfg":
            args.print_cfg = True
        elif arg in ("-m", "--multirun"):
            args.multirun = True
        elif arg in ("--config-dir", "-cd"):
            args.user_dir = next(it, None)
        elif arg.startswith("--config-dir="):
            args.user_dir = arg.split("=", 1)[1]
        elif arg in ("--config-name", "-cn"):
            args.config_name = next(it, None)
        elif arg.startswith("--config-name="):
            args.config_name = arg.split("=", 1)[1]
        elif arg.startswith("-"):
            raise NmtError(f"unknown option {arg!r}; overrides are written KEY=VALUE (see --help)")
        else:
            args.overrides.append(arg)
    return args


def rewrite_deprecated(name: str, overrides: list[str]) -> tuple[list[str], list[str]]:
    """(overrides with each deprecated key renamed, one note per rename).

    `old=value` (also `+old=`, `++old=`, `~old`) becomes `new=value`, and the note says so
    and names the release that drops the old name (nmt.config.DEPRECATED_KEYS). Both
    names given with different values is an NmtError."""
    from nmt.config import DEPRECATED_KEYS

    aliases = DEPRECATED_KEYS.get(name, {})
    parts = [re.match(r"^(~|\+{0,2})([^=@]+)(.*)$", o, re.DOTALL) for o in overrides]
    given = {m.group(2): m.group(3) for m in parts if m}  # key -> "=value" (the last)
    rewritten: list[str] = []
    notes: list[str] = []
    for override, match in zip(overrides, parts):
        key = match.group(2) if match else ""
        if match and key in aliases:
            new, removal = aliases[key]
            if match.group(1) != "~" and given.get(new, match.group(3)) != match.group(3):
                raise NmtError(
                    f"{new}{given[new]}, {key}{match.group(3)}: {key}= is the old name of "
                    f"{new}=, and the two differ; give {new}= only"
                )
            override = f"{match.group(1)}{new}{match.group(3)}"
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
    from hydra import compose

    from nmt.config import COMMANDS, register

    overrides, renamed = rewrite_deprecated(name, overrides)
    if notes is not None:
        notes.extend(renamed)
    else:
        for note in renamed:
            print(f"nmt-{name.replace('_', '-')}: note: {note}", file=sys.stderr)
    check_override_syntax(overrides)
    register(COMMANDS[name]())
    try:
        with hydra_on_configs(name, user_dir) as search_path:
            cfg = compose(config_name=config_name or name, overrides=overrides + search_path)
    except NmtError:
        raise
    except Exception as exc:  # Hydra and OmegaConf raise many types; all are user mistakes here
        raise NmtError(describe_config_error(exc, name, overrides)) from exc
    check_known_keys(cfg, name, overrides)
    return cfg


@contextmanager
def hydra_on_configs(name: str, user_dir: str | None) -> Iterator[list[str]]:
    """Hydra initialized on the built-in configs, or on --config-dir DIR with the built-in
    ones searched after DIR's; yields the overrides that set this search path."""
    from hydra import initialize_config_dir
    from hydra.core.global_hydra import GlobalHydra

    primary, search_path = str(config_dir()), []
    if user_dir is not None:
        path = Path(user_dir).expanduser().resolve()
        if not path.is_dir():
            raise NmtError(f"--config-dir {user_dir}: no such directory")
        primary, search_path = str(path), [f"hydra.searchpath=[file://{config_dir()}]"]
    GlobalHydra.instance().clear()
    try:
        with initialize_config_dir(version_base=None, config_dir=primary, job_name=f"nmt-{name}"):
            yield search_path
    finally:
        GlobalHydra.instance().clear()


def expand_sweep(
    overrides: list[str], user_dir: str | None = None
) -> list[tuple[list[str], list[str]]]:
    """(every override, the swept ones) of each run of a sweep: Hydra's multirun values
    (a,b; range(1,4); choice(a,b); glob(transformer_*) over a group's configs) expanded by
    Hydra's parser to their cartesian product, in BasicSweeper's order. The overrides that
    sweep nothing are passed on as typed."""
    from hydra.core.global_hydra import GlobalHydra
    from hydra.core.override_parser.overrides_parser import OverridesParser

    check_override_syntax(overrides)
    choices: list[list[tuple[str, bool]]] = []
    with hydra_on_configs("train", user_dir):
        parser = OverridesParser.create(config_loader=GlobalHydra.instance().config_loader())
        for typed in overrides:
            try:
                (override,) = parser.parse_overrides([typed])
                if not override.is_sweep_override():
                    choices.append([(typed, False)])
                    continue
                key = override.get_key_element()
                values = [f"{key}={v}" for v in override.sweep_string_iterator()]
            except Exception as exc:  # Hydra cannot expand it (interval(), a nested sweep)
                first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
                raise NmtError(
                    f"{typed}: not a sweep nmt-train -m can run ({first.rstrip('.')}); give "
                    "the values as a,b,c, range(start,stop[,step]) or choice(a,b)"
                ) from exc
            if not values:
                raise NmtError(f"{typed}: sweeps no value; check the pattern or the values")
            choices.append([(value, True) for value in values])
    return [
        ([o for o, _ in run], [o for o, swept in run if swept])
        for run in itertools.product(*choices)
    ]


def sweep_main(name: str, args: CommandLine) -> int:
    """`nmt-train -m ...`: every run composed and validated, then run one by one
    (nmt.commands.sweep); with --cfg, each run's config printed instead."""
    from nmt.commands import sweep

    if name != "train":
        raise NmtError(
            f"-m (--multirun): sweeps are run by nmt-train only; run nmt-{name.replace('_', '-')} "
            "once per value"
        )
    if int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise NmtError(
            "-m (--multirun) under torchrun: every rank would run the whole sweep; run "
            "nmt-train -m without torchrun (a sweep of multi-process runs is not supported)"
        )
    overrides, notes = rewrite_deprecated(name, args.overrides)
    for note in notes:
        print(f"nmt-{name}: note: {note}", file=sys.stderr)
    expanded = expand_sweep(overrides, args.user_dir)
    configs = []
    for i, (run_overrides, swept) in enumerate(expanded):
        try:
            cfg = compose_config(name, run_overrides, args.user_dir, args.config_name, notes=[])
            to_dataclass(cfg, name)
        except NmtError as exc:
            where = " ".join(swept) or "its overrides"
            raise NmtError(f"sweep run {i + 1} of {len(expanded)} ({where}): {exc}") from exc
        configs.append(cfg)
    sweep_dirs = sorted({str(cfg.save_dir) for cfg in configs})
    if len(sweep_dirs) > 1:
        raise NmtError(
            f"save_dir={','.join(sweep_dirs)}: differs between the runs; give one save_dir: "
            "each run trains in a folder of its own under it"
        )
    sweep_dir = Path(sweep_dirs[0])
    names = sweep.run_names([swept for _, swept in expanded])
    runs = [
        sweep.SweepRun(
            name=run_name,
            values=swept,
            overrides=[*run_overrides, f"save_dir={quoted(str(sweep_dir / run_name))}"],
            save_dir=str(sweep_dir / run_name),
        )
        for run_name, (run_overrides, swept) in zip(names, expanded)
    ]
    if args.print_cfg:
        for i, (run, cfg) in enumerate(zip(runs, configs)):
            cfg.save_dir = run.save_dir
            print(f"# sweep run {i + 1} of {len(runs)}: {' '.join(run.values) or '-'}")
            print(OmegaConf.to_yaml(cfg), end="")
        return 0
    options = [*(["--config-dir", args.user_dir] if args.user_dir else [])]
    options += ["--config-name", args.config_name] if args.config_name else []
    train = [sys.executable, "-c", "from nmt.cli import train_main; train_main()", *options]
    return sweep.run_sweep(runs, sweep_dir, train)


def to_dataclass(cfg: DictConfig, command: str = ""):
    """The composed config as its plain dataclass, checked by its own `validate()`."""
    try:
        obj = OmegaConf.to_object(cfg)
    except Exception as exc:
        raise NmtError(describe_config_error(exc, command)) from exc
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
        args = parse_args(argv)
        if args.show_help:
            print(help_text(name), end="")
            return
        if args.multirun:
            swept = sweep_main(name, args)
            if swept:
                _exit(swept)
            return
        cfg = compose_config(name, args.overrides, args.user_dir, args.config_name)
        checked = to_dataclass(cfg, name)  # an invalid config fails here, --cfg or not
        if args.print_cfg:
            print(OmegaConf.to_yaml(cfg), end="")
            return
        from nmt.config import COMMANDS

        code = COMMANDS[name]().run(checked)
        if code or _is_a_rank():  # a rank leaves without the teardown after success too
            _exit(code or 0)
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
