"""The training-split cleaning rules of nmt-preprocess, and what they need to run.

Rules see a pair after normalization (nmt.data.tokenizer.normalize_text: optional NFKC,
whitespace runs to one space, trimmed); case is never folded. A pair is counted under the
first rule it breaks, in the order of CLEAN_RULES:
  empty, too_long, ratio  subword lengths (CleanRules.apply, in the encoding workers);
  copy                    the target equals the (non-empty) source (workers);
  langid                  a side not identified as its language (workers; py3langid);
  duplicate               the pair equals an earlier kept pair of the split (the main process,
                          which sees the chunks in order: SeenPairs, on 64-bit hashes the
                          workers compute).
Identical pairs break the same length, copy and language rules, so dropping those before
the duplicate check keeps the first occurrence of every pair that survives them.
"""

from __future__ import annotations

import hashlib
import re
from dataclasses import dataclass
from typing import Any

import numpy as np

from nmt.errors import NmtError, option_error

# Rule names as they appear in meta.json's `removed` counts, in the order they are checked.
CLEAN_RULES = ("empty", "too_long", "ratio", "copy", "langid", "duplicate")
LENGTH_RULES = CLEAN_RULES[:3]  # counted whether on or off (meta.json has always had them)

LANGID_EXTRA = "clean.langid=true needs the langid extra: pip install 'nmt[langid]'"
_LETTER = re.compile(r"[^\W\d_]")  # a side without letters (numbers, symbols) is not judged


@dataclass(frozen=True)
class LangidRule:
    """Keep a pair when its source is identified as `src` and its target as `tgt`, among
    `candidates` (with src and tgt; None: every language the model knows)."""

    src: str
    tgt: str
    candidates: tuple[str, ...] | None

    def languages(self) -> list[str] | None:
        if self.candidates is None:
            return None
        return sorted({self.src, self.tgt, *self.candidates})


@dataclass(frozen=True)
class CleanRules:
    """The training-split filters (valid and test keep every line)."""

    remove_empty: bool
    max_pieces: int | None
    max_ratio: float | None
    drop_copies: bool = False
    langid: LangidRule | None = None
    dedup: bool = False

    @property
    def names(self) -> tuple[str, ...]:
        """The rules counted in meta.json, in order: the length rules always, the others
        when on."""
        on = {"copy": self.drop_copies, "langid": self.langid is not None}
        on["duplicate"] = self.dedup
        return tuple(rule for rule in CLEAN_RULES if rule in LENGTH_RULES or on[rule])

    def apply(
        self, src_lens: np.ndarray, tgt_lens: np.ndarray
    ) -> tuple[np.ndarray, dict[str, int]]:
        """The length rules on subword lengths without EOS: keep mask and per-rule counts;
        a pair is counted under the first rule it breaks."""
        keep = np.ones(len(src_lens), dtype=bool)
        counts = dict.fromkeys(LENGTH_RULES, 0)
        shorter = np.minimum(src_lens, tgt_lens)
        longer = np.maximum(src_lens, tgt_lens)
        if self.remove_empty:
            hit = shorter == 0
            counts["empty"] = int(hit.sum())
            keep &= ~hit
        if self.max_pieces is not None:
            hit = keep & (longer > self.max_pieces)
            counts["too_long"] = int(hit.sum())
            keep &= ~hit
        if self.max_ratio is not None:
            # an empty side kept on purpose (remove_empty=false) is not a ratio problem
            hit = keep & (shorter > 0) & (longer > self.max_ratio * shorter)
            counts["ratio"] = int(hit.sum())
            keep &= ~hit
        return keep, counts

    def apply_text(
        self,
        src: list[str],
        tgt: list[str],
        keep: np.ndarray,
        languages: LanguageFilter | None,
    ) -> tuple[np.ndarray, dict[str, int]]:
        """The copy and language rules on the pairs `keep` still holds: the new keep mask
        and their counts. `languages` is needed when the langid rule is on."""
        keep = keep.copy()
        counts: dict[str, int] = {}
        if self.drop_copies:
            # two empty sides are clean.remove_empty's business, not a copy
            hit = [i for i in np.flatnonzero(keep) if src[i] == tgt[i] and src[i]]
            keep[hit] = False
            counts["copy"] = len(hit)
        if self.langid is not None:
            assert languages is not None
            hit = [i for i in np.flatnonzero(keep) if not languages.keeps(src[i], tgt[i])]
            keep[hit] = False
            counts["langid"] = len(hit)
        return keep, counts


