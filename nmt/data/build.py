"""Parallel text -> data dir: the library call under `nmt-preprocess`.

    from nmt.data import build_data_dir
    report = build_data_dir(PreprocessConfig(data=DataConfig(trainpref="corpus/train", ...)))

Order of work, so that mistakes surface early and nothing half-done is ever visible:
  1. check the config, the destination and every input file (counts, UTF-8) before slow work,
     in one pass over each file that also draws the SentencePiece training sample;
  2. build everything in a temporary sibling of `data.dest` (nmt.fsutil.atomic_directory):
     the SentencePiece model(s), the binarized splits, config.yaml, and meta.json last;
  3. rename the finished directory into place.

Memory does not depend on the corpus size: the files are read in chunks (plain files by
the workers themselves, compressed ones as one stream), SentencePiece sees a bounded sample
(`spm.input_sentence_size`), at most 2 x workers chunks are in flight, and the output is
written as it comes. With `join=[...]`, data dirs built apart are joined instead
(nmt.data.join).
Any failure, Ctrl-C or SIGTERM removes the temporary directory; an existing data dir is
replaced only with `overwrite=true`, and only once the new one is complete. A directory that
is not an nmt data dir (no meta.json), or holds anything nmt-preprocess does not write, is
never replaced. One run at a time builds a data dir: a second on the same `data.dest` is
refused, naming the first (an flock on `.<name>.lock` beside it, which the kernel releases
when its holder dies), so the temporary a killed run left can be removed safely.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from enum import Enum
from pathlib import Path
from typing import Any

from tqdm import tqdm

from nmt.data.binarize import Encoder, EncodeSettings, SplitStats, dtype_for_vocab
from nmt.data.cleaning import CleanRules, LangidRule, check_langid
from nmt.data.config import PAIR_PLACEHOLDER, InvalidUtf8, PreprocessConfig
from nmt.data.corpus import FileScan, check_parallel, input_file, scan_file
from nmt.data.join import join_data_dirs
from nmt.data.languages import parse_direction
from nmt.data.meta import (
    CONFIG_FILE,
    META_FILE,
    DataMeta,
    SplitInfo,
    split_prefix,
    write_config,
    write_meta,
)
from nmt.data.report import BuildReport
from nmt.data.tokenizer_setup import (
    DataTokenizers,
    TokenizerSamples,
    check_reused_model,
    setup_tokenizers,
)
from nmt.errors import NmtError, setting
from nmt.fsutil import (
    OutputKind,
    atomic_directory,
    check_replaceable,
    destination_lock,
    remove_stale_temps,
)
from nmt.vocab import SPECIAL_IDS

# what nmt-preprocess writes into a data dir (also a join's hard-linked shards): with
# overwrite=true, a data dir holding anything else is not replaced
DATA_DIR = OutputKind(
    "nmt data dir",
    META_FILE,
    (META_FILE, CONFIG_FILE, "spm*.model", "spm*.vocab", "*.bin", "*.idx"),
)


@dataclass(frozen=True)
class SplitFiles:
    """One split's pair of input files, before they are read."""

    name: str  # as stored: train, valid, a test prefix's file name; `<that>.<stem>` for a
    # pair of a multilingual build (train.en-de)
    option: str  # the option that named them, as written (data.trainpref=corpus/train)
    langs: tuple[str, str]  # the languages of the two files (source, target)
    paths: tuple[Path, Path]
    is_train: bool
    stem: str = ""  # its pair in a multilingual build (en-de), for messages


@dataclass(frozen=True)
class SplitInput:
    """One split's pair of input files, scanned."""

    files: SplitFiles
    src: FileScan
    tgt: FileScan

    @property
    def name(self) -> str:
        return self.files.name


def build_data_dir(
    cfg: PreprocessConfig,
    *,
    progress: bool = False,
    log: Callable[[str], None] | None = None,
) -> BuildReport:
    """Write the data dir `cfg.data.dest` (docs/ARCHITECTURE.md, "Data dir"); NmtError on
    any input mistake, before slow work where it can be found before.

    `progress`: a tqdm bar on stderr while encoding (when stderr is a terminal). `log`
    receives progress messages (e.g. that a SentencePiece model is being trained).
    """
    cfg.validate()
    assert cfg.data.dest is not None  # validate() requires it
    if cfg.clean.langid and not cfg.join:
        key = "data.langs" if cfg.data.multilingual else ""
        for _, langs in _pairs(cfg):  # the extra is installed and knows the languages
            langid = clean_rules(cfg, langs).langid
            assert langid is not None
            check_langid(langid, key)
    say = log or (lambda message: None)
    dest = Path(cfg.data.dest).expanduser()
    _check_dest(dest, cfg.overwrite)
    with destination_lock(dest, f"data.dest={dest}"):
        _check_dest(dest, cfg.overwrite)  # again, now that no other run can change it
        if cfg.join:
            return join_data_dirs(cfg, dest, _plain(cfg), log=say)
        check_reused_model(cfg)
        samples = TokenizerSamples(cfg)
        splits = _scan_inputs(cfg, samples, progress)
        for stale in remove_stale_temps(dest):  # what a killed run left beside dest
            say(f"removed {stale}, left by an interrupted run")
        with atomic_directory(dest) as tmp:
            meta, stats, encode_s = _build(cfg, splits, samples, tmp, progress, say)
    bad = {name: s.bad_utf8 for name, s in stats.items() if s.bad_utf8}
    return BuildReport(
        dest=dest,
        meta=meta,
        encode_seconds=encode_s,
        workers=cfg.workers,
        invalid_utf8=bad,
        invalid_utf8_policy=InvalidUtf8(cfg.on_invalid_utf8).value,
    )


