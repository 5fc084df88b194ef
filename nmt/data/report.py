"""BuildReport: what nmt-preprocess wrote and how the run went, whichever way it made the
data dir (build.py from text, join.py from data dirs built apart)."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from nmt.data.meta import DataMeta


@dataclass(frozen=True)
class BuildReport:
    """What `build_data_dir` wrote, from text or by joining data dirs: the data dir's
    meta.json, and how the run went."""

    dest: Path  # the data dir
    meta: DataMeta  # as written to <dest>/meta.json
    encode_seconds: float  # reading, encoding and writing the splits (tokenizer training not)
    workers: int  # encoding processes
    invalid_utf8: dict[str, int]  # split -> lines with invalid UTF-8, where there were any
    invalid_utf8_policy: str  # "replace" or "skip" (with "error" there are none)
    joined: int = 0  # data dirs joined (join=[...]); 0: built from text

    @property
    def pairs(self) -> int:
        """Sentence pairs read, over every split."""
        return sum(s.lines for s in self.meta.splits.values())

    @property
    def pairs_per_second(self) -> float:
        return self.pairs / self.encode_seconds if self.encode_seconds > 0 else float("inf")

    def lines(self) -> list[str]:
        """A summary for people: headline lines, with one indented line per split."""
        meta = self.meta
        out = [
            f"{name}: {n} lines with invalid UTF-8 "
            f"({'replaced' if self.invalid_utf8_policy == 'replace' else 'skipped'})"
            for name, n in self.invalid_utf8.items()
        ]
        vocab = (
            f"joint vocabulary of {meta.src_vocab_size}"
            if meta.joint_vocab
            else f"vocabularies of {meta.src_vocab_size} ({meta.src_lang}) and "
            f"{meta.tgt_vocab_size} ({meta.tgt_lang})"
        )
        if meta.multilingual:
            n = len(meta.directions)
            out.append(
                f"{', '.join(meta.langs)}: {n} direction{'s' if n > 1 else ''} "
                f"({', '.join(meta.directions)}), "
                f"{vocab} pieces with {len(meta.lang_tags)} language tags, {meta.dtype} ids"
            )
        else:
            out.append(f"{meta.src_lang}->{meta.tgt_lang}, {vocab} pieces, {meta.dtype} ids")
        width = max(len(name) for name in meta.splits)
        for name, s in meta.splits.items():
            src_lang, tgt_lang = s.langs or (meta.src_lang, meta.tgt_lang)
            removed = ", ".join(f"{rule} {n}" for rule, n in s.removed.items())
            out.append(
                f"  {name:<{width}} {s.lines:>9} lines {s.kept:>9} kept   tokens "
                f"{s.src_tokens} {src_lang} / {s.tgt_tokens} {tgt_lang}   "
                f"removed: {removed}"
            )
        if self.joined:
            out.append(f"joined {self.joined} data dirs ({self.pairs} pairs)")
        else:
            out.append(
                f"encoded {self.pairs} pairs in {self.encode_seconds:.2f} s "
                f"({self.pairs_per_second:,.0f} pairs/s, "
                f"{self.workers} worker{'s' if self.workers > 1 else ''})"
            )
        out.append(f"wrote {self.dest}")
        return out