def pair_hashes(src: list[str], tgt: list[str]) -> np.ndarray:
    """64-bit BLAKE2b hashes of the pairs (uint64, never 0: SeenPairs' empty slot).

    Normalized text holds no tab, so "src<TAB>tgt" names a pair unambiguously."""
    digests = b"".join(
        hashlib.blake2b(f"{a}\t{b}".encode(), digest_size=8).digest() for a, b in zip(src, tgt)
    )
    hashes = np.frombuffer(digests, dtype="<u8").astype(np.uint64)
    hashes[hashes == 0] = 1
    return hashes


class SeenPairs:
    """The hashes of the pairs kept so far in a split, to drop later equal pairs.

    An open-addressing hash table (linear probing) of uint64, sized once for `capacity`
    distinct hashes at a load of at most one half: 16 bytes per pair of the split, fixed
    from the start, whatever the corpus holds. Texts are not kept, so two different pairs
    with the same 64-bit hash would count as one: for n pairs that happens with probability
    about n^2 / 2^65 (2.7e-6 for 10M pairs).
    """

    def __init__(self, capacity: int) -> None:
        self._table = np.zeros(max(2 * capacity, 16), dtype=np.uint64)  # 0: an empty slot
        self._size = np.uint64(len(self._table))
        self.count = 0  # distinct hashes held

    @property
    def nbytes(self) -> int:
        return self._table.nbytes

    def first_seen(self, hashes: np.ndarray) -> np.ndarray:
        """Mask of the hashes not seen before (in earlier calls or earlier in this one),
        which are added; at most `capacity` distinct hashes over all calls."""
        _, first = np.unique(hashes, return_index=True)  # repeats within the call
        new = np.zeros(len(hashes), dtype=bool)
        todo = np.sort(first)  # positions still probing, each a distinct hash
        slot = hashes[todo] % self._size
        while len(todo):
            held = self._table[slot]
            here = held == hashes[todo]  # seen before: not new
            empty = held == 0
            # an empty slot goes to the first position probing it; the others probe on
            _, winner = np.unique(slot[empty], return_index=True)
            claim = np.flatnonzero(empty)[winner]
            self._table[slot[claim]] = hashes[todo[claim]]
            new[todo[claim]] = True
            done = here.copy()
            done[claim] = True
            move = ~done & ~empty  # held by another hash; losers of a claim look again
            slot[move] = (slot[move] + np.uint64(1)) % self._size
            todo, slot = todo[~done], slot[~done]
        self.count += int(new.sum())
        if 2 * self.count > len(self._table):
            raise RuntimeError("SeenPairs: more distinct hashes than its capacity")
        return new


class LanguageFilter:
    """py3langid's identifier, restricted to the rule's candidate languages (one per
    encoding process)."""

    def __init__(self, rule: LangidRule) -> None:
        self.rule = rule
        self._identifier = load_identifier()
        self._identifier.set_languages(rule.languages())

    def keeps(self, src: str, tgt: str) -> bool:
        return self._is(src, self.rule.src) and self._is(tgt, self.rule.tgt)

    def _is(self, text: str, lang: str) -> bool:
        return not _LETTER.search(text) or self._identifier.classify(text)[0] == lang


def load_identifier() -> Any:
    """A fresh py3langid identifier over every language of its model; NmtError naming the
    extra when the package is not installed."""
    try:
        from py3langid.langid import MODEL_FILE, LanguageIdentifier
    except ImportError:
        raise NmtError(LANGID_EXTRA) from None
    return LanguageIdentifier.from_model_file(MODEL_FILE)


def check_langid(rule: LangidRule, lang_key: str = "") -> None:
    """Before any work: the package is installed and knows every language named;
    NmtError naming the option (`lang_key`, or data.src and data.tgt) otherwise."""
    known = set(load_identifier().labels)
    fix = "use the ISO 639-1 codes py3langid knows (en, de, fr, ...), or set clean.langid=false"
    for key, lang in ((lang_key or "data.src", rule.src), (lang_key or "data.tgt", rule.tgt)):
        if lang not in known:
            raise option_error(key, lang, "not a language clean.langid knows", fix)
    unknown = [lang for lang in rule.candidates or () if lang not in known]
    if unknown:
        raise option_error(
            "clean.langid_candidates",
            list(rule.candidates or ()),
            f"{', '.join(unknown)}: not a language py3langid knows",
            "use ISO 639-1 codes (en, de, fr, ...), or null for every language it knows",
        )
