"""One config contract: each command's YAML file gives exactly its dataclass's defaults,
every preset of the config groups composes into a config that passes its own validate(), and
renamed keys keep working for the release that DEPRECATED_KEYS names."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from omegaconf import OmegaConf

from nmt.cli import compose_config, to_dataclass
from nmt.config import COMMANDS, DEPRECATED_KEYS
from nmt.errors import NmtError
from nmt.training.config import TrainConfig

REPO = Path(__file__).resolve().parents[2]
PATHS = ["data=data-bin/x", "save_dir=runs/x"]  # nmt-train requires both


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
            compose_config("train", [override, *PATHS, "max_update=100000", "max_time=1.0"]),
            "train",
        )


def _another_value(value: Any) -> Any:
    """A value of the same kind as `value` that differs from it (validate() not applied)."""
    if isinstance(value, bool):
        return not value
    if isinstance(value, (int, float)):
        return value + 2
    return "other"


def test_every_flat_key_of_0_1_still_sets_its_sectioned_key_with_a_note():
    """TrainConfig's flat keys (valid_split=, eval_bleu_beam=, ...) work until 0.3.0: on the
    command line each becomes its new key, with one note naming both and the removal."""
    aliases = DEPRECATED_KEYS["train"]
    assert len(aliases) >= 34
    defaults = OmegaConf.structured(TrainConfig)
    old, new = ["data=d", "save_dir=r"], ["data=d", "save_dir=r"]
    for flat, (dotted, removal) in aliases.items():
        assert removal == "0.3.0" and OmegaConf.select(defaults, flat) is None
        value = _another_value(OmegaConf.select(defaults, dotted, throw_on_missing=True))
        old.append(f"{flat}={value}")
        new.append(f"{dotted}={value}")
    notes: list[str] = []
    renamed = OmegaConf.to_object(compose_config("train", old, notes=notes))
    assert renamed == OmegaConf.to_object(compose_config("train", new))
    assert len(notes) == len(aliases)
    for note, (flat, (dotted, _)) in zip(notes, aliases.items()):
        assert note == f"{flat}= is deprecated, renamed to {dotted}= (removed in 0.3.0)"


def test_a_flat_key_in_a_config_file_is_an_error_naming_its_new_name(tmp_path):
    (tmp_path / "mine.yaml").write_text("defaults:\n  - train\n  - _self_\nvalid_split: test\n")
    with pytest.raises(NmtError) as info:
        compose_config("train", ["data=d", "save_dir=r"], str(tmp_path), "mine")
    assert str(info.value) == (
        "valid_split: renamed to validation.split (its old name works on the command line "
        "until 0.3.0); write validation.split=... instead"
    )
