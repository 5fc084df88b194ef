"""Streaming nmt-preprocess: byte for byte the in-memory reference (tests/reference_preprocess.py)
for any worker count and chunk size, compressed input, and the bounded SentencePiece sample."""

from __future__ import annotations

import bz2
import gzip
import lzma
import sys
from pathlib import Path

import numpy as np
import pytest
from reference_preprocess import reference_data_files

from nmt.data import build_data_dir
from nmt.data.meta import load_meta
from nmt.data.sampling import LineReservoir
from nmt.errors import NmtError


def _awkward_corpus(folder: Path) -> None:
    """The small corpus with what streaming could get wrong: a byte-order mark, CRLF, empty
    lines, a line with invalid UTF-8, over-long and unbalanced pairs, no final newline."""
    for split in ("train", "valid"):
        en = (folder / f"{split}.en").read_bytes().split(b"\n")[:-1]
        de = (folder / f"{split}.de").read_bytes().split(b"\n")[:-1]
        en[0] = b"\xef\xbb\xbf" + en[0]
        en[5] = en[5] + b"\r"
        de[7] = b""
        en[11] = b"bad \xff byte"
        en[13] = b" ".join([b"Anna"] * 300)
        de[17] = de[17] + b" " + b" ".join([b"und"] * 40)
        (folder / f"{split}.en").write_bytes(b"\n".join(en))  # no final newline
        (folder / f"{split}.de").write_bytes(b"\n".join(de) + b"\n")


def _data_files(folder: Path) -> dict[str, bytes]:
    return {
        p.name: p.read_bytes() for p in folder.iterdir() if p.suffix in (".bin", ".idx", ".model")
    }


@pytest.mark.parametrize("policy", ["replace", "skip"])
@pytest.mark.parametrize(("workers", "chunk_lines"), [(1, 5000), (2, 37), (3, 100)])
def test_streaming_output_equals_the_in_memory_reference(
    small_corpus: Path,
    preprocess_config,
    tmp_path: Path,
    policy: str,
    workers: int,
    chunk_lines: int,
) -> None:
    _awkward_corpus(small_corpus)
    cfg = preprocess_config(
        f"workers={workers}", f"chunk_lines={chunk_lines}", f"on_invalid_utf8={policy}"
    )
    build_data_dir(cfg)
    built = _data_files(tmp_path / "out")
    expected = reference_data_files(cfg)
    assert built.keys() == expected.keys()
    for name in sorted(expected):
        assert built[name] == expected[name], name
    train = load_meta(tmp_path / "out").splits["train"]
    assert train.removed["invalid_utf8"] == (1 if policy == "skip" else 0)
    assert train.removed["too_long"] == 1 and train.lines == 400


