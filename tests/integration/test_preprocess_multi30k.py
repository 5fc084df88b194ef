"""The issue's "done when" on the real corpus: Multi30k en->de decodes back to its raw text.

Slow (SentencePiece training on 58,000 sentences): run with `-m slow`.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from nmt.data import build_data_dir
from nmt.data.binarize import TokenArray
from nmt.data.meta import load_meta, split_prefix
from nmt.data.tokenizer import load_tokenizers, normalize_text

MULTI30K = Path(__file__).resolve().parents[2].parent / "shared" / "data" / "multi30k"


@pytest.mark.slow
@pytest.mark.skipif(not (MULTI30K / "train.en").is_file(), reason="needs ../shared/data/multi30k")
def test_multi30k_round_trip(tmp_path: Path, preprocess_config) -> None:
    dest = tmp_path / "multi30k"
    build_data_dir(
        preprocess_config(
            f"data.trainpref={MULTI30K / 'train'}",
            f"data.validpref={MULTI30K / 'val'}",
            f"data.testpref=[{MULTI30K / 'test_2016_flickr'}]",
            f"data.dest={dest}",
            "spm.vocab_size=8000",
            "spm.byte_fallback=true",
            "spm.num_threads=2",
            "workers=2",
        )
    )
    meta = load_meta(dest)
    src_tok, tgt_tok = load_tokenizers(dest)
    for split, raw_name in (("valid", "val"), ("test_2016_flickr", "test_2016_flickr")):
        assert meta.splits[split].kept == meta.splits[split].lines
        for lang, tok in (("en", src_tok), ("de", tgt_tok)):
            raw = (MULTI30K / f"{raw_name}.{lang}").read_text(encoding="utf-8").split("\n")[:-1]
            arr = TokenArray(split_prefix(dest, split, lang))
            decoded = [tok.decode(arr[i]) for i in range(len(arr))]
            assert decoded == [normalize_text(t, False) for t in raw]
    for info in meta.splits.values():
        assert info.kept + sum(info.removed.values()) == info.lines
    assert meta.splits["train"].lines == 29000 and meta.splits["train"].kept > 28900
