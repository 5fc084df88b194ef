"""The scale features from the command line, equal to the library: extra training corpora,
joined shards and a weighted mix, composed by Hydra as a user types them; the corpus maker
(benchmarks.make_corpus) killed mid-corpus, and its compressed output."""

from __future__ import annotations

import gzip
import lzma
import subprocess
import sys
from dataclasses import asdict
from pathlib import Path

import pytest
import yaml
from helpers import assert_bitwise_equal, kill_9_when, last_params, run_training, tiny_config

from benchmarks import make_corpus
from nmt.checkpoint import load_checkpoint
from nmt.data.meta import load_meta
from nmt.fsutil import stale_temps

REPO = Path(__file__).resolve().parents[2]

pytestmark = pytest.mark.usefixtures("one_thread")


def test_extra_corpora_join_and_a_weighted_mix_from_the_cli(nmt_cli, small_corpus, tmp_path):
    for lang in ("en", "de"):
        lines = (small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (small_corpus / f"clean.{lang}").write_text("\n".join(lines[:100]) + "\n", encoding="utf-8")
        (small_corpus / f"more.{lang}").write_text("\n".join(lines[100:]) + "\n", encoding="utf-8")
    common = ["spm.vocab_size=200", "spm.byte_fallback=false", "spm.num_threads=1", "workers=1"]
    code, out, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'train'}",
        f"+data.extra_train.clean={small_corpus / 'clean'}",
        f"data.validpref={small_corpus / 'valid'}",
        "data.testpref=[]",
        f"data.dest={tmp_path / 'a'}",
        *common,
    )
    assert code == 0, err
    code, _, err = nmt_cli(
        "preprocess",
        f"data.trainpref={small_corpus / 'more'}",
        f"spm.model={tmp_path / 'a' / 'spm.model'}",
        "data.validpref=null",
        "data.testpref=[]",
        f"data.dest={tmp_path / 'b'}",
        *common,
    )
    assert code == 0, err
    code, out, err = nmt_cli(
        "preprocess", f"join=[{tmp_path / 'a'},{tmp_path / 'b'}]", f"data.dest={tmp_path / 'j'}"
    )
    assert code == 0, err
    assert "nmt-preprocess: joined 2 data dirs" in out
    meta = load_meta(tmp_path / "j")
    assert list(meta.splits) == ["train", "clean", "valid"]
    assert meta.splits["train"].shards == ["train.0", "train.1"]

    cfg = tiny_config(
        tmp_path / "j", tmp_path / "api", train_split={"train": 1, "clean": 2}, max_update=4
    )
    run_training(cfg)
    model = [f"model.{key}={value}" for key, value in asdict(cfg.model).items()]
    optim = [f"optim.{key}={value}" for key, value in asdict(cfg.optim).items() if key != "betas"]
    code, _, err = nmt_cli(
        "train",
        f"data={tmp_path / 'j'}",
        f"save_dir={tmp_path / 'cli'}",
        "train_split={train:1,clean:2}",
        "validation.split=''",
        "max_tokens=500",
        "device=cpu",
        "threads=1",
        "max_update=4",
        "logging.interval=2",
        "logging.progress_bar=false",
        "logging.tensorboard=false",
        "checkpoint.keep_last=-1",
        *model,
        *optim,
    )
    assert code == 0, err
    assert_bitwise_equal(last_params(tmp_path / "api"), last_params(tmp_path / "cli"))
    saved = yaml.safe_load((tmp_path / "cli" / "config.yaml").read_text())
    assert saved["train_split"] == {"train": 1, "clean": 2}
    assert load_checkpoint(tmp_path / "cli" / "checkpoint_last.pt")["config"]["train_split"] == {
        "train": 1,
        "clean": 2,
    }
    code, _, err = nmt_cli(
        "train", f"data={tmp_path / 'j'}", "save_dir=runs/x", "train_split={train:1,clean:0}"
    )
    assert code == 2
    assert err.strip().splitlines()[-1] == (
        "nmt-train: error: train_split={train:1,clean:0}: the weight of clean must be "
        "positive; drop the split to leave it out"
    )


def test_a_killed_corpus_maker_leaves_no_partial_corpus(tmp_path):
    """benchmarks.make_corpus killed with SIGKILL mid-corpus: no train.en/train.de appear
    (a partial corpus would pass for a whole one), and the next run removes the
    temporaries and writes both whole."""
    out = tmp_path / "c" / "train"
    proc = subprocess.Popen(
        [sys.executable, "-m", "benchmarks.make_corpus", "--pairs", "600000", "--out", str(out)],
        cwd=REPO,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )

    def a_block_written() -> bool:
        return any(p.stat().st_size for p in stale_temps(f"{out}.de"))

    kill_9_when(proc, a_block_written, timeout=300)
    assert sorted(p.name for p in out.parent.iterdir() if not p.name.startswith(".")) == []
    assert stale_temps(f"{out}.en") and stale_temps(f"{out}.de")

    paths = make_corpus.write_corpus(out, 300)
    assert [len(p.read_text(encoding="utf-8").splitlines()) for p in paths] == [300, 300]
    assert sorted(p.name for p in out.parent.iterdir()) == ["train.de", "train.en"]


@pytest.mark.parametrize(("compress", "opener"), [("gz", gzip.open), ("xz", lzma.open)])
def test_a_compressed_corpus_is_the_plain_one(tmp_path, compress, opener):
    plain = make_corpus.write_corpus(tmp_path / "plain", 300, seed=4)
    packed = make_corpus.write_corpus(tmp_path / "packed", 300, seed=4, compress=compress)
    for p, z in zip(plain, packed):
        assert z.name == f"{p.name.replace('plain', 'packed')}.{compress}"
        with opener(z, "rb") as f:
            assert f.read() == p.read_bytes()
