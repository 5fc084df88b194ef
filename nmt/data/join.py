"""Join data dirs built apart into one: the way a corpus too big for one machine is
preprocessed on several (`nmt-preprocess join=[...]`, or `build_data_dir` with `cfg.join`).

    # on machine k, with the SentencePiece model of the first shard (or any shared one):
    nmt-preprocess data.trainpref=corpus/part$k spm.model=shard0/spm.model \\
        data.validpref=null data.testpref=[] data.dest=shards/$k
    # then, where the shards are (shared storage):
    nmt-preprocess join=[shards/0,shards/1,shards/2] data.dest=data-bin/big

Every input must have the same languages, SentencePiece model(s) (sha256), normalization
and token dtype. A split found in several inputs becomes one split in shards (meta.json's
`splits.<name>.shards` lists their file prefixes `<name>.<k>`); nmt-train reads a sharded
training split one shard per epoch, in turn (nmt.training.data), and validation reads all
of a sharded valid split. A split found in one input keeps its files and name. Files are
hard-linked when the inputs are on the same file system (no copying of gigabytes), copied
otherwise; the joined data dir appears complete or not at all (nmt.fsutil).
"""

from __future__ import annotations

import os
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from nmt.data.config import InvalidUtf8, PreprocessConfig
from nmt.data.meta import DataMeta, SplitInfo, load_meta, write_config, write_meta
from nmt.data.report import BuildReport
from nmt.errors import NmtError
from nmt.fsutil import atomic_directory, remove_stale_temps

# what every shard must agree on, and what to do otherwise
_SAME = {
    "langs": "build every shard with the same data.langs and data.pairs",
    "directions": "build every shard with the same data.langs and data.pairs",
    "src_lang": "build every shard with the same data.src and data.tgt",
    "tgt_lang": "build every shard with the same data.src and data.tgt",
    "joint_vocab": "build every shard with the same SentencePiece model(s)",
    "src_vocab_size": "build every shard with the same SentencePiece model(s)",
    "tgt_vocab_size": "build every shard with the same SentencePiece model(s)",
    "dtype": "build every shard with the same SentencePiece model(s)",
    "normalization": "build every shard with the same nfkc setting",
    "special_ids": "rebuild the shard with this nmt",
}


def join_data_dirs(
    cfg: PreprocessConfig,
    dest: Path,
    config: dict[str, Any],
    log: Callable[[str], None] | None = None,
) -> BuildReport:
    """Write the data dir `dest` joining the data dirs `cfg.join` (in that order)."""
    started = time.perf_counter()
    inputs = [Path(p).expanduser() for p in cfg.join]
    for path in inputs:
        if path.resolve() == dest.resolve():
            raise NmtError(
                f"join=[{','.join(cfg.join)}]: data.dest={dest} is one of the data dirs to "
                "join; write the joined data dir elsewhere"
            )
    metas = [load_meta(path) for path in inputs]
    _check_compatible(inputs, metas)
    first = metas[0]
    # split name -> [(input, its SplitInfo)], in the order the inputs name them
    parts: dict[str, list[tuple[int, SplitInfo]]] = {}
    for i, meta in enumerate(metas):
        for name, info in meta.splits.items():
            parts.setdefault(name, []).append((i, info))
    remove_stale_temps(dest)
    with atomic_directory(dest) as out:
        files = {first.tokenizers[side]["file"] for side in ("src", "tgt")}
        for model in files:
            _link(inputs[0] / model, out / model)
            vocab = Path(model).with_suffix(".vocab").name
            if (inputs[0] / vocab).is_file():
                _link(inputs[0] / vocab, out / vocab)
        splits = {
            name: _join_split(name, found, inputs, first, out) for name, found in parts.items()
        }
        write_config(out, config)
        meta = DataMeta(
            src_lang=first.src_lang,
            tgt_lang=first.tgt_lang,
            joint_vocab=first.joint_vocab,
            src_vocab_size=first.src_vocab_size,
            tgt_vocab_size=first.tgt_vocab_size,
            special_ids=dict(first.special_ids),
            dtype=first.dtype,
            tokenizers=first.tokenizers,
            normalization=dict(first.normalization),
            splits=splits,
            config=config,
            langs=list(first.langs),
            directions=dict(first.directions),
            lang_tags=dict(first.lang_tags),
        )
        write_meta(out, meta)
    sharded = [name for name, info in splits.items() if info.shards]
    if log is not None:
        log(
            f"joined {len(inputs)} data dirs"
            + (f"; in shards: {', '.join(sharded)}" if sharded else "")
        )
    return BuildReport(
        dest=dest,
        meta=meta,
        encode_seconds=time.perf_counter() - started,
        workers=0,
        invalid_utf8={},
        invalid_utf8_policy=InvalidUtf8(cfg.on_invalid_utf8).value,
        joined=len(inputs),
    )


def _check_compatible(inputs: list[Path], metas: list[DataMeta]) -> None:
    first = metas[0]
    for path, meta in zip(inputs[1:], metas[1:]):
        for key, fix in _SAME.items():
            if getattr(meta, key) != getattr(first, key):
                raise NmtError(
                    f"join={path}: its {key} is {getattr(meta, key)!r} but {inputs[0]}'s is "
                    f"{getattr(first, key)!r}; {fix}"
                )
        for side in ("src", "tgt"):
            if meta.tokenizers[side]["sha256"] != first.tokenizers[side]["sha256"]:
                raise NmtError(
                    f"join={path}: its SentencePiece model ({side}) differs from "
                    f"{inputs[0]}'s; build every shard with "
                    f"spm.model={inputs[0] / first.tokenizers[side]['file']} (or the "
                    "same spm.src_model/spm.tgt_model)"
                )


def _join_split(
    name: str,
    found: list[tuple[int, SplitInfo]],
    inputs: list[Path],
    meta: DataMeta,
    out: Path,
) -> SplitInfo:
    """Link the split's files into `out`; one input: as they are, several: as shards."""
    langs = tuple(found[0][1].langs) or (meta.src_lang, meta.tgt_lang)  # multilingual: its pair
    if len(found) == 1:
        i, info = found[0]
        for prefix in info.shard_prefixes(name):
            for lang in langs:
                for ext in ("bin", "idx"):
                    _link(inputs[i] / f"{prefix}.{lang}.{ext}", out / f"{prefix}.{lang}.{ext}")
        return info
    shards: list[str] = []
    removed: dict[str, int] = {}
    for i, info in found:
        for prefix in info.shard_prefixes(name):  # a joined input's shards stay shards
            new = f"{name}.{len(shards)}"
            for lang in langs:
                for ext in ("bin", "idx"):
                    _link(inputs[i] / f"{prefix}.{lang}.{ext}", out / f"{new}.{lang}.{ext}")
            shards.append(new)
        for rule, count in info.removed.items():
            removed[rule] = removed.get(rule, 0) + count
    infos = [info for _, info in found]
    return SplitInfo(
        lines=sum(s.lines for s in infos),
        kept=sum(s.kept for s in infos),
        removed=removed,
        src_tokens=sum(s.src_tokens for s in infos),
        tgt_tokens=sum(s.tgt_tokens for s in infos),
        shards=shards,
        langs=list(infos[0].langs),
    )


def _link(src: Path, dst: Path) -> None:
    """A hard link to `src` at `dst` (a copy across file systems); NmtError if missing."""
    if not src.is_file():
        raise NmtError(f"{src}: missing; rebuild that data dir with nmt-preprocess")
    try:
        os.link(src, dst)
    except OSError:
        shutil.copyfile(src, dst)
