"""The checkpoint manager: files written, pruning, links, RNG capture, best tracking."""

import errno
import os
import random
from pathlib import Path

import numpy as np
import pytest
import torch

from nmt.checkpoint import build_checkpoint, load_checkpoint
from nmt.errors import NmtError
from nmt.training.checkpointing import BestTracker, CheckpointManager, rng_state, set_rng_state


def _state(update: int) -> dict:
    return build_checkpoint(
        model_state={"w": torch.full((2,), float(update))},
        model_config={"embed_dim": 4},
        data={"src_lang": "en"},
        src_tokenizer=b"spm",
        tgt_tokenizer=b"spm",
        train_state={"num_updates": update, "rng": rng_state()},
        config={"seed": 1},
    )


def test_numbered_checkpoints_are_pruned_to_keep_last(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=2, keep_best=0, metric="loss", maximize=False)
    for u in (10, 20, 30):
        m.save(_state(u), epoch=1, update=u, numbered=True, best_value=None)
    names = sorted(p.name for p in tmp_path.glob("*.pt"))
    assert names == ["checkpoint_1_20.pt", "checkpoint_1_30.pt", "checkpoint_last.pt"]
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["num_updates"] == 30
    assert load_checkpoint(tmp_path / "checkpoint_1_20.pt")["train_state"]["num_updates"] == 20


def test_best_files_keep_the_best_k(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=-1, keep_best=2, metric="loss", maximize=False)
    for u, value in ((1, 5.0), (2, 4.0), (3, 4.5), (4, 3.0)):
        m.save(_state(u), epoch=1, update=u, numbered=False, best_value=value)
    kept = [v for v, _ in m.best_k()]
    assert kept == [3.0, 4.0]
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["train_state"]["num_updates"] == 4


def test_a_later_save_does_not_change_linked_files(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=-1, keep_best=0, metric="loss", maximize=False)
    m.save(_state(1), epoch=1, update=1, numbered=True, best_value=None)
    m.save(_state(2), epoch=1, update=2, numbered=False, best_value=None)
    assert load_checkpoint(tmp_path / "checkpoint_1_1.pt")["model"]["w"][0] == 1.0
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["model"]["w"][0] == 2.0
    assert not list(tmp_path.glob(".*tmp"))


def test_rng_state_round_trips_through_a_weights_only_checkpoint(tmp_path):
    torch.manual_seed(3), np.random.seed(3), random.seed(3)
    m = CheckpointManager(tmp_path, keep_last=1, keep_best=0, metric="loss", maximize=False)
    m.save(_state(1), epoch=1, update=1, numbered=False, best_value=None)
    expected = (torch.rand(3), np.random.rand(3), random.random())
    set_rng_state(load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["rng"])
    again = (torch.rand(3), np.random.rand(3), random.random())
    assert torch.equal(expected[0], again[0])
    assert np.array_equal(expected[1], again[1]) and expected[2] == again[2]


def test_best_tracker_patience_and_direction():
    t = BestTracker("loss", maximize=False)
    assert [t.update(v) for v in (3.0, 2.0, 2.5, 2.1, 1.0)] == [True, True, False, False, True]
    assert t.bad_validations == 0 and t.best == 1.0
    t.update(1.5)
    restored = BestTracker("loss", maximize=False)
    restored.load_state_dict(t.state_dict())
    assert restored.best == 1.0 and restored.bad_validations == 1
    bleu = BestTracker("bleu", maximize=True)
    assert bleu.update(10.0) and bleu.update(12.0) and not bleu.update(11.0)
    fresh = BestTracker("bleu", maximize=True)
    fresh.load_state_dict(t.state_dict())  # another metric: start afresh
    assert fresh.best is None


def test_stale_temporaries_of_every_name_are_removed_and_nothing_else(tmp_path):
    """What a kill leaves mid-write, in nmt.fsutil's naming `.<name>.<random>.tmp`: the
    serialised checkpoint, a link being put in place, config.yaml."""
    m = CheckpointManager(tmp_path, keep_last=-1, keep_best=1, metric="loss", maximize=False)
    m.save(_state(1), epoch=1, update=1, numbered=True, best_value=2.5)
    stale = [
        ".checkpoint_last.pt.k3j4_x9q.tmp",
        ".checkpoint_1_2.pt.0a1b2c3d.tmp",
        ".checkpoint.best_loss_2.0000.pt.0a1b2c3d.tmp",
        ".checkpoint_best.pt.link.tmp",  # the name runs before issue 16 used for links
        ".config.yaml.abcd1234.tmp",
    ]
    kept = ["notes.tmp", ".checkpoint_last.pt.swp", "train.jsonl"]
    for name in stale + kept:
        (tmp_path / name).write_bytes(b"partial")
    before = {p.name for p in tmp_path.glob("checkpoint*.pt")}
    removed = m.remove_stale_temps()
    assert sorted(p.name for p in removed) == sorted(stale)
    assert all((tmp_path / name).exists() for name in kept)
    assert {p.name for p in tmp_path.glob("checkpoint*.pt")} == before
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["train_state"]["num_updates"] == 1


