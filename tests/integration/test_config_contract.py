"""One config contract: each command's YAML file gives exactly its dataclass's defaults, and
every preset of the config groups composes into a config that passes its own validate()."""

from __future__ import annotations

from pathlib import Path

import pytest
from omegaconf import OmegaConf

from nmt.cli import compose_config, to_dataclass
from nmt.config import COMMANDS

REPO = Path(__file__).resolve().parents[2]


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_the_yaml_defaults_are_the_dataclass_defaults(command):
    """`nmt-<command>` with no overrides runs with `<Schema>()`, so the library and the CLI
    agree on every default (validate() is not called: some commands need an input path)."""
    schema = COMMANDS[command]().schema
    assert OmegaConf.to_object(compose_config(command, [])) == schema()


@pytest.mark.parametrize(
    "group", ["model", "optim", "experiment"], ids=lambda group: f"configs/{group}"
)
def test_every_preset_composes_and_validates(group):
    presets = sorted(p.stem for p in (REPO / "configs" / group).glob("*.yaml"))
    assert presets
    for preset in presets:
        override = f"+experiment={preset}" if group == "experiment" else f"{group}={preset}"
        # a cosine schedule needs its end (configs/optim/adam_cosine.yaml says so), a
        # time-based one its budget (adam_cosine_time.yaml)
        to_dataclass(
            compose_config("train", [override, "max_update=100000", "max_time=1.0"]), "train"
        )