def test_separate_vocabularies_and_extra_training_corpora_equal_the_reference(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    for lang in ("en", "de"):
        lines = (small_corpus / f"train.{lang}").read_text(encoding="utf-8").splitlines()
        (small_corpus / f"clean.{lang}").write_text("\n".join(lines[:120]) + "\n", encoding="utf-8")
    cfg = preprocess_config(
        "spm.joint=false", f"data.extra_train.clean={small_corpus / 'clean'}", "workers=2"
    )
    build_data_dir(cfg)
    built = _data_files(tmp_path / "out")
    expected = reference_data_files(cfg)
    assert sorted(built) == sorted(expected) and "clean.de.bin" in built
    for name in sorted(expected):
        assert built[name] == expected[name], name
    meta = load_meta(tmp_path / "out")
    assert list(meta.splits) == ["train", "clean", "valid", "test"]
    assert meta.splits["clean"].lines == 120 and "ratio" in meta.splits["clean"].removed


def _zstd_open(path: Path, mode: str):
    zstandard = pytest.importorskip("zstandard", reason="zstandard (test extra) is not installed")
    return zstandard.open(path, mode)


@pytest.mark.parametrize(
    ("suffix", "opener"),
    [(".gz", gzip.open), (".xz", lzma.open), (".bz2", bz2.open), (".zst", _zstd_open)],
)
def test_compressed_input_gives_the_same_data_dir(
    small_corpus: Path, preprocess_config, tmp_path: Path, suffix: str, opener
) -> None:
    _awkward_corpus(small_corpus)
    build_data_dir(preprocess_config("on_invalid_utf8=replace", "chunk_lines=50"))
    plain = _data_files(tmp_path / "out")
    for split in ("train", "valid"):  # test stays plain: both kinds in one run
        for lang in ("en", "de"):
            path = small_corpus / f"{split}.{lang}"
            with opener(Path(f"{path}{suffix}"), "wb") as f:
                f.write(path.read_bytes())
            path.unlink()
    build_data_dir(
        preprocess_config(
            "on_invalid_utf8=replace", "chunk_lines=50", "workers=2", f"data.dest={tmp_path / 'z'}"
        )
    )
    assert _data_files(tmp_path / "z") == plain


def test_compressed_input_mistakes_are_named(
    small_corpus: Path, preprocess_config, tmp_path: Path, monkeypatch
) -> None:
    train_en = small_corpus / "train.en"
    with gzip.open(f"{train_en}.gz", "wb") as f:
        f.write(train_en.read_bytes())
    with pytest.raises(NmtError, match=r"train\.en: train\.en\.gz is beside it; keep one"):
        build_data_dir(preprocess_config())
    train_en.unlink()
    whole = Path(f"{train_en}.gz").read_bytes()
    Path(f"{train_en}.gz").write_bytes(whole[: len(whole) // 2])
    with pytest.raises(NmtError, match=r"train\.en\.gz: truncated"):
        build_data_dir(preprocess_config())
    Path(f"{train_en}.gz").write_bytes(b"plain text, not gzip\n")
    with pytest.raises(NmtError, match=r"train\.en\.gz: not a gz file"):
        build_data_dir(preprocess_config())
    Path(f"{train_en}.gz").rename(f"{train_en}.zst")
    with pytest.raises(NmtError, match=r"train\.en\.zst: not a zst file"):
        build_data_dir(preprocess_config())
    Path(f"{train_en}.zst").write_bytes(b"\x28\xb5\x2f\xfd")  # zstd's magic number
    # without the optional package (a None entry in sys.modules makes its import fail)
    monkeypatch.setitem(sys.modules, "zstandard", None)
    with pytest.raises(NmtError, match=r"train\.en\.zst: reading \.zst needs the zstandard"):
        build_data_dir(preprocess_config())
    assert sorted(p.name for p in tmp_path.iterdir()) == ["corpus"]


def test_sentencepiece_trains_on_a_bounded_seeded_sample(
    small_corpus: Path, preprocess_config, tmp_path: Path
) -> None:
    messages: list[str] = []
    build_data_dir(preprocess_config("spm.input_sentence_size=300"), log=messages.append)
    assert "on a random sample of 300 of its 800 lines of" in messages[0]
    sampled = (tmp_path / "out" / "spm.model").read_bytes()
    build_data_dir(
        preprocess_config(
            "spm.input_sentence_size=300",
            "workers=3",
            "chunk_lines=17",
            f"data.dest={tmp_path / 'again'}",
        )
    )
    assert (tmp_path / "again" / "spm.model").read_bytes() == sampled  # seeded
    build_data_dir(preprocess_config("spm.input_sentence_size=0", f"data.dest={tmp_path / 'all'}"))
    assert (tmp_path / "all" / "spm.model").read_bytes() != sampled
    build_data_dir(
        preprocess_config(
            "spm.input_sentence_size=300", "spm.seed=2", f"data.dest={tmp_path / 's2'}"
        )
    )
    assert (tmp_path / "s2" / "spm.model").read_bytes() != sampled


def _lines(n: int) -> tuple[bytes, np.ndarray]:
    data = b"".join(b"line %d\n" % i for i in range(n))
    return data, np.flatnonzero(np.frombuffer(data, dtype=np.uint8) == 10)


def test_the_reservoir_does_not_depend_on_how_the_stream_is_cut() -> None:
    data, ends = _lines(5000)
    whole = LineReservoir(64, seed=3)
    whole.offer(data, ends)
    pieces = LineReservoir(64, seed=3)
    cuts = [0, 1, 64, 65, 1000, 4321, 5000]
    for lo, hi in zip(cuts[:-1], cuts[1:]):
        start = 0 if lo == 0 else int(ends[lo - 1]) + 1
        pieces.offer(data[start : int(ends[hi - 1]) + 1], ends[lo:hi] - start)
    assert pieces.lines == whole.lines and whole.seen == 5000 and len(whole.lines) == 64
    small = LineReservoir(10_000, seed=3)
    small.offer(data, ends)
    assert small.lines == data.split(b"\n")[:-1]  # no more lines than room: all, in order


def test_every_line_is_equally_likely_to_be_sampled() -> None:
    data, ends = _lines(200)
    hits = np.zeros(200)
    for seed in range(600):
        r = LineReservoir(20, seed=seed)
        r.offer(data, ends)
        for line in r.lines:
            hits[int(line.split()[1])] += 1
    expected = 600 * 20 / 200  # 60 per line
    assert abs(hits[:100].mean() - hits[100:].mean()) < 6  # early and late lines alike
    assert hits.min() > expected / 2 and hits.max() < expected * 1.6
