"""Data: raw parallel text -> data dir (`build_data_dir`), and reading it back.

config.py            PreprocessConfig (nmt-preprocess), ShortlistConfig (nmt-shortlist)
build.py             build_data_dir: check every input, build beside the destination, rename
join.py              join data dirs built apart into one (join=[...])
report.py            BuildReport: what a build or a join wrote
corpus.py            reading parallel text: line counts, UTF-8 checks, chunks
cleaning.py          the training split's cleaning rules: lengths, copies, langid, duplicates
sampling.py          a bounded, seeded sample of a stream of lines (reservoir sampling)
tokenizer_setup.py   the data dir's SentencePiece model(s): reused, or trained on a sample
tokenizer.py         SentencePiece with nmt's special ids; the one text normalization
segmentations.py     every way a vocabulary's pieces spell a text (banned phrases)
binarize.py          encoding in worker processes; the .bin/.idx arrays (TokenArray)
meta.py              meta.json (and config.yaml beside it)
languages.py         languages of a multilingual data dir: directions, tags, where tags go
dataset.py           a split as indexable sentence pairs, memory-mapped
batching.py          token-budget batches: pure functions of lengths, seed and epoch
collate.py           sentence pairs -> padded, batch-first tensors
subword_sampling.py  subword regularization: segmentations drawn afresh every epoch
lexical.py           target-vocabulary shortlists: the file (Shortlist) and nmt-shortlist

`build_data_dir` and `BuildReport` are imported on first use, so `import nmt.data.config`
stays cheap (no SentencePiece, numpy or tqdm).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from nmt.data.build import build_data_dir
    from nmt.data.report import BuildReport

__all__ = ["BuildReport", "build_data_dir"]


def __getattr__(name: str) -> Any:
    if name == "build_data_dir":
        from nmt.data.build import build_data_dir

        return build_data_dir
    if name == "BuildReport":
        from nmt.data.report import BuildReport

        return BuildReport
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
