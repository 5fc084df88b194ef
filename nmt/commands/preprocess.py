"""nmt-preprocess: parallel text -> data dir (SentencePiece model(s), binarized splits, meta.json).

Order of work, so that mistakes surface early and nothing half-done is ever visible:
  1. check the config, the destination and every input file (counts, UTF-8) before slow work;
  2. build everything in a hidden temporary sibling of `data.dest`;
  3. write meta.json last, then rename the finished directory into place.
Any failure or Ctrl-C removes the temporary directory; an existing data dir is replaced
only with `overwrite=true`, and only once the new one is complete.
"""

from __future__ import annotations

import multiprocessing
import os
import shutil
import tempfile
import time
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from enum import Enum
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import yaml
from tqdm import tqdm

from nmt.data.binarize import Encoder, EncodeSettings, SplitStats, dtype_for_vocab
from nmt.data.config import InvalidUtf8, PreprocessConfig
from nmt.data.corpus import CleanRules, FileScan, check_parallel, read_lines, scan_file
from nmt.data.meta import META_FILE, DataMeta, SplitInfo, split_prefix, write_meta
from nmt.data.tokenizer import Tokenizer, train_tokenizer
from nmt.data.vocab import SPECIAL_IDS
from nmt.errors import NmtError
from nmt.fsutil import fsync_dir
from nmt.processes import ignore_sigint, sigint_deferred

PROG = "nmt-preprocess"


@dataclass(frozen=True)
class SplitInput:
    name: str  # train, valid, or the test prefix's file name
    src: FileScan
    tgt: FileScan
    is_train: bool


def run(cfg: PreprocessConfig) -> None:
    _validate(cfg)
    dest = Path(cfg.data.dest).expanduser()
    _check_dest(dest, cfg.overwrite)
    splits = _scan_inputs(cfg)

    dest.parent.mkdir(parents=True, exist_ok=True)
    tmp = Path(tempfile.mkdtemp(prefix=f".{dest.name}.tmp-", dir=dest.parent))
    try:
        os.chmod(tmp, 0o777 & ~_umask())  # mkdtemp makes it private; the data dir should not be
        meta, encode_s = _build(cfg, splits, tmp)
        _move_into_place(tmp, dest)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _report(meta, dest, encode_s, cfg.workers)


def _build(cfg: PreprocessConfig, splits: list[SplitInput], out: Path) -> tuple[DataMeta, float]:
    """Everything in `out`, meta.json last; returns the meta and the encoding time."""
    src_tok, tgt_tok, joint, files = _tokenizers(cfg, splits[0], out)
    dtype = dtype_for_vocab(max(src_tok.vocab_size, tgt_tok.vocab_size))
    settings = EncodeSettings(
        src_model=src_tok.model_bytes,
        tgt_model=tgt_tok.model_bytes,
        dtype=dtype.name,
        nfkc=cfg.nfkc,
        on_invalid_utf8=cfg.on_invalid_utf8.value,
    )
    rules = CleanRules(cfg.clean.remove_empty, cfg.clean.max_tokens, cfg.clean.max_ratio)
    stats: dict[str, SplitStats] = {}
    started = time.perf_counter()
    total = sum(s.src.lines for s in splits)
    with (
        Encoder(settings, cfg.workers) as encoder,
        tqdm(total=total, unit=" pairs", desc=PROG, disable=None, leave=False) as bar,
    ):
        for split in splits:
            bar.set_postfix_str(split.name)
            stats[split.name] = encoder.encode_split(
                split.src,
                split.tgt,
                cfg.chunk_lines,
                split_prefix(out, split.name, cfg.data.src),
                split_prefix(out, split.name, cfg.data.tgt),
                rules if split.is_train else None,
                progress=bar.update,
            )
            if split.is_train and stats[split.name].kept == 0:
                raise NmtError(_empty_train_message(cfg, stats[split.name]))
    encode_s = time.perf_counter() - started

    config = _plain(cfg)
    (out / "config.yaml").write_text(
        yaml.safe_dump(config, sort_keys=False, allow_unicode=True), encoding="utf-8"
    )
    meta = DataMeta(
        src_lang=cfg.data.src,
        tgt_lang=cfg.data.tgt,
        joint_vocab=joint,
        src_vocab_size=src_tok.vocab_size,
        tgt_vocab_size=tgt_tok.vocab_size,
        special_ids=dict(SPECIAL_IDS),
        dtype=dtype.name,
        tokenizers=files,
        normalization={"nfkc": cfg.nfkc},
        splits={
            name: SplitInfo(
                lines=s.lines,
                kept=s.kept,
                removed=s.removed,
                src_tokens=s.src_tokens,
                tgt_tokens=s.tgt_tokens,
            )
            for name, s in stats.items()
        },
        config=config,
    )
    for name, s in stats.items():
        if s.bad_utf8:
            print(
                f"{PROG}: {name}: {s.bad_utf8} lines with invalid UTF-8 "
                f"({'replaced' if cfg.on_invalid_utf8 is InvalidUtf8.replace else 'skipped'})"
            )
    write_meta(out, meta)
    return meta, encode_s


