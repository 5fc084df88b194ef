"""Reliability (issue 7), checkpoints: corruption is detected (sha256 stored inside), foreign
shapes and vocabularies are refused, pickled code never runs, and a full disk keeps the
previous checkpoint intact. Errors reach the user as one line naming the file."""

from __future__ import annotations

import errno
import os
import shutil
from pathlib import Path

import pytest
import torch
from helpers import run_training, tiny_config
from test_reliability_input import one_line_error, train_args

from nmt.checkpoint import CHECKSUM_KEY, load_checkpoint, payload_checksum, save_checkpoint
from nmt.errors import NmtError


@pytest.fixture(scope="module")
def trained(demo_data_dir, tmp_path_factory) -> Path:
    """A run dir with two updates of the tiny model on the demo data dir."""
    save_dir = tmp_path_factory.mktemp("ckpt-run")
    run_training(tiny_config(demo_data_dir, save_dir, max_update=2))
    return save_dir


@pytest.fixture
def text(tmp_path) -> Path:
    path = tmp_path / "in.en"
    path.write_text("a dog runs .\n", encoding="utf-8")
    return path


def generate_error(nmt_cli, ckpt: Path, text: Path, *needles: str) -> str:
    out = text.with_suffix(".out")
    code, _, err = nmt_cli(
        "generate", f"checkpoint={ckpt}", f"input={text}", "device=cpu", f"output={out}"
    )
    assert not out.exists()
    return one_line_error(code, err, "generate", str(ckpt), *needles)


def test_checksum_is_stored_and_checked(trained, tmp_path):
    raw = torch.load(trained / "checkpoint_last.pt", weights_only=True)
    assert raw[CHECKSUM_KEY] == payload_checksum(raw)
    loaded = load_checkpoint(trained / "checkpoint_last.pt")
    assert CHECKSUM_KEY not in loaded  # callers see the documented layout only
    # a re-save of a loaded (and changed) checkpoint gets a fresh, valid checksum
    loaded["model"] = {k: v + 1 for k, v in loaded["model"].items()}
    save_checkpoint(loaded, tmp_path / "changed.pt")
    assert load_checkpoint(tmp_path / "changed.pt")["train_state"]["num_updates"] == 2


