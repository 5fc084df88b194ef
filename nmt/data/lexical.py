"""Target-vocabulary shortlists: the file (`Shortlist`) and how nmt-shortlist learns one
from a data dir's parallel data (`build_shortlist`); nmt.generation.shortlist decodes with it.

The file is a CTranslate2 vocabulary map (vmap), so one file serves both engines
(`nmt-export vmap=` puts it into a CTranslate2 model):

    <source pieces>\t<target piece> <target piece> ...

one line per source n-gram (its pieces separated by spaces; nmt-shortlist writes single
pieces), and one line with no source, whose targets are candidates for every sentence.
A sentence's candidates are those, the four special tokens, the targets of every source
n-gram it contains, and the tokens of its forced prefix and of its required phrases
(constraints).

The table is IBM Model 1 (Brown et al., 1993): p(t | s) for every source piece s (and
a NULL source word) and target piece t that occur in one sentence pair, learned by EM
from uniform values. The shortlist keeps, per source piece, the `topk` target pieces of
highest p(t | s) among those that are not candidates anyway, plus the `frequent` most
frequent target pieces for every sentence: how Marian's lexical shortlists and
CTranslate2's vocabulary maps are made (from fast_align's tables, which refine Model 1
with a preference for the diagonal).

Pairs are read from the binarized split (ids, no tokenization), EOS dropped; a split of
more than `max_pairs` pairs is sampled (seeded), so memory and time stay bounded. EM
works on every (source position, target position) link of the pairs, in chunks of
CHUNK_LINKS links, with numpy: a link's probability is looked up in the sorted table of
the (source, target) pairs seen, normalised over the sentence's source positions for its
target position, and summed into the expected counts.

Shapes: E table entries, L links of a chunk, n sentences.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from tqdm import tqdm

from nmt.data.binarize import TokenArray
from nmt.data.config import ShortlistConfig
from nmt.data.meta import DataMeta, load_meta
from nmt.data.tokenizer import Tokenizer, load_tokenizers
from nmt.errors import NmtError
from nmt.fsutil import atomic_write_text, remove_stale_temps
from nmt.vocab import SPECIAL_IDS

CHUNK_LINKS = 2_000_000  # links per EM chunk: ~100 MB of numpy arrays
SPECIALS = np.array(sorted(SPECIAL_IDS.values()), dtype=np.int64)  # [0,1,2,3]
FORMAT_HINT = "each line is 'source pieces<TAB>target pieces' (a CTranslate2 vocabulary map)"


class Shortlist:
    """Candidate target ids per source n-gram, read from a shortlist file."""

    def __init__(self, rules: dict[tuple[int, ...], np.ndarray], always: np.ndarray, name: str):
        """rules: source ids -> target ids; always: target ids every sentence gets."""
        self.name = name
        self.always = np.union1d(always, SPECIALS)  # sorted, specials included
        self.unigrams = {key[0]: ids for key, ids in rules.items() if len(key) == 1}
        self.ngrams = {key: ids for key, ids in rules.items() if len(key) > 1}
        self.longest = max((len(k) for k in self.ngrams), default=1)

    @classmethod
    def from_file(
        cls,
        path: str | os.PathLike,
        src_tokenizer: Tokenizer,
        tgt_tokenizer: Tokenizer,
        key: str = "shortlist",
    ) -> Shortlist:
        """Read a shortlist file against the model's vocabularies (NmtError naming the file
        and line of anything that does not fit them; `key` names the option in errors)."""
        path = Path(path)
        if not path.is_file():
            raise NmtError(
                f"{key}={path}: no such file; build one with nmt-shortlist data=<the "
                "model's data dir>"
            )
        try:
            text = path.read_bytes().decode("utf-8")
        except UnicodeDecodeError as exc:
            at = path.read_bytes()[: exc.start].count(b"\n") + 1
            raise NmtError(f"{path}:{at}: not UTF-8 text; {FORMAT_HINT}") from None
        except OSError as exc:
            raise NmtError(f"{path}: cannot read it ({exc.strerror}); check the file") from None
        src_ids = {p: i for i, p in enumerate(src_tokenizer.pieces())}
        tgt_ids = {p: i for i, p in enumerate(tgt_tokenizer.pieces())}
        rules: dict[tuple[int, ...], np.ndarray] = {}
        first_seen: dict[tuple[int, ...], int] = {}
        always: list[int] = []
        for number, line in enumerate(text.split("\n"), start=1):
            line = line.rstrip("\r")
            if not line:
                continue
            parts = line.split("\t")
            if len(parts) != 2:
                problem = "no tab" if len(parts) == 1 else f"{len(parts) - 1} tabs"
                raise NmtError(f"{path}:{number}: {problem}; {FORMAT_HINT}")
            source, targets = parts
            ids = np.array(
                [_piece_id(p, tgt_ids, "target", path, number) for p in targets.split()],
                dtype=np.int64,
            )
            if not source:
                always.extend(ids.tolist())
                continue
            ngram = tuple(_piece_id(p, src_ids, "source", path, number) for p in source.split(" "))
            if ngram in first_seen:
                raise NmtError(
                    f"{path}:{number}: source {source!r} listed again (first on line "
                    f"{first_seen[ngram]}); list each source n-gram once"
                )
            first_seen[ngram] = number
            rules[ngram] = np.unique(ids)
        if not rules and not always:
            raise NmtError(f"{path}: no candidates in it; {FORMAT_HINT}")
        return cls(rules, np.unique(np.array(always, dtype=np.int64)), str(path))

    def candidates(self, source: np.ndarray, prefix: np.ndarray | None = None) -> np.ndarray:
        """One sentence's candidate target ids, sorted: source [S] ids (PAD-free), prefix
        [P] its forced target ids (PAD-free) or None."""
        found = [self.always]
        for token in source.tolist():
            ids = self.unigrams.get(token)
            if ids is not None:
                found.append(ids)
        if self.ngrams:
            tokens = tuple(source.tolist())
            for n in range(2, self.longest + 1):
                for start in range(len(tokens) - n + 1):
                    ids = self.ngrams.get(tokens[start : start + n])
                    if ids is not None:
                        found.append(ids)
        if prefix is not None:
            found.append(prefix.astype(np.int64))
        return np.unique(np.concatenate(found))


@dataclass
class Corpus:
    """Sentence pairs as flat id arrays without EOS: sentence i of a side is
    ids[offsets[i]:offsets[i + 1]]."""

    src: np.ndarray  # int64
    src_offsets: np.ndarray  # [n+1] int64
    tgt: np.ndarray
    tgt_offsets: np.ndarray

    def __len__(self) -> int:
        return len(self.src_offsets) - 1


@dataclass
class LexicalTable:
    """p(target | source) for the pairs seen together; source == NULL is the empty word."""

    source: np.ndarray  # [E] int64, ascending (then target ascending)
    target: np.ndarray  # [E] int64
    prob: np.ndarray  # [E] float64: p(target | source); each source's entries sum to 1
    null: int  # the NULL source id (the source vocabulary's size)

    def best(self, k: int, exclude: np.ndarray | None = None) -> dict[int, np.ndarray]:
        """Per source id (NULL left out): its k targets of highest probability, best
        first (ties: lower id first), leaving out the targets `exclude`."""
        order = np.lexsort((self.target, -self.prob, self.source))  # by source, best first
        if exclude is not None:
            order = order[~np.isin(self.target[order], exclude)]
        source = self.source[order]
        starts = np.flatnonzero(np.r_[True, source[1:] != source[:-1]])  # each source's first
        rank = np.arange(len(order)) - np.repeat(starts, np.diff(np.r_[starts, len(order)]))
        keep = order[rank < k]
        out: dict[int, np.ndarray] = {}
        kept_source = self.source[keep]
        bounds = np.flatnonzero(np.r_[True, kept_source[1:] != kept_source[:-1], True])
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            s = int(kept_source[lo])
            if s != self.null:
                out[s] = self.target[keep[lo:hi]]
        return out


@dataclass
class ShortlistReport:
    """What nmt-shortlist wrote, and how the shortlist does on check_split."""

    path: Path
    pairs: int  # sentence pairs the table was learned from
    sources: int  # source pieces with candidates
    always: int  # target pieces every sentence gets (specials included)
    check_split: str | None = None
    candidates: float = 0.0  # candidates per sentence of check_split, on average
    vocab_size: int = 0  # the target vocabulary's size
    coverage: float = 0.0  # reference tokens of check_split among their sentence's candidates

    def line(self) -> str:
        text = (
            f"wrote {self.path}: {self.sources:,} source pieces with candidates, "
            f"{self.always} for every sentence, from {self.pairs:,} sentence pairs"
        )
        if self.check_split:
            text += (
                f"; on {self.check_split}: {self.candidates:,.0f} candidates per sentence "
                f"({100 * self.candidates / max(self.vocab_size, 1):.1f}% of "
                f"{self.vocab_size:,}), covering {100 * self.coverage:.2f}% of the "
                "reference tokens"
            )
        return text


def read_pairs(
    data_dir: str | Path, meta: DataMeta, split: str, max_pairs: int = 0, seed: int = 1
) -> Corpus:
    """The pairs of `split` (every shard), EOS dropped; at most max_pairs (0: all) of
    them, a seeded sample in corpus order."""
    info = meta.splits.get(split)
    if info is None:
        raise NmtError(
            f"split={split}: not in {data_dir}; choose one of {', '.join(sorted(meta.splits))}"
        )
    sides: list[list[TokenArray]] = [[], []]
    for prefix in info.shard_prefixes(split):
        # a multilingual data dir's split names its own pair (train.en-de)
        for side, lang in enumerate(info.langs or (meta.src_lang, meta.tgt_lang)):
            path = Path(data_dir) / f"{prefix}.{lang}"
            if not Path(f"{path}.bin").is_file():
                raise NmtError(f"split={split}: {path}.bin is missing; choose a parallel split")
            sides[side].append(TokenArray(path))
    total = sum(len(a) for a in sides[0])
    chosen = np.arange(total)
    if max_pairs and total > max_pairs:
        chosen = np.sort(np.random.default_rng(seed).choice(total, max_pairs, replace=False))
    src, src_off = _gather(sides[0], chosen)
    tgt, tgt_off = _gather(sides[1], chosen)
    return Corpus(src, src_off, tgt, tgt_off)


def _gather(shards: list[TokenArray], chosen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Sentences `chosen` (indices over the shards end to end) without their EOS: (ids,
    offsets)."""
    pieces, lengths = [], []
    first = 0
    for array in shards:
        mine = chosen[(chosen >= first) & (chosen < first + len(array))] - first
        first += len(array)
        bounds = np.asarray(array._idx)
        starts, ends = bounds[mine], bounds[mine + 1] - 1  # - 1: EOS
        length = np.maximum(ends - starts, 0)
        at = np.repeat(starts - np.cumsum(length) + length, length) + np.arange(length.sum())
        pieces.append(np.asarray(array._bin[at], dtype=np.int64))
        lengths.append(length)
    length = np.concatenate(lengths) if lengths else np.zeros(0, np.int64)
    return np.concatenate(pieces), np.r_[0, np.cumsum(length)].astype(np.int64)