# ---------------------------------------------------------------------------- checks


def _validate(cfg: PreprocessConfig) -> None:
    d = cfg.data
    for key, lang in (("data.src", d.src), ("data.tgt", d.tgt)):
        if not lang or "/" in lang or lang != lang.strip():
            raise NmtError(f"{key}={lang!r}: a language suffix such as en or de is needed")
    if d.src == d.tgt:
        raise NmtError(f"data.src and data.tgt are both {d.src!r}; give two languages")
    if not d.trainpref:
        raise NmtError("data.trainpref: required (the prefix of the training files)")
    positive = {
        "workers": cfg.workers,
        "chunk_lines": cfg.chunk_lines,
        "spm.vocab_size": cfg.spm.vocab_size,
        "spm.num_threads": cfg.spm.num_threads,
    }
    for key, value in positive.items():
        if value < 1:
            raise NmtError(f"{key}={value}: must be at least 1")
    if cfg.spm.input_sentence_size < 0:
        raise NmtError(f"spm.input_sentence_size={cfg.spm.input_sentence_size}: 0 (all) or more")
    if not 0 < cfg.spm.character_coverage <= 1:
        raise NmtError(f"spm.character_coverage={cfg.spm.character_coverage}: must be in (0, 1]")
    if cfg.clean.max_tokens is not None and cfg.clean.max_tokens < 1:
        raise NmtError(f"clean.max_tokens={cfg.clean.max_tokens}: at least 1, or null for no limit")
    if cfg.clean.max_ratio is not None and cfg.clean.max_ratio < 1:
        raise NmtError(f"clean.max_ratio={cfg.clean.max_ratio}: at least 1, or null for no limit")
    if cfg.spm.model is not None and (cfg.spm.src_model or cfg.spm.tgt_model):
        raise NmtError(
            "spm.model and spm.src_model/spm.tgt_model are both set; give a joint "
            "model or two separate ones"
        )
    if (cfg.spm.src_model is None) != (cfg.spm.tgt_model is None):
        raise NmtError("spm.src_model and spm.tgt_model: give both (separate models) or neither")
    if cfg.spm.model is not None and not cfg.spm.joint:
        raise NmtError(
            "spm.joint=false but spm.model is one joint model; give spm.src_model "
            "and spm.tgt_model instead"
        )


def _split_names(cfg: PreprocessConfig) -> list[tuple[str, str]]:
    """(split name, prefix): train, valid, then each test prefix under its file name."""
    named = [("train", cfg.data.trainpref)]
    if cfg.data.validpref:
        named.append(("valid", cfg.data.validpref))
    for prefix in cfg.data.testpref:
        name = Path(prefix).name
        if not name or name in (n for n, _ in named):
            raise NmtError(
                f"data.testpref: {prefix!r} would be stored as split {name!r}, which "
                "is taken; give test files distinct names other than train and valid"
            )
        named.append((name, prefix))
    return named