def clean_rules(cfg: PreprocessConfig, langs: tuple[str, str] | None = None) -> CleanRules:
    """The training splits' cleaning rules (nmt.data.cleaning) from `cfg.clean`, for the
    pair of languages `langs` (default: data.src and data.tgt)."""
    c = cfg.clean
    src, tgt = langs or (cfg.data.src, cfg.data.tgt)
    candidates = None if c.langid_candidates is None else tuple(c.langid_candidates)
    return CleanRules(
        remove_empty=c.remove_empty,
        max_pieces=c.max_pieces,
        max_ratio=c.max_ratio,
        drop_copies=c.drop_copies,
        langid=LangidRule(src, tgt, candidates) if c.langid else None,
        dedup=c.dedup,
    )


def _build(
    cfg: PreprocessConfig,
    splits: list[SplitInput],
    samples: TokenizerSamples,
    out: Path,
    progress: bool,
    log: Callable[[str], None],
) -> tuple[DataMeta, dict[str, SplitStats], float]:
    """Everything in `out`, meta.json last; returns the meta, the split counts and the
    encoding time."""
    tokenizers = setup_tokenizers(cfg, samples, out, log)
    dtype = dtype_for_vocab(max(tokenizers.src.vocab_size, tokenizers.tgt.vocab_size))
    started = time.perf_counter()
    stats = _encode_splits(cfg, splits, tokenizers, dtype.name, out, progress)
    encode_s = time.perf_counter() - started

    config = _plain(cfg)
    write_config(out, config)
    d = cfg.data
    src_lang, tgt_lang = d.directions()[0]  # a multilingual data dir's first direction
    meta = DataMeta(
        src_lang=src_lang,
        tgt_lang=tgt_lang,
        joint_vocab=tokenizers.joint,
        src_vocab_size=tokenizers.src.vocab_size,
        tgt_vocab_size=tokenizers.tgt.vocab_size,
        special_ids=dict(SPECIAL_IDS),
        dtype=dtype.name,
        tokenizers=tokenizers.files,
        normalization={"nfkc": cfg.nfkc},
        splits={
            split.name: _split_info(split, stats[split.name], d.multilingual) for split in splits
        },
        config=config,
        langs=d.languages() if d.multilingual else [],
        directions=d.pair_stems() if d.multilingual else {},
        lang_tags=d.tag_pieces(),
    )
    write_meta(out, meta)
    return meta, stats, encode_s


def _split_info(split: SplitInput, stats: SplitStats, multilingual: bool) -> SplitInfo:
    """meta.json's record of a split: its counts, and a multilingual pair's languages."""
    return SplitInfo(
        lines=stats.lines,
        kept=stats.kept,
        removed=stats.removed,
        src_tokens=stats.src_tokens,
        tgt_tokens=stats.tgt_tokens,
        langs=list(split.files.langs) if multilingual else [],
    )


def _encode_splits(
    cfg: PreprocessConfig,
    splits: list[SplitInput],
    tokenizers: DataTokenizers,
    dtype: str,
    out: Path,
    progress: bool,
) -> dict[str, SplitStats]:
    """Binarize every split into `out` with `cfg.workers` processes; returns their counts."""
    settings = EncodeSettings(
        src_model=tokenizers.src.model_bytes,
        tgt_model=tokenizers.tgt.model_bytes,
        dtype=dtype,
        nfkc=cfg.nfkc,
        on_invalid_utf8=InvalidUtf8(cfg.on_invalid_utf8).value,
    )
    stats: dict[str, SplitStats] = {}
    total = sum(s.src.lines for s in splits)
    with (
        Encoder(settings, cfg.workers) as encoder,
        tqdm(
            total=total,
            unit=" pairs",
            unit_scale=True,
            desc="encoding",
            disable=None if progress else True,  # None: only on a terminal
            leave=False,
        ) as bar,
    ):
        for split in splits:
            f = split.files
            bar.set_postfix_str(f.name)
            stats[f.name] = encoder.encode_split(
                split.src,
                split.tgt,
                cfg.chunk_lines,
                split_prefix(out, f.name, f.langs[0]),
                split_prefix(out, f.name, f.langs[1]),
                clean_rules(cfg, f.langs) if f.is_train else None,
                progress=bar.update,
            )
            if f.is_train and stats[f.name].kept == 0:
                raise NmtError(_empty_train_message(f, stats[f.name]))
    return stats