def _links(corpus: Corpus, null: int, tgt_vocab: int) -> Iterator[tuple[np.ndarray, np.ndarray]]:
    """Per chunk of sentences: (key [L] = source * tgt_vocab + target of every link,
    group [L]: the link's target position, numbered within the chunk). Source position 0
    of every sentence is NULL."""
    src_len = np.diff(corpus.src_offsets) + 1  # + NULL
    tgt_len = np.diff(corpus.tgt_offsets)
    links = src_len * tgt_len
    ends = np.searchsorted(np.cumsum(links), np.arange(1, links.sum() + CHUNK_LINKS, CHUNK_LINKS))
    lo = 0
    for hi in np.unique(np.minimum(ends + 1, len(links))):
        if hi <= lo:
            continue
        count = links[lo:hi]
        sent = np.repeat(np.arange(lo, hi), count)  # [L]
        k = np.arange(count.sum()) - np.repeat(np.cumsum(count) - count, count)
        per = tgt_len[sent]
        i, j = k // per, k % per  # source position (0 = NULL), target position
        src_at = corpus.src_offsets[sent] + i - 1
        source = np.where(i == 0, null, corpus.src[np.maximum(src_at, 0)])
        target_at = corpus.tgt_offsets[sent] + j
        yield source * tgt_vocab + corpus.tgt[target_at], target_at - corpus.tgt_offsets[lo]
        lo = hi