def _scan_inputs(cfg: PreprocessConfig) -> list[SplitInput]:
    """Every input file exists, pairs have equal line counts, and (in error mode) valid UTF-8."""
    check_utf8 = cfg.on_invalid_utf8 is InvalidUtf8.error
    splits = []
    for name, prefix in _split_names(cfg):
        base = Path(prefix).expanduser()
        scans = [
            scan_file(Path(f"{base}.{lang}"), cfg.chunk_lines, check_utf8)
            for lang in (cfg.data.src, cfg.data.tgt)
        ]
        check_parallel(*scans)
        if name == "train" and scans[0].lines == 0:
            raise NmtError(f"data.trainpref={prefix}: the training files are empty")
        splits.append(SplitInput(name, scans[0], scans[1], is_train=name == "train"))
    return splits


def _check_dest(dest: Path, overwrite: bool) -> None:
    if not dest.exists():
        return
    if not dest.is_dir():
        raise NmtError(f"data.dest={dest}: exists and is not a directory; choose another data.dest")
    if (dest / META_FILE).is_file():
        if not overwrite:
            raise NmtError(
                f"data.dest={dest}: a data dir already exists there; "
                "set overwrite=true to replace it"
            )
    elif any(dest.iterdir()):
        # never delete what nmt did not write, even with overwrite=true
        raise NmtError(
            f"data.dest={dest}: exists, is not empty and is not an nmt data dir "
            "(no meta.json); choose another data.dest"
        )


def _empty_train_message(cfg: PreprocessConfig, stats: SplitStats) -> str:
    removed = ", ".join(f"{rule} {n}" for rule, n in stats.removed.items() if n)
    return (
        f"data.trainpref={cfg.data.trainpref}: no training pairs left after cleaning "
        f"({stats.lines} lines; removed: {removed or 'none'}); check the files or relax "
        "clean.remove_empty, clean.max_tokens, clean.max_ratio"
    )


# ---------------------------------------------------------------------------- tokenizers


def _tokenizers(
    cfg: PreprocessConfig, train: SplitInput, out: Path
) -> tuple[Tokenizer, Tokenizer, bool, dict[str, dict[str, str]]]:
    """Reuse or train the model(s), copy them into `out`; returns (src, tgt, joint, files)."""
    s, d = cfg.spm, cfg.data
    if s.model is not None:
        src_tok = tgt_tok = _reuse(s.model, "spm.model")
    elif s.src_model is not None and s.tgt_model is not None:
        src_tok = _reuse(s.src_model, "spm.src_model")
        tgt_tok = _reuse(s.tgt_model, "spm.tgt_model")
    elif s.joint:
        src_tok = tgt_tok = _train(
            cfg, [train.src, train.tgt], f"{d.trainpref}.{{{d.src},{d.tgt}}}"
        )
    else:
        src_tok = _train(cfg, [train.src], f"{d.trainpref}.{d.src}")
        tgt_tok = _train(cfg, [train.tgt], f"{d.trainpref}.{d.tgt}")
    joint = src_tok is tgt_tok
    names = (
        {"src": "spm", "tgt": "spm"} if joint else {"src": f"spm.{d.src}", "tgt": f"spm.{d.tgt}"}
    )
    files = {}
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        if side == "src" or not joint:
            (out / f"{names[side]}.model").write_bytes(tok.model_bytes)
            tok.write_vocab(out / f"{names[side]}.vocab")
        files[side] = {"file": f"{names[side]}.model", "sha256": tok.sha256}
    return src_tok, tgt_tok, joint, files


def _reuse(path: str, key: str) -> Tokenizer:
    file = Path(path).expanduser()
    if not file.is_file():
        raise NmtError(f"{key}={path}: no such file")
    tok = Tokenizer.from_file(file)
    tok.check_special_ids(f"{key}={path}")
    return tok


