"""meta.json: what a data dir holds, written last by nmt-preprocess and read by everything else.

A data dir is complete only when meta.json exists (see docs/ARCHITECTURE.md). Training and
generation read languages, vocabulary sizes, special ids and tokenizer files from here, so
nothing is configured twice. Beside it, config.yaml holds the resolved preprocess config
for people to read (meta.json's `config` holds the same).
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field, fields
from pathlib import Path
from typing import Any

import yaml

from nmt.errors import NmtError
from nmt.fsutil import atomic_write, atomic_write_text

FORMAT_VERSION = 1
META_FILE = "meta.json"
CONFIG_FILE = "config.yaml"


@dataclass
class SplitInfo:
    """Counts of one split; `lines == kept + sum(removed.values())`."""

    lines: int  # lines in each input file
    kept: int  # sentence pairs stored
    removed: dict[str, int]  # rule -> pairs dropped (empty, too_long, ratio, invalid_utf8)
    src_tokens: int  # ids stored for the source side, EOS included
    tgt_tokens: int  # ids stored for the target side, EOS included
    # a split joined from several data dirs (nmt.data.join): its shards' file prefixes, in
    # order (`<shard>.<lang>.bin/.idx`); empty: one shard, stored as `<split>.<lang>`
    shards: list[str] = field(default_factory=list)
    # a multilingual data dir's split (`train.en-de`): its two languages, as the stem names
    # them (files `<split>.<lang>`); empty: the data dir's src_lang and tgt_lang
    langs: list[str] = field(default_factory=list)

    def shard_prefixes(self, split: str) -> list[str]:
        return list(self.shards) or [split]


@dataclass
class DataMeta:
    """Mirror of meta.json."""

    src_lang: str
    tgt_lang: str
    joint_vocab: bool
    src_vocab_size: int
    tgt_vocab_size: int
    special_ids: dict[str, int]  # {bos, pad, eos, unk}
    dtype: str  # "uint16" or "int32"
    tokenizers: dict[str, dict[str, str]]  # {src: {file, sha256}, tgt: {file, sha256}}
    normalization: dict[str, bool]  # {nfkc}
    splits: dict[str, SplitInfo]
    config: dict[str, Any] = field(default_factory=dict)  # the preprocess config, resolved
    format_version: int = FORMAT_VERSION
    # A multilingual data dir (nmt.data.languages): its languages, each direction's pair stem
    # ("de-en" -> "en-de": a pair is binarized once, as `<split>.<stem>`, and read either way)
    # and each language's tag piece. Empty in a single-pair data dir; src_lang and tgt_lang
    # then name its pair, and in a multilingual one its first direction.
    langs: list[str] = field(default_factory=list)
    directions: dict[str, str] = field(default_factory=dict)
    lang_tags: dict[str, str] = field(default_factory=dict)

    @property
    def multilingual(self) -> bool:
        return bool(self.directions)

    def direction_split(self, split: str, direction: str) -> tuple[str, str, str]:
        """(split name, source language, target language) of `direction`'s part of
        `split` (a stem such as "train" or "valid") in a multilingual data dir."""
        stem = self.directions[direction]
        src, tgt = direction.split("-")
        return f"{split}.{stem}", src, tgt

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for info in d["splits"].values():
            for optional in ("shards", "langs"):  # older nmt reads what it knows
                if not info[optional]:
                    del info[optional]
        for optional in ("langs", "directions", "lang_tags"):
            if not d[optional]:
                del d[optional]
        return {"format_version": d.pop("format_version"), **d}

    @classmethod
    def from_dict(cls, d: dict[str, Any], where: str) -> DataMeta:
        names = {f.name for f in fields(cls)}
        missing = sorted(names - {"config", "langs", "directions", "lang_tags"} - d.keys())
        if missing:
            raise NmtError(
                f"{where}: missing fields {', '.join(missing)}; "
                "rebuild the data dir with nmt-preprocess"
            )
        values = {k: v for k, v in d.items() if k in names}
        try:
            values["splits"] = {name: SplitInfo(**info) for name, info in d["splits"].items()}
        except (TypeError, AttributeError) as exc:
            raise NmtError(
                f"{where}: malformed splits ({exc}); rebuild the data dir with nmt-preprocess"
            ) from exc
        return cls(**values)

    def tokenizer_file(self, data_dir: str | Path, side: str) -> Path:
        """Path of the SentencePiece model for side "src" or "tgt"."""
        return Path(data_dir) / self.tokenizers[side]["file"]


def split_prefix(data_dir: str | Path, split: str, lang: str) -> Path:
    """`<data_dir>/<split>.<lang>`: add .bin / .idx, or hand it to TokenArray."""
    return Path(data_dir) / f"{split}.{lang}"


def load_meta(data_dir: str | Path) -> DataMeta:
    path = Path(data_dir) / META_FILE
    if not path.is_file():
        why = "no such directory" if not Path(data_dir).is_dir() else f"no {META_FILE}"
        raise NmtError(f"{data_dir}: not an nmt data dir ({why}); build it with nmt-preprocess")
    try:
        d = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise NmtError(
            f"{path}: unreadable ({exc}); rebuild the data dir with nmt-preprocess"
        ) from exc
    if not isinstance(d, dict) or d.get("format_version") != FORMAT_VERSION:
        found = d.get("format_version") if isinstance(d, dict) else None
        raise NmtError(
            f"{path}: format_version {found!r}, this nmt reads {FORMAT_VERSION}; "
            "rebuild the data dir with this nmt's nmt-preprocess"
        )
    return DataMeta.from_dict(d, str(path))


def write_meta(data_dir: str | Path, meta: DataMeta) -> None:
    """Write meta.json durably (nmt.fsutil.atomic_write): the data dir's completion mark."""
    with atomic_write(Path(data_dir) / META_FILE, "w") as f:
        json.dump(meta.to_dict(), f, indent=2, ensure_ascii=False)
        f.write("\n")


def write_config(data_dir: str | Path, config: dict[str, Any]) -> None:
    """Write config.yaml durably: the resolved preprocess config, in YAML."""
    text = yaml.safe_dump(config, sort_keys=False, allow_unicode=True)
    atomic_write_text(Path(data_dir) / CONFIG_FILE, text)
