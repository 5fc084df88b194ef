"""The data dir's SentencePiece model(s): reused from files, or trained on a sample of the
training text.

The sample is drawn while the input files are scanned (`TokenizerSamples`, reservoir
sampling in nmt.data.sampling): at most `spm.input_sentence_size` lines per model, so the
memory of this step does not grow with the corpus. A corpus with fewer lines gives every
line, in order, so its model is the one trained on the whole text.

Training runs in a child process: SentencePiece's C++ trainer ignores Ctrl-C for minutes on
a large corpus, while a child can be stopped at once. The models are then written into the
data dir being built (`<name>.model` and `<name>.vocab`), through nmt.fsutil.
"""

from __future__ import annotations

import multiprocessing
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from multiprocessing.connection import Connection
from pathlib import Path

from nmt.data.config import InvalidUtf8, ModelType, PreprocessConfig
from nmt.data.sampling import LineReservoir
from nmt.data.tokenizer import Tokenizer, normalize_text, train_tokenizer
from nmt.errors import NmtError
from nmt.fsutil import atomic_write_bytes
from nmt.processes import become_child_of, interrupts_deferred


@dataclass(frozen=True)
class DataTokenizers:
    """The source and target tokenizers of a data dir (one object twice when joint)."""

    src: Tokenizer
    tgt: Tokenizer
    files: dict[str, dict[str, str]]  # meta.json's `tokenizers`: {side: {file, sha256}}

    @property
    def joint(self) -> bool:
        return self.src is self.tgt


class TokenizerSamples:
    """The reservoirs the scan of the training files fills: one for a joint model (both
    sides), one per side for separate models, none when the models are reused."""

    def __init__(self, cfg: PreprocessConfig) -> None:
        s = cfg.spm
        capacity = s.input_sentence_size or _ALL
        self.reservoirs: dict[str, LineReservoir] = {}
        if s.model is None and s.src_model is None:
            sides = ("joint",) if s.joint else ("src", "tgt")
            for k, side in enumerate(sides):
                self.reservoirs[side] = LineReservoir(capacity, seed=s.seed + 1000 * k)

    def for_side(self, side: str) -> LineReservoir | None:
        """The reservoir the training text of `side` ("src" or "tgt") goes to, if any."""
        return self.reservoirs.get("joint", self.reservoirs.get(side))


_ALL = 1 << 62  # input_sentence_size=0: keep every line


def setup_tokenizers(
    cfg: PreprocessConfig, samples: TokenizerSamples, out: Path, log: Callable[[str], None]
) -> DataTokenizers:
    """Reuse or train the model(s) `cfg.spm` asks for, and write them into `out`."""
    s, d = cfg.spm, cfg.data
    train = ",".join(prefix for _, prefix in cfg.data.train_prefixes())
    if s.model is not None:
        src_tok = tgt_tok = _reuse(s.model, "spm.model")
    elif s.src_model is not None and s.tgt_model is not None:
        src_tok = _reuse(s.src_model, "spm.src_model")
        tgt_tok = _reuse(s.tgt_model, "spm.tgt_model")
    elif s.joint:
        what = f"{train}.{{{','.join(d.languages())}}}"  # a multilingual build is joint
        src_tok = tgt_tok = _train(cfg, samples.reservoirs.pop("joint"), what, log)
    else:
        src_tok = _train(cfg, samples.reservoirs.pop("src"), f"{train}.{d.src}", log)
        tgt_tok = _train(cfg, samples.reservoirs.pop("tgt"), f"{train}.{d.tgt}", log)
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


def check_reused_model(cfg: PreprocessConfig) -> None:
    """The model spm.model names, if any, is there with nmt's special ids and (in a
    multilingual build) the language tags as control symbols: checked before slow work."""
    path, tags = cfg.spm.model, list(cfg.data.tag_pieces().values())
    if path is None:
        return
    tok = _reuse(path, "spm.model")
    missing = [tag for tag in tags if tag not in tok.control_symbol_ids(tags)]
    if missing:
        raise NmtError(
            f"spm.model={path}: lacks the language tags {' '.join(missing)} as control "
            "symbols; give a model nmt-preprocess trained with these data.langs, or "
            "leave spm.model out to train one"
        )


def _train(
    cfg: PreprocessConfig, sample: LineReservoir, what: str, log: Callable[[str], None]
) -> Tokenizer:
    """Train in a child process and return the model it sends back."""
    s = cfg.spm
    taken = (
        f"all {sample.seen:,} lines"
        if len(sample.lines) == sample.seen
        else f"a random sample of {len(sample.lines):,} of its {sample.seen:,} lines"
    )
    log(
        f"training a {ModelType(s.model_type).value} SentencePiece model of {s.vocab_size} "
        f"pieces on {taken} of {what}"
    )
    ctx = multiprocessing.get_context()
    receiver, sender = ctx.Pipe(duplex=False)
    # forked, the child reads the sample from the parent's memory (nothing is copied)
    child = ctx.Process(
        target=_train_child, args=(sender, cfg, sample.lines, what, os.getpid()), daemon=True
    )
    try:
        with interrupts_deferred():
            child.start()
        sender.close()  # so that recv() sees EOF if the child dies
        status, payload = receiver.recv()
    except EOFError:
        raise NmtError(
            f"SentencePiece training on {what} died (out of memory?); lower "
            f"spm.input_sentence_size={s.input_sentence_size} to train on a smaller sample"
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
    sender: Connection, cfg: PreprocessConfig, sample: list[bytes], what: str, parent_pid: int
) -> None:
    become_child_of(parent_pid)
    s = cfg.spm
    try:
        tok = train_tokenizer(
            _training_text(sample, cfg),
            vocab_size=s.vocab_size,
            model_type=ModelType(s.model_type).value,
            character_coverage=s.character_coverage,
            byte_fallback=s.byte_fallback,
            input_sentence_size=0,  # the sample is drawn already
            user_defined_symbols=s.user_defined_symbols,
            num_threads=s.num_threads,
            seed=s.seed,
            what=what,
            control_symbols=list(cfg.data.tag_pieces().values()),
        )
    except NmtError as exc:
        sender.send(("error", str(exc)))
    else:
        sender.send(("ok", tok.model_bytes))
    finally:
        sender.close()


def _training_text(sample: list[bytes], cfg: PreprocessConfig) -> Iterator[str]:
    """The sampled lines, decoded and normalized as the encoder reads them; empty lines and
    lines skipped for invalid UTF-8 are left out."""
    skip = InvalidUtf8(cfg.on_invalid_utf8) is InvalidUtf8.skip
    for raw in sample:
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError:
            if skip:
                continue
            text = raw.decode("utf-8", errors="replace")  # the scan refused it in error mode
        line = normalize_text(text, cfg.nfkc)
        if line:
            yield line