def ibm_model1(
    corpus: Corpus, src_vocab: int, tgt_vocab: int, iterations: int, progress: bool = False
) -> LexicalTable:
    """IBM Model 1 with a NULL source word (id src_vocab), `iterations` EM steps from
    uniform probabilities."""
    null = src_vocab
    chunks = sum(1 for _ in _links(corpus, null, tgt_vocab))
    bar = tqdm(
        total=chunks * (iterations + 1),
        desc="nmt-shortlist: IBM Model 1",
        unit="chunk",
        file=sys.stderr,
        disable=None if progress else True,
        leave=False,
    )
    with bar:
        seen: list[np.ndarray] = []
        for key, _ in _links(corpus, null, tgt_vocab):
            seen.append(np.unique(key))
            if sum(map(len, seen)) > 4 * max(len(seen[0]), CHUNK_LINKS):  # compact
                seen = [np.unique(np.concatenate(seen))]
            bar.update()
        keys = np.unique(np.concatenate(seen)) if seen else np.zeros(0, np.int64)
        source = keys // tgt_vocab
        prob = np.ones(len(keys))  # uniform: the first E-step splits each link evenly
        for _ in range(iterations):
            counts = np.zeros(len(keys))
            for key, group in _links(corpus, null, tgt_vocab):
                entry = np.searchsorted(keys, key)  # [L]
                p = prob[entry]
                posterior = p / np.bincount(group, weights=p)[group]  # over source positions
                counts += np.bincount(entry, weights=posterior, minlength=len(keys))
                bar.update()
            totals = np.bincount(source, weights=counts, minlength=null + 1)
            prob = counts / totals[source]
    return LexicalTable(source, keys % tgt_vocab, prob, null)


