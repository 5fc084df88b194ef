"""Registers each command's structured config (a dataclass) in Hydra's ConfigStore.

The dataclasses themselves live next to the code that uses them and import nothing
from Hydra; this module and `cli.py` are the only places that know about Hydra.
Each command's YAML file (configs/<command>.yaml) starts its defaults list with
`<command>_schema`, so every key and type is checked against the dataclass.
"""

from __future__ import annotations

import dataclasses
import difflib
import typing
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from hydra.core.config_store import ConfigStore


def config_dir() -> Path:
    """The built-in configs: the checkout's configs/ folder, or nmt/configs in a wheel."""
    checkout = Path(__file__).resolve().parent.parent / "configs"
    if (checkout / "train.yaml").exists() or (checkout / "preprocess.yaml").exists():
        return checkout
    from importlib.resources import files

    return Path(str(files("nmt.configs")))


@dataclass(frozen=True)
class CommandSpec:
    """What the CLI needs to know about one command."""

    name: str  # "preprocess": the YAML file is configs/preprocess.yaml
    schema: type  # the dataclass the composed config must fit
    run: Callable[[Any], int | None]  # commands/<name>.run(cfg) -> exit code (None = 0)


def _preprocess() -> CommandSpec:
    from nmt.commands import preprocess
    from nmt.data.config import PreprocessConfig

    return CommandSpec("preprocess", PreprocessConfig, preprocess.run)


def _shortlist() -> CommandSpec:
    from nmt.commands import shortlist
    from nmt.data.config import ShortlistConfig

    return CommandSpec("shortlist", ShortlistConfig, shortlist.run)


def _score() -> CommandSpec:
    from nmt.commands import score
    from nmt.scoring import ScoreConfig

    return CommandSpec("score", ScoreConfig, score.run)


def _generate() -> CommandSpec:
    from nmt.commands import generate
    from nmt.generation.config import GenerateConfig

    return CommandSpec("generate", GenerateConfig, generate.run)


def _export() -> CommandSpec:
    from nmt.commands import export
    from nmt.interop.config import ExportConfig

    return CommandSpec("export", ExportConfig, export.run)


def _import_fairseq() -> CommandSpec:
    from nmt.commands import import_fairseq
    from nmt.interop.config import ImportFairseqConfig

    return CommandSpec("import_fairseq", ImportFairseqConfig, import_fairseq.run)


def _train() -> CommandSpec:
    from nmt.commands import train
    from nmt.training.config import TrainConfig

    return CommandSpec("train", TrainConfig, train.run)


def _average() -> CommandSpec:
    from nmt.commands import average
    from nmt.training.config import AverageConfig

    return CommandSpec("average", AverageConfig, average.run)


def _serve() -> CommandSpec:
    from nmt.commands import serve
    from nmt.serving.config import ServeConfig

    return CommandSpec("serve", ServeConfig, serve.run)


# Keys that were renamed, per command: old -> (new, why). Using an old key is a one-line
# error that names the new one (nmt.cli).
RENAMED_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "preprocess": {
        "clean.max_tokens": (
            "clean.max_pieces",
            "cleaning counts SentencePiece pieces per side; nmt-train's max_tokens is the "
            "batch budget",
        ),
    },
}

# Keys that still work under their old name for one more release, per command:
# old -> (new, the version that removes the old name). The CLI rewrites `old=value` on the
# command line to `new=value` and prints a one-line note; CHANGELOG.md lists each one.
# (A renamed key that no longer works belongs in RENAMED_KEYS.)
DEPRECATED_KEYS: dict[str, dict[str, tuple[str, str]]] = {
    "generate": {"dtype": ("precision", "0.3.0")},
    # TrainConfig's flat keys of 0.1, now in sections (nmt.training.config)
    "train": {
        old: (new, "0.3.0")
        for old, new in {
            "valid_split": "validation.split",
            "valid_max_pairs": "validation.max_pairs",
            "valid_max_tokens": "validation.max_tokens",
            "validate_interval_updates": "validation.interval_updates",
            "validate_every_epoch": "validation.every_epoch",
            "best_metric": "validation.best_metric",
            "patience": "validation.patience",
            "eval_bleu": "validation.bleu.enabled",
            "eval_bleu_max_sentences": "validation.bleu.max_sentences",
            "eval_bleu_beam": "validation.bleu.beam",
            "eval_bleu_len_a": "validation.bleu.len_a",
            "eval_bleu_len_b": "validation.bleu.len_b",
            "save_interval_updates": "checkpoint.save_interval_updates",
            "keep_last": "checkpoint.keep_last",
            "keep_best": "checkpoint.keep_best",
            "ema_decay": "checkpoint.ema_decay",
            "no_save": "checkpoint.no_save",
            "finetune_from": "resume.finetune_from",
            "reset_optimizer": "resume.reset_optimizer",
            "reset_lr_scheduler": "resume.reset_lr_scheduler",
            "reset_dataloader": "resume.reset_dataloader",
            "reset_data_check": "resume.reset_data_check",
            "label_smoothing": "loss.label_smoothing",
            "rdrop_alpha": "loss.rdrop_alpha",
            "src_subword_alpha": "subword.src_alpha",
            "tgt_subword_alpha": "subword.tgt_alpha",
            "subword_nbest_size": "subword.nbest_size",
            "fp16_init_scale": "fp16.init_scale",
            "fp16_min_scale": "fp16.min_scale",
            "clip_norm": "optim.clip_norm",
            "log_interval": "logging.interval",
            "progress_bar": "logging.progress_bar",
            "tensorboard": "logging.tensorboard",
            "ddp_timeout": "distributed.timeout",
        }.items()
    },
}

COMMANDS: dict[str, Callable[[], CommandSpec]] = {
    "preprocess": _preprocess,
    "train": _train,
    "average": _average,
    "score": _score,
    "generate": _generate,
    "shortlist": _shortlist,
    "export": _export,
    "import_fairseq": _import_fairseq,
    "serve": _serve,
}


def register(spec: CommandSpec) -> None:
    """Store the schema under `<name>_schema` for the YAML defaults list to extend."""
    ConfigStore.instance().store(name=f"{spec.name}_schema", node=spec.schema)


def option_names(schema: type, prefix: str = "") -> list[str]:
    """Every option of a config dataclass as its dotted key (`model.dropout`), nested
    dataclasses included; a list's or a dict's items are not options of their own."""
    names = []
    hints = typing.get_type_hints(schema)
    for field in dataclasses.fields(schema):
        key = f"{prefix}{field.name}"
        names.append(key)
        kind = hints[field.name]
        inner = [a for a in typing.get_args(kind) if a is not type(None)]
        if typing.get_origin(kind) is typing.Union and len(inner) == 1:
            kind = inner[0]  # Optional[X]
        if dataclasses.is_dataclass(kind):
            names += option_names(kind, f"{key}.")  # type: ignore[arg-type]
    return names


def closest_option(key: str, names: Iterable[str]) -> str | None:
    """The option `key` most likely misspells (difflib's ratio): among its siblings first
    (`optim.lrr` -> `optim.lr`), then among the full dotted names (`dropout` ->
    `model.dropout`, `optm.lr` -> `optim.lr`)."""
    names = list(names)
    parent, _, leaf = key.rpartition(".")
    siblings = [n.rpartition(".")[2] for n in names if n.rpartition(".")[0] == parent]
    close = difflib.get_close_matches(leaf, siblings, n=1)
    if close:
        return f"{parent}.{close[0]}" if parent else close[0]
    close = difflib.get_close_matches(key, names, n=1)
    return close[0] if close else None
