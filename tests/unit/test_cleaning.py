"""The cleaning rules of nmt.data.cleaning on their own: the duplicate set (exactness,
memory), pair hashes, the copy and language rules (nmt-preprocess's use of them:
tests/integration/test_preprocess_cleaning.py)."""

from __future__ import annotations

import tracemalloc

import numpy as np
import pytest

from nmt.data.cleaning import (
    CLEAN_RULES,
    CleanRules,
    LangidRule,
    LanguageFilter,
    SeenPairs,
    pair_hashes,
)


def _first_occurrences(values: list[int]) -> list[bool]:
    seen: set[int] = set()
    out = []
    for v in values:
        out.append(v not in seen)
        seen.add(v)
    return out


def test_seen_pairs_keeps_exactly_the_first_occurrences() -> None:
    rng = np.random.default_rng(1)
    # many repeats, within and across calls, of hashes spread over the whole 64-bit range
    pool = rng.integers(1, 2**63, size=3000, dtype=np.int64).astype(np.uint64) * np.uint64(2)
    hashes = pool[rng.integers(0, len(pool), size=20000)]
    seen = SeenPairs(len(hashes))
    got: list[bool] = []
    start = 0
    while start < len(hashes):
        size = int(rng.integers(1, 700))
        got += seen.first_seen(hashes[start : start + size]).tolist()
        start += size
    assert got == _first_occurrences(hashes.tolist())
    assert seen.count == len(set(hashes.tolist()))


def test_seen_pairs_resolves_long_probe_chains() -> None:
    """Hashes that all want the same slot (and the slots after it) are still told apart."""
    seen = SeenPairs(64)
    size = 128  # the table: 2 x capacity slots
    hashes = np.array([k * size + 5 for k in range(1, 50)], dtype=np.uint64)
    assert seen.first_seen(hashes[:30]).all()
    again = np.concatenate([hashes[10:20], hashes[30:], hashes[30:31]])
    expected = [False] * 10 + [True] * 19 + [False]
    assert seen.first_seen(again).tolist() == expected


def test_seen_pairs_memory_is_fixed_at_16_bytes_a_pair() -> None:
    """Sized once from the split's line count; filling it allocates little beyond a chunk's
    temporaries (numpy's allocations are traced by tracemalloc)."""
    n, chunk = 200_000, 5000
    hashes = np.random.default_rng(2).integers(1, 2**63, size=n, dtype=np.int64).astype(np.uint64)
    tracemalloc.start()
    try:
        seen = SeenPairs(n)
        for start in range(0, n, chunk):
            seen.first_seen(hashes[start : start + chunk])
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert seen.nbytes == 16 * n
    assert seen.count == n
    assert peak < 16 * n + 100 * chunk * 8, f"peak {peak / n:.1f} bytes a pair"


def test_pair_hashes_tell_pairs_apart_by_side() -> None:
    a = pair_hashes(["a b", "a", "x"], ["c", "b c", "x"])
    assert a.dtype == np.uint64 and (a != 0).all()
    assert len(set(a.tolist())) == 3  # the tab between the sides keeps "a b|c" from "a|b c"
    assert pair_hashes(["a b"], ["c"])[0] == a[0]  # the same pair, the same hash, any call
    assert pair_hashes(["A b"], ["c"])[0] != a[0]  # case is not folded


def test_rules_are_counted_only_when_on() -> None:
    off = CleanRules(True, 250, 3.0)
    assert off.names == ("empty", "too_long", "ratio")  # as meta.json has always had them
    on = CleanRules(True, None, None, True, LangidRule("en", "de", ()), True)
    assert on.names == CLEAN_RULES == ("empty", "too_long", "ratio", "copy", "langid", "duplicate")


def test_copies_are_exact_and_only_among_the_pairs_still_kept() -> None:
    rules = CleanRules(False, None, None, drop_copies=True)
    src = ["Anna.", "Hello there.", "Tom.", "Das Haus.", ""]
    tgt = ["Anna.", "hello there.", "Tom.", "The house.", ""]
    keep = np.array([True, True, False, True, True])  # "Tom." was dropped by an earlier rule
    kept, counts = rules.apply_text(src, tgt, keep, None)
    # an empty pair kept on purpose (remove_empty=false) is not a copy
    assert kept.tolist() == [False, True, False, True, True]
    assert counts == {"copy": 1}


def test_language_filter_keeps_the_declared_languages() -> None:
    pytest.importorskip("py3langid", reason="the langid extra: pip install 'nmt[langid]'")
    languages = LanguageFilter(LangidRule("en", "de", ("fr",)))
    assert languages.keeps(
        "A man in a blue shirt is standing on a ladder.",
        "Ein Mann in einem blauen Hemd steht auf einer Leiter.",
    )
    assert not languages.keeps(
        "A woman reads a book in the park.", "Une femme lit un livre dans le parc."
    )
    assert not languages.keeps(  # the source side is checked too
        "Die Kinder spielen am Strand.", "Die Kinder spielen am Strand Fußball."
    )
    assert languages.keeps("1998", "1998")  # no letters: nothing to judge
