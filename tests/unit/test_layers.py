"""The layers of nmt/ and what each may import, checked with `ast` over every import.

LAYERS below is the one statement of the rule (docs/ARCHITECTURE.md shows it, and a test
keeps the two equal). Every import of every module under nmt/ counts: at module level,
inside a function (a lazy import), under `if TYPE_CHECKING:`, and importlib.import_module
with a literal name. Each is a dependency of the importing module, whenever it runs.

Checked here: each module belongs to one layer, and imports only its own layer and the
layers its row names; the third-party packages in THIRD_PARTY stay in their layers (Hydra
only in the CLI layer); no modules import each other, directly or around a cycle. A
failure names the importing file and line, the module it imports and the rule it breaks.
"""

from __future__ import annotations

import ast
import functools
import graphlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
ARCHITECTURE = REPO / "docs" / "ARCHITECTURE.md"


@dataclass(frozen=True)
class Layer:
    name: str
    modules: tuple[str, ...]  # module names; "nmt.data.*": the package and its modules
    may_import: tuple[str, ...]  # layers below this one that its modules may import
    why: str


# every layer below the commands
LIBRARY = (
    "foundation", "data", "model", "scoring", "generation", "training", "package", "interop",
    "serving",
)  # fmt: skip

# Bottom up: a layer may import its own modules and those of the layers it names, which
# come before it here.
LAYERS = (
    Layer(
        "foundation",
        ("nmt.errors", "nmt.fsutil", "nmt.processes", "nmt.textlines", "nmt.vocab")
        + ("nmt.runtime", "nmt.distributed", "nmt.checkpoint"),
        (),
        "what every layer uses: the one error, files, child processes, text lines, the "
        "special ids, device and precision, torchrun, the checkpoint file; no model, "
        "tokenizer or command",
    ),
    Layer("data", ("nmt.data.*",), ("foundation",), "text <-> ids and the data dir; no model"),
    Layer(
        "model",
        ("nmt.model.*",),
        ("foundation",),
        "the Transformer: tensors in and out, no tokenizer",
    ),
    Layer(
        "scoring",
        ("nmt.scoring",),
        ("foundation",),
        "nmt-score's core over sacrebleu, text in and scores out: a core beside data and "
        "model, under the generation and training that report BLEU with it",
    ),
    Layer(
        "generation",
        ("nmt.generation.*",),
        ("foundation", "data", "model", "scoring"),
        "loading a checkpoint for inference, the search, the Translator, nmt-generate's job",
    ),
    Layer(
        "training",
        ("nmt.training.*",),
        ("foundation", "data", "model", "scoring", "generation"),
        "validation BLEU decodes with generation's SequenceGenerator; generation never "
        "imports training",
    ),
    Layer(
        "package",
        ("nmt",),
        ("generation",),
        "nmt/__init__.py: `__version__`, and the Translator imported on first use",
    ),
    Layer(
        "interop",
        ("nmt.interop.*",),
        ("foundation", "data", "model", "generation"),
        "checkpoints to and from other toolkits, loaded as generation loads them",
    ),
    Layer(
        "serving",
        ("nmt.serving.*",),
        ("foundation", "generation", "package"),
        "HTTP over the Translator",
    ),
    Layer("commands", ("nmt.commands.*",), LIBRARY, "one library call per command"),
    Layer(
        "cli",
        ("nmt.cli", "nmt.config", "nmt.config_errors"),
        (*LIBRARY, "commands"),
        "the CLI layer, the only code that knows Hydra: composes a config, runs its command",
    ),
)

# package -> (the only layers that may import it, why)
THIRD_PARTY = {
    "hydra": (("cli",), "the library's configs are plain dataclasses"),
    "sacrebleu": (("scoring",), "BLEU, chrF and TER come from one place"),
    "sentencepiece": (("data", "generation", "interop"), "the model sees tensors only"),
    "ctranslate2": (("interop",), "an optional package, for nmt-export"),
    "fastapi": (("serving",), "training and translating never need the server's packages"),
    "starlette": (("serving",), "as fastapi"),
    "pydantic": (("serving",), "as fastapi"),
    "uvicorn": (("serving",), "as fastapi"),
    "prometheus_client": (("serving",), "as fastapi"),
}


@dataclass(frozen=True)
class Import:
    path: str  # the importing file, relative to the repository
    line: int
    importer: str  # its module name
    name: str  # the module imported: an nmt module's full name, else as written


def module_name(path: Path) -> str:
    parts = path.relative_to(REPO).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


NMT_FILES = {module_name(p): p for p in sorted((REPO / "nmt").rglob("*.py"))}


