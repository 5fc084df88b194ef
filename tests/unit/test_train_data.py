"""Training data at scale: memory that grows by a few bytes a pair, corpora mixed with
weights, sharded data dirs read one shard per epoch, a bounded validation set."""

from __future__ import annotations

import json
import os
import shutil
import tracemalloc
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from helpers import assert_bitwise_equal, last_params, run_training, tiny_config, with_overrides

from nmt.checkpoint import load_checkpoint
from nmt.data import build_data_dir
from nmt.data.meta import SplitInfo, load_meta, write_meta
from nmt.errors import NmtError
from nmt.training.data import load_train_data

pytestmark = pytest.mark.usefixtures("one_thread")


def _fake_data_dir(folder: Path, demo: Path, pairs: int, seed: int = 0) -> Path:
    """A data dir of `pairs` training pairs with WMT-like lengths; the .bin files are sparse
    (only the lengths matter until a batch is read), so this is fast at any size."""
    folder.mkdir(parents=True)
    rng = np.random.default_rng(seed)
    src = np.clip(rng.lognormal(3.3, 0.5, pairs), 2, 250).astype(np.int64)
    tgt = np.clip(src * rng.lognormal(0.0, 0.1, pairs), 2, 250).astype(np.int64)
    for lang, lens in (("en", src), ("de", tgt)):
        offsets = np.concatenate([[0], np.cumsum(lens)])
        offsets.tofile(folder / f"train.{lang}.idx")
        with open(folder / f"train.{lang}.bin", "wb") as f:
            f.truncate(2 * int(offsets[-1]))
    shutil.copy(demo / "spm.model", folder / "spm.model")
    meta = load_meta(demo)
    info = SplitInfo(pairs, pairs, {}, int(src.sum()), int(tgt.sum()))
    write_meta(folder, replace(meta, splits={"train": info}))
    return folder


def _peak_bytes(data_dir: Path, tmp_path: Path) -> int:
    cfg = tiny_config(data_dir, tmp_path / "run", train_split="train", max_tokens=4096)
    tracemalloc.start()
    try:
        data = load_train_data(cfg)
        batches = data.epoch_batches(1)
        assert batches.pairs() == len(data.train)
        return tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


def test_memory_grows_by_a_few_bytes_a_pair(demo_data_dir: Path, tmp_path: Path) -> None:
    """Opening the data and building an epoch's batches: at most 12 bytes a pair (the old
    int64 arrays and Python batch lists cost about 70), counted by tracemalloc, which sees
    numpy's buffers."""
    # both above the chunk sizes of the readers and the sort (about 1M pairs)
    small = _peak_bytes(_fake_data_dir(tmp_path / "small", demo_data_dir, 1_100_000), tmp_path)
    big = _peak_bytes(_fake_data_dir(tmp_path / "big", demo_data_dir, 3_100_000), tmp_path)
    per_pair = (big - small) / 2_000_000
    assert per_pair <= 12, f"{per_pair:.1f} bytes a pair"


def _counts(batches, n: int) -> np.ndarray:
    return np.bincount(np.concatenate(list(batches)), minlength=n)