def test_truncated_checkpoint_is_detected(nmt_cli, trained, text, tmp_path):
    bad = tmp_path / "truncated.pt"
    data = (trained / "checkpoint_last.pt").read_bytes()
    for size in (0, 100, len(data) // 2, len(data) - 10):
        bad.write_bytes(data[:size])
        generate_error(nmt_cli, bad, text, "corrupted")


def test_a_flipped_bit_in_the_weights_is_detected(nmt_cli, trained, text, tmp_path):
    """torch.load itself reads such a file without complaint; the stored sha256 catches it."""
    data = bytearray((trained / "checkpoint_last.pt").read_bytes())
    start = data.find(b"/data/0") + 400  # inside the first tensor's bytes
    data[start] ^= 0x10
    bad = tmp_path / "flipped.pt"
    bad.write_bytes(bytes(data))
    generate_error(nmt_cli, bad, text, "checksum mismatch")
    with pytest.raises(NmtError, match="checksum mismatch"):
        load_checkpoint(bad)


def test_corrupted_checkpoint_last_stops_a_resume(nmt_cli, demo_data_dir, trained, tmp_path):
    run = tmp_path / "run"
    shutil.copytree(trained, run)
    last = run / "checkpoint_last.pt"
    os.unlink(last)  # break the hard link before editing: the other names stay good
    data = (trained / "checkpoint_last.pt").read_bytes()
    last.write_bytes(data[: len(data) // 3])
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "max_update=4"))
    one_line_error(code, err, "train", str(last))
    assert last.read_bytes() == data[: len(data) // 3]  # nothing overwritten


def test_weights_of_another_shape_are_refused(nmt_cli, trained, text, tmp_path):
    ckpt = load_checkpoint(trained / "checkpoint_last.pt")
    name = next(k for k in ckpt["model"] if k.endswith("fc1.weight"))
    ckpt["model"][name] = torch.zeros(7, 3)
    save_checkpoint(ckpt, tmp_path / "shape.pt")
    generate_error(nmt_cli, tmp_path / "shape.pt", text, "do not fit", name)


class RunsCode:
    """Unpickling this calls os.system: what a malicious checkpoint would carry."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self):  # noqa: ANN204
        return os.system, (f"touch {self.marker}",)


def test_a_checkpoint_that_runs_code_is_refused_unexecuted(nmt_cli, trained, text, tmp_path):
    marker = tmp_path / "pwned"
    evil = dict(load_checkpoint(trained / "checkpoint_last.pt"))
    evil["config"] = {"payload": RunsCode(marker)}
    path = tmp_path / "evil.pt"
    torch.save(evil, path)  # an ordinary pickle, as someone else's tool would write it
    generate_error(nmt_cli, path, text)
    with pytest.raises(NmtError, match="not a readable nmt checkpoint"):
        load_checkpoint(path)
    assert not marker.exists()


def test_vocab_of_another_data_dir_is_refused(nmt_cli, preprocess_config, tmp_path):
    """Resume and resume.finetune_from compare vocab sizes and the tokenizers themselves."""
    from nmt.data import build_data_dir

    first = preprocess_config("spm.vocab_size=200", f"data.dest={tmp_path / 'a'}")
    same_size = preprocess_config(
        "spm.vocab_size=200", "spm.model_type=unigram", f"data.dest={tmp_path / 'b'}"
    )
    bigger = preprocess_config("spm.vocab_size=240", f"data.dest={tmp_path / 'c'}")
    for cfg in (first, same_size, bigger):
        build_data_dir(cfg)
    code, _, err = nmt_cli("train", *train_args(tmp_path / "a", tmp_path / "run"))
    assert code == 0, err
    last = tmp_path / "run" / "checkpoint_last.pt"
    before = last.read_bytes()
    code, _, err = nmt_cli("train", *train_args(tmp_path / "c", tmp_path / "run", "max_update=2"))
    one_line_error(code, err, "train", str(last), "src_vocab_size")
    code, _, err = nmt_cli("train", *train_args(tmp_path / "b", tmp_path / "run", "max_update=2"))
    one_line_error(code, err, "train", str(last), "tokenizer")
    code, _, err = nmt_cli(
        "train", *train_args(tmp_path / "b", tmp_path / "ft", f"resume.finetune_from={last}")
    )
    one_line_error(code, err, "train", str(last), "tokenizer")
    assert last.read_bytes() == before and not (tmp_path / "ft" / "checkpoint_last.pt").exists()


def test_full_disk_keeps_the_previous_checkpoint(nmt_cli, demo_data_dir, tmp_path, monkeypatch):
    run = tmp_path / "run"
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "max_update=2"))
    assert code == 0, err
    before = (run / "checkpoint_last.pt").read_bytes()
    real_save = torch.save

    def disk_full(obj, f, *args, **kwargs):  # noqa: ANN001, ANN202
        f.write(b"PK\x03\x04 partial")  # some bytes reach the disk, then it is full
        raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))

    monkeypatch.setattr(torch, "save", disk_full)
    code, _, err = nmt_cli("train", *train_args(demo_data_dir, run, "max_update=4"))
    monkeypatch.setattr(torch, "save", real_save)
    line = one_line_error(
        code,
        err.strip().splitlines()[-1] + "\n",
        "train",
        "checkpoint_last.pt",
        "No space left on device",
        "previous checkpoint is intact",
    )
    assert "error" in line and err.count("error:") == 1 and "Traceback" not in err
    assert (run / "checkpoint_last.pt").read_bytes() == before
    assert load_checkpoint(run / "checkpoint_last.pt")["train_state"]["num_updates"] == 2
    assert [p.name for p in run.iterdir() if p.name.endswith(".tmp")] == []