def imports_in(source: str, module: str, path: str, modules: Iterable[str]) -> Iterator[Import]:
    """Every import in `source` (the module `module`, file `path`), at any depth.
    `from a import b` imports the module a.b when `modules` has it, else a itself."""
    modules = set(modules)
    package = module if path.endswith("__init__.py") else module.rpartition(".")[0]
    for node in ast.walk(ast.parse(source, path)):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, level - 1 packages up
                parts = package.split(".")
                parts = parts[: len(parts) - node.level + 1] + [node.module or ""]
                base = ".".join(filter(None, parts))
            names = [
                f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base
                for alias in node.names
            ]
        elif (
            isinstance(node, ast.Call)
            and ast.unparse(node.func) in ("importlib.import_module", "import_module")
            and node.args
            and isinstance(node.args[0], ast.Constant)
            and isinstance(node.args[0].value, str)
        ):
            names = [node.args[0].value]
        else:
            continue
        for name in dict.fromkeys(names):
            yield Import(path, node.lineno, module, name)


@functools.cache
def all_imports() -> tuple[Import, ...]:
    return tuple(
        imp
        for module, path in NMT_FILES.items()
        for imp in imports_in(
            path.read_text(encoding="utf-8"),
            module,
            path.relative_to(REPO).as_posix(),
            NMT_FILES,
        )
    )


def is_nmt(name: str) -> bool:
    return name == "nmt" or name.startswith("nmt.")


def layer_of(module: str) -> Layer | None:
    for layer in LAYERS:
        for pattern in layer.modules:
            package = pattern.removesuffix(".*")
            if module == pattern or (
                pattern.endswith(".*") and (module == package or module.startswith(package + "."))
            ):
                return layer
    return None


def may_import(name: str) -> set[str]:
    """The layers that layer `name`'s modules may import, its own included."""
    return {name}.union(*(layer.may_import for layer in LAYERS if layer.name == name))


def layer_violations(imports: Iterable[Import], modules: Iterable[str]) -> list[str]:
    """One line per import that the table (or THIRD_PARTY) does not allow."""
    modules = set(modules)
    found = []
    for imp in imports:
        where = f"{imp.path}:{imp.line}: imports {imp.name}"
        layer = layer_of(imp.importer)
        if layer is None:
            found.append(f"{where}: {imp.importer} is in no layer; add it to LAYERS")
            continue
        if is_nmt(imp.name):
            target = layer_of(imp.name)
            if imp.name not in modules or target is None:
                found.append(f"{where}: no such module in nmt/ (or in no layer of LAYERS)")
            elif target.name not in may_import(layer.name):
                below = " and " + ", ".join(layer.may_import) if layer.may_import else ""
                found.append(
                    f"{where} ({target.name}): the {layer.name} layer may import only "
                    f"its own modules{below}"
                )
            continue
        package = imp.name.split(".")[0]
        if package in THIRD_PARTY:
            homes, why = THIRD_PARTY[package]
            if layer.name not in homes:
                found.append(
                    f"{where}: only the {', '.join(homes)} layer(s) may import {package} ({why})"
                )
    return found


def import_cycles(imports: Iterable[Import]) -> list[str]:
    """Each cycle of nmt modules importing each other, as the imports that close it (file
    and line). After a cycle is found, its last edge
    is removed and the search goes on, so that every cycle is named at least once."""
    first: dict[tuple[str, str], Import] = {}
    for imp in imports:
        if is_nmt(imp.name) and imp.name != imp.importer:
            first.setdefault((imp.importer, imp.name), imp)
    edges = set(first)
    cycles = []
    while True:
        graph: dict[str, set[str]] = {}
        for importer, imported in edges:
            graph.setdefault(importer, set()).add(imported)
        try:
            graphlib.TopologicalSorter(graph).prepare()
        except graphlib.CycleError as cycle:
            # each node is imported by the next (graphlib: "an immediate predecessor")
            nodes = cycle.args[1]
            closing = [first[(b, a)] for a, b in zip(nodes, nodes[1:])]
            cycles.append(
                "import cycle: " + "; ".join(f"{c.path}:{c.line} imports {c.name}" for c in closing)
            )
            edges.discard((closing[-1].importer, closing[-1].name))
            continue
        return cycles


def test_every_module_belongs_to_one_layer():
    unplaced = [f"{NMT_FILES[m].relative_to(REPO)}" for m in NMT_FILES if layer_of(m) is None]
    assert not unplaced, f"modules in no layer of LAYERS (add them): {unplaced}"
    named = [m for layer in LAYERS for m in layer.modules if not m.endswith(".*")]
    assert not [m for m in named if m not in NMT_FILES], "LAYERS names modules that do not exist"
    assert len(named) == len(set(named))