def test_a_failed_link_leaves_no_temporary(tmp_path, monkeypatch):
    m = CheckpointManager(tmp_path, keep_last=-1, keep_best=0, metric="loss", maximize=False)
    real_replace = os.replace

    def replace_fails_for_links(src, dst):
        if Path(dst).name != "checkpoint_last.pt":
            raise OSError(errno.ENOSPC, os.strerror(errno.ENOSPC))
        real_replace(src, dst)

    monkeypatch.setattr(os, "replace", replace_fails_for_links)
    with pytest.raises(
        NmtError, match=r"could not write checkpoint files .*; checkpoint_last.pt is complete"
    ):
        m.save(_state(2), epoch=1, update=2, numbered=True, best_value=None)
    monkeypatch.undo()
    assert not list(tmp_path.glob(".*.tmp"))
    assert load_checkpoint(tmp_path / "checkpoint_last.pt")["train_state"]["num_updates"] == 2


def _copies_of_last(save_dir: Path) -> list[str]:
    return load_checkpoint(save_dir / "checkpoint_last.pt")["train_state"]["copies"]


def test_complete_copies_makes_missing_and_earlier_ones_and_leaves_later_ones(tmp_path):
    """What a re-run does after a kill between checkpoint_last.pt and its copies (the
    process-level kill -9 is tests/integration/test_reliability_crash.py); a rewound
    checkpoint_last.pt (a user's `cp` of an old one) never overwrites a later checkpoint."""
    m = CheckpointManager(tmp_path, keep_last=2, keep_best=1, metric="loss", maximize=False)
    m.save(_state(1), epoch=1, update=1, numbered=True, best_value=5.0)
    m.save(_state(2), epoch=1, update=2, numbered=True, best_value=4.0)
    names = _copies_of_last(tmp_path)
    assert names == ["checkpoint_1_2.pt", "checkpoint_best.pt", "checkpoint.best_loss_4.0000.pt"]
    assert m.complete_copies(names, 2) == []  # all made: nothing to do
    # as a kill before the copies leaves them: numbered and best_k missing, best one save behind
    (tmp_path / "checkpoint_1_2.pt").unlink()
    (tmp_path / "checkpoint.best_loss_4.0000.pt").unlink()
    (tmp_path / "checkpoint_best.pt").write_bytes((tmp_path / "checkpoint_1_1.pt").read_bytes())
    assert sorted(p.name for p in m.complete_copies(names, 2)) == sorted(names)
    for name in names:
        assert load_checkpoint(tmp_path / name)["model"]["w"][0] == 2.0
    assert not list(tmp_path.glob(".*tmp"))
    # rewound: checkpoint_last.pt replaced by update 1, whose save named checkpoint_best.pt too
    (tmp_path / "checkpoint_last.pt").write_bytes((tmp_path / "checkpoint_1_1.pt").read_bytes())
    assert m.complete_copies(_copies_of_last(tmp_path), 1) == []
    assert load_checkpoint(tmp_path / "checkpoint_best.pt")["model"]["w"][0] == 2.0


def test_complete_copies_leaves_an_unreadable_file_alone(tmp_path):
    m = CheckpointManager(tmp_path, keep_last=2, keep_best=0, metric="loss", maximize=False)
    m.save(_state(3), epoch=1, update=3, numbered=True, best_value=None)
    (tmp_path / "checkpoint_1_3.pt").write_bytes(b"not a checkpoint")
    assert m.complete_copies(_copies_of_last(tmp_path), 3) == []
    assert (tmp_path / "checkpoint_1_3.pt").read_bytes() == b"not a checkpoint"


def test_complete_copies_on_a_file_size_limit_is_one_line_error(tmp_path):
    """A real limit (RLIMIT_FSIZE; CPython ignores SIGXFSZ, so the write fails with EFBIG)."""
    import resource

    m = CheckpointManager(tmp_path, keep_last=2, keep_best=0, metric="loss", maximize=False)
    m.save(_state(3), epoch=1, update=3, numbered=True, best_value=None)
    (tmp_path / "checkpoint_1_3.pt").unlink()
    soft, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
    resource.setrlimit(resource.RLIMIT_FSIZE, (100, hard))
    try:
        with pytest.raises(NmtError, match=r"checkpoint_1_3.pt: could not write this copy"):
            m.complete_copies(_copies_of_last(tmp_path), 3)
    finally:
        resource.setrlimit(resource.RLIMIT_FSIZE, (soft, hard))
    assert not (tmp_path / "checkpoint_1_3.pt").exists() and not list(tmp_path.glob(".*tmp"))
