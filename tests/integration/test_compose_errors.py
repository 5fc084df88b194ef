"""Errors from composing a config keep the fix Hydra's message had, in one line: the
options of a config group and the closest one, the + that adds a group, the closest option
to a misspelled key at any depth, how to write several values (a list, or nmt-train's -m).

A few run the console scripts (one line on stderr, exit 2); the rest go through
compose_config, which the scripts call.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from nmt.cli import compose_config, config_dir
from nmt.config import closest_option
from nmt.errors import NmtError

BIN = Path(sys.executable).parent
ENV = {**os.environ, "NMT_DEBUG": ""}


def _console(command: str, *args: str) -> str:
    """The one line `nmt-<command> --cfg ARGS` prints on stderr, exiting with 2."""
    proc = subprocess.run(
        [str(BIN / f"nmt-{command}"), "--cfg", *args], capture_output=True, text=True, env=ENV
    )
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode == 2 and len(lines) == 1 and proc.stdout == "", proc
    prefix = f"nmt-{command}: error: "
    assert lines[0].startswith(prefix), lines[0]
    return lines[0][len(prefix) :]


def _compose_error(command: str, *overrides: str) -> str:
    with pytest.raises(NmtError) as caught:
        compose_config(command, list(overrides), notes=[])
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_a_misspelled_preset_lists_the_group_and_the_closest_one() -> None:
    message = _console("train", "model=transformer_smal")
    presets = sorted(p.stem for p in (config_dir() / "model").glob("*.yaml"))
    assert message.startswith("model=transformer_smal: no such model config; ")
    assert "did you mean model=transformer_small?" in message
    assert f"model is one of {', '.join(presets)}" in message


def test_an_added_group_keeps_its_plus_in_the_suggestion() -> None:
    message = _compose_error("train", "+experiment=multi30k_en_e")
    assert "did you mean +experiment=multi30k_en_de?" in message


def test_a_group_outside_the_defaults_list_is_added_with_plus() -> None:
    message = _console("train", "experiment=multi30k_en_de")
    assert message == (
        "experiment=multi30k_en_de: experiment is not in nmt-train's defaults list; add it "
        "with +: +experiment=multi30k_en_de"
    )


def test_a_group_in_the_defaults_list_is_not_added_twice() -> None:
    message = _compose_error("train", "+model=transformer_tiny")
    assert message.endswith("drop the +: model=transformer_tiny")


@pytest.mark.parametrize("plus", ["", "+"])
def test_a_misspelled_key_gets_the_closest_option(plus: str) -> None:
    """Hydra raises for `key=` (ConfigCompositionException) and nmt for `+key=`; both say
    the same, without Hydra's hint to add the unknown key with +."""
    message = _console("train", f"{plus}max_tokns=2048")
    assert message == (
        "max_tokns=2048: not an option of nmt-train; did you mean max_tokens=2048? "
        "(nmt-train --help lists every option)"
    )


@pytest.mark.parametrize(
    "command, override, suggestion",
    [
        ("train", "model.dropuot=0.3", "model.dropout=0.3"),  # a group's key
        ("train", "optim.lrr=1e-3", "optim.lr=1e-3"),
        ("train", "+optim.lrr=1e-3", "optim.lr=1e-3"),
        ("train", "optm.lr=1e-3", "optim.lr=1e-3"),  # the misspelling in the parent
        ("train", "dropout=0.3", "model.dropout=0.3"),  # the group left out
        ("train", "modle=transformer_tiny", "model=transformer_tiny"),
        ("score", "bleu.smooth_methd=floor", "bleu.smooth_method=floor"),
        ("score", "ref=r.txt", "refs=r.txt"),
        ("preprocess", "spm.vocab_sise=8000", "spm.vocab_size=8000"),
    ],
)
def test_misspelled_keys_at_any_depth(command: str, override: str, suggestion: str) -> None:
    message = _compose_error(command, override)
    assert f"not an option of nmt-{command}; did you mean {suggestion}?" in message


def test_nmt_score_ref_through_the_console_script() -> None:
    message = _console("score", "hyp=h.txt", "ref=r.txt")
    assert "did you mean refs=r.txt?" in message


def test_a_key_like_no_option_is_to_be_removed() -> None:
    message = _compose_error("train", "zzz=1")
    assert (
        message
        == "zzz=1: not an option of nmt-train; remove it (nmt-train --help lists every option)"
    )


def test_the_closest_option_at_three_levels() -> None:
    """The schema's keys are dotted at any depth: siblings first, then every full name."""
    names = ["validation.bleu.beam", "validation.bleu.enabled", "validation.loss", "beam_size"]
    assert closest_option("validation.bleu.beem", names) == "validation.bleu.beam"
    assert closest_option("validaton.bleu.beam", names) == "validation.bleu.beam"
    assert closest_option("nothing.like.it", names) is None


def test_several_values_without_multirun() -> None:
    message = _console("train", "optim.lr=1e-3,2e-3")
    assert message.startswith("optim.lr=1e-3,2e-3: several values; run one training per value")
    assert "-m (--multirun)" in message and "optim.lr=[1e-3,2e-3]" in message
    message = _compose_error("generate", "beam=1,2")
    assert "-m" not in message and "beam=[1,2]" in message and "beam='1,2'" in message


@pytest.mark.parametrize(
    "override, expected",
    [
        ("max_tokens=lots", "max_tokens=lots: not a whole number; give one such as "),
        ("model.dropout=abc", "model.dropout=abc: not a number; give one such as "),
        (
            "logging.progress_bar=maybe",
            "logging.progress_bar=maybe: not true or false; write true or false",
        ),
        ("validation.split=[a,b]", "validation.split=[a,b]: not one value; "),
    ],
)
def test_a_value_of_the_wrong_type_says_what_the_option_takes(override, expected) -> None:
    assert _compose_error("train", override).startswith(expected)


def test_a_list_option_given_one_value() -> None:
    assert (
        _compose_error("score", "metrics=7") == "metrics=7: not a list; write a list: metrics=[7]"
    )