def shortlist_text(
    table: LexicalTable,
    frequent_ids: np.ndarray,
    topk: int,
    src_pieces: list[str],
    tgt_pieces: list[str],
) -> tuple[str, int]:
    """The shortlist file's text (first the line without a source: `frequent_ids`), and
    how many source pieces have a line."""
    for side, pieces in (("source", src_pieces), ("target", tgt_pieces)):
        bad = next((p for p in pieces if not p or any(c.isspace() for c in p)), None)
        if bad is not None:
            raise NmtError(
                f"the {side} SentencePiece model has the piece {bad!r}, which holds "
                "whitespace: a shortlist file cannot name it"
            )
    lines = ["\t" + " ".join(tgt_pieces[t] for t in frequent_ids.tolist())]
    best = table.best(topk, exclude=frequent_ids)  # no slot spent on what every sentence has
    for s in sorted(best):
        lines.append(src_pieces[s] + "\t" + " ".join(tgt_pieces[t] for t in best[s].tolist()))
    return "\n".join(lines) + "\n", len(best)


def most_frequent(ids: np.ndarray, vocab_size: int, n: int) -> np.ndarray:
    """The n most frequent ids that are not special tokens (ties: lower id first)."""
    counts = np.bincount(ids, minlength=vocab_size)
    counts[list(SPECIAL_IDS.values())] = 0
    order = np.lexsort((np.arange(vocab_size), -counts))
    return np.sort(order[: min(n, int(np.count_nonzero(counts)))])


def build_shortlist(cfg: ShortlistConfig) -> ShortlistReport:
    """nmt-shortlist's work: learn the table from cfg.split, write the shortlist file
    (atomically), measure it on cfg.check_split."""
    cfg.validate()
    data = str(cfg.data)
    meta = load_meta(data)
    output = cfg.output_path
    if output.exists() and not cfg.overwrite:
        raise NmtError(
            f"output={output}: already exists; choose another path or set overwrite=true "
            "to replace it"
        )
    if not output.parent.is_dir():
        raise NmtError(f"output={output}: its folder does not exist; create it first")
    check = cfg.check_split
    if check is not None and check not in meta.splits:
        if check != ShortlistConfig.check_split:  # the default is skipped quietly when absent
            raise NmtError(
                f"check_split={check}: not in {data}; choose one of "
                f"{', '.join(sorted(meta.splits))}, or null"
            )
        check = None
    src_tok, tgt_tok = load_tokenizers(data, meta)
    corpus = read_pairs(data, meta, cfg.split, cfg.max_pairs, cfg.seed)
    if not len(corpus):
        raise NmtError(f"split={cfg.split}: no sentence pairs in {data}; choose another split")
    table = ibm_model1(
        corpus, meta.src_vocab_size, meta.tgt_vocab_size, cfg.iterations, cfg.progress
    )
    frequent = most_frequent(corpus.tgt, meta.tgt_vocab_size, cfg.frequent)
    text, sources = shortlist_text(table, frequent, cfg.topk, src_tok.pieces(), tgt_tok.pieces())
    remove_stale_temps(output)  # what a killed run left beside it
    try:
        atomic_write_text(output, text)
    except OSError as exc:
        raise NmtError(f"output={output}: could not write it ({exc.strerror or exc})") from exc
    shortlist = Shortlist.from_file(output, src_tok, tgt_tok)
    report = ShortlistReport(
        output, len(corpus), sources, len(shortlist.always), vocab_size=meta.tgt_vocab_size
    )
    if check is not None:
        _measure(report, shortlist, read_pairs(data, meta, check), check)
    return report


def _measure(report: ShortlistReport, shortlist: Shortlist, pairs: Corpus, split: str) -> None:
    """Candidates per sentence and the share of reference tokens among them."""
    sizes, covered, tokens = [], 0, 0
    for i in range(len(pairs)):
        source = pairs.src[pairs.src_offsets[i] : pairs.src_offsets[i + 1]]
        reference = pairs.tgt[pairs.tgt_offsets[i] : pairs.tgt_offsets[i + 1]]
        candidates = shortlist.candidates(source)
        sizes.append(len(candidates))
        covered += int(np.isin(reference, candidates).sum())
        tokens += len(reference)
    report.check_split = split
    report.candidates = float(np.mean(sizes)) if sizes else 0.0
    report.coverage = covered / tokens if tokens else 1.0


def _piece_id(piece: str, ids: dict[str, int], side: str, path: Path, line: int) -> int:
    found = ids.get(piece)
    if found is None:
        raise NmtError(
            f"{path}:{line}: {piece!r} is not a piece of the model's {side} vocabulary; "
            "build the shortlist from the model's own data dir (nmt-shortlist)"
        )
    return found
