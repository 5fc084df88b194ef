"""Binarized splits: write / memory-map / read round trip, dtypes, and worker-count invariance."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import numpy as np
import pytest

from nmt.data import binarize, build_data_dir
from nmt.data.binarize import TokenArray, TokenArrayWriter, dtype_for_vocab
from nmt.errors import NmtError


def _write(prefix: Path, sentences: list[list[int]], dtype: np.dtype, chunk: int = 3) -> None:
    writer = TokenArrayWriter(prefix, dtype)
    for start in range(0, len(sentences), chunk):
        part = sentences[start : start + chunk]
        ids = np.array([i for s in part for i in s], dtype=np.int64)
        writer.add(ids, np.array([len(s) for s in part], dtype=np.int64))
    writer.close()


@pytest.mark.parametrize("vocab_size", [800, 65536, 70000])
def test_round_trip(tmp_path: Path, vocab_size: int) -> None:
    rng = np.random.default_rng(0)
    sentences = [
        rng.integers(4, vocab_size, size=rng.integers(0, 20)).tolist() + [2] for _ in range(50)
    ]
    sentences[7] = []  # an empty entry survives too
    prefix = tmp_path / "train.en"
    _write(prefix, sentences, dtype_for_vocab(vocab_size))

    arr = TokenArray(prefix)
    assert arr.dtype == (np.uint16 if vocab_size <= 65536 else np.int32)
    assert isinstance(arr._bin, np.memmap)  # read lazily from the file, not loaded
    assert len(arr) == len(sentences)
    assert arr.sizes.dtype == np.int64
    assert arr.sizes.tolist() == [len(s) for s in sentences]
    for i, expected in enumerate(sentences):
        assert arr[i].dtype == np.int64
        assert arr[i].tolist() == expected
    assert arr[-1].tolist() == sentences[-1]
    with pytest.raises(IndexError):
        arr[len(sentences)]
    # the on-disk layout of docs/ARCHITECTURE.md: int64 offsets, n+1 of them
    idx = np.fromfile(f"{prefix}.idx", dtype=np.int64)
    assert idx[0] == 0 and len(idx) == len(sentences) + 1
    assert idx[-1] * arr.dtype.itemsize == Path(f"{prefix}.bin").stat().st_size


def test_pickles_as_a_path(tmp_path: Path) -> None:
    _write(tmp_path / "x", [[5, 6, 2]] * 1000, np.dtype(np.uint16))
    arr = TokenArray(tmp_path / "x")
    blob = pickle.dumps(arr)
    assert len(blob) < 200  # DataLoader workers reopen the files instead of copying them
    assert pickle.loads(blob)[999].tolist() == [5, 6, 2]


def test_empty_split(tmp_path: Path) -> None:
    _write(tmp_path / "e", [], np.dtype(np.uint16))
    arr = TokenArray(tmp_path / "e")
    assert len(arr) == 0 and arr.sizes.tolist() == []


@pytest.mark.parametrize("dtype", [None, "uint16"], ids=["dtype-from-sizes", "dtype-of-meta"])
def test_damaged_files_are_reported(tmp_path: Path, dtype) -> None:
    """A truncated .bin is blamed on the .bin, a truncated .idx on the .idx."""
    prefix = tmp_path / "d"
    sentences = [[5, 6, 2], [7, 2], [8, 9, 10, 2]]
    _write(prefix, sentences, np.dtype(np.uint16))
    idx = Path(f"{prefix}.idx").read_bytes()
    with open(f"{prefix}.idx", "r+b") as f:
        f.truncate(len(idx) - 8)  # whole offsets lost: the last sentence is gone
    with pytest.raises(NmtError, match=r"d\.idx: truncated or damaged: it describes 5 tokens"):
        TokenArray(prefix, dtype)
    Path(f"{prefix}.idx").write_bytes(idx)
    with open(f"{prefix}.bin", "r+b") as f:
        f.truncate(7)
    with pytest.raises(NmtError, match=r"d\.bin: truncated: 7 bytes, but d\.idx describes 9"):
        TokenArray(prefix, dtype)
    Path(f"{prefix}.idx").unlink()
    with pytest.raises(NmtError, match=r"d\.idx: missing"):
        TokenArray(prefix)


def _data_files(folder: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(folder.iterdir())}


def test_output_is_the_same_for_any_worker_count(preprocess_config, tmp_path: Path) -> None:
    build_data_dir(preprocess_config("workers=1"))
    one = _data_files(tmp_path / "out")
    # three processes and small chunks (they finish out of order), same destination
    build_data_dir(preprocess_config("workers=3", "chunk_lines=37", "overwrite=true"))
    three = _data_files(tmp_path / "out")
    assert one.keys() == three.keys()
    for name in one:
        if name not in ("meta.json", "config.yaml"):
            assert one[name] == three[name], name
    # meta.json differs only where it records the settings that changed
    meta_one, meta_three = (json.loads(d["meta.json"]) for d in (one, three))
    for key in ("workers", "chunk_lines", "overwrite"):
        assert meta_one["config"].pop(key) != meta_three["config"].pop(key)
    assert meta_one == meta_three


def test_a_dying_worker_fails_the_run_instead_of_hanging(
    preprocess_config, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(binarize._ChunkEncoder, "__call__", lambda self, task: os._exit(3))
    with pytest.raises(NmtError, match="worker process died"):
        build_data_dir(preprocess_config("workers=2", "chunk_lines=100"))
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]
