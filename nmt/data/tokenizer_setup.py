"""The data dir's SentencePiece model(s): reused from files, or trained on the training split.

Training runs in a child process: SentencePiece's C++ trainer ignores Ctrl-C for minutes on
a large corpus, while a child can be stopped at once. The models are then written into the
data dir being built (`<name>.model` and `<name>.vocab`), through nmt.fsutil.
"""

from __future__ import annotations

import multiprocessing
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from nmt.data.config import InvalidUtf8, ModelType, PreprocessConfig
from nmt.data.corpus import FileScan, read_lines
from nmt.data.tokenizer import Tokenizer, train_tokenizer
from nmt.errors import NmtError
from nmt.fsutil import atomic_write_bytes
from nmt.processes import ignore_sigint, sigint_deferred


@dataclass(frozen=True)
class DataTokenizers:
    """The source and target tokenizers of a data dir (one object twice when joint)."""

    src: Tokenizer
    tgt: Tokenizer
    files: dict[str, dict[str, str]]  # meta.json's `tokenizers`: {side: {file, sha256}}

    @property
    def joint(self) -> bool:
        return self.src is self.tgt


def setup_tokenizers(
    cfg: PreprocessConfig,
    train_src: FileScan,
    train_tgt: FileScan,
    out: Path,
    log: Callable[[str], None],
) -> DataTokenizers:
    """Reuse or train the model(s) `cfg.spm` asks for, and write them into `out`."""
    s, d = cfg.spm, cfg.data
    if s.model is not None:
        src_tok = tgt_tok = _reuse(s.model, "spm.model")
    elif s.src_model is not None and s.tgt_model is not None:
        src_tok = _reuse(s.src_model, "spm.src_model")
        tgt_tok = _reuse(s.tgt_model, "spm.tgt_model")
    elif s.joint:
        what = f"{d.trainpref}.{{{d.src},{d.tgt}}}"
        src_tok = tgt_tok = _train(cfg, [train_src, train_tgt], what, log)
    else:
        src_tok = _train(cfg, [train_src], f"{d.trainpref}.{d.src}", log)
        tgt_tok = _train(cfg, [train_tgt], f"{d.trainpref}.{d.tgt}", log)
    joint = src_tok is tgt_tok
    names = (
        {"src": "spm", "tgt": "spm"} if joint else {"src": f"spm.{d.src}", "tgt": f"spm.{d.tgt}"}
    )
    files = {}
    for side, tok in (("src", src_tok), ("tgt", tgt_tok)):
        if side == "src" or not joint:
            atomic_write_bytes(out / f"{names[side]}.model", tok.model_bytes)
            tok.write_vocab(out / f"{names[side]}.vocab")
        files[side] = {"file": f"{names[side]}.model", "sha256": tok.sha256}
    return DataTokenizers(src_tok, tgt_tok, files)


def _reuse(path: str, key: str) -> Tokenizer:
    file = Path(path).expanduser()
    if not file.is_file():
        raise NmtError(f"{key}={path}: no such file; give the path of a SentencePiece .model")
    tok = Tokenizer.from_file(file)
    tok.check_special_ids(f"{key}={path}")
    return tok


def _train(
    cfg: PreprocessConfig, scans: list[FileScan], what: str, log: Callable[[str], None]
) -> Tokenizer:
    """Train in a child process and return the model it sends back."""
    s = cfg.spm
    log(
        f"training a {ModelType(s.model_type).value} SentencePiece model of {s.vocab_size} "
        f"pieces on {what}"
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
            model_type=ModelType(s.model_type).value,
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
    policy = InvalidUtf8(cfg.on_invalid_utf8).value
    for scan in scans:
        for k in range(len(scan.starts) - 1):
            lines, _ = read_lines(scan.path, *scan.chunk(k), k * cfg.chunk_lines, policy, cfg.nfkc)
            yield from (line for line in lines if line)