# ---------------------------------------------------------------------------- checks


def _pairs(cfg: PreprocessConfig) -> list[tuple[str, tuple[str, str]]]:
    """(stem, its two languages) of each pair to binarize, each once: the stems of a
    multilingual build's directions; ("", (data.src, data.tgt)) for a single pair."""
    d = cfg.data
    if not d.multilingual:
        return [("", (d.src, d.tgt))]
    stems = dict.fromkeys(d.pair_stems().values())
    return [(stem, parse_direction(stem, "data.pairs")) for stem in stems]


def _split_files(cfg: PreprocessConfig) -> list[SplitFiles]:
    """The input files of every split to build: each split prefix once for a single pair;
    once per pair in a multilingual build, stored as `<split>.<stem>` (a {pair} in the
    prefix is replaced by the stem)."""
    d = cfg.data
    train_names = {name for name, _ in d.train_prefixes()}
    found = []
    for name, prefix in d.split_prefixes():
        option = setting(d.option_of(name), prefix)
        for stem, langs in _pairs(cfg):
            resolved = Path(prefix.replace(PAIR_PLACEHOLDER, stem)).expanduser()
            paths = (input_file(resolved, langs[0]), input_file(resolved, langs[1]))
            stored = f"{name}.{stem}" if stem else name
            found.append(SplitFiles(stored, option, langs, paths, name in train_names, stem))
    return found


def _scan_inputs(
    cfg: PreprocessConfig, samples: TokenizerSamples, progress: bool
) -> list[SplitInput]:
    """Every input file exists, pairs have equal line counts, and (in error mode) valid
    UTF-8; the training files' lines are offered to the SentencePiece sample on the way.
    A file several pairs share (a multi-parallel corpus) is read once."""
    check_utf8 = InvalidUtf8(cfg.on_invalid_utf8) is InvalidUtf8.error
    split_files = _split_files(cfg)
    for files in split_files:  # every file is there before the first is read
        for path in files.paths:
            if path.is_dir():
                raise NmtError(f"{path}: is a directory; give the prefix of the text files")
            if not path.is_file():
                pair = f" for {files.stem}" if files.stem else ""
                raise NmtError(f"{path}: no such file ({files.option}{pair})")
    # a file is scanned once as training text (offered to the sample) and once otherwise
    unique = {(path, files.is_train) for files in split_files for path in files.paths}
    total = sum(path.stat().st_size for path, _ in unique)
    scans: dict[tuple[Path, bool], FileScan] = {}
    splits = []
    with tqdm(
        total=total,
        unit="B",
        unit_scale=True,
        desc="scanning",
        disable=None if progress else True,  # None: only on a terminal
        leave=False,
    ) as bar:
        for files in split_files:
            for side, path in zip(("src", "tgt"), files.paths):
                if (path, files.is_train) not in scans:
                    bar.set_postfix_str(path.name)
                    sample = samples.for_side(side) if files.is_train else None
                    scans[path, files.is_train] = scan_file(
                        path, cfg.chunk_lines, check_utf8, sample, bar.update
                    )
            src, tgt = (scans[path, files.is_train] for path in files.paths)
            check_parallel(src, tgt)
            if files.is_train and src.lines == 0:
                pair = f"{files.stem} " if files.stem else ""
                raise NmtError(
                    f"{files.option}: the {pair}training files are empty; give the prefix "
                    "of files with text"
                )
            splits.append(SplitInput(files, src, tgt))
    return splits


def _check_dest(dest: Path, overwrite: bool) -> None:
    """May a data dir be written at `dest`? Only where nothing, an empty directory, or (with
    overwrite) an nmt data dir holding nothing else is."""
    ancestor = dest.parent
    while not ancestor.exists() and ancestor != ancestor.parent:
        ancestor = ancestor.parent
    if not ancestor.is_dir():
        raise NmtError(f"data.dest={dest}: {ancestor} is not a directory; choose another data.dest")
    check_replaceable(dest, "data.dest", DATA_DIR, overwrite)


def _empty_train_message(files: SplitFiles, stats: SplitStats) -> str:
    removed = ", ".join(f"{rule} {n}" for rule, n in stats.removed.items() if n)
    options = [
        RULE_OPTIONS[rule] for rule, n in stats.removed.items() if n and rule in RULE_OPTIONS
    ]
    pair = f" of {files.stem}" if files.stem else ""
    return (
        f"{files.option}: no training pairs{pair} left after cleaning "
        f"({stats.lines} lines; removed: {removed or 'none'}); check the files or relax "
        f"{', '.join(options or RULE_OPTIONS.values())}"
    )


# the option that turns each cleaning rule off or relaxes it, for the message above
RULE_OPTIONS = {
    "empty": "clean.remove_empty",
    "too_long": "clean.max_pieces",
    "ratio": "clean.max_ratio",
    "copy": "clean.drop_copies",
    "langid": "clean.langid",
}


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