def test_the_table_points_down_only():
    seen: set[str] = set()
    for layer in LAYERS:
        below = set(layer.may_import) - seen
        assert not below, f"{layer.name} may import {below}, which are not below it in LAYERS"
        seen.add(layer.name)
    for package, (homes, _) in THIRD_PARTY.items():
        assert set(homes) <= seen, f"THIRD_PARTY[{package!r}] names an unknown layer"


def test_every_import_follows_the_layers():
    problems = layer_violations(all_imports(), NMT_FILES)
    assert not problems, "\n".join(problems)


def test_no_import_cycles():
    problems = import_cycles(all_imports())
    assert not problems, "\n".join(problems)


SAMPLE = """
from typing import TYPE_CHECKING
import hydra.utils
from nmt import distributed
from nmt.data.tokenizer import Tokenizer
from . import cache
if TYPE_CHECKING:
    from nmt.generation.translator import Translator

def lazy():
    from nmt.training import loop
    importlib.import_module("nmt.serving.app")
"""
SAMPLE_MODULES = {
    "nmt",
    "nmt.distributed",
    "nmt.data.tokenizer",
    "nmt.generation.translator",
    "nmt.model.cache",
    "nmt.model.transformer",
    "nmt.training.loop",
    "nmt.serving.app",
}


def test_the_checker_sees_every_kind_of_import_and_names_the_rule():
    imports = list(
        imports_in(SAMPLE, "nmt.model.transformer", "nmt/model/transformer.py", SAMPLE_MODULES)
    )
    assert sorted((i.line, i.name) for i in imports) == [
        (2, "typing"),  # (TYPE_CHECKING is not a module)
        (3, "hydra.utils"),
        (4, "nmt.distributed"),  # a module, not a name of the package nmt
        (5, "nmt.data.tokenizer"),
        (6, "nmt.model.cache"),
        (8, "nmt.generation.translator"),
        (11, "nmt.training.loop"),
        (12, "nmt.serving.app"),
    ]
    problems = layer_violations(imports, SAMPLE_MODULES)
    assert problems == [
        "nmt/model/transformer.py:3: imports hydra.utils: only the cli layer(s) may import "
        "hydra (the library's configs are plain dataclasses)",
        "nmt/model/transformer.py:5: imports nmt.data.tokenizer (data): the model layer may "
        "import only its own modules and foundation",
        "nmt/model/transformer.py:8: imports nmt.generation.translator (generation): the "
        "model layer may import only its own modules and foundation",
        "nmt/model/transformer.py:11: imports nmt.training.loop (training): the model layer "
        "may import only its own modules and foundation",
        "nmt/model/transformer.py:12: imports nmt.serving.app (serving): the model layer may "
        "import only its own modules and foundation",
    ]


def test_the_cycle_check_names_every_import_of_a_cycle():
    a = Import("nmt/data/build.py", 149, "nmt.data.build", "nmt.data.join")
    b = Import("nmt/data/join.py", 36, "nmt.data.join", "nmt.data.build")
    c = Import("nmt/data/join.py", 30, "nmt.data.join", "nmt.data.config")
    (cycle,) = import_cycles([a, b, c])
    assert cycle.startswith("import cycle: ")
    assert set(cycle.removeprefix("import cycle: ").split("; ")) == {
        "nmt/data/build.py:149 imports nmt.data.join",
        "nmt/data/join.py:36 imports nmt.data.build",
    }
    assert import_cycles([a, c]) == []


def markdown_tables() -> str:
    """LAYERS and THIRD_PARTY as docs/ARCHITECTURE.md shows them."""

    def code(names: Iterable[str]) -> str:
        return ", ".join(f"`{n}`" for n in names)

    rows = ["| layer | modules | may import | why |", "| --- | --- | --- | --- |"]
    for layer in LAYERS:
        allowed = ", ".join(layer.may_import) or "nothing in nmt"
        rows.append(f"| {layer.name} | {code(layer.modules)} | {allowed} | {layer.why} |")
    rows += ["", "| third-party package | only in | why |", "| --- | --- | --- |"]
    for package, (homes, why) in THIRD_PARTY.items():
        rows.append(f"| `{package}` | {', '.join(homes)} | {why} |")
    return "\n".join(rows) + "\n"


def test_architecture_shows_the_table():
    tables = markdown_tables()
    shown = ARCHITECTURE.read_text(encoding="utf-8")
    assert tables in shown, (
        f"{ARCHITECTURE.relative_to(REPO)} must show tests/unit/test_layers.py's tables "
        f"as they are; replace them with:\n{tables}"
    )