def _train(cfg: PreprocessConfig, scans: list[FileScan], what: str) -> Tokenizer:
    """Train in a child process: SentencePiece's C++ trainer ignores Ctrl-C for minutes on
    a large corpus, while a child can be stopped at once."""
    s = cfg.spm
    print(
        f"{PROG}: training a {s.model_type.value} SentencePiece model of {s.vocab_size} pieces "
        f"on {what}",
        flush=True,
    )
    ctx = multiprocessing.get_context()
    receiver, sender = ctx.Pipe(duplex=False)
    child = ctx.Process(target=_train_child, args=(sender, cfg, scans, what), daemon=True)
    try:
        with sigint_deferred():
            child.start()
        sender.close()  # so that recv() sees EOF if the child dies
        status, payload = receiver.recv()
    except EOFError:
        raise NmtError(
            f"SentencePiece training on {what} died (out of memory?); set "
            "spm.input_sentence_size to train on a sample"
        ) from None
    finally:
        sender.close()
        if child.pid is not None:  # started
            if child.is_alive():
                child.terminate()
            child.join()
    if status == "error":
        raise NmtError(payload)
    return Tokenizer(payload, name=f"SentencePiece model of {what}")


def _train_child(
    sender: Connection, cfg: PreprocessConfig, scans: list[FileScan], what: str
) -> None:
    ignore_sigint()
    s = cfg.spm
    try:
        tok = train_tokenizer(
            _training_text(scans, cfg),
            vocab_size=s.vocab_size,
            model_type=s.model_type.value,
            character_coverage=s.character_coverage,
            byte_fallback=s.byte_fallback,
            input_sentence_size=s.input_sentence_size,
            user_defined_symbols=s.user_defined_symbols,
            num_threads=s.num_threads,
            seed=s.seed,
            what=what,
        )
    except NmtError as exc:
        sender.send(("error", str(exc)))
    else:
        sender.send(("ok", tok.model_bytes))
    finally:
        sender.close()


def _training_text(scans: list[FileScan], cfg: PreprocessConfig) -> Iterator[str]:
    """Normalized, non-empty training lines of the given file(s), one chunk in memory at a time."""
    for scan in scans:
        for k in range(len(scan.starts) - 1):
            lines, _ = read_lines(
                scan.path, *scan.chunk(k), k * cfg.chunk_lines, cfg.on_invalid_utf8.value, cfg.nfkc
            )
            yield from (line for line in lines if line)


# ---------------------------------------------------------------------------- output


def _move_into_place(tmp: Path, dest: Path) -> None:
    """Rename the finished dir to `dest`; an old data dir there is removed only afterwards."""
    for path in (*tmp.iterdir(), tmp):  # on disk before the rename makes them visible
        fd = os.open(path, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)
    old = None
    if dest.exists():
        old = dest.parent / f".{dest.name}.old-{os.getpid()}"
        os.rename(dest, old)
    os.rename(tmp, dest)
    fsync_dir(dest.parent)
    if old is not None:
        shutil.rmtree(old, ignore_errors=True)


def _umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


def _plain(obj: Any) -> Any:
    """The config as plain YAML/JSON values (enums by value)."""
    if hasattr(obj, "__dataclass_fields__"):
        obj = asdict(obj)
    if isinstance(obj, dict):
        return {k: _plain(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_plain(v) for v in obj]
    if isinstance(obj, Enum):
        return obj.value
    return obj


def _report(meta: DataMeta, dest: Path, encode_s: float, workers: int) -> None:
    vocab = (
        f"joint vocabulary of {meta.src_vocab_size}"
        if meta.joint_vocab
        else f"vocabularies of {meta.src_vocab_size} ({meta.src_lang}) and "
        f"{meta.tgt_vocab_size} ({meta.tgt_lang})"
    )
    print(f"{PROG}: {meta.src_lang}->{meta.tgt_lang}, {vocab} pieces, {meta.dtype} ids")
    width = max(len(name) for name in meta.splits)
    for name, s in meta.splits.items():
        removed = ", ".join(f"{rule} {n}" for rule, n in s.removed.items())
        print(
            f"  {name:<{width}} {s.lines:>9} lines {s.kept:>9} kept   tokens {s.src_tokens} "
            f"{meta.src_lang} / {s.tgt_tokens} {meta.tgt_lang}   removed: {removed}"
        )
    lines = sum(s.lines for s in meta.splits.values())
    rate = lines / encode_s if encode_s > 0 else float("inf")
    print(
        f"{PROG}: encoded {lines} pairs in {encode_s:.2f} s ({rate:,.0f} pairs/s, "
        f"{workers} worker{'s' if workers > 1 else ''})"
    )
    print(f"{PROG}: wrote {dest}")