def test_weights_repeat_or_subsample_each_corpus(demo_data_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(demo_data_dir, tmp_path / "run", train_split={"valid": 1, "test": 2})
    data = load_train_data(cfg)
    n_valid = load_meta(demo_data_dir).splits["valid"].kept
    n = len(data.train)
    counts = _counts(data.epoch_batches(1), n)
    usable = np.zeros(n, dtype=bool)
    usable[data.train_indices if data.train_indices is not None else slice(None)] = True
    assert (counts[:n_valid][usable[:n_valid]] == 1).all()  # valid once
    assert (counts[n_valid:][usable[n_valid:]] == 2).all()  # test twice
    assert (counts[~usable] == 0).all()
    assert any("mixing valid" in note and "x 2" in note for note in data.notes)

    half = load_train_data(replace(cfg, train_split={"valid": 0.5, "test": 1}))
    one, two = (_counts(half.epoch_batches(e), n)[:n_valid] for e in (1, 2))
    assert one.sum() == round(0.5 * usable[:n_valid].sum()) and one.max() == 1
    assert (one != two).any()  # another half every epoch
    again = load_train_data(replace(cfg, train_split={"valid": 0.5, "test": 1}))
    assert (_counts(again.epoch_batches(1), n)[:n_valid] == one).all()  # seeded
    with pytest.raises(NmtError, match=r"^train_split=nope: .*has splits"):
        load_train_data(replace(cfg, train_split={"nope": 1}))


def test_a_mixed_run_records_its_mix_and_resumes_bitwise(
    demo_data_dir: Path, tmp_path: Path
) -> None:
    mix = {"valid": 1, "test": 1.5}
    run_training(tiny_config(demo_data_dir, tmp_path / "straight", train_split=mix, max_update=8))
    run_training(tiny_config(demo_data_dir, tmp_path / "run", train_split=mix, max_update=3))
    run_training(tiny_config(demo_data_dir, tmp_path / "run", train_split=mix, max_update=8))
    assert_bitwise_equal(last_params(tmp_path / "run"), last_params(tmp_path / "straight"))
    ckpt = load_checkpoint(tmp_path / "run" / "checkpoint_last.pt")
    assert ckpt["config"]["train_split"] == mix
    start = json.loads((tmp_path / "run" / "train.jsonl").read_text().splitlines()[0])
    assert start["config"]["train_split"] == mix


def _shard(small_corpus: Path, preprocess_config, dest: Path, part: slice, **over: str) -> None:
    folder = dest.parent / f"{dest.name}-text"
    folder.mkdir()
    for lang in ("en", "de"):
        lines = (small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (folder / f"train.{lang}").write_text("\n".join(lines[part]) + "\n", encoding="utf-8")
    build_data_dir(
        preprocess_config(f"data.trainpref={folder / 'train'}", f"data.dest={dest}", *over.values())
    )


def test_joined_shards_are_trained_on_one_per_epoch_and_resume_mid_shard(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    _shard(small_corpus, preprocess_config, tmp_path / "s0", slice(0, 250))
    model = f"spm.model={tmp_path / 's0' / 'spm.model'}"
    no_eval = {"v": "data.validpref=null", "t": "data.testpref=[]"}
    _shard(small_corpus, preprocess_config, tmp_path / "s1", slice(250, 400), m=model, **no_eval)
    report = build_data_dir(
        preprocess_config(
            f"join=[{tmp_path / 's0'},{tmp_path / 's1'}]", f"data.dest={tmp_path / 'j'}"
        )
    )
    assert report.lines()[-2] == "joined 2 data dirs (500 pairs)"
    meta = load_meta(tmp_path / "j")
    assert meta.splits["train"].shards == ["train.0", "train.1"]
    assert meta.splits["train"].lines == 400 and meta.splits["valid"].shards == []
    same = (
        os.stat(tmp_path / "j" / "train.1.de.bin").st_ino
        == os.stat(tmp_path / "s1" / "train.de.bin").st_ino
    )
    assert same  # hard links, no copy
    assert (
        "shards" not in json.loads((tmp_path / "s0" / "meta.json").read_text())["splits"]["train"]
    )

    cfg = tiny_config(
        tmp_path / "j", tmp_path / "run", train_split="train", validation={"split": "valid"}
    )
    data = load_train_data(cfg)
    kept = [load_meta(tmp_path / s).splits["train"].kept for s in ("s0", "s1")]
    for epoch, shard in ((1, 0), (2, 1), (3, 0)):
        assert data.epoch_batches(epoch).pairs() <= len(data.train) == kept[shard]
    assert any("2 shards, one per epoch" in note for note in data.notes)
    result = run_training(with_overrides(cfg, max_epoch=2, max_update=0, validation={"split": ""}))
    assert result.epoch == 3

    # stopped in the middle of the second shard's epoch, resumed: the same run, bit for bit
    first, second = len(data.epoch_batches(1)), len(data.epoch_batches(2))
    assert second >= 3
    straight = with_overrides(cfg, save_dir=str(tmp_path / "straight"), validation={"split": ""})
    run_training(replace(straight, max_update=first + second - 1))
    stopped = replace(straight, save_dir=str(tmp_path / "stopped"))
    run_training(replace(stopped, max_update=first + 1))
    state = load_checkpoint(tmp_path / "stopped" / "checkpoint_last.pt")["train_state"]
    assert (state["epoch"], state["position"]) == (2, 1)  # one batch into shard 2's epoch
    run_training(replace(stopped, max_update=first + second - 1))
    assert_bitwise_equal(last_params(tmp_path / "stopped"), last_params(tmp_path / "straight"))


def test_join_refuses_shards_that_do_not_fit(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    _shard(small_corpus, preprocess_config, tmp_path / "s0", slice(0, 200))
    _shard(small_corpus, preprocess_config, tmp_path / "s1", slice(200, 400))  # its own model
    with pytest.raises(NmtError, match=r"^join=.*s1: its SentencePiece model \(src\) differs"):
        build_data_dir(preprocess_config(f"join=[{tmp_path / 's0'},{tmp_path / 's1'}]"))
    with pytest.raises(NmtError, match=r"data.dest=.*is one of the data dirs to join"):
        build_data_dir(
            preprocess_config(
                f"join=[{tmp_path / 's0'}]", f"data.dest={tmp_path / 's0'}", "overwrite=true"
            )
        )
    assert not (tmp_path / "out").exists()


def test_validation_on_the_first_valid_max_pairs(demo_data_dir: Path, tmp_path: Path) -> None:
    cfg = tiny_config(
        demo_data_dir, tmp_path / "run", validation={"split": "test", "max_pairs": 40}
    )
    (valid,) = load_train_data(cfg).valid_sets
    assert valid.direction == "" and len(valid.dataset) == 40
    assert sorted(np.concatenate(list(valid.batches)).tolist()) == list(range(40))
    data = load_train_data(cfg)
    assert any("the first 40 of" in note for note in data.notes)
    (whole,) = load_train_data(with_overrides(cfg, validation={"max_pairs": 0})).valid_sets
    assert len(whole.dataset) == load_meta(demo_data_dir).splits["test"].kept
    assert (whole.dataset.tgt_sizes[:40] == valid.dataset.tgt_sizes).all()
