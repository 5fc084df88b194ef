"""nmt-preprocess as the plainest in-memory program: the reference the streaming builder
(nmt.data.build_data_dir: chunks, worker processes, reservoir-sampled SentencePiece,
compressed input) must equal byte for byte on corpora smaller than the sample.

Everything is read whole, then normalized, tokenized, cleaned and written in order, with
the same SentencePiece settings and the same file formats (docs/ARCHITECTURE.md, "Data
dir"). Only the data files are produced (meta.json and config.yaml are compared by count).
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from nmt.data.config import ModelType, PreprocessConfig
from nmt.data.tokenizer import Tokenizer, normalize_text, train_tokenizer
from nmt.vocab import EOS

BOM = "\ufeff"


def _read(path: Path, policy: str, nfkc: bool) -> list[str | None]:
    """Lines split at "\\n" only; None for a line skipped for invalid UTF-8."""
    raw = path.read_bytes()
    if raw.startswith(BOM.encode()):
        raw = raw[3:]
    if raw.endswith(b"\n"):
        raw = raw[:-1]
    if not raw:
        return []
    out: list[str | None] = []
    for line in raw.split(b"\n"):
        try:
            text = line.decode("utf-8")
        except UnicodeDecodeError:
            if policy == "skip":
                out.append(None)
                continue
            text = line.decode("utf-8", errors="replace")
        out.append(normalize_text(text, nfkc))
    return out


def reference_data_files(cfg: PreprocessConfig) -> dict[str, bytes]:
    """{file name: bytes} of the data dir `cfg` describes (spm model and vocab, splits)."""
    d, s = cfg.data, cfg.spm
    policy = (
        cfg.on_invalid_utf8.value if hasattr(cfg.on_invalid_utf8, "value") else cfg.on_invalid_utf8
    )
    text = {
        name: {lang: _read(Path(f"{prefix}.{lang}"), policy, cfg.nfkc) for lang in (d.src, d.tgt)}
        for name, prefix in d.split_prefixes()
    }
    train_names = [name for name, _ in d.train_prefixes()]

    def train(lines: list[str | None], what: str) -> Tokenizer:
        return train_tokenizer(
            [line for line in lines if line],
            vocab_size=s.vocab_size,
            model_type=ModelType(s.model_type).value,
            character_coverage=s.character_coverage,
            byte_fallback=s.byte_fallback,
            input_sentence_size=0,
            user_defined_symbols=s.user_defined_symbols,
            num_threads=s.num_threads,
            seed=s.seed,
            what=what,
        )

    files: dict[str, bytes] = {}
    if s.joint:
        lines = [
            line for name in train_names for lang in (d.src, d.tgt) for line in text[name][lang]
        ]
        src_tok = tgt_tok = train(lines, "joint")
        files["spm.model"] = src_tok.model_bytes
    else:
        src_tok = train([x for name in train_names for x in text[name][d.src]], "src")
        tgt_tok = train([x for name in train_names for x in text[name][d.tgt]], "tgt")
        files[f"spm.{d.src}.model"] = src_tok.model_bytes
        files[f"spm.{d.tgt}.model"] = tgt_tok.model_bytes
    dtype = np.uint16 if max(src_tok.vocab_size, tgt_tok.vocab_size) <= 65536 else np.int32
    for name, sides in text.items():
        pairs = [
            (a, b) for a, b in zip(sides[d.src], sides[d.tgt]) if a is not None and b is not None
        ]
        encoded = [(src_tok.encode(a), tgt_tok.encode(b)) for a, b in pairs]
        if name in train_names:
            encoded = [(x, y) for x, y in encoded if _clean_keeps(cfg, len(x), len(y))]
        for lang, side in ((d.src, 0), (d.tgt, 1)):
            seqs = [pair[side] + [EOS] for pair in encoded]
            ids = np.array([i for seq in seqs for i in seq], dtype=dtype)
            offsets = np.cumsum([0] + [len(seq) for seq in seqs]).astype(np.int64)
            files[f"{name}.{lang}.bin"] = ids.tobytes()
            files[f"{name}.{lang}.idx"] = offsets.tobytes()
    return files


def _clean_keeps(cfg: PreprocessConfig, src_len: int, tgt_len: int) -> bool:
    c = cfg.clean
    shorter, longer = min(src_len, tgt_len), max(src_len, tgt_len)
    if c.remove_empty and shorter == 0:
        return False
    if c.max_pieces is not None and longer > c.max_pieces:
        return False
    if c.max_ratio is not None and shorter > 0 and longer > c.max_ratio * shorter:
        return False
    return True
